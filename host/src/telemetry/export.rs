//! The queue between requests and the OTLP exporter, and the task that
//! drains it.
//!
//! A request hands its finished [`Trace`] over with `try_send`: a full queue
//! (the backend slow or gone) drops it at once and counts its spans, so a
//! request never waits for tracing. One task gathers what is queued into
//! batches (up to [`BATCH_SPANS`], or what arrived within [`BATCH_WAIT`]),
//! converts them to the SDK's `SpanData` and exports them one batch at a
//! time; a batch the exporter could not deliver within the timeout is
//! counted as lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::trace::{SpanContext, SpanId, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter, SpanLinks};
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use super::{Protocol, Settings, Span, Trace};
use crate::metrics::Metrics;

/// Most spans in one export.
pub const BATCH_SPANS: usize = 512;
/// How long the task gathers traces after the first before it exports.
pub const BATCH_WAIT: Duration = Duration::from_millis(200);

enum Msg {
    Trace(Trace),
    /// Export what came before, then stop and say so.
    Close(oneshot::Sender<()>),
}

/// The sending side, held by [`super::Telemetry`].
pub struct Queue {
    tx: mpsc::Sender<Msg>,
    metrics: Arc<Metrics>,
    closed: Mutex<bool>,
    /// Spans queued and not yet taken into a batch: what a shutdown that
    /// runs out of time loses, counted.
    pending: Arc<AtomicU64>,
}

impl Queue {
    /// Builds the exporter `settings` describe and starts its task.
    pub fn start(settings: &Settings, metrics: Arc<Metrics>) -> anyhow::Result<Queue> {
        let mut exporter = exporter(settings)?;
        exporter.set_resource(&resource(settings));
        let (tx, rx) = mpsc::channel(settings.queue_max.max(1));
        let pending = Arc::new(AtomicU64::new(0));
        let drained = Drain { exporter, metrics: metrics.clone(), timeout: settings.timeout, pending: pending.clone() };
        tokio::spawn(drained.run(rx));
        Ok(Queue { tx, metrics, closed: Mutex::new(false), pending })
    }

    /// Queues `trace`, or drops and counts it.
    pub fn send(&self, trace: Trace) {
        let n = trace.spans.len() as u64;
        self.pending.fetch_add(n, Ordering::Relaxed);
        if self.tx.try_send(Msg::Trace(trace)).is_err() {
            self.pending.fetch_sub(n, Ordering::Relaxed);
            self.metrics.trace_spans("dropped_queue_full", n);
        }
    }

    /// Exports what is queued and stops the task, all within `within`; what
    /// is still queued then is counted as lost.
    pub async fn close(&self, within: Duration) {
        if std::mem::replace(&mut *self.closed.lock(), true) {
            return;
        }
        let (done, wait) = oneshot::channel();
        let closed = tokio::time::timeout(within, async {
            if self.tx.send(Msg::Close(done)).await.is_ok() {
                let _ = wait.await;
            }
        })
        .await;
        if closed.is_err() {
            let lost = self.pending.swap(0, Ordering::Relaxed);
            self.metrics.trace_spans("dropped_export_failed", lost);
            tracing::warn!(spans = lost, "traces still queued at shutdown were not exported in time");
        }
    }
}

/// The OTLP exporter for `settings`' protocol, endpoint and headers.
fn exporter(settings: &Settings) -> anyhow::Result<opentelemetry_otlp::SpanExporter> {
    let built = match settings.protocol {
        Protocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(&settings.endpoint)
            .with_timeout(settings.timeout)
            .with_headers(settings.headers.iter().cloned().collect())
            .build(),
        Protocol::Grpc => {
            let mut headers = http::HeaderMap::new();
            for (k, v) in &settings.headers {
                let name = http::HeaderName::from_bytes(k.as_bytes())
                    .map_err(|_| anyhow::anyhow!("telemetry.headers: `{k}` is not a header name"))?;
                let value = http::HeaderValue::from_str(v)
                    .map_err(|_| anyhow::anyhow!("telemetry.headers: the value of `{k}` is not a header value"))?;
                headers.insert(name, value);
            }
            let metadata = opentelemetry_otlp::tonic_types::metadata::MetadataMap::from_headers(headers);
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(&settings.endpoint)
                .with_timeout(settings.timeout)
                .with_metadata(metadata)
                .build()
        }
    };
    built.map_err(|e| anyhow::anyhow!("telemetry.endpoint: cannot build the OTLP exporter: {e}"))
}

/// `service.name`, poolgate's version and the operator's attributes.
fn resource(settings: &Settings) -> Resource {
    let mut attributes = vec![
        KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        KeyValue::new("telemetry.sdk.name", "poolgate"),
    ];
    attributes.extend(settings.resource.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())));
    Resource::builder_empty().with_service_name(settings.service_name.clone()).with_attributes(attributes).build()
}

/// The task's side: the exporter and what it counts.
struct Drain {
    exporter: opentelemetry_otlp::SpanExporter,
    metrics: Arc<Metrics>,
    timeout: Duration,
    pending: Arc<AtomicU64>,
}

impl Drain {
    async fn run(self, mut rx: mpsc::Receiver<Msg>) {
        let scope = InstrumentationScope::builder("poolgate").with_version(env!("CARGO_PKG_VERSION")).build();
        let mut closing = None;
        while closing.is_none() {
            let Some(first) = rx.recv().await else { break };
            let mut batch = Vec::new();
            closing = self.take(first, &mut batch, &scope);
            let gather = tokio::time::sleep(BATCH_WAIT);
            tokio::pin!(gather);
            while batch.len() < BATCH_SPANS && closing.is_none() {
                tokio::select! {
                    m = rx.recv() => match m {
                        Some(m) => closing = self.take(m, &mut batch, &scope),
                        None => break,
                    },
                    () = &mut gather => break,
                }
            }
            self.export(batch).await;
        }
        let _ = self.exporter.shutdown_with_timeout(self.timeout);
        if let Some(done) = closing {
            let _ = done.send(());
        }
    }

    /// Adds a queued trace to `batch`; a close hands back whom to tell.
    fn take(&self, m: Msg, batch: &mut Vec<SpanData>, scope: &InstrumentationScope) -> Option<oneshot::Sender<()>> {
        match m {
            Msg::Trace(t) => {
                self.pending.fetch_sub(t.spans.len() as u64, Ordering::Relaxed);
                batch.extend(span_data(t, scope));
                None
            }
            Msg::Close(done) => Some(done),
        }
    }

    async fn export(&self, batch: Vec<SpanData>) {
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        match tokio::time::timeout(self.timeout, self.exporter.export(batch)).await {
            Ok(Ok(())) => self.metrics.trace_spans("exported", n),
            failed => {
                self.metrics.trace_spans("dropped_export_failed", n);
                let why = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {} ms", self.timeout.as_millis()),
                };
                tracing::warn!(spans = n, error = %why, "could not export spans to the OTLP endpoint; they are dropped");
            }
        }
    }
}

/// The SDK's form of a trace's spans.
fn span_data(trace: Trace, scope: &InstrumentationScope) -> Vec<SpanData> {
    let ids = &trace.ids;
    let state = ids.tracestate.as_deref().and_then(|s| s.parse::<TraceState>().ok()).unwrap_or_default();
    let trace_id = TraceId::from_bytes(ids.trace_id);
    trace
        .spans
        .into_iter()
        .map(|s: Span| {
            let (parent, remote) = match (s.parent, ids.remote_parent) {
                (Some(p), _) => (SpanId::from_bytes(p), false),
                (None, Some(p)) => (SpanId::from_bytes(p), true),
                (None, None) => (SpanId::INVALID, false),
            };
            let mut events = SpanEvents::default();
            events.events =
                s.events.into_iter().map(|e| opentelemetry::trace::Event::new(e.name, e.at, e.attributes, 0)).collect();
            SpanData {
                span_context: SpanContext::new(
                    trace_id,
                    SpanId::from_bytes(s.id),
                    TraceFlags::SAMPLED,
                    false,
                    state.clone(),
                ),
                parent_span_id: parent,
                parent_span_is_remote: remote,
                span_kind: s.kind,
                name: s.name,
                start_time: s.start,
                end_time: s.end,
                attributes: s.attributes,
                dropped_attributes_count: 0,
                events,
                links: SpanLinks::default(),
                status: match s.error {
                    Some(why) => Status::error(why),
                    None => Status::Unset,
                },
                instrumentation_scope: scope.clone(),
            }
        })
        .collect()
}
