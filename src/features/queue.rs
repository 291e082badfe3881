//! Queued delivery (issue 47, docs/plans/queued-delivery.md): a message a
//! caller hands wxgate once, sent at the first moment WeChat takes it.
//! Being built: the jobs are stored by [`crate::store::jobs`]; here, so far,
//! what becomes of a job after an attempt ([`retry`]) and how a round of
//! the dispatcher is shared between callers ([`turns`]). The intake (a
//! feature answering 202) and the dispatcher come next; until then nothing
//! here is on a call's path.

pub mod retry;
pub mod turns;
