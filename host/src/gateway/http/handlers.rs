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
    if !g.admin.check(headers) {
        return Some(final_error(
            StatusCode::UNAUTHORIZED,
            ErrorType::Authentication,
            "poolgate: admin token required",
        ));
    }
    None
}

/// `value` as pretty JSON.
pub fn json(value: &impl serde::Serialize) -> Response {
    match serde_json::to_string_pretty(value) {
        Ok(text) => ([(http::header::CONTENT_TYPE, "application/json")], text).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, ErrorType::Api, &e.to_string()),
    }
}
