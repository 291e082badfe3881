//! Every answer wxgate writes itself, in one place, WeChat-shaped:
//! `{"errcode":N,"errmsg":"wxgate: ..."}` with an HTTP status that says
//! what happened (400, 408, 413, 429, 502, 503, 504). An SDK that reads
//! the body of a non-2xx answer sees a WeChat errcode; one that turns every
//! non-2xx status into a transport error (wechatpy, WxJava's Apache
//! backend) does not: for those, a rule's `throttle_status = 200` makes
//! refusals HTTP 200 with the same body and headers.
//!
//! [`ProxyError::row`] is the one table from an error to status, errcode,
//! outcome label and headers; nothing else chooses a status. The
//! RateLimit headers, on refusals and on forwarded answers alike, are
//! written by [`ratelimit`].
//!
//! Why wxgate cannot start at all is a `StartError` (`crate::proxy::start`, which names the failing parts' own errors); a component's failure is a [`ComponentError`].

pub mod component;
pub mod ratelimit;
pub mod unavailable;

pub use component::ComponentError;
pub use unavailable::Unavailable;

use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};

use crate::config::Config;
use crate::limit::{Reason, Rule};
use crate::telemetry::metrics::Outcome;
use crate::time::Micros;
use crate::transport::body::RelayBody;
use crate::transport::upstream::UpstreamError;

/// WeChat's "api freq out of limit"; what a throttled call reports.
pub const ERRCODE_THROTTLED: i64 = 45009;
/// WeChat's "invalid args"; what a malformed request reports.
pub const ERRCODE_BAD_REQUEST: i64 = 40097;
/// WeChat's "api unauthorized": what a call gets whose caller is not
/// proven or not granted the account. SDKs treat it as permanent: none
/// refetches a token or retries on it (40001 would make them refetch).
pub const ERRCODE_UNAUTHORIZED: i64 = 48001;
/// WeChat's "invalid appsecret": a token request for an `[[account]]`
/// with another secret than the one wxgate holds.
pub const ERRCODE_INVALID_SECRET: i64 = 40125;
/// WeChat's "system error, retry later"; upstream unreachable or too slow.
pub const ERRCODE_SYSTEM: i64 = -1;

pub const REASON_HEADER: &str = "x-wxgate-reason";
pub const RULE_HEADER: &str = "x-wxgate-rule";
/// `X-Wxgate-Reason` of a call its caller's flood guard refused.
pub const REASON_CALLER_RATE: &str = "caller_rate";

/// A call wxgate answers itself.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("{0}")]
    BadRequest(String),
    /// `over`: the recipients over their own `per_recipient` limits (the
    /// errmsg lists them so the caller can send to the others).
    #[error("rule \"{rule}\" throttled this call ({reason}); retry after {secs}s{over}", reason = .reason.as_str(), secs = retry_after_secs(*.wait_us), over = over_text(.over))]
    Throttled { rule: String, reason: Reason, wait_us: Micros, over: Vec<String> },
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// Something this call needs is not ready (the store could not decide
    /// and `[store] fallback = "deny"`, a reload is half-way, ...): a retry
    /// in a second may succeed. [`Unavailable`] says what.
    #[error(transparent)]
    Unavailable(Unavailable),
    #[error("{0}")]
    TooLarge(String),
    /// `[server] max_accounts` accounts already had calls today; this one is new.
    #[error("this wxgate instance serves at most {max} accounts a day ([server] max_accounts) and this call's account is not one of today's; retry after {secs}s", secs = retry_after_secs(*.wait_us))]
    AccountsFull { max: usize, wait_us: Micros },
    /// `caller_auth = "required"`: the call proves no declared caller (401).
    #[error("{0}")]
    Unauthenticated(String),
    /// `caller_auth = "required"`: its caller may not spend the account (403).
    #[error("{0}")]
    Forbidden(String),
    /// A token request waited `[tokens] wait` for another request's fetch
    /// of the same token, which did not end in time.
    #[error("another request is fetching this access token and did not finish within {0:?} ([tokens] wait); retry")]
    TokenWait(std::time::Duration),
    /// wxgate could not get the token of an `[[account]]` for a call it
    /// would add it to (`crate::features::broker`): WeChat refused the
    /// fetch (its errcode) or gave no token.
    #[error("cannot get an access token for account \"{account}\": {why}")]
    NoToken { account: std::sync::Arc<str>, errcode: i64, why: String },
    /// A token request for an `[[account]]` whose secret wxgate holds,
    /// giving another secret (403).
    #[error("{0}")]
    WrongSecret(String),
    /// The caller's flood guard (`[[caller]] rate`) refused the call.
    #[error("caller \"{caller}\" is over its rate of {rate} on this instance ([[caller]] rate); retry after {secs}s", secs = retry_after_secs(*.wait_us))]
    CallerRate { caller: std::sync::Arc<str>, rate: crate::config::CallerRate, wait_us: Micros },
    /// A queued submission would pass a `[queue]` bound: nothing stored
    /// (429, `X-Wxgate-Reason: queue_full`).
    #[error("{what}; nothing was queued, retry after {secs}s", secs = retry_after_secs(*.wait_us))]
    QueueFull { what: String, wait_us: Micros },
    /// No such thing for this caller (a delivery id: another caller's is
    /// not found either).
    #[error("{0}")]
    NotFound(String),
}

/// A call that ends before its last phase. Each phase (and each feature's
/// hook, [`crate::features`]) either hands on to the next or stops the call
/// with one of these; [`crate::proxy`] turns it into the one answer the
/// client gets.
pub enum Early {
    /// wxgate refuses or fails the call: a WeChat-shaped answer, made by
    /// the one table ([`ProxyError::into_response`]).
    Refused(ProxyError),
    /// A hook answered the call itself (e.g. from a cache): sent as it is,
    /// counted as `outcome`.
    Answered(Box<Response<RelayBody>>, Outcome),
}

impl From<ProxyError> for Early {
    fn from(e: ProxyError) -> Early {
        Early::Refused(e)
    }
}

/// A store that could not answer: the call is unavailable ([`Unavailable::Store`]).
impl From<crate::store::StoreError> for ProxyError {
    fn from(e: crate::store::StoreError) -> ProxyError {
        ProxyError::Unavailable(Unavailable::Store(e))
    }
}

impl From<UpstreamError> for Early {
    fn from(e: UpstreamError) -> Early {
        Early::Refused(ProxyError::Upstream(e))
    }
}

/// The errmsg's list of the recipients over their own limits ("" if none).
fn over_text(over: &[String]) -> String {
    if over.is_empty() {
        return String::new();
    }
    // A broadcast's members over may be thousands: the first 1,000 (all of
    // a `touser`'s, which names at most that many) are listed.
    let listed = over.len().min(OVER_LISTED);
    let more = match over.len() - listed {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    format!(
        "; {} recipient(s) over their per_recipient limits, the message was sent to no one: {}{more} (send to \
         the others without them, or retry after the wait)",
        over.len(),
        over[..listed].join("|")
    )
}

/// Most recipients over their limits an errmsg names.
const OVER_LISTED: usize = 1_000;

/// `Retry-After` for a wait: whole seconds, rounded up, at least 1.
pub fn retry_after_secs(wait_us: Micros) -> i64 {
    ((wait_us + 999_999) / 1_000_000).max(1)
}

/// An answer's HTTP status, as the table gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Fixed(StatusCode),
    /// The call's rule's `throttle_status` ([server]'s for a call without a
    /// rule): 429, or 200 for SDKs that drop the body of a non-2xx answer.
    Throttle,
}

/// The headers a row adds besides `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Marks {
    None,
    /// `Retry-After`, `X-Wxgate-Reason`, `X-Wxgate-Rule`, and the
    /// `RateLimit` headers when `[server] ratelimit_headers` is on.
    Throttled {
        reason: Reason,
        wait_us: Micros,
    },
    /// `Retry-After` and `X-Wxgate-Reason: caller_rate`.
    CallerRate {
        wait_us: Micros,
    },
    /// `Retry-After: 1` and `X-Wxgate-Reason: unavailable`.
    Unavailable,
    /// `Retry-After` and `X-Wxgate-Reason: accounts_full`.
    AccountsFull {
        wait_us: Micros,
    },
    /// `X-Wxgate-Reason: unauthenticated` and a `WWW-Authenticate` challenge.
    Unauthenticated,
    /// `X-Wxgate-Reason: forbidden`.
    Forbidden,
    /// `Retry-After` and `X-Wxgate-Reason: queue_full`.
    QueueFull {
        wait_us: Micros,
    },
}

/// One row of the table: everything the client and the metrics see of a
/// way a call ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Row {
    status: Status,
    errcode: i64,
    outcome: Outcome,
    marks: Marks,
}

impl ProxyError {
    /// **The table**: every way wxgate ends a call itself, and what it
    /// becomes: status, errcode, outcome label, headers. The only place a
    /// status is chosen (WeChat's own penalised answers take theirs from
    /// [`penalised`], from the same rows).
    fn row(&self) -> Row {
        use StatusCode as S;
        let row = |status, errcode, outcome, marks| Row { status, errcode, outcome, marks };
        let fixed = Status::Fixed;
        match self {
            ProxyError::BadRequest(_) => {
                row(fixed(S::BAD_REQUEST), ERRCODE_BAD_REQUEST, Outcome::rejected_bad_request, Marks::None)
            }
            ProxyError::TooLarge(_) => {
                row(fixed(S::PAYLOAD_TOO_LARGE), ERRCODE_BAD_REQUEST, Outcome::rejected_bad_request, Marks::None)
            }
            &ProxyError::AccountsFull { wait_us, .. } => {
                row(Status::Throttle, ERRCODE_THROTTLED, Outcome::throttled, Marks::AccountsFull { wait_us })
            }
            ProxyError::Unauthenticated(_) => {
                row(fixed(S::UNAUTHORIZED), ERRCODE_UNAUTHORIZED, Outcome::unauthorized, Marks::Unauthenticated)
            }
            ProxyError::Forbidden(_) => {
                row(fixed(S::FORBIDDEN), ERRCODE_UNAUTHORIZED, Outcome::unauthorized, Marks::Forbidden)
            }
            ProxyError::WrongSecret(_) => {
                row(fixed(S::FORBIDDEN), ERRCODE_INVALID_SECRET, Outcome::unauthorized, Marks::Forbidden)
            }
            &ProxyError::NoToken { errcode, .. } => {
                row(fixed(S::BAD_GATEWAY), errcode, Outcome::upstream_error, Marks::None)
            }
            &ProxyError::Throttled { reason, wait_us, .. } => {
                let outcome = if reason == Reason::Penalty { Outcome::penalised } else { Outcome::throttled };
                row(Status::Throttle, ERRCODE_THROTTLED, outcome, Marks::Throttled { reason, wait_us })
            }
            &ProxyError::QueueFull { wait_us, .. } => {
                row(Status::Throttle, ERRCODE_THROTTLED, Outcome::throttled, Marks::QueueFull { wait_us })
            }
            ProxyError::NotFound(_) => {
                row(fixed(S::NOT_FOUND), ERRCODE_BAD_REQUEST, Outcome::rejected_bad_request, Marks::None)
            }
            &ProxyError::CallerRate { wait_us, .. } => {
                row(Status::Throttle, ERRCODE_THROTTLED, Outcome::throttled, Marks::CallerRate { wait_us })
            }
            ProxyError::Unavailable(_) | ProxyError::TokenWait(_) => {
                row(fixed(S::SERVICE_UNAVAILABLE), ERRCODE_SYSTEM, Outcome::unavailable, Marks::Unavailable)
            }
            ProxyError::Upstream(e) => {
                let status = match e {
                    UpstreamError::Timeout(_) | UpstreamError::ConnectTimeout(_) | UpstreamError::BodyStalled(_) => {
                        S::GATEWAY_TIMEOUT
                    }
                    UpstreamError::BodyTooLarge => S::PAYLOAD_TOO_LARGE,
                    UpstreamError::BadBody(_) => S::BAD_REQUEST,
                    UpstreamError::ClientStalled(_) => S::REQUEST_TIMEOUT,
                    _ => S::BAD_GATEWAY,
                };
                // A body the client malformed, cut short or stopped sending.
                if e.client_fault() {
                    row(fixed(status), ERRCODE_BAD_REQUEST, Outcome::rejected_bad_request, Marks::None)
                } else {
                    row(fixed(status), ERRCODE_SYSTEM, Outcome::upstream_error, Marks::None)
                }
            }
        }
    }

    /// The outcome this error is counted and logged as.
    /// A refusal of the caller rather than of its request (its key, its
    /// rate, its grant, the account table, a reload settling): counted
    /// under the call's rule. A request wxgate could not read is counted
    /// under none.
    pub fn refuses_the_caller(&self) -> bool {
        matches!(
            self,
            ProxyError::Unauthenticated(_)
                | ProxyError::Forbidden(_)
                | ProxyError::CallerRate { .. }
                | ProxyError::AccountsFull { .. }
                | ProxyError::Unavailable(_)
        )
    }

    pub fn outcome(&self) -> Outcome {
        self.row().outcome
    }

    /// The one mapping from an error to what the client sees, for a call
    /// of `rule` (`None`: no rule matched, or none was looked up yet).
    pub fn into_response(self, rule: Option<&Rule>, config: &Config) -> Response<RelayBody> {
        self.into_response_for(rule, config, None)
    }

    /// [`ProxyError::into_response`] for a caller whose `throttle_status`
    /// (`Some`) replaces the rule's.
    /// The status of its answer by the table (a throttle as 429, whatever
    /// `throttle_status` a rule or caller sets): a span's status code.
    pub fn status(&self) -> StatusCode {
        match self.row().status {
            Status::Fixed(status) => status,
            Status::Throttle => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    pub fn into_response_for(
        self,
        rule: Option<&Rule>,
        config: &Config,
        caller_status: Option<StatusCode>,
    ) -> Response<RelayBody> {
        let row = self.row();
        let http = config.rule_http(rule);
        let body = serde_json::json!({ "errcode": row.errcode, "errmsg": format!("wxgate: {self}") });
        let mut resp = Response::new(RelayBody::full(body.to_string()));
        *resp.status_mut() = match row.status {
            Status::Fixed(status) => status,
            Status::Throttle => caller_status.unwrap_or(http.throttle_status),
        };
        let h = resp.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        match row.marks {
            Marks::None => {}
            Marks::Throttled { reason, wait_us } => {
                let name = match &self {
                    ProxyError::Throttled { rule, .. } => rule.as_str(),
                    _ => "",
                };
                mark_throttled(h, name, reason, wait_us);
                if let (Some(rule), true) = (rule, config.server.ratelimit_headers) {
                    ratelimit::refused(h, rule, &http.policy, reason, wait_us);
                }
            }
            Marks::CallerRate { wait_us } => {
                h.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(wait_us)));
                h.insert(REASON_HEADER, HeaderValue::from_static(REASON_CALLER_RATE));
            }
            Marks::Unavailable => {
                h.insert(RETRY_AFTER, HeaderValue::from(1));
                h.insert(REASON_HEADER, HeaderValue::from_static("unavailable"));
            }
            Marks::AccountsFull { wait_us } => {
                h.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(wait_us)));
                h.insert(REASON_HEADER, HeaderValue::from_static("accounts_full"));
            }
            Marks::Unauthenticated => {
                h.insert(http::header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"wxgate\""));
                h.insert(REASON_HEADER, HeaderValue::from_static("unauthenticated"));
            }
            Marks::Forbidden => {
                h.insert(REASON_HEADER, HeaderValue::from_static("forbidden"));
            }
            Marks::QueueFull { wait_us } => {
                h.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(wait_us)));
                h.insert(REASON_HEADER, HeaderValue::from_static("queue_full"));
            }
        }
        resp
    }
}

/// WeChat answered a penalised errcode to a call of `rule` (not in shadow
/// mode): its answer reaches the client as a penalty refusal's row says
/// (429, or WeChat's own status when the caller's `throttle_status`, else
/// the rule's, is 200; `Retry-After` and the refusal headers), with
/// WeChat's body unchanged.
pub fn penalised(
    parts: &mut http::response::Parts,
    rule: &Rule,
    config: &Config,
    caller_status: Option<StatusCode>,
    wait_us: Micros,
) -> Outcome {
    let row = ProxyError::Throttled { rule: String::new(), reason: Reason::Penalty, wait_us, over: Vec::new() }.row();
    let status = caller_status.unwrap_or(config.rule_http(Some(rule)).throttle_status);
    if row.status == Status::Throttle && status == StatusCode::TOO_MANY_REQUESTS {
        parts.status = StatusCode::TOO_MANY_REQUESTS;
    }
    mark_throttled(&mut parts.headers, &rule.name, Reason::Penalty, wait_us);
    row.outcome
}

/// Adds `Retry-After`, `X-Wxgate-Reason` and `X-Wxgate-Rule` to a refusal.
pub fn mark_throttled(headers: &mut HeaderMap, rule: &str, reason: Reason, wait_us: Micros) {
    headers.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(wait_us)));
    headers.insert(REASON_HEADER, HeaderValue::from_static(reason.as_str()));
    if let Ok(v) = HeaderValue::from_str(rule) {
        headers.insert(RULE_HEADER, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table's statuses for a rule that answers refusals with 200, and
    /// for a call without a rule on a server that answers them with 429.
    #[test]
    fn the_table_gives_throttling_rows_the_rules_status_and_the_rest_their_own() {
        let text = "[server]\nupstream = \"http://127.0.0.1:9\"\n[[rule]]\nname = \"r\"\nmatch = [\"/x\"]\n\
                    limits = [{ count = 1, per = \"1s\" }]\nthrottle_status = 200\n";
        let config = crate::config::Config::parse(text, std::path::Path::new("t.toml")).expect("config");
        let rule = config.rule_for("/x").expect("rule").clone();
        let throttled =
            || ProxyError::Throttled { rule: "r".into(), reason: Reason::Rate, wait_us: 1, over: Vec::new() };
        let caller = || ProxyError::CallerRate {
            caller: "c".into(),
            rate: crate::config::CallerRate { count: std::num::NonZeroU32::MIN, per: crate::config::RatePer::Second },
            wait_us: 1,
        };
        let status = |e: ProxyError, rule: Option<&Rule>| e.into_response(rule, &config).status().as_u16();
        assert_eq!(status(throttled(), Some(&rule)), 200);
        assert_eq!(status(caller(), Some(&rule)), 200);
        assert_eq!(status(caller(), None), 429);
        assert_eq!(status(ProxyError::TokenWait(std::time::Duration::from_secs(1)), Some(&rule)), 503);
        assert_eq!(status(ProxyError::BadRequest("x".into()), Some(&rule)), 400);
        assert_eq!(
            ProxyError::Upstream(UpstreamError::ClientStalled(std::time::Duration::ZERO)).outcome(),
            Outcome::rejected_bad_request
        );
        let penalty = ProxyError::Throttled { rule: "r".into(), reason: Reason::Penalty, wait_us: 1, over: Vec::new() };
        assert_eq!(penalty.outcome(), Outcome::penalised);
    }

    /// Whatever was not ready, one answer: 503, errcode -1, `Retry-After: 1`,
    /// outcome `unavailable`, a refusal of the caller (counted under its rule).
    #[test]
    fn a_broadcasts_members_over_are_listed_up_to_a_thousand() {
        let few: Vec<String> = vec!["a".into(), "b".into()];
        assert!(over_text(&few).contains("2 recipient(s) over") && over_text(&few).contains(": a|b ("));
        let many: Vec<String> = (0..2_500).map(|i| format!("m{i}")).collect();
        let text = over_text(&many);
        assert!(text.contains("2500 recipient(s) over") && text.contains("m999 and 1500 more ("), "{}", &text[..80]);
        assert!(!text.contains("m1000|") && !text.contains("|m1000 "));
    }

    #[test]
    fn every_unavailable_gets_the_one_unavailable_row() {
        let row = Row {
            status: Status::Fixed(StatusCode::SERVICE_UNAVAILABLE),
            errcode: ERRCODE_SYSTEM,
            outcome: Outcome::unavailable,
            marks: Marks::Unavailable,
        };
        for why in [
            Unavailable::Store(crate::store::StoreError::Settling),
            Unavailable::AuthReloading,
            Unavailable::NoTokenCache,
            Unavailable::AnsweredEarly(Outcome::cached),
            Unavailable::JobLeaseLost,
            Unavailable::Directory("WeCom's directory did not answer".into()),
        ] {
            let e = ProxyError::Unavailable(why);
            assert_eq!(e.row(), row, "{e}");
            assert!(e.refuses_the_caller(), "{e}");
        }
        let store = ProxyError::Unavailable(crate::store::StoreError::BreakerOpen.into());
        assert_eq!(store.to_string(), "store unavailable: circuit breaker open");
    }
}
