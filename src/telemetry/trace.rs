//! Traces (OpenTelemetry): a call's spans, continued from its caller's
//! W3C `traceparent`, exported in OTLP's protobuf messages
//! ([`export`]; docs/tracing.md).
//!
//! A traced call carries a [`Traced`]: its server span's context, and,
//! when sampled, a [`Recording`] its phases add finished child spans to
//! (the decision, a hold, the upstream exchange, a resend); the server
//! span itself is written when the call is answered, and the whole lot is
//! handed to the [`Tracer`]'s queue, bounded in spans and in bytes, every
//! value a caller can make long capped first. With tracing off no call
//! carries anything: the call path pays one `Option` test per phase.
//!
//! What a span may carry is chosen here and in `crate::proxy::spans`:
//! the rule, account, caller, outcome, status, WeChat's errcode, the
//! upstream's host; never a token, secret, caller key, body, query or
//! recipient.

pub mod attr;
pub mod export;

pub use attr::{kv, kv_bool, kv_int};

use std::sync::Arc;

use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::span::{Link, SpanKind};
use opentelemetry_proto::tonic::trace::v1::{status, Span, Status};
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};

use crate::time::Stopwatch;

/// A span's place in a trace: what a `traceparent` carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
}

impl SpanContext {
    /// A W3C `traceparent` value (version 00), or `None` when it is not
    /// one this version of the specification reads. Written out here
    /// rather than through the SDK's propagator: that one builds a
    /// `Context` (allocations, a `HashMap`) per call for 55 bytes of a
    /// fixed format.
    pub fn from_traceparent(value: &[u8]) -> Option<SpanContext> {
        // version "-" trace-id "-" parent-id "-" flags; a later version
        // may add fields after a further "-".
        if value.len() < 55 || (value.len() > 55 && value[55] != b'-') {
            return None;
        }
        let version = hex::<1>(&value[0..2])?;
        if version[0] == 0xff || (version[0] == 0 && value.len() != 55) {
            return None;
        }
        if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let trace_id = hex::<16>(&value[3..35])?;
        let span_id = hex::<8>(&value[36..52])?;
        let flags = hex::<1>(&value[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(SpanContext { trace_id, span_id, sampled: flags[0] & 1 == 1 })
    }

    /// Its `traceparent` (version 00).
    pub fn traceparent(&self) -> String {
        format!("00-{}-{}-{:02x}", hex_string(&self.trace_id), hex_string(&self.span_id), u8::from(self.sampled))
    }

    /// The trace id as logs and exemplars show it (32 lowercase hex digits).
    pub fn trace_hex(&self) -> String {
        hex_string(&self.trace_id)
    }
}

/// `N` bytes from `2 × N` lowercase hex digits (W3C: uppercase is invalid).
fn hex<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in text.chunks_exact(2).enumerate().take(N) {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

pub fn hex_string(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// Which calls are recorded: OpenTelemetry's trace-id-ratio rule (the
/// same trace id gives the same answer on every instance and every
/// service using it), and, `parent_based`, a caller's own choice.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    pub ratio: f64,
    pub parent_based: bool,
}

impl Sampling {
    /// Whether a trace with `trace_id` (and a caller's `parent`) is recorded.
    pub fn sampled(&self, trace_id: &[u8; 16], parent: Option<&SpanContext>) -> bool {
        if let (true, Some(parent)) = (self.parent_based, parent) {
            return parent.sampled;
        }
        if self.ratio >= 1.0 {
            return true;
        }
        // The specification's rule, as the SDK's TraceIdRatioBased: the
        // trace id's last 8 bytes, shifted right once, under ratio × 2^63.
        let mut low = [0u8; 8];
        low.copy_from_slice(&trace_id[8..]);
        let x = u64::from_be_bytes(low) >> 1;
        (x as f64) < self.ratio * (1u64 << 63) as f64
    }
}

/// The tracer of a running wxgate: its sampling, its ids, its cap on
/// values, its export queue.
pub struct Tracer {
    sampling: Sampling,
    ids: RandomIdGenerator,
    /// Most bytes of a span's name or string value ([`attr::cap`]).
    max_value: usize,
    queue: export::Queue,
    /// The queue's receiving end, until the exporter takes it.
    spans: std::sync::Mutex<Option<export::Spans>>,
}

impl Tracer {
    pub fn new(sampling: Sampling, max_value: usize, queue: export::Queue, spans: export::Spans) -> Arc<Tracer> {
        Arc::new(Tracer {
            sampling,
            ids: RandomIdGenerator::default(),
            max_value,
            queue,
            spans: std::sync::Mutex::new(Some(spans)),
        })
    }

    /// The queue's receiving end, for the one exporter (`None` once taken).
    pub fn take_spans(&self) -> Option<export::Spans> {
        self.spans.lock().ok().and_then(|mut s| s.take())
    }

    /// A new span id.
    pub fn span_id(&self) -> [u8; 8] {
        self.ids.new_span_id().to_bytes()
    }

    /// The trace of a call: a child of `parent` (its caller's span, or the
    /// call that made wxgate make this one), else a new trace; recording
    /// when sampled.
    pub fn start(&self, parent: Option<SpanContext>, tracestate: Option<String>) -> Traced {
        let trace_id = match &parent {
            Some(p) => p.trace_id,
            None => self.ids.new_trace_id().to_bytes(),
        };
        let sampled = self.sampling.sampled(&trace_id, parent.as_ref());
        self.begin(trace_id, parent.map(|p| p.span_id), sampled, tracestate)
    }

    /// A new trace linked to `link` (a queued delivery's send, linked to
    /// its submission): recorded when the link was, else as sampled.
    pub fn start_linked(&self, link: SpanContext) -> Traced {
        let trace_id = self.ids.new_trace_id().to_bytes();
        let sampled = link.sampled || self.sampling.sampled(&trace_id, None);
        let mut traced = self.begin(trace_id, None, sampled, None);
        if let Some(rec) = &mut traced.recording {
            rec.links.push(link);
        }
        traced
    }

    fn begin(&self, trace_id: [u8; 16], parent: Option<[u8; 8]>, sampled: bool, tracestate: Option<String>) -> Traced {
        let ctx = SpanContext { trace_id, span_id: self.span_id(), sampled };
        let recording = sampled.then(|| {
            Box::new(Recording {
                parent,
                tracestate,
                start_ns: crate::time::unix_nanos(),
                origin: Stopwatch::start(),
                spans: Vec::new(),
                links: Vec::new(),
            })
        });
        Traced { ctx, recording }
    }

    /// Hands a finished call's spans to the export queue, each capped
    /// ([`attr::cap`]: the only way in, so no queued span holds a value
    /// longer than the cap), dropped and counted when the queue is full:
    /// never waited for.
    pub fn finish(&self, mut spans: Vec<Span>) {
        for span in &mut spans {
            attr::cap(span, self.max_value);
        }
        self.queue.push(spans);
    }

    pub fn queue(&self) -> &export::Queue {
        &self.queue
    }
}

/// A traced call: its server span's context, and what is recorded of it
/// (`None`: not sampled).
pub struct Traced {
    pub ctx: SpanContext,
    pub recording: Option<Box<Recording>>,
}

/// The spans of a sampled call, as they finish.
pub struct Recording {
    /// The caller's span (`None`: the trace starts here).
    pub parent: Option<[u8; 8]>,
    pub tracestate: Option<String>,
    /// When the call arrived (Unix ns), and a monotonic clock from then.
    pub start_ns: u64,
    origin: Stopwatch,
    /// Finished child spans.
    pub spans: Vec<Span>,
    /// Spans this call's span links to (a queued delivery's submission).
    pub links: Vec<SpanContext>,
}

impl Recording {
    /// Now, in Unix ns on this call's clock (the arrival's wall time plus
    /// monotonic time since: spans of one call never run backwards).
    pub fn now_ns(&self) -> u64 {
        self.start_ns.saturating_add(u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }
}

impl Traced {
    /// Records a finished child span of the call's span (nothing when the
    /// call is not sampled).
    pub fn child(&mut self, tracer: &Tracer, data: SpanData<'_>) {
        let Some(rec) = &mut self.recording else { return };
        rec.spans.push(span(self.ctx.trace_id, tracer.span_id(), Some(self.ctx.span_id), data));
    }
}

/// A finished span's name, kind, times (Unix ns), attributes, and why it
/// failed (`None`: it did not).
pub struct SpanData<'a> {
    pub name: &'a str,
    pub kind: SpanKind,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attributes: Vec<KeyValue>,
    pub error: Option<String>,
}

impl SpanData<'_> {
    /// The end of a span that lasted `micros` from `start_ns`.
    pub fn end_after(start_ns: u64, micros: i64) -> u64 {
        start_ns.saturating_add(u64::try_from(micros).unwrap_or(0).saturating_mul(1000))
    }
}

/// One span in OTLP's message.
pub fn span(trace_id: [u8; 16], span_id: [u8; 8], parent: Option<[u8; 8]>, data: SpanData<'_>) -> Span {
    Span {
        trace_id: trace_id.to_vec(),
        span_id: span_id.to_vec(),
        parent_span_id: parent.map(|p| p.to_vec()).unwrap_or_default(),
        name: data.name.to_owned(),
        kind: data.kind as i32,
        start_time_unix_nano: data.start_ns,
        end_time_unix_nano: data.end_ns.max(data.start_ns),
        attributes: data.attributes,
        status: data.error.map(|message| Status { message, code: status::StatusCode::Error as i32 }),
        ..Default::default()
    }
}

/// A link to another trace's span (a queued delivery's submission).
pub fn link(to: &SpanContext) -> Link {
    Link { trace_id: to.trace_id.to_vec(), span_id: to.span_id.to_vec(), ..Default::default() }
}

pub use opentelemetry_proto::tonic::trace::v1::span::SpanKind as Kind;

tokio::task_local! {
    /// The span of the call whose task is running (a traced client call):
    /// a call wxgate makes itself for it (a token fetch) is its child.
    pub static CURRENT: SpanContext;
}

/// The span of the traced call this task runs, if any.
pub fn current() -> Option<SpanContext> {
    CURRENT.try_with(|c| *c).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_is_read_and_written_as_w3c_says() {
        let tp = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let ctx = SpanContext::from_traceparent(tp).expect("valid");
        assert!(ctx.sampled);
        assert_eq!(ctx.traceparent().as_bytes(), tp);
        assert_eq!(ctx.trace_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        for bad in [
            &b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"[..],
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            b"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(SpanContext::from_traceparent(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        // A later version's extra field is ignored.
        let later = b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what";
        assert_eq!(SpanContext::from_traceparent(later).map(|c| c.sampled), Some(false));
    }

    #[test]
    fn the_ratio_samples_its_share_of_trace_ids_and_a_parent_decides_when_followed() {
        let s = Sampling { ratio: 0.25, parent_based: true };
        let ids = RandomIdGenerator::default();
        let n = 20_000;
        let sampled = (0..n).filter(|_| s.sampled(&ids.new_trace_id().to_bytes(), None)).count();
        assert!((4_400..5_600).contains(&sampled), "{sampled} of {n}");
        let parent = SpanContext { trace_id: [1; 16], span_id: [1; 8], sampled: false };
        assert!(!Sampling { ratio: 1.0, parent_based: true }.sampled(&[1; 16], Some(&parent)));
        assert!(Sampling { ratio: 1.0, parent_based: false }.sampled(&[1; 16], Some(&parent)));
        assert!(!Sampling { ratio: 0.0, parent_based: false }.sampled(&[255; 16], None));
    }
}
