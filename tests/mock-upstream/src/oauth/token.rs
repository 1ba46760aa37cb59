//! `POST /v1/oauth/token`: the refresh and authorization-code grants.
//!
//! Claude Code sends JSON; standard OAuth clients send a form. Anthropic takes both, so
//! the mock does too, or a gateway written against either would pass here and fail there.
//! Errors follow RFC 6749 (`{"error":…,"error_description":…}`), not Anthropic's API
//! envelope, because that is what the real token endpoint answers.

use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use poolgate_wire::error::{self, ErrorType};
use serde::Deserialize;
use serde_json::json;

use super::{Authority, Grant, Granted, SCOPES, TokenMode, json};

/// The fields of both grants; which are required depends on `grant_type`. Anything else
/// (`state`, `scope`, …) is accepted and ignored.
#[derive(Deserialize)]
struct Form {
    grant_type: Option<String>,
    client_id: Option<String>,
    refresh_token: Option<String>,
    code: Option<String>,
    code_verifier: Option<String>,
    redirect_uri: Option<String>,
}

impl Form {
    /// The grant asked for, or the `error_description` of an `invalid_request`.
    fn grant(&self) -> Result<Grant<'_>, String> {
        let required = |field: &'static str, value: &Option<String>| match value.as_deref() {
            Some(v) if !v.is_empty() => Ok(()),
            _ => Err(format!("Missing required parameter: {field}")),
        };
        required("grant_type", &self.grant_type)?;
        required("client_id", &self.client_id)?;
        match self.grant_type.as_deref().unwrap_or_default() {
            "refresh_token" => {
                required("refresh_token", &self.refresh_token)?;
                Ok(Grant::Refresh { refresh_token: self.refresh_token.as_deref().unwrap_or_default() })
            }
            "authorization_code" => {
                required("code", &self.code)?;
                required("code_verifier", &self.code_verifier)?;
                required("redirect_uri", &self.redirect_uri)?;
                let code = self.code.as_deref().unwrap_or_default();
                Ok(Grant::Code { code, verifier: self.code_verifier.as_deref().unwrap_or_default() })
            }
            other => Err(format!("Unsupported grant_type: {other}")),
        }
    }
}

/// Answers one token request: recorded on arrival, then played per the mode in force.
pub(crate) async fn token(
    authority: &Authority,
    headers: &HeaderMap,
    body: &[u8],
    request_id: &HeaderValue,
) -> Response {
    let form = parse(headers, body);
    let (grant_type, client_id) = match &form {
        Some(f) => (f.grant_type.as_deref().unwrap_or_default(), f.client_id.as_deref()),
        None => ("", None),
    };
    let grant = form.as_ref().and_then(|f| f.grant().ok());
    let index = authority.record(grant_type, client_id, grant.as_ref());
    let response = answer(authority, form.as_ref(), request_id).await;
    authority.answered(index, response.status().as_u16());
    response
}

async fn answer(authority: &Authority, form: Option<&Form>, request_id: &HeaderValue) -> Response {
    // A broken or slow server fails before it looks at the body, and changes nothing.
    match authority.mode() {
        TokenMode::Normal => {}
        TokenMode::Slow(delay) => tokio::time::sleep(delay).await,
        TokenMode::Failing(status) => return failing(status, request_id),
        TokenMode::Hang => std::future::pending().await,
    }
    let Some(form) = form else {
        return oauth_error("invalid_request", "Invalid request body", request_id);
    };
    let grant = match form.grant() {
        Ok(grant) => grant,
        Err(description) => return oauth_error("invalid_request", &description, request_id),
    };
    match authority.grant(&grant) {
        Ok(granted) => json(200, success(&granted), request_id),
        Err(description) => oauth_error("invalid_grant", description, request_id),
    }
}

/// JSON if the `content-type` says so (or, without one, if the body looks like JSON),
/// else a form; `None` if it does not parse.
fn parse(headers: &HeaderMap, body: &[u8]) -> Option<Form> {
    let content_type = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok());
    let is_json = match content_type {
        Some(t) => t.split(';').next().is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json")),
        None => body.trim_ascii_start().starts_with(b"{"),
    };
    if is_json { serde_json::from_slice(body).ok() } else { serde_urlencoded::from_bytes(body).ok() }
}

/// The body of a successful grant, in Anthropic's shape.
fn success(granted: &Granted) -> String {
    let Granted { tokens, lifetime, identity } = granted;
    json!({
        "token_type": "Bearer",
        "access_token": tokens.access_token,
        "refresh_token": tokens.refresh_token,
        "expires_in": lifetime.as_secs(),
        "scope": SCOPES.join(" "),
        "organization": {"uuid": identity.organization_uuid, "name": identity.organization_name()},
        "account": {"uuid": identity.account_uuid, "email_address": identity.email},
    })
    .to_string()
}

/// A 400 in RFC 6749's shape.
fn oauth_error(error: &str, description: &str, request_id: &HeaderValue) -> Response {
    json(400, json!({"error": error, "error_description": description}).to_string(), request_id)
}

/// What the endpoint answers in [`TokenMode::Failing`]: Anthropic's envelope, as its edge
/// sends for an outage.
fn failing(status: u16, request_id: &HeaderValue) -> Response {
    let (kind, message) = match status {
        429 => (ErrorType::RateLimit, "Rate limited. Please try again later."),
        529 => (ErrorType::Overloaded, "Overloaded"),
        _ => (ErrorType::Api, "Internal server error"),
    };
    json(status, error::body(kind, message, None), request_id)
}
