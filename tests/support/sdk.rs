//! Real WeChat SDKs as subprocesses: the pinned environment that
//! `scripts/sdk-env.sh` installs into `target/sdk-env/` (wechatpy in a
//! Python venv, wechat-api for Node.js), and the drivers in `tests/sdk/`
//! that make real SDK calls against a base URL and print one JSON line per
//! call with what the SDK's caller sees ([`Seen`]).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde::Deserialize;

/// How long one driver run may take (a few SDK calls on loopback; the
/// interpreters start in well under a second).
const DRIVER_DEADLINE: Duration = Duration::from_secs(30);

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Where `scripts/sdk-env.sh` installs the SDKs (`WXGATE_SDK_ENV` overrides it there too).
fn env_dir() -> PathBuf {
    std::env::var_os("WXGATE_SDK_ENV").map(PathBuf::from).unwrap_or_else(|| repo().join("target/sdk-env"))
}

/// Runs `scripts/sdk-env.sh` once per test process (it returns at once when
/// the pinned SDKs are installed, and installs them otherwise); panics with
/// what it printed when it cannot.
pub fn ensure_env() -> PathBuf {
    static READY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let ready = READY.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo().join("scripts/sdk-env.sh"))
            .current_dir(repo())
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("could not run scripts/sdk-env.sh: {e}"))?;
        if out.status.success() {
            Ok(env_dir())
        } else {
            Err(format!(
                "scripts/sdk-env.sh failed ({}): it installs wechatpy from PyPI and wechat-api from npm into \
                 target/sdk-env/ and needs python3 (with venv), node and npm (installed with apt-get when \
                 missing and run as root). It printed:\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    });
    match ready {
        Ok(dir) => dir.clone(),
        Err(e) => panic!("{e}"),
    }
}

/// What the SDK's caller saw for one call, as a driver printed it.
#[derive(Debug, Clone, Deserialize)]
pub struct Seen {
    pub call: String,
    pub ok: bool,
    /// The call's result, when it succeeded.
    #[serde(default)]
    pub result: serde_json::Value,
    /// The exception's class (wechatpy) or the error's `name` (wechat-api).
    #[serde(default)]
    pub error: Option<String>,
    /// wechatpy: whether the exception is a `WeChatClientException`.
    #[serde(default)]
    pub wechat_client_exception: Option<bool>,
    /// `errcode` (wechatpy) or `code` (wechat-api) on the error; `None` when the SDK had none.
    #[serde(default)]
    pub errcode: Option<i64>,
    #[serde(default)]
    pub errmsg: Option<String>,
    /// The HTTP status of the response the SDK handed its caller, if any.
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub retry_after: Option<String>,
}

impl Seen {
    /// A refusal by wxgate as the SDK exposes it: errcode 45009 and wxgate's errmsg.
    pub fn is_wxgate_45009(&self) -> bool {
        !self.ok && self.errcode == Some(45009) && self.errmsg.as_deref().is_some_and(|m| m.starts_with("wxgate: "))
    }
}

/// One run of an SDK driver: its options, then [`Driver::calls`].
pub struct Driver {
    program: PathBuf,
    script: &'static str,
    args: Vec<String>,
    /// Environment set for the driver, after every proxy variable was removed.
    env: Vec<(String, String)>,
}

/// wechatpy 1.8.18 in front of `base` (`http://host:port`, optionally with
/// an `@account` segment): `API_BASE_URL` is `<base>/cgi-bin/` unless
/// [`Driver::contrib`]. Calls: see `CALLS` in `tests/sdk/wechatpy_driver.py`.
pub fn wechatpy(base: &str) -> Driver {
    let program = ensure_env().join("py/bin/python");
    Driver {
        program,
        script: "tests/sdk/wechatpy_driver.py",
        args: vec!["--base".into(), base.into()],
        env: Vec::new(),
    }
}

/// wechatpy 1.8.18 as shipped (every URL `https://api.weixin.qq.com/...`,
/// nothing changed in the client), routed by its environment only:
/// `HTTPS_PROXY=http://<proxy>` and `REQUESTS_CA_BUNDLE=<ca>` (wxgate's
/// `[intercept]`). The driver refuses any request not sent through a
/// proxy on loopback.
pub fn wechatpy_intercepted(proxy: std::net::SocketAddr, ca: &Path) -> Driver {
    let program = ensure_env().join("py/bin/python");
    Driver {
        program,
        script: "tests/sdk/wechatpy_driver.py",
        args: vec!["--via".into(), "intercept".into()],
        env: vec![
            ("HTTPS_PROXY".into(), format!("http://{proxy}")),
            ("REQUESTS_CA_BUNDLE".into(), ca.display().to_string()),
        ],
    }
}

/// wechat-api (node-webot) with `api.endpoint = base`. Calls: see `CALLS`
/// in `tests/sdk/wechat_api_driver.js`.
pub fn wechat_api(base: &str) -> Driver {
    ensure_env();
    Driver {
        program: PathBuf::from("node"),
        script: "tests/sdk/wechat_api_driver.js",
        args: vec!["--base".into(), base.into()],
        env: Vec::new(),
    }
}

impl Driver {
    /// The SDK starts with this access token (no token request).
    pub fn token(self, token: &str) -> Self {
        self.opt("--token", token)
    }

    /// The appid the SDK fetches its token for (with secret `SECRET`).
    pub fn appid(self, appid: &str) -> Self {
        self.opt("--appid", appid)
    }

    /// wechatpy: a `wechatpy.enterprise` client of WeCom app `agent` of
    /// corp `corpid` with the app's `secret` (it fetches its token from
    /// `gettoken` through the base URL). Calls: `wecom.send_all`, `wecom.send_party`.
    pub fn wecom(self, corpid: &str, secret: &str, agent: i64) -> Self {
        self.opt("--appid", corpid).opt("--secret", secret).opt("--agent", &agent.to_string()).flag("--wecom")
    }

    fn flag(mut self, flag: &str) -> Self {
        self.args.push(flag.to_owned());
        self
    }

    /// `X-Wx-Account` on every call (wechatpy: with [`Driver::contrib`]).
    pub fn account(self, account: &str) -> Self {
        self.opt("--account", account)
    }

    /// wechatpy: every call routed by `contrib/wechatpy_wxgate.py` instead of `API_BASE_URL`.
    pub fn contrib(self) -> Self {
        self.opt("--via", "contrib")
    }

    /// wxgate is the token server: the SDK sends `access_token=` (empty)
    /// on every call, never asks for a token and holds no secret (the
    /// settings of README "wxgate as your token server").
    pub fn no_token(mut self) -> Self {
        self.args.push("--no-token".to_owned());
        self
    }

    fn opt(mut self, flag: &str, value: &str) -> Self {
        self.args.extend([flag.to_owned(), value.to_owned()]);
        self
    }

    /// Makes these calls in order, in one SDK client, and returns what its
    /// caller saw for each. The driver runs on a blocking thread, so a
    /// [`super::Gate`] on this runtime keeps serving; it is killed and the
    /// test fails after [`DRIVER_DEADLINE`].
    pub async fn calls(self, calls: &[&str]) -> Vec<Seen> {
        let env = env_dir();
        let mut cmd = Command::new(&self.program);
        cmd.arg(repo().join(self.script))
            .args(&self.args)
            .args(calls)
            .current_dir(repo())
            .env("PYTHONPATH", repo().join("contrib"))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env("NODE_PATH", env.join("node/node_modules"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for proxy in [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "NO_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
            "no_proxy",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "SSL_CERT_FILE",
        ] {
            cmd.env_remove(proxy);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let what = format!("{} {}", self.script, calls.join(" "));
        let (ok, stdout, stderr) =
            tokio::task::spawn_blocking(move || run_with_deadline(cmd, DRIVER_DEADLINE)).await.expect("driver thread");
        assert!(ok, "{what} failed:\n{stdout}{stderr}");
        let seen: Vec<Seen> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: not a JSON line ({e}): {l}\n{stderr}")))
            .collect();
        assert_eq!(seen.len(), calls.len(), "{what}: one line per call:\n{stdout}{stderr}");
        seen
    }
}

/// Runs `cmd` to completion: whether it exited 0, its stdout and stderr.
/// Killed, and reported as a failure, when it runs past `limit`.
fn run_with_deadline(mut cmd: Command, limit: Duration) -> (bool, String, String) {
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout")));
    let err = drain(Box::new(child.stderr.take().expect("stderr")));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break Some(status);
        }
        if start.elapsed() >= limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let (stdout, mut stderr) = (out.join().expect("stdout reader"), err.join().expect("stderr reader"));
    if status.is_none() {
        stderr.push_str(&format!("(killed: still running after {limit:?})\n"));
    }
    (status.is_some_and(|s| s.success()), stdout, stderr)
}
