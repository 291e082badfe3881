//! The export queue and its batches: finished spans wait in a bounded
//! queue ([`Queue`]); one task ([`run`]) takes up to [`BATCH`] of them at
//! a time, at most `batch_delay` after the first, encodes them as one
//! OTLP `ExportTraceServiceRequest` (protobuf) and hands the bytes to a
//! `post` function (`crate::ops::trace_export`: OTLP/HTTP over hyper).
//!
//! A collector that is down or slow costs counters, never memory or a
//! call's time: a full queue drops the spans pushed to it
//! (`wxgate_trace_spans_total{what="dropped"}`); an export that fails or
//! outlasts its timeout drops its batch (`what="failed"`); one export is
//! in flight at a time, so a slow collector fills the queue, not memory.
//!
//! The queue is full at `max_queued` spans, or when a span would take the
//! bytes held past `max_queued_bytes` ([`super::attr::held_bytes`]: an
//! estimate of each span's memory). The bytes held are those of the spans
//! queued and of the batch being exported, until its export ends
//! (`wxgate_trace_queued_bytes`): so everything tracing keeps for a
//! collector is within the bound, whatever the spans carry.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prost::Message as _;
use tokio::sync::mpsc;

/// Most spans in one export.
pub const BATCH: usize = 512;

/// What became of spans: exported, dropped (the queue was full) or
/// failed (their export did not succeed); and the bytes held for export.
#[derive(Clone, Default)]
pub struct Counters {
    pub exported: Counter,
    pub dropped: Counter,
    pub failed: Counter,
    /// Bytes of the spans queued and of the batch being exported: never
    /// more than the queue's `max_bytes`.
    pub queued_bytes: Gauge,
}

/// A queued span and the bytes it is counted for.
struct Queued {
    span: Span,
    bytes: i64,
}

/// The bounded queue of finished spans.
pub struct Queue {
    tx: mpsc::Sender<Queued>,
    max_bytes: i64,
    counters: Counters,
}

/// The receiving end, for [`run`].
pub struct Spans(mpsc::Receiver<Queued>);

impl Queue {
    /// A queue of at most `max` spans and `max_bytes` bytes.
    pub fn new(max: usize, max_bytes: usize, counters: Counters) -> (Queue, Spans) {
        let (tx, rx) = mpsc::channel(max.max(1));
        let max_bytes = i64::try_from(max_bytes).unwrap_or(i64::MAX);
        (Queue { tx, max_bytes, counters }, Spans(rx))
    }

    /// Queues `spans`; those that do not fit, in number or in bytes, are
    /// dropped and counted.
    pub fn push(&self, spans: Vec<Span>) {
        for span in spans {
            let bytes = i64::try_from(super::attr::held_bytes(&span)).unwrap_or(i64::MAX);
            if !self.reserve(bytes) {
                self.counters.dropped.inc();
                continue;
            }
            if self.tx.try_send(Queued { span, bytes }).is_err() {
                self.counters.queued_bytes.dec_by(bytes);
                self.counters.dropped.inc();
            }
        }
    }

    /// Counts `bytes` as held, unless that would pass `max_bytes`: one
    /// atomic step, so pushes racing each other never pass it together.
    fn reserve(&self, bytes: i64) -> bool {
        let held = self.counters.queued_bytes.inner();
        held.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
            now.checked_add(bytes).filter(|&then| then <= self.max_bytes)
        })
        .is_ok()
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
/// says whether the collector took it (why not, logged).
pub async fn run<F, Fut, E>(
    mut spans: Spans,
    source: Source,
    counters: Counters,
    batch_delay: Duration,
    timeout: Duration,
    post: F,
) where
    F: Fn(bytes::Bytes) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
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
        // Still held until the export ends, whatever its outcome.
        let bytes: i64 = batch.iter().map(|q| q.bytes).sum();
        let body = encode(&resource, batch.drain(..).map(|q| q.span).collect());
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
        // Released once the batch is counted: at 0, every span is.
        counters.queued_bytes.dec_by(bytes);
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
