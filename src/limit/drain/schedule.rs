//! The windows' schedule in closed form: when call `i` of a run goes, and
//! each window's TAT after `i` calls, in O(W) for `W` windows whatever
//! `i`, the same as replaying the run call by call (each window's `lead`
//! ≥ 0, as a compiled rule's is: the reserve keeps at most `burst − 1`
//! tokens of the tolerance).
//!
//! Why it holds. From a start `B` (the last call's time) and TATs `t_w`,
//! the replay places call `k` at `a_k = max(a_{k−1}, max_w TAT_w(k) − l_w)`
//! with `a_0 = max(B, max_w t_w − l_w)`, and `TAT_w(k) = max(TAT_w(k−1),
//! a_{k−1}) + s_w` unrolls to `max(t_w + k·s_w, max_{j<k} a_j + (k−j)·s_w)`
//! (`s_w` the window's step, `l_w` its lead). Every term is a bound plus
//! steps, so `a_k` is the longest of the chains that start at `B`, at a
//! `t_w`, and then add segments `(k−j)·s_v − l_v`. Two segments in a row
//! are never longer than one segment, over both lengths, of the window
//! with the larger step (`d₁s₁ + d₂s₂ − l₁ − l₂ ≤ (d₁+d₂)·s₁ − l₁` when
//! `s₁ ≥ s₂`, leads ≥ 0), so a longest chain has at most one segment after
//! its start. A start at `t_w` carried `j` calls by `w` itself, then
//! `k − j` by `v`, is linear in `j`: at `j = 0` it is at most `a_0 + k·s_v
//! − l_v`; at `j = k − 1` it beats `t_w + k·s_w − l_w` only if `s_v > s_w`,
//! and then it is below `a_0 + k·s_v − l_v` (`a_0 ≥ t_w − l_w`). What is
//! left, for `k ≥ 1`, is the largest of `a_0 + k·s_v − l_v` and `t_w +
//! k·s_w − l_w` over the windows: a maximum of lines in `k`, so `a_j` is
//! convex in `j ≥ 1`, and `max_{j<k} a_j + (k−j)·s_w` is at `j = 0`, `1`
//! or `k − 1`; `j = 1` never beats both others (its lines are `a_0` or a
//! `t_v`, plus `s_v − l_v`, then `s_w` a call: above `a_{k−1} + s_w` only
//! if `s_w > s_v`, and then below `max(t_w, a_0) + k·s_w`), so `TAT_w(k)`
//! is the largest of `max(t_w, a_0) + k·s_w` and `a_{k−1} + s_w`. (The
//! tests compare all of it with the replay on thousands of cases.)

use crate::time::Micros;

/// A window's GCRA state and terms, for a normal-priority call (here, below
/// the replay that uses it, so the schedule imports nothing of it).
pub(super) struct Window {
    pub(super) tat: Micros,
    /// τ − kept: how far ahead of `tat` a call may go.
    pub(super) lead: Micros,
    pub(super) step: Micros,
}

/// The calls the windows alone place from a start.
pub(super) struct Schedule<'a> {
    windows: &'a [Window],
    /// `a_0`: the run's first call.
    first: Micros,
}

impl<'a> Schedule<'a> {
    /// The run of calls after one placed at `start` (or starting there),
    /// from `windows` as they are now.
    pub(super) fn new(windows: &'a [Window], start: Micros) -> Schedule<'a> {
        let first = windows.iter().fold(start, |a, w| a.max(w.tat - w.lead));
        Schedule { windows, first }
    }

    /// When call `i` of the run (from 0) is admitted.
    pub(super) fn at(&self, i: u64) -> Micros {
        if i == 0 {
            return self.first;
        }
        let (k, first) = (i128::from(i), i128::from(self.first));
        let mut best = first;
        for w in self.windows {
            let (tw, sw, lw) = (i128::from(w.tat), i128::from(w.step), i128::from(w.lead));
            best = best.max(first.max(tw) + k * sw - lw);
        }
        clamp(best)
    }

    /// Window `w`'s TAT once `i` calls of the run were admitted.
    pub(super) fn tat(&self, w: &Window, i: u64) -> Micros {
        if i == 0 {
            return w.tat;
        }
        let (k, sw) = (i128::from(i), i128::from(w.step));
        let best = i128::from(w.tat).max(i128::from(self.first)) + k * sw;
        clamp(best.max(i128::from(self.at(i - 1)) + sw))
    }
}

fn clamp(t: i128) -> Micros {
    t.clamp(i128::from(Micros::MIN), i128::from(Micros::MAX)) as Micros
}
