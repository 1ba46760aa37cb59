//! Routing and answering: one request in, the account's next step out.
//!
//! Every request goes through [`handle`]: read the body, resolve the credential, record the
//! request (before any delay or failure, so tests can see which account was tried), pop
//! the account's step and play it. Normal replies depend on the endpoint; failures look
//! the same on every endpoint, as they do at Anthropic.
//!
//! The OAuth routes (`/v1/oauth/token`, `/api/oauth/*`) are answered by [`crate::oauth`]
//! instead: they are not scripted, and they are recorded there, not here, so a gateway's
//! background refreshes and usage polls do not disturb [`crate::MockUpstream::served_by`].

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::{get, head, post};
use bytes::Bytes;
use poolgate_wire::error::{self, ErrorType};
use poolgate_wire::message::{Chunking, TextPieces};
use poolgate_wire::{header, ids, message, request};

use crate::chunks::Chunks;
use crate::conn::ConnControl;
use crate::oauth::{self, Access};
use crate::quota;
use crate::reply::{self, CHUNKING};
use crate::script::{Account, Step, Taken};
use crate::{Config, Recorded};

/// Bodies above this are refused; Claude Code sends ~90 KB, long contexts a few MB.
const BODY_LIMIT: usize = 64 << 20;

const REQUEST_ID: HeaderName = HeaderName::from_static(header::REQUEST_ID);
const ORG_ID: HeaderName = HeaderName::from_static(header::ORGANIZATION_ID);
const JSON: HeaderValue = HeaderValue::from_static(header::JSON);
const EVENT_STREAM: HeaderValue = HeaderValue::from_static(header::EVENT_STREAM);

/// State shared by the server task and the [`crate::MockUpstream`] handle.
pub(crate) struct Shared {
    pub config: Config,
    pub oauth: Arc<oauth::Authority>,
    accounts: Mutex<HashMap<String, Account>>,
    records: Mutex<Vec<Recorded>>,
    /// The usage of every whole Messages reply, in order.
    pub reported: Mutex<Vec<poolgate_wire::usage::Usage>>,
    ids: AtomicU64,
}

impl Shared {
    pub fn new(config: Config) -> Shared {
        Shared {
            config,
            oauth: Arc::default(),
            accounts: Mutex::new(HashMap::new()),
            records: Mutex::new(Vec::new()),
            reported: Mutex::new(Vec::new()),
            ids: AtomicU64::new(1),
        }
    }

    /// The account for `credential`, creating it.
    pub fn account(&self, credential: &str) -> Account {
        let mut accounts = self.accounts.lock();
        if let Some(account) = accounts.get(credential) {
            return account.clone();
        }
        let account = Account::new(credential, self.config.default_quota.as_ref());
        accounts.insert(credential.to_owned(), account.clone());
        account
    }

    /// The account for `credential` if it is registered (or any credential is accepted).
    fn lookup(&self, credential: &str) -> Option<Account> {
        if self.config.accept_any {
            return Some(self.account(credential));
        }
        self.accounts.lock().get(credential).cloned()
    }

    /// Who `credential` is: a seat's OAuth access token first (so that `accept_any` does
    /// not turn an expired one into a fresh account), then a registered account.
    fn caller(&self, credential: &str) -> Caller {
        match self.oauth.access(credential, oauth::now_ms()) {
            Some(Access::Valid { account, org, .. }) => Caller::Account { account, org: Some(org) },
            Some(Access::Expired) => Caller::Expired,
            None => self.lookup(credential).map_or(Caller::Unknown, |account| Caller::Account { account, org: None }),
        }
    }

    pub fn records(&self) -> MutexGuard<'_, Vec<Recorded>> {
        self.records.lock()
    }

    /// A unique id with an Anthropic-looking prefix (`req_`, `msg_`, `toolu_`).
    fn id(&self, prefix: &str) -> String {
        ids::numbered(prefix, "01mock", self.ids.fetch_add(1, Ordering::Relaxed))
    }

    fn request_id(&self) -> HeaderValue {
        HeaderValue::try_from(self.id("req_")).expect("ids are ASCII")
    }
}

/// Who sent a request.
enum Caller {
    /// A registered account, or a seat's live access token (then with the seat's
    /// organization id, which overrides the account's).
    Account { account: Account, org: Option<HeaderValue> },
    /// An access token the OAuth authority issued, past its expiry.
    Expired,
    /// No credential, or one nobody issued.
    Unknown,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Messages,
    CountTokens,
    Models,
    Probe,
    NotFound,
}

/// The routes Anthropic's API (and Claude Code's probes) use.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/models", get(models))
        .route("/", head(probe))
        .route("/api/hello", head(probe))
        .route("/v1/oauth/token", post(oauth_token))
        .route("/api/oauth/usage", get(oauth_usage))
        .route("/api/oauth/profile", get(oauth_profile))
        .fallback(not_found)
        .method_not_allowed_fallback(not_found)
        .with_state(shared)
}

async fn messages(State(s): State<Arc<Shared>>, req: Request) -> Response {
    handle(s, Endpoint::Messages, req).await
}
async fn count_tokens(State(s): State<Arc<Shared>>, req: Request) -> Response {
    handle(s, Endpoint::CountTokens, req).await
}
async fn models(State(s): State<Arc<Shared>>, req: Request) -> Response {
    handle(s, Endpoint::Models, req).await
}
async fn probe(State(s): State<Arc<Shared>>, req: Request) -> Response {
    handle(s, Endpoint::Probe, req).await
}
async fn not_found(State(s): State<Arc<Shared>>, req: Request) -> Response {
    handle(s, Endpoint::NotFound, req).await
}

/// Token requests are small forms; anything near this is not one.
const TOKEN_BODY_LIMIT: usize = 64 << 10;

async fn oauth_token(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let request_id = s.request_id();
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, TOKEN_BODY_LIMIT).await else {
        return error(&request_id, ErrorType::RequestTooLarge, error::TOO_LARGE);
    };
    oauth::token(&s.oauth, &parts.headers, &body, &request_id).await
}
async fn oauth_usage(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    oauth::usage(&s.oauth, &headers, &s.request_id())
}
async fn oauth_profile(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    oauth::profile(&s.oauth, &headers, &s.request_id())
}

/// `x-api-key` first, then `authorization: Bearer`.
fn credential(headers: &HeaderMap) -> Option<&str> {
    match headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        Some(key) => Some(key),
        None => bearer(headers),
    }
}

/// The token of `authorization: Bearer <token>`.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let auth = headers.get("authorization")?.to_str().ok()?;
    let (scheme, token) = auth.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Everything one request's answer depends on.
struct Ctx {
    shared: Arc<Shared>,
    endpoint: Endpoint,
    body: Bytes,
    control: Option<Arc<ConnControl>>,
    account: Account,
    taken: Taken,
    request_id: HeaderValue,
}

async fn handle(shared: Arc<Shared>, endpoint: Endpoint, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let request_id = shared.request_id();
    let Ok(body) = axum::body::to_bytes(body, BODY_LIMIT).await else {
        return error(&request_id, ErrorType::RequestTooLarge, error::TOO_LARGE);
    };
    let caller = credential(&parts.headers).map_or(Caller::Unknown, |c| shared.caller(c));
    if shared.config.record {
        shared.records().push(record(&parts, &caller, &body));
    }
    match endpoint {
        // Probes are answered cheaply and without a credential: an auth error here makes
        // Claude Code retry for minutes.
        Endpoint::Probe => return respond_empty(&request_id),
        Endpoint::NotFound => return error(&request_id, ErrorType::NotFound, "Not found"),
        _ => {}
    }
    let (account, org) = match caller {
        // A seat's token without the OAuth beta flag is refused, as Anthropic
        // refuses it: the flag may sit on any `anthropic-beta` line.
        Caller::Account { org: Some(_), .. }
            if matches!(endpoint, Endpoint::Messages | Endpoint::CountTokens) && !has_oauth_beta(&parts.headers) =>
        {
            return error(&request_id, ErrorType::Authentication, OAUTH_NOT_SUPPORTED);
        }
        Caller::Account { account, org } => (account, org),
        Caller::Expired => return error(&request_id, ErrorType::Authentication, oauth::EXPIRED),
        Caller::Unknown => return error(&request_id, ErrorType::Authentication, error::INVALID_API_KEY),
    };
    let mut taken = account.take();
    if let Some(org) = org {
        taken.org = org;
    }
    let step = taken.step.clone();
    let ctx = Ctx {
        control: parts.extensions.get::<Arc<ConnControl>>().cloned(),
        shared,
        endpoint,
        body,
        account,
        taken,
        request_id,
    };
    if ctx.shared.config.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(ctx.shared.config.latency_ms)).await;
    }
    play(&ctx, step).await
}

/// Anthropic's answer to an OAuth access token sent without the OAuth beta flag.
pub const OAUTH_NOT_SUPPORTED: &str = "OAuth authentication is currently not supported.";

/// Whether any `anthropic-beta` line names the OAuth flag.
fn has_oauth_beta(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|f| f.trim() == "oauth-2025-04-20")
}

/// The request as [`crate::MockUpstream::requests`] shows it.
fn record(parts: &axum::http::request::Parts, caller: &Caller, body: &Bytes) -> Recorded {
    let credential = match caller {
        Caller::Account { account, .. } => account.credential().to_owned(),
        Caller::Expired | Caller::Unknown => String::new(),
    };
    let bearer = match parts.headers.contains_key("x-api-key") {
        true => None,
        false => bearer(&parts.headers).map(str::to_owned),
    };
    Recorded {
        method: parts.method.to_string(),
        path: parts.uri.path_and_query().map_or_else(|| parts.uri.path().to_owned(), |p| p.to_string()),
        credential,
        bearer,
        headers: parts
            .headers
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect(),
        body: body.clone(),
    }
}

/// Plays one step. Boxed because [`Step::Delay`] nests steps.
fn play<'a>(ctx: &'a Ctx, step: Step) -> std::pin::Pin<Box<dyn Future<Output = Response> + Send + 'a>> {
    Box::pin(async move {
        let default_gap = Duration::from_millis(ctx.shared.config.chunk_delay_ms);
        match step {
            Step::Ok => reply(ctx, None, default_gap, None),
            Step::Text(text) => reply(ctx, Some(&text), default_gap, None),
            Step::SlowStream { chunk_delay_ms } => {
                let gap = Duration::from_millis(chunk_delay_ms);
                if !wants_stream(ctx) {
                    tokio::time::sleep(gap).await;
                }
                reply(ctx, None, gap, None)
            }
            Step::ResetMidStream { after_events } => reply(ctx, None, default_gap, Some(after_events)),
            Step::LongStream { deltas, delta_bytes } => {
                // Words of six bytes, as many to a delta as fill it.
                let words = (delta_bytes / 6).max(1);
                let text = "lorem ".repeat(words * deltas.max(1));
                let chunking = Chunking { text: TextPieces::Words(words), json_parts: 4 };
                reply_chunked(ctx, Some(&text), default_gap, None, &chunking)
            }
            Step::RateLimited { unified, retry_after } => rate_limited(ctx, unified, retry_after),
            Step::Overloaded => account_error(ctx, 529, ErrorType::Overloaded, "Overloaded"),
            Step::ServerError(status) => account_error(ctx, status, ErrorType::Api, "Internal server error"),
            Step::Status { status, body, headers } => custom(ctx, status, body, headers),
            Step::Delay { ms, then } => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                play(ctx, *then).await
            }
            Step::ResetBeforeResponse => {
                match &ctx.control {
                    Some(control) => control.abort(),
                    None => {
                        eprintln!("poolgate-mock-upstream: no connection to reset; hanging instead")
                    }
                }
                std::future::pending().await
            }
            Step::Hang => std::future::pending().await,
        }
    })
}

/// Whether a normal reply would be SSE: only a well-formed streaming Messages request.
fn wants_stream(ctx: &Ctx) -> bool {
    ctx.endpoint == Endpoint::Messages && reply::parse_messages(&ctx.body).is_ok_and(|ask| ask.stream)
}

/// The endpoint's normal reply, optionally spaced out by `gap` (SSE only) or cut after
/// `cut` events (or half the body, for JSON).
fn reply(ctx: &Ctx, text: Option<&str>, gap: Duration, cut: Option<usize>) -> Response {
    reply_chunked(ctx, text, gap, cut, &CHUNKING)
}

/// [`reply`], with the SSE text split as `chunking` says.
fn reply_chunked(ctx: &Ctx, text: Option<&str>, gap: Duration, cut: Option<usize>, chunking: &Chunking) -> Response {
    let (body, stream) = match ctx.endpoint {
        Endpoint::Messages => match reply::parse_messages(&ctx.body) {
            Ok(ask) => {
                let stream = ask.stream;
                let reply = reply::reply(ask, text, &|prefix| ctx.shared.id(prefix));
                if cut.is_none() {
                    ctx.shared.reported.lock().push(poolgate_wire::usage::Usage {
                        input_tokens: reply.input_tokens,
                        output_tokens: reply.output_tokens,
                        cache_read_input_tokens: reply.cache_read_input_tokens,
                        cache_creation_input_tokens: reply.cache_creation_input_tokens,
                    });
                }
                if stream {
                    (Err(reply.events(chunking).into_iter().map(Bytes::from).collect()), true)
                } else {
                    (Ok(Bytes::from(reply.to_json())), false)
                }
            }
            Err(msg) => return account_error(ctx, 400, ErrorType::InvalidRequest, &msg),
        },
        Endpoint::CountTokens => {
            let count = message::count_tokens_body(request::estimate_input_tokens(&ctx.body));
            (Ok(Bytes::from(count)), false)
        }
        _ => (Ok(reply::models_body()), false),
    };
    let cut = cut.and_then(|after| Some((after, ctx.control.clone()?)));
    let mut response = match (body, cut) {
        (Ok(json), None) => Response::new(Body::from(json)),
        (Ok(json), Some((_, control))) => {
            // Promise the whole body, send half: the client sees a truncated message.
            let len = json.len();
            let half = json.slice(..len / 2);
            let mut r = Response::new(Body::from_stream(Chunks::new(vec![half], gap, Some((1, control)))));
            r.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(len));
            r
        }
        (Err(events), cut) => Response::new(Body::from_stream(Chunks::new(events, gap, cut))),
    };
    let headers = response.headers_mut();
    if stream {
        headers.insert(CONTENT_TYPE, EVENT_STREAM);
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    } else {
        headers.insert(CONTENT_TYPE, JSON);
    }
    account_headers(ctx, headers, &ctx.taken.quota_headers);
    response
}

/// `request-id`, the organization and the quota headers, on every account response.
fn account_headers(ctx: &Ctx, headers: &mut HeaderMap, quota: &[(HeaderName, HeaderValue)]) {
    headers.insert(REQUEST_ID, ctx.request_id.clone());
    headers.insert(ORG_ID, ctx.taken.org.clone());
    for (name, value) in quota {
        headers.append(name.clone(), value.clone());
    }
}

fn rate_limited(ctx: &Ctx, unified: bool, retry_after: Option<String>) -> Response {
    let mut response;
    if unified {
        let rejected = quota::render(&quota::rejected(&ctx.account.quota()));
        response = json_response(429, body(ErrorType::RateLimit, error::RATE_LIMITED));
        account_headers(ctx, response.headers_mut(), &rejected);
    } else {
        // The bare burst limit: no rate-limit headers at all, and Anthropic's bare message.
        response = json_response(429, body(ErrorType::RateLimit, "Error"));
        response.headers_mut().insert(REQUEST_ID, ctx.request_id.clone());
        response.headers_mut().insert(ORG_ID, ctx.taken.org.clone());
    }
    if let Some(value) = retry_after {
        let value = HeaderValue::try_from(value).expect("retry-after must be a valid header value");
        response.headers_mut().insert(RETRY_AFTER, value);
    }
    response
}

fn account_error(ctx: &Ctx, status: u16, kind: ErrorType, message: &str) -> Response {
    let mut response = json_response(status, body(kind, message));
    account_headers(ctx, response.headers_mut(), &ctx.taken.quota_headers);
    response
}

fn custom(ctx: &Ctx, status: u16, body: serde_json::Value, extra: Vec<(String, String)>) -> Response {
    let (body, content_type) = match body {
        serde_json::Value::Null => (Bytes::new(), None),
        serde_json::Value::String(raw) => (Bytes::from(raw), Some(HeaderValue::from_static("text/plain"))),
        json => (Bytes::from(json.to_string()), Some(JSON)),
    };
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status_code(status);
    let headers = response.headers_mut();
    if let Some(content_type) = content_type {
        headers.insert(CONTENT_TYPE, content_type);
    }
    account_headers(ctx, headers, &ctx.taken.quota_headers);
    for (name, value) in extra {
        let n = HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
            .unwrap_or_else(|e| panic!("invalid header name `{name}` in Step::Status: {e}"));
        let v = HeaderValue::try_from(value.as_str())
            .unwrap_or_else(|e| panic!("invalid value for header `{name}` in Step::Status: {e}"));
        headers.insert(n, v);
    }
    response
}

fn json_response(status: u16, body: Bytes) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status_code(status);
    response.headers_mut().insert(CONTENT_TYPE, JSON);
    response
}

/// An error body; the mock's carry no `request_id` field (the header has it).
fn body(kind: ErrorType, message: &str) -> Bytes {
    error::body(kind, message, None).into()
}

/// An error that no account answered (no or unknown credential, unknown path).
fn error(request_id: &HeaderValue, kind: ErrorType, message: &str) -> Response {
    let mut response = json_response(kind.status(), body(kind, message));
    response.headers_mut().insert(REQUEST_ID, request_id.clone());
    response
}

fn respond_empty(request_id: &HeaderValue) -> Response {
    let mut response = Response::new(Body::empty());
    response.headers_mut().insert(REQUEST_ID, request_id.clone());
    response
}

fn status_code(status: u16) -> StatusCode {
    StatusCode::from_u16(status).unwrap_or_else(|_| panic!("invalid HTTP status {status} in a step"))
}
