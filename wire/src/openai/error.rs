//! Errors in OpenAI's shape: `{"error":{"message","type","param","code"}}`,
//! and the mapping from Anthropic's error envelope to it.
//!
//! OpenAI clients (the official SDKs among them) pick their exception class and
//! their retry policy from the HTTP status, and show `error.message`; `type` and
//! `code` are for programs that branch on them. So the status is what has to be
//! right, and each Anthropic type is given the status an OpenAI client retries
//! (or does not retry) the same way.

use serde_json::{Value, json};

/// A request the translation refuses, or an upstream error, in OpenAI's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenAiError {
    /// The HTTP status to answer with.
    pub status: u16,
    /// What is wrong, for a person.
    pub message: String,
    /// `error.type`: `invalid_request_error`, `rate_limit_exceeded`, `server_error`…
    pub kind: &'static str,
    /// `error.param`: the request field at fault (`messages[2].role`), if one is.
    pub param: Option<String>,
    /// `error.code`: a machine-readable reason (`model_not_found`), if there is one.
    pub code: Option<String>,
}

impl OpenAiError {
    /// A 400 `invalid_request_error` about `param` (when one field is at fault).
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> OpenAiError {
        OpenAiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_owned),
            code: None,
        }
    }

    /// The same error with `error.code` set.
    pub fn with_code(mut self, code: &str) -> OpenAiError {
        self.code = Some(code.to_owned());
        self
    }

    /// The JSON body: `{"error":{"message":…,"type":…,"param":…,"code":…}}`.
    pub fn to_body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl std::fmt::Display for OpenAiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.kind, self.message)
    }
}

impl std::error::Error for OpenAiError {}

/// An Anthropic error answer (`status` and its body, the envelope
/// `{"type":"error","error":{"type","message"}}`) as an OpenAI one: the status
/// to send and the body.
///
/// | Anthropic `error.type` | status | OpenAI `type` | `code` |
/// |---|---|---|---|
/// | `invalid_request_error` | as sent (400 if not 4xx) | `invalid_request_error` | — |
/// | `authentication_error` | 401 | `invalid_request_error` | `invalid_api_key` |
/// | `permission_error` | 403 | `invalid_request_error` | `permission_denied` |
/// | `not_found_error` | 404 | `invalid_request_error` | `not_found` |
/// | `request_too_large` | 413 | `invalid_request_error` | `request_too_large` |
/// | `rate_limit_error` | 429 | `rate_limit_exceeded` | `rate_limit_exceeded` |
/// | `api_error` | as sent (500 if not 5xx) | `server_error` | — |
/// | `overloaded_error` | 503 | `server_error` | `overloaded` |
///
/// 529 becomes 503 because 529 is Anthropic's own; 503 is the status every
/// HTTP client knows as "retry later". A body that is not the envelope, or an
/// unknown type, is judged by its status alone (4xx a request error, else a
/// server error) so that nothing the upstream says is lost: its text becomes
/// the message.
pub fn anthropic_error_to_openai(status: u16, anthropic_body: &Value) -> (u16, Value) {
    let err = from_anthropic(status, anthropic_body);
    (err.status, err.to_body())
}

/// [`anthropic_error_to_openai`], as an [`OpenAiError`].
pub fn from_anthropic(status: u16, anthropic_body: &Value) -> OpenAiError {
    let inner = anthropic_body.get("error");
    let kind = inner.and_then(|e| e.get("type")).and_then(Value::as_str).unwrap_or("");
    let message = match inner.and_then(|e| e.get("message")).and_then(Value::as_str) {
        Some(m) => m.to_owned(),
        None if anthropic_body.is_null() => format!("upstream error (HTTP {status})"),
        None => format!("upstream error (HTTP {status}): {anthropic_body}"),
    };
    let client = (400..500).contains(&status);
    let (status, kind, code) = match kind {
        "invalid_request_error" => (if client { status } else { 400 }, "invalid_request_error", None),
        "authentication_error" => (401, "invalid_request_error", Some("invalid_api_key")),
        "permission_error" => (403, "invalid_request_error", Some("permission_denied")),
        "not_found_error" => (404, "invalid_request_error", Some("not_found")),
        "request_too_large" => (413, "invalid_request_error", Some("request_too_large")),
        "rate_limit_error" => (429, "rate_limit_exceeded", Some("rate_limit_exceeded")),
        "overloaded_error" => (503, "server_error", Some("overloaded")),
        "api_error" => (if status >= 500 && status != 529 { status } else { 500 }, "server_error", None),
        _ if status == 429 => (429, "rate_limit_exceeded", Some("rate_limit_exceeded")),
        _ if client => (status, "invalid_request_error", None),
        _ => (if status == 529 { 503 } else { status.max(500) }, "server_error", None),
    };
    OpenAiError { status, message, kind, param: None, code: code.map(str::to_owned) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anthropic(kind: &str) -> Value {
        json!({"type": "error", "error": {"type": kind, "message": "why"}})
    }

    #[test]
    fn the_body_is_openais_shape_with_nulls_for_absent_fields() {
        let e = OpenAiError::invalid("bad", Some("n"));
        assert_eq!(
            e.to_body(),
            json!({"error": {"message": "bad", "type": "invalid_request_error", "param": "n", "code": null}})
        );
        assert_eq!(e.status, 400);
        assert_eq!(e.with_code("x").to_body()["error"]["code"], "x");
    }

    #[test]
    fn every_anthropic_type_maps_to_a_status_and_type() {
        let cases = [
            (400, "invalid_request_error", 400, "invalid_request_error", None),
            (413, "invalid_request_error", 413, "invalid_request_error", None),
            (401, "authentication_error", 401, "invalid_request_error", Some("invalid_api_key")),
            (403, "permission_error", 403, "invalid_request_error", Some("permission_denied")),
            (404, "not_found_error", 404, "invalid_request_error", Some("not_found")),
            (413, "request_too_large", 413, "invalid_request_error", Some("request_too_large")),
            (429, "rate_limit_error", 429, "rate_limit_exceeded", Some("rate_limit_exceeded")),
            (500, "api_error", 500, "server_error", None),
            (502, "api_error", 502, "server_error", None),
            (529, "overloaded_error", 503, "server_error", Some("overloaded")),
            // An error event inside a 200 stream still maps to a failure status.
            (200, "overloaded_error", 503, "server_error", Some("overloaded")),
            (200, "api_error", 500, "server_error", None),
        ];
        for (status, kind, want_status, want_kind, want_code) in cases {
            let (s, body) = anthropic_error_to_openai(status, &anthropic(kind));
            assert_eq!((s, body["error"]["type"].as_str()), (want_status, Some(want_kind)), "{kind}");
            assert_eq!(body["error"]["code"].as_str(), want_code, "{kind}");
            assert_eq!(body["error"]["message"], "why");
        }
    }

    #[test]
    fn a_body_that_is_not_the_envelope_is_judged_by_its_status() {
        let (s, body) = anthropic_error_to_openai(502, &json!("Bad Gateway"));
        assert_eq!((s, body["error"]["type"].as_str()), (502, Some("server_error")));
        assert_eq!(body["error"]["message"], "upstream error (HTTP 502): \"Bad Gateway\"");
        let (s, body) = anthropic_error_to_openai(429, &Value::Null);
        assert_eq!((s, body["error"]["type"].as_str()), (429, Some("rate_limit_exceeded")));
        assert_eq!(body["error"]["message"], "upstream error (HTTP 429)");
        let (s, _) = anthropic_error_to_openai(418, &json!({}));
        assert_eq!(s, 418);
        let (s, _) = anthropic_error_to_openai(529, &json!({}));
        assert_eq!(s, 503);
    }
}
