//! What an instance reports: its metrics ([`metrics`]), the last hour of
//! them for the console ([`history`]) and its traces ([`trace`]).

pub mod history;
pub mod metrics;
pub mod trace;
