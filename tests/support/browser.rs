//! A real headless Chromium driven over the DevTools protocol (a WebSocket
//! per page), for the console's test. Chromium is Debian's `chromium`
//! (scripts/test.sh installs it), or the binary `WXGATE_TEST_CHROMIUM`
//! names. Each browser has its own profile in a scratch directory and is
//! killed when dropped.
//!
//! A [`Page`] records what a test asserts on: console errors, uncaught
//! exceptions and the browser's own error log (a Content-Security-Policy
//! violation lands there), every request the page made, and the dialogs
//! it opened (each accepted, as a user clicking OK). With credentials set,
//! it answers HTTP authentication as a user typing them into the prompt.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::Message;

use super::temp::TempDir;

/// How long one DevTools command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// The Chromium binary: `WXGATE_TEST_CHROMIUM`, else the first of the usual
/// names on PATH.
pub fn chromium() -> String {
    if let Ok(bin) = std::env::var("WXGATE_TEST_CHROMIUM") {
        return bin;
    }
    for name in ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"] {
        let found =
            std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(name).is_file()));
        if found {
            return name.to_owned();
        }
    }
    panic!("no Chromium: install Debian's chromium (scripts/test.sh does) or set WXGATE_TEST_CHROMIUM");
}

/// A headless Chromium process.
pub struct Browser {
    child: Child,
    /// `127.0.0.1:<port>` of its DevTools endpoint.
    devtools: String,
    _profile: TempDir,
}

impl Browser {
    /// Starts Chromium with a fresh profile, window 1280×1000.
    pub fn start() -> Browser {
        let profile = TempDir::new("chromium");
        let mut child = Command::new(chromium())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-extensions",
                "--disable-sync",
                "--hide-scrollbars",
                "--window-size=1280,1000",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start chromium");
        let stderr = child.stderr.take().expect("chromium's stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            // Read to the end: a full pipe would stall Chromium.
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("DevTools listening on ws://").nth(1) {
                    if let (Some(tx), Some(addr)) = (tx.take(), rest.split('/').next()) {
                        let _ = tx.send(addr.to_owned());
                    }
                }
            }
        });
        let devtools = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                panic!("chromium did not open its DevTools endpoint within 60 s");
            }
        };
        Browser { child, devtools, _profile: profile }
    }

    /// A new tab, blank, its DevTools session open.
    pub async fn page(&self) -> Page {
        let body = http(&self.devtools, "PUT", "/json/new?about:blank").await;
        let target: Value = serde_json::from_str(&body).expect("a target's JSON");
        let url = target["webSocketDebuggerUrl"].as_str().expect("webSocketDebuggerUrl").to_owned();
        Page::connect(&url).await
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request over a fresh connection; the body (of its
/// `Content-Length`: DevTools' server keeps the connection open).
async fn http(addr: &str, method: &str, path: &str) -> String {
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect to DevTools");
        let req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\n\r\n");
        s.write_all(req.as_bytes()).await.expect("send");
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = s.read(&mut buf).await.expect("read");
            out.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&out).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len = head
                    .lines()
                    .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
                    .and_then(|v| v.parse::<usize>().ok());
                if n == 0 || len.is_some_and(|len| body.len() >= len) {
                    return body.to_owned();
                }
            } else if n == 0 {
                return String::new();
            }
        }
    };
    tokio::time::timeout(COMMAND_TIMEOUT, exchange).await.expect("DevTools answered over HTTP")
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;
type Sink = futures_util::stream::SplitSink<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    Message,
>;

/// What a page did, as its events said.
#[derive(Default, Debug, Clone)]
pub struct Seen {
    /// Console errors, uncaught exceptions, the browser's error log.
    pub errors: Vec<String>,
    /// Every request's URL, in order.
    pub requests: Vec<String>,
    /// Each dialog's message (all accepted).
    pub dialogs: Vec<String>,
    /// HTTP authentication challenges answered.
    pub auth_challenges: u32,
}

/// One tab's DevTools session.
pub struct Page {
    sink: Arc<tokio::sync::Mutex<Sink>>,
    pending: Pending,
    next: AtomicU64,
    seen: Arc<Mutex<Seen>>,
    credentials: Arc<Mutex<Option<(String, String)>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Page {
    async fn connect(url: &str) -> Page {
        let (ws, _) = tokio::time::timeout(COMMAND_TIMEOUT, tokio_tungstenite::connect_async(url))
            .await
            .expect("DevTools WebSocket in time")
            .expect("DevTools WebSocket");
        let (sink, mut stream) = ws.split();
        let sink = Arc::new(tokio::sync::Mutex::new(sink));
        let pending: Pending = Arc::default();
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let credentials: Arc<Mutex<Option<(String, String)>>> = Arc::default();
        let next = Arc::new(AtomicU64::new(1_000_000));
        let reader = {
            let (sink, pending, seen, credentials) = (sink.clone(), pending.clone(), seen.clone(), credentials.clone());
            tokio::spawn(async move {
                while let Some(Ok(msg)) = stream.next().await {
                    let Message::Text(text) = msg else { continue };
                    let Ok(v) = serde_json::from_str::<Value>(&text) else { continue };
                    if let Some(id) = v["id"].as_u64() {
                        if let Some(tx) = pending.lock().expect("pending").remove(&id) {
                            let _ = tx.send(v);
                        }
                        continue;
                    }
                    let params = &v["params"];
                    // Answers the browser waits for, sent from here (no reply awaited).
                    let reply = match v["method"].as_str().unwrap_or("") {
                        "Runtime.consoleAPICalled" if params["type"] == "error" => {
                            let args: Vec<String> = params["args"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .map(|a| a["value"].as_str().map_or_else(|| a.to_string(), str::to_owned))
                                .collect();
                            seen.lock().expect("seen").errors.push(format!("console.error: {}", args.join(" ")));
                            None
                        }
                        "Runtime.exceptionThrown" => {
                            let d = &params["exceptionDetails"];
                            let what =
                                d["exception"]["description"].as_str().unwrap_or(d["text"].as_str().unwrap_or(""));
                            seen.lock().expect("seen").errors.push(format!("exception: {what}"));
                            None
                        }
                        "Log.entryAdded" if params["entry"]["level"] == "error" => {
                            let e = &params["entry"];
                            seen.lock()
                                .expect("seen")
                                .errors
                                .push(format!("log ({}): {} {}", e["source"], e["text"], e["url"]));
                            None
                        }
                        "Network.requestWillBeSent" => {
                            let url = params["request"]["url"].as_str().unwrap_or("").to_owned();
                            seen.lock().expect("seen").requests.push(url);
                            None
                        }
                        "Page.javascriptDialogOpening" => {
                            let message = params["message"].as_str().unwrap_or("").to_owned();
                            seen.lock().expect("seen").dialogs.push(message);
                            Some(json!({ "method": "Page.handleJavaScriptDialog", "params": { "accept": true } }))
                        }
                        "Fetch.requestPaused" => Some(
                            json!({ "method": "Fetch.continueRequest", "params": { "requestId": params["requestId"] } }),
                        ),
                        "Fetch.authRequired" => {
                            seen.lock().expect("seen").auth_challenges += 1;
                            let given = credentials.lock().expect("credentials").clone();
                            let response = match given {
                                Some((username, password)) => {
                                    json!({ "response": "ProvideCredentials", "username": username, "password": password })
                                }
                                None => json!({ "response": "CancelAuth" }),
                            };
                            Some(
                                json!({ "method": "Fetch.continueWithAuth", "params": { "requestId": params["requestId"], "authChallengeResponse": response } }),
                            )
                        }
                        _ => None,
                    };
                    if let Some(mut reply) = reply {
                        reply["id"] = json!(next.fetch_add(1, Ordering::Relaxed));
                        let _ = sink.lock().await.send(Message::Text(reply.to_string().into())).await;
                    }
                }
            })
        };
        let page = Page { sink, pending, next: AtomicU64::new(1), seen, credentials, reader };
        for domain in ["Page.enable", "Runtime.enable", "Log.enable", "Network.enable"] {
            page.call(domain, json!({})).await;
        }
        page
    }

    /// Runs a DevTools command; its `result` (panics on an error answer).
    pub async fn call(&self, method: &str, params: Value) -> Value {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().expect("pending").insert(id, tx);
        let msg = json!({ "id": id, "method": method, "params": params }).to_string();
        self.sink.lock().await.send(Message::Text(msg.into())).await.expect("send a DevTools command");
        let answer = tokio::time::timeout(COMMAND_TIMEOUT, rx)
            .await
            .unwrap_or_else(|_| panic!("{method}: no answer within {COMMAND_TIMEOUT:?}"))
            .expect("the DevTools session closed");
        if let Some(e) = answer.get("error") {
            panic!("{method}: {e}");
        }
        answer["result"].clone()
    }

    /// Answers HTTP authentication with these credentials from now on, as
    /// a user would type them into the browser's prompt.
    pub async fn sign_in_with(&self, username: &str, password: &str) {
        *self.credentials.lock().expect("credentials") = Some((username.to_owned(), password.to_owned()));
        self.call("Fetch.enable", json!({ "handleAuthRequests": true, "patterns": [{ "urlPattern": "*" }] })).await;
    }

    /// Opens `url` and waits for its load event.
    pub async fn open(&self, url: &str) {
        let r = self.call("Page.navigate", json!({ "url": url })).await;
        assert!(r.get("errorText").is_none(), "navigating to {url}: {r}");
        super::eventually_async("the page loaded", super::PATIENCE, async || {
            self.eval("document.readyState").await == "complete"
        })
        .await;
    }

    /// The value of a JavaScript expression (a promise awaited).
    pub async fn eval(&self, expression: &str) -> Value {
        let r = self
            .call("Runtime.evaluate", json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }))
            .await;
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expression}: {e}");
        }
        r["result"]["value"].clone()
    }

    /// A PNG of the viewport.
    pub async fn screenshot(&self) -> Vec<u8> {
        use base64::Engine;
        let r = self.call("Page.captureScreenshot", json!({ "format": "png", "captureBeyondViewport": false })).await;
        base64::engine::general_purpose::STANDARD.decode(r["data"].as_str().expect("data")).expect("base64 PNG")
    }

    /// What the page did so far.
    pub fn seen(&self) -> Seen {
        self.seen.lock().expect("seen").clone()
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        self.reader.abort();
    }
}
