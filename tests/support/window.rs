//! Counting arrivals in sliding windows, for checks that no window of a
//! limit's length ever saw more than its count.

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
