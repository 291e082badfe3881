//! What an instance reports: its metrics ([`metrics`]) and the RateLimit
//! response headers ([`ratelimit_headers`]).

pub mod metrics;
pub mod ratelimit_headers;
