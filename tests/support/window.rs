//! Counting arrivals in sliding windows, for checks that no window of a
//! limit's length ever saw more than its count; and the pace of arrivals.

use std::ops::Sub;

/// The busiest half-open window `[t, t + w)` over `times` (sorted, earliest
/// first): how many of `times` it holds, and the first of them (`None` when
/// `times` is empty).
pub fn busiest_window<T, D>(times: &[T], w: D) -> (usize, Option<T>)
where
    T: Copy + PartialOrd + Sub<Output = D>,
    D: PartialOrd,
{
    assert!(times.windows(2).all(|p| p[0] <= p[1]), "times must be sorted");
    let mut best = (0, None);
    let mut lo = 0;
    for hi in 0..times.len() {
        while times[hi] - times[lo] >= w {
            lo += 1;
        }
        if hi - lo + 1 > best.0 {
            best = (hi - lo + 1, Some(times[lo]));
        }
    }
    best
}

/// The largest number of `times` (sorted) inside any half-open window `[t, t + w)`.
pub fn max_in_window<T, D>(times: &[T], w: D) -> usize
where
    T: Copy + PartialOrd + Sub<Output = D>,
    D: PartialOrd,
{
    busiest_window(times, w).0
}

/// Arrivals per second from `times[from]` to the last of `times` (sorted):
/// `(times.len() - 1 - from)` gaps over that span (e.g. after a limit's
/// first burst, which goes at once). 0 when there are not two.
pub fn pace(times: &[std::time::Instant], from: usize) -> f64 {
    assert!(times.windows(2).all(|p| p[0] <= p[1]), "times must be sorted");
    match (times.get(from), times.last()) {
        (Some(first), Some(last)) if last > first => (times.len() - 1 - from) as f64 / (*last - *first).as_secs_f64(),
        _ => 0.0,
    }
}
