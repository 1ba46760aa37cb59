//! `/admin/keys`: client keys managed at run time, over HTTP (admin token).
//!
//! - `GET /admin/keys`: every key — the config's and the run-time ones —
//!   with its team, owner, expiry, limits and the first 8 hex digits of its
//!   hash (never the key);
//! - `POST /admin/keys` (`{"name": …, "team": …, "expires": …, limits…}`):
//!   a new key; the answer holds the key, once (201);
//! - `POST /admin/keys/{name}` (the same fields, each optional): changed;
//! - `POST /admin/keys/{name}/revoke`: refused from now on (its usage stays
//!   under its name).
//!
//! A change is in force on this gateway when the answer comes back, and on
//! the others sharing the store within `gateway::keys::REFRESH`.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::handlers::{AppState, admin_refused, json};
use crate::gateway::request::errors::{ErrorType, error, final_error};
use crate::ledger::calendar::rfc3339;
use crate::ledger::keys::{self as store_keys, KeySpec};
use crate::ledger::{KeyRecord, Ledger};

fn refused(status: StatusCode, kind: ErrorType, msg: &str) -> Response {
    final_error(status, kind, &format!("poolgate: {msg}"))
}

/// The ledger, for an admin request that may use it.
fn gate<'a>(s: &'a AppState, headers: &HeaderMap) -> Result<&'a Ledger, Box<Response>> {
    if let Some(r) = admin_refused(s, headers) {
        return Err(Box::new(r));
    }
    s.gateway.ledger.as_deref().ok_or_else(|| {
        let msg = "run-time keys live in the usage ledger, and this gateway keeps none ([ledger] file = \"\")";
        Box::new(refused(StatusCode::NOT_FOUND, ErrorType::NotFound, msg))
    })
}

fn store_error(e: anyhow::Error) -> Response {
    error(StatusCode::SERVICE_UNAVAILABLE, ErrorType::Api, &format!("poolgate: the key store cannot answer now: {e:#}"))
}

/// A key as an operator reads it (never the key or its whole hash).
fn shown(k: &KeyRecord, now_ms: u64) -> serde_json::Value {
    serde_json::json!({
        "name": k.name,
        "source": "runtime",
        "sha256_prefix": k.sha256.get(..8).unwrap_or_default(),
        "team": k.team,
        "owner": k.owner,
        "created_at": rfc3339(k.created_ms),
        "expires_at": k.expires_ms.map(rfc3339),
        "revoked_at": k.revoked_ms.map(rfc3339),
        "refused": k.refused(now_ms),
        "limits": k.limits,
    })
}

/// `GET /admin/keys`.
pub async fn list(State(s): State<AppState>, headers: HeaderMap) -> Response {
    let ledger = match gate(&s, &headers) {
        Ok(l) => l,
        Err(r) => return *r,
    };
    let records = match ledger.keys().await {
        Ok(r) => r,
        Err(e) => return store_error(e),
    };
    let now = s.gateway.clock.now_ms();
    let g = s.gateway.generation();
    let config = g
        .config
        .server
        .client_keys
        .iter()
        .map(|k| serde_json::json!({ "name": k.name, "source": "config", "team": k.team, "limits": k.limits }));
    let keys: Vec<serde_json::Value> = config.chain(records.iter().map(|k| shown(k, now))).collect();
    json(&serde_json::json!({ "keys": keys }))
}

fn spec(body: &Bytes) -> Result<KeySpec, Box<Response>> {
    KeySpec::parse(body).map_err(|e| {
        Box::new(refused(StatusCode::BAD_REQUEST, ErrorType::InvalidRequest, &format!("the key's fields: {e}")))
    })
}

/// `POST /admin/keys`: a new key, shown once.
pub async fn create(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let ledger = match gate(&s, &headers) {
        Ok(l) => l,
        Err(r) => return *r,
    };
    let spec = match spec(&body) {
        Ok(spec) => spec,
        Err(r) => return *r,
    };
    let existing = match ledger.keys().await {
        Ok(r) => r,
        Err(e) => return store_error(e),
    };
    let reserved: Vec<String> =
        s.gateway.generation().config.server.client_keys.iter().map(|k| k.name.clone()).collect();
    let now = s.gateway.clock.now_ms();
    let (record, secret) = match store_keys::create(&spec, &existing, &reserved, now) {
        Ok(made) => made,
        Err(why) => return refused(StatusCode::BAD_REQUEST, ErrorType::InvalidRequest, &why),
    };
    if let Err(e) = ledger.put_key(record.clone()).await {
        return store_error(e);
    }
    tracing::info!(key = %record.name, "client key created");
    let _ = crate::gateway::keys::refresh(&s.gateway).await;
    let mut answer = shown(&record, now);
    answer["key"] = serde_json::json!(secret);
    let mut r = json(&answer);
    *r.status_mut() = StatusCode::CREATED;
    r
}

/// `POST /admin/keys/{name}`: the key changed as the body says.
pub async fn change(State(s): State<AppState>, Path(name): Path<String>, headers: HeaderMap, body: Bytes) -> Response {
    apply(s, name, false, headers, body).await
}

/// `POST /admin/keys/{name}/revoke`.
pub async fn act(
    State(s): State<AppState>,
    Path((name, action)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if action != "revoke" {
        return refused(
            StatusCode::NOT_FOUND,
            ErrorType::NotFound,
            "use /admin/keys/{name} or /admin/keys/{name}/revoke",
        );
    }
    apply(s, name, true, headers, body).await
}

async fn apply(s: AppState, name: String, revoke: bool, headers: HeaderMap, body: Bytes) -> Response {
    let ledger = match gate(&s, &headers) {
        Ok(l) => l,
        Err(r) => return *r,
    };
    let existing = match ledger.keys().await {
        Ok(r) => r,
        Err(e) => return store_error(e),
    };
    let Some(key) = existing.into_iter().find(|k| k.name == name) else {
        let msg = format!(
            "no run-time key `{}` (GET /admin/keys lists them; a config key changes in the config)",
            name.escape_debug()
        );
        return refused(StatusCode::NOT_FOUND, ErrorType::NotFound, &msg);
    };
    let now = s.gateway.clock.now_ms();
    let changed = match revoke {
        true => Ok(KeyRecord { revoked_ms: key.revoked_ms.or(Some(now)), ..key }),
        false => spec(&body).and_then(|spec| {
            store_keys::change(&key, &spec)
                .map_err(|why| Box::new(refused(StatusCode::BAD_REQUEST, ErrorType::InvalidRequest, &why)))
        }),
    };
    let changed = match changed {
        Ok(c) => c,
        Err(r) => return *r,
    };
    if let Err(e) = ledger.put_key(changed.clone()).await {
        return store_error(e);
    }
    tracing::info!(key = %changed.name, revoked = revoke, "client key changed");
    let _ = crate::gateway::keys::refresh(&s.gateway).await;
    json(&shown(&changed, now))
}
