//! One attempt on one account: send, read the answer up to its first body
//! chunk, and say how it went ([`Attempted`]); then what the gateway learns
//! from it ([`learn`]) and whether the request moves on ([`next`], a pure
//! function of how it went).
//!
//! A 2xx is committed only once its first body chunk has arrived — until then
//! nothing has reached the client and the request can still move, so a stream
//! that dies before its first byte fails over like a 5xx.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http::{HeaderMap, HeaderValue, StatusCode};

use super::admission::Lease;
use super::finish::{note, outcome_of};
use super::read::Incoming;
use super::record::AttemptOutcome;
use super::upstream;
use crate::gateway::Gateway;
use crate::gateway::generation::{Generation, PoolAccount};
use crate::learned::cooldown::{Answer, fails_over};
use crate::learned::quota::{self, QuotaReading};
use crate::policy::types as wit;

pub use super::upstream::Rest;

/// How one attempt went.
pub struct Attempted {
    /// The account's pool index.
    pub account: u32,
    /// Time spent waiting for an in-flight slot, ms.
    pub queued_ms: u64,
    /// Time to the response headers (or the failure), ms.
    pub upstream_ms: u64,
    /// The quota the answer reported (empty without an answer).
    pub reading: QuotaReading,
    /// What came back.
    pub how: How,
}

/// What came back from an attempt.
pub enum How {
    /// An answer to pass on: a 2xx whose first body chunk has arrived, or a
    /// status that does not fail over (a 4xx the client caused).
    Answered(Answered),
    /// A status that moves the request to the next account: 429, 529, 5xx,
    /// 401, 403. Its body is read (at most 64 KiB) so the connection can be
    /// reused, and its message logged for the operator.
    Refused {
        /// The status.
        status: StatusCode,
        /// Its body (at most 64 KiB).
        body: Bytes,
    },
    /// No response at all (connect error, timeout).
    Unreachable(String),
    /// A 2xx whose body broke before the client got a byte of it: before
    /// its first chunk, or, for an answer read whole to be translated,
    /// before it was whole.
    Broke {
        /// The status it had announced.
        status: StatusCode,
        /// What broke.
        why: String,
    },
}

/// An answer on its way to the client.
pub struct Answered {
    /// The account's pool index.
    pub account: u32,
    /// The upstream's status.
    pub status: StatusCode,
    /// The upstream's headers.
    pub headers: HeaderMap,
    /// The first body chunk (empty for an empty body).
    pub first: Bytes,
    /// The rest of the body.
    pub rest: Rest,
    /// Whether it is a plain (uncompressed) event stream, relayed event by event.
    pub sse: bool,
    /// The account's in-flight slot, held until the body ends.
    pub lease: Lease,
}

/// How a failed attempt failed: what the chain hears, and what the answer
/// says when no account is left. The upstream's own answer is never passed
/// on: its 401 would read as the client's key being wrong.
pub enum Failure {
    /// The upstream refused.
    Refused {
        /// The account's pool index.
        account: u32,
        /// The status.
        status: StatusCode,
        /// What `retry-after` said, ms.
        retry_after_ms: Option<u64>,
    },
    /// Nothing usable came back: no connection, or a body that broke at once.
    Unreachable {
        /// The account's pool index.
        account: u32,
        /// What failed.
        why: String,
    },
}

impl Failure {
    /// The account that failed.
    pub fn account(&self) -> u32 {
        match self {
            Failure::Refused { account, .. } | Failure::Unreachable { account, .. } => *account,
        }
    }

    /// What the chain hears about it.
    pub fn outcome(&self) -> wit::Outcome {
        match self {
            Failure::Refused { status, retry_after_ms, .. } => outcome_of(Some(status.as_u16()), *retry_after_ms),
            Failure::Unreachable { .. } => outcome_of(None, None),
        }
    }
}

/// Whether a request goes on to the next account.
pub enum Next {
    /// The answer goes to the client.
    Commit(Answered),
    /// It failed before anything reached the client: try the next account.
    FailOver(Failure),
}

/// The failover decision: an answer is committed, anything else moves on.
pub fn next(attempted: Attempted) -> Next {
    let Attempted { account, reading, how, .. } = attempted;
    match how {
        How::Answered(a) => Next::Commit(a),
        How::Refused { status, .. } => {
            Next::FailOver(Failure::Refused { account, status, retry_after_ms: reading.retry_after_ms })
        }
        How::Unreachable(why) => Next::FailOver(Failure::Unreachable { account, why }),
        How::Broke { why, .. } => Next::FailOver(Failure::Unreachable {
            account,
            why: format!("the answer broke before the client got a byte: {why}"),
        }),
    }
}

/// One attempt to send: where, what, and what it carries.
pub struct Send<'a> {
    /// The account.
    pub account: &'a PoolAccount,
    /// The client's request.
    pub incoming: &'a Incoming,
    /// The account's in-flight slot.
    pub lease: Lease,
    /// Time spent waiting for it, ms.
    pub queued_ms: u64,
    /// `traceparent` (and `tracestate`) for the upstream, when the operator
    /// has it propagated.
    pub propagate: Option<(String, Option<&'a str>)>,
}

/// Sends the request to `account` (holding `lease`) and reads the answer up to
/// its first body chunk.
pub async fn send(gw: &Gateway, generation: &Generation, send: Send<'_>) -> Attempted {
    let Send { account, incoming, lease, queued_ms, propagate } = send;
    let sent = gw.clock.instant();
    account.state.attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let timeout = Duration::from_millis(generation.config.gateway.response_timeout_ms);
    // With propagation configured the allow-list lets `traceparent` and
    // `tracestate` through: the client's own never go, only what the
    // gateway's tracing hands over (none when it traces nothing).
    let traced;
    let headers = match (propagate, generation.config.telemetry.propagate_upstream) {
        (None, false) => &incoming.headers,
        (propagate, _) => {
            traced = trace_headers(&incoming.headers, propagate);
            &traced
        }
    };
    let result = send_refreshing(gw, generation, account, incoming, headers, timeout).await;
    let attempted = |reading, how| Attempted {
        account: account.index,
        queued_ms,
        upstream_ms: gw.clock.since(sent).as_millis() as u64,
        reading,
        how,
    };
    let response = match result {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(request = incoming.id, account = %account.config.id, error = %e, "upstream connection failed");
            return attempted(QuotaReading::default(), How::Unreachable(e));
        }
    };
    gw.metrics.upstream_latency(&account.config.id, gw.clock.since(sent).as_secs_f64());
    let status = response.status();
    let reading = quota::parse(response.headers(), gw.clock.now_ms());
    if fails_over(status.as_u16()) {
        let body = upstream::read_small(response).await;
        return attempted(reading, How::Refused { status, body });
    }
    let sse = upstream::is_plain_sse(response.headers());
    // The headers are moved out, not copied: an answer carries some thirty
    // (the unified quota family), each name a copy of its own once cloned.
    let (mut parts, body) = response.into_parts();
    let headers = std::mem::take(&mut parts.headers);
    let mut rest: Rest = Box::pin(upstream::body_stream(http::Response::from_parts(parts, body)));
    let first = match rest.next().await {
        Some(Ok(b)) => b,
        None => Bytes::new(),
        Some(Err(e)) if status.is_success() => {
            tracing::warn!(request = incoming.id, account = %account.config.id, error = %e, "upstream failed before the first byte");
            return attempted(reading, How::Broke { status, why: e.to_string() });
        }
        Some(Err(_)) => Bytes::new(),
    };
    let (first, rest) = match incoming.dialect.is_openai() && status.is_success() && !sse {
        true => match read_ahead(gw, first, rest).await {
            Ok(read) => read,
            Err(why) => {
                tracing::warn!(request = incoming.id, account = %account.config.id, error = %why, "upstream answer broke before it was whole");
                return attempted(reading, How::Broke { status, why });
            }
        },
        false => (first, rest),
    };
    let answered = Answered { account: account.index, status, headers, first, rest, sse, lease };
    attempted(reading, How::Answered(answered))
}

/// The most of an answer that is read whole to be translated.
pub const WHOLE_LIMIT: usize = 64 << 20;

/// Reads a 2xx answer that is translated for its client whole, inside the
/// attempt: nothing has reached the client yet, so an answer that breaks on
/// the way fails over like one that broke before its first byte (the chaos
/// run found a Chat Completions client failed by one cut account while
/// others could serve). A shutdown's cut stops the reading where it is; the
/// commit then answers the client that the grace period ended.
async fn read_ahead(gw: &Gateway, first: Bytes, mut rest: Rest) -> Result<(Bytes, Rest), String> {
    let mut cut = gw.lifecycle.on_cut();
    let mut out = bytes::BytesMut::from(&first[..]);
    loop {
        tokio::select! {
            biased;
            chunk = rest.next() => match chunk {
                None => return Ok((out.freeze(), Box::pin(futures_util::stream::empty()))),
                Some(Ok(chunk)) if out.len() + chunk.len() > WHOLE_LIMIT => {
                    return Err(format!("the body is larger than {} MiB", WHOLE_LIMIT >> 20));
                }
                Some(Ok(chunk)) => out.extend_from_slice(&chunk),
                Some(Err(e)) => return Err(format!("the body broke: {e}")),
            },
            () = &mut cut => return Ok((out.freeze(), rest)),
        }
    }
}

/// Sends the request; for an OAuth seat whose token the upstream refused
/// (401), refreshes the token — once for every request that met the same 401
/// — and sends again on the same account before the request fails over.
async fn send_refreshing(
    gw: &Gateway,
    generation: &Generation,
    account: &PoolAccount,
    incoming: &Incoming,
    headers: &HeaderMap,
    timeout: Duration,
) -> Result<upstream::UpstreamResponse, String> {
    let send = || gw.http.send(&account.target, &incoming.method, &incoming.uri, headers, &incoming.body, timeout);
    let Some(seat) = account.target.oauth_seat() else { return send().await };
    let token = seat.header();
    let response = send().await?;
    if response.status() != StatusCode::UNAUTHORIZED {
        return Ok(response);
    }
    let oauth = &generation.config.oauth;
    let wait = Duration::from_millis(oauth.request_wait_ms);
    let bounds = (oauth.refresh_before_ms, oauth.max_backoff_ms);
    let Some(refreshed) = refresh_within(gw, account, seat.clone(), token, wait, bounds).await else {
        tracing::warn!(
            request = incoming.id,
            account = %account.config.id,
            wait_ms = oauth.request_wait_ms,
            "401 on an OAuth seat whose refresh takes longer than oauth.request_wait_ms: failing over while it goes on"
        );
        return Ok(response);
    };
    match refreshed {
        Ok(_) => {
            tracing::info!(request = incoming.id, account = %account.config.id, "401 on an OAuth seat: token refreshed, sending again");
            send().await
        }
        Err(e) => {
            // A refresh that failed now was logged by the seat, with its
            // error; this line says which request met it, not the error again.
            let error = match &e {
                crate::oauth::SeatError::Failed(_) => None,
                e => Some(tracing::field::display(e)),
            };
            tracing::warn!(request = incoming.id, account = %account.config.id, error, "401 on an OAuth seat and no new token");
            Ok(response)
        }
    }
}

/// Refreshes `account`'s seat after a 401 on `token`, waiting for it at most
/// `wait`: `None` past that. The refresh runs as a task of its own, so a
/// request that stops waiting never cuts it short — a refresh token is
/// single-use, and a refresh dropped after the token endpoint spent it would
/// lose the seat's new pair. The chaos run found requests held 15 s (the token
/// endpoint's whole timeout) on a seat whose endpoint hung, while other
/// accounts could serve.
async fn refresh_within(
    gw: &Gateway,
    account: &PoolAccount,
    seat: std::sync::Arc<crate::oauth::Seat>,
    token: HeaderValue,
    wait: Duration,
    (before_ms, max_backoff_ms): (u64, u64),
) -> Option<Result<crate::oauth::Refreshed, crate::oauth::SeatError>> {
    let (clock, metrics, state, id) =
        (gw.clock.clone(), gw.metrics.clone(), account.state.clone(), account.config.id.clone());
    let refresh = tokio::spawn(async move {
        let why = crate::oauth::Why::Unauthorized;
        let refreshed = seat.refresh(why, Some(&token), || clock.now_ms(), before_ms, max_backoff_ms).await;
        crate::gateway::seat_keeper::note(&metrics, &id, &state, &refreshed, clock.now_ms());
        refreshed
    });
    match tokio::time::timeout(wait, refresh).await {
        Ok(Ok(refreshed)) => Some(refreshed),
        Ok(Err(panicked)) => Some(Err(crate::oauth::SeatError::Failed(format!("the refresh failed: {panicked}")))),
        Err(_) => None,
    }
}

/// What the gateway learns from an attempt — quota, cooldowns, streaks,
/// metrics — and the record entry's outcome and status.
pub fn learn(
    gw: &Gateway,
    generation: &Generation,
    family: Option<&str>,
    attempted: &Attempted,
) -> (AttemptOutcome, Option<u16>) {
    let Some(account) = generation.account(attempted.account) else {
        return (AttemptOutcome::ConnectError, None);
    };
    let id = &account.config.id;
    let cooldowns = &generation.config.cooldowns;
    let status = match &attempted.how {
        How::Answered(a) => Some(a.status),
        How::Refused { status, .. } | How::Broke { status, .. } => Some(*status),
        How::Unreachable(_) => None,
    };
    gw.metrics.attempt(id, status.map(|s| s.as_u16()));
    let now = gw.clock.now_ms();
    if let Some(s) = status {
        let change = account.state.record(Answer::Status(s.as_u16()), &attempted.reading, family, cooldowns, now);
        note(gw, account, change);
        share_reading(generation, account, &attempted.reading, now);
        if s.is_success() {
            overage_guard(gw, generation, account, &attempted.reading);
        }
    }
    let connection_failed = |cause: &str| {
        let change = account.state.record(Answer::ConnectFailed, &QuotaReading::default(), family, cooldowns, now);
        note(gw, account, change);
        gw.metrics.failover(id, cause);
    };
    let outcome = match &attempted.how {
        How::Answered(_) => AttemptOutcome::Served,
        How::Refused { status, body, .. } => {
            gw.metrics.failover(id, status.as_str());
            let upstream = upstream_message(body);
            tracing::info!(account = %id, status = status.as_u16(), upstream, "failing over");
            AttemptOutcome::Failover
        }
        How::Unreachable(_) => {
            connection_failed("connect_error");
            AttemptOutcome::ConnectError
        }
        How::Broke { .. } => {
            connection_failed("stream_error");
            AttemptOutcome::Failover
        }
    };
    (outcome, status.map(|s| s.as_u16()))
}

/// Hands a quota reading to the other accounts of the same subscription
/// (same organization id): they draw on one quota.
fn share_reading(generation: &Generation, account: &PoolAccount, reading: &QuotaReading, now: u64) {
    let Some(org) = reading.organization_id.as_deref() else { return };
    if reading.is_empty() {
        return;
    }
    for sibling in generation.accounts.iter().filter(|a| a.index != account.index) {
        if sibling.state.is_organization(org) {
            sibling.state.merge_shared(reading, now);
        }
    }
}

/// The overage guard: a subscription seat's answer billed as extra usage is
/// counted, and — with `[oauth] overage = "avoid"` (the default) — the seat
/// rests until the windows that pushed it there reset.
fn overage_guard(gw: &Gateway, generation: &Generation, account: &PoolAccount, reading: &QuotaReading) {
    use crate::config::{AccountKind, Overage};
    let now = gw.clock.now_ms();
    if account.config.kind != AccountKind::Oauth || !reading.billed_as_overage(now) {
        return;
    }
    let action = generation.config.oauth.overage;
    gw.metrics.overage(&account.config.id, &format!("{action:?}").to_lowercase());
    match action {
        Overage::Allow => {}
        Overage::Warn => tracing::warn!(account = %account.config.id, "an answer was billed as extra usage (overage)"),
        Overage::Avoid => {
            let fallback = now + generation.config.cooldowns.unified_ms;
            let until = reading.subscription_reset_ms(now).unwrap_or(fallback);
            let change = account.state.cool(until, crate::account::CooldownReason::Overage, now);
            tracing::warn!(account = %account.config.id, until_ms = until, "an answer was billed as extra usage: the seat rests until its windows reset");
            note(gw, account, change);
        }
    }
}

/// What an upstream error body says, for the log: `error.message` of
/// Anthropic's envelope, else the start of the body; at most 200 characters.
/// The client's headers with its `traceparent` and `tracestate` replaced by
/// the gateway's (the attempt's span as the parent, the caller's state as
/// parsed), or taken away when there are none.
fn trace_headers(client: &HeaderMap, propagate: Option<(String, Option<&str>)>) -> HeaderMap {
    let mut h = client.clone();
    h.remove("traceparent");
    h.remove("tracestate");
    let Some((traceparent, tracestate)) = propagate else { return h };
    if let Ok(v) = http::HeaderValue::from_str(&traceparent) {
        h.insert("traceparent", v);
    }
    if let Some(v) = tracestate.and_then(|s| http::HeaderValue::from_str(s).ok()) {
        h.insert("tracestate", v);
    }
    h
}

/// Why an attempt got no answer to pass on, for its record; none for a
/// status (the record has it).
pub fn failure(how: &How) -> Option<String> {
    match how {
        How::Answered(_) | How::Refused { .. } => None,
        How::Unreachable(why) => Some(why.clone()),
        How::Broke { why, .. } => Some(format!("the answer broke before the client got a byte: {why}")),
    }
}

fn upstream_message(body: &[u8]) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let message = parsed.as_ref().and_then(|v| v["error"]["message"].as_str()).map(str::to_string);
    let text = message.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    text.chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempted(how: How, retry_after_ms: Option<u64>) -> Attempted {
        let reading = QuotaReading { retry_after_ms, ..QuotaReading::default() };
        Attempted { account: 3, queued_ms: 0, upstream_ms: 1, reading, how }
    }

    #[test]
    fn a_refusal_fails_over_keeping_its_answer_and_retry_after() {
        let how = How::Refused { status: StatusCode::TOO_MANY_REQUESTS, body: "x".into() };
        let Next::FailOver(f) = next(attempted(how, Some(30_000))) else { panic!("a 429 moves on") };
        assert_eq!(f.account(), 3);
        assert!(matches!(f.outcome(), wit::Outcome::RateLimited(Some(30_000))));
        assert!(matches!(f, Failure::Refused { status, .. } if status == 429));
    }

    #[test]
    fn the_log_gets_the_upstreams_message_not_its_envelope() {
        let body = br#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#;
        assert_eq!(upstream_message(body), "invalid x-api-key");
        assert_eq!(upstream_message(b"<html>bad gateway</html>"), "<html>bad gateway</html>");
        assert_eq!(upstream_message("é".repeat(300).as_bytes()).chars().count(), 200);
    }

    #[test]
    fn no_answer_fails_over_and_is_no_rate_limit() {
        for how in [How::Unreachable("refused".into()), How::Broke { status: StatusCode::OK, why: "reset".into() }] {
            let Next::FailOver(f) = next(attempted(how, None)) else { panic!("moves on") };
            assert!(matches!(f.outcome(), wit::Outcome::Failed));
        }
        let how = How::Refused { status: StatusCode::INTERNAL_SERVER_ERROR, body: Bytes::new() };
        let Next::FailOver(f) = next(attempted(how, None)) else { panic!("a 500 moves on") };
        assert!(matches!(f.outcome(), wit::Outcome::UpstreamError(500)));
    }
}
