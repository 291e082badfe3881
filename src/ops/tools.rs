//! Tools built on the library, not on the call path: the simulated WeChat
//! ([`sim`]) and the command-line health check ([`healthcheck`]).

pub mod healthcheck;
pub mod sim;
