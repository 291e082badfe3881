//! Where a call comes from: a client's request on its connection, or a
//! call wxgate makes itself ([`crate::proxy::own`]: a token or ticket
//! fetch, a quota/get, a queued job's send). Both run the one list of
//! phases (`crate::proxy::run`), in one order; the phases that treat them
//! differently take the [`Source`], and what they do with it is all that
//! differs:
//!
//! | phase | a client's call | an own call |
//! |---|---|---|
//! | accept ([`super::accept::accept`]) | the request target checked (origin-form, a path an API can have, a declared body within `max_body`), an `@account` segment split off | the target its maker gave; its whole body set on the call |
//! | identify ([`super::identify::identify`]) | the caller (`X-Wx-Caller` or its key), its flood guard, the account it names and the caller's grant of it; the `on_request` hooks see the live request; a request it cannot read is counted under no rule | caller and account set by its maker; the `on_request` hooks see its `Seeds` |
//! | meter | the body read from the request when the rule counts recipients ([`Source::request`]) | the body it was given |
//! | decide | held only while the client may still read the answer ([`Source::client`]) | no client |
//! | forward ([`super::forward::prepare`]) | the client's head rewritten, its body as read or streamed | its method and body, a JSON content type |
//!
//! After the phases each is answered where it was made: a client gets the
//! answer the one table makes of an early stop and its access-log line
//! (`crate::proxy::serve`); an own call's maker gets WeChat's answer or
//! the refusal, with no access-log line and no caller series
//! ([`super::respond::count_and_log`] reads `Who::own`).

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::Request;
use hyper::body::Incoming;

use crate::features::hooks::Seeds;
use crate::transport::downstream::Client;

/// Where a call comes from (see the module docs for what that changes).
pub enum Source<'a> {
    /// A client's request, and the connection it came on.
    Client(Request<Incoming>, &'a Client),
    /// A call wxgate makes itself ([`crate::features::hooks::OwnCall`]):
    /// its caller, account and domain are set on the call by its maker.
    Own {
        /// The path and query to send.
        target: PathAndQuery,
        /// Its whole body (taken by accept).
        body: Bytes,
        /// What its maker leaves for the features' `on_request` hooks.
        seeds: Seeds,
    },
}

impl Source<'_> {
    /// The live request whose body may still be read (`None`: an own
    /// call, whose body is on the call).
    pub fn request(&mut self) -> Option<&mut Request<Incoming>> {
        match self {
            Source::Client(req, _) => Some(req),
            Source::Own { .. } => None,
        }
    }

    /// The client whose leaving ends a hold (`None`: an own call).
    pub fn client(&self) -> Option<&Client> {
        match self {
            Source::Client(_, client) => Some(client),
            Source::Own { .. } => None,
        }
    }
}
