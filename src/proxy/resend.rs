//! The one resend: a call whose body a feature kept, sent once more to the
//! target that feature asked for ([`crate::features::hooks::Feature::resend`]:
//! e.g. with a new token, after WeChat refused the one wxgate added,
//! before acting on the call).

use http::uri::PathAndQuery;
use http::Request;
use hyper::body::Incoming;

use super::call::Call;
use crate::error::{Early, ProxyError};
use crate::time::Stopwatch;
use crate::transport::request_body::RequestBody;

/// What a call whose body a feature kept needs to be sent once more.
pub struct Resend {
    pub method: http::Method,
    pub headers: http::HeaderMap,
    pub body: bytes::Bytes,
    pub upstream: std::sync::Arc<crate::transport::upstream::Upstream>,
}

/// Sends the call once more, to `target`, on the upstream that answered
/// the first time.
pub async fn resend(
    app: &crate::proxy::app::App,
    call: &mut Call,
    resend: &Resend,
    target: &PathAndQuery,
) -> Result<hyper::Response<Incoming>, Early> {
    let uri =
        resend.upstream.target(target).map_err(|e| ProxyError::BadRequest(format!("cannot forward this path: {e}")))?;
    let mut req = Request::new(RequestBody::bytes(resend.body.clone()));
    *req.method_mut() = resend.method.clone();
    *req.uri_mut() = uri;
    *req.headers_mut() = resend.headers.clone();
    let sent = Stopwatch::start();
    let traced_at = super::spans::now(call);
    let (tried, resp) = resend.upstream.send(req).await;
    call.sent.upstream_us += sent.elapsed_us();
    if traced_at.is_some() {
        let answered = super::spans::Answered::of(&resp);
        super::spans::exchanged(app, call, traced_at, resend.upstream.name(tried), answered, true);
    }
    call.sent.upstream = Some((resend.upstream.clone(), tried));
    Ok(resp?)
}
