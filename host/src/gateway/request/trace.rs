//! A request's trace, built from its record when it ends
//! ([`super::finish`]): the request's server span; under it, for each
//! attempt, a span of the chain's ranking (with a span per stage: plugin,
//! hash, order out, reason, fault, breaker) and a client span of the upstream
//! call (account, status, time to first byte, why it failed over), with what
//! its answer said of the quota as events.
//!
//! Times are placed from the record: an attempt's ranking begins at its
//! `at_us`, its stages follow one another for their measured time, the
//! admission wait follows the chain, and the upstream call follows the wait.
//! The serving attempt's span ends with the request (its answer streamed
//! until then); `poolgate.upstream.ttfb_ms` is its time to the response
//! headers.
//!
//! Attribute names follow OpenTelemetry's HTTP and GenAI semantic
//! conventions where one exists (`http.*`, `gen_ai.*`); poolgate's own are
//! under `poolgate.*`.

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::{Array, StringValue, Value};

use super::record::{Attempt, AttemptOutcome, Ending, RequestRecord};
use crate::gateway::generation::Generation;
use crate::policy::decision::StageRecord;
use crate::telemetry::{Event, KeyValue, Span, SpanKind, Trace, TraceIds};

/// Span numbers an attempt may use: its chain span, its stages, its upstream.
const PER_ATTEMPT: u32 = 64;

/// The span number of attempt `n`'s upstream call (known before it is sent,
/// for `traceparent`).
pub fn upstream_span(n: u32) -> u32 {
    n * PER_ATTEMPT + PER_ATTEMPT - 1
}

fn chain_span(n: u32) -> u32 {
    n * PER_ATTEMPT + 1
}

/// Stage spans a ranking may have: the ids between its chain span and its
/// upstream span. A longer chain's later stages are counted on the ranking
/// (`poolgate.stages_untraced`), not given spans.
const STAGES_MAX: usize = (PER_ATTEMPT - 2) as usize;

fn stage_span(n: u32, stage: usize) -> u32 {
    chain_span(n) + 1 + stage as u32
}

fn kv(k: &'static str, v: impl Into<Value>) -> KeyValue {
    KeyValue::new(k, v)
}

/// The most of a client-given string an attribute carries: a model name,
/// a session id or a path may be as long as the body or the head allows,
/// and every queued trace holds its spans until they are exported.
const TEXT_MAX: usize = 256;

fn clip(s: &str) -> String {
    match s.char_indices().nth(TEXT_MAX) {
        Some((at, _)) => s[..at].to_string(),
        None => s.to_string(),
    }
}

/// The route a request took, as a template (`/v1/models/{id}`): a span's
/// name and `http.route` stay few whatever paths clients send.
fn route(api: &str, path: &str) -> &'static str {
    match api {
        "messages" => "/v1/messages",
        "count_tokens" => "/v1/messages/count_tokens",
        "chat_completions" => "/v1/chat/completions",
        _ if path.trim_end_matches('/') == "/v1/models" => "/v1/models",
        _ => "/v1/models/{id}",
    }
}

fn strings(items: Vec<String>) -> Value {
    Value::Array(Array::String(items.into_iter().map(StringValue::from).collect()))
}

fn after(start: SystemTime, us: f64) -> SystemTime {
    start + Duration::from_nanos((us.max(0.0) * 1_000.0) as u64)
}

/// The trace of the request `record` describes, which took `took`.
pub fn trace(record: &RequestRecord, ids: &TraceIds, took: Duration, generation: &Generation, now_ms: u64) -> Trace {
    let start = UNIX_EPOCH + Duration::from_millis(record.at_ms);
    let end = start + took;
    let root = ids.span_id(0);
    let mut spans = vec![server_span(record, root, start, end)];
    for a in &record.attempts {
        let chain_start = after(start, a.at_us as f64);
        spans.push(chain(a, ids, root, chain_start));
        spans.extend(stages(a, ids, chain_start, generation, now_ms));
        if a.account.is_some() {
            let sent = after(chain_start, a.decision.duration_us + a.queued_ms as f64 * 1_000.0);
            spans.push(upstream(a, ids, root, sent, end));
        }
    }
    Trace { ids: ids.clone(), spans }
}

fn server_span(r: &RequestRecord, id: [u8; 8], start: SystemTime, end: SystemTime) -> Span {
    let route = route(r.api, &r.path);
    let mut at = vec![
        kv("http.request.method", r.method.clone()),
        kv("http.route", route),
        kv("url.path", clip(&r.path)),
        kv("http.response.status_code", i64::from(r.status)),
        kv("poolgate.request_id", r.id as i64),
        kv("poolgate.api", r.api),
        kv("poolgate.outcome", r.outcome.as_str()),
        kv("poolgate.reason", clip(&r.reason)),
        kv("poolgate.attempts", r.attempts.len() as i64),
        kv("poolgate.fallback", r.fallback.is_some()),
        kv("poolgate.stream", r.stream),
        kv("gen_ai.provider.name", "anthropic"),
        kv("gen_ai.system", "anthropic"),
        kv("gen_ai.operation.name", if matches!(r.api, "messages" | "chat_completions") { "chat" } else { r.api }),
    ];
    let optional = [
        ("poolgate.client_key", r.client.clone()),
        ("poolgate.account", r.account.clone()),
        ("poolgate.fallback.backend", r.fallback.clone()),
        ("session.id", r.session.as_deref().map(clip)),
        ("gen_ai.request.model", Some(clip(&r.model)).filter(|m| !m.is_empty())),
        // The answer's own word; for a substitute, the model it was sent to.
        (
            "gen_ai.response.model",
            r.response_model
                .clone()
                .or_else(|| r.fallback.as_deref().and_then(|f| f.split_once('/')).map(|(_, m)| m.into())),
        ),
    ];
    at.extend(optional.into_iter().filter_map(|(k, v)| v.map(|v| kv(k, v))));
    if let Some(u) = &r.usage {
        at.extend([
            kv("gen_ai.usage.input_tokens", u.input_tokens as i64),
            kv("gen_ai.usage.output_tokens", u.output_tokens as i64),
            kv("gen_ai.usage.cache_read.input_tokens", u.cache_read_input_tokens as i64),
            kv("gen_ai.usage.cache_creation.input_tokens", u.cache_creation_input_tokens as i64),
            kv("poolgate.usage.estimated", r.usage_estimated),
        ]);
    }
    // A client's mistake (4xx) is not the gateway's failure; a local 429
    // from a parked pool is the pool's state, said in `poolgate.outcome`.
    let failed = r.status >= 500
        || matches!(r.outcome, Ending::StreamError | Ending::Shutdown | Ending::UpstreamFailed | Ending::AuthRefused);
    Span {
        id,
        parent: None,
        name: Cow::Owned(format!("{} {route}", r.method)),
        kind: SpanKind::Server,
        start,
        end,
        attributes: at,
        events: Vec::new(),
        error: failed.then(|| r.outcome.as_str().to_string()),
    }
}

fn chain(a: &Attempt, ids: &TraceIds, root: [u8; 8], start: SystemTime) -> Span {
    let d = &a.decision;
    let mut attributes = vec![
        kv("poolgate.attempt", i64::from(a.attempt)),
        kv("poolgate.reason", clip(&d.reason)),
        kv("poolgate.order", strings(d.order.ids())),
        kv("poolgate.policy_errors", d.policy_errors.len() as i64),
        kv("poolgate.attempt.outcome", outcome(a.outcome)),
    ];
    if let Some(detail) = &d.detail {
        attributes.push(kv("poolgate.detail", clip(detail)));
    }
    if d.stages.len() > STAGES_MAX {
        attributes.push(kv("poolgate.stages_untraced", (d.stages.len() - STAGES_MAX) as i64));
    }
    Span {
        id: ids.span_id(chain_span(a.attempt)),
        parent: Some(root),
        name: Cow::Borrowed("poolgate.chain"),
        kind: SpanKind::Internal,
        start,
        end: after(start, d.duration_us),
        attributes,
        events: Vec::new(),
        error: None,
    }
}

fn stages(a: &Attempt, ids: &TraceIds, mut at: SystemTime, g: &Generation, now_ms: u64) -> Vec<Span> {
    let parent = ids.span_id(chain_span(a.attempt));
    let mut out = Vec::with_capacity(a.decision.stages.len());
    for (j, s) in a.decision.stages.iter().enumerate().take(STAGES_MAX) {
        let end = after(at, s.duration_us);
        out.push(stage(s, ids.span_id(stage_span(a.attempt, j)), parent, (at, end), g, now_ms));
        at = end;
    }
    out
}

fn stage(
    s: &StageRecord,
    id: [u8; 8],
    parent: [u8; 8],
    (start, end): (SystemTime, SystemTime),
    g: &Generation,
    now_ms: u64,
) -> Span {
    let (plugin, sha, breaker) = g.chain.stage_facts(&s.stage, now_ms).unwrap_or(("", "", "closed"));
    let mut attributes = vec![
        kv("poolgate.stage", s.stage.clone()),
        kv("poolgate.plugin", plugin.to_string()),
        kv("poolgate.plugin.sha256", sha.to_string()),
        kv("poolgate.stage.reason", clip(&s.reason)),
        kv("poolgate.stage.order", strings(s.order.ids())),
        kv("poolgate.stage.duration_us", s.duration_us),
        kv("poolgate.stage.breaker", s.bypassed.as_ref().map_or(breaker, |b| b.state)),
        kv("poolgate.stage.safety_valve", s.safety_valve),
    ];
    if let Some(d) = &s.detail {
        attributes.push(kv("poolgate.stage.detail", clip(d)));
    }
    let mut events = Vec::new();
    let fault = s.error.as_ref().map(|f| (f.cause.as_str(), f.message.clone()));
    let fault = fault.or_else(|| s.bypassed.as_ref().map(|_| ("bypassed", "the stage's breaker is open".to_string())));
    if let Some((cause, message)) = &fault {
        attributes.push(kv("poolgate.stage.fault_cause", *cause));
        events.push(Event {
            name: Cow::Borrowed("poolgate.policy_error"),
            at: start,
            attributes: vec![kv("poolgate.fault_cause", *cause), kv("exception.message", clip(message))],
        });
    }
    Span {
        id,
        parent: Some(parent),
        name: Cow::Owned(format!("poolgate.stage {}", s.stage)),
        kind: SpanKind::Internal,
        start,
        end,
        attributes,
        events,
        error: fault.map(|(cause, _)| format!("routing_policy_error: {cause}")),
    }
}

fn upstream(a: &Attempt, ids: &TraceIds, root: [u8; 8], start: SystemTime, request_end: SystemTime) -> Span {
    let ttfb = a.upstream_ms.unwrap_or(0);
    let end = match a.outcome {
        AttemptOutcome::Served => request_end.max(start),
        _ => start + Duration::from_millis(ttfb),
    };
    let mut attributes = vec![
        kv("poolgate.attempt", i64::from(a.attempt)),
        kv("poolgate.account", a.account.clone().unwrap_or_default()),
        kv("poolgate.attempt.outcome", outcome(a.outcome)),
        kv("poolgate.upstream.ttfb_ms", ttfb as i64),
        kv("poolgate.queued_ms", a.queued_ms as i64),
    ];
    if let Some(s) = a.status {
        attributes.push(kv("http.response.status_code", i64::from(s)));
    }
    let cause = match (a.outcome, a.status) {
        (AttemptOutcome::Served, _) => None,
        (_, Some(s)) => Some(format!("status_{s}")),
        (_, None) => Some(a.failure.as_deref().map_or_else(|| "no_answer".into(), clip)),
    };
    if let Some(c) = &cause {
        attributes.push(kv("poolgate.failover_cause", c.clone()));
        attributes.push(kv("error.type", a.status.map_or("connect_error".to_string(), |s| s.to_string())));
    }
    let answered = start + Duration::from_millis(ttfb);
    let events =
        a.reading.iter().filter(|r| r.status.is_some() || !r.windows.is_empty()).map(|r| quota_event(r, answered));
    Span {
        id: ids.span_id(upstream_span(a.attempt)),
        parent: Some(root),
        name: Cow::Borrowed("poolgate.upstream"),
        kind: SpanKind::Client,
        start,
        end,
        attributes,
        events: events.collect(),
        error: cause,
    }
}

/// What an answer said of its account's quota, as a span event: the status,
/// the binding window, each window's utilization and reset.
fn quota_event(r: &crate::learned::quota::QuotaReading, at: SystemTime) -> Event {
    let mut attributes = Vec::with_capacity(2 + 2 * r.windows.len());
    if let Some(s) = r.status {
        let status = match s {
            crate::account::Status::Allowed => "allowed",
            crate::account::Status::AllowedWarning => "allowed_warning",
            crate::account::Status::Rejected => "rejected",
            crate::account::Status::Unknown => "unknown",
        };
        attributes.push(kv("poolgate.quota.status", status));
    }
    if let Some(c) = &r.representative_claim {
        attributes.push(kv("poolgate.quota.representative_claim", c.clone()));
    }
    if let Some(ms) = r.retry_after_ms {
        attributes.push(kv("poolgate.quota.retry_after_ms", ms as i64));
    }
    for w in &r.windows {
        attributes.push(KeyValue::new(format!("poolgate.quota.{}.utilization", w.name), w.utilization));
        if let Some(reset) = w.resets_at_ms {
            attributes.push(KeyValue::new(format!("poolgate.quota.{}.resets_at_ms", w.name), reset as i64));
        }
    }
    Event { name: Cow::Borrowed("poolgate.quota.learned"), at, attributes }
}

/// The model an answer names in its first bytes: a JSON answer's top-level
/// `"model"`, a stream's `message_start` (both come before any content).
/// Read only for a traced request, from the first chunk, at most 8 KiB in.
pub fn response_model(first: &[u8]) -> Option<String> {
    let head = &first[..first.len().min(8 << 10)];
    let at = memchr::memmem::find(head, b"\"model\"")? + 7;
    let rest = head[at..].trim_ascii_start().strip_prefix(b":")?.trim_ascii_start().strip_prefix(b"\"")?;
    let name = &rest[..memchr::memchr(b'"', rest)?];
    let printable =
        !name.is_empty() && name.len() <= 128 && name.iter().all(|b| (0x21..0x7f).contains(b) && *b != b'\\');
    printable.then(|| String::from_utf8_lossy(name).into_owned())
}

fn outcome(o: AttemptOutcome) -> &'static str {
    match o {
        AttemptOutcome::Served => "served",
        AttemptOutcome::Failover => "failover",
        AttemptOutcome::ConnectError => "connect_error",
        AttemptOutcome::NoUsableAccount => "no_usable_account",
        AttemptOutcome::QueueFull => "queue_full",
        AttemptOutcome::QueueTimeout => "queue_timeout",
        AttemptOutcome::Shutdown => "shutdown",
    }
}

#[cfg(test)]
mod tests {
    use super::response_model;

    #[test]
    fn the_answering_model_is_read_from_a_json_answer_and_a_streams_first_event() {
        let json =
            br#"{"id":"msg_1","type":"message","role":"assistant","model": "claude-sonnet-4-5-20250929","content":[]}"#;
        assert_eq!(response_model(json).as_deref(), Some("claude-sonnet-4-5-20250929"));
        let sse = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"claude-haiku-4-5\"}}\n\n";
        assert_eq!(response_model(sse).as_deref(), Some("claude-haiku-4-5"));
        for none in [&b"{\"type\":\"error\"}"[..], b"{\"model\":42}", b"{\"model\":\"a b\"}", b"{\"model\":\"cut"] {
            assert_eq!(response_model(none), None, "{}", String::from_utf8_lossy(none));
        }
    }
}
