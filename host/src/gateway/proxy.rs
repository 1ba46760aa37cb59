//! One client request, end to end: read the facts, rank the pool, take an
//! in-flight slot, send upstream with the account's credential, learn from the
//! answer, fail over before the first byte, and stream the answer back.
//!
//! Failover happens only while nothing has reached the client: on 429, 529, 5xx,
//! 401/403 or a connection failure, the same body goes to the next account the
//! chain ranks for attempt n+1 (the accounts already tried are no longer
//! candidates). A 2xx is committed only once its first body chunk has arrived,
//! so a stream that dies before its first byte fails over too. When no usable
//! account remains, the answer is local: 429 with `retry-after` = the earliest
//! recovery and `x-poolgate-pool: parked` — a cooling account is never probed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};

use super::admission::{Refused, Slot};
use super::cooldown::{Answer, CooldownConfig, fails_over};
use super::decisions::{Attempt, RequestRecord};
use super::errors::{error, final_error, rate_limited};
use super::generation::{Generation, PoolAccount};
use super::relay::{self, Finish, Relay};
use super::request::{BodyFacts, body_facts, session_id};
use super::{Gateway, accounts::Change, now_ms, quota, upstream};

use crate::policy::bindings as wit;
use crate::snapshot::model_family;

/// The API a route serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/messages`.
    Messages,
    /// `POST /v1/messages/count_tokens`.
    CountTokens,
    /// `GET /v1/models…`.
    Models,
}

impl Api {
    fn shape(self) -> wit::ApiShape {
        match self {
            Api::Messages => wit::ApiShape::Messages,
            Api::CountTokens => wit::ApiShape::CountTokens,
            Api::Models => wit::ApiShape::Models,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Api::Messages => "messages",
            Api::CountTokens => "count_tokens",
            Api::Models => "models",
        }
    }
}

/// A client request, read.
pub struct Incoming {
    /// Method.
    pub method: Method,
    /// Path and query, as the client sent them.
    pub uri: Uri,
    /// Client headers.
    pub headers: HeaderMap,
    /// The whole body (kept so it can be replayed on another account).
    pub body: Bytes,
    /// The accepted client key's name.
    pub client: Option<String>,
}

/// How the last attempt failed, answered when no account is left to try.
enum Failed {
    /// The upstream answered with an error status (kept to pass on).
    Answer { status: StatusCode, headers: HeaderMap, body: Bytes },
    /// The upstream could not be reached.
    Unreachable(String),
}

/// Serves one request.
pub async fn forward(gw: Arc<Gateway>, api: Api, incoming: Incoming) -> Response {
    let started = Instant::now();
    let generation = gw.generation();
    let id = gw.next_request_id();
    let facts = if incoming.method == Method::POST {
        match body_facts(&incoming.body) {
            Ok(f) => f,
            Err(e) => return tag(error(StatusCode::BAD_REQUEST, "invalid_request_error", &e.0), id, None, None),
        }
    } else {
        BodyFacts::default()
    };
    if generation.accounts.is_empty() {
        let msg = "poolgate has no usable accounts configured: add an [[accounts]] entry (with api_key_env or token_file) to the config, or enable one";
        return tag(final_error(StatusCode::SERVICE_UNAVAILABLE, "api_error", msg), id, None, None);
    }
    let model = facts.model.clone().unwrap_or_default();
    let family = model_family(&model);
    let session = session_id(&facts, &incoming.headers);
    let mut record = RequestRecord {
        id,
        at_ms: now_ms(),
        generation: generation.number,
        api: api.name(),
        model: model.clone(),
        session: session.clone(),
        stream: facts.stream,
        client: incoming.client.clone(),
        attempts: Vec::new(),
        account: None,
        reason: String::new(),
        status: 0,
        outcome: String::new(),
        duration_ms: 0,
    };
    let cfg = &generation.config;
    let pool = generation.accounts.len();
    let max_attempts = if cfg.gateway.max_attempts == 0 { pool } else { cfg.gateway.max_attempts.min(pool) };
    let mut tried: Vec<u32> = Vec::new();
    let mut last_failure: Option<Failed> = None;
    // The request, account and outcome of the last failed attempt: `observe`
    // hears about it if no later attempt serves.
    let mut last_attempt: Option<(wit::Request, u32, wit::Outcome)> = None;

    for attempt in 0..max_attempts as u32 {
        let now = now_ms();
        let candidates = generation.candidates(family, now, &tried);
        if candidates.accounts.is_empty() {
            break;
        }
        let usable: Vec<u32> = candidates.accounts.iter().filter(|a| a.usable).map(|a| a.id).collect();
        let request = wit::Request {
            id,
            now_ms: now,
            model: model.clone(),
            session: session.clone(),
            api: api.shape(),
            attempt,
            replayable: true,
            decided_by: None,
        };
        let decision = generation.chain.rank(request.clone(), candidates).await;
        gw.metrics.chain_duration(decision.duration_us / 1e6);
        record.reason = decision.reason.clone();
        let slots: Vec<Slot<'_>> = decision
            .order
            .indices()
            .iter()
            .filter(|i| usable.contains(i))
            .filter_map(|&i| generation.account(i))
            .map(|a| (&a.state, a.config.max_in_flight))
            .collect();
        if slots.is_empty() {
            record.attempts.push(local_attempt(attempt, decision, "no_usable_account"));
            break;
        }
        let queued = Instant::now();
        let timeout = Duration::from_millis(cfg.gateway.queue_timeout_ms);
        let lease = match gw.admission.acquire(&slots, cfg.gateway.queue_max, timeout).await {
            Ok(lease) => lease,
            Err(refused) => {
                let (what, msg) = match refused {
                    Refused::QueueFull => {
                        ("queue_full", "poolgate: every account is at its in-flight limit and the queue is full")
                    }
                    Refused::Timeout => {
                        ("queue_timeout", "poolgate: timed out waiting for an account with in-flight room")
                    }
                };
                record.attempts.push(local_attempt(attempt, decision, what));
                let mut r = rate_limited(msg, 1_000);
                r.headers_mut().insert("x-poolgate-queue", HeaderValue::from_static(what));
                return finish_local(&gw, &generation, r, record, what, started, last_attempt);
            }
        };
        let queued_ms = queued.elapsed().as_millis() as u64;
        let account = generation
            .accounts
            .iter()
            .find(|a| Arc::ptr_eq(&a.state, lease.account()))
            .expect("a lease is on one of this generation's accounts");
        tried.push(account.index);
        let sent = Instant::now();
        account.state.attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let timeout = Duration::from_millis(cfg.gateway.response_timeout_ms);
        let result = gw
            .http
            .send(&account.target, &incoming.method, &incoming.uri, &incoming.headers, &incoming.body, timeout)
            .await;
        let upstream_ms = sent.elapsed().as_millis() as u64;
        let mut this = Attempt {
            attempt,
            decision,
            account: Some(account.config.id.clone()),
            status: None,
            outcome: String::new(),
            queued_ms,
            upstream_ms: Some(upstream_ms),
        };
        record.account = Some(account.config.id.clone());
        let response = match result {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(request = id, account = %account.config.id, error = %e, "upstream connection failed");
                gw.metrics.attempt(&account.config.id, None);
                connection_failed(&gw, account, family, &cfg.cooldowns, "connect_error");
                this.outcome = "connect_error".into();
                record.attempts.push(this);
                drop(lease);
                last_failure = Some(Failed::Unreachable(e));
                last_attempt = Some((request, account.index, wit::Outcome::Failed));
                continue;
            }
        };
        gw.metrics.upstream_latency(&account.config.id, sent.elapsed().as_secs_f64());
        let status = response.status();
        let reading = quota::parse(response.headers(), now_ms());
        gw.metrics.attempt(&account.config.id, Some(status.as_u16()));
        note(
            &gw,
            account,
            account.state.record(Answer::Status(status.as_u16()), &reading, family, &cfg.cooldowns, now_ms()),
        );
        this.status = Some(status.as_u16());

        if fails_over(status.as_u16()) {
            let headers = response.headers().clone();
            let body = upstream::read_small(response).await;
            this.outcome = "failover".into();
            record.attempts.push(this);
            gw.metrics.failover(&account.config.id, status.as_str());
            tracing::info!(request = id, account = %account.config.id, status = status.as_u16(), "failing over");
            last_failure = Some(Failed::Answer { status, headers, body });
            let ended = match status.as_u16() {
                429 => wit::Outcome::RateLimited(reading.retry_after_ms),
                529 => wit::Outcome::Overloaded,
                s => wit::Outcome::UpstreamError(s),
            };
            last_attempt = Some((request, account.index, ended));
            drop(lease);
            continue;
        }

        // Commit only once the first byte is here: until then, nothing has
        // reached the client and the request can still move.
        let sse = upstream::is_plain_sse(response.headers());
        let mut headers = response.headers().clone();
        let mut stream = Box::pin(upstream::body_stream(response));
        let first = match stream.next().await {
            Some(Ok(b)) => b,
            None => Bytes::new(),
            Some(Err(e)) if status.is_success() => {
                tracing::warn!(request = id, account = %account.config.id, error = %e, "upstream failed before the first byte");
                connection_failed(&gw, account, family, &cfg.cooldowns, "stream_error");
                this.outcome = "failover".into();
                record.attempts.push(this);
                drop(lease);
                last_failure = Some(Failed::Unreachable(format!("stream failed before the first byte: {e}")));
                last_attempt = Some((request, account.index, wit::Outcome::Failed));
                continue;
            }
            Some(Err(_)) => Bytes::new(),
        };
        this.outcome = "served".into();
        record.attempts.push(this);
        record.status = status.as_u16();
        let policy_error = record
            .attempts
            .iter()
            .rev()
            .find_map(|a| a.decision.policy_errors.first())
            .map(|e| format!("{}:{}", e.stage, e.cause.as_str()));
        upstream::retain_forwardable(&mut headers);
        let finish = Finish {
            gateway: gw.clone(),
            generation: generation.clone(),
            lease,
            account: account.index,
            request,
            record,
            started,
        };
        let reason = finish.record.reason.clone();
        let attempts = finish.record.attempts.len();
        let length = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
        let body = Body::from_stream(Relay::new(first, stream, sse, length, finish));
        let mut out = Response::new(body);
        *out.status_mut() = status;
        *out.headers_mut() = headers;
        // The account's id: what the config, `/status` and the decision record
        // name it by (the alias is in the record).
        let r = tag(out, id, Some(&account.config.id), Some(&reason));
        return with_attempt_headers(r, attempts, policy_error.as_deref());
    }

    // Out of accounts to try.
    let now = now_ms();
    let all_cooling = generation.accounts.iter().all(|a| !a.state.snapshot(&a.config).usable(family, now));
    // Parked: every account is cooling and nothing but rate limits (or nothing at
    // all) stood in the way. Other failures are passed on as they were.
    let rate_limited_last = match &last_failure {
        None => true,
        Some(Failed::Answer { status, .. }) => matches!(status.as_u16(), 429 | 529),
        Some(Failed::Unreachable(_)) => false,
    };
    if all_cooling && rate_limited_last {
        let earliest = generation
            .accounts
            .iter()
            .filter_map(|a| {
                let s = a.state.snapshot(&a.config);
                let gate = s.active_gate(family, now).map(|g| g.until_ms);
                s.active_cooldown(now).map(|c| c.until_ms).into_iter().chain(gate).min()
            })
            .min()
            .unwrap_or(now + 1_000);
        gw.metrics.parked();
        let mut r = rate_limited(
            "poolgate: every account is cooling down (rate limited or exhausted); retry after the time given",
            earliest.saturating_sub(now),
        );
        r.headers_mut().insert("x-poolgate-pool", HeaderValue::from_static("parked"));
        return finish_local(&gw, &generation, r, record, "parked", started, last_attempt);
    }
    match last_failure {
        Some(Failed::Answer { status, mut headers, body }) => {
            let mut r = Response::new(Body::from(body));
            *r.status_mut() = status;
            upstream::retain_forwardable(&mut headers);
            *r.headers_mut() = headers;
            finish_local(&gw, &generation, r, record, "upstream_error", started, last_attempt)
        }
        Some(Failed::Unreachable(why)) => {
            let r = error(
                StatusCode::BAD_GATEWAY,
                "api_error",
                &format!("poolgate: the upstream could not be reached ({why})"),
            );
            finish_local(&gw, &generation, r, record, "unreachable", started, last_attempt)
        }
        None => {
            let r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded_error",
                "poolgate: no account could take the request",
            );
            finish_local(&gw, &generation, r, record, "no_account", started, last_attempt)
        }
    }
}

/// Cools `account` after its connection failed before anything reached the
/// client, and counts the failover with `cause`.
fn connection_failed(
    gw: &Gateway,
    account: &PoolAccount,
    family: Option<&str>,
    cooldowns: &CooldownConfig,
    cause: &str,
) {
    let change =
        account.state.record(Answer::ConnectFailed, &quota::QuotaReading::default(), family, cooldowns, now_ms());
    note(gw, account, change);
    gw.metrics.failover(&account.config.id, cause);
}

/// Reports a cooldown change to metrics and the log.
fn note(gw: &Gateway, account: &PoolAccount, change: Change) {
    match change {
        Change::Cooled(reason) => {
            gw.metrics.cooldown(&account.config.id, reason.as_str());
            tracing::info!(account = %account.config.id, reason = reason.as_str(), "account cooling down");
        }
        Change::Gated(family) => {
            gw.metrics.cooldown(&account.config.id, "model_exhausted");
            tracing::info!(account = %account.config.id, family, "model family gated on account");
        }
        Change::Cleared | Change::None => {}
    }
}

fn local_attempt(attempt: u32, decision: crate::policy::Decision, outcome: &str) -> Attempt {
    Attempt { attempt, decision, account: None, status: None, outcome: outcome.into(), queued_ms: 0, upstream_ms: None }
}

/// Ends a request answered by the gateway itself (or with a kept upstream
/// error), telling the chain how the last attempt ended, if there was one.
fn finish_local(
    gw: &Gateway,
    generation: &Arc<Generation>,
    r: Response,
    mut record: RequestRecord,
    outcome: &str,
    started: Instant,
    last_attempt: Option<(wit::Request, u32, wit::Outcome)>,
) -> Response {
    if let Some((request, account, ended)) = last_attempt {
        relay::observe(generation.clone(), request, account, ended);
    }
    record.status = r.status().as_u16();
    record.outcome = outcome.into();
    record.duration_ms = started.elapsed().as_millis() as u64;
    let (id, reason, attempts) = (record.id, record.reason.clone(), record.attempts.len());
    let alias = record.account.clone();
    gw.metrics.request(record.account.as_deref().unwrap_or("-"), record.status);
    gw.decisions.push(record);
    with_attempt_headers(tag(r, id, alias.as_deref(), Some(&reason)), attempts, None)
}

/// Adds the explanation headers every response carries.
pub fn tag(mut r: Response, id: u64, alias: Option<&str>, reason: Option<&str>) -> Response {
    let h = r.headers_mut();
    h.insert("x-poolgate-request-id", HeaderValue::from(id));
    if let Some(v) = alias.and_then(|a| HeaderValue::from_str(a).ok()) {
        h.insert("x-poolgate-account", v);
    }
    if let Some(v) = reason.filter(|r| !r.is_empty()).and_then(|r| HeaderValue::from_str(r).ok()) {
        h.insert("x-poolgate-reason", v);
    }
    r
}

fn with_attempt_headers(mut r: Response, attempts: usize, policy_error: Option<&str>) -> Response {
    let h = r.headers_mut();
    if attempts > 0 {
        h.insert("x-poolgate-attempts", HeaderValue::from(attempts));
    }
    if let Some(v) = policy_error.and_then(|p| HeaderValue::from_str(p).ok()) {
        h.insert("x-poolgate-policy-error", v);
    }
    r
}
