//! The trace exporter (`[telemetry]`, docs/tracing.md): the spans the
//! calls finish ([`crate::telemetry::trace`]) posted to the collector over
//! OTLP/HTTP with protobuf, in batches, one export at a time. What a dead
//! or slow collector costs is counted (`wxgate_trace_spans_total`), never
//! waited for by a call.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, USER_AGENT};
use http::{HeaderValue, Method, Request};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::proxy::app::App;
use crate::telemetry::trace::export::{self, Source};

/// Most bytes of a collector's answer read (a partial-success message).
const ANSWER_READ: usize = 64 * 1024;

/// Why the collector did not take an export (logged at debug; its spans
/// are dropped and counted).
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The request cannot be built.
    #[error("{0}")]
    Request(http::Error),
    /// No answer: refused, reset, TLS.
    #[error("no answer: {0}")]
    NoAnswer(hyper_util::client::legacy::Error),
    /// An answer other than 2xx.
    #[error("the collector answered {0}")]
    Refused(http::StatusCode),
}

/// Starts the exporter when tracing is on; it ends once the app (and its
/// tracer) is gone and the queue is drained.
pub fn spawn(app: &Arc<App>) {
    let Some(tracer) = &app.core.tracer else { return };
    let config = app.config.load();
    let (Some(telemetry), Some(spans)) = (config.telemetry.clone(), tracer.take_spans()) else { return };
    let poster = match crate::transport::upstream::connector(&config.server) {
        Ok(connector) => Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build::<_, Full<Bytes>>(connector),
        Err(e) => {
            tracing::error!(error = %e, "[telemetry]: no client for the collector; traces are not exported");
            return;
        }
    };
    let counters = tracer.queue().counters().clone();
    let source = Source { service_name: telemetry.service_name.clone(), service_instance: instance_id() };
    // The collector's host and path only: a query may carry a key.
    let collector =
        format!("{}{}", telemetry.endpoint.authority().map_or("", |a| a.as_str()), telemetry.endpoint.path());
    tracing::info!(%collector, ratio = telemetry.sampler.ratio, "[telemetry]: exporting traces");
    let telemetry = Arc::new(telemetry);
    tokio::spawn(export::run(spans, source, counters, telemetry.batch_delay, telemetry.timeout, move |body| {
        let poster = poster.clone();
        let telemetry = telemetry.clone();
        async move {
            let mut req = Request::builder()
                .method(Method::POST)
                .uri(telemetry.endpoint.clone())
                .header(CONTENT_TYPE, HeaderValue::from_static("application/x-protobuf"))
                .header(USER_AGENT, HeaderValue::from_static(concat!("wxgate/", env!("CARGO_PKG_VERSION"))))
                .body(Full::new(body))
                .map_err(ExportError::Request)?;
            for (name, value) in &telemetry.headers {
                req.headers_mut().append(name.clone(), value.clone());
            }
            let resp = poster.request(req).await.map_err(ExportError::NoAnswer)?;
            let status = resp.status();
            crate::transport::body::read_some(resp.into_body(), ANSWER_READ).await;
            match status.is_success() {
                true => Ok(()),
                false => Err(ExportError::Refused(status)),
            }
        }
    }));
}

/// This instance's `service.instance.id`: the host name and process id.
fn instance_id() -> String {
    let host = std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "wxgate".into());
    format!("{host}-{}", std::process::id())
}
