//! One client request, end to end, as a list of named phases over one context
//! ([`Exchange`]):
//!
//! ```text
//! read ─► rank ─► admit ─► attempt ─► learn ─┬─► commit ─► answer (relayed; finished when its body ends)
//!          ▲                                  └─► fail over: the next attempt ranks again
//!          └──────────────────────────────────────┘
//!          out of accounts ─► answer (local: 429 quota, 503 auth, 502/503 upstream; see `unserved`)
//! ```
//!
//! Failover happens only while nothing has reached the client: on 429, 529,
//! 5xx, 401/403 or a connection failure, the same body goes to the next account
//! the chain ranks for attempt n+1 (the accounts already tried are no longer
//! candidates). A 2xx is committed only once its first body chunk has arrived,
//! so a stream that dies before its first byte fails over too. Whether an
//! attempt fails over is a pure function of how it went ([`next`]). When no
//! usable account remains, the answer is local; a cooling account is never
//! probed. Every way a request ends goes through [`Finish`].
//!
//! The phases' modules, in the order they run: [`read`] (what is read from
//! the client) and [`dialect`] (how the client speaks: its answers are
//! translated before they finish), [`key_limits`] (what the client key may
//! still do: its models, limits and budgets), [`admission`] (in-flight limits and their queue),
//! [`attempt`] (one try on one account through [`upstream`]'s `Transport`,
//! what it teaches, and the pure failover decision), [`relay`] and [`body`]
//! (the response body as it streams: framing, translation, keep-alive),
//! [`unified`] (the quota headers an account's answer carries, pooled),
//! [`unserved`], [`fallback`] and [`errors`] (the answer when no account
//! can serve), [`finish`] (the one end of every request) and [`record`]
//! (the decision records it keeps).
//!
//! Each attempt records the accounts ranked ahead of the one it tried and why
//! they were passed over ([`ahead_of`]): not usable (cooling, gated), at their
//! in-flight limit (admission says which), an overflow account, or tried and
//! failed over. An account an operator disabled is no candidate at all.

pub mod admission;
pub mod attempt;
pub mod body;
pub mod dialect;
pub mod errors;
pub mod fallback;
pub mod finish;
pub mod key_limits;
pub mod read;
pub mod record;
pub mod relay;
pub mod trace;
pub mod unified;
pub mod unserved;
pub mod upstream;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode, header};

use super::Gateway;
use super::generation::Generation;
use crate::account::model_family;
use crate::policy::Decision;
use crate::policy::types as wit;
use admission::{Lease, Refused, Slot};
use attempt::{Answered, Attempted, Failure, How, Next, next};
use errors::{ErrorType, error, final_error, rate_limited};
use fallback::Substitute;
use finish::{Early, Finish, Observe};
use read::{BodyFacts, body_facts, session_id};
use record::{Attempt, AttemptOutcome, Ending, PassCause, PassedOver, RequestRecord, pass_over, unusable_cause};

/// The API a route serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/messages`.
    Messages,
    /// `POST /v1/messages/count_tokens`.
    CountTokens,
    /// `GET /v1/models…`.
    Models,
    /// `POST /v1/chat/completions`, translated to Messages (see `dialect`).
    ChatCompletions,
}

impl Api {
    fn shape(self) -> wit::ApiShape {
        match self {
            Api::Messages => wit::ApiShape::Messages,
            Api::CountTokens => wit::ApiShape::CountTokens,
            Api::Models => wit::ApiShape::Models,
            Api::ChatCompletions => wit::ApiShape::ChatCompletions,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Api::Messages => "messages",
            Api::CountTokens => "count_tokens",
            Api::Models => "models",
            Api::ChatCompletions => "chat_completions",
        }
    }
}

pub use read::Incoming;

/// Serves one request: its phases, in order.
pub async fn forward(gw: Arc<Gateway>, api: Api, incoming: Incoming) -> Response {
    let mut x = match Exchange::read(gw, api, incoming) {
        Ok(x) => x,
        Err(answer) => return *answer,
    };
    while let Some(ranked) = x.rank().await {
        let (lease, queued_ms, full) = match x.admit(&ranked).await {
            Ok(admitted) => admitted,
            Err(refused) => return x.refused(ranked, refused),
        };
        // The grace period can end while an upstream thinks: the client then
        // hears why, rather than a connection reset.
        let cut = x.gw.lifecycle.on_cut();
        let attempted = tokio::select! {
            biased;
            attempted = x.attempt(lease, queued_ms) => attempted,
            () = cut => return x.cut_short(ranked),
        };
        let request = x.learn(ranked, &full, &attempted);
        match next(attempted) {
            Next::Commit(answered) => return x.commit(request, answered).await,
            Next::FailOver(failure) => x.last = Some((failure, request)),
        }
    }
    x.out_of_accounts().await
}

/// One rank of the chain for one attempt.
pub struct Ranked {
    attempt: u32,
    /// The request as the chain saw it.
    request: wit::Request,
    decision: Decision,
    /// Pool indices of the usable accounts, best first.
    order: Vec<u32>,
    /// The accounts of the chain's order that are not usable, with why (and
    /// until when), as they were when it ranked.
    unusable: Vec<Unusable>,
    /// When it began, µs into the request (traced requests only).
    at_us: u64,
}

/// An account the chain ranked that could not take the request: its pool index, why, and until when.
pub type Unusable = (u32, PassCause, Option<u64>);

/// Everything one request carries from phase to phase.
pub struct Exchange {
    gw: Arc<Gateway>,
    generation: Arc<Generation>,
    api: Api,
    incoming: Incoming,
    started: Instant,
    family: Option<&'static str>,
    record: RequestRecord,
    /// Pool indices of the accounts tried so far (no longer candidates).
    tried: Vec<u32>,
    max_attempts: u32,
    /// How the last failed attempt went, with the request the chain saw for
    /// it: the answer when no account is left, and what the chain hears.
    last: Option<(Failure, wit::Request)>,
    /// The request's place on its client key's meter (a key with limits).
    key_lease: Option<crate::ledger::limits::KeyLease>,
}

impl Exchange {
    /// Phase *read*: the body's facts (model, stream, session) and the record.
    fn read(gw: Arc<Gateway>, api: Api, incoming: Incoming) -> Result<Exchange, Box<Response>> {
        let (started, arrived_ms) = (gw.clock.instant(), gw.clock.now_ms());
        let id = incoming.id;
        let generation = gw.generation();
        let early = Early { id, method: &incoming.method, path: incoming.uri.path(), started };
        let facts = if incoming.method == Method::POST {
            body_facts(&incoming.body).map_err(|e| {
                let r = incoming.dialect.whole(error(StatusCode::BAD_REQUEST, ErrorType::InvalidRequest, &e.0));
                Box::new(early.refuse_from(&gw, "invalid_body", incoming.client.as_deref(), r))
            })?
        } else {
            BodyFacts::default()
        };
        if generation.accounts.is_empty() {
            let msg = "poolgate has no usable accounts configured: add an [[accounts]] entry (with api_key_env or token_file) to the config, or enable one";
            let r = incoming.dialect.whole(final_error(StatusCode::SERVICE_UNAVAILABLE, ErrorType::Api, msg));
            return Err(Box::new(early.refuse_from(&gw, "no_accounts", incoming.client.as_deref(), r)));
        }
        let model = facts.model.clone().unwrap_or_default();
        // The key's limits: every route that asks a model.
        let metered = api != Api::Models;
        let key_lease = match metered {
            true => key_limits::admit(&gw, &generation, &incoming, &model)
                .map_err(|r| Box::new(early.refuse_from(&gw, "key_limit", incoming.client.as_deref(), *r)))?,
            false => None,
        };
        let pool = generation.accounts.len();
        let max = generation.config.gateway.max_attempts;
        let max_attempts = if max == 0 { pool } else { max.min(pool) } as u32;
        let record = RequestRecord {
            id,
            at_ms: arrived_ms,
            generation: generation.number,
            api: api.name(),
            method: incoming.method.to_string(),
            path: incoming.uri.path().to_string(),
            blocked: Vec::new(),
            session: session_id(&facts, &incoming.headers),
            model,
            stream: facts.stream,
            client: incoming.client.clone(),
            attempts: Vec::new(),
            passed_over: Vec::new(),
            account: None,
            fallback: None,
            reason: String::new(),
            status: 0,
            outcome: Ending::Pending,
            duration_ms: 0,
            usage: None,
            usage_estimated: false,
            response_model: None,
            trace: gw.telemetry.as_ref().and_then(|t| {
                let header = |n: &str| incoming.headers.get(n).and_then(|v| v.to_str().ok());
                t.begin(id, header("traceparent"), header("tracestate"))
            }),
        };
        let family = model_family(&record.model);
        Ok(Exchange {
            family,
            gw,
            generation,
            api,
            incoming,
            started,
            record,
            tried: Vec::new(),
            max_attempts,
            last: None,
            key_lease,
        })
    }

    /// Phase *rank*: the chain orders the accounts not tried yet. `None` once
    /// the attempts are used up or no candidate is left.
    async fn rank(&mut self) -> Option<Ranked> {
        let attempt = self.record.attempts.len() as u32;
        if attempt >= self.max_attempts {
            return None;
        }
        let now = self.gw.clock.now_ms();
        let at_us = self.record.trace.as_ref().map_or(0, |_| self.gw.clock.since(self.started).as_micros() as u64);
        // An account an operator disabled is no candidate, like one the file
        // disables; the accounts already tried are no longer candidates.
        let disabled = self.generation.accounts.iter().filter(|a| a.state.is_runtime_disabled()).map(|a| a.index);
        let mut exclude = std::borrow::Cow::Borrowed(&self.tried);
        for i in disabled {
            exclude.to_mut().push(i);
        }
        let candidates = self.generation.candidates(self.family, now, &exclude);
        if candidates.accounts.is_empty() {
            return None;
        }
        let usable: Vec<u32> = candidates.accounts.iter().filter(|a| a.usable).map(|a| a.id).collect();
        let request = wit::Request {
            id: self.record.id,
            now_ms: now,
            model: self.record.model.clone(),
            session: self.record.session.clone(),
            api: self.api.shape(),
            attempt,
            replayable: true,
            decided_by: None,
        };
        let decision = self.generation.chain.decide(request.clone(), candidates).await;
        self.gw.metrics.chain_duration(decision.duration_us / 1e6);
        self.gw.metrics.stage_durations(&decision.stages);
        self.record.reason.clone_from(&decision.reason);
        let mut order: Vec<u32> = decision.order.indices().iter().copied().filter(|i| usable.contains(i)).collect();
        // Overflow accounts (API keys beside subscription seats, by default)
        // come after every usable account that is not: a stable partition, so
        // the chain's order holds within each tier.
        order.sort_by_key(|&i| self.generation.account(i).is_some_and(|a| a.overflow));
        if order.is_empty() {
            self.record.attempts.push(local_attempt(attempt, decision, AttemptOutcome::NoUsableAccount, at_us));
            return None;
        }
        // Usually none: stage 1 puts usable accounts first and most stages
        // keep them there.
        let unusable = decision
            .order
            .indices()
            .iter()
            .filter(|i| !usable.contains(i))
            .filter_map(|&i| {
                let a = self.generation.account(i)?;
                let (cause, until) = unusable_cause(&a.state.snapshot(&a.config, now), self.family, now);
                Some((i, cause, until))
            })
            .collect();
        Some(Ranked { attempt, request, decision, order, unusable, at_us })
    }

    /// Phase *admit*: an in-flight slot on the first ranked account with room,
    /// waiting in the queue if none has; with the time waited, ms, and the
    /// pool indices of the accounts ahead of it that were full.
    async fn admit(&self, ranked: &Ranked) -> Result<(Lease, u64, Vec<u32>), Refused> {
        let cfg = &self.generation.config.gateway;
        let accounts: Vec<_> = ranked.order.iter().filter_map(|&i| self.generation.account(i)).collect();
        let slots: Vec<Slot<'_>> = accounts.iter().map(|a| (&a.state, a.config.max_in_flight)).collect();
        let queued = self.gw.clock.instant();
        let timeout = Duration::from_millis(cfg.queue_timeout_ms);
        let admitted = self.gw.admission.acquire(&slots, cfg.queue_max, timeout).await?;
        let full = admitted.full.iter().filter_map(|&p| accounts.get(p).map(|a| a.index)).collect();
        Ok((admitted.lease, self.gw.clock.since(queued).as_millis() as u64, full))
    }

    /// Phase *attempt*: the request goes to the leased account, and the answer
    /// is read up to its first body chunk.
    async fn attempt(&mut self, lease: Lease, queued_ms: u64) -> Attempted {
        let account = self
            .generation
            .accounts
            .iter()
            .find(|a| Arc::ptr_eq(&a.state, lease.account()))
            .expect("a lease is on one of this generation's accounts");
        self.tried.push(account.index);
        let n = self.record.attempts.len() as u32;
        let trace = self.record.trace.as_ref().zip(self.gw.telemetry.as_ref());
        let propagate = trace.and_then(|(ids, t)| t.upstream_headers(ids, ids.span_id(trace::upstream_span(n))));
        let send = attempt::Send { account, incoming: &self.incoming, lease, queued_ms, propagate };
        attempt::send(&self.gw, &self.generation, send).await
    }

    /// Phase *learn*: what the answer says about the account (quota, cooldown,
    /// streaks), the attempt's entry in the record, and the accounts passed
    /// over on the way to it (`full`: those admission found at their limit).
    /// Gives back the request the chain saw, for `observe`.
    fn learn(&mut self, ranked: Ranked, full: &[u32], attempted: &Attempted) -> wit::Request {
        let (outcome, status) = attempt::learn(&self.gw, &self.generation, self.family, attempted);
        let tried = match &attempted.how {
            How::Answered(_) => None,
            How::Refused { status, .. } => Some(PassCause::FailedOver(status.as_u16())),
            How::Unreachable(_) => Some(PassCause::NoAnswer),
            How::Broke { .. } => Some(PassCause::Broke),
        };
        let ahead = ahead_of(&ranked, full, attempted.account);
        for (i, cause, until_ms) in ahead.into_iter().chain(tried.map(|c| (attempted.account, c, None))) {
            if let Some(a) = self.generation.account(i) {
                let p = PassedOver { account: a.config.id.clone(), attempt: ranked.attempt, cause, until_ms };
                pass_over(&mut self.record.passed_over, p);
            }
        }
        let account = self.generation.account(attempted.account).map(|a| a.config.id.clone());
        self.record.account.clone_from(&account);
        // Room for this attempt alone: a first push would make room for
        // four, held in the record for as long as the answer streams.
        self.record.attempts.reserve_exact(1);
        self.record.attempts.push(Attempt {
            attempt: ranked.attempt,
            decision: ranked.decision,
            account,
            status,
            outcome,
            queued_ms: attempted.queued_ms,
            upstream_ms: Some(attempted.upstream_ms),
            failure: attempt::failure(&attempted.how),
            at_us: ranked.at_us,
            reading: self.record.trace.as_ref().map(|_| attempted.reading.clone()),
        });
        ranked.request
    }

    /// Phase *commit*: the account's answer streams back through the relay,
    /// which finishes the request when the body ends. For a client that
    /// reads another dialect, a stream is translated as it goes; any other
    /// answer is read whole first, since its status may change with its shape.
    async fn commit(mut self, request: wit::Request, answered: Answered) -> Response {
        let Answered { account, status, mut headers, first, rest, sse, lease } = answered;
        if self.record.trace.is_some() {
            self.record.response_model = trace::response_model(&first);
        }
        upstream::retain_forwardable(&mut headers);
        upstream::integer_retry_after(&mut headers, self.gw.clock.now_ms());
        let length = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
        let observe = Observe::Answer { account, request, status: status.as_u16() };
        let finish = self.into_finish(Some(lease), true, observe);
        let mut head = Response::new(Body::empty());
        *head.status_mut() = status;
        *head.headers_mut() = headers;
        if finish.dialect.is_openai() && !(status.is_success() && sse) {
            // Boxed: only a translated answer waits here, and every request's
            // future would otherwise carry this one's size (it is moved, and
            // copied, whole when the handler's future is boxed).
            return Box::pin(relay::read_whole(finish, head, first, rest)).await;
        }
        relay::respond(finish, head, first, rest, sse, length, false)
    }

    /// The admission queue refused the request: a local 429.
    fn refused(mut self, ranked: Ranked, refused: Refused) -> Response {
        let (outcome, ending, what, msg) = match refused {
            Refused::QueueFull => (
                AttemptOutcome::QueueFull,
                Ending::QueueFull,
                "queue_full",
                "poolgate: every account is at its in-flight limit and the queue is full",
            ),
            Refused::Timeout => (
                AttemptOutcome::QueueTimeout,
                Ending::QueueTimeout,
                "queue_timeout",
                "poolgate: timed out waiting for an account with in-flight room",
            ),
        };
        self.record.attempts.push(local_attempt(ranked.attempt, ranked.decision, outcome, ranked.at_us));
        let mut r = rate_limited(msg, 1_000);
        r.headers_mut().insert("x-poolgate-queue", HeaderValue::from_static(what));
        let observe = self.observe_last();
        self.into_finish(None, false, observe).now(r, ending)
    }

    /// The shutdown grace period ended before the upstream answered: a 503 a
    /// client's SDK retries (on another replica), recorded as `shutdown`.
    fn cut_short(mut self, ranked: Ranked) -> Response {
        let mut attempt = local_attempt(ranked.attempt, ranked.decision, AttemptOutcome::Shutdown, ranked.at_us);
        // The account it was sent to, still thinking.
        attempt.account = self.tried.last().and_then(|&i| self.generation.account(i)).map(|a| a.config.id.to_string());
        self.record.attempts.push(attempt);
        self.gw.metrics.shutdown_cut();
        let r = error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorType::Api,
            "poolgate is shutting down: its shutdown grace period ended before the upstream answered",
        );
        let observe = self.observe_last();
        self.into_finish(None, false, observe).now(r, Ending::Shutdown)
    }

    /// Phase *answer*, when no account is left to try: the cause that stood
    /// in the way, as the status a client can act on ([`unserved`]).
    async fn out_of_accounts(mut self) -> Response {
        let now = self.gw.clock.now_ms();
        let (blocked, usable) = unserved::survey(&self.generation, self.family, &self.record.attempts, now);
        let attempted = self.record.attempts.iter().any(|a| a.account.is_some());
        let verdict = unserved::verdict(&blocked, usable, attempted, now);
        let ending = verdict.ending();
        // A populated pool that cannot serve: the fallback backends, if any
        // (never for an empty pool, which a fallback would only hide).
        let substitutable = matches!(self.api, Api::Messages | Api::ChatCompletions);
        if substitutable && !self.generation.accounts.is_empty() && !self.generation.fallbacks.is_empty() {
            let timeout = Duration::from_millis(self.generation.config.gateway.response_timeout_ms);
            // Boxed, as the translated answer in `commit`: rare, and large.
            let served = self.generation.fallbacks.serve(&*self.gw.http, &self.incoming.body, timeout, &self.gw.clock);
            if let Some((answer, marker)) = Box::pin(served).await {
                self.gw.metrics.fallback(&marker);
                self.record.blocked = blocked;
                self.record.fallback = Some(marker.clone());
                let observe = self.observe_last();
                let finish = self.into_finish(None, false, observe);
                let marked = |mut r: Response| {
                    if let Ok(v) = HeaderValue::from_str(&marker) {
                        r.headers_mut().insert("x-poolgate-fallback", v);
                    }
                    r
                };
                return match answer {
                    Substitute::Whole(body) => {
                        let mut finish = finish;
                        finish.record.usage = poolgate_wire::usage::of_message(&body);
                        let mut r = Response::new(Body::from(body));
                        let json = HeaderValue::from_static("application/json");
                        r.headers_mut().insert(header::CONTENT_TYPE, json);
                        finish.now(marked(r), Ending::Fallback)
                    }
                    Substitute::Stream(events) => {
                        let mut head = marked(Response::new(Body::empty()));
                        head.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
                        relay::respond(finish, head, Bytes::new(), events, true, None, true)
                    }
                };
            }
        }
        self.gw.metrics.unserved(ending.as_str());
        if ending == Ending::Parked {
            self.gw.metrics.parked();
        }
        let last_why = match &self.last {
            Some((Failure::Unreachable { why, .. }, _)) => Some(why.clone()),
            _ => None,
        };
        self.record.blocked = blocked;
        let observe = self.observe_last();
        self.into_finish(None, false, observe).now(verdict.response(last_why.as_deref()), ending)
    }

    /// What the chain hears when the gateway answers itself: how the last
    /// failed attempt went, if there was one.
    fn observe_last(&mut self) -> Observe {
        match self.last.take() {
            Some((failure, request)) => Observe::Known((request, failure.account(), failure.outcome())),
            None => Observe::Nothing,
        }
    }

    /// The request's end, carrying its record.
    fn into_finish(self, lease: Option<Lease>, account_answers: bool, observe: Observe) -> Finish {
        Finish {
            gateway: self.gw,
            generation: self.generation,
            started: self.started,
            record: self.record,
            lease,
            account_answers,
            observe,
            dialect: self.incoming.dialect,
            status: 0,
            done: false,
            key_lease: self.key_lease,
            connection: self.incoming.connection,
        }
    }
}

/// The accounts the chain ranked ahead of `tried` in `ranked`, each with why
/// it was passed over: not usable (as it was when ranked), at its in-flight
/// limit (`full`, as admission found it), or an overflow account moved
/// behind the others. In the chain's order.
pub fn ahead_of(ranked: &Ranked, full: &[u32], tried: u32) -> Vec<Unusable> {
    let chain = ranked.decision.order.indices();
    let Some(at) = chain.iter().position(|&i| i == tried) else { return Vec::new() };
    chain[..at]
        .iter()
        .map(|&i| {
            if let Some((_, cause, until)) = ranked.unusable.iter().find(|(u, _, _)| *u == i) {
                (i, cause.clone(), *until)
            } else if full.contains(&i) {
                (i, PassCause::Full, None)
            } else if ranked.order.contains(&i) {
                // Usable, not full, ranked ahead by the chain yet after the
                // account tried: the overflow partition moved it.
                (i, PassCause::Overflow, None)
            } else {
                (i, PassCause::NotUsable, None)
            }
        })
        .collect()
}

/// The record entry of a rank that reached no account.
fn local_attempt(attempt: u32, decision: Decision, outcome: AttemptOutcome, at_us: u64) -> Attempt {
    let (account, status, upstream_ms, failure, reading) = (None, None, None, None, None);
    Attempt { attempt, decision, account, status, outcome, queued_ms: 0, upstream_ms, failure, at_us, reading }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Order;

    fn ranked(chain: &[u32], usable_order: &[u32], unusable: Vec<Unusable>) -> Ranked {
        let ids: Arc<[String]> = (0..6).map(|i| format!("a{i}")).collect::<Vec<_>>().into();
        let decision = Decision {
            order: Order::new(chain.to_vec(), ids),
            reason: "r".into(),
            detail: None,
            policy_errors: Vec::new(),
            background_errors: Vec::new(),
            stages: Vec::new(),
            duration_us: 0.0,
        };
        let request = wit::Request {
            id: 1,
            now_ms: 0,
            model: String::new(),
            session: None,
            api: wit::ApiShape::Messages,
            attempt: 0,
            replayable: true,
            decided_by: None,
        };
        Ranked { attempt: 0, request, decision, order: usable_order.to_vec(), unusable, at_us: 0 }
    }

    #[test]
    fn accounts_ahead_of_the_one_tried_are_full_unusable_or_overflow() {
        let cooling = (1, PassCause::Cooling(crate::account::CooldownReason::Overloaded), Some(9));
        // Chain: a0 a1 a2 a3 a4; a1 cooling; a2 an overflow key moved last.
        let r = ranked(&[0, 1, 2, 3, 4], &[0, 3, 4, 2], vec![cooling.clone()]);
        assert_eq!(ahead_of(&r, &[0], 3), vec![(0, PassCause::Full, None), cooling, (2, PassCause::Overflow, None)]);
        assert_eq!(ahead_of(&r, &[], 0), vec![], "the head served: nothing passed over");
        assert_eq!(ahead_of(&r, &[], 5), vec![], "not in the order: nothing to say");
    }
}
