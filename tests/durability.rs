//! The embedded store's state outlives wxgate (`[store] state_file`): a
//! restart never grants a spent day quota again, a crash loses at most the
//! calls admitted since the last write, a penalty and its escalation
//! survive, an unreadable file is reported and set aside; and the store
//! stays bounded (`max_entries`, idle state dropped by time).

use crate::support;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::process::{self, Instance};
use support::*;
use wxgate::config::{Config, MemoryConfig};
use wxgate::limit::{Ask, Decision, Key, Reason};
use wxgate::store::memory::MemoryStore;
use wxgate::store::{Store, StoreError};
use wxgate::telemetry::metrics::MemoryStoreMetrics;
use wxgate::time::ManualClock;

const SEND: &str = "/cgi-bin/message/custom/send";
const MENU: &str = "/cgi-bin/menu/create";

/// Rule "send": 20 calls a day.
fn send() -> RuleToml {
    rule("send").matching(SEND).limit(20, "day")
}

/// A config file in `dir` in front of `mock` with these sections, in a
/// timezone where the day does not end during the test; the state file is
/// the default one beside it (`dir/wxgate-state.json`).
fn config_in(dir: &TempDir, mock: &MockWeChat, sections: &[String]) -> PathBuf {
    let mut config = ConfigToml::new(&mock.url()).server("quota_timezone", midday_timezone());
    for s in sections {
        config = config.with(s);
    }
    dir.write("wxgate.toml", &config.to_string())
}

/// `n` calls to `path` one after the other; their statuses, counted.
async fn call(gate: &Instance, path: &str, n: usize) -> std::collections::HashMap<u16, usize> {
    let mut statuses = Vec::with_capacity(n);
    for _ in 0..n {
        statuses.push(gate.get(path).await.status);
    }
    tally(&statuses)
}

fn only(status: u16, n: usize) -> std::collections::HashMap<u16, usize> {
    [(status, n)].into()
}

fn split(ok: usize, refused: usize) -> std::collections::HashMap<u16, usize> {
    [(200, ok), (429, refused)].into_iter().filter(|(_, n)| *n > 0).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_never_grants_a_spent_day_quota_again() {
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("graceful");
    let path = config_in(&dir, &mock, &[send().to_string()]);
    let gate = process::spawn_path(&path, &[]).expect("serving");
    assert_eq!(call(&gate, SEND, 12).await, only(200, 12));
    let log = gate.stop().await;
    assert!(log.contains("state saved for the next start"), "{log}");

    let gate = process::spawn_path(&path, &[]).expect("serving again");
    assert!(gate.logged().contains("state loaded"), "{}", gate.logged());
    assert_eq!(call(&gate, SEND, 20).await, split(8, 12));
    assert_eq!(mock.count(), 20, "WeChat saw the day quota once, not 12 + 20");
}

/// A wxgate writing its state every 50 ms that admitted 12 calls, once the
/// state file holds them: the mock, the directory, the config file, the
/// state file and the process.
async fn twelve_calls_written(tag: &str) -> (MockWeChat, TempDir, PathBuf, PathBuf, Instance) {
    let mock = MockWeChat::start().await;
    let dir = TempDir::new(tag);
    let store = StoreToml::memory().set("flush_interval", "50ms");
    let path = config_in(&dir, &mock, &[store.to_string(), send().to_string()]);
    let state = dir.join("wxgate-state.json");
    let gate = process::spawn_path(&path, &[]).expect("serving");
    assert_eq!(call(&gate, SEND, 12).await, only(200, 12));
    eventually("the state file holding the 12 calls", PATIENCE, || {
        support::state_file::used(&state, "default", "send") == Some(12)
    })
    .await;
    (mock, dir, path, state, gate)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_a_write_loses_nothing() {
    let (mock, _dir, path, _state, mut gate) = twelve_calls_written("crash").await;
    gate.kill();

    let gate = process::spawn_path(&path, &[]).expect("serving after the crash");
    assert_eq!(call(&gate, SEND, 20).await, split(8, 12));
    assert_eq!(mock.count(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_writes_loses_nothing_either() {
    let (mock, _dir, path, state, mut gate) = twelve_calls_written("crash-bound").await;
    // Three more, then SIGKILL before (or while) they are written: the
    // admissions journal has them.
    assert_eq!(call(&gate, SEND, 3).await, only(200, 3));
    gate.kill();
    let written = support::state_file::used(&state, "default", "send").expect("a whole state file");
    assert!((12..=15).contains(&written), "the file is the last whole write: {written}");

    let gate = process::spawn_path(&path, &[]).expect("serving after the crash");
    assert_eq!(call(&gate, SEND, 25).await, split(5, 20));
    assert_eq!(mock.count(), 20, "not one call over the day quota");
}

/// A SIGKILL (an OOM kill, a panic) long before the next state-file write:
/// every admission reached the kernel before its call was forwarded (the
/// admissions journal), so the restarted wxgate counts all 12.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_before_any_state_file_write_forgets_no_admission() {
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("sigkill-journal");
    let store = StoreToml::memory().set("flush_interval", "1h");
    let path = config_in(&dir, &mock, &[store.to_string(), send().to_string()]);
    let mut gate = process::spawn_path(&path, &[]).expect("serving");
    assert_eq!(call(&gate, SEND, 12).await, only(200, 12));
    gate.kill();
    assert!(support::state_file::used(&dir.join("wxgate-state.json"), "default", "send").is_none(), "no write yet");
    let gate = process::spawn_path(&path, &[]).expect("serving after the crash");
    assert!(gate.logged().contains("replayed the journal"), "{}", gate.logged());
    assert_eq!(call(&gate, SEND, 20).await, split(8, 12));
    assert_eq!(mock.count(), 20, "WeChat saw the day quota once, not 12 + 20");
}

/// A penalty reaches the journal before any call sees it: a SIGKILL (an
/// OOM kill) long before the next state-file write keeps it, so the
/// restarted wxgate sends nothing to the punished account, and keeps its
/// escalation (WeChat's next 45009 gives the doubled penalty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_penalty_and_its_escalation_survive_a_sigkill_before_any_state_file_write() {
    let mock = MockWeChat::start().await;
    mock.respond(|_| errcode_reply(45009));
    let dir = TempDir::new("sigkill-penalty");
    let store = StoreToml::memory().set("flush_interval", "1h");
    let path = config_in(&dir, &mock, &[store.to_string(), penalty(45009, 5), send().to_string()]);
    let mut gate = process::spawn_path(&path, &[]).expect("serving");
    let first = gate.get(SEND).await;
    assert_eq!(
        (first.status.as_u16(), first.header("x-wxgate-reason"), first.retry_after()),
        (429, Some("penalty"), 5)
    );
    gate.kill();
    assert!(support::state_file::read(&dir.join("wxgate-state.json")).is_none(), "no state-file write yet");

    let gate = process::spawn_path(&path, &[]).expect("serving after the crash");
    let a = gate.get(SEND).await;
    assert_eq!((a.status.as_u16(), a.header("x-wxgate-reason")), (429, Some("penalty")), "{}", a.text());
    assert_eq!(mock.count(), 1, "the punished account got no call after the crash");
    let bucket = gate.admin_get("/v1/buckets/default/send").await.json();
    assert_eq!((&bucket["penalty"]["active"], &bucket["penalty"]["level"]), (&true.into(), &0.into()), "{bucket}");
    // Once it ends, the next call goes to WeChat, whose 45009 escalates: 10 s, not 5 again.
    let next = eventually_some_async("the penalty's end", PATIENCE, async || {
        let a = gate.get(SEND).await;
        (mock.count() == 2).then_some(a)
    })
    .await;
    assert_eq!((next.status.as_u16(), next.retry_after()), (429, 10), "escalated from the level before the crash");
}

/// A clear WeChat accepted (`clear_quota`) reaches the journal in order
/// with the admissions around it: a SIGKILL before the next state-file
/// write does not bring the spent count back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleared_day_stays_cleared_after_a_sigkill_before_any_state_file_write() {
    const CLEAR: &str = "/cgi-bin/clear_quota";
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("sigkill-clear");
    let store = StoreToml::memory().set("flush_interval", "1h");
    let rules =
        [store.to_string(), rule("send").matching(SEND).limit(2, "day").to_string(), rule("default").to_string()];
    let path = config_in(&dir, &mock, &rules);
    let mut gate = process::spawn_path(&path, &[]).expect("serving");
    let statuses = |gate: &Instance| {
        let gate = gate.addr;
        async move {
            let mut out = Vec::new();
            for _ in 0..3 {
                out.push(get_as_at(gate, "wxA", SEND).await.status.as_u16());
            }
            out
        }
    };
    assert_eq!(statuses(&gate).await, [200, 200, 429], "the day spent");
    assert_eq!(gate.post(CLEAR, r#"{"appid":"wxA"}"#).await.status, 200);
    assert_eq!(get_as_at(gate.addr, "wxA", SEND).await.status, 200, "cleared: one of two used again");
    gate.kill();
    assert!(support::state_file::read(&dir.join("wxgate-state.json")).is_none(), "no state-file write yet");

    let gate = process::spawn_path(&path, &[]).expect("serving after the crash");
    assert_eq!(statuses(&gate).await, [200, 429, 429], "the clear outlived the SIGKILL; the call after it too");
    assert_eq!(mock.count(), 5);
}

/// The journal beside the state file is wxgate's alone: a link planted in
/// it is never followed (the file it points to is not written) and a
/// journal directory others may write is refused; wxgate says why and does
/// not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_journal_link_or_a_journal_dir_others_may_write_stops_the_start() {
    use std::os::unix::fs::PermissionsExt;
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("journal-private");
    let path = config_in(&dir, &mock, &[send().to_string()]);
    let journal = dir.join("wxgate-state.json.journal");
    std::fs::create_dir(&journal).expect("journal dir");
    std::fs::set_permissions(&journal, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let victim = dir.write("victim.txt", "do not overwrite\n");
    for name in ["current", "old"] {
        let link = journal.join(name);
        std::os::unix::fs::symlink(&victim, &link).expect("plant a symlink");
        let log = match process::spawn_path(&path, &[]) {
            Ok(gate) => {
                let _ = gate.get(SEND).await;
                panic!("started with a link at {name}: {}", gate.stop().await)
            }
            Err(log) => log,
        };
        assert!(log.contains("is not a regular file") && log.contains(&link.display().to_string()), "{log}");
        assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "do not overwrite\n", "not followed");
        std::fs::remove_file(&link).expect("remove the link");
    }

    std::fs::set_permissions(&journal, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let log = process::spawn_path(&path, &[]).err().expect("a journal dir anyone may write is refused");
    assert!(log.contains("has mode 0777") && log.contains("chmod 700"), "{log}");

    std::fs::set_permissions(&journal, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let gate = process::spawn_path(&path, &[]).expect("serving once the directory is private");
    assert_eq!(gate.get(SEND).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_penalty_outlives_a_restart() {
    let mock = MockWeChat::start().await;
    let answered = Arc::new(AtomicUsize::new(0));
    let n = answered.clone();
    mock.respond(move |_| if n.fetch_add(1, Ordering::SeqCst) == 0 { errcode_reply(45009) } else { ok_reply() });
    let dir = TempDir::new("penalty");
    let path = config_in(&dir, &mock, &[send().to_string()]);
    let gate = process::spawn_path(&path, &[]).expect("serving");
    let first = gate.get(SEND).await;
    assert_eq!((first.status.as_u16(), first.header("x-wxgate-reason")), (429, Some("penalty")));
    gate.stop().await;

    let gate = process::spawn_path(&path, &[]).expect("serving again");
    for _ in 0..5 {
        let a = gate.get(SEND).await;
        assert_eq!((a.status.as_u16(), a.header("x-wxgate-reason")), (429, Some("penalty")), "{}", a.text());
    }
    assert_eq!(mock.count(), 1, "nothing reached WeChat during the penalty");
    let bucket = gate.admin_get("/v1/buckets/default/send").await.json();
    let penalty = &bucket["penalty"];
    assert_eq!(penalty["active"], true, "{bucket}");
    assert_eq!(penalty["level"], 0, "{bucket}");
    // The default 45009 penalty is 60 s; what is left of it, not a new one.
    let left = penalty["remaining_seconds"].as_f64().expect("remaining");
    assert!(left > 30.0 && left <= 60.0, "{bucket}");
}

#[tokio::test]
async fn the_escalation_level_outlives_a_restart() {
    let mock = MockWeChat::start().await;
    mock.respond(|_| errcode_reply(45009));
    let dir = TempDir::new("escalation");
    let path = config_in(&dir, &mock, &[penalty(45009, 60), rule("send").matching(SEND).to_string()]);
    let mut gate = Gate::start_file(&path).await;
    // 60 s, then 120 s, then 240 s: each repeat right after the last ended.
    for length in [60, 120] {
        assert_eq!(gate.get(SEND).await.retry_after(), length);
        gate.advance(Duration::from_secs(length as u64));
    }
    assert_eq!(gate.get(SEND).await.retry_after(), 240);
    assert_eq!(mock.count(), 3);
    gate = gate.restart().await;

    let bucket = get_at(gate.admin_addr(), "/v1/buckets/default/send").await.json();
    assert_eq!((&bucket["penalty"]["level"], &bucket["penalty"]["active"]), (&2.into(), &true.into()), "{bucket}");
    for _ in 0..3 {
        let a = gate.get(SEND).await;
        assert_eq!((a.status.as_u16(), a.retry_after()), (429, 240));
    }
    assert_eq!(mock.count(), 3, "nothing reached WeChat during the penalty");
    // The next repeat escalates from level 2: 480 s.
    gate.advance(Duration::from_secs(240));
    assert_eq!(gate.get(SEND).await.retry_after(), 480);
    assert_eq!(mock.count(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_state_file_is_reported_set_aside_and_wxgate_serves() {
    let mock = MockWeChat::start().await;
    let truncated = r#"{"format":"wxgate-state","version":1,"saved_at_us":1,"pairs":[{"account":"default","rule":"se"#;
    let cases: [(&str, &[u8]); 3] = [
        ("garbage", b"\x00\x01 not json at all"),
        ("truncated", truncated.as_bytes()),
        ("version", br#"{"format":"wxgate-state","version":99,"saved_at_us":1,"pairs":[]}"#),
    ];
    for (name, content) in cases {
        let dir = TempDir::new(&format!("corrupt-{name}"));
        let path = config_in(&dir, &mock, &[send().to_string()]);
        std::fs::write(dir.join("wxgate-state.json"), content).expect("write state file");
        let gate = process::spawn_path(&path, &[]).expect("serving despite the state file");
        assert_eq!(gate.get(SEND).await.status, 200, "{name}: serves");
        let log = gate.logged();
        assert!(log.contains("QUOTAS RESTART FROM ZERO"), "{name}: says so loudly: {log}");
        assert_eq!(gate.metric(r#"wxgate_state_file_errors_total{op="load"}"#).await, Some(1.0), "{name}");
        let aside = support::state_file::named(dir.path(), "wxgate-state.json.corrupt-");
        assert_eq!(aside.len(), 1, "{name}: moved aside: {aside:?}");
        assert_eq!(std::fs::read(&aside[0]).expect("moved file"), content, "{name}: kept as it was");
        let log = gate.stop().await;
        // The next start finds a good file.
        assert!(log.contains("state saved for the next start"), "{name}: {log}");
        assert!(support::state_file::read(&dir.join("wxgate-state.json")).is_some(), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_file_from_other_rules_loads_what_still_applies() {
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("renamed");
    let menu = |name: &str| rule(name).matching(MENU).limit(5, "day").to_string();
    let path = config_in(&dir, &mock, &[send().to_string(), menu("menu")]);
    let gate = process::spawn_path(&path, &[]).expect("serving");
    assert_eq!(call(&gate, SEND, 12).await, only(200, 12));
    assert_eq!(call(&gate, MENU, 6).await, split(5, 1));
    gate.stop().await;

    // "menu" renamed: a rule of another name is another rule, and starts afresh.
    config_in(&dir, &mock, &[send().to_string(), menu("menu2")]);
    let gate = process::spawn_path(&path, &[]).expect("serving with other rules");
    assert_eq!(call(&gate, SEND, 10).await, split(8, 2), "send kept its 12");
    assert_eq!(call(&gate, MENU, 6).await, split(5, 1), "menu2 is new");
    assert_eq!(gate.metric(r#"wxgate_state_file_errors_total{op="load"}"#).await, Some(0.0));
    gate.stop().await;

    // "send" removed: the rest still loads.
    config_in(&dir, &mock, &[menu("menu2")]);
    let gate = process::spawn_path(&path, &[]).expect("serving without send");
    assert_eq!(call(&gate, MENU, 1).await, only(429, 1), "menu2 kept its 5");
    assert_eq!(gate.metric(r#"wxgate_state_file_errors_total{op="load"}"#).await, Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_wxgate_on_the_same_state_file_does_not_start() {
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("two");
    let path = config_in(&dir, &mock, &[send().to_string()]);
    let first = process::spawn_path(&path, &[]).expect("serving");
    let log = process::spawn_path(&path, &[]).err().expect("the second one refuses to start");
    assert!(log.contains("another wxgate is using the state file"), "{log}");
    assert_eq!(first.get(SEND).await.status, 200, "the first one serves on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_file_that_cannot_be_written_is_reported_and_wxgate_serves() {
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("unwritable");
    // Under a regular file: no directory there, even for root.
    let blocker = dir.write("not-a-dir", "x");
    let file = blocker.join("state.json");
    let store = StoreToml::memory().set("state_file", file.to_str().expect("UTF-8")).set("flush_interval", "20ms");
    let path = config_in(&dir, &mock, &[store.to_string(), send().to_string()]);
    let gate = process::spawn_path(&path, &[]).expect("serving");
    assert!(gate.logged().contains("quotas and penalties will NOT survive a restart"), "{}", gate.logged());
    assert_eq!(gate.get(SEND).await.status, 200);
    let errors = r#"wxgate_state_file_errors_total{op="save"}"#;
    eventually_async("a failed save counted", PATIENCE, async || gate.metric(errors).await >= Some(1.0)).await;
    let ready = gate.admin_get("/readyz").await;
    assert_eq!(ready.status, 200, "still ready: decisions are as good as ever");
    let status = &ready.json()["state_file"];
    assert!(status["save_errors"].as_u64() >= Some(1) && status["saves"] == 0, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_shows_the_state_file_and_its_last_save() {
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("readyz");
    let store = StoreToml::memory().set("flush_interval", "20ms");
    let path = config_in(&dir, &mock, &[store.to_string(), send().to_string()]);
    let gate = process::spawn_path(&path, &[]).expect("serving");
    assert_eq!(gate.get(SEND).await.status, 200);
    eventually_async("a save", PATIENCE, async || gate.metric("wxgate_state_file_saves_total").await >= Some(1.0))
        .await;
    let status = gate.admin_get("/readyz").await.json()["state_file"].clone();
    let want = dir.join("wxgate-state.json");
    assert_eq!(status["path"], want.to_str().expect("UTF-8"), "{status}");
    assert!(status["last_save_unix"].as_i64() > Some(1_700_000_000), "{status}");
    assert_eq!((&status["save_errors"], &status["load_errors"]), (&0.into(), &0.into()), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_store_refuses_new_pairs_and_never_drops_a_spent_quota() {
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("full");
    let store = StoreToml::memory().set("max_entries", 3);
    let path = config_in(&dir, &mock, &[store.to_string(), rule("send").matching(SEND).limit(2, "day").to_string()]);
    let gate = process::spawn_path(&path, &[]).expect("serving");
    for (account, statuses) in [("a", [200, 200, 429]), ("b", [200, 200, 429]), ("c", [200, 200, 429])] {
        for want in statuses {
            assert_eq!(gate.get_as(account, SEND).await.status, want, "{account}");
        }
    }
    let d = gate.get_as("d", SEND).await;
    assert_eq!(d.status, 503, "{}", d.text());
    assert_eq!(d.json()["errcode"], -1);
    assert!(d.json()["errmsg"].as_str().expect("errmsg").contains("embedded store is full ([store] max_entries = 3)"));
    let a = gate.get_as("a", SEND).await;
    assert_eq!((a.status.as_u16(), a.header("x-wxgate-reason")), (429, Some("quota")), "a's spent day stays spent");
    assert_eq!(mock.count(), 6);
    assert_eq!(gate.metric("wxgate_store_full_total").await, Some(1.0));
    eventually_async("the entries gauge", PATIENCE, async || gate.metric("wxgate_store_entries").await == Some(3.0))
        .await;
    assert!(gate.logged().contains("the embedded store is full"), "{}", gate.logged());
}

// ---- The store itself, on a manual clock ----

fn rules(text: &str) -> Config {
    Config::parse(text, Path::new("durability.toml")).expect("config")
}

fn open(clock: &ManualClock, max_entries: usize) -> (Arc<MemoryStore>, MemoryStoreMetrics) {
    let metrics = MemoryStoreMetrics::default();
    let config = MemoryConfig { max_entries, ..MemoryConfig::in_memory() };
    let store = MemoryStore::open(Arc::new(clock.clone()), &config, 8 * 3600 * SEC, 0, metrics.clone()).expect("open");
    (store, metrics)
}

async fn acquire(store: &MemoryStore, config: &Config, account: &str, rule: usize) -> Result<Decision, StoreError> {
    let key = Key { account, rule: &config.rules[rule], offset_us: config.server.quota_offset_us };
    store
        .acquire(&Ask {
            key,
            max_wait_us: 0,
            holder: "",
            lease_us: 0,
            normal: false,
            share: None,
            cost: 1,
            recipients: &[],
        })
        .await
        .map(|d| d.decision)
}

#[tokio::test(start_paused = true)]
async fn idle_state_is_dropped_by_time_without_further_traffic() {
    let config = rules(&format!("{}", rule("send").matching(SEND).limit(10, "60s")));
    let clock = ManualClock::new(T0);
    let (store, metrics) = open(&clock, 1_000_000);
    for i in 0..200_000 {
        let d = acquire(&store, &config, &format!("acct-{i}"), 0).await.expect("room");
        assert!(matches!(d, Decision::Admit { .. }));
    }
    assert_eq!(store.len(), 200_000);
    eventually("the entries gauge", PATIENCE, || metrics.entries.get() == 200_000).await;
    // Every window refills within 60 s; then no call comes at all.
    clock.advance(Duration::from_secs(61));
    eventually("idle state dropped by the background sweep", PATIENCE, || store.is_empty()).await;
    eventually("the entries gauge", PATIENCE, || metrics.entries.get() == 0).await;
}

#[tokio::test]
async fn when_full_only_refilled_windows_make_room() {
    let text =
        format!("{}\n{}", rule("minute").matching("/a").limit(1, "60s"), rule("day").matching("/b").limit(1, "day"));
    let config = rules(&text);
    let (minute, day) = (0, 1);
    let clock = ManualClock::new(T0);
    let (store, metrics) = open(&clock, 2);
    acquire(&store, &config, "a", minute).await.expect("room");
    acquire(&store, &config, "b", minute).await.expect("room");
    assert_eq!(acquire(&store, &config, "c", minute).await, Err(StoreError::Full(2)), "windows still running");
    clock.advance(Duration::from_secs(61));
    assert!(
        matches!(acquire(&store, &config, "c", minute).await, Ok(Decision::Admit { .. })),
        "a refilled window gave way"
    );

    let (store, metrics_day) = open(&clock, 2);
    acquire(&store, &config, "a", day).await.expect("room");
    acquire(&store, &config, "b", day).await.expect("room");
    clock.advance(Duration::from_secs(3600));
    assert_eq!(acquire(&store, &config, "c", day).await, Err(StoreError::Full(2)), "day counts are never dropped");
    let again = acquire(&store, &config, "a", day).await.expect("a's state is there");
    assert!(matches!(again, Decision::Reject { reason: Reason::Quota, .. }), "a's spent quota is not granted again");
    assert_eq!((metrics.full.get(), metrics_day.full.get()), (1, 1));
}

/// The state file holds the token key's check and learned tokens' hashes:
/// it (and its lock) are 0600, and a symlink planted at its temporary path
/// is replaced, never followed (the file it points to is untouched).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_file_is_private_and_a_planted_symlink_is_not_followed() {
    use std::os::unix::fs::PermissionsExt;
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("state-private");
    let path = config_in(&dir, &mock, &[send().to_string()]);
    let victim = dir.write("victim.txt", "do not overwrite\n");
    std::os::unix::fs::symlink(&victim, dir.join("wxgate-state.json.tmp")).expect("plant a symlink");
    let gate = process::spawn_path(&path, &[]).expect("serving");
    assert_eq!(call(&gate, SEND, 3).await, only(200, 3));
    let log = gate.stop().await;
    assert!(log.contains("state saved for the next start"), "{log}");
    assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "do not overwrite\n", "the link was not followed");
    for name in ["wxgate-state.json", "wxgate-state.json.lock"] {
        let mode = std::fs::metadata(dir.join(name)).expect(name).permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{name} has mode {mode:o}");
    }
    assert_eq!(support::state_file::used(&dir.join("wxgate-state.json"), "default", "send"), Some(3));
}

/// A member's own windows (`per_recipient`) outlive a restart of the
/// embedded store: the state file keeps them (by a hash of the id, never
/// the id), so a restart does not give a member its minute again.
#[tokio::test]
async fn a_members_own_windows_outlive_a_restart_without_its_id_in_the_file() {
    let mock = MockWeChat::start().await;
    let dir = TempDir::new("recipients-restart");
    let rule = "[[rule]]\nname = \"message_send\"\nmatch = [\"/cgi-bin/message/send\"]\n\
                limits = [{ count = 1000, per = \"day\" }]\ncost = \"recipients\"\n\
                recipients = { field = \"touser\", separator = \"|\" }\n\
                per_recipient = [{ count = 3, per = \"1m\", burst = 3 }]\n";
    let path = config_in(&dir, &mock, &[rule.to_owned()]);
    let mut gate = Gate::start_file(&path).await;
    let send = "/cgi-bin/message/send?access_token=T";
    for _ in 0..3 {
        assert_eq!(gate.post(send, r#"{"touser":"zhangsan"}"#).await.status, 200);
    }
    gate = gate.restart().await;
    let fourth = gate.post(send, r#"{"touser":"zhangsan|lisi"}"#).await;
    assert_eq!(fourth.status, 429, "{}", fourth.text());
    assert_eq!(fourth.header("x-wxgate-reason"), Some("recipient"));
    assert!(fourth.text().contains(": zhangsan ("), "{}", fourth.text());
    assert_eq!(gate.post(send, r#"{"touser":"lisi"}"#).await.status, 200);
    assert_eq!(mock.count(), 4);
    let file = std::fs::read_to_string(dir.path().join("wxgate-state.json")).expect("state file");
    assert!(file.contains("\"recipients\"") && !file.contains("zhangsan"), "{file}");
}
