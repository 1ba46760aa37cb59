//! Answers the gateway gives itself, in Anthropic's error shape, so an SDK client
//! parses them like any upstream error (the envelope is the wire crate's, the
//! one the fakes answer with too).

use axum::body::Body;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};
pub use poolgate_wire::error::ErrorType;

/// An Anthropic-shaped error response:
/// `{"type":"error","error":{"type":<kind>,"message":<message>}}`.
pub fn error(status: StatusCode, kind: ErrorType, message: &str) -> Response {
    let mut r = Response::new(Body::from(poolgate_wire::error::body(kind, message, None)));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// An error retrying cannot fix: Claude Code stops at once on `x-should-retry:
/// false` instead of backing off for minutes.
pub fn final_error(status: StatusCode, kind: ErrorType, message: &str) -> Response {
    let mut r = error(status, kind, message);
    r.headers_mut().insert("x-should-retry", HeaderValue::from_static("false"));
    r
}

/// A locally generated 429 with `retry-after` in whole seconds (at least 1).
pub fn rate_limited(kind_message: &str, retry_after_ms: u64) -> Response {
    let mut r = error(StatusCode::TOO_MANY_REQUESTS, ErrorType::RateLimit, kind_message);
    let secs = retry_after_ms.div_ceil(1000).max(1);
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    r
}

/// The SSE event that ends a stream still open when the shutdown grace
/// period ends.
pub const STREAM_SHUTDOWN_EVENT: &[u8] = b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"poolgate is shutting down: the stream was cut at the end of its shutdown grace period\"}}\n\n";
