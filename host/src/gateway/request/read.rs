//! The request facts the chain needs, read once from the client's body and headers:
//! model, streaming, and the session id that affinity binds on.
//!
//! Claude Code's session id lives in `metadata.user_id`, now a JSON-encoded string
//! (`{"device_id":…,"account_uuid":…,"session_id":…}`), formerly
//! `user_<hex>_account_<uuid>_session_<uuid>`; it equals the
//! `x-claude-code-session-id` header (see `shared/references/claude-code-wire.md`).
//! Both body forms are parsed; the headers are the fallback.
//!
//! [`Incoming`] is the client request as the phases hold it, body whole.

use bytes::Bytes;
use http::{HeaderMap, Method, Uri};
use poolgate_wire::request::{Expect, json_error};
use serde::Deserialize;

/// A client request, read.
pub struct Incoming {
    /// The request's number (already on any early refusal).
    pub id: u64,
    /// Method.
    pub method: Method,
    /// Path and query, as the client sent them.
    pub uri: Uri,
    /// Client headers.
    pub headers: HeaderMap,
    /// The whole body (kept so it can be replayed on another account).
    pub body: Bytes,
    /// The accepted client key's name.
    pub client: Option<String>,
    /// How the client's answers are written (the request itself is already
    /// Anthropic's here: see `dialect`).
    pub dialect: super::dialect::Dialect,
    /// The connection it came on, when it came on one (not in the simulator).
    pub connection: Option<Connection>,
}

/// What the connection a request came on knows about how it ended, asked by
/// a request whose answer was dropped before its end. The HTTP surface
/// implements it (its connection guard knows); the phases only ask.
pub trait ClientConnection: Send + Sync {
    /// Whether the connection was closed because its client accepted no
    /// byte for `server.send_timeout_ms`.
    fn send_timed_out(&self) -> bool;
}

/// The connection a request came on, as the request's extensions carry it:
/// the connection's own shared state, not a copy.
#[derive(Clone)]
pub struct Connection(pub std::sync::Arc<dyn ClientConnection>);

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connection")
    }
}

/// What the gateway reads from a request body.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BodyFacts {
    /// `model`, if present.
    pub model: Option<String>,
    /// `stream: true`.
    pub stream: bool,
    /// The session id from `metadata.user_id`, if any.
    pub session: Option<String>,
}

#[derive(Deserialize)]
struct Peek {
    model: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
    metadata: Option<Metadata>,
}

#[derive(Deserialize)]
struct Metadata {
    user_id: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct UserIdJson {
    session_id: Option<String>,
}

/// The types of the fields [`Peek`] reads, for an error that names them
/// instead of `Peek`.
const PEEKED: &[(&str, Expect)] =
    &[("model", Expect::String), ("stream", Expect::Boolean), ("metadata", Expect::Object)];

/// Why a body was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadBody(pub String);

/// Reads the facts of a JSON request body. A body that is not one valid UTF-8
/// JSON object — empty, not UTF-8, not JSON, not an object — is refused (the
/// client gets a 400 in Anthropic's shape), never forwarded: the upstream
/// would refuse it too, after a round trip and on an account's budget.
///
/// The whole body is checked: UTF-8 first (a vectorised scan of the bytes,
/// since serde skips the strings of fields it does not keep without looking at
/// them), then JSON, in the one pass that reads the facts. It runs once per
/// request, before any attempt, never per streamed chunk.
pub fn body_facts(body: &[u8]) -> Result<BodyFacts, BadBody> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(BadBody("body is empty: the request must be a JSON object".into()));
    }
    let text = std::str::from_utf8(body).map_err(|e| {
        BadBody(format!("body is not valid UTF-8: invalid bytes at offset {} (JSON is UTF-8)", e.valid_up_to()))
    })?;
    // serde reads a struct from an array too (`["m", true, null]`): only an
    // object is a request.
    if text.trim_start().starts_with('[') {
        return Err(BadBody("body: Input should be a valid dictionary".into()));
    }
    let peek: Peek = serde_json::from_str(text).map_err(|e| BadBody(json_error(body, &e, PEEKED)))?;
    let session = peek.metadata.and_then(|m| m.user_id).and_then(|v| match v {
        serde_json::Value::String(s) => session_from_user_id(&s),
        _ => None,
    });
    Ok(BodyFacts { model: peek.model, stream: peek.stream.unwrap_or(false), session })
}

/// The session part of a Claude Code `metadata.user_id`, in either form.
pub fn session_from_user_id(user_id: &str) -> Option<String> {
    let trimmed = user_id.trim();
    if trimmed.starts_with('{') {
        let parsed: UserIdJson = serde_json::from_str(trimmed).ok()?;
        return parsed.session_id.filter(|s| !s.is_empty());
    }
    let (_, session) = trimmed.rsplit_once("_session_")?;
    (!session.is_empty()).then(|| session.to_string())
}

/// The session id: from the body when present, else from the
/// `x-claude-code-session-id` or `x-session-id` header.
pub fn session_id(facts: &BodyFacts, headers: &HeaderMap) -> Option<String> {
    facts.session.clone().or_else(|| {
        ["x-claude-code-session-id", "x-session-id"].iter().find_map(|h| {
            headers
                .get(*h)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty() && v.len() <= 256)
                .map(str::to_string)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_json_string_form_of_user_id() {
        let body = br#"{"model":"claude-sonnet-4-5","stream":true,"metadata":{"user_id":"{\"device_id\":\"abc\",\"account_uuid\":\"\",\"session_id\":\"5f0c-uuid\"}"}}"#;
        let f = body_facts(body).unwrap();
        assert_eq!(f.session.as_deref(), Some("5f0c-uuid"));
        assert_eq!(f.model.as_deref(), Some("claude-sonnet-4-5"));
        assert!(f.stream);
    }

    #[test]
    fn reads_the_older_underscore_form() {
        let id =
            "user_0123abcd_account_11111111-2222-3333-4444-555555555555_session_66666666-7777-8888-9999-000000000000";
        assert_eq!(session_from_user_id(id).as_deref(), Some("66666666-7777-8888-9999-000000000000"));
        assert_eq!(session_from_user_id("plain-user"), None);
    }

    #[test]
    fn falls_back_to_the_session_headers() {
        let mut h = HeaderMap::new();
        h.insert("x-session-id", "from-generic".parse().unwrap());
        assert_eq!(session_id(&BodyFacts::default(), &h).as_deref(), Some("from-generic"));
        h.insert("x-claude-code-session-id", "from-cc".parse().unwrap());
        assert_eq!(session_id(&BodyFacts::default(), &h).as_deref(), Some("from-cc"));
        let body = BodyFacts { session: Some("from-body".into()), ..Default::default() };
        assert_eq!(session_id(&body, &h).as_deref(), Some("from-body"));
    }

    #[test]
    fn refuses_a_body_that_is_not_json() {
        let err = |b: &[u8]| body_facts(b).unwrap_err().0;
        assert!(err(b"{not json").starts_with("body is not valid JSON: key must be a string"), "{}", err(b"{not"));
        assert_eq!(err(br#"{"model":5}"#), "model: Input should be a valid string");
        assert_eq!(err(br#"{"stream":"yes"}"#), "stream: Input should be a valid boolean");
        assert_eq!(err(br#"{"metadata":[]}"#), "metadata: Input should be a valid dictionary");
        assert_eq!(err(br#"[1]"#), "body: Input should be a valid dictionary");
        for e in [err(br#"{"model":5}"#), err(b"[1]"), err(br#""text""#)] {
            assert!(!e.contains("Peek") && !e.contains("struct"), "no Rust type in {e}");
        }
    }

    #[test]
    fn refuses_an_empty_body_and_one_that_is_not_utf8() {
        for empty in [&b""[..], b"  \n"] {
            assert_eq!(body_facts(empty).unwrap_err().0, "body is empty: the request must be a JSON object");
        }
        // Invalid UTF-8 inside a string of a field the gateway does not read.
        let body = b"{\"model\":\"claude-sonnet-4-5\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}";
        let e = body_facts(body).unwrap_err().0;
        assert!(e.starts_with("body is not valid UTF-8: invalid bytes at offset 67"), "{e}");
        assert_eq!(body_facts(br#"{"model":"m"}"#).unwrap().model.as_deref(), Some("m"));
        // An array that serde would read as the struct's fields is no request.
        for array in [&br#"["claude-sonnet-4-5",true,null]"#[..], b" [null,null,null]"] {
            assert_eq!(body_facts(array).unwrap_err().0, "body: Input should be a valid dictionary");
        }
    }
}
