//! The features of a call, in the order their hooks ([`crate::features::hooks`])
//! run; the phases of [`crate::proxy`] run them through [`Features`]
//! without naming any. A feature owns its shared state (its value, built in
//! [`Features::new`]) and its per-call context ([`Feature::Ctx`], a field of
//! [`Contexts`]).
//!
//! Adding a feature: its module, an `impl Feature` with the hooks it needs,
//! its line in the `features!` list below and its value in
//! [`Features::new`]. A feature with a life of its own (background work,
//! routes, metrics: [`component`]) also implements `Component` and is
//! marked `[component]` in the list: the server starts, reloads and stops
//! it, and the listeners hand it its routes, through [`Features`].

pub mod accounts;
pub mod broker;
pub mod component;
pub mod directory;
pub mod errcodes;
pub mod hooks;
pub mod penalties;
pub mod queue;
pub mod quota_clear;
pub mod token_cache;
pub mod warmup;

use std::sync::{Arc, Weak};

use http::uri::PathAndQuery;
use http::{HeaderMap, Method, Request, Response};
use hyper::body::Incoming;

use crate::admit::callers::Caller;
use crate::config::{Config, StoreConfig};
use crate::error::{Early, ProxyError};
use crate::features::component::{AdminAnswer, Component, ComponentError, Host};
use crate::features::hooks::{Answered, Asking, Env, Feature, Requesting, Sending};
use crate::jobs::JobStore;
use crate::store::Store;
use crate::telemetry::metrics::Metrics;
use crate::time::Clock;
use crate::transport::body::RelayBody;

/// [`Features`] (every feature's value) and [`Contexts`] (every feature's
/// per-call context) from one list, and the hooks of all of them run in
/// its order, so the three cannot disagree; likewise the lifecycle of
/// those marked `[component]`. Any number of features.
macro_rules! features {
    ($($name:ident: $feature:ty $([$component:ident])?),+ $(,)?) => {
        /// Every feature, with its shared state, in the order their hooks run.
        pub struct Features {
            $(pub $name: $feature,)+
        }

        /// Every feature's context of one call.
        #[derive(Default)]
        pub struct Contexts {
            $(pub $name: <$feature as Feature>::Ctx,)+
        }

        impl Features {
            /// Every feature's [`Feature::on_request`]; the first `Err` ends the call.
            pub async fn on_request(&self, env: Env<'_>, cx: &mut Contexts, req: &mut Requesting<'_>) -> Result<(), Early> {
                $(self.$name.on_request(env, &mut cx.$name, req).await?;)+
                Ok(())
            }

            /// Every feature's [`Feature::before_decide`]; the first `Err` ends the call.
            pub async fn before_decide(&self, env: Env<'_>, cx: &mut Contexts, asking: &mut Asking<'_>) -> Result<(), Early> {
                $(self.$name.before_decide(env, &mut cx.$name, asking).await?;)+
                Ok(())
            }

            /// Every feature's [`Feature::before_forward`]; the first `Err` ends the call.
            pub async fn before_forward(&self, env: Env<'_>, cx: &mut Contexts, sending: &mut Sending<'_>) -> Result<(), Early> {
                $(self.$name.before_forward(env, &mut cx.$name, sending).await?;)+
                Ok(())
            }

            /// Whether any feature keeps the call's body ([`Feature::keep_body`]).
            pub fn keep_body(&self, cx: &Contexts) -> bool {
                false $(|| self.$name.keep_body(&cx.$name))+
            }

            /// The first feature's resend target ([`Feature::resend`]), if any asks.
            pub async fn resend(&self, env: Env<'_>, cx: &mut Contexts, answered: &Answered<'_>) -> Option<PathAndQuery> {
                $(if let Some(target) = self.$name.resend(env, &mut cx.$name, answered).await {
                    return Some(target);
                })+
                None
            }

            /// Every feature's [`Feature::on_answer`].
            pub async fn on_answer(&self, env: Env<'_>, cx: &mut Contexts, answered: &mut Answered<'_>) {
                $(self.$name.on_answer(env, &mut cx.$name, answered).await;)+
            }

            /// Every feature's [`Feature::on_response`].
            pub fn on_response(&self, cx: &Contexts, answered: &Answered<'_>, headers: &mut HeaderMap) {
                $(self.$name.on_response(&cx.$name, answered, headers);)+
            }

            /// Starts every component ([`Component::start`]), in order; the
            /// first `Err` stops wxgate starting.
            pub async fn start(&self, host: Weak<dyn Host>, config: &Config) -> Result<(), ComponentError> {
                $($(
                    let _ = stringify!($component);
                    Component::start(&self.$name, host.clone(), config).await?;
                )?)+
                let _ = (host, config);
                Ok(())
            }

            /// Every component's [`Component::reload`] of `next`; the
            /// first `Err` refuses the reload.
            pub async fn reload(&self, next: &mut Config) -> Result<(), ComponentError> {
                $($(
                    let _ = stringify!($component);
                    Component::reload(&self.$name, next).await?;
                )?)+
                let _ = next;
                Ok(())
            }

            /// Stops every component ([`Component::stop`]) within `deadline`
            /// (together); `false` when one still had work under way.
            pub async fn stop(&self, deadline: std::time::Duration) -> bool {
                let mut all = true;
                $($(
                    let _ = stringify!($component);
                    all &= Component::stop(&self.$name, deadline).await;
                )?)+
                let _ = deadline;
                all
            }

            /// Whether a component serves `path` on the proxy listener.
            pub fn serves(&self, path: &str) -> bool {
                false $($(|| { let _ = stringify!($component); Component::serves(&self.$name, path) })?)+
            }

            /// The component serving `req`'s path answers it ([`Component::serve`]).
            pub async fn serve(&self, host: &dyn Host, caller: &Caller, req: Request<Incoming>) -> Result<Response<RelayBody>, ProxyError> {
                $($(
                    let _ = stringify!($component);
                    if Component::serves(&self.$name, req.uri().path()) {
                        return Component::serve(&self.$name, host, caller, req).await;
                    }
                )?)+
                let _ = (host, caller);
                Err(ProxyError::NotFound(format!("no such endpoint: {}", req.uri().path())))
            }

            /// The first component's answer to an admin request `/v1/<path>`
            /// ([`Component::admin`]); `None`: no component's route.
            pub async fn admin(&self, host: &dyn Host, method: &Method, path: &[&str]) -> Option<AdminAnswer> {
                $($(
                    let _ = stringify!($component);
                    if let Some(answer) = Component::admin(&self.$name, host, method, path).await {
                        return Some(answer);
                    }
                )?)+
                let _ = (host, method, path);
                None
            }
        }
    };
}

// The features, in the order their hooks run. clear_quota recognises its
// calls before the account is found (it is the appid cleared); the broker
// after it (it adds the account's token); penalties last of the answer
// hooks, as WeChat's answer is reported to the store last (errcodes after
// it only keeps what it saw, with the penalty started). The queue
// last: its intake answers once every other feature has checked the call
// (its account, its domain), and a job's send is marked `Sending` after
// every other `before_forward` (the broker's token) has run.
features!(
    quota_clear: quota_clear::QuotaClear,
    accounts: accounts::Accounts,
    broker: broker::Broker,
    token_cache: token_cache::TokenCacheFeature,
    warmup: warmup::Warmup,
    penalties: penalties::Penalties,
    errcodes: errcodes::Errcodes,
    ratelimit_headers: RateLimitHeaders,
    directory: directory::Directory [component],
    queue: queue::Queue [component],
);

impl Features {
    /// Every feature, its state built from `config`.
    pub fn new(
        config: &Config,
        store: &Arc<dyn Store>,
        clock: &Arc<dyn Clock>,
        metrics: &mut Metrics,
        jobs: Option<Arc<dyn JobStore>>,
    ) -> Result<Features, FeaturesError> {
        let cache = token_cache::cache::TokenCache::open(
            &config.tokens,
            &config.store,
            store,
            clock.clone(),
            metrics.tokens.clone(),
        )?;
        if cache.is_none() && !config.quota_syncs.is_empty() {
            tracing::warn!("quota_sync needs the token cache ([tokens]): no rule's day count will be synced");
        }
        broker::check(config, cache.as_deref(), matches!(config.store, StoreConfig::Redis(_)))?;
        Ok(Features {
            quota_clear: quota_clear::QuotaClear,
            accounts: accounts::Accounts::new(config.server.workers),
            broker: broker::Broker { cache: cache.clone() },
            token_cache: token_cache::TokenCacheFeature { cache: cache.clone() },
            warmup: warmup::Warmup,
            penalties: penalties::Penalties::default(),
            errcodes: errcodes::Errcodes::default(),
            ratelimit_headers: RateLimitHeaders,
            directory: directory::Directory::new(cache, &mut metrics.registry),
            queue: queue::Queue::new(config, jobs, &mut metrics.registry),
        })
    }
}

/// Why the features' state cannot be built at start.
#[derive(Debug, thiserror::Error)]
pub enum FeaturesError {
    /// The token cache (`[tokens]`: its key).
    #[error(transparent)]
    TokenCache(#[from] token_cache::cache::TokenCacheError),
    /// An `[[account]]` without the token cache it needs.
    #[error(transparent)]
    Accounts(#[from] broker::AccountsError),
}

/// The RateLimit headers as a feature: on every admitted call's answer,
/// the rule's policies and the room left in its tightest limit
/// ([`crate::error::ratelimit::admitted`]). Refusals get theirs from the one table
/// ([`crate::error`], [`crate::error::ratelimit::refused`]).
pub struct RateLimitHeaders;

impl Feature for RateLimitHeaders {
    type Ctx = ();

    fn on_response(&self, _: &(), answered: &Answered<'_>, headers: &mut HeaderMap) {
        if let (Some(rule), Some(a), true) =
            (answered.rule, answered.admitted, answered.config.server.ratelimit_headers)
        {
            let policy = &answered.config.rule_http(Some(rule)).policy;
            crate::error::ratelimit::admitted(headers, rule, policy, a.quota);
        }
    }
}
