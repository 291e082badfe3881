//! The campaign scenario (issue 17): at 9:00 marketing floods a rule that HR
//! shares. Two wxgate processes on one Redis; marketing (normal priority)
//! sends as fast as it can through both, HR (high priority) sends steadily
//! within the rule's 20 % reserve. HR gets no refusal, marketing gets the
//! rest, and no window of the rule ever exceeds its count at WeChat. Real
//! processes racing in real time are the point of this test.

mod support;

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
    let instances: Vec<process::Instance> =
        (0..2).map(|i| process::spawn(&config, &format!("campaign-{i}"), &[]).expect("wxgate serving")).collect();
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
    let mut hr = Vec::new();
    let mut n = 0u32;
    let hr_client = new_client();
    while started.elapsed() < RUN {
        hr.push(send(&hr_client, addrs[n as usize % 2], "hr").await);
        n += 1;
        tokio::time::sleep_until((started + HR_EVERY * n).into()).await;
    }
    stop.store(true, Ordering::Relaxed);
    let (mut m_ok, mut m_refused) = (0, 0);
    for t in flood {
        let (ok, refused) = t.await.expect("flooder");
        m_ok += ok;
        m_refused += refused;
    }
    drop(instances);
    let hr_refused: Vec<_> = hr.iter().filter(|(s, _)| *s != 200).collect();
    eprintln!("hr: {} calls, {} refused; marketing: {m_ok} forwarded, {m_refused} refused", hr.len(), hr_refused.len());
    assert!(hr.len() >= 30, "HR sent steadily: {}", hr.len());
    assert!(hr_refused.is_empty(), "HR was refused: {hr_refused:?}");
    assert!(m_ok > 0 && m_refused > 0, "marketing got the rest and was refused beyond it");
    let first = mock.calls().iter().map(|c| c.arrived).min().expect("calls");
    let mut times: Vec<Duration> = mock.calls().iter().map(|c| c.arrived - first).collect();
    times.sort();
    let worst = max_in_window(&times, WINDOW - JITTER);
    eprintln!("WeChat saw {} calls; worst {:?} window {worst}", times.len(), WINDOW - JITTER);
    assert!(worst <= COUNT, "{worst} calls in one {:?} window (limit {COUNT})", WINDOW - JITTER);
}
