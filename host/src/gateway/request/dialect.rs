//! The API shape a client speaks, at the two ends of the one request path.
//!
//! The phases (`proxy`) work on one Anthropic Messages request. A client that
//! speaks OpenAI's Chat Completions (`POST /v1/chat/completions`, or
//! `GET /v1/models` without `anthropic-version`) has its request translated
//! on the way in ([`translate_request`], plain data → data in
//! `poolgate_wire::openai`) and every answer translated on the way out, before
//! the request finishes — so the status the decision record and the metrics
//! keep is the status the client got (a pool that answers 529 is a 503 to an
//! OpenAI client, in both). How an answer is translated depends on where its
//! body is:
//!
//! - in memory (the gateway's own answers, an account's error or JSON answer
//!   once read whole): [`Dialect::whole`], status and body together;
//! - a stream: event by event through [`super::body::Translate`], the status
//!   unchanged (a 2xx).

use std::collections::BTreeMap;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use poolgate_wire::openai::{self, ChatStream, OpenAiError};

/// What the answer's translation needs to know about a chat request.
#[derive(Debug, Clone, Default)]
pub struct ChatFacts {
    /// The model as the client named it (the answer names it back).
    pub model: String,
    /// Whether the stream ends with a usage chunk.
    pub include_usage: bool,
    /// When the request was read, Unix seconds (a chat answer's `created`).
    pub created_s: u64,
}

/// How a client's answers are written.
#[derive(Debug, Clone, Default)]
pub enum Dialect {
    /// Anthropic's API: answers pass as the account wrote them.
    #[default]
    Anthropic,
    /// OpenAI's Chat Completions (`facts` default until the request was read).
    Chat(ChatFacts),
    /// OpenAI's model list.
    Models,
}

impl Dialect {
    /// Whether answers are translated.
    pub fn is_openai(&self) -> bool {
        !matches!(self, Dialect::Anthropic)
    }

    /// `r`, whose body is in memory, in the client's shape: an error in
    /// OpenAI's error shape (with OpenAI's status for it: 529 → 503), a
    /// success as a chat completion or a model list.
    pub fn whole(&self, r: Response) -> Response {
        if !self.is_openai() {
            return r;
        }
        let (mut parts, body) = r.into_parts();
        let Some(bytes) = in_memory(body) else {
            // Only bodies already read come here (every local answer is one,
            // and an account's is read whole first); anything else goes as is.
            debug_assert!(false, "Dialect::whole on a streaming body");
            return Response::from_parts(parts, Body::empty());
        };
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        let (status, out) = match self {
            _ if !parts.status.is_success() => openai::anthropic_error_to_openai(parts.status.as_u16(), &value),
            Dialect::Chat(f) => (parts.status.as_u16(), openai::messages_to_chat(&value, &f.model, f.created_s)),
            _ => (parts.status.as_u16(), openai::models_to_openai(&value)),
        };
        parts.status = StatusCode::from_u16(status).unwrap_or(parts.status);
        parts.headers.remove(header::CONTENT_LENGTH);
        parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        Response::from_parts(parts, Body::from(out.to_string()))
    }

    /// The translation of an event stream the account answers with, when
    /// the client reads another dialect (`None`: it passes as it is).
    pub fn stream_translation(&self) -> Option<ChatStream> {
        match self {
            Dialect::Chat(f) => Some(ChatStream::new(&f.model, f.created_s, f.include_usage)),
            Dialect::Anthropic | Dialect::Models => None,
        }
    }
}

/// The bytes of a body already in memory (one built from bytes or a string):
/// such a body is ready at its first poll. `None` for one that is not.
fn in_memory(body: Body) -> Option<Bytes> {
    futures_util::FutureExt::now_or_never(axum::body::to_bytes(body, usize::MAX))?.ok()
}

/// An error in OpenAI's shape.
pub fn error_response(e: &OpenAiError) -> Response {
    let mut r = Response::new(Body::from(e.to_body().to_string()));
    *r.status_mut() = StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST);
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// Translates a chat client's body and headers into a Messages request: the
/// body, the upstream path, and the facts the answer's translation needs. The
/// headers lose `accept-encoding` (a compressed stream could not be
/// translated event by event) and gain `anthropic-version` if absent.
/// `now_ms`: when the request was read.
pub fn translate_request(
    body: &Bytes,
    headers: &mut HeaderMap,
    aliases: &BTreeMap<String, String>,
    now_ms: u64,
) -> Result<(Bytes, Uri, ChatFacts), Box<Response>> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        Box::new(error_response(&OpenAiError::invalid(format!("the body is not valid JSON: {e}"), None)))
    })?;
    // `claude-*` models pass; other names through `[models] aliases`, else a
    // 400 naming the model.
    let alias = |name: &str| aliases.get(name).cloned();
    let translated = openai::chat_to_messages(&value, &alias).map_err(|e| Box::new(error_response(&e)))?;
    headers.remove(header::ACCEPT_ENCODING);
    headers.remove(header::CONTENT_LENGTH);
    if !headers.contains_key("anthropic-version") {
        headers.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
    }
    let facts = ChatFacts {
        model: translated.model.clone(),
        include_usage: translated.include_usage,
        created_s: now_ms / 1000,
    };
    let body = Bytes::from(translated.body.to_string());
    Ok((body, Uri::from_static("/v1/messages"), facts))
}

/// Whether a `GET /v1/models` comes from an OpenAI-shaped client: one that
/// sends no `anthropic-version` (every Anthropic SDK and Claude Code does).
/// Its request goes to the pool as Anthropic's (the version added, no
/// compression asked for).
pub fn openai_models(headers: &mut HeaderMap) -> bool {
    if headers.contains_key("anthropic-version") {
        return false;
    }
    headers.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
    headers.remove(header::ACCEPT_ENCODING);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anthropic_error(status: u16, kind: &str) -> Response {
        let body = format!(r#"{{"type":"error","error":{{"type":"{kind}","message":"why"}}}}"#);
        let mut r = Response::new(Body::from(body));
        *r.status_mut() = StatusCode::from_u16(status).unwrap();
        r.headers_mut().insert("x-poolgate-request-id", HeaderValue::from(7));
        r.headers_mut().insert(header::CONTENT_LENGTH, HeaderValue::from(99));
        r
    }

    #[test]
    fn an_overloaded_answer_is_a_503_in_openais_shape_and_keeps_its_headers() {
        let r = Dialect::Chat(ChatFacts::default()).whole(anthropic_error(529, "overloaded_error"));
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["x-poolgate-request-id"], "7");
        assert!(r.headers().get(header::CONTENT_LENGTH).is_none(), "the length changed");
        let body = in_memory(r.into_body()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "overloaded");
    }

    #[test]
    fn an_anthropic_client_gets_the_answer_untouched() {
        let r = Dialect::Anthropic.whole(anthropic_error(529, "overloaded_error"));
        assert_eq!(r.status(), 529);
        assert_eq!(r.headers()[header::CONTENT_LENGTH], "99");
    }

    #[test]
    fn a_models_page_becomes_openais_list() {
        let page =
            r#"{"data":[{"id":"claude-x","type":"model","created_at":"2025-01-01T00:00:00Z"}],"has_more":false}"#;
        let r = Dialect::Models.whole(Response::new(Body::from(page)));
        let v: serde_json::Value = serde_json::from_slice(&in_memory(r.into_body()).unwrap()).unwrap();
        assert_eq!(v["object"], "list");
        assert_eq!(v["data"][0]["id"], "claude-x");
    }
}
