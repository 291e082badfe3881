//! wxgate config TOML, built field by field: the `[server]` table, a
//! `[store]`, `[[rule]]` and `[[caller]]` blocks. Each builder displays as its TOML text.
//! Tests *about* the TOML text (parse errors, fixtures) write it by hand.

use std::fmt;

/// One TOML value as written in a config (`"3s"`, `5`, `true`, `["/a"]`).
fn value(v: impl Into<toml::Value>) -> String {
    v.into().to_string()
}

/// `key = value` lines in order; setting a key again replaces its value.
#[derive(Clone, Default)]
struct Fields(Vec<(String, String)>);

impl Fields {
    fn set(&mut self, key: &str, v: String) {
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some((_, old)) => *old = v,
            None => self.0.push((key.to_owned(), v)),
        }
    }

    fn remove(&mut self, key: &str) {
        self.0.retain(|(k, _)| k != key);
    }
}

impl fmt::Display for Fields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, v) in &self.0 {
            writeln!(f, "{k} = {v}")?;
        }
        Ok(())
    }
}

/// A `[[rule]]` block. Starts with `limits = []` and no `match` (a rule
/// named "default" catches unmatched paths).
#[derive(Clone)]
pub struct RuleToml {
    name: String,
    patterns: Vec<String>,
    limits: Vec<String>,
    more: Fields,
}

/// A `[[rule]]` named `name`.
pub fn rule(name: &str) -> RuleToml {
    RuleToml { name: name.to_owned(), patterns: Vec::new(), limits: Vec::new(), more: Fields::default() }
}

impl RuleToml {
    /// Adds a path pattern to `match`.
    pub fn matching(mut self, pattern: &str) -> Self {
        self.patterns.push(pattern.to_owned());
        self
    }

    /// Adds `{ count, per }` to `limits` (`per` a duration such as "10s", or "day").
    pub fn limit(mut self, count: u64, per: &str) -> Self {
        self.limits.push(format!("{{ count = {count}, per = {} }}", value(per)));
        self
    }

    /// Adds `{ count, per, burst }` to `limits`.
    pub fn limit_burst(mut self, count: u64, per: &str, burst: u64) -> Self {
        self.limits.push(format!("{{ count = {count}, per = {}, burst = {burst} }}", value(per)));
        self
    }

    pub fn max_wait(self, d: &str) -> Self {
        self.set("max_wait", d)
    }

    pub fn warmup(self, d: &str) -> Self {
        self.set("warmup", d)
    }

    pub fn concurrency(self, n: u32) -> Self {
        self.set("concurrency", n)
    }

    /// `mode = "shadow"`: count what would be refused, forward everything.
    pub fn shadow(self) -> Self {
        self.set("mode", "shadow")
    }

    /// Any other key of the rule; setting a key again replaces it.
    pub fn set(mut self, key: &str, v: impl Into<toml::Value>) -> Self {
        self.more.set(key, value(v));
        self
    }
}

impl fmt::Display for RuleToml {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "[[rule]]\nname = {}", value(self.name.as_str()))?;
        if !self.patterns.is_empty() {
            writeln!(f, "match = {}", value(self.patterns.clone()))?;
        }
        writeln!(f, "limits = [{}]", self.limits.join(", "))?;
        write!(f, "{}", self.more)
    }
}

/// A `[[caller]]` block: a declared caller, `priority` and `rate` only if set.
#[derive(Clone)]
pub struct CallerToml {
    name: String,
    more: Fields,
}

/// A `[[caller]]` named `name`.
pub fn caller(name: &str) -> CallerToml {
    CallerToml { name: name.to_owned(), more: Fields::default() }
}

impl CallerToml {
    /// `priority = "high"`.
    pub fn high(self) -> Self {
        self.set("priority", "high")
    }

    /// `rate = "..."`: the flood guard, e.g. "5/s".
    pub fn rate(self, rate: &str) -> Self {
        self.set("rate", rate)
    }

    /// Any other key; setting a key again replaces it.
    pub fn set(mut self, key: &str, v: impl Into<toml::Value>) -> Self {
        self.more.set(key, value(v));
        self
    }
}

impl fmt::Display for CallerToml {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "[[caller]]\nname = {}", value(self.name.as_str()))?;
        write!(f, "{}", self.more)
    }
}

/// The hex SHA-256 of a caller's key, as `key_sha256` takes it.
pub fn key_sha256(key: &str) -> String {
    wxgate::config::KeyDigest::of(key.as_bytes()).0.iter().map(|b| format!("{b:02x}")).collect()
}

/// A `[[penalty]]` block: WeChat's `errcode` pauses the (account, rule) for `seconds`.
pub fn penalty(errcode: i64, seconds: u64) -> String {
    format!("[[penalty]]\nerrcode = {errcode}\nseconds = {seconds}\n")
}

/// A `[store]` table.
#[derive(Clone)]
pub struct StoreToml(Fields);

impl StoreToml {
    /// `kind = "memory"`.
    pub fn memory() -> StoreToml {
        let mut f = Fields::default();
        f.set("kind", value("memory"));
        StoreToml(f)
    }

    /// `kind = "redis"` at `url`, with `timeout = "2s"` (and no lease or
    /// reserve when `WXGATE_TEST_PER_CALL=1`).
    pub fn redis(url: &str) -> StoreToml {
        let mut f = Fields::default();
        f.set("kind", value("redis"));
        f.set("url", value(url));
        f.set("timeout", value("2s"));
        StoreToml(f).with_test_leases()
    }

    /// `kind = "redis-cluster"` on these seed `nodes`, with `timeout = "1s"`
    /// (and no lease or reserve when `WXGATE_TEST_PER_CALL=1`).
    pub fn redis_cluster(nodes: Vec<String>) -> StoreToml {
        let mut f = Fields::default();
        f.set("kind", value("redis-cluster"));
        f.set("nodes", value(nodes));
        f.set("timeout", value("1s"));
        StoreToml(f).with_test_leases()
    }

    /// The suite's second mode (scripts/test.sh runs the Redis tests again
    /// with `WXGATE_TEST_PER_CALL=1`): every Redis store a test starts
    /// decides each call on its own (`quota_leases = false`, `quota_reserve
    /// = "0s"`), and every guarantee the test asserts must hold.
    fn with_test_leases(self) -> StoreToml {
        if super::test_per_call() {
            self.per_call()
        } else {
            self
        }
    }

    /// Every call decided on its own: no quota lease, no reserve (the
    /// per-call path, whose fallback guesses a share of a calendar quota;
    /// tests of that path and of what it asks of Redis).
    pub fn per_call(self) -> StoreToml {
        self.set("quota_leases", false).set("quota_reserve", "0s")
    }

    /// Any other key (`timeout`, `fallback`, `lease`, `refusal_cache`, ...);
    /// setting a key again replaces it.
    pub fn set(mut self, key: &str, v: impl Into<toml::Value>) -> Self {
        self.0.set(key, value(v));
        self
    }
}

impl fmt::Display for StoreToml {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[store]\n{}", self.0)
    }
}

/// A whole config: `[server]` in front of an upstream, listening on free
/// loopback ports (proxy and admin), with `upstream_timeout = "2s"`; then
/// whatever sections are added, in order.
#[derive(Clone)]
pub struct ConfigToml {
    server: Fields,
    sections: Vec<String>,
}

impl ConfigToml {
    /// In front of `upstream`, an `http://host:port` (or `https://`) base.
    pub fn new(upstream: &str) -> ConfigToml {
        let mut server = Fields::default();
        server.set("listen", value("127.0.0.1:0"));
        server.set("admin_listen", value("127.0.0.1:0"));
        server.set("upstream", value(upstream));
        server.set("upstream_timeout", value("2s"));
        // Windows exact at the decision, so that tests can state exact
        // moments; the arrival margin has tests of its own (tests/shaping.rs),
        // which set it or leave this key out for the default. Nor does the
        // margin widen on a busy machine (a process's real clock): that
        // has its own test (tests/shaping.rs).
        server.set("window_margin", value("0s"));
        server.set("window_margin_max", value("0s"));
        ConfigToml { server, sections: Vec::new() }
    }

    /// In front of these upstreams, tried in order (`upstream = [...]`,
    /// failover).
    pub fn upstreams(urls: &[&str]) -> ConfigToml {
        ConfigToml::new("").server("upstream", urls.iter().map(|u| u.to_string()).collect::<Vec<_>>())
    }

    /// A `[server]` key; setting a key again replaces it.
    pub fn server(mut self, key: &str, v: impl Into<toml::Value>) -> Self {
        self.server.set(key, value(v));
        self
    }

    /// Leaves a default `[server]` key out.
    pub fn without_server(mut self, key: &str) -> Self {
        self.server.remove(key);
        self
    }

    /// Adds a section: a [`RuleToml`], a [`StoreToml`], or TOML text
    /// (`[[penalty]]`, `[log]`, several rules).
    pub fn with(mut self, section: impl fmt::Display) -> Self {
        self.sections.push(section.to_string());
        self
    }
}

impl fmt::Display for ConfigToml {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[server]\n{}", self.server)?;
        for s in self.sections.iter().filter(|s| !s.is_empty()) {
            write!(f, "\n{s}")?;
            if !s.ends_with('\n') {
                writeln!(f)?;
            }
        }
        Ok(())
    }
}

/// A `quota_timezone` in which it is around noon now, so that a test's
/// calendar day does not end while it runs.
pub fn midday_timezone() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    let utc_hour = ((secs / 3600) % 24) as i64;
    let offset = 12 - utc_hour;
    format!("{}{:02}:00", if offset < 0 { '-' } else { '+' }, offset.abs())
}
