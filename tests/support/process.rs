//! The wxgate binary as a real process, for multi-instance and crash tests.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// A running wxgate process; killed on drop.
pub struct Instance {
    pub child: Child,
    pub addr: SocketAddr,
    /// The admin listener's address, if it runs.
    pub admin: Option<SocketAddr>,
    /// Everything the process has logged so far (stderr).
    pub log: Arc<Mutex<String>>,
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Instance {
    /// What the process has logged so far.
    pub fn logged(&self) -> String {
        self.log.lock().expect("log").clone()
    }

    /// Kills the process at once (SIGKILL): no graceful shutdown, no releases.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `wxgate --config <file with config>` (listen on 127.0.0.1:0) with
/// extra environment, and waits until it logs the address it serves on.
/// `Err` carries everything it logged if it exits first.
pub fn spawn(config: &str, tag: &str, env: &[(&str, &str)]) -> Result<Instance, String> {
    let path = std::env::temp_dir().join(format!("wxgate-{}-{tag}.toml", std::process::id()));
    std::fs::write(&path, config).expect("write config");
    spawn_path(&path, env)
}

/// Like [`spawn`], with an existing config file.
pub fn spawn_path(path: &std::path::Path, env: &[(&str, &str)]) -> Result<Instance, String> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wxgate"));
    cmd.args(["--config", path.to_str().expect("utf-8 path")])
        .env("WXGATE_LOG", "info")
        .env_remove("WXGATE_REDIS_PASSWORD")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn wxgate");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let mut seen = String::new();
    loop {
        let Some(Ok(line)) = lines.next() else {
            let _ = child.wait();
            return Err(seen);
        };
        seen.push_str(&line);
        seen.push('\n');
        if let Some(addr) = field(&line, "listen").and_then(|a| a.parse().ok()) {
            let admin = field(&line, "admin").and_then(|a| a.parse().ok());
            // Keep reading stderr (so the process never blocks on a full pipe), and keep it.
            let log = Arc::new(Mutex::new(seen));
            let keep = log.clone();
            std::thread::spawn(move || {
                for line in lines.map_while(Result::ok) {
                    let mut l = keep.lock().expect("log");
                    l.push_str(&line);
                    l.push('\n');
                }
            });
            return Ok(Instance { child, addr, admin, log });
        }
    }
}

/// The value of `name` in a text (`name=value`) or JSON (`"name":"value"`) log line.
fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    if let Some(rest) = line.split(&format!(" {name}=")).nth(1) {
        return rest.split_whitespace().next();
    }
    let rest = line.split(&format!("\"{name}\":\"")).nth(1)?;
    rest.split('"').next()
}
