//! Which serving thread the current code runs on.
//!
//! `wxgate` serves on `[server] workers` threads, each with its own
//! single-threaded Tokio runtime (the model nginx uses with worker
//! processes): a connection, its upstream connection and its Redis round
//! trips all stay on one thread, so no call ever wakes another thread.
//! Per-thread resources (the upstream connection pool, the Redis connection)
//! are looked up by [`current`]; code that runs anywhere else (the admin
//! API, background tasks, in-process tests) uses the shared ones.

use std::cell::Cell;

thread_local! {
    static INDEX: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The serving thread's index (0-based), or `None` off the serving threads.
pub fn current() -> Option<usize> {
    INDEX.with(Cell::get)
}

/// Marks this thread as serving thread `index`, for its whole life.
pub fn enter(index: usize) {
    INDEX.with(|i| i.set(Some(index)));
}

/// Picks this thread's own item of `per_worker`, or `shared` off the serving
/// threads (or when it has none).
pub fn pick<'a, T>(per_worker: &'a [T], shared: &'a T) -> &'a T {
    current().and_then(|i| per_worker.get(i)).unwrap_or(shared)
}
