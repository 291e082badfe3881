//! The wxgate binary as a real process, for multi-instance and crash tests.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

/// A running wxgate process; killed on drop.
pub struct Instance {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Instance {
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
        if let Some(rest) = line.split("listen=").nth(1) {
            let addr = rest.split_whitespace().next().expect("address").parse().expect("socket address");
            // Keep draining stderr so the process never blocks on a full pipe.
            std::thread::spawn(move || for _ in lines {});
            return Ok(Instance { child, addr });
        }
    }
}
