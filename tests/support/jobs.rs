//! Queued delivery's jobs stores (tests/jobs_conformance.rs): submissions
//! to build, bounds, answers, and this test binary run again as a child
//! process (to kill it at a chosen moment).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use wxgate::jobs::{Answer, Bounds, Lanes, NewJob, QueueKey};

use super::GUARD;

/// The queue of `caller` for `account` and `rule`.
pub fn queue(caller: &str, account: &str, rule: &str) -> QueueKey {
    QueueKey { caller: caller.into(), account: account.into(), rule: rule.into() }
}

/// A template-message submission to `recipient` (its lane), with a body
/// of `body` bytes.
pub fn job_to(queue: &QueueKey, recipient: &str, body: usize) -> NewJob {
    NewJob { lanes: Lanes::of([recipient]), ..new_job(queue, body) }
}

/// [`new_job`] in a strict queue (one at a time, in order: `queue_order =
/// "strict"`).
pub fn strict_job(queue: &QueueKey, body: usize) -> NewJob {
    NewJob { lanes: Lanes::strict(), ..new_job(queue, body) }
}

/// A template-message submission with a body of `body` bytes, naming no
/// recipient (ordered with no other job).
pub fn new_job(queue: &QueueKey, body: usize) -> NewJob {
    NewJob {
        queue: queue.clone(),
        domain: "api.weixin.qq.com".into(),
        method: "POST".into(),
        target: "/cgi-bin/message/template/send".into(),
        content_type: Some("application/json".into()),
        body: Bytes::from(vec![b'x'; body]),
        deadline_us: None,
        idempotency_key: None,
        callback: None,
        traceparent: None,
        lanes: Lanes::default(),
    }
}

/// Bounds nothing in a test reaches; idempotency keys kept `idempotency_us`.
pub fn roomy(idempotency_us: i64) -> Bounds {
    Bounds {
        caller_jobs: 1_000_000,
        caller_bytes: 1 << 40,
        account_jobs: 1_000_000,
        account_bytes: 1 << 40,
        ended_jobs: 1_000_000,
        idempotency_us,
    }
}

pub fn answer(status: u16, errcode: i64, body: &str) -> Answer {
    Answer { status, errcode: Some(errcode), body: Bytes::copy_from_slice(body.as_bytes()) }
}

/// This test binary, run again to run only `test` (its full name,
/// `module::name`) with `env` set: the child's side of a test checks the
/// variable and does its part.
/// Killed (SIGKILL) on drop.
pub struct SelfChild {
    child: Child,
    lines: mpsc::Receiver<String>,
    reader: Option<JoinHandle<()>>,
}

impl SelfChild {
    pub fn spawn(test: &str, env: &[(&str, &str)]) -> SelfChild {
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut cmd = Command::new(exe);
        cmd.args([test, "--exact", "--nocapture", "--test-threads=1"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn the test binary");
        let stdout = child.stdout.take().expect("stdout");
        let (send, lines) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        SelfChild { child, lines, reader: Some(reader) }
    }

    /// What follows `marker` in the next line the child printed that holds
    /// it (libtest may print its own text before it on the same line),
    /// within [`GUARD`]; panics if the child ends or stays silent.
    pub fn next(&self, marker: &str) -> String {
        let deadline = Instant::now() + GUARD;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(at) = line.find(marker) {
                        return line[at + marker.len()..].to_owned();
                    }
                }
                Err(e) => panic!("the child printed no `{marker}` line within {GUARD:?}: {e}"),
            }
        }
    }

    /// SIGKILL, and wait for it to be gone.
    pub fn kill(&mut self) {
        super::process::signal(self.child.id(), "-KILL");
        let _ = self.child.wait();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

impl Drop for SelfChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How long a child waits to be killed before it gives up on its own.
pub const CHILD_LIFE: Duration = Duration::from_secs(60);
