//! The wxgate binary as a real process, for multi-instance, crash, signal
//! and log tests: started on a config, everything it writes collected,
//! signalled, stopped or killed. Also one-shot runs such as `wxgate check`.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::poll::{eventually_some, within};
use super::temp::TempDir;
use super::{get_at, Answer, GUARD};

/// A running wxgate process; killed on drop.
pub struct Instance {
    child: Child,
    pub addr: SocketAddr,
    /// The admin listener's address, if it runs.
    pub admin: Option<SocketAddr>,
    /// Everything the process has written so far (stderr and stdout).
    log: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
    /// Holds the config file [`spawn`] wrote; removed after the process.
    _dir: Option<TempDir>,
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `wxgate --config <file with config>` (listen on 127.0.0.1:0) with
/// extra environment (`WXGATE_LOG` is `info` unless given), and waits until
/// it logs the address it serves on. `Err` carries everything it wrote if it
/// exits first, or does not start within [`GUARD`].
pub fn spawn(config: &str, tag: &str, env: &[(&str, &str)]) -> Result<Instance, String> {
    let dir = TempDir::new(&format!("process-{tag}"));
    let path = dir.write("wxgate.toml", config);
    let mut instance = spawn_path(&path, env)?;
    instance._dir = Some(dir);
    Ok(instance)
}

/// Like [`spawn`], with an existing config file.
pub fn spawn_path(path: &Path, env: &[(&str, &str)]) -> Result<Instance, String> {
    spawn_args(&["--config", path.to_str().expect("utf-8 path")], env)
}

/// Starts `wxgate <args>` (e.g. `sim --listen 127.0.0.1:0`) like [`spawn`]:
/// ready once it logs `listen=<addr>`.
pub fn spawn_args(args: &[&str], env: &[(&str, &str)]) -> Result<Instance, String> {
    spawn_args_in(Path::new(env!("CARGO_MANIFEST_DIR")), args, env)
}

/// [`spawn_args`] in the directory `dir` (e.g. one with no deploy/ in it).
pub fn spawn_args_in(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<Instance, String> {
    let mut cmd = command();
    cmd.current_dir(dir)
        .args(args)
        .env("WXGATE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn wxgate");
    let log = Arc::new(Mutex::new(String::new()));
    let (lines, ready) = mpsc::channel::<String>();
    let readers = vec![
        collect(child.stderr.take().expect("stderr"), log.clone(), Some(lines)),
        collect(child.stdout.take().expect("stdout"), log.clone(), None),
    ];
    let mut instance = Instance { child, addr: ([0, 0, 0, 0], 0).into(), admin: None, log, readers, _dir: None };
    let deadline = Instant::now() + GUARD;
    loop {
        match ready.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                if let Some(addr) = field(&line, "listen").and_then(|a| a.parse().ok()) {
                    instance.addr = addr;
                    instance.admin = field(&line, "admin").and_then(|a| a.parse().ok());
                    return Ok(instance);
                }
            }
            // Exited (stderr closed) or silent for too long: everything it wrote.
            Err(e) => {
                instance.kill();
                let mut log = instance.finish();
                if e == mpsc::RecvTimeoutError::Timeout {
                    log.push_str(&format!("(wxgate did not start serving within {GUARD:?})\n"));
                }
                return Err(log);
            }
        }
    }
}

/// Like [`spawn_path`], with the process's stderr written to the file
/// `log` (created or appended to; not collected by [`Instance::logged`]):
/// ready once `log` holds the line with the address it serves on.
pub async fn spawn_path_logging_to(path: &Path, env: &[(&str, &str)], log: &Path) -> Result<Instance, String> {
    let mut cmd = command();
    let file = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("log file");
    cmd.args(["--config", path.to_str().expect("utf-8 path")])
        .env("WXGATE_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(file);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn wxgate");
    let out = Arc::new(Mutex::new(String::new()));
    let readers = vec![collect(child.stdout.take().expect("stdout"), out.clone(), None)];
    let mut instance = Instance { child, addr: ([0, 0, 0, 0], 0).into(), admin: None, log: out, readers, _dir: None };
    let serving = within(GUARD, || {
        let text = std::fs::read_to_string(log).ok()?;
        let line = text.lines().find(|l| field(l, "listen").is_some())?.to_owned();
        Some(line)
    })
    .await;
    match serving {
        Some(line) => {
            instance.addr = field(&line, "listen").and_then(|a| a.parse().ok()).expect("listen address");
            instance.admin = field(&line, "admin").and_then(|a| a.parse().ok());
            Ok(instance)
        }
        None => {
            instance.kill();
            Err(format!(
                "wxgate did not start serving within {GUARD:?}: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            ))
        }
    }
}

/// Appends everything `from` yields to `log`, as lossy UTF-8 line by line (a
/// line is never lost to a decoding error), passing each line on to `lines`
/// while someone listens.
fn collect(
    from: impl Read + Send + 'static,
    log: Arc<Mutex<String>>,
    lines: Option<mpsc::Sender<String>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(from);
        let mut line = Vec::new();
        while reader.read_until(b'\n', &mut line).map(|n| n > 0).unwrap_or(false) {
            let text = String::from_utf8_lossy(&line).into_owned();
            log.lock().expect("log").push_str(&text);
            if let Some(tx) = &lines {
                let _ = tx.send(text);
            }
            line.clear();
        }
    })
}

impl Instance {
    /// What the process has written so far.
    pub fn logged(&self) -> String {
        self.log.lock().expect("log").clone()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process at once (SIGKILL): no graceful shutdown, no releases.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends a signal (`"-TERM"`, `"-INT"`, `"-HUP"`, ...).
    pub fn signal(&self, sig: &str) {
        signal(self.child.id(), sig);
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// Waits for the process to exit; its exit code (-1 if a signal ended it).
    pub async fn exit_code(&mut self, limit: Duration) -> i32 {
        let status = eventually_some("wxgate exiting", limit, || self.child.try_wait().expect("try_wait")).await;
        status.code().unwrap_or(-1)
    }

    /// Stops the process (SIGTERM, so it logs its shutdown; SIGKILL if it is
    /// still running after [`GUARD`]) and returns everything it wrote.
    pub async fn stop(mut self) -> String {
        self.signal("-TERM");
        within(GUARD, || self.child.try_wait().expect("try_wait")).await;
        self.kill();
        self.finish()
    }

    /// After the process ended: waits for its pipes to drain; the whole log.
    fn finish(&mut self) -> String {
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        self.logged()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A GET on the proxy listener.
    pub async fn get(&self, path: &str) -> Answer {
        get_at(self.addr, path).await
    }

    /// A GET on the proxy listener as `account` (`X-Wx-Account`).
    pub async fn get_as(&self, account: &str, path: &str) -> Answer {
        super::get_as_at(self.addr, account, path).await
    }

    /// A POST of `body` on the proxy listener.
    pub async fn post(&self, path: &str, body: &str) -> Answer {
        let req = hyper::Request::post(self.url(path))
            .body(http_body_util::Full::new(bytes::Bytes::from(body.to_owned())))
            .expect("request");
        super::send(req).await
    }

    /// A POST of `body` on the proxy listener with these headers.
    pub async fn post_with(&self, path: &str, body: &str, headers: &[(&str, &str)]) -> Answer {
        let mut req = hyper::Request::post(self.url(path));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        super::send(req.body(http_body_util::Full::new(bytes::Bytes::from(body.to_owned()))).expect("request")).await
    }

    /// A GET on the proxy listener with these headers.
    pub async fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Answer {
        let mut req = hyper::Request::get(self.url(path));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        super::send(req.body(http_body_util::Full::new(bytes::Bytes::new())).expect("request")).await
    }

    /// A GET on the admin listener.
    pub async fn admin_get(&self, path: &str) -> Answer {
        get_at(self.admin.expect("admin listener"), path).await
    }

    /// The value of one sample of the admin `/metrics` exposition, e.g.
    /// `wxgate_held`, or `wxgate_calls_total{rule="send",outcome="forwarded"}`.
    pub async fn metric(&self, name_and_labels: &str) -> Option<f64> {
        super::sample(&self.admin_get("/metrics").await.text(), name_and_labels)
    }
}

/// A `wxgate` command in the crate's directory, without the environment
/// variables wxgate reads (config path, Redis password, admin token).
fn command() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wxgate"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("WXGATE_CONFIG")
        .env_remove("WXGATE_REDIS_PASSWORD")
        .env_remove("WXGATE_ADMIN_TOKEN")
        .env_remove("WXGATE_TOKEN_KEY");
    cmd
}

/// Runs `wxgate <args>` to completion in the crate's directory: exit code, stdout, stderr.
pub fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    run_in(Path::new(env!("CARGO_MANIFEST_DIR")), args, env)
}

/// [`run`] in the directory `dir` (e.g. one without a rules.toml).
pub fn run_in(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = command();
    cmd.current_dir(dir).args(args).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run wxgate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Sends `sig` to process `pid` with kill(1).
pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill").args([sig, &pid.to_string()]).status().map(|s| s.success()).unwrap_or(false);
    assert!(ok, "kill {sig} {pid} failed");
}

/// The value of `name` in a text (`name=value`) or JSON (`"name":"value"`) log line.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    if let Some(rest) = line.split(&format!(" {name}=")).nth(1) {
        return rest.split_whitespace().next();
    }
    let rest = line.split(&format!("\"{name}\":\"")).nth(1)?;
    rest.split('"').next()
}
