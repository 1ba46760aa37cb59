//! `GET /ui`: the pool as a live web page — every account's windows and
//! cooldowns, the chain, recent decisions with each stage's reason, usage
//! per client key — and the operator's actions on it.
//!
//! Why in the gateway, and why this way: an operator asks "which seat is
//! serving, how much is left, why was this request sent there" while it is
//! happening, often on a machine with no network beyond the gateway. So the
//! page's three files (`page.html`, `app.js`, `app.css`) are compiled into
//! the binary — no CDN, no external font, no framework, no build step — and
//! are served to anyone: they hold no data. Everything the page shows comes
//! from [`events`], an SSE stream that needs the admin token, which the page
//! keeps in the tab's session storage and sends as `Authorization` (never in
//! a URL, where logs and history would keep it). Actions go to the admin
//! endpoints that already exist, with the same token. A one-time ticket in
//! the link `poolgate demo` prints signs in without typing the token
//! ([`sign_in`], `gateway::sessions`).
//!
//! What a page costs: nothing per request. No request does anything for the
//! page; each open page has one task that reads the gateway's state every
//! [`events::TICK`] and sends what changed. At most [`events::PAGES_MAX`]
//! pages stream at once; more are refused (429), so a flood of page loads
//! cannot pile up tasks.

pub mod events;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;

use super::handlers::{AppState, json};
use crate::gateway::request::errors::{ErrorType, final_error};

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

/// The page's own files, each with its type. The page allows nothing but
/// its own origin (`content-security-policy`): no inline script runs, no
/// other host is reached.
fn asset(body: &'static str, kind: &'static str) -> Response {
    let mut r = body.into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"),
    );
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    r
}

/// `GET /ui`.
pub async fn page() -> Response {
    asset(include_str!("page.html"), "text/html; charset=utf-8")
}

/// `GET /ui/app.js`.
pub async fn script() -> Response {
    asset(include_str!("app.js"), "text/javascript; charset=utf-8")
}

/// `GET /ui/app.css`.
pub async fn style() -> Response {
    asset(include_str!("app.css"), "text/css; charset=utf-8")
}

/// `POST /ui/sign-in` `{"ticket": "…"}`: a one-time ticket (from the
/// link `poolgate demo` prints) traded for a session token the admin routes
/// accept; 401 for a ticket unknown, used or lapsed.
pub async fn sign_in(State(s): State<AppState>, body: Bytes) -> Response {
    #[derive(serde::Deserialize)]
    struct Ticket {
        ticket: String,
    }
    let Ok(t) = serde_json::from_slice::<Ticket>(&body) else {
        let msg = "poolgate: the body must be {\"ticket\": \"…\"}";
        return final_error(StatusCode::BAD_REQUEST, ErrorType::InvalidRequest, msg);
    };
    match s.gateway.sessions.redeem(&t.ticket, s.gateway.clock.now_ms()) {
        Some(token) => json(&serde_json::json!({ "token": token })),
        None => {
            let msg = "poolgate: this sign-in link was used already or is too old; sign in with the admin token";
            final_error(StatusCode::UNAUTHORIZED, ErrorType::Authentication, msg)
        }
    }
}
