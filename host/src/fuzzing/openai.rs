//! The OpenAI dialect, both ways: a Chat Completions client's request in and
//! its answers out (whole and streamed), and the reverse a fallback backend
//! speaking OpenAI's API needs. Whatever comes in, what goes out parses as
//! JSON (a client's SDK parses every byte), and a translated request is one
//! the gateway itself reads.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde_json::Value;

use super::{NOW_MS, chunks};
use crate::gateway::request::dialect::{self, ChatFacts, Dialect};
use crate::gateway::request::read;
use poolgate_wire::openai::{self, ChatStream, MessagesStream};
use poolgate_wire::sse::Parser;

/// A Chat Completions request body, translated in as the routes do, then
/// read for routing; and the same bytes as a Messages body translated out
/// for an OpenAI-speaking fallback.
pub fn request(data: &[u8]) {
    let aliases = BTreeMap::from([("gpt-4o".to_string(), "claude-sonnet-4-5".to_string())]);
    let mut headers = HeaderMap::new();
    match dialect::translate_request(&Bytes::copy_from_slice(data), &mut headers, &aliases, NOW_MS) {
        Ok((body, _, facts)) => {
            let read = read::body_facts(&body).expect("a translated request is a body the gateway reads");
            assert!(read.model.is_some(), "a translated request names its model");
            assert!(!facts.model.is_empty());
            assert!(headers.contains_key("anthropic-version"));
        }
        Err(refusal) => assert!(refusal.status().is_client_error(), "a refused request is the client's error"),
    }
    if let Ok(value) = serde_json::from_slice::<Value>(data)
        && let Ok(chat) = openai::messages_to_chat_request(&value, "backend-model")
    {
        assert_eq!(chat["model"], "backend-model");
        assert_json(chat.to_string().as_bytes());
    }
}

/// The status an answer target's first byte picks: successes and every
/// error the upstream or the gateway answers with.
fn status(b: u8) -> u16 {
    const STATUSES: [u16; 12] = [200, 400, 401, 403, 404, 408, 413, 429, 500, 502, 503, 529];
    STATUSES[usize::from(b) % STATUSES.len()]
}

/// An answer read whole (first byte: its status; the rest: its body) in the
/// chat client's dialect, as `Dialect::whole` writes it, and a backend's
/// Chat Completions answer in Anthropic's.
pub fn answer(data: &[u8]) {
    let Some((&first, body)) = data.split_first() else { return };
    let status = status(first);
    let facts = ChatFacts { model: "gpt-4o".into(), include_usage: true, created_s: NOW_MS / 1000 };
    for d in [Dialect::Chat(facts), Dialect::Models] {
        let mut r = Response::new(Body::from(body.to_vec()));
        *r.status_mut() = StatusCode::from_u16(status).expect("a status");
        let out = d.whole(r);
        assert_eq!(out.status().is_success(), (200..300).contains(&status), "a translation kept the outcome");
        let bytes = futures_util::FutureExt::now_or_never(axum::body::to_bytes(out.into_body(), usize::MAX))
            .expect("a whole answer is in memory")
            .expect("a body");
        assert_json(&bytes);
    }
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let back = openai::chat_to_messages_answer(&value, "claude-x");
    assert_json(back.to_string().as_bytes());
    let (to, text) = openai::openai_error_to_anthropic(status, &value);
    assert!((400..600).contains(&to) || (200..300).contains(&status));
    assert_json(text.as_bytes());
}

fn assert_json(bytes: &[u8]) {
    if let Err(e) = serde_json::from_slice::<Value>(bytes) {
        panic!("not JSON ({e}): {}", String::from_utf8_lossy(bytes));
    }
}

/// A stream translated event by event, cut into chunks at [`super::CUT`]:
/// an Anthropic stream to Chat Completions chunks (every line a JSON chunk
/// or `[DONE]`, last), and an OpenAI stream to Anthropic events (every event
/// JSON whose type is its name, in the order Anthropic's grammar allows).
/// Neither depends on where the chunks were cut.
pub fn stream(data: &[u8]) {
    let chunks = chunks(data);
    let chat = |pieces: &[&[u8]]| {
        let mut s = ChatStream::new("gpt-4o", NOW_MS / 1000, true);
        let mut out: Vec<String> = pieces.iter().flat_map(|c| s.feed(c)).collect();
        out.extend(s.finish());
        out
    };
    let out = chat(&chunks);
    assert_eq!(out, chat(&[&chunks.concat()]), "the translation depends on where the stream was cut");
    assert_eq!(out.last().map(String::as_str), Some("data: [DONE]\n\n"), "a chat stream ends with [DONE]");
    assert_eq!(out.iter().filter(|l| l.as_str() == "data: [DONE]\n\n").count(), 1, "one [DONE]: {out:?}");
    for line in &out {
        let data = line.strip_prefix("data: ").and_then(|l| l.strip_suffix("\n\n")).expect("a data line");
        if data != "[DONE]" {
            assert_json(data.as_bytes());
        }
    }

    let messages = |pieces: &[&[u8]]| {
        let mut s = MessagesStream::new("claude-x");
        let mut out: Vec<String> = pieces.iter().flat_map(|c| s.feed(c)).collect();
        out.extend(s.finish());
        out
    };
    let out = messages(&chunks);
    assert_eq!(out, messages(&[&chunks.concat()]), "the translation depends on where the stream was cut");
    anthropic_grammar(&out.concat());
}

/// Anthropic's event grammar: `message_start` first and once; blocks opened
/// in index order, each closed before the next opens, deltas only to the
/// open one; then `message_delta` and `message_stop` last — or an `error`
/// event, last, wherever the stream broke.
fn anthropic_grammar(stream: &str) {
    let events = Parser::new().feed(stream.as_bytes());
    let (mut started, mut open, mut next, mut stopped) = (false, None::<u64>, 0u64, false);
    for (i, e) in events.iter().enumerate() {
        let data: Value = serde_json::from_str(&e.data).expect("an event's data is JSON");
        assert_eq!(data["type"], e.name.as_str(), "an event's type is its name");
        assert!(!stopped, "an event after message_stop: {stream}");
        let index = data["index"].as_u64();
        match e.name.as_str() {
            "error" => assert_eq!(i + 1, events.len(), "an error ends the stream: {stream}"),
            "message_start" => assert!(!started, "a second message_start: {stream}"),
            _ if !started => panic!("{} before message_start: {stream}", e.name),
            "content_block_start" => {
                assert!(open.is_none() && index == Some(next), "a block opened out of order: {stream}");
                (open, next) = (index, next + 1);
            }
            "content_block_delta" => assert!(open.is_some() && index == open, "a delta to a closed block: {stream}"),
            "content_block_stop" => {
                assert!(open.is_some() && index == open, "a block closed twice: {stream}");
                open = None;
            }
            "message_delta" => assert!(open.is_none(), "message_delta inside a block: {stream}"),
            "message_stop" => stopped = true,
            other => panic!("an event Anthropic never sends: {other}"),
        }
        started = true;
    }
    assert!(stopped || events.last().is_some_and(|e| e.name == "error"), "a stream neither stopped nor failed");
}
