//! The simulator's HTTP surface: `POST /v1/messages`, `POST
//! /v1/messages/count_tokens`, `GET /v1/models[/{id}]`, answered per account
//! (found by its key) from that account's ledger.
//!
//! A Messages request is admitted or refused by the ledger *before* any delay,
//! and an admitted one is charged at once — input tokens from the request's
//! size, output tokens from the reply it will get — so concurrent requests see
//! each other's spending as they would upstream. The answer then takes the
//! scenario's time to first byte and per-event gaps, during which the request
//! counts as in flight.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::{get, post};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use parking_lot::Mutex;
use poolgate_wire::error::{self, ErrorType};
use poolgate_wire::{header as wire_header, ids, message, models, request};

use super::quota::Ledger;
use super::reply::{self, CHUNKING, MODELS};
use super::scenario::Scenario;
use crate::account::model_family;
use crate::clock::Clock;
use crate::config::Secret;
use crate::gateway::auth;
use crate::random::splitmix;

/// Bodies above this are refused, as upstream does; Claude Code sends ~90 KB a
/// turn and a few MB with images.
const BODY_LIMIT: usize = 32 << 20;

/// One simulated account's live state.
pub(crate) struct Account {
    /// Its scenario name.
    pub name: String,
    /// Its scenario note.
    pub note: String,
    /// The key it answers to.
    pub key: Secret,
    /// A stable fake organization id: real answers carry one on every response.
    pub organization: String,
    /// Its quota; locked only for the admit-and-charge step, never across a wait.
    pub ledger: Mutex<Ledger>,
    /// Messages requests admitted.
    pub served: AtomicU64,
    /// Messages requests refused with a 429.
    pub refused: AtomicU64,
    /// Replies being sent now.
    pub in_flight: AtomicU32,
}

/// What the server task and the [`super::SimUpstream`] handle share.
pub(crate) struct Shared {
    pub scenario: Scenario,
    /// Accounts in scenario order.
    pub accounts: Vec<Arc<Account>>,
    by_key: HashMap<String, Arc<Account>>,
    next_id: AtomicU64,
    seed: u64,
    /// OAuth seats' tokens (see [`super::oauth`]).
    pub tokens: super::oauth::Tokens<Account>,
    /// Where windows and tokens read the time.
    pub clock: Clock,
}

impl Shared {
    pub fn new(scenario: Scenario, accounts: Vec<Arc<Account>>, seed: u64, clock: Clock) -> Shared {
        let by_key = accounts.iter().map(|a| (a.key.expose().to_string(), a.clone())).collect();
        Shared { scenario, accounts, by_key, next_id: AtomicU64::new(1), seed, tokens: Default::default(), clock }
    }

    /// The account whose key (or live OAuth token) the request presents.
    fn authenticate(&self, headers: &HeaderMap) -> Option<Arc<Account>> {
        let presented = auth::presented(headers)?;
        if let Some(a) = self.by_key.get(presented) {
            return Some(a.clone());
        }
        match super::oauth::bearer(&self.tokens, presented, self.clock.now_ms()) {
            super::oauth::Bearer::Live(a) => Some(a),
            _ => None,
        }
    }

    /// Whether the request presents one of our OAuth tokens past its expiry.
    fn expired(&self, headers: &HeaderMap) -> bool {
        auth::presented(headers).is_some_and(|t| {
            matches!(super::oauth::bearer(&self.tokens, t, self.clock.now_ms()), super::oauth::Bearer::Expired)
        })
    }

    /// A fresh number, and a pseudo-random value derived from it: replies and
    /// delays vary per request yet a run stays reproducible from its seed.
    fn next(&self) -> (u64, u64) {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        (n, splitmix(self.seed ^ n))
    }
}

/// The router.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/oauth/token", post(token))
        .fallback(not_found)
        .with_state(shared)
}

/// Keeps the in-flight count of an account up for as long as it lives — until
/// the reply's last byte, or until the client goes away.
struct InFlight(Arc<Account>);

impl InFlight {
    fn enter(account: Arc<Account>) -> InFlight {
        account.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(account)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The simulator's ids: `req_sim…`, `msg_sim…`, `toolu_sim…`.
/// `POST /v1/oauth/token`: the simulator's OAuth authority ([`super::oauth`]).
async fn token(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    super::oauth::refresh_grant(&s.tokens, &body, s.clock.now_ms(), |a: &Account| a.organization.clone())
}

fn sim_id(prefix: &str, n: u64) -> String {
    ids::numbered(prefix, "sim", n)
}

fn request_id(n: u64) -> String {
    sim_id("req_", n)
}

/// An error in Anthropic's shape, with the `request_id` in the body and the header.
fn error(kind: ErrorType, message: &str, rid: &str) -> Response {
    let mut r = json(error::body(kind, message, Some(rid)).into(), rid);
    *r.status_mut() = StatusCode::from_u16(kind.status()).expect("Anthropic's statuses are valid");
    r
}

fn unauthorized(rid: &str) -> Response {
    error(ErrorType::Authentication, error::INVALID_API_KEY, rid)
}

async fn read_body(body: Body, rid: &str) -> Result<Bytes, Response> {
    axum::body::to_bytes(body, BODY_LIMIT).await.map_err(|_| error(ErrorType::RequestTooLarge, error::TOO_LARGE, rid))
}

fn with_headers(mut r: Response, account: &Account, rid: &str, quota: Vec<(String, String)>) -> Response {
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(rid) {
        h.insert(wire_header::REQUEST_ID, v);
    }
    if let Ok(v) = HeaderValue::from_str(&account.organization) {
        h.insert(wire_header::ORGANIZATION_ID, v);
    }
    for (name, value) in quota {
        if let (Ok(n), Ok(v)) = (http::HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(&value)) {
            h.insert(n, v);
        }
    }
    r
}

async fn messages(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Body) -> Response {
    let (n, random) = s.next();
    let rid = request_id(n);
    let Some(account) = s.authenticate(&headers) else {
        if s.expired(&headers) {
            let expired = "OAuth token has expired. Please obtain a new token or refresh your existing token.";
            return error(ErrorType::Authentication, expired, &rid);
        }
        return unauthorized(&rid);
    };
    let body = match read_body(body, &rid).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let ask = match reply::parse_messages(&body) {
        Ok(a) => a,
        Err(m) => return error(ErrorType::InvalidRequest, &m, &rid),
    };
    let Some(family) = model_family(&ask.model) else {
        return error(ErrorType::NotFound, &format!("model: {}", ask.model), &rid);
    };
    let latency = s.scenario.latency;
    let (low, high) = (*s.scenario.reply_words.start(), *s.scenario.reply_words.end());
    let words = low + (random % u64::from(high.saturating_sub(low) + 1)) as u32;
    let reply = reply::reply(
        &ask,
        sim_id("msg_", n),
        sim_id("toolu_", n),
        request::estimate_input_tokens(&body),
        words,
        random >> 32,
    );

    let now = s.clock.now_ms();
    let quota = match admit(&account, family, &reply, now) {
        Ok(q) => q,
        Err(q) => {
            account.refused.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(latency.rejection).await;
            return with_headers(error(ErrorType::RateLimit, error::RATE_LIMITED, &rid), &account, &rid, q);
        }
    };
    account.served.fetch_add(1, Ordering::Relaxed);
    let guard = InFlight::enter(account.clone());
    let jitter = latency.jitter.mul_f64((random >> 11) as f64 / (1u64 << 53) as f64);
    tokio::time::sleep(latency.first_byte + jitter).await;

    let response = respond(&reply, ask.stream, latency.per_event, guard).await;
    with_headers(response, &account, &rid, quota)
}

/// Quota headers, as (name, value) pairs.
type QuotaHeaders = Vec<(String, String)>;

/// Admits a request on `account`'s ledger and charges the reply's tokens; the
/// quota headers either way, a refusal's naming what refused.
fn admit(account: &Account, family: &str, reply: &message::Reply, now: u64) -> Result<QuotaHeaders, QuotaHeaders> {
    let mut ledger = account.ledger.lock();
    match ledger.admit(Some(family), now) {
        Ok(()) => {
            ledger.charge(Some(family), reply.tokens(), now);
            Ok(ledger.headers(Some(family), None))
        }
        Err(refusal) => Err(ledger.headers(Some(family), Some(&refusal))),
    }
}

/// The reply as events `gap` apart, or as JSON once the whole message would
/// have been generated; `guard` keeps the request in flight until then.
async fn respond(reply: &message::Reply, stream: bool, gap: Duration, guard: InFlight) -> Response {
    let events: Vec<Bytes> = reply.events(&CHUNKING).into_iter().map(Bytes::from).collect();
    if stream {
        let stream = futures_util::stream::unfold(
            (events.into_iter(), true, guard),
            move |(mut events, first, guard)| async move {
                let event = events.next()?;
                if !first && !gap.is_zero() {
                    tokio::time::sleep(gap).await;
                }
                Some((Ok::<Bytes, Infallible>(event), (events, false, guard)))
            },
        );
        let mut r = Response::new(Body::from_stream(stream));
        let h = r.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(wire_header::EVENT_STREAM));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static(wire_header::NO_CACHE));
        r
    } else {
        // A JSON reply arrives once the whole message would have been generated.
        tokio::time::sleep(gap * events.len().saturating_sub(1) as u32).await;
        drop(guard);
        let mut r = Response::new(Body::from(reply.to_json()));
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(wire_header::JSON));
        r
    }
}

async fn count_tokens(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Body) -> Response {
    let rid = request_id(s.next().0);
    if s.authenticate(&headers).is_none() {
        return unauthorized(&rid);
    }
    let body = match read_body(body, &rid).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    if let Err(p) = request::check_count_tokens(&body) {
        return error(ErrorType::InvalidRequest, &p, &rid);
    }
    json(message::count_tokens_body(request::estimate_input_tokens(&body)).into(), &rid)
}

async fn models(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let rid = request_id(s.next().0);
    if s.authenticate(&headers).is_none() {
        return unauthorized(&rid);
    }
    json(models::page(MODELS).into(), &rid)
}

async fn model(State(s): State<Arc<Shared>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let rid = request_id(s.next().0);
    if s.authenticate(&headers).is_none() {
        return unauthorized(&rid);
    }
    match MODELS.iter().find(|m| m.id == id) {
        Some(m) => json(models::object(m).into(), &rid),
        None => error(ErrorType::NotFound, &format!("model: {id}"), &rid),
    }
}

fn json(body: Bytes, rid: &str) -> Response {
    let mut r = Response::new(Body::from(body));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(wire_header::JSON));
    if let Ok(v) = HeaderValue::from_str(rid) {
        h.insert(wire_header::REQUEST_ID, v);
    }
    r
}

async fn not_found(State(s): State<Arc<Shared>>) -> Response {
    error(ErrorType::NotFound, "Not Found", &request_id(s.next().0))
}
