//! Polling with a deadline: check a condition, pause briefly, and fail with a
//! clear message when the deadline passes. The one way tests wait for
//! something to happen; never a fixed sleep followed by a check.

use std::time::{Duration, Instant};

/// How long a test waits for something that normally takes milliseconds,
/// on a loaded 2-core machine.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Pauses between checks: a few bare yields first (on the current-thread
/// runtime of `#[tokio::test]` each lets every ready task run, so conditions
/// that only need the runtime to turn are seen at once), then short sleeps
/// growing to 20 ms, so a slow condition does not spin a core.
#[derive(Default)]
struct Pause {
    round: u32,
}

impl Pause {
    const YIELDS: u32 = 3;

    fn sleep_for(&self) -> Duration {
        let n = self.round - Self::YIELDS;
        Duration::from_millis((1u64 << n.min(5)).min(20))
    }

    async fn next(&mut self) {
        if self.round < Self::YIELDS {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(self.sleep_for()).await;
        }
        self.round = self.round.saturating_add(1);
    }
}

fn give_up(what: &str, limit: Duration) -> ! {
    panic!("{what} did not happen within {limit:?}")
}

/// Waits until `cond` holds; panics naming `what` after `limit`.
pub async fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    eventually_some(what, limit, || cond().then_some(())).await
}

/// Waits until `probe` gives a value, and returns it; panics naming `what` after `limit`.
pub async fn eventually_some<T>(what: &str, limit: Duration, probe: impl FnMut() -> Option<T>) -> T {
    match within(limit, probe).await {
        Some(v) => v,
        None => give_up(what, limit),
    }
}

/// Waits until `probe` gives a value, for at most `limit`; `None` if it never did.
pub async fn within<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    let mut pause = Pause::default();
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if start.elapsed() >= limit {
            return None;
        }
        pause.next().await;
    }
}

/// Like [`eventually`], for a condition that has to await (a request, a connect).
pub async fn eventually_async(what: &str, limit: Duration, mut cond: impl AsyncFnMut() -> bool) {
    eventually_some_async(what, limit, async || cond().await.then_some(())).await
}

/// Like [`eventually_some`], for a probe that has to await.
pub async fn eventually_some_async<T>(what: &str, limit: Duration, probe: impl AsyncFnMut() -> Option<T>) -> T {
    match within_async(limit, probe).await {
        Some(v) => v,
        None => give_up(what, limit),
    }
}

/// Like [`within`], for a probe that has to await.
pub async fn within_async<T>(limit: Duration, mut probe: impl AsyncFnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    let mut pause = Pause::default();
    loop {
        if let Some(v) = probe().await {
            return Some(v);
        }
        if start.elapsed() >= limit {
            return None;
        }
        pause.next().await;
    }
}
