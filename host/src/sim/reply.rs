//! What the simulated model answers: what it reads from a request, and the reply
//! it makes up — a few sentences of a coding assistant's prose, as long as the
//! scenario and the request's `max_tokens` allow.
//!
//! How a request is read and a reply written (the JSON `message`, the events of
//! a stream, the model list) is `poolgate_wire`'s, shared with the test mock;
//! clients validate what they get (the official SDKs parse every event).
//!
//! Tool calls are made only when the request forces one (`tool_choice` `any` or
//! `tool`). A real client such as Claude Code executes the tools a reply calls,
//! and a simulator inventing tool inputs must never make it write a file or run
//! a command on its own initiative.

use poolgate_wire::message::{Chunking, Reply, StopReason, TextPieces, ToolUse};
use poolgate_wire::models::Model;
use poolgate_wire::request::MessagesRequest;
use serde_json::Value;

/// The models `GET /v1/models` lists.
pub const MODELS: &[Model] = &[
    Model::new("claude-opus-4-1-20250805", "Claude Opus 4.1", "2025-08-05T00:00:00Z"),
    Model::new("claude-sonnet-4-5-20250929", "Claude Sonnet 4.5", "2025-09-29T00:00:00Z"),
    Model::new("claude-haiku-4-5-20251001", "Claude Haiku 4.5", "2025-10-01T00:00:00Z"),
    Model::new("claude-fable-5", "Claude Fable 5", "2026-06-01T00:00:00Z"),
];

/// A stream as a model streams it: a delta every four words, a tool input in
/// three parts.
pub const CHUNKING: Chunking = Chunking { text: TextPieces::Words(4), json_parts: 3 };

/// What a string property of a forced tool call's input is set to.
const SAMPLE_TEXT: &str = "example";

/// What a `POST /v1/messages` asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    /// The model, as the client named it (echoed back).
    pub model: String,
    /// `stream: true`.
    pub stream: bool,
    /// `max_tokens`.
    pub max_tokens: u64,
    /// The tool the reply must call, with the input it calls it with.
    pub forced_tool: Option<(String, Value)>,
}

/// Reads a Messages request, or says what is wrong in Anthropic's words.
pub fn parse_messages(body: &[u8]) -> Result<Ask, String> {
    let req = MessagesRequest::parse(body)?;
    let forced_tool = req.forced_tool()?.map(|t| (t.name.clone(), t.sample_input(SAMPLE_TEXT)));
    Ok(Ask { model: req.model, stream: req.stream, max_tokens: req.max_tokens, forced_tool })
}

/// Sentences the simulated assistant strings together.
const PROSE: &[&str] = &[
    "I'll start by reading the module that owns this behaviour.",
    "The failing case comes from an off-by-one in the window arithmetic.",
    "Here is a smaller change that keeps the public API as it is.",
    "The tests cover the edge where the reset has already passed.",
    "This keeps the hot path free of allocations.",
    "Let me check how the caller handles an empty list.",
    "I've updated the documentation to match the new behaviour.",
    "That should fix the flaky test without slowing the suite down.",
];

/// The reply to `ask`: `words` words of prose (capped by `max_tokens`), then
/// the forced tool call if there is one (`tool_id`). `seed` picks the prose.
pub fn reply(ask: &Ask, id: String, tool_id: String, input_tokens: u64, words: u32, seed: u64) -> Reply {
    let wanted = if ask.forced_tool.is_some() { 8 } else { u64::from(words.max(1)) };
    let capped = wanted.min(ask.max_tokens.max(1));
    let tool = ask.forced_tool.clone().map(|(name, input)| ToolUse { id: tool_id, name, input });
    let tool_tokens = tool.as_ref().map_or(0, |t| t.input.to_string().len() as u64 / 4 + 1);
    let stop_reason = match (&tool, capped < wanted) {
        (_, true) => StopReason::MaxTokens,
        (Some(_), false) => StopReason::ToolUse,
        (None, false) => StopReason::EndTurn,
    };
    Reply {
        id,
        model: ask.model.clone(),
        thinking: None,
        text: prose(capped as usize, seed),
        tool,
        stop_reason,
        input_tokens,
        output_tokens: capped + tool_tokens,
        cache_read_input_tokens: 0,
        cache_creation_input_tokens: 0,
    }
}

/// `words` words of prose, starting at a sentence picked by `seed`.
fn prose(words: usize, seed: u64) -> String {
    let start = (seed % PROSE.len() as u64) as usize;
    let all = PROSE.iter().cycle().skip(start).flat_map(|s| s.split(' '));
    all.take(words).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ask(body: Value) -> Result<Ask, String> {
        parse_messages(body.to_string().as_bytes())
    }

    #[test]
    fn a_tool_is_called_only_when_the_request_forces_one() {
        let tools = json!([{ "name": "get_weather", "input_schema": { "properties": { "city": { "type": "string" }, "unit": { "enum": ["c", "f"] } } } }]);
        let base = json!({ "model": "m", "max_tokens": 100, "messages": [], "tools": tools });
        assert_eq!(ask(base.clone()).unwrap().forced_tool, None);
        let mut forced = base.clone();
        forced["tool_choice"] = json!({ "type": "any" });
        let (name, input) = ask(forced).unwrap().forced_tool.unwrap();
        assert_eq!((name.as_str(), input), ("get_weather", json!({ "city": "example", "unit": "c" })));
        let mut named = base;
        named["tool_choice"] = json!({ "type": "tool", "name": "nope" });
        assert!(ask(named).unwrap_err().contains("no tool named `nope`"));
    }

    #[test]
    fn a_forced_call_follows_a_short_text_and_ends_the_turn() {
        let a = ask(json!({ "model": "claude-x", "max_tokens": 50, "messages": [], "tools": [{ "name": "t", "input_schema": { "properties": { "q": { "type": "string" } } } }], "tool_choice": { "type": "any" } })).unwrap();
        let r = reply(&a, "msg_1".into(), "toolu_1".into(), 10, 100, 3);
        assert_eq!((r.stop_reason, r.text.split(' ').count()), (StopReason::ToolUse, 8));
        let tool = r.tool.as_ref().unwrap();
        assert_eq!((tool.id.as_str(), tool.name.as_str(), &tool.input), ("toolu_1", "t", &json!({ "q": "example" })));
        assert_eq!(r.output_tokens, 8 + 4, "the words and the tool input");
        assert_eq!(r.tokens(), 10 + 12);
    }

    #[test]
    fn max_tokens_caps_the_reply() {
        let a = ask(json!({ "model": "m", "max_tokens": 5, "messages": [] })).unwrap();
        let r = reply(&a, "msg".into(), "toolu".into(), 1, 200, 0);
        assert_eq!((r.stop_reason, r.output_tokens, r.text.split(' ').count()), (StopReason::MaxTokens, 5, 5));
        assert_eq!(r.text, "I'll start by reading the");
    }
}
