//! The HTTP surface: the Anthropic API routes, health, status, metrics and admin.
//!
//! API routes need a client key when keys are configured; `/status` and
//! `/admin/*` need the admin token; `/healthz`, `/readyz`, `/metrics` and the
//! cheap probes Claude Code sends without a credential (`HEAD /`,
//! `HEAD /api/hello`) stay open. No route ever shows a secret.

use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;

pub use super::handlers::AppState;
use super::handlers::{admin_refused, json};
use crate::gateway::Gateway;
use crate::gateway::reload::{ReloadError, ReloadRequest};
use crate::gateway::request::dialect::{self, Dialect};
use crate::gateway::request::errors::{ErrorType, error, final_error};
use crate::gateway::request::finish::Early;
use crate::gateway::request::read::Connection;
use crate::gateway::request::{Api, Incoming, forward};

/// Builds the router.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(models))
        .route("/v1/usage", get(super::usage::client_usage))
        .route("/", get(probe).head(probe))
        .route("/api/hello", get(probe).head(probe))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(super::scrape::metrics))
        .route("/status", get(status))
        .route("/ui", get(super::ui::page))
        .route("/ui/app.js", get(super::ui::script))
        .route("/ui/app.css", get(super::ui::style))
        .route("/ui/events", get(super::ui::events::events))
        .route("/ui/sign-in", post(super::ui::sign_in))
        .route("/admin/decisions", get(decisions))
        .route("/admin/usage", get(super::usage::admin_usage))
        .route("/admin/keys", get(super::keys::list).post(super::keys::create))
        .route("/admin/keys/{name}", post(super::keys::change))
        .route("/admin/keys/{name}/{action}", post(super::keys::act))
        .route("/admin/reload", post(reload))
        .route("/admin/accounts/{id}/{action}", post(account_action))
        .fallback(not_found)
        .method_not_allowed_fallback(wrong_method)
        .with_state(state)
}

/// Serves an API route: the client key, the body read, the request in the
/// client's dialect translated to Anthropic's, then the phases ([`forward`]).
/// A refusal here is written in the client's dialect too.
async fn api(state: AppState, api: Api, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let (method, uri, mut headers) = (parts.method, parts.uri, parts.headers);
    // The connection it came on (the server puts it there), asked at the
    // request's end if its answer is dropped early.
    let connection = parts.extensions.get::<Connection>().cloned();
    let gw = state.gateway;
    let early = Early { id: gw.next_request_id(), method: &method, path: uri.path(), started: gw.clock.instant() };
    let dialect = match api {
        Api::ChatCompletions => Dialect::Chat(Default::default()),
        Api::Models if dialect::openai_models(&mut headers) => Dialect::Models,
        _ => Dialect::Anthropic,
    };
    let refuse = |reason, r, client: Option<&str>| early.refuse_from(&gw, reason, client, dialect.whole(r));
    let generation = gw.generation();
    let client = match crate::gateway::keys::identify(&gw, &generation, &headers) {
        Ok(client) => client,
        Err(r) => return refuse("client_key", *r, None),
    };
    if method == Method::POST
        && let Some(refused) = not_json(&headers)
    {
        return refuse("unsupported_media_type", refused, None);
    }
    let server = &generation.config.server;
    let timeout = std::time::Duration::from_millis(server.body_timeout_ms);
    let body = match read_body(&headers, body, server.max_body_mb << 20, (early.started, timeout), &gw.clock).await {
        Ok(b) => b,
        Err((reason, refused)) => return refuse(reason, refused, None),
    };
    let id = early.id;
    let (body, uri, dialect) = if api == Api::ChatCompletions {
        let aliases = &generation.config.models.aliases;
        match dialect::translate_request(&body, &mut headers, aliases, gw.clock.now_ms()) {
            Ok((body, uri, facts)) => (body, uri, Dialect::Chat(facts)),
            // Already in OpenAI's shape.
            Err(refused) => return early.refuse_from(&gw, "invalid_chat_request", client.as_deref(), *refused),
        }
    } else {
        (body, uri, dialect)
    };
    drop(generation);
    forward(gw, api, Incoming { id, method, uri, headers, body, client, dialect, connection }).await
}

/// The 415 for a POST whose body is not declared `application/json` (any
/// parameters, any case): the body is read as JSON and forwarded as such, so
/// anything else is refused before it costs a round trip.
fn not_json(headers: &HeaderMap) -> Option<Response> {
    let declared = headers.get(http::header::CONTENT_TYPE).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let essence = declared.as_deref().map(|v| v.split(';').next().unwrap_or("").trim());
    if essence.is_some_and(|e| e.eq_ignore_ascii_case("application/json")) {
        return None;
    }
    let msg = match declared {
        Some(d) => format!("poolgate: the request body must be JSON (content-type: application/json), not `{d}`"),
        None => "poolgate: the request body must be JSON: send content-type: application/json".to_string(),
    };
    Some(final_error(StatusCode::UNSUPPORTED_MEDIA_TYPE, ErrorType::InvalidRequest, &msg))
}

/// Reads the whole body, at most `limit` bytes, within `timeout` of `started`
/// (when the head arrived; a client that
/// sends slower holds a connection and a task: `server.body_timeout_ms`). Past
/// the size, the 413; past the deadline, a 408 that closes the connection
/// (the rest of the body may still be on its way). The refusal comes with its
/// reason for `poolgate_refused_total`.
async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    (started, timeout): (Instant, std::time::Duration),
    clock: &crate::clock::Clock,
) -> Result<bytes::Bytes, (&'static str, Response)> {
    let deadline = started + timeout;
    let declared =
        headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok());
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorType::RequestTooLarge,
            &format!("poolgate: request body exceeds the {} MiB limit (server.max_body_mb)", limit >> 20),
        )
    };
    let close = |mut r: Response| {
        r.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
        r
    };
    if let Some(n) = declared.filter(|n| *n > limit) {
        // Read (and drop) a moderately oversized body first: answering while the
        // client is still sending makes many clients see a reset instead of 413.
        if n <= limit.saturating_mul(8) {
            let drain = deadline.min(clock.instant() + std::time::Duration::from_secs(10));
            // Read and let go, chunk by chunk: never held whole.
            let discard = async {
                let mut chunks = body.into_data_stream();
                let mut seen = 0;
                while let Some(Ok(chunk)) = futures_util::StreamExt::next(&mut chunks).await {
                    seen += chunk.len();
                    if seen >= n {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout_at(drain.into(), discard).await;
        }
        return Err(("body_too_large", close(too_large())));
    }
    match tokio::time::timeout_at(deadline.into(), axum::body::to_bytes(body, limit)).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(_)) => Err(("body_too_large", too_large())),
        Err(_) => {
            let msg = format!(
                "poolgate: the request body did not arrive within {} ms (server.body_timeout_ms)",
                timeout.as_millis()
            );
            Err(("body_timeout", close(error(StatusCode::REQUEST_TIMEOUT, ErrorType::InvalidRequest, &msg))))
        }
    }
}

async fn messages(State(s): State<AppState>, req: Request) -> Response {
    api(s, Api::Messages, req).await
}

async fn chat_completions(State(s): State<AppState>, req: Request) -> Response {
    api(s, Api::ChatCompletions, req).await
}

async fn count_tokens(State(s): State<AppState>, req: Request) -> Response {
    api(s, Api::CountTokens, req).await
}

/// `GET /v1/models`: Anthropic's list, or OpenAI's for a client that sends no
/// `anthropic-version` (see `dialect`).
async fn models(State(s): State<AppState>, req: Request) -> Response {
    api(s, Api::Models, req).await
}

/// Claude Code's reachability probes: answered at once, never with an auth error
/// (which would make it retry).
async fn probe() -> &'static str {
    "poolgate"
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(s): State<AppState>) -> Response {
    // A shutdown began: a load balancer should send nothing new here.
    if s.gateway.lifecycle.draining() {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response();
    }
    let g = s.gateway.generation();
    if g.accounts.is_empty() {
        return (StatusCode::SERVICE_UNAVAILABLE, "no accounts configured").into_response();
    }
    (StatusCode::OK, "ready").into_response()
}

/// How many headers a request may carry: past it, or past
/// `server.max_header_bytes`, poolgate answers 431 itself, in Anthropic's error
/// shape and with a request id. (Claude Code sends about 20 headers, well
/// under 8 KiB.) The HTTP server's own limits sit above these
/// ([`SERVER_HEAD_BYTES`]), as a backstop.
pub const MAX_HEADERS: usize = 100;

/// What the HTTP server buffers of a request head: twice the largest
/// `server.max_header_bytes`, so that any head up to there is refused by
/// poolgate (with a body that says why) rather than by hyper (with none).
pub const SERVER_HEAD_BYTES: usize = 2 * crate::config::schema::MAX_HEADER_BYTES as usize;

/// The 431 for a request whose headers exceed [`MAX_HEADERS`] or
/// `server.max_header_bytes` (names, values, and `: ` and CRLF, as on the
/// wire); `None` for any other.
pub fn oversized_head(gw: &Gateway, method: &Method, uri: &Uri, headers: &HeaderMap) -> Option<Response> {
    let limit = gw.generation().config.server.max_header_bytes;
    let bytes: usize = headers.iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum();
    let reason = if headers.len() > MAX_HEADERS {
        "too_many_headers"
    } else if bytes > limit {
        "headers_too_large"
    } else {
        return None;
    };
    let msg = format!(
        "poolgate: the request headers are too large ({} headers, {bytes} bytes; the limit is {MAX_HEADERS} headers, \
         {limit} bytes: server.max_header_bytes)",
        headers.len(),
    );
    let r = final_error(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, ErrorType::InvalidRequest, &msg);
    let early = Early { id: gw.next_request_id(), method, path: uri.path(), started: gw.clock.instant() };
    Some(early.refuse(gw, reason, r))
}

async fn not_found(State(s): State<AppState>, method: Method, uri: Uri) -> Response {
    let r = error(StatusCode::NOT_FOUND, ErrorType::NotFound, &format!("poolgate: no route for {}", uri.path()));
    let early = Early {
        id: s.gateway.next_request_id(),
        method: &method,
        path: uri.path(),
        started: s.gateway.clock.instant(),
    };
    early.refuse(&s.gateway, "not_found", r)
}

async fn wrong_method(State(s): State<AppState>, method: Method, uri: Uri) -> Response {
    let msg = format!("poolgate: {method} is not allowed on {}", uri.path());
    let r = final_error(StatusCode::METHOD_NOT_ALLOWED, ErrorType::InvalidRequest, &msg);
    let early = Early {
        id: s.gateway.next_request_id(),
        method: &method,
        path: uri.path(),
        started: s.gateway.clock.instant(),
    };
    early.refuse(&s.gateway, "method_not_allowed", r)
}

async fn status(State(s): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(r) = admin_refused(&s, &headers) {
        return r;
    }
    json(&super::handlers::status_value(&s.gateway))
}

/// The most an admin action's body may hold (a few fields of text).
const ADMIN_BODY_BYTES: usize = 64 * 1024;

/// `POST /admin/accounts/{id}/clear|disable|enable` (`crate::gateway::admin`).
async fn account_action(
    State(s): State<AppState>,
    Path((id, action)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Some(r) = admin_refused(&s, &headers) {
        return r;
    }
    let Some(act) = crate::gateway::admin::Act::parse(&action) else {
        let msg = format!("poolgate: no admin action `{action}`: use clear, disable or enable");
        return error(StatusCode::NOT_FOUND, ErrorType::NotFound, &msg);
    };
    let Ok(bytes) = axum::body::to_bytes(body, ADMIN_BODY_BYTES).await else {
        let msg = format!("poolgate: the body exceeds {} KiB", ADMIN_BODY_BYTES >> 10);
        return error(StatusCode::PAYLOAD_TOO_LARGE, ErrorType::RequestTooLarge, &msg);
    };
    let parsed = match crate::gateway::admin::parse_body(act, &bytes) {
        Ok(b) => b,
        Err(msg) => return error(StatusCode::BAD_REQUEST, ErrorType::InvalidRequest, &msg),
    };
    match crate::gateway::admin::act(&s.gateway, act, &id, parsed, s.gateway.clock.now_ms()) {
        Ok(answer) => json(&answer),
        Err(crate::gateway::admin::Refusal::UnknownAccount(id)) => {
            let msg = format!("poolgate: no configured account `{}` (GET /status lists them)", id.escape_debug());
            error(StatusCode::NOT_FOUND, ErrorType::NotFound, &msg)
        }
    }
}

#[derive(Deserialize)]
struct Limit {
    limit: Option<usize>,
}

async fn decisions(State(s): State<AppState>, headers: HeaderMap, Query(q): Query<Limit>) -> Response {
    if let Some(r) = admin_refused(&s, &headers) {
        return r;
    }
    let latest = s.gateway.decisions.latest(q.limit.unwrap_or(50));
    json(&latest.iter().map(|r| &**r).collect::<Vec<_>>())
}

async fn reload(State(s): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(r) = admin_refused(&s, &headers) {
        return r;
    }
    let Some(reloader) = s.reloader.clone() else {
        return error(
            StatusCode::CONFLICT,
            ErrorType::InvalidRequest,
            "poolgate: this gateway was not started from a config file",
        );
    };
    // Compiling runs on the blocking pool (or a child process) and configuring
    // on the plugin builder thread: the async workers only wait.
    match tokio::spawn(reloader(ReloadRequest::now("admin"))).await {
        Ok(Ok(generation)) => json(&serde_json::json!({ "ok": true, "generation": generation })),
        Ok(Err(ReloadError::Refused(e))) => refused(&e, None),
        Ok(Err(ReloadError::Superseded { ticket })) => superseded(&s.gateway, ticket).await,
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, ErrorType::Api, &e.to_string()),
    }
}

/// A refused reload's answer: 422, one line per problem.
fn refused(errors: &str, superseded_by: Option<&str>) -> Response {
    let mut body = serde_json::json!({ "ok": false, "errors": errors.lines().collect::<Vec<_>>() });
    if let Some(by) = superseded_by {
        body["superseded_by"] = by.into();
    }
    let mut r = json(&body);
    *r.status_mut() = StatusCode::UNPROCESSABLE_ENTITY;
    r
}

/// The answer of an admin reload that a newer reload superseded: the newer
/// one read the file later, so its outcome — waited for, within the bound of
/// a whole load — is the answer to "is the file in force?" (the body names
/// the trigger that won in `superseded_by`). 409 if none finished in time.
async fn superseded(gw: &Gateway, ticket: u64) -> Response {
    let g = gw.generation();
    let wait = crate::gateway::generation::LoadBounds::of(&g.config)
        .map(|b| b.total(g.chain.len().max(1)))
        .unwrap_or(std::time::Duration::from_secs(60));
    drop(g);
    match gw.reload_outcome_after(ticket, wait).await {
        Some(f) => match f.result {
            Ok(generation) => {
                json(&serde_json::json!({ "ok": true, "generation": generation, "superseded_by": f.trigger }))
            }
            Err(e) => refused(&e, Some(&f.trigger)),
        },
        None => error(
            StatusCode::CONFLICT,
            ErrorType::InvalidRequest,
            "poolgate: this reload was superseded by a newer one, which has not finished yet; \
             GET /status (config.last_reload) shows its outcome",
        ),
    }
}
