//! The local fallback decides as one of `[store] instances` instances
//! configured with its part of each limit: for every row, the Redis store
//! behind its safety net with Redis down (`fallback = "local"`,
//! `instances = 3`) and the memory store running the row's one-third config
//! give the same whole decisions, for normal and high-priority callers and
//! for callers' shares. The reserve and the shares are derived from the
//! scaled limits ([`wxgate::limit::Rule::scaled`]), never kept from the
//! whole rule.

use crate::support;

use std::path::Path;
use std::sync::Arc;

use support::redis_server::RedisServer;
use wxgate::config::{Config, Fallback, Resilience};
use wxgate::limit::{Ask, Decision, Key, Reason, Rule};
use wxgate::store::memory::MemoryStore;
use wxgate::store::redis::RedisStore;
use wxgate::store::resilient::{Resilient, StoreCounters};
use wxgate::store::Store;
use wxgate::time::ManualClock;

const SEC: i64 = 1_000_000;
const BEIJING: i64 = 8 * 3600 * SEC;
/// 2026-11-29 10:00:00 Beijing.
const T0: i64 = (20_786 * 86_400 + 2 * 3600) * SEC;

/// Who calls: a normal-priority caller, a high one, or a (normal) caller
/// whose `max_share` counts.
#[derive(Clone, Copy, Debug)]
enum By {
    Normal,
    High,
    Caller(&'static str),
    /// A message to this recipient (a high-priority caller's).
    To(&'static str),
}

struct Row {
    name: &'static str,
    /// The rule as configured for the whole deployment...
    whole: &'static str,
    /// ...and as one of three instances would be configured alone.
    third: &'static str,
    calls: Vec<By>,
    /// Calls the row must see admitted, and why the first refused one was.
    admitted: usize,
    refused: Reason,
}

fn rows() -> Vec<Row> {
    use By::*;
    vec![
        Row {
            name: "a_day_quota_and_its_reserve",
            whole: r#"limits = [{ count = 90, per = "day" }]
reserve = "40%""#,
            third: r#"limits = [{ count = 30, per = "day" }]
reserve = "40%""#,
            // 30 for this instance, 12 of them kept for high callers.
            calls: [vec![Normal; 20], vec![High; 14]].concat(),
            admitted: 30,
            refused: Reason::Reserve,
        },
        Row {
            name: "a_window_and_its_reserve",
            whole: r#"limits = [{ count = 60, per = "60s", burst = 30 }]
reserve = "20%""#,
            third: r#"limits = [{ count = 20, per = "60s", burst = 10 }]
reserve = "20%""#,
            calls: [vec![Normal; 10], vec![High; 4]].concat(),
            admitted: 10,
            refused: Reason::Reserve,
        },
        Row {
            name: "a_day_quota_shared_by_callers",
            whole: r#"limits = [{ count = 30, per = "day" }]
max_share = "50%""#,
            third: r#"limits = [{ count = 10, per = "day" }]
max_share = "50%""#,
            calls: [vec![Caller("m"); 7], vec![Caller("h"); 7]].concat(),
            admitted: 10,
            refused: Reason::Share,
        },
        Row {
            name: "a_window_shared_by_callers",
            whole: r#"limits = [{ count = 30, per = "10s", burst = 15 }]
max_share = "40%""#,
            third: r#"limits = [{ count = 10, per = "10s", burst = 5 }]
max_share = "40%""#,
            calls: [vec![Caller("m"); 4], vec![Caller("h"); 4]].concat(),
            admitted: 4,
            refused: Reason::Share,
        },
        Row {
            name: "a_reserve_too_large_for_the_scaled_burst_leaves_normal_callers_one_call",
            // 50 % of a scaled burst of 1 would keep the whole of it.
            whole: r#"limits = [{ count = 30, per = "60s", burst = 4 }]
reserve = "50%""#,
            third: r#"limits = [{ count = 10, per = "60s", burst = 1 }]"#,
            calls: vec![Normal; 3],
            admitted: 1,
            refused: Reason::Rate,
        },
        Row {
            name: "a_recipients_own_limit",
            // A member messaged through three instances must not get 9 from each.
            whole: r#"limits = [{ count = 900, per = "day" }]
recipients = { field = "touser" }
per_recipient = [{ count = 9, per = "1m", burst = 9 }]"#,
            third: r#"limits = [{ count = 300, per = "day" }]
recipients = { field = "touser" }
per_recipient = [{ count = 3, per = "1m", burst = 3 }]"#,
            calls: [vec![To("u1"); 4], vec![To("u2"); 3]].concat(),
            admitted: 6,
            refused: Reason::Recipient,
        },
    ]
}

fn compile(rule: &str) -> Arc<Rule> {
    let text = format!("[[rule]]\nname = \"r\"\nmatch = [\"/x\"]\n{rule}\n");
    let config = Config::parse(&text, Path::new("row.toml")).expect("row config");
    config.rule_for("/x").expect("/x has a rule").clone()
}

/// Every call of the row, decided by `store` for `rule`.
async fn decide_all(store: &dyn Store, rule: &Rule, calls: &[By], clock: &ManualClock) -> Vec<(Decision, bool)> {
    clock.set_us(T0);
    let mut out = Vec::new();
    for by in calls {
        let (normal, caller) = match *by {
            By::Normal => (true, "other"),
            By::High => (false, "other"),
            By::Caller(c) => (true, c),
            By::To(_) => (false, "other"),
        };
        let recipients: Vec<String> = match *by {
            By::To(id) => vec![id.to_owned()],
            _ => Vec::new(),
        };
        let share = (!rule.share.is_empty()).then_some(caller);
        let key = Key { account: "a", rule, offset_us: BEIJING };
        let ask =
            Ask { key, max_wait_us: 0, holder: "", lease_us: SEC, normal, share, cost: 1, recipients: &recipients };
        let decided = store.acquire(&ask).await.expect("decided");
        out.push((decided.decision, decided.degraded));
    }
    out
}

#[tokio::test]
async fn the_local_fallback_decides_as_one_instance_configured_with_its_part() {
    let mut redis = RedisServer::start();
    let clock = ManualClock::new(T0);
    // The per-call path's fallback: no lease, no reserve.
    let resilience = Resilience {
        fallback: Fallback::Local,
        instances: 3,
        quota_leases: None,
        quota_reserve: std::time::Duration::ZERO,
        ..Resilience::default()
    };
    let mut stores = Vec::new();
    for row in rows() {
        let config = redis.store_config(row.name);
        let raw = RedisStore::connect(&config).await.expect("connect").with_fixed_clock(Arc::new(clock.clone()));
        stores.push(Resilient::new(raw, Arc::new(clock.clone()), resilience.clone(), false, StoreCounters::default()));
    }
    redis.stop();
    for (row, fallback) in rows().into_iter().zip(&stores) {
        let memory = MemoryStore::new(Arc::new(clock.clone()));
        let alone = decide_all(&memory, &compile(row.third), &row.calls, &clock).await;
        let scaled = decide_all(&**fallback, &compile(row.whole), &row.calls, &clock).await;
        assert!(scaled.iter().all(|(_, degraded)| *degraded), "{}: decided without the fallback", row.name);
        let decisions = |v: &[(Decision, bool)]| v.iter().map(|(d, _)| d.clone()).collect::<Vec<_>>();
        assert_eq!(decisions(&scaled), decisions(&alone), "{}: the fallback and one third disagree", row.name);
        let admitted = scaled.iter().filter(|(d, _)| matches!(d, Decision::Admit { .. })).count();
        assert_eq!(admitted, row.admitted, "{}: {scaled:?}", row.name);
        let refused = scaled.iter().find_map(|(d, _)| match d {
            Decision::Reject { reason, .. } => Some(*reason),
            _ => None,
        });
        assert_eq!(refused, Some(row.refused), "{}: {scaled:?}", row.name);
    }
}
