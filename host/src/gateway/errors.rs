//! Answers the gateway gives itself, in Anthropic's error shape, so an SDK client
//! parses them like any upstream error.

use axum::body::Body;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};

/// An Anthropic-shaped error response:
/// `{"type":"error","error":{"type":<kind>,"message":<message>}}`.
pub fn error(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = serde_json::json!({ "type": "error", "error": { "type": kind, "message": message } });
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// An error retrying cannot fix: Claude Code stops at once on `x-should-retry:
/// false` instead of backing off for minutes.
pub fn final_error(status: StatusCode, kind: &str, message: &str) -> Response {
    let mut r = error(status, kind, message);
    r.headers_mut().insert("x-should-retry", HeaderValue::from_static("false"));
    r
}

/// A locally generated 429 with `retry-after` in whole seconds (at least 1).
pub fn rate_limited(kind_message: &str, retry_after_ms: u64) -> Response {
    let mut r = error(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", kind_message);
    let secs = retry_after_ms.div_ceil(1000).max(1);
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    r
}
