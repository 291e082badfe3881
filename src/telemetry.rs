//! What an instance reports: its metrics ([`metrics`]).

pub mod metrics;
