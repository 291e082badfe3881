//! What an instance reports: its metrics ([`metrics`]) and its traces
//! ([`trace`]).

pub mod metrics;
pub mod trace;
