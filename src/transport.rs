//! Bytes on the wire: the downstream connection ([`downstream`]) and its
//! browser marks ([`browser`]), its
//! smuggling guard ([`smuggling`]), bodies ([`body`], [`request_body`]),
//! WeChat's answer read ([`sniff`]), the upstream client ([`upstream`]),
//! TLS interception ([`intercept`]) and the worker threads ([`worker`]).

pub mod body;
pub mod browser;
pub mod downstream;
pub mod intercept;
pub mod request_body;
pub mod smuggling;
pub mod sniff;
pub mod upstream;
pub mod worker;
