//! Anthropic's JSON wire format: what a request asks for and the bodies we answer with.
//!
//! Tests drive the gateway with the official Anthropic SDKs, which validate what they get
//! back, so the bodies here follow the Messages API field for field. Requests are parsed
//! only as far as the reply needs (model, `stream`, the first tool); everything else,
//! including Claude Code's ~90 KB of system prompt and tool schemas, is skipped unparsed.

use std::borrow::Cow;
use std::fmt;
use std::sync::OnceLock;

use bytes::Bytes;
use serde::de::{self, IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// The text of a reply when the script does not give one.
pub const DEFAULT_TEXT: &str = "Hello! This is the mock upstream answering.";

/// The text that comes before a tool call.
const TOOL_PREAMBLE: &str = "Let me call the tool for that.";

/// The models `GET /v1/models` lists, newest first: (id, display name, created at).
pub const MODELS: &[(&str, &str, &str)] = &[
    ("claude-opus-4-1-20250805", "Claude Opus 4.1", "2025-08-05T00:00:00Z"),
    ("claude-sonnet-4-5-20250929", "Claude Sonnet 4.5", "2025-09-29T00:00:00Z"),
    ("claude-haiku-4-5-20251001", "Claude Haiku 4.5", "2025-10-01T00:00:00Z"),
    ("claude-3-5-haiku-20241022", "Claude Haiku 3.5", "2024-10-22T00:00:00Z"),
];

/// The parts of a `POST /v1/messages` body that shape the reply.
#[derive(Deserialize)]
struct MessagesRequest<'a> {
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
    max_tokens: Option<IgnoredAny>,
    messages: Option<IgnoredAny>,
    stream: Option<bool>,
    #[serde(default)]
    tools: FirstTool,
}

/// The first tool of `tools`; the rest are skipped without building values.
#[derive(Default)]
struct FirstTool(Option<ToolDef>);

#[derive(Deserialize)]
struct ToolDef {
    name: String,
    #[serde(default)]
    input_schema: Value,
}

impl<'de> Deserialize<'de> for FirstTool {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct First;
        impl<'de> Visitor<'de> for First {
            type Value = FirstTool;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of tools or null")
            }
            fn visit_unit<E: de::Error>(self) -> Result<FirstTool, E> {
                Ok(FirstTool(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<FirstTool, A::Error> {
                let first = seq.next_element::<ToolDef>()?;
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(FirstTool(first))
            }
        }
        d.deserialize_any(First)
    }
}

/// A parsed request to `/v1/messages`: what the reply must echo or act on.
#[derive(Debug)]
pub(crate) struct Ask {
    pub model: String,
    pub stream: bool,
    /// The first tool's name and the input we "call" it with.
    pub tool: Option<(String, Value)>,
    pub input_tokens: u64,
}

/// Parses a Messages request, or says what is wrong in Anthropic's words.
pub(crate) fn parse_messages(body: &[u8]) -> Result<Ask, String> {
    let req: MessagesRequest<'_> = serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    let model = req.model.ok_or("model: Field required")?;
    req.max_tokens.ok_or("max_tokens: Field required")?;
    req.messages.ok_or("messages: Field required")?;
    Ok(Ask {
        model: model.into_owned(),
        stream: req.stream.unwrap_or(false),
        tool: req.tools.0.map(|t| {
            let input = sample_input(&t.input_schema);
            (t.name, input)
        }),
        input_tokens: input_tokens(body),
    })
}

/// A deterministic token estimate (about 4 bytes per token), so tests can predict usage.
pub(crate) fn input_tokens(body: &[u8]) -> u64 {
    (body.len() as u64 / 4).max(1)
}

/// An estimate of output tokens for a reply: one per word plus the tool input's size.
pub(crate) fn output_tokens(text: &str, tool_json: Option<&str>) -> u64 {
    let words = text.split_whitespace().count() as u64;
    (words + tool_json.map_or(0, |j| j.len() as u64 / 4)).max(1)
}

/// A plausible tool input for a JSON schema: one value per declared property, by type.
fn sample_input(schema: &Value) -> Value {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return Value::Object(Map::new());
    };
    let input = props
        .iter()
        .map(|(name, prop)| {
            let value = if let Some(first) = prop.get("enum").and_then(|e| e.get(0)) {
                first.clone()
            } else {
                match prop.get("type").and_then(Value::as_str) {
                    Some("string") => Value::from("mock"),
                    Some("integer" | "number") => Value::from(1),
                    Some("boolean") => Value::from(true),
                    Some("array") => Value::Array(Vec::new()),
                    Some("object") => Value::Object(Map::new()),
                    _ => Value::Null,
                }
            };
            (name.clone(), value)
        })
        .collect();
    Value::Object(input)
}

/// The tool call a reply makes.
pub(crate) struct ToolCall {
    /// `toolu_…`.
    pub id: String,
    pub name: String,
    pub input: Value,
    /// `input` as compact JSON: what the `input_json_delta` pieces add up to.
    pub json: String,
}

/// The assistant reply one request gets; rendered as JSON or as SSE events.
pub(crate) struct Reply {
    pub id: String,
    pub model: String,
    pub text: String,
    pub tool: Option<ToolCall>,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl Reply {
    /// The reply to `ask`; `text` overrides the default text.
    pub fn new(ask: Ask, text: Option<&str>, ids: &impl Fn(&str) -> String) -> Reply {
        let tool = ask.tool.map(|(name, input)| ToolCall { id: ids("toolu_"), name, json: input.to_string(), input });
        let text = match (text, &tool) {
            (Some(t), _) => t.to_owned(),
            (None, Some(_)) => TOOL_PREAMBLE.to_owned(),
            (None, None) => DEFAULT_TEXT.to_owned(),
        };
        let output_tokens = output_tokens(&text, tool.as_ref().map(|t| t.json.as_str()));
        Reply { id: ids("msg_"), model: ask.model, text, tool, input_tokens: ask.input_tokens, output_tokens }
    }

    pub fn stop_reason(&self) -> &'static str {
        if self.tool.is_some() { "tool_use" } else { "end_turn" }
    }

    /// The non-streaming `message` object.
    pub fn to_json(&self) -> Bytes {
        let mut content = vec![Block::Text { text: &self.text }];
        if let Some(t) = &self.tool {
            content.push(Block::ToolUse { id: &t.id, name: &t.name, input: &t.input });
        }
        let message = Message {
            id: &self.id,
            kind: "message",
            role: "assistant",
            model: &self.model,
            content,
            stop_reason: Some(self.stop_reason()),
            stop_sequence: None,
            usage: Usage::full(self.input_tokens, self.output_tokens),
        };
        serde_json::to_vec(&message).expect("message serializes").into()
    }
}

/// A `message` object, as in a JSON reply and in `message_start`.
#[derive(Serialize)]
pub(crate) struct Message<'a> {
    pub id: &'a str,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub model: &'a str,
    pub content: Vec<Block<'a>>,
    pub stop_reason: Option<&'a str>,
    pub stop_sequence: Option<&'a str>,
    pub usage: Usage,
}

/// A content block.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Block<'a> {
    Text { text: &'a str },
    ToolUse { id: &'a str, name: &'a str, input: &'a Value },
}

/// The `usage` object.
#[derive(Serialize)]
pub(crate) struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub cache_read_input_tokens: u64,
}

impl Usage {
    pub fn full(input_tokens: u64, output_tokens: u64) -> Usage {
        Usage { input_tokens, output_tokens, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 }
    }
}

/// `{"type":"error","error":{"type":kind,"message":message}}`.
pub(crate) fn error_body(kind: &str, message: &str) -> Bytes {
    #[derive(Serialize)]
    struct Inner<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        message: &'a str,
    }
    #[derive(Serialize)]
    struct Envelope<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        error: Inner<'a>,
    }
    let body = Envelope { kind: "error", error: Inner { kind, message } };
    serde_json::to_vec(&body).expect("error serializes").into()
}

/// `{"input_tokens": N}`.
pub(crate) fn count_tokens_body(request: &[u8]) -> Bytes {
    format!("{{\"input_tokens\":{}}}", input_tokens(request)).into()
}

/// The `GET /v1/models` page; built once because it never changes.
pub(crate) fn models_body() -> Bytes {
    static BODY: OnceLock<Bytes> = OnceLock::new();
    BODY.get_or_init(|| {
        let data: Vec<Value> = MODELS
            .iter()
            .map(|(id, name, created)| {
                serde_json::json!({"type": "model", "id": id, "display_name": name, "created_at": created})
            })
            .collect();
        let page = serde_json::json!({
            "data": data,
            "has_more": false,
            "first_id": MODELS.first().map(|m| m.0),
            "last_id": MODELS.last().map(|m| m.0),
        });
        serde_json::to_vec(&page).expect("models serialize").into()
    })
    .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_takes_first_tool_and_skips_the_rest() {
        let body = br#"{"model":"m","max_tokens":5,"messages":[],"stream":true,
            "tools":[{"name":"get_weather","input_schema":{"type":"object","properties":
              {"city":{"type":"string"},"unit":{"type":"string","enum":["c","f"]},"days":{"type":"integer"}}}},
              {"name":"other","input_schema":{}}]}"#;
        let ask = parse_messages(body).unwrap();
        assert!(ask.stream);
        let (name, input) = ask.tool.unwrap();
        assert_eq!(name, "get_weather");
        assert_eq!(input, serde_json::json!({"city": "mock", "unit": "c", "days": 1}));
    }

    #[test]
    fn parse_reports_missing_fields_and_bad_json() {
        assert!(parse_messages(b"{").unwrap_err().starts_with("invalid JSON"));
        assert_eq!(parse_messages(br#"{"max_tokens":1,"messages":[]}"#).unwrap_err(), "model: Field required");
        assert!(parse_messages(br#"{"model":"m","max_tokens":1,"messages":[],"tools":null}"#).unwrap().tool.is_none());
        assert!(parse_messages(br#"{"model":"m","max_tokens":1,"messages":[],"tools":[]}"#).unwrap().tool.is_none());
    }
}
