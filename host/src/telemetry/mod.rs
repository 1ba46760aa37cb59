//! Traces to an OpenTelemetry backend: one trace per request, sent over OTLP.
//!
//! Why spans are built after the fact: a request's record already holds
//! everything a trace shows — each ranking's stages with their order, reason,
//! time and fault, each upstream attempt with its account, status and time to
//! first byte. So nothing traces *during* the request: no context carried
//! through the phases, no span objects alive across awaits, no SDK tracer.
//! When the request ends ([`crate::gateway::request::finish`]), its record
//! becomes a [`Trace`] of plain [`Span`]s and goes on a bounded queue; one
//! task batches the queue into the OTLP exporter. A gateway without
//! `[telemetry]` has no [`Telemetry`] at all, and a request pays one `None`
//! check.
//!
//! What can be lost is counted, never silent: a trace that finds the queue
//! full (the backend slow or gone) and a batch the exporter could not deliver
//! are counted in `poolgate_trace_spans_total{outcome}`; requests never wait
//! for either.
//!
//! Ids: a trace id is the caller's (W3C `traceparent`, [`w3c`]) or drawn from
//! a per-process random seed and the request id; span ids are derived from the
//! same, so the span an upstream attempt will have is known before it is sent
//! (what `propagate_upstream` passes on) and no random source is read per
//! request.

pub mod export;
pub mod w3c;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub use opentelemetry::KeyValue;
pub use opentelemetry::trace::SpanKind;
use serde::{Serialize, Serializer};

use crate::metrics::Metrics;
use crate::random::splitmix;

/// How spans are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP over HTTP, protobuf bodies (`http/protobuf`, port 4318).
    HttpProtobuf,
    /// OTLP over gRPC (`grpc`, port 4317).
    Grpc,
}

/// Which requests are traced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampler {
    /// A request whose caller sent a `traceparent` follows the caller's
    /// `sampled` flag.
    pub parent_based: bool,
    /// The share of the other requests traced, by trace id (0 to 1).
    pub ratio: f64,
}

/// Everything `[telemetry]` and the `OTEL_*` environment say, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Where spans go: for HTTP the full URL (`…/v1/traces`), for gRPC the
    /// collector's address.
    pub endpoint: String,
    /// How.
    pub protocol: Protocol,
    /// Headers on every export (a backend's API key: never logged).
    pub headers: Vec<(String, String)>,
    /// `service.name`.
    pub service_name: String,
    /// Other resource attributes (`deployment.environment`, …).
    pub resource: Vec<(String, String)>,
    /// Which requests are traced.
    pub sampler: Sampler,
    /// Whether upstream requests carry `traceparent` (the attempt's span)
    /// and the caller's `tracestate`.
    pub propagate_upstream: bool,
    /// Most traces waiting for the exporter; beyond it they are dropped and
    /// counted.
    pub queue_max: usize,
    /// Longest one export may take before its batch counts as lost.
    pub timeout: Duration,
    /// What was ignored in the environment, to log when tracing starts.
    pub notes: Vec<String>,
}

/// A traced request's ids.
#[derive(Debug, Clone)]
pub struct TraceIds {
    /// The trace: the caller's, or new.
    pub trace_id: [u8; 16],
    /// The caller's span, when the trace is the caller's.
    pub remote_parent: Option<[u8; 8]>,
    /// The caller's `tracestate`, kept on every span and passed on.
    pub tracestate: Option<String>,
    /// Whether spans are recorded and sent (a caller's unsampled trace is
    /// still passed on upstream, unrecorded).
    pub sampled: bool,
    base: u64,
}

impl TraceIds {
    /// The id of the request's span number `k` (0: the server span); never
    /// zero, distinct for distinct `k`.
    pub fn span_id(&self, k: u32) -> [u8; 8] {
        let id = splitmix(self.base.wrapping_add(u64::from(k)));
        (if id == 0 { 1 } else { id }).to_be_bytes()
    }

    /// The trace id, hex.
    pub fn trace_hex(&self) -> String {
        hex::encode(self.trace_id)
    }
}

impl Serialize for TraceIds {
    /// A decision record names its trace by id, so a record and a trace can
    /// be found from each other.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.trace_hex())
    }
}

/// One span of a request's trace.
#[derive(Debug, Clone)]
pub struct Span {
    /// Its id ([`TraceIds::span_id`]).
    pub id: [u8; 8],
    /// Its parent in this trace; `None` for the request's own span, whose
    /// parent is the caller's span (if any).
    pub parent: Option<[u8; 8]>,
    /// Its name.
    pub name: Cow<'static, str>,
    /// Server, client or internal.
    pub kind: SpanKind,
    /// When it began.
    pub start: SystemTime,
    /// When it ended.
    pub end: SystemTime,
    /// Its attributes.
    pub attributes: Vec<KeyValue>,
    /// What happened during it.
    pub events: Vec<Event>,
    /// Set when it failed: why.
    pub error: Option<String>,
}

/// Something that happened during a span.
#[derive(Debug, Clone)]
pub struct Event {
    /// Its name.
    pub name: Cow<'static, str>,
    /// When.
    pub at: SystemTime,
    /// Its attributes.
    pub attributes: Vec<KeyValue>,
}

/// A request's spans, ready to send.
#[derive(Debug, Clone)]
pub struct Trace {
    /// Its ids.
    pub ids: TraceIds,
    /// Its spans, the request's own first.
    pub spans: Vec<Span>,
}

/// The tracing of a running gateway: the ids and sampling, the queue.
pub struct Telemetry {
    ids: Ids,
    queue: export::Queue,
}

impl Telemetry {
    /// Starts the exporter task (on the running tokio runtime).
    pub fn start(settings: Settings, metrics: Arc<Metrics>) -> anyhow::Result<Arc<Telemetry>> {
        let seed_hex = crate::random::random_hex(16)?;
        let seed_of = |r: std::ops::Range<usize>| u64::from_str_radix(&seed_hex[r], 16).unwrap_or(0);
        let ids = Ids::new([seed_of(0..16), seed_of(16..32)], &settings);
        let queue = export::Queue::start(&settings, metrics)?;
        Ok(Arc::new(Telemetry { ids, queue }))
    }

    /// The ids of request `request` ([`Ids::begin`]).
    pub fn begin(&self, request: u64, traceparent: Option<&str>, tracestate: Option<&str>) -> Option<TraceIds> {
        self.ids.begin(request, traceparent, tracestate)
    }

    /// Queues `trace` for the exporter; a full queue drops it, counted.
    pub fn send(&self, trace: Trace) {
        self.queue.send(trace);
    }

    /// The `traceparent` (and `tracestate`) an upstream attempt whose span
    /// is `span` carries ([`Ids::upstream`]).
    pub fn upstream_headers<'a>(&self, ids: &'a TraceIds, span: [u8; 8]) -> Option<(String, Option<&'a str>)> {
        self.ids.upstream(ids, span)
    }

    /// Sends what is queued and stops the exporter, waiting at most
    /// `within` (at shutdown, after the last request).
    pub async fn close(&self, within: Duration) {
        self.queue.close(within).await;
    }
}

/// Trace and span ids, and which requests are traced: a pure function of a
/// seed, the request id and the caller's headers.
#[derive(Debug, Clone)]
pub struct Ids {
    seed: [u64; 2],
    sampler: Sampler,
    propagate: bool,
}

impl Ids {
    /// Ids from `seed` (random per process) under `settings`' sampler.
    pub fn new(seed: [u64; 2], settings: &Settings) -> Ids {
        Ids { seed, sampler: settings.sampler, propagate: settings.propagate_upstream }
    }

    /// The ids of request `request`, from the caller's `traceparent` and
    /// `tracestate` when they parse; `None` when the request is not traced
    /// and there is no caller's trace to pass on.
    pub fn begin(&self, request: u64, traceparent: Option<&str>, tracestate: Option<&str>) -> Option<TraceIds> {
        let base = splitmix(self.seed[0] ^ splitmix(request));
        match traceparent.and_then(w3c::parse_traceparent) {
            Some(p) => {
                let sampled = if self.sampler.parent_based { p.sampled } else { self.by_ratio(&p.trace_id) };
                if !sampled && !self.propagate {
                    return None;
                }
                // What is kept on the spans is what goes upstream: a state the
                // OpenTelemetry model reads, else none.
                let tracestate = tracestate
                    .and_then(w3c::clean_tracestate)
                    .filter(|s| s.parse::<opentelemetry::trace::TraceState>().is_ok());
                Some(TraceIds { trace_id: p.trace_id, remote_parent: Some(p.span_id), tracestate, sampled, base })
            }
            None => {
                let hi = splitmix(self.seed[1] ^ request);
                let lo = splitmix(hi ^ self.seed[0]);
                let mut trace_id = [0u8; 16];
                trace_id[..8].copy_from_slice(&hi.to_be_bytes());
                trace_id[8..].copy_from_slice(&lo.to_be_bytes());
                let sampled = self.by_ratio(&trace_id);
                sampled.then_some(TraceIds { trace_id, remote_parent: None, tracestate: None, sampled, base })
            }
        }
    }

    /// The ratio sampler: the trace id's low 8 bytes against the ratio, so
    /// every replica (and a caller sampling the same way) agrees.
    fn by_ratio(&self, trace_id: &[u8; 16]) -> bool {
        let ratio = self.sampler.ratio;
        if ratio >= 1.0 {
            return true;
        }
        let mut low = [0u8; 8];
        low.copy_from_slice(&trace_id[8..]);
        (u64::from_be_bytes(low) >> 11) < (ratio * (1u64 << 53) as f64) as u64
    }

    /// The `traceparent` (and `tracestate`) an upstream attempt carries when
    /// `propagate_upstream` is on: the attempt's span `span` as the parent;
    /// for a caller's trace this gateway does not record, the caller's span.
    pub fn upstream<'a>(&self, ids: &'a TraceIds, span: [u8; 8]) -> Option<(String, Option<&'a str>)> {
        if !self.propagate {
            return None;
        }
        let parent = match (ids.sampled, ids.remote_parent) {
            (false, Some(p)) => p,
            _ => span,
        };
        Some((w3c::traceparent(&ids.trace_id, &parent, ids.sampled), ids.tracestate.as_deref()))
    }
}

#[cfg(test)]
mod tests;
