//! Reading a Messages request, only as far as a reply needs.
//!
//! Claude Code sends ~90 KB a turn — a long system prompt, the conversation,
//! dozens of tool schemas — and a fake needs a handful of fields of it: the
//! model, `max_tokens`, `stream`, the tools' names and `tool_choice`. Everything
//! else is skipped without being built; tool schemas are kept as borrowed text
//! and only the one a reply calls is parsed ([`Tool::sample_input`]).
//!
//! What is wrong with a request is said in Anthropic's words (`model: Field
//! required`), as the message of a 400 `invalid_request_error`.

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// What a `POST /v1/messages` asks for.
#[derive(Debug)]
pub struct MessagesRequest<'a> {
    /// The model, as the client named it.
    pub model: String,
    /// `max_tokens`.
    pub max_tokens: u64,
    /// `stream: true`.
    pub stream: bool,
    /// The tools it declares, in order.
    pub tools: Vec<Tool<'a>>,
    /// `tool_choice`, if given.
    pub tool_choice: Option<ToolChoice>,
    /// Whether extended thinking is on (`"thinking": {"type": "enabled", …}`).
    pub thinking: bool,
}

/// A request's `thinking`: only whether it is on matters to a reply.
#[derive(Debug, Deserialize)]
struct ThinkingConfig {
    #[serde(rename = "type")]
    kind: String,
}

/// A tool a request declares.
#[derive(Debug, Deserialize)]
pub struct Tool<'a> {
    /// Its name.
    pub name: String,
    /// Its input's JSON schema, unparsed.
    #[serde(borrow, default)]
    pub input_schema: Option<&'a RawValue>,
}

/// A request's `tool_choice`.
#[derive(Debug, Deserialize)]
pub struct ToolChoice {
    /// `auto`, `any`, `tool` or `none`.
    #[serde(rename = "type")]
    pub kind: String,
    /// With `tool`: the tool to call.
    #[serde(default)]
    pub name: Option<String>,
}

/// The fields any request to the Messages endpoints may carry; the others are
/// skipped unread.
#[derive(Deserialize)]
struct Fields<'a> {
    model: Option<String>,
    max_tokens: Option<u64>,
    messages: Option<List>,
    stream: Option<bool>,
    #[serde(borrow)]
    tools: Option<Vec<Tool<'a>>>,
    tool_choice: Option<ToolChoice>,
    thinking: Option<ThinkingConfig>,
}

/// The types of the top-level fields [`Fields`] reads.
const FIELD_TYPES: &[(&str, Expect)] = &[
    ("model", Expect::String),
    ("max_tokens", Expect::Count),
    ("messages", Expect::Array),
    ("stream", Expect::Boolean),
    ("tools", Expect::Array),
    ("tool_choice", Expect::Object),
    ("thinking", Expect::Object),
];

impl<'a> Fields<'a> {
    fn parse(body: &'a [u8]) -> Result<Fields<'a>, String> {
        let fields: Fields<'a> = serde_json::from_slice(body).map_err(|e| json_error(body, &e, FIELD_TYPES))?;
        if fields.model.is_none() {
            return Err("model: Field required".into());
        }
        Ok(fields)
    }
}

/// What a top-level field must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// A string.
    String,
    /// A whole number, 0 or more.
    Count,
    /// `true` or `false`.
    Boolean,
    /// A list.
    Array,
    /// An object.
    Object,
}

impl Expect {
    fn holds(self, v: &Value) -> bool {
        match self {
            Expect::String => v.is_string(),
            Expect::Count => v.is_u64(),
            Expect::Boolean => v.is_boolean(),
            Expect::Array => v.is_array(),
            Expect::Object => v.is_object(),
        }
    }

    /// Anthropic's (pydantic's) words.
    fn words(self) -> &'static str {
        match self {
            Expect::String => "Input should be a valid string",
            Expect::Count => "Input should be a valid non-negative integer",
            Expect::Boolean => "Input should be a valid boolean",
            Expect::Array => "Input should be a valid list",
            Expect::Object => "Input should be a valid dictionary",
        }
    }
}

/// Anthropic-like words for why `body` could not be read as a request whose
/// top-level `fields` hold the given types: `body is not valid JSON: …`,
/// `body: Input should be a valid dictionary`, `model: Input should be a valid
/// string`. serde's own words for a wrong type name the reader's Rust types
/// (`expected struct Fields`, `expected u64`), which mean nothing to a client.
pub fn json_error(body: &[u8], error: &serde_json::Error, fields: &[(&str, Expect)]) -> String {
    if !error.is_data() {
        // Syntax and end-of-input errors say where, in JSON's terms.
        return format!("body is not valid JSON: {error}");
    }
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return format!("body is not valid JSON (line {}, column {})", error.line(), error.column());
    };
    let Some(object) = value.as_object() else {
        return "body: Input should be a valid dictionary".into();
    };
    let wrong =
        fields.iter().find(|(name, expect)| object.get(*name).is_some_and(|v| !v.is_null() && !expect.holds(v)));
    match wrong {
        Some((name, expect)) => format!("{name}: {}", expect.words()),
        None => format!("body: a field has the wrong type (line {}, column {})", error.line(), error.column()),
    }
}

/// A list whose elements are skipped unbuilt (the conversation).
struct List;

impl<'de> Deserialize<'de> for List {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<List, D::Error> {
        struct Elements;
        impl<'de> Visitor<'de> for Elements {
            type Value = List;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<List, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(List)
            }
        }
        d.deserialize_seq(Elements)
    }
}

impl<'a> MessagesRequest<'a> {
    /// Reads a Messages request, or says what is wrong in Anthropic's words:
    /// `body is not valid JSON: …`, a field of the wrong type ([`json_error`]),
    /// or `model: Field required`, `max_tokens: …`, `messages: …`, in that order.
    pub fn parse(body: &'a [u8]) -> Result<MessagesRequest<'a>, String> {
        let f = Fields::parse(body)?;
        let max_tokens = f.max_tokens.ok_or("max_tokens: Field required")?;
        f.messages.ok_or("messages: Field required")?;
        Ok(MessagesRequest {
            model: f.model.unwrap_or_default(),
            max_tokens,
            stream: f.stream.unwrap_or(false),
            tools: f.tools.unwrap_or_default(),
            tool_choice: f.tool_choice,
            thinking: f.thinking.is_some_and(|t| t.kind == "enabled"),
        })
    }

    /// The tool `tool_choice` forces a reply to call: the first one for `any`,
    /// the named one for `tool`, none otherwise (`auto`, `none`, no choice).
    pub fn forced_tool(&self) -> Result<Option<&Tool<'a>>, String> {
        let Some(choice) = &self.tool_choice else {
            return Ok(None);
        };
        match choice.kind.as_str() {
            "any" => match self.tools.first() {
                Some(tool) => Ok(Some(tool)),
                None => Err("tool_choice: `any` requires at least one tool".into()),
            },
            "tool" => {
                let name = choice.name.as_deref().ok_or("tool_choice.name: Field required")?;
                match self.tools.iter().find(|t| t.name == name) {
                    Some(tool) => Ok(Some(tool)),
                    None => Err(format!("tool_choice: no tool named `{name}`")),
                }
            }
            _ => Ok(None),
        }
    }
}

/// Checks a `POST /v1/messages/count_tokens` request: a model and messages.
pub fn check_count_tokens(body: &[u8]) -> Result<(), String> {
    let f = Fields::parse(body)?;
    f.messages.map(drop).ok_or_else(|| "messages: Field required".into())
}

/// Input tokens of a request body, as both fakes bill them: about four bytes a
/// token (what English text and JSON average with Claude's tokenizer), at least
/// one. Deterministic, so tests can predict usage.
pub fn estimate_input_tokens(body: &[u8]) -> u64 {
    (body.len() as u64 / 4).max(1)
}

impl Tool<'_> {
    /// A plausible input for this tool: one value per property its schema
    /// declares — the first `enum` value, else by `type`, with `text` for a
    /// string; `{}` for a schema without properties.
    pub fn sample_input(&self, text: &str) -> Value {
        let schema = self.input_schema.and_then(|raw| serde_json::from_str(raw.get()).ok()).unwrap_or(Value::Null);
        sample_input(&schema, text)
    }
}

fn sample_input(schema: &Value, text: &str) -> Value {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return Value::Object(Map::new());
    };
    let input = props
        .iter()
        .map(|(name, prop)| {
            let value = match prop.get("enum").and_then(|e| e.get(0)) {
                Some(first) => first.clone(),
                None => match prop.get("type").and_then(Value::as_str) {
                    Some("string") => Value::from(text),
                    Some("integer" | "number") => Value::from(1),
                    Some("boolean") => Value::from(true),
                    Some("array") => Value::Array(Vec::new()),
                    Some("object") => Value::Object(Map::new()),
                    _ => Value::Null,
                },
            };
            (name.clone(), value)
        })
        .collect();
    Value::Object(input)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(body: &Value) -> Result<(String, u64, bool, Vec<String>), String> {
        let text = body.to_string();
        let r = MessagesRequest::parse(text.as_bytes())?;
        Ok((r.model, r.max_tokens, r.stream, r.tools.iter().map(|t| t.name.clone()).collect()))
    }

    #[test]
    fn the_fields_a_reply_needs_are_read_and_the_rest_skipped() {
        let body = json!({ "model": "m", "max_tokens": 5, "stream": true, "system": [{ "type": "text", "text": "long" }],
            "messages": [{ "role": "user", "content": "hi" }], "metadata": { "user_id": "u" },
            "tools": [{ "name": "a", "input_schema": { "type": "object" } }, { "name": "b", "description": "no schema" }] });
        assert_eq!(parse(&body).unwrap(), ("m".into(), 5, true, vec!["a".into(), "b".into()]));
        let plain = json!({ "model": "m", "max_tokens": 1, "messages": [], "tools": null });
        assert_eq!(parse(&plain).unwrap(), ("m".into(), 1, false, vec![]));
    }

    #[test]
    fn what_is_wrong_is_said_in_anthropics_words() {
        let err = |body: Value| parse(&body).unwrap_err();
        assert_eq!(err(json!({ "max_tokens": 1, "messages": [] })), "model: Field required");
        assert_eq!(err(json!({ "model": "m", "messages": [] })), "max_tokens: Field required");
        assert_eq!(err(json!({ "model": "m", "max_tokens": 1 })), "messages: Field required");
        assert_eq!(err(json!({ "max_tokens": 1 })), "model: Field required", "the model is named first");
        assert_eq!(
            err(json!({ "model": "m", "max_tokens": 1, "messages": {} })),
            "messages: Input should be a valid list"
        );
        assert_eq!(
            err(json!({ "model": 5, "max_tokens": 1, "messages": [] })),
            "model: Input should be a valid string"
        );
        assert_eq!(
            err(json!({ "model": "m", "max_tokens": -1, "messages": [] })),
            "max_tokens: Input should be a valid non-negative integer"
        );
        assert_eq!(err(json!(["m"])), "body: Input should be a valid dictionary");
        assert_eq!(
            err(json!({ "model": "m", "max_tokens": 1, "messages": [], "tools": [{ "name": 1 }] })),
            "body: a field has the wrong type (line 1, column 60)"
        );
        assert_eq!(
            MessagesRequest::parse(b"{").unwrap_err(),
            "body is not valid JSON: EOF while parsing an object at line 1 column 1"
        );
    }

    #[test]
    fn tool_choice_forces_the_first_or_the_named_tool() {
        let tools = json!([{ "name": "a" }, { "name": "b" }]);
        let forced = |choice: Value| {
            let body = json!({ "model": "m", "max_tokens": 1, "messages": [], "tools": tools, "tool_choice": choice })
                .to_string();
            let r = MessagesRequest::parse(body.as_bytes()).unwrap();
            r.forced_tool().map(|t| t.map(|t| t.name.clone()))
        };
        assert_eq!(forced(json!({ "type": "auto" })), Ok(None));
        assert_eq!(forced(json!({ "type": "any" })), Ok(Some("a".into())));
        assert_eq!(forced(json!({ "type": "tool", "name": "b" })), Ok(Some("b".into())));
        assert_eq!(forced(json!({ "type": "tool", "name": "c" })), Err("tool_choice: no tool named `c`".into()));
        assert_eq!(forced(json!({ "type": "tool" })), Err("tool_choice.name: Field required".into()));
        let none =
            json!({ "model": "m", "max_tokens": 1, "messages": [], "tool_choice": { "type": "any" } }).to_string();
        let r = MessagesRequest::parse(none.as_bytes()).unwrap();
        assert_eq!(r.forced_tool().unwrap_err(), "tool_choice: `any` requires at least one tool");
    }

    #[test]
    fn a_sample_input_has_a_value_per_property() {
        let body = json!({ "model": "m", "max_tokens": 1, "messages": [], "tools": [
            { "name": "t", "input_schema": { "properties": { "s": { "type": "string" }, "e": { "enum": ["z", "y"] },
              "n": { "type": "number" }, "i": { "type": "integer" }, "b": { "type": "boolean" }, "a": { "type": "array" },
              "o": { "type": "object" }, "u": {} } } },
            { "name": "bare" } ] })
        .to_string();
        let r = MessagesRequest::parse(body.as_bytes()).unwrap();
        assert_eq!(
            r.tools[0].sample_input("mock"),
            json!({ "s": "mock", "e": "z", "n": 1, "i": 1, "b": true, "a": [], "o": {}, "u": null })
        );
        assert_eq!(r.tools[1].sample_input("mock"), json!({}));
    }

    #[test]
    fn count_tokens_needs_a_model_and_messages_only() {
        assert_eq!(check_count_tokens(br#"{"model":"m","messages":[]}"#), Ok(()));
        assert_eq!(check_count_tokens(br#"{"messages":[]}"#).unwrap_err(), "model: Field required");
        assert_eq!(check_count_tokens(br#"{"model":"m"}"#).unwrap_err(), "messages: Field required");
        assert_eq!(estimate_input_tokens(b""), 1);
        assert_eq!(estimate_input_tokens(&[b' '; 41]), 10);
    }
}
