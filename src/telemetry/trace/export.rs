//! The export queue and its batches: finished spans wait in a bounded
//! queue ([`Queue`]); one task ([`run`]) takes up to [`BATCH`] of them at
//! a time, at most `batch_delay` after the first, encodes them as one
//! OTLP `ExportTraceServiceRequest` (protobuf) and hands the bytes to a
//! `post` function (`crate::ops::traces`: OTLP/HTTP over hyper).
//!
//! A collector that is down or slow costs counters, never memory or a
//! call's time: a full queue drops the spans pushed to it
//! (`wxgate_trace_spans_total{what="dropped"}`); an export that fails or
//! outlasts its timeout drops its batch (`what="failed"`); one export is
//! in flight at a time, so a slow collector fills the queue, not memory.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prometheus_client::metrics::counter::Counter;
use prost::Message as _;
use tokio::sync::mpsc;

/// Most spans in one export.
pub const BATCH: usize = 512;

/// What became of spans: exported, dropped (the queue was full) or
/// failed (their export did not succeed).
#[derive(Clone, Default)]
pub struct Counters {
    pub exported: Counter,
    pub dropped: Counter,
    pub failed: Counter,
}

/// The bounded queue of finished spans.
pub struct Queue {
    tx: mpsc::Sender<Span>,
    counters: Counters,
}

/// The receiving end, for [`run`].
pub struct Spans(mpsc::Receiver<Span>);

impl Queue {
    /// A queue of at most `max` spans.
    pub fn new(max: usize, counters: Counters) -> (Queue, Spans) {
        let (tx, rx) = mpsc::channel(max.max(1));
        (Queue { tx, counters }, Spans(rx))
    }

    /// Queues `spans`; those that do not fit are dropped and counted.
    pub fn push(&self, spans: Vec<Span>) {
        for span in spans {
            if self.tx.try_send(span).is_err() {
                self.counters.dropped.inc();
            }
        }
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }
}

/// The resource the spans are from.
pub struct Source {
    pub service_name: String,
    pub service_instance: String,
}

/// Exports what the queue receives until every sender is gone: a batch
/// of up to [`BATCH`] spans, sent `batch_delay` after its first span at
/// most, each export given `timeout`. `post` sends one encoded request and
/// says whether the collector took it.
pub async fn run<F, Fut>(
    mut spans: Spans,
    source: Source,
    counters: Counters,
    batch_delay: Duration,
    timeout: Duration,
    post: F,
) where
    F: Fn(bytes::Bytes) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let resource = Arc::new(resource(&source));
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        if spans.0.recv_many(&mut batch, BATCH).await == 0 {
            return;
        }
        let by = crate::time::deadline_after(batch_delay);
        while batch.len() < BATCH {
            let room = BATCH - batch.len();
            match tokio::time::timeout_at(by, spans.0.recv_many(&mut batch, room)).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let n = batch.len() as u64;
        let body = encode(&resource, std::mem::take(&mut batch));
        match tokio::time::timeout(timeout, post(body)).await {
            Ok(Ok(())) => {
                counters.exported.inc_by(n);
            }
            Ok(Err(e)) => {
                counters.failed.inc_by(n);
                tracing::debug!(spans = n, error = %e, "trace export failed: its spans are dropped");
            }
            Err(_) => {
                counters.failed.inc_by(n);
                tracing::debug!(spans = n, ?timeout, "trace export timed out: its spans are dropped");
            }
        }
    }
}

fn resource(source: &Source) -> Resource {
    Resource {
        attributes: vec![
            super::attr::kv("service.name", source.service_name.clone()),
            super::attr::kv("service.instance.id", source.service_instance.clone()),
            super::attr::kv("service.version", env!("CARGO_PKG_VERSION")),
            super::attr::kv("telemetry.sdk.name", "wxgate"),
            super::attr::kv("telemetry.sdk.language", "rust"),
        ],
        ..Default::default()
    }
}

/// One OTLP request of `spans`, encoded.
pub fn encode(resource: &Resource, spans: Vec<Span>) -> bytes::Bytes {
    let request = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource.clone()),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "wxgate".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    bytes::Bytes::from(request.encode_to_vec())
}
