//! The integration tests, one test binary: each tests/<name>.rs is the
//! module `<name>` here, and tests/support (the mock WeChat, wxgate as a
//! process, redis-server, ...) is compiled and linked with wxgate once, not
//! once per file (64 binaries linking it were most of CI's time).
//!
//! One file's tests: its module as the filter, `cargo test --test all
//! console::`; several filters run what any of them matches. A filter
//! matches anywhere in a name, so `conformance::` also runs
//! `jobs_conformance::` and `fallback_conformance::` (`-- --skip
//! jobs_conformance::` leaves one out).
//!
//! Every file's tests share this process and run at the same time, so none
//! changes what is process-wide: no test sets an environment variable, the
//! current directory or a global tracing subscriber here (a child process
//! gets its environment through its `Command`); scratch directories are
//! unique in the process (`support::temp`); servers listen on free ports
//! the system hands out; what support keeps process-wide is set once
//! (`support::sdk::ensure_env`).

mod support;

mod accounts;
mod admin;
mod app_scope;
mod architecture;
mod broadcasts;
mod broker;
mod caller_auth;
mod callers;
mod campaign;
mod config;
mod conformance;
mod console;
mod dashboards;
mod decision;
mod deploy;
mod docs_links;
mod domains;
mod durability;
mod encodings;
mod failover;
mod fallback_conformance;
mod forecasts;
mod forwarding;
mod fuzz;
mod hostile;
mod instances;
mod intercept;
mod jobs_bounded;
mod jobs_conformance;
mod jobs_redis;
mod learned_quota;
mod limits;
mod metric_volume;
mod multi_instance;
mod outage;
mod overrides;
mod penalties;
mod per_path;
mod queue;
mod queue_callbacks;
mod queue_drained;
mod queue_failover;
mod queue_metrics;
mod queue_pace;
mod queue_reload;
mod queue_shutdown;
mod quickstart;
mod quota_clear;
mod recipients;
mod redis_durability;
mod redis_healing;
mod redis_sentinel;
mod redis_store;
mod refunds;
mod refusals;
mod reload;
mod request_bodies;
mod reserve;
mod rules_files;
mod sdks;
mod secrets;
mod shaping;
mod share;
mod shutdown;
mod sim;
mod smuggling;
mod tls;
mod tokens;
mod tracing;
mod wecom_mock;
