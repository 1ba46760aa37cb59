//! The simulator's OAuth authority, so `poolgate demo` shows subscription seats
//! refreshing: a seat's access tokens live [`TOKEN_LIFETIME`] (the demo's
//! compressed clock), its refresh tokens are single-use and rotate, and the
//! API answers an expired token with a 401 as Anthropic does.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use http::StatusCode;
use parking_lot::Mutex;

use crate::random::random_hex;

/// How long a seat's access token lives in the demo.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(6);

/// Tokens in circulation: access token → (account, expiry ms); refresh
/// token → account. Generic over the server's account type, which this
/// module never looks into (the server hands it what it needs to know).
pub(crate) struct Tokens<A> {
    access: Mutex<HashMap<String, (Arc<A>, u64)>>,
    refresh: Mutex<HashMap<String, Arc<A>>>,
    /// Refreshes granted, for the demo's summary.
    pub refreshes: std::sync::atomic::AtomicU64,
}

impl<A> Default for Tokens<A> {
    fn default() -> Self {
        Tokens { access: Mutex::default(), refresh: Mutex::default(), refreshes: Default::default() }
    }
}

/// A fresh pair for `account`: (access, refresh, expires at ms).
pub(crate) fn issue<A>(tokens: &Tokens<A>, account: &Arc<A>, now_ms: u64) -> anyhow::Result<(String, String, u64)> {
    let access = format!("sk-ant-oat-sim-{}", random_hex(24)?);
    let refresh = format!("sk-ant-ort-sim-{}", random_hex(24)?);
    let expires = now_ms + TOKEN_LIFETIME.as_millis() as u64;
    tokens.access.lock().insert(access.clone(), (account.clone(), expires));
    tokens.refresh.lock().insert(refresh.clone(), account.clone());
    Ok((access, refresh, expires))
}

/// What a bearer token says: the account, or that it expired.
pub(crate) enum Bearer<A> {
    /// A live token of this account.
    Live(Arc<A>),
    /// One of ours, past its expiry.
    Expired,
    /// Not one of ours.
    Unknown,
}

/// Looks up a presented bearer token.
pub(crate) fn bearer<A>(tokens: &Tokens<A>, token: &str, now_ms: u64) -> Bearer<A> {
    match tokens.access.lock().get(token) {
        Some((a, until)) if *until > now_ms => Bearer::Live(a.clone()),
        Some(_) => Bearer::Expired,
        None => Bearer::Unknown,
    }
}

/// `POST /v1/oauth/token`, the refresh grant (form-encoded, as the gateway
/// sends it), at `now_ms`; `organization` names an account's organization.
pub(crate) fn refresh_grant<A>(
    tokens: &Tokens<A>,
    body: &[u8],
    now_ms: u64,
    organization: impl Fn(&A) -> String,
) -> Response {
    let form = String::from_utf8_lossy(body).into_owned();
    let field = |name: &str| {
        form.split('&').find_map(|kv| kv.split_once('=').filter(|(k, _)| *k == name).map(|(_, v)| v.to_string()))
    };
    let answer = |status: StatusCode, body: serde_json::Value| {
        let mut r = Response::new(axum::body::Body::from(body.to_string()));
        *r.status_mut() = status;
        r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
        r
    };
    if field("grant_type").as_deref() != Some("refresh_token") {
        return answer(StatusCode::BAD_REQUEST, serde_json::json!({"error": "unsupported_grant_type"}));
    }
    let used = field("refresh_token").unwrap_or_default();
    let Some(account) = tokens.refresh.lock().remove(&used) else {
        let body =
            serde_json::json!({"error": "invalid_grant", "error_description": "Refresh token not found or invalid"});
        return answer(StatusCode::BAD_REQUEST, body);
    };
    let Ok((access, refresh, _)) = issue(tokens, &account, now_ms) else {
        return answer(StatusCode::INTERNAL_SERVER_ERROR, serde_json::json!({"error": "server_error"}));
    };
    tokens.refreshes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    answer(
        StatusCode::OK,
        serde_json::json!({
            "token_type": "Bearer",
            "access_token": access,
            "refresh_token": refresh,
            "expires_in": TOKEN_LIFETIME.as_secs(),
            "scope": "user:inference user:profile",
            "organization": { "uuid": organization(&account) },
        }),
    )
}
