//! How long a call's forecast update waits while the console (or a scrape)
//! reads every pair: 100,000 (account, rule) pairs with a day quota, one
//! thread reading the top 20 and searching an id every 5 ms (what an open
//! console does every refresh, as if hundreds were open), the main thread
//! timing the per-call `Forecasts::observe` meanwhile. Prints how long a
//! whole pass takes and the calls' longest waits: with one lock over the
//! table, a call that comes during a pass waits for the rest of it.
//!
//! `cargo run --profile profiling --example forecast_stall -- 100000`
//! (pairs default to 100,000; `-- 100000 alone`: the calls with no reader,
//! the machine's own noise). Times, not instructions: compare two builds in
//! one run, on an otherwise idle machine.
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wxgate::admit::forecasts::Forecasts;
use wxgate::limit::calendar::Period;
use wxgate::limit::{Limit, Quota, Rule};

const S: i64 = 1_000_000;
const T0: i64 = 1_800_000_000 * S;

fn main() {
    let pairs: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let alone = std::env::args().nth(2).is_some_and(|a| a == "alone");
    let limit = NonZeroU64::new(5000).unwrap_or(NonZeroU64::MIN);
    let rule = Rule::new("send", vec![Limit::Calendar { count: limit, period: Period::Day }]);
    let left = |remaining: u64| Quota { limit: 0, remaining, reset_us: 3600 * S };
    let f = Arc::new(Forecasts::default());
    let accounts: Vec<String> = (0..pairs).map(|i| format!("wx{i:08}")).collect();
    for (i, a) in accounts.iter().enumerate() {
        f.observe(a, &rule, left(5000 - (i as u64 * 7919 % 5000)), T0, 1, false);
    }

    // One pass of each kind, alone.
    let t = Instant::now();
    let top = f.top(20, "", T0 + S);
    let top_alone = t.elapsed();
    let t = Instant::now();
    let found = f.top(20, "0009999", T0 + S);
    let search_alone = t.elapsed();
    assert_eq!((top.len(), found.len().min(1)), (20, 1));

    // The console reading while calls come.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (f, stop) = (f.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut passes = 0u32;
            while !alone && !stop.load(Ordering::Relaxed) {
                f.top(20, "", T0 + S);
                std::thread::sleep(Duration::from_millis(5));
                f.top(20, "0009999", T0 + S);
                passes += 2;
                std::thread::sleep(Duration::from_millis(5));
            }
            passes
        })
    };
    let mut waits: Vec<Duration> = Vec::with_capacity(400_000);
    let until = Instant::now() + Duration::from_secs(3);
    let mut i = 0usize;
    while Instant::now() < until {
        let a = &accounts[(i * 104_729) % accounts.len()];
        let t = Instant::now();
        f.observe(a, &rule, left(100), T0 + S, 1, false);
        waits.push(t.elapsed());
        i += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let passes = reader.join().unwrap_or(0);
    waits.sort_unstable();
    let at = |q: f64| waits[((waits.len() - 1) as f64 * q) as usize];
    println!("pairs {pairs}: top 20 alone {top_alone:.2?}, search alone {search_alone:.2?}");
    let over = |d: Duration| waits.iter().filter(|w| **w > d).count();
    println!(
        "{} calls beside {passes} passes: median {:.2?}, p99.9 {:.2?}; waits over 0.1 ms {}, over 1 ms {}; \
         the 5 longest {:.2?}",
        waits.len(),
        at(0.5),
        at(0.999),
        over(Duration::from_micros(100)),
        over(Duration::from_millis(1)),
        &waits[waits.len().saturating_sub(5)..]
    );
}
