//! `[queue]` → [`QueueConfig`]: where queued deliveries (issue 47,
//! docs/queued-delivery.md) are kept, what any caller or account may keep
//! there, and how a job is retried. A rule allows queuing with `queue =
//! true` (its `queue_deadline` the default deadline of its jobs); a
//! `[[caller]]`'s `deliver`, `weight` and `callbacks` are read with it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::errors::Invalid;
use super::units::{beside_config, micros, parse_duration, parse_size};
use crate::time::Micros;

const TABLE: &str = "[queue]";

/// The default jobs file of the embedded store, beside its state file.
pub const DEFAULT_FILE: &str = "wxgate-queue.db";

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawQueue {
    pub file: Option<String>,
    pub max_body: Option<String>,
    pub caller_jobs: Option<u64>,
    pub caller_bytes: Option<String>,
    pub account_jobs: Option<u64>,
    pub account_bytes: Option<String>,
    pub ended_jobs: Option<u64>,
    pub keep: Option<String>,
    pub idempotency: Option<String>,
    pub deadline: Option<String>,
    pub lease: Option<String>,
    pub attempts: Option<u32>,
    pub backoff: Option<String>,
    pub backoff_max: Option<String>,
    pub callback_key_file: Option<String>,
    pub callback_for: Option<String>,
    pub max_in_flight: Option<u32>,
    pub instance_in_flight: Option<u32>,
    pub replicas: Option<RawReplicas>,
}

/// `[queue] replicas` as written: `"auto"` or a number.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawReplicas {
    Count(i64),
    Text(String),
}

/// `[queue] replicas`: how many Redis replicas must hold a job's `sending`
/// mark before its request goes out (src/jobs/redis/sending.rs), so that a
/// failover to one of them cannot hand the job out again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Replicas {
    /// One, on a master that has (or, since its replication id last
    /// changed, had) a replica; none on a master that never had one.
    #[default]
    Auto,
    /// Always this many (0: never wait).
    Exactly(u32),
}

/// Most replicas `[queue] replicas` may name.
const MAX_REPLICAS: i64 = 16;

/// Where the jobs live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobsAt {
    /// No queued delivery (`file = "off"` on the memory store, or no
    /// config directory to put the file in): a call asking for it gets 400.
    Off,
    /// The embedded store's SQLite file.
    File(PathBuf),
    /// In the Redis deployment of `[store]`.
    Redis,
}

/// `[queue]`, compiled. Read at start (a reload keeps the jobs store it
/// started with; bounds, deadlines and retries follow the reload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    pub at: JobsAt,
    /// Most bytes of one queued call's body (413 past it).
    pub max_body: u64,
    pub bounds: Bounds,
    /// How long an ended job is kept (then purged).
    pub keep_us: Micros,
    /// A job's deadline when neither the call nor its rule gives one.
    pub deadline_us: Micros,
    /// A dispatcher's lease on the jobs it claims.
    pub lease_us: Micros,
    pub backoff: Backoff,
    /// The key callbacks are signed with (`WXGATE_CALLBACK_KEY`, else
    /// `[queue] callback_key_file`); `None`: no caller may name a callback.
    pub callback_key: Option<CallbackKey>,
    /// How long after its job ended a callback is tried (then given up).
    pub callback_for_us: Micros,
    /// Most sends of one queue (caller, account, rule) one instance has
    /// under way at once: the ceiling of its adaptive in-flight
    /// (docs/queued-delivery.md "Pace").
    pub max_in_flight: u32,
    /// Most queued sends one instance has under way at once, all queues.
    pub instance_in_flight: u32,
    /// The replicas a `sending` mark must be on (jobs in Redis only; read
    /// when the jobs store opens).
    pub replicas: Replicas,
}

/// The environment variable that gives the callback key (before
/// `[queue] callback_key_file`).
pub const CALLBACK_KEY_ENV: &str = "WXGATE_CALLBACK_KEY";

/// Shortest callback key (e.g. `openssl rand -hex 32`).
const MIN_CALLBACK_KEY: usize = 16;

/// The HMAC-SHA256 key of callbacks' `X-Wxgate-Signature`: its `Debug`
/// never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct CallbackKey(std::sync::Arc<[u8]>);

impl CallbackKey {
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for CallbackKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallbackKey(..)")
    }
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            at: JobsAt::Off,
            max_body: 64 * 1024,
            bounds: Bounds {
                caller_jobs: 100_000,
                caller_bytes: 256 << 20,
                account_jobs: 200_000,
                account_bytes: 512 << 20,
                ended_jobs: 100_000,
                idempotency_us: 24 * 3_600_000_000,
            },
            keep_us: 7 * 24 * 3_600_000_000,
            deadline_us: 24 * 3_600_000_000,
            lease_us: 30_000_000,
            backoff: Backoff::default(),
            callback_key: None,
            callback_for_us: 24 * 3_600_000_000,
            max_in_flight: 256,
            instance_in_flight: 1024,
            replicas: Replicas::Auto,
        }
    }
}

/// What a store keeps any caller and any account to; past one of the
/// unfinished bounds, a submission is refused whole (the jobs store's
/// `SubmitError::Full`); past `ended_jobs`, the oldest ended jobs go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Unfinished jobs (and their body bytes) of one caller, all accounts.
    pub caller_jobs: u64,
    pub caller_bytes: u64,
    /// Unfinished jobs (and their body bytes) of one account, all callers.
    pub account_jobs: u64,
    pub account_bytes: u64,
    /// Ended jobs (their metadata and WeChat's answer; the body goes when a
    /// job ends) one caller keeps in one account: past it, that caller's
    /// oldest ended jobs there are deleted early, their `Idempotency-Key`s
    /// with them. Never refuses a submission.
    pub ended_jobs: u64,
    /// How long an `Idempotency-Key` returns its first job's id.
    pub idempotency_us: Micros,
}

/// How retries are spread and bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first retry waits up to this long.
    pub base_us: Micros,
    /// No retry waits longer.
    pub cap_us: Micros,
    /// After this many attempts that reached (or may have reached) WeChat,
    /// a "not now" fails the job with the last answer.
    pub max_attempts: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { base_us: 1_000_000, cap_us: 300_000_000, max_attempts: 10 }
    }
}

/// Longest deadline a job may be given (and `keep`, `idempotency`).
pub const MAX_DEADLINE: Duration = Duration::from_secs(31 * 24 * 3600);

/// `redis`: the store is Redis (the jobs live there). `state_dir`: the
/// memory store's state file's directory (the jobs file's default place;
/// `None`: `state_file = "off"`, and queued delivery is off unless `file`
/// is given). `dir`: the config file's directory (a relative `file`).
pub(super) fn compile(
    raw: RawQueue,
    redis: bool,
    state_dir: Option<&Path>,
    dir: Option<&Path>,
) -> Result<QueueConfig, Invalid> {
    let d = QueueConfig::default();
    let at = match (raw.file.as_deref(), redis) {
        (Some(_), true) => {
            return Err(Invalid::at(TABLE, "file", "with a Redis [store] the jobs live in Redis: leave file out"))
        }
        (None, true) => JobsAt::Redis,
        (Some("off"), false) => JobsAt::Off,
        (Some(""), false) => return Err(Invalid::at(TABLE, "file", "give a file path, or \"off\"")),
        (Some(path), false) => JobsAt::File(beside_config(dir, Path::new(path))),
        (None, false) => state_dir.map_or(JobsAt::Off, |d| JobsAt::File(d.join(DEFAULT_FILE))),
    };
    if let JobsAt::File(path) = &at {
        if path.file_name().is_none() || path.is_dir() {
            return Err(Invalid::at(TABLE, "file", format!("{} is not a file name", path.display())));
        }
    }
    let size = |text: Option<&str>, key: &str, default: u64| -> Result<u64, Invalid> {
        match text {
            None => Ok(default),
            Some(t) => match parse_size(t).map_err(|e| e.field(key).table(TABLE))? {
                0 => Err(Invalid::at(TABLE, key, "must be more than 0")),
                n => Ok(n),
            },
        }
    };
    let span = |text: Option<&str>, key: &str, default: Micros, least: Duration, most: Duration| {
        let Some(t) = text else { return Ok(default) };
        let got = parse_duration(t).map_err(|e| e.field(key).table(TABLE))?;
        if got < least || got > most {
            return Err(Invalid::at(TABLE, key, format!("\"{t}\" must be between {least:?} and {most:?}")));
        }
        Ok(micros(got))
    };
    let count = |n: Option<u64>, key: &str, default: u64| match n {
        Some(0) => Err(Invalid::at(TABLE, key, "must be at least 1")),
        Some(n) => Ok(n),
        None => Ok(default),
    };
    let max_body = size(raw.max_body.as_deref(), "max_body", d.max_body)?;
    if max_body > 1 << 20 {
        return Err(Invalid::at(TABLE, "max_body", "at most 1MiB: a queued body is kept until it is sent"));
    }
    let second = Duration::from_secs(1);
    let bounds = Bounds {
        caller_jobs: count(raw.caller_jobs, "caller_jobs", d.bounds.caller_jobs)?,
        caller_bytes: size(raw.caller_bytes.as_deref(), "caller_bytes", d.bounds.caller_bytes)?,
        account_jobs: count(raw.account_jobs, "account_jobs", d.bounds.account_jobs)?,
        account_bytes: size(raw.account_bytes.as_deref(), "account_bytes", d.bounds.account_bytes)?,
        ended_jobs: count(raw.ended_jobs, "ended_jobs", d.bounds.ended_jobs)?,
        idempotency_us: span(raw.idempotency.as_deref(), "idempotency", d.bounds.idempotency_us, second, MAX_DEADLINE)?,
    };
    let keep_us = span(raw.keep.as_deref(), "keep", d.keep_us, Duration::from_secs(60), MAX_DEADLINE)?;
    let deadline_us = deadline(raw.deadline.as_deref()).map_err(|e| e.table(TABLE))?.unwrap_or(d.deadline_us);
    let lease_us = span(raw.lease.as_deref(), "lease", d.lease_us, Duration::from_secs(5), Duration::from_secs(600))?;
    let max_attempts = match raw.attempts {
        Some(0) | Some(101..) => return Err(Invalid::at(TABLE, "attempts", "must be between 1 and 100")),
        Some(n) => n,
        None => d.backoff.max_attempts,
    };
    let hour = Duration::from_secs(3600);
    let base_us = span(raw.backoff.as_deref(), "backoff", d.backoff.base_us, Duration::from_millis(10), hour)?;
    let cap_us = span(raw.backoff_max.as_deref(), "backoff_max", d.backoff.cap_us, Duration::from_millis(10), hour)?;
    if cap_us < base_us {
        return Err(Invalid::at(TABLE, "backoff_max", "must not be shorter than backoff"));
    }
    let callback_for_us =
        span(raw.callback_for.as_deref(), "callback_for", d.callback_for_us, Duration::from_secs(60), MAX_DEADLINE)?;
    let replicas = match (raw.replicas, redis) {
        (None, _) => Replicas::Auto,
        (Some(_), false) => {
            return Err(Invalid::at(TABLE, "replicas", "only with a Redis [store] (the jobs are in a file here)"))
        }
        (Some(RawReplicas::Text(t)), true) if t == "auto" => Replicas::Auto,
        (Some(RawReplicas::Count(n)), true) if (0..=MAX_REPLICAS).contains(&n) => Replicas::Exactly(n as u32),
        (Some(_), true) => {
            return Err(Invalid::at(TABLE, "replicas", format!("\"auto\" or a number from 0 to {MAX_REPLICAS}")))
        }
    };
    let env_key = std::env::var(CALLBACK_KEY_ENV).ok().filter(|k| !k.trim().is_empty());
    let callback_key = match (env_key, raw.callback_key_file.as_deref()) {
        (Some(key), _) => Some(callback_key(key.trim().as_bytes()).map_err(|e| e.field(CALLBACK_KEY_ENV))?),
        (None, None) => None,
        (None, Some(file)) => Some(read_callback_key(&beside_config(dir, Path::new(file)))?),
    };
    let in_flight = |n: Option<u32>, key: &str, default: u32| match n {
        None => Ok(default),
        Some(n @ 1..=10_000) => Ok(n),
        Some(_) => Err(Invalid::at(TABLE, key, "must be between 1 and 10000")),
    };
    let max_in_flight = in_flight(raw.max_in_flight, "max_in_flight", d.max_in_flight)?;
    let instance_in_flight = in_flight(raw.instance_in_flight, "instance_in_flight", d.instance_in_flight)?;
    Ok(QueueConfig {
        at,
        max_body,
        bounds,
        keep_us,
        deadline_us,
        lease_us,
        backoff: Backoff { base_us, cap_us, max_attempts },
        callback_key,
        callback_for_us,
        max_in_flight,
        instance_in_flight,
        replicas,
    })
}

fn callback_key(key: &[u8]) -> Result<CallbackKey, Invalid> {
    if key.len() < MIN_CALLBACK_KEY {
        return Err(Invalid::new(format!(
            "the callback key is shorter than {MIN_CALLBACK_KEY} bytes (make one with: openssl rand -hex 32)"
        )));
    }
    Ok(CallbackKey(key.into()))
}

/// `[queue] callback_key_file`: the key (surrounding whitespace ignored),
/// in a file only its owner (and group) may read.
fn read_callback_key(path: &Path) -> Result<CallbackKey, Invalid> {
    let field = "callback_key_file";
    super::units::check_secret_mode(path, field, "whoever reads it can sign callbacks as wxgate")
        .map_err(|e| e.table(TABLE))?;
    let text = std::fs::read(path).map_err(|e| Invalid::at(TABLE, field, format!("{}: {e}", path.display())))?;
    callback_key(text.trim_ascii()).map_err(|e| e.field(field).table(TABLE))
}

/// Callers that name callback prefixes need a key to sign callbacks with:
/// without one the config is refused, naming the first such caller
/// (`with_callbacks`).
pub fn check_callbacks(queue: &QueueConfig, with_callbacks: Option<&str>) -> Result<(), Invalid> {
    match (queue.callback_key.is_some(), with_callbacks) {
        (true, _) | (false, None) => Ok(()),
        (false, Some(name)) => Err(Invalid::at(
            TABLE,
            "callback_key_file",
            format!(
                "[[caller]] \"{name}\" has callbacks, which are signed: give a key in [queue] callback_key_file \
                 (a file of mode 0600) or the {CALLBACK_KEY_ENV} environment variable"
            ),
        )),
    }
}

/// A deadline setting (`[queue] deadline`, a rule's `queue_deadline`): a
/// duration from submission, 1s to 31 days.
pub(super) fn deadline(text: Option<&str>) -> Result<Option<Micros>, Invalid> {
    let Some(t) = text else { return Ok(None) };
    let got = parse_duration(t).map_err(|e| e.field("deadline"))?;
    if got < Duration::from_secs(1) || got > MAX_DEADLINE {
        return Err(Invalid::at_field("deadline", format!("\"{t}\" must be between 1s and 31 days")));
    }
    Ok(Some(micros(got)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replicas(text: &str, redis: bool) -> Result<Replicas, String> {
        let raw: RawQueue = toml::from_str(text).map_err(|e| e.to_string())?;
        compile(raw, redis, None, None).map(|q| q.replicas).map_err(|e| e.to_string())
    }

    #[test]
    fn replicas_is_auto_or_a_number_and_only_for_jobs_in_redis() {
        assert_eq!(replicas("", true), Ok(Replicas::Auto));
        assert_eq!(replicas("replicas = \"auto\"", true), Ok(Replicas::Auto));
        assert_eq!(replicas("replicas = 0", true), Ok(Replicas::Exactly(0)));
        assert_eq!(replicas("replicas = 2", true), Ok(Replicas::Exactly(2)));
        for bad in ["replicas = -1", "replicas = 17", "replicas = \"all\"", "replicas = 1.5"] {
            let e = replicas(bad, true).expect_err(bad);
            assert!(e.contains("replicas"), "{bad}: {e}");
        }
        let e = replicas("replicas = 1", false).expect_err("jobs in a file");
        assert!(e.contains("[queue] replicas") && e.contains("Redis"), "{e}");
    }
}
