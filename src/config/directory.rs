//! `[directory]` → [`DirectoryConfig`]: how wxgate keeps what WeCom's
//! directory says of a broadcast's members (`@all`, `toparty`, `totag`),
//! for rules whose `recipients` has `directory = true`
//! (`crate::features::directory`, docs/recipients.md).

use std::time::Duration;

use serde::Deserialize;

use super::errors::Invalid;
use super::units::{micros, parse_duration};
use crate::time::Micros;

const TABLE: &str = "[directory]";

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDirectory {
    pub ttl: Option<String>,
    pub max_members: Option<u64>,
    pub max_broadcast: Option<usize>,
    pub wait: Option<String>,
}

/// `[directory]`, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectoryConfig {
    /// How long a fetched visible range, department or tag is used (a
    /// member added to WeCom is counted after at most this); refreshed in
    /// the background from three quarters of it.
    pub ttl_us: Micros,
    /// Most member ids cached, every account, app, department and tag
    /// together (a member in two departments counts twice).
    pub max_members: u64,
    /// Most members one broadcast may reach: each gets its `per_recipient`
    /// windows in the one decision.
    pub max_broadcast: usize,
    /// Longest a call waits for the directory (its fetch, or another
    /// instance's) before the directory is taken as not answering.
    pub wait: Duration,
}

impl Default for DirectoryConfig {
    fn default() -> Self {
        DirectoryConfig {
            ttl_us: 10 * 60 * 1_000_000,
            max_members: 1_000_000,
            max_broadcast: 10_000,
            wait: Duration::from_secs(10),
        }
    }
}

/// Most `max_broadcast` may be: WeCom itself sends one message to at most
/// the corp's members; each is a key of one atomic decision.
pub const MAX_BROADCAST: usize = 100_000;

pub(super) fn compile(raw: RawDirectory) -> Result<DirectoryConfig, Invalid> {
    let d = DirectoryConfig::default();
    let at = |field: &str, e: Invalid| e.field(field).table(TABLE);
    let ttl_us = match raw.ttl.as_deref() {
        None => d.ttl_us,
        Some(t) => {
            let ttl = parse_duration(t).map_err(|e| at("ttl", e))?;
            if ttl < Duration::from_secs(10) || ttl > Duration::from_secs(86_400) {
                return Err(at("ttl", Invalid::new("between 10s and 1 day")));
            }
            micros(ttl)
        }
    };
    let max_members = raw.max_members.unwrap_or(d.max_members);
    if !(1_000..=100_000_000).contains(&max_members) {
        return Err(at("max_members", Invalid::new("between 1,000 and 100,000,000 member ids")));
    }
    let max_broadcast = raw.max_broadcast.unwrap_or(d.max_broadcast);
    if !(1..=MAX_BROADCAST).contains(&max_broadcast) {
        return Err(at("max_broadcast", Invalid::new(format!("between 1 and {MAX_BROADCAST} members"))));
    }
    let wait = match raw.wait.as_deref() {
        None => d.wait,
        Some(w) => {
            let wait = parse_duration(w).map_err(|e| at("wait", e))?;
            if wait.is_zero() || wait > Duration::from_secs(60) {
                return Err(at("wait", Invalid::new("between 1ms and 60s")));
            }
            wait
        }
    };
    Ok(DirectoryConfig { ttl_us, max_members, max_broadcast, wait })
}
