//! What the mock answers a Messages request with: a canned text (or the script's), and a
//! call of the first tool the request declares, whatever its `tool_choice`.
//!
//! How the answer is written — the JSON `message`, the SSE events, the model list — is
//! `poolgate_wire`'s, shared with the demo's simulated upstream; the official Anthropic
//! SDKs the tests drive validate every byte of it.

use std::sync::OnceLock;

use bytes::Bytes;
use poolgate_wire::message::{Chunking, Reply, StopReason, TextPieces, ToolUse};
use poolgate_wire::models::{self, Model};
use poolgate_wire::request::{MessagesRequest, estimate_input_tokens};
use serde_json::Value;

/// The text of a reply when the script does not give one.
pub const DEFAULT_TEXT: &str = "Hello! This is the mock upstream answering.";

/// The thinking block of a request that enabled extended thinking.
const THINKING: &str = "The user wants an answer; a short one will do.";

/// The text that comes before a tool call.
const TOOL_PREAMBLE: &str = "Let me call the tool for that.";

/// What a string property of a called tool's input is set to.
const SAMPLE_TEXT: &str = "mock";

/// The models `GET /v1/models` lists, newest first.
pub const MODELS: &[Model] = &[
    Model::new("claude-opus-4-1-20250805", "Claude Opus 4.1", "2025-08-05T00:00:00Z"),
    Model::new("claude-sonnet-4-5-20250929", "Claude Sonnet 4.5", "2025-09-29T00:00:00Z"),
    Model::new("claude-haiku-4-5-20251001", "Claude Haiku 4.5", "2025-10-01T00:00:00Z"),
    Model::new("claude-3-5-haiku-20241022", "Claude Haiku 3.5", "2024-10-22T00:00:00Z"),
];

/// Streams stay short however long a scripted text is: at most 8 `text_delta`s, and a
/// tool input in 4 parts.
pub(crate) const CHUNKING: Chunking = Chunking { text: TextPieces::AtMost(8), json_parts: 4 };

/// A parsed request to `/v1/messages`: what the reply must echo or act on.
#[derive(Debug)]
pub(crate) struct Ask {
    pub model: String,
    pub stream: bool,
    /// The first tool's name and the input we "call" it with.
    pub tool: Option<(String, Value)>,
    pub input_tokens: u64,
    /// Whether the request marks a prompt-cache breakpoint (`cache_control`).
    pub cached: bool,
    /// Whether the request enabled extended thinking.
    pub thinking: bool,
}

/// Parses a Messages request, or says what is wrong in Anthropic's words.
pub(crate) fn parse_messages(body: &[u8]) -> Result<Ask, String> {
    let req = MessagesRequest::parse(body)?;
    let tool = req.tools.first().map(|t| (t.name.clone(), t.sample_input(SAMPLE_TEXT)));
    let cached = has_cache_control(body);
    let (model, stream, thinking) = (req.model, req.stream, req.thinking);
    Ok(Ask { model, stream, tool, input_tokens: estimate_input_tokens(body), cached, thinking })
}

/// Whether `body` holds a `cache_control` key anywhere.
fn has_cache_control(body: &[u8]) -> bool {
    body.windows(b"\"cache_control\"".len()).any(|w| w == b"\"cache_control\"")
}

/// An estimate of output tokens for a reply: one per word plus the tool input's size.
fn output_tokens(text: &str, tool_json: Option<&str>) -> u64 {
    let words = text.split_whitespace().count() as u64;
    (words + tool_json.map_or(0, |j| j.len() as u64 / 4)).max(1)
}

/// The reply to `ask`; `text` overrides the default text; `ids` makes `msg_…` and
/// `toolu_…` ids from their prefix.
pub(crate) fn reply(ask: Ask, text: Option<&str>, ids: &impl Fn(&str) -> String) -> Reply {
    let tool = ask.tool.map(|(name, input)| ToolUse { id: ids("toolu_"), name, input });
    let text = match (text, &tool) {
        (Some(t), _) => t.to_owned(),
        (None, Some(_)) => TOOL_PREAMBLE.to_owned(),
        (None, None) => DEFAULT_TEXT.to_owned(),
    };
    let tool_json = tool.as_ref().map(|t| t.input.to_string());
    let thinking = ask.thinking.then(|| THINKING.to_owned());
    let output_tokens =
        output_tokens(&text, tool_json.as_deref()) + thinking.as_deref().map_or(0, |t| output_tokens(t, None));
    let stop_reason = if tool.is_some() { StopReason::ToolUse } else { StopReason::EndTurn };
    // A request with a cache breakpoint reports cache use, by a fixed rule
    // (what a gateway's usage ledger must then count to the token): twice its
    // input read from the cache, a quarter (and one) written to it.
    let (cache_read_input_tokens, cache_creation_input_tokens) = match ask.cached {
        true => (ask.input_tokens * 2, ask.input_tokens / 4 + 1),
        false => (0, 0),
    };
    Reply {
        id: ids("msg_"),
        model: ask.model,
        thinking,
        text,
        tool,
        stop_reason,
        input_tokens: ask.input_tokens,
        output_tokens,
        cache_read_input_tokens,
        cache_creation_input_tokens,
    }
}

/// The `GET /v1/models` page; built once because it never changes.
pub(crate) fn models_body() -> Bytes {
    static BODY: OnceLock<Bytes> = OnceLock::new();
    BODY.get_or_init(|| models::page(MODELS).into()).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_tool_is_called_whatever_the_tool_choice() {
        let body = br#"{"model":"m","max_tokens":5,"messages":[],"stream":true,"tool_choice":{"type":"none"},
            "tools":[{"name":"get_weather","input_schema":{"type":"object","properties":
              {"city":{"type":"string"},"unit":{"type":"string","enum":["c","f"]},"days":{"type":"integer"}}}},
              {"name":"other","input_schema":{}}]}"#;
        let ask = parse_messages(body).unwrap();
        assert!(ask.stream);
        let (name, input) = ask.tool.clone().unwrap();
        assert_eq!(name, "get_weather");
        assert_eq!(input, serde_json::json!({"city": "mock", "unit": "c", "days": 1}));
        let r = reply(ask, None, &|p| format!("{p}1"));
        assert_eq!(
            (r.text.as_str(), r.stop_reason, r.tool.unwrap().id),
            (TOOL_PREAMBLE, StopReason::ToolUse, "toolu_1".into())
        );
    }

    #[test]
    fn a_reply_without_tools_is_the_default_text_or_the_scripts() {
        let ask = || parse_messages(br#"{"model":"m","max_tokens":1,"messages":[],"tools":[]}"#).unwrap();
        let r = reply(ask(), None, &|p| format!("{p}1"));
        assert_eq!((r.text.as_str(), r.stop_reason, r.output_tokens), (DEFAULT_TEXT, StopReason::EndTurn, 7));
        assert_eq!(reply(ask(), Some("two words"), &|p| p.to_owned()).output_tokens, 2);
    }
}
