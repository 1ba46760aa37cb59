//! Anthropic's error envelope: `{"type":"error","error":{"type":…,"message":…}}`,
//! the error types, and the messages both fakes use.

use serde::Serialize;

/// The `error.type` of an answer, each with the status Anthropic sends it with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorType {
    /// 400 `invalid_request_error`: the request is malformed.
    InvalidRequest,
    /// 401 `authentication_error`: no or an unknown credential.
    Authentication,
    /// 403 `permission_error`: the credential may not do this.
    Permission,
    /// 404 `not_found_error`: an unknown path or model.
    NotFound,
    /// 413 `request_too_large`: the body is over the limit.
    RequestTooLarge,
    /// 429 `rate_limit_error`: a quota window is spent, or a burst limit hit.
    RateLimit,
    /// 500 `api_error`: the upstream failed (also sent with 502 and 503).
    Api,
    /// 529 `overloaded_error`: the upstream is overloaded.
    Overloaded,
}

impl ErrorType {
    /// The wire name (`rate_limit_error`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorType::InvalidRequest => "invalid_request_error",
            ErrorType::Authentication => "authentication_error",
            ErrorType::Permission => "permission_error",
            ErrorType::NotFound => "not_found_error",
            ErrorType::RequestTooLarge => "request_too_large",
            ErrorType::RateLimit => "rate_limit_error",
            ErrorType::Api => "api_error",
            ErrorType::Overloaded => "overloaded_error",
        }
    }

    /// The HTTP status it comes with.
    pub fn status(self) -> u16 {
        match self {
            ErrorType::InvalidRequest => 400,
            ErrorType::Authentication => 401,
            ErrorType::Permission => 403,
            ErrorType::NotFound => 404,
            ErrorType::RequestTooLarge => 413,
            ErrorType::RateLimit => 429,
            ErrorType::Api => 500,
            ErrorType::Overloaded => 529,
        }
    }
}

/// The message of a 401 for a missing or unknown credential.
pub const INVALID_API_KEY: &str = "invalid x-api-key";

/// The message of a 413.
pub const TOO_LARGE: &str = "Request exceeds the maximum allowed number of bytes.";

/// The message of a 429 that names a spent quota window.
pub const RATE_LIMITED: &str = "This request would exceed your account's rate limit. Please try again later.";

/// `{"type":"error","error":{"type":kind,"message":message}}`, with
/// `"request_id"` after it when given (as Anthropic's newer answers have it).
pub fn body(kind: ErrorType, message: &str, request_id: Option<&str>) -> String {
    serde_json::to_string(&Envelope::new(kind, message, request_id)).expect("an error serializes")
}

/// The envelope, as in a JSON body and in a stream's `error` event.
#[derive(Serialize)]
pub(crate) struct Envelope<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    error: Inner<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<&'a str>,
}

#[derive(Serialize)]
struct Inner<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: &'a str,
}

impl<'a> Envelope<'a> {
    pub(crate) fn new(kind: ErrorType, message: &'a str, request_id: Option<&'a str>) -> Envelope<'a> {
        Envelope { kind: "error", error: Inner { kind: kind.as_str(), message }, request_id }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_is_anthropics_with_an_optional_request_id() {
        assert_eq!(
            body(ErrorType::RateLimit, "Error", None),
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"Error"}}"#
        );
        assert_eq!(
            body(ErrorType::Authentication, INVALID_API_KEY, Some("req_1")),
            r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"},"request_id":"req_1"}"#
        );
        assert_eq!(
            body(ErrorType::InvalidRequest, "a \"quoted\"\nline", None),
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"a \"quoted\"\nline"}}"#
        );
    }

    #[test]
    fn every_type_has_its_status() {
        let all = [
            ErrorType::InvalidRequest,
            ErrorType::Authentication,
            ErrorType::Permission,
            ErrorType::NotFound,
            ErrorType::RequestTooLarge,
            ErrorType::RateLimit,
            ErrorType::Api,
            ErrorType::Overloaded,
        ];
        let pairs: Vec<(u16, &str)> = all.iter().map(|k| (k.status(), k.as_str())).collect();
        assert_eq!(
            pairs,
            [
                (400, "invalid_request_error"),
                (401, "authentication_error"),
                (403, "permission_error"),
                (404, "not_found_error"),
                (413, "request_too_large"),
                (429, "rate_limit_error"),
                (500, "api_error"),
                (529, "overloaded_error"),
            ]
        );
    }
}
