//! `[store] instances` from heartbeats: the wxgate instances sharing one
//! Redis count each other (heartbeats in Redis), so that when Redis goes away
//! the local fallback of each decides with its share of every limit
//! without a hand-kept number; `instances` is a floor. Real wxgate
//! processes and a real redis-server.

use crate::support;

use support::process::{self, Instance};
use support::redis_server::RedisServer;
use support::*;

const PATH: &str = "/cgi-bin/message/custom/send?access_token=T";

/// A wxgate process on `redis` with the local fallback, a rule of 10 calls
/// a day, and `instances` if given.
fn start(mock: &MockWeChat, redis: &RedisServer, tag: &str, instances: Option<i64>) -> Instance {
    let mut store = StoreToml::redis(&redis.url())
        .per_call()
        .set("timeout", "500ms")
        .set("fallback", "local")
        .set("breaker_failures", 1)
        .set("breaker_open", "200ms");
    if let Some(n) = instances {
        store = store.set("instances", n);
    }
    let config = ConfigToml::new(&mock.url())
        .with(store)
        .with(rule("send").matching("/cgi-bin/message/custom/send").limit(10, "day"))
        .to_string();
    process::spawn(&config, tag, &[]).expect("wxgate serving")
}

/// What `/readyz` says the fallback divides each limit by.
async fn instances(gate: &Instance) -> Option<u64> {
    gate.admin_get("/readyz").await.json()["instances"].as_u64()
}

/// Calls to `gate` while Redis is away: how many are admitted (200) before
/// the first refusal, at most `most`.
async fn admitted_without_redis(gate: &Instance, most: usize) -> usize {
    for n in 0..most {
        let answer = gate.get(PATH).await;
        if answer.status != 200 {
            assert_eq!(answer.status, 429, "refused by the fallback's share: {}", answer.text());
            return n;
        }
    }
    most
}

#[tokio::test]
async fn two_instances_that_hear_each_other_each_take_half_of_a_limit_when_redis_goes_away() {
    let mock = MockWeChat::start().await;
    let mut redis = RedisServer::start();
    let a = start(&mock, &redis, "heard-a", None);
    let b = start(&mock, &redis, "heard-b", None);
    eventually_async("both instances hear two instances in Redis", PATIENCE, async || {
        instances(&a).await == Some(2) && instances(&b).await == Some(2)
    })
    .await;
    redis.stop();
    // Without Redis, a's fallback decides with 10 / 2 of the day's quota:
    // with `instances` left unset it took all 10.
    assert_eq!(admitted_without_redis(&a, 12).await, 5, "a's share of 10 a day between 2 instances");
    assert_eq!(instances(&a).await, Some(2), "the count heard last holds while Redis is away");
    drop(b);
    a.stop().await;
}

#[tokio::test]
async fn the_configured_instances_are_a_floor_and_a_gone_instance_stops_counting() {
    let mock = MockWeChat::start().await;
    let redis = RedisServer::start();
    let a = start(&mock, &redis, "floor-a", Some(3));
    let mut b = start(&mock, &redis, "floor-b", Some(3));
    // Two heard, three configured: the fallback divides by three.
    eventually_async("a hears b", PATIENCE, async || instances(&a).await == Some(3)).await;
    let c = start(&mock, &redis, "floor-c", Some(1));
    let d = start(&mock, &redis, "floor-d", Some(1));
    eventually_async("four instances heard", PATIENCE, async || instances(&a).await == Some(4)).await;
    // An instance gone stops counting once its heartbeat is older than 10 s.
    b.kill();
    drop(c);
    eventually_async("a gone instance no longer counts", std::time::Duration::from_secs(30), async || {
        instances(&d).await == Some(2)
    })
    .await;
    eventually_async("the floor holds above what is heard", PATIENCE, async || instances(&a).await == Some(3)).await;
    drop(d);
    a.stop().await;
}
