//! The campaign scenario (issue 17): at 9:00 marketing floods a rule that HR
//! shares. Two wxgate processes on one Redis; marketing (normal priority)
//! sends as fast as it can through both, HR (high priority) sends steadily
//! within the rule's 20 % reserve. HR gets no refusal, marketing gets the
//! rest, and no window of the rule ever exceeds its count at WeChat. Real
//! processes racing in real time are the point of this test.

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::process;
use support::redis_server::RedisServer;
use support::{caller, max_in_window, rule, ConfigToml, MockWeChat, StoreToml};

const COUNT: usize = 100;
const WINDOW: Duration = Duration::from_secs(2);
/// Scheduling jitter allowed between a decision and the mock's clock.
const JITTER: Duration = Duration::from_millis(200);
const RUN: Duration = Duration::from_secs(4);
const FLOODERS: usize = 24;
/// HR: one call every 100 ms, 20 per window: the reserve's 20 %.
const HR_EVERY: Duration = Duration::from_millis(100);

/// What one campaign run saw: the steady caller's answers (status,
/// reason), marketing's forwarded and refused calls.
struct Run {
    steady: Vec<(u16, Option<String>)>,
    flood_ok: usize,
    flood_refused: usize,
}

/// Two wxgate processes on `config`; marketing floods through both from
/// [`FLOODERS`] keep-alive clients without back-off while `steady` sends
/// one call every `every`, for [`RUN`].
async fn campaign(config: &str, steady: &str, every: Duration) -> Run {
    let instances: Vec<process::Instance> =
        (0..2).map(|i| process::spawn(config, &format!("campaign-{i}"), &[]).expect("wxgate serving")).collect();
    let addrs: Vec<_> = instances.iter().map(|i| i.addr).collect();
    let stop = Arc::new(AtomicBool::new(false));
    // One pooled client per caller task: keep-alive, as services send.
    async fn send(
        client: &Client<HttpConnector, Full<Bytes>>,
        addr: std::net::SocketAddr,
        who: &str,
    ) -> (u16, Option<String>) {
        let uri = format!("http://{addr}/cgi-bin/message/template/send?access_token=T&who={who}");
        let req = http::Request::post(uri).header("x-wx-caller", who).body(Full::new(Bytes::from_static(b"{}")));
        let resp = client.request(req.expect("request")).await.expect("wxgate answered");
        let status = resp.status().as_u16();
        let reason = resp.headers().get("x-wxgate-reason").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let _ = resp.into_body().collect().await;
        (status, reason)
    }
    let new_client = || Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut flood = Vec::new();
    for f in 0..FLOODERS {
        let (stop, addr, client) = (stop.clone(), addrs[f % 2], new_client());
        flood.push(tokio::spawn(async move {
            let (mut ok, mut refused) = (0usize, 0usize);
            while !stop.load(Ordering::Relaxed) {
                match send(&client, addr, "marketing").await {
                    (200, _) => ok += 1,
                    (429, _) => {
                        refused += 1;
                        // Without back-off: the flood the reserve is for.
                        tokio::task::yield_now().await;
                    }
                    (status, reason) => panic!("marketing got {status} {reason:?}"),
                }
            }
            (ok, refused)
        }));
    }
    let started = Instant::now();
    let mut answers = Vec::new();
    let mut n = 0u32;
    let steady_client = new_client();
    while started.elapsed() < RUN {
        answers.push(send(&steady_client, addrs[n as usize % 2], steady).await);
        n += 1;
        tokio::time::sleep_until((started + every * n).into()).await;
    }
    stop.store(true, Ordering::Relaxed);
    let (mut flood_ok, mut flood_refused) = (0, 0);
    for t in flood {
        let (ok, refused) = t.await.expect("flooder");
        flood_ok += ok;
        flood_refused += refused;
    }
    drop(instances);
    Run { steady: answers, flood_ok, flood_refused }
}

/// The most calls the mock saw in any window of `window` (less the jitter).
fn worst_window(mock: &MockWeChat, window: Duration, who: Option<&str>) -> usize {
    let calls = mock.calls();
    let mine = calls.iter().filter(|c| who.is_none_or(|w| c.path_and_query.contains(&format!("who={w}"))));
    let first = calls.iter().map(|c| c.arrived).min().expect("calls");
    let mut times: Vec<Duration> = mine.map(|c| c.arrived - first).collect();
    times.sort();
    max_in_window(&times, window - JITTER)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_flood_never_refuses_the_high_priority_caller_nor_overruns_the_window() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let config = ConfigToml::new(&mock.url())
        .without_server("upstream_timeout")
        .with(StoreToml::redis(&redis.url()).set("timeout", "1s").set("instances", 2))
        .with(caller("hr").high())
        .with(caller("marketing"))
        // 100 per 2 s, burst 20: 20 % keeps 4 calls of the burst for HR.
        .with(
            rule("template")
                .matching("/cgi-bin/message/template/send")
                .limit_burst(COUNT as u64, "2s", 20)
                .set("reserve", "20%"),
        )
        .to_string();
    let run = campaign(&config, "hr", HR_EVERY).await;
    let hr_refused: Vec<_> = run.steady.iter().filter(|(s, _)| *s != 200).collect();
    eprintln!(
        "hr: {} calls, {} refused; marketing: {} forwarded, {} refused",
        run.steady.len(),
        hr_refused.len(),
        run.flood_ok,
        run.flood_refused
    );
    assert!(run.steady.len() >= 30, "HR sent steadily: {}", run.steady.len());
    assert!(hr_refused.is_empty(), "HR was refused: {hr_refused:?}");
    assert!(run.flood_ok > 0 && run.flood_refused > 0, "marketing got the rest and was refused beyond it");
    let worst = worst_window(&mock, WINDOW, None);
    eprintln!("WeChat saw {} calls; worst {:?} window {worst}", mock.count(), WINDOW - JITTER);
    assert!(worst <= COUNT, "{worst} calls in one {:?} window (limit {COUNT})", WINDOW - JITTER);
}

/// `max_share` (issue 17 item 3): the same flood on a rule where no caller
/// may take more than 60 %; approvals, a normal caller like marketing, sends
/// steadily (10 a second, a quarter of the rule) and is never refused;
/// marketing never gets more than its 60 per window, and the rule never
/// more than 100. Without the share the flood takes the window and
/// approvals is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_keeps_to_its_share_and_another_normal_caller_gets_through() {
    let redis = RedisServer::start();
    let mock = MockWeChat::start().await;
    let config = ConfigToml::new(&mock.url())
        .without_server("upstream_timeout")
        .with(StoreToml::redis(&redis.url()).set("timeout", "1s").set("instances", 2))
        .with(caller("marketing"))
        .with(caller("approvals"))
        // 100 per 2 s, burst 20 (40.5/s sustained); each caller 60 per 2 s, burst 12 (24.5/s).
        .with(
            rule("template")
                .matching("/cgi-bin/message/template/send")
                .limit_burst(COUNT as u64, "2s", 20)
                .set("max_share", "60%"),
        )
        .to_string();
    let run = campaign(&config, "approvals", HR_EVERY).await;
    let refused: Vec<_> = run.steady.iter().filter(|(s, _)| *s != 200).collect();
    let marketing = worst_window(&mock, WINDOW, Some("marketing"));
    let all = worst_window(&mock, WINDOW, None);
    eprintln!(
        "approvals: {} calls, {} refused; marketing: {} forwarded, {} refused; worst windows: marketing {marketing}, all {all}",
        run.steady.len(),
        refused.len(),
        run.flood_ok,
        run.flood_refused
    );
    assert!(run.steady.len() >= 30, "approvals sent steadily: {}", run.steady.len());
    assert!(refused.is_empty(), "approvals was refused: {refused:?}");
    assert!(run.flood_ok > 0 && run.flood_refused > 0, "marketing got its share and was refused beyond it");
    assert!(marketing <= 60, "marketing had {marketing} calls in one window (its share: 60)");
    assert!(all <= COUNT, "{all} calls in one window (limit {COUNT})");
}

/// Issue 32's campaign: marketing broadcasts to 1,000 members of the corp
/// while HR sends its punch-in notice to 3 of them 40 times a minute. WeCom
/// takes 30 messages a minute per member and drops the rest without an
/// errcode; wxgate, counting each member (`per_recipient`), lets no member
/// get more than 30 in any minute at WeChat, refuses every message it
/// cannot send whole and names the members over, so nothing is dropped
/// silently. On an injected clock (minutes of traffic, decided at once), on
/// the embedded store, Redis and a Redis Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broadcast_campaign_never_takes_a_member_past_30_a_minute_and_every_refusal_names_whom() {
    use std::collections::HashMap;
    use support::redis_server::RedisCluster;
    use support::Gate;

    const STEP: Duration = Duration::from_millis(1500); // HR: 40 a minute
    const STEPS: usize = 160; // 4 minutes
    let rules = "[[rule]]\nname = \"message_send\"\nmatch = [\"/cgi-bin/message/send\"]\n\
                 limits = [{ count = 1000000, per = \"day\" }]\ncost = \"recipients\"\n\
                 recipients = { field = \"touser\", separator = \"|\", all = \"@all\", unseen = [\"toparty\", \"totag\"] }\n\
                 per_recipient = [{ count = 30, per = \"1m\", burst = 30 }, { count = 1000, per = \"1h\", burst = 1000 }]\n";
    let everyone: String = (0..1000).map(|i| format!("m{i}")).collect::<Vec<_>>().join("|");
    let hr_members = "m0|m1|m2";
    let redis = RedisServer::start();
    let cluster = RedisCluster::start(3);
    for store in ["memory", "redis", "cluster"] {
        let mock = MockWeChat::start().await;
        let text = ConfigToml::new(&mock.url()).with(rules);
        let gate = match store {
            "memory" => Gate::start_text(text).await,
            "redis" => {
                Gate::start_redis_on_manual_clock(text.with(StoreToml::redis(&redis.url()).set("key_prefix", "c32")))
                    .await
            }
            _ => Gate::start_redis_on_manual_clock(text.with(StoreToml::redis_cluster(cluster.urls()))).await,
        };
        // Each forwarded message's members and its (manual) time.
        let mut sent: Vec<(Duration, Vec<String>)> = Vec::new();
        let (mut hr_ok, mut hr_refused, mut marketing_ok, mut marketing_refused) = (0, 0, 0, 0);
        for step in 0..STEPS {
            let now = STEP * step as u32;
            for (who, to) in [("hr", hr_members), ("marketing", everyone.as_str())] {
                let body = format!(r#"{{"touser":"{to}","msgtype":"text","agentid":1,"text":{{"content":"{who}"}}}}"#);
                let a = gate.post("/cgi-bin/message/send?access_token=T", &body).await;
                match a.status.as_u16() {
                    200 => {
                        sent.push((now, to.split('|').map(str::to_owned).collect()));
                        if who == "hr" {
                            hr_ok += 1
                        } else {
                            marketing_ok += 1
                        }
                    }
                    429 => {
                        assert_eq!(a.header("x-wxgate-reason"), Some("recipient"), "{store}: {}", a.text());
                        let errmsg = a.json()["errmsg"].as_str().unwrap_or_default().to_owned();
                        let named = errmsg
                            .split("sent to no one: ")
                            .nth(1)
                            .and_then(|rest| rest.split(" (send").next())
                            .unwrap_or_default();
                        assert!(!named.is_empty(), "{store}: a refusal names whom: {errmsg}");
                        assert!(
                            named.split('|').all(|m| to.split('|').any(|t| t == m)),
                            "{store}: only members of the message: {errmsg}"
                        );
                        if who == "hr" {
                            hr_refused += 1;
                            assert!(named.split('|').all(|m| hr_members.contains(m)), "{store}: {errmsg}");
                        } else {
                            marketing_refused += 1;
                        }
                    }
                    other => panic!("{store}: {who} got {other}: {}", a.text()),
                }
            }
            gate.advance(STEP);
        }
        // Nothing dropped silently: every message was forwarded whole or refused by name.
        assert_eq!(mock.count(), sent.len(), "{store}");
        assert_eq!(hr_ok + hr_refused + marketing_ok + marketing_refused, 2 * STEPS, "{store}");
        // At WeChat, no member got more than 30 in any minute.
        let mut times: HashMap<&str, Vec<Duration>> = HashMap::new();
        for (at, members) in &sent {
            for m in members {
                times.entry(m.as_str()).or_default().push(*at);
            }
        }
        let worst = times.values().map(|t| max_in_window(t, Duration::from_secs(60))).max().unwrap_or(0);
        eprintln!("{store}: hr {hr_ok} sent, {hr_refused} refused; marketing {marketing_ok} sent, {marketing_refused} refused; worst member-minute {worst}");
        assert!(worst <= 30, "{store}: a member got {worst} messages in a minute");
        // The members' minutes were used, not wasted: m0 got 30 in its busiest minute.
        assert_eq!(max_in_window(&times["m0"], Duration::from_secs(60)), 30, "{store}");
        assert!(hr_ok > 0 && hr_refused > 0 && marketing_ok > 0 && marketing_refused > 0, "{store}");
    }
}
