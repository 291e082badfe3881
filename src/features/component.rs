//! Components: features with a life of their own beside the calls (pingora's
//! background services are the model). A [`Feature`] plugs into the phases
//! of each call; a component is a feature that also runs work of its own
//! (a loop, a dispatcher), serves routes and owns metrics, and so needs a
//! lifecycle the server drives for it:
//!
//! | step | when | what it may do |
//! |---|---|---|
//! | [`Component::start`] | once, after the app is built, before the listeners accept | open what it needs (`Err` stops wxgate starting), spawn its work (holding the [`Host`] weakly: its loops end when the app is dropped) |
//! | [`Component::reload`] | a reload's config was read and checked, before it is swapped in | adjust `next` to what it must keep until a restart, open what `next` needs first (`Err` refuses the reload: the running config stays) |
//! | [`Component::serves`] / [`Component::serve`] | a request on the proxy listener whose path it claims, once its caller is identified | answer it (never forwarded) |
//! | [`Component::admin`] | a request on the admin listener under `/v1/`, after the admin token was checked | answer it (`None`: not its route) |
//! | [`Component::stop`] | a graceful stop, with the calls in flight | start nothing new, let work under way finish within the deadline |
//!
//! Its metrics are its own: it registers them in the registry when it is
//! built ([`crate::features::Features::new`]). A component is listed once,
//! in the `features!` list, marked `[component]`; the server, the admin
//! API and reloads loop over the list and never name one.

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::admit::callers::{Caller, Callers};
use crate::admit::core::Core;
use crate::config::Config;
pub use crate::error::ComponentError;
use crate::error::ProxyError;
use crate::features::hooks::{Calls, Feature};
use crate::transport::body::RelayBody;

/// What a component's work reaches of the running instance (implemented
/// by the app): the [`Core`], the running config and callers, and the way
/// to make a call of its own. Held weakly by a component's tasks.
pub trait Host: Send + Sync {
    fn core(&self) -> &Core;
    /// The running config (a reload swaps it).
    fn config(&self) -> Arc<Config>;
    /// The running config's callers.
    fn callers(&self) -> Arc<Callers>;
    /// Runs a call wxgate makes itself through the phases.
    fn calls(&self) -> &dyn Calls;
}

/// An answer of a component's admin route: its status and JSON body (the
/// admin API writes it).
pub type AdminAnswer = (StatusCode, serde_json::Value);

/// A feature with a lifecycle (see the module's table). Every method but
/// `start` has a default that does nothing.
pub trait Component: Feature {
    /// Opens what the component needs for `config` and starts its work.
    fn start(&self, host: Weak<dyn Host>, config: &Config) -> impl Future<Output = Result<(), ComponentError>> + Send;

    /// Before `next` replaces the running config.
    fn reload(&self, next: &mut Config) -> impl Future<Output = Result<(), ComponentError>> + Send {
        let _ = next;
        async { Ok(()) }
    }

    /// A graceful stop: nothing new starts; `false` when work was still
    /// under way at `deadline`.
    fn stop(&self, deadline: Duration) -> impl Future<Output = bool> + Send {
        let _ = deadline;
        async { true }
    }

    /// Whether a request to `path` on the proxy listener is its own.
    fn serves(&self, path: &str) -> bool {
        let _ = path;
        false
    }

    /// Answers a request to one of its paths from `caller` (identified as
    /// for a call: its key under `caller_auth = "required"`).
    fn serve(
        &self,
        host: &dyn Host,
        caller: &Caller,
        req: Request<Incoming>,
    ) -> impl Future<Output = Result<Response<RelayBody>, ProxyError>> + Send {
        let _ = (host, caller, req);
        async { Err(ProxyError::NotFound("no such endpoint".into())) }
    }

    /// Answers an admin request `method` `/v1/<path>` it serves; `None`:
    /// not its route.
    fn admin(
        &self,
        host: &dyn Host,
        method: &Method,
        path: &[&str],
    ) -> impl Future<Output = Option<AdminAnswer>> + Send {
        let _ = (host, method, path);
        async { None }
    }
}
