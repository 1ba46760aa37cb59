//! Anthropic's Messages wire format as the simulator speaks it: what it reads
//! from a request, the reply it makes up, and that reply rendered as a JSON
//! `message` or as the server-sent events of a stream.
//!
//! Clients validate what they get (the official SDKs parse every event), so the
//! shapes follow the Messages API field for field. What a reply *says* is made
//! up: a few sentences of a coding assistant's prose, as long as the scenario
//! and the request's `max_tokens` allow.
//!
//! Tool calls are made only when the request forces one (`tool_choice` `any` or
//! `tool`). A real client such as Claude Code executes the tools a reply calls,
//! and a simulator inventing tool inputs must never make it write a file or run
//! a command on its own initiative.

use bytes::Bytes;
use serde_json::{Value, json};

/// The models `GET /v1/models` lists: (id, display name, created at).
pub const MODELS: &[(&str, &str, &str)] = &[
    ("claude-opus-4-1-20250805", "Claude Opus 4.1", "2025-08-05T00:00:00Z"),
    ("claude-sonnet-4-5-20250929", "Claude Sonnet 4.5", "2025-09-29T00:00:00Z"),
    ("claude-haiku-4-5-20251001", "Claude Haiku 4.5", "2025-10-01T00:00:00Z"),
    ("claude-fable-5", "Claude Fable 5", "2026-06-01T00:00:00Z"),
];

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
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    let model = v.get("model").and_then(Value::as_str).ok_or("model: Field required")?;
    let max_tokens = v.get("max_tokens").and_then(Value::as_u64).ok_or("max_tokens: Field required")?;
    if !v.get("messages").is_some_and(Value::is_array) {
        return Err("messages: Field required".into());
    }
    let tools = v.get("tools").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let choice = v.get("tool_choice");
    let forced = match choice.and_then(|c| c.get("type")).and_then(Value::as_str) {
        Some("any") => tools.first(),
        Some("tool") => {
            let name =
                choice.and_then(|c| c.get("name")).and_then(Value::as_str).ok_or("tool_choice.name: Field required")?;
            Some(
                tools
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some(name))
                    .ok_or_else(|| format!("tool_choice: no tool named `{name}`"))?,
            )
        }
        _ => None,
    };
    let forced_tool = match forced {
        Some(t) => {
            let name = t.get("name").and_then(Value::as_str).ok_or("tools.0.name: Field required")?;
            Some((name.to_string(), sample_input(t.get("input_schema").unwrap_or(&Value::Null))))
        }
        None if choice.is_some_and(|c| c.get("type").and_then(Value::as_str) == Some("any")) => {
            return Err("tool_choice: `any` requires at least one tool".into());
        }
        None => None,
    };
    Ok(Ask {
        model: model.to_string(),
        stream: v.get("stream").and_then(Value::as_bool).unwrap_or(false),
        max_tokens,
        forced_tool,
    })
}

/// Input tokens of a request body: about four bytes a token, which is what
/// English text and JSON average with Claude's tokenizer.
pub fn input_tokens(body: &[u8]) -> u64 {
    (body.len() as u64 / 4).max(1)
}

/// A plausible input for a JSON schema: one value per declared property.
fn sample_input(schema: &Value) -> Value {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return json!({});
    };
    let input = props
        .iter()
        .map(|(name, prop)| {
            let value = match prop.get("enum").and_then(|e| e.get(0)) {
                Some(first) => first.clone(),
                None => match prop.get("type").and_then(Value::as_str) {
                    Some("string") => Value::from("example"),
                    Some("integer" | "number") => Value::from(1),
                    Some("boolean") => Value::from(true),
                    Some("array") => json!([]),
                    Some("object") => json!({}),
                    _ => Value::Null,
                },
            };
            (name.clone(), value)
        })
        .collect();
    Value::Object(input)
}

/// What the simulated model sends back for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// `msg_…`.
    pub id: String,
    /// The model, as asked.
    pub model: String,
    /// The text block.
    pub text: String,
    /// The tool call: `toolu_…` id, name, input.
    pub tool: Option<(String, String, Value)>,
    /// `end_turn`, `max_tokens` or `tool_use`.
    pub stop_reason: &'static str,
    /// Input tokens billed.
    pub input_tokens: u64,
    /// Output tokens billed.
    pub output_tokens: u64,
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

impl Reply {
    /// The reply to `ask`: `words` words of prose (capped by `max_tokens`),
    /// then the forced tool call if there is one. `seed` picks the prose.
    pub fn new(ask: &Ask, id: String, tool_id: String, input_tokens: u64, words: u32, seed: u64) -> Reply {
        let wanted = if ask.forced_tool.is_some() { 8 } else { u64::from(words.max(1)) };
        let capped = wanted.min(ask.max_tokens.max(1));
        let text = prose(capped as usize, seed);
        let tool = ask.forced_tool.clone().map(|(name, input)| (tool_id, name, input));
        let tool_tokens = tool.as_ref().map_or(0, |(_, _, input)| input.to_string().len() as u64 / 4 + 1);
        let stop_reason = match (&tool, capped < wanted) {
            (_, true) => "max_tokens",
            (Some(_), false) => "tool_use",
            (None, false) => "end_turn",
        };
        Reply {
            id,
            model: ask.model.clone(),
            text,
            tool,
            stop_reason,
            input_tokens,
            output_tokens: capped + tool_tokens,
        }
    }

    /// Tokens the request spends from the account's quota.
    pub fn tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }

    fn usage(&self, output_tokens: u64) -> Value {
        json!({
            "input_tokens": self.input_tokens,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        })
    }

    fn message(&self, content: Vec<Value>, stop_reason: Option<&str>, output_tokens: u64) -> Value {
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": null,
            "usage": self.usage(output_tokens),
        })
    }

    /// The non-streaming `message` object.
    pub fn to_json(&self) -> Bytes {
        let mut content = vec![json!({ "type": "text", "text": self.text })];
        if let Some((id, name, input)) = &self.tool {
            content.push(json!({ "type": "tool_use", "id": id, "name": name, "input": input }));
        }
        self.message(content, Some(self.stop_reason), self.output_tokens).to_string().into()
    }

    /// The events of a stream, in Anthropic's order: `message_start`, a text
    /// block (start, `ping`, `text_delta`s, stop), the tool block if any (its
    /// input in `input_json_delta` pieces that are not JSON on their own),
    /// `message_delta` with the stop reason and usage, `message_stop`.
    pub fn events(&self) -> Vec<Bytes> {
        let mut out = vec![
            event("message_start", json!({ "type": "message_start", "message": self.message(Vec::new(), None, 1) })),
            event(
                "content_block_start",
                json!({ "type": "content_block_start", "index": 0, "content_block": { "type": "text", "text": "" } }),
            ),
            event("ping", json!({ "type": "ping" })),
        ];
        for piece in pieces(&self.text) {
            let delta =
                json!({ "type": "content_block_delta", "index": 0, "delta": { "type": "text_delta", "text": piece } });
            out.push(event("content_block_delta", delta));
        }
        out.push(event("content_block_stop", json!({ "type": "content_block_stop", "index": 0 })));
        if let Some((id, name, input)) = &self.tool {
            let start = json!({ "type": "content_block_start", "index": 1, "content_block": { "type": "tool_use", "id": id, "name": name, "input": {} } });
            out.push(event("content_block_start", start));
            let json = input.to_string();
            // Anthropic opens with an empty piece, then sends the JSON in parts.
            for part in std::iter::once("").chain(split_json(&json)) {
                let delta = json!({ "type": "content_block_delta", "index": 1, "delta": { "type": "input_json_delta", "partial_json": part } });
                out.push(event("content_block_delta", delta));
            }
            out.push(event("content_block_stop", json!({ "type": "content_block_stop", "index": 1 })));
        }
        let delta = json!({
            "type": "message_delta",
            "delta": { "stop_reason": self.stop_reason, "stop_sequence": null },
            "usage": { "output_tokens": self.output_tokens },
        });
        out.push(event("message_delta", delta));
        out.push(event("message_stop", json!({ "type": "message_stop" })));
        out
    }
}

fn event(name: &str, data: Value) -> Bytes {
    format!("event: {name}\ndata: {data}\n\n").into()
}

/// `words` words of prose, starting at a sentence picked by `seed`.
fn prose(words: usize, seed: u64) -> String {
    let start = (seed % PROSE.len() as u64) as usize;
    let all = PROSE.iter().cycle().skip(start).flat_map(|s| s.split(' '));
    all.take(words).collect::<Vec<_>>().join(" ")
}

/// Text in pieces of a few words (the spaces stay with the word before), as a
/// model streams it.
fn pieces(text: &str) -> Vec<&str> {
    const WORDS_PER_PIECE: usize = 4;
    let mut out = Vec::new();
    let (mut start, mut n) = (0, 0);
    for (i, _) in text.match_indices(' ') {
        n += 1;
        if n == WORDS_PER_PIECE {
            out.push(&text[start..=i]);
            (start, n) = (i + 1, 0);
        }
    }
    if start < text.len() || out.is_empty() {
        out.push(&text[start..]);
    }
    out
}

/// JSON in a few parts split at char boundaries.
fn split_json(json: &str) -> Vec<&str> {
    let size = json.len().div_ceil(3).max(1);
    let mut out = Vec::new();
    let mut start = 0;
    while start < json.len() {
        let mut end = (start + size).min(json.len());
        while !json.is_char_boundary(end) {
            end += 1;
        }
        out.push(&json[start..end]);
        start = end;
    }
    out
}

/// `{"type":"error","error":{"type":kind,"message":message},"request_id":…}`.
pub fn error_body(kind: &str, message: &str, request_id: &str) -> Bytes {
    json!({ "type": "error", "error": { "type": kind, "message": message }, "request_id": request_id })
        .to_string()
        .into()
}

/// The `GET /v1/models` page.
pub fn models_page() -> Bytes {
    let data: Vec<Value> = MODELS.iter().map(model).collect();
    let page =
        json!({ "data": data, "has_more": false, "first_id": MODELS[0].0, "last_id": MODELS[MODELS.len() - 1].0 });
    page.to_string().into()
}

/// One model object, by id.
pub fn model_object(id: &str) -> Option<Bytes> {
    MODELS.iter().find(|m| m.0 == id).map(|m| model(m).to_string().into())
}

fn model(m: &(&str, &str, &str)) -> Value {
    json!({ "type": "model", "id": m.0, "display_name": m.1, "created_at": m.2 })
}

#[cfg(test)]
mod tests {
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
    fn missing_fields_are_refused_in_anthropics_words() {
        assert_eq!(ask(json!({ "max_tokens": 1, "messages": [] })).unwrap_err(), "model: Field required");
        assert_eq!(ask(json!({ "model": "m", "messages": [] })).unwrap_err(), "max_tokens: Field required");
        assert!(parse_messages(b"{").unwrap_err().starts_with("invalid JSON"));
    }

    #[test]
    fn a_stream_adds_up_to_the_json_reply() {
        let mut a = ask(json!({ "model": "claude-x", "max_tokens": 50, "messages": [], "tools": [{ "name": "t", "input_schema": { "properties": { "q": { "type": "string" } } } }], "tool_choice": { "type": "any" } })).unwrap();
        a.stream = true;
        let r = Reply::new(&a, "msg_1".into(), "toolu_1".into(), 10, 100, 3);
        assert_eq!(r.stop_reason, "tool_use");
        let events = r.events();
        let datas: Vec<Value> = events
            .iter()
            .map(|e| {
                let s = std::str::from_utf8(e).unwrap();
                serde_json::from_str(s.lines().nth(1).unwrap().strip_prefix("data: ").unwrap()).unwrap()
            })
            .collect();
        assert_eq!(datas.first().unwrap()["type"], "message_start");
        assert_eq!(datas.last().unwrap()["type"], "message_stop");
        let text: String = datas.iter().filter_map(|d| d["delta"]["text"].as_str()).collect();
        let partial: String = datas.iter().filter_map(|d| d["delta"]["partial_json"].as_str()).collect();
        let full: Value = serde_json::from_slice(&r.to_json()).unwrap();
        assert_eq!(text, full["content"][0]["text"].as_str().unwrap());
        assert_eq!(serde_json::from_str::<Value>(&partial).unwrap(), full["content"][1]["input"]);
        assert_eq!(full["stop_reason"], "tool_use");
        assert_eq!(full["usage"]["output_tokens"], r.output_tokens);
    }

    #[test]
    fn max_tokens_caps_the_reply() {
        let a = ask(json!({ "model": "m", "max_tokens": 5, "messages": [] })).unwrap();
        let r = Reply::new(&a, "msg".into(), "toolu".into(), 1, 200, 0);
        assert_eq!((r.stop_reason, r.output_tokens, r.text.split(' ').count()), ("max_tokens", 5, 5));
        assert_eq!(pieces("a b c d e f g h i"), ["a b c d ", "e f g h ", "i"]);
    }
}
