//! What every route handler shares: the state they are given, the admin
//! token's gate, a JSON answer. Below the handlers (`routes`, `usage`), so
//! neither imports the other.

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::gateway::Gateway;
use crate::gateway::reload::Reloader;
use crate::gateway::request::errors::{ErrorType, error, final_error};

/// Shared route state.
#[derive(Clone)]
pub struct AppState {
    /// The gateway.
    pub gateway: Arc<Gateway>,
    /// Reloads the configuration (absent when poolgate runs without a file).
    pub reloader: Option<Reloader>,
    /// The web pages that may stream at once (`ui::events`).
    pub ui_pages: Arc<tokio::sync::Semaphore>,
}

/// The refusal of an admin route without the admin token (none: go on).
pub fn admin_refused(s: &AppState, headers: &HeaderMap) -> Option<Response> {
    let g = s.gateway.generation();
    if !g.admin.configured() {
        return Some(final_error(
            StatusCode::FORBIDDEN,
            ErrorType::Permission,
            "poolgate: admin routes are disabled; set server.admin_token_env (or admin_token_sha256) to enable them",
        ));
    }
    if !g.admin.check(headers) && !s.gateway.sessions.check(headers, s.gateway.clock.now_ms()) {
        return Some(final_error(
            StatusCode::UNAUTHORIZED,
            ErrorType::Authentication,
            "poolgate: admin token required",
        ));
    }
    None
}

/// What `GET /status` answers (and the web page's `status` event).
pub fn status_value(gw: &crate::gateway::Gateway) -> serde_json::Value {
    let g = gw.generation();
    let now = gw.clock.now_ms();
    let mut accounts: Vec<_> = g
        .accounts
        .iter()
        .map(|a| crate::learned::accounts::AccountStatus { overflow: a.overflow, ..a.state.status(&a.config, now) })
        .chain(g.disabled.iter().map(|(c, st)| st.status(c, now)))
        .collect();
    crate::learned::accounts::mark_shared_subscriptions(&mut accounts);
    serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "now_ms": now,
        "uptime_ms": now.saturating_sub(gw.started_ms),
        "config": {
            "generation": g.number,
            "loaded_ms": g.loaded_ms,
            "last_reload": *gw.last_reload.lock(),
            "reloads": gw.reload_history.lock().iter().rev().collect::<Vec<_>>(),
        },
        "chain": g.chain.status(now),
        "builtins_ready": gw.engine.builtins_ready(),
        "queue_depth": gw.admission.depth(),
        "state_backend": gw.shared.status(),
        "state_file": gw.persist.as_ref().map(|p| p.status()),
        "ledger": gw.ledger.as_ref().map(|l| l.health()),
        "admin_actions": gw.admin.latest(),
        "fallback": g.config.fallback.iter().map(|f| {
            let backend = format!("{}/{}", f.name, f.model);
            serde_json::json!({ "backend": backend, "served": gw.metrics.fallback_served(&backend) })
        }).collect::<Vec<_>>(),
        "accounts": accounts,
    })
}

/// `value` as pretty JSON.
pub fn json(value: &impl serde::Serialize) -> Response {
    match serde_json::to_string_pretty(value) {
        Ok(text) => ([(http::header::CONTENT_TYPE, "application/json")], text).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, ErrorType::Api, &e.to_string()),
    }
}
