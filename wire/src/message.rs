//! An assistant reply, rendered as Anthropic renders it: the JSON `message` of a
//! plain answer, or the events of a stream.
//!
//! Both fakes answer with the same structure — a thinking block when the
//! request enabled extended thinking, one text block, then at most one tool
//! call — so that is what a [`Reply`] holds. Fields are written in
//! Anthropic's order (`type` first in every event); the official SDKs parse
//! every event, so each shape follows the Messages API field for field. How a
//! stream is cut into deltas is each fake's choice, given as a [`Chunking`].

use serde::Serialize;
use serde_json::{Map, Value};

use crate::sse;

/// Why a reply ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// `end_turn`: the reply is complete.
    EndTurn,
    /// `max_tokens`: the request's `max_tokens` cut it short.
    MaxTokens,
    /// `tool_use`: it ends with a tool call for the client to run.
    ToolUse,
}

impl StopReason {
    /// The wire name (`end_turn`).
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::EndTurn => "end_turn",
            StopReason::MaxTokens => "max_tokens",
            StopReason::ToolUse => "tool_use",
        }
    }
}

/// The tool call a reply makes (its second content block).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolUse {
    /// `toolu_…`.
    pub id: String,
    /// The tool's name, as the request declared it.
    pub name: String,
    /// The input it is called with.
    pub input: Value,
}

/// One assistant reply: a thinking block if asked for, a text block, then at
/// most one tool call.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    /// `msg_…`.
    pub id: String,
    /// The model, as the request named it (echoed back).
    pub model: String,
    /// The thinking block's text, when the request enabled extended thinking
    /// (`"thinking": {"type": "enabled", …}`); it comes first, with a signature.
    pub thinking: Option<String>,
    /// The text block.
    pub text: String,
    /// The tool call, if any.
    pub tool: Option<ToolUse>,
    /// Why it ended.
    pub stop_reason: StopReason,
    /// Input tokens billed.
    pub input_tokens: u64,
    /// Output tokens billed.
    pub output_tokens: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read_input_tokens: u64,
    /// Input tokens written to the prompt cache.
    pub cache_creation_input_tokens: u64,
}

/// How finely a stream is cut: the pieces of text in the `text_delta`s, and how
/// many `input_json_delta` parts a tool call's input is sent in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunking {
    /// How the text block is split.
    pub text: TextPieces,
    /// How many parts a tool input is split into (after the empty part
    /// Anthropic always opens with); no part is JSON on its own.
    pub json_parts: usize,
}

/// How a text is split into `text_delta`s, always at spaces (which stay with
/// the word before them), as a model streams words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextPieces {
    /// This many words a piece: a long text makes many deltas.
    Words(usize),
    /// At most this many pieces, of equal numbers of words: a long text stays
    /// a few deltas.
    AtMost(usize),
}

impl Reply {
    /// Input and output tokens together: what the request costs a quota.
    pub fn tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }

    /// The JSON `message` of a plain (not streamed) answer.
    pub fn to_json(&self) -> String {
        let signature = self.signature();
        let mut content = Vec::with_capacity(3);
        if let Some(thinking) = &self.thinking {
            content.push(Block::Thinking { thinking, signature: &signature });
        }
        content.push(Block::Text { text: &self.text });
        if let Some(t) = &self.tool {
            content.push(Block::ToolUse { id: &t.id, name: &t.name, input: &t.input });
        }
        serde_json::to_string(&self.message(content, Some(self.stop_reason), self.output_tokens))
            .expect("a message serializes")
    }

    /// The events of a stream, each one framed, in Anthropic's order:
    /// `message_start` (no content, one output token so far), the thinking
    /// block if any (start, `thinking_delta`s, one `signature_delta`, stop), the
    /// text block (start, `ping`, `text_delta`s, stop), the tool block if any
    /// (its input in `input_json_delta` parts), `message_delta` with the stop
    /// reason and the output tokens, `message_stop`.
    pub fn events(&self, chunking: &Chunking) -> Vec<String> {
        let mut out = Vec::with_capacity(16);
        out.push(render(&Event::MessageStart { message: self.message(Vec::new(), None, 1) }));
        let mut index = 0;
        if let Some(thinking) = &self.thinking {
            let start = Block::Thinking { thinking: "", signature: "" };
            out.push(render(&Event::ContentBlockStart { index, content_block: start }));
            for piece in split_text(thinking, chunking.text) {
                let delta = Delta::ThinkingDelta { thinking: piece };
                out.push(render(&Event::ContentBlockDelta { index, delta }));
            }
            let delta = Delta::SignatureDelta { signature: &self.signature() };
            out.push(render(&Event::ContentBlockDelta { index, delta }));
            out.push(render(&Event::ContentBlockStop { index }));
            index += 1;
        }
        out.push(render(&Event::ContentBlockStart { index, content_block: Block::Text { text: "" } }));
        out.push(sse::frame("ping", sse::PING));
        for piece in split_text(&self.text, chunking.text) {
            out.push(render(&Event::ContentBlockDelta { index, delta: Delta::TextDelta { text: piece } }));
        }
        out.push(render(&Event::ContentBlockStop { index }));
        if let Some(tool) = &self.tool {
            index += 1;
            let empty = Value::Object(Map::new());
            let start = Block::ToolUse { id: &tool.id, name: &tool.name, input: &empty };
            out.push(render(&Event::ContentBlockStart { index, content_block: start }));
            let json = tool.input.to_string();
            for part in std::iter::once("").chain(split_json(&json, chunking.json_parts)) {
                let delta = Delta::InputJsonDelta { partial_json: part };
                out.push(render(&Event::ContentBlockDelta { index, delta }));
            }
            out.push(render(&Event::ContentBlockStop { index }));
        }
        out.push(render(&Event::MessageDelta {
            delta: StopDelta { stop_reason: self.stop_reason, stop_sequence: None },
            usage: OutputUsage { output_tokens: self.output_tokens },
        }));
        out.push(render(&Event::MessageStop));
        out
    }

    /// The thinking block's signature: opaque to a client, so any stable
    /// string of the reply does (the message id's, base64-looking).
    fn signature(&self) -> String {
        format!("sig{:016x}", crate::ids::fnv1a(self.id.as_bytes()))
    }

    fn message<'a>(&'a self, content: Vec<Block<'a>>, stop_reason: Option<StopReason>, output: u64) -> Message<'a> {
        Message {
            id: &self.id,
            kind: "message",
            role: "assistant",
            model: &self.model,
            content,
            stop_reason,
            stop_sequence: None,
            usage: Usage {
                input_tokens: self.input_tokens,
                output_tokens: output,
                cache_creation_input_tokens: self.cache_creation_input_tokens,
                cache_read_input_tokens: self.cache_read_input_tokens,
            },
        }
    }
}

/// The answer of `POST /v1/messages/count_tokens`: `{"input_tokens":N}`.
pub fn count_tokens_body(input_tokens: u64) -> String {
    format!("{{\"input_tokens\":{input_tokens}}}")
}

/// A `message` object, as in a JSON answer and in `message_start`.
#[derive(Serialize)]
struct Message<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: Vec<Block<'a>>,
    stop_reason: Option<StopReason>,
    stop_sequence: Option<&'a str>,
    usage: Usage,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Thinking { thinking: &'a str, signature: &'a str },
    Text { text: &'a str },
    ToolUse { id: &'a str, name: &'a str, input: &'a Value },
}

#[derive(Serialize)]
struct Usage {
    input_tokens: u64,
    output_tokens: u64,
    cache_creation_input_tokens: u64,
    cache_read_input_tokens: u64,
}

/// A stream's events but `ping` (whose bytes are fixed, see [`sse::PING`]).
/// Internally tagged, so `type` comes first, as Anthropic writes it.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event<'a> {
    MessageStart { message: Message<'a> },
    ContentBlockStart { index: usize, content_block: Block<'a> },
    ContentBlockDelta { index: usize, delta: Delta<'a> },
    ContentBlockStop { index: usize },
    MessageDelta { delta: StopDelta, usage: OutputUsage },
    MessageStop,
}

impl Event<'_> {
    fn name(&self) -> &'static str {
        match self {
            Event::MessageStart { .. } => "message_start",
            Event::ContentBlockStart { .. } => "content_block_start",
            Event::ContentBlockDelta { .. } => "content_block_delta",
            Event::ContentBlockStop { .. } => "content_block_stop",
            Event::MessageDelta { .. } => "message_delta",
            Event::MessageStop => "message_stop",
        }
    }
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[expect(clippy::enum_variant_names, reason = "serde names them Anthropic's delta types, which all end in `_delta`")]
enum Delta<'a> {
    ThinkingDelta { thinking: &'a str },
    SignatureDelta { signature: &'a str },
    TextDelta { text: &'a str },
    InputJsonDelta { partial_json: &'a str },
}

#[derive(Serialize)]
struct StopDelta {
    stop_reason: StopReason,
    stop_sequence: Option<&'static str>,
}

#[derive(Serialize)]
struct OutputUsage {
    output_tokens: u64,
}

fn render(event: &Event<'_>) -> String {
    sse::frame(event.name(), &serde_json::to_string(event).expect("an event serializes"))
}

/// `text` in pieces at spaces, each space kept with the word before it, so the
/// pieces concatenate back to `text`. An empty text is one empty piece.
pub fn split_text(text: &str, pieces: TextPieces) -> Vec<&str> {
    let per = match pieces {
        TextPieces::Words(n) => n,
        TextPieces::AtMost(n) => text.split_inclusive(' ').count().div_ceil(n.max(1)),
    }
    .max(1);
    let mut out = Vec::new();
    let (mut start, mut n) = (0, 0);
    for (i, _) in text.match_indices(' ') {
        n += 1;
        if n == per {
            out.push(&text[start..=i]);
            (start, n) = (i + 1, 0);
        }
    }
    if start < text.len() || out.is_empty() {
        out.push(&text[start..]);
    }
    out
}

/// `json` in `parts` parts of about equal size, split at char boundaries.
pub fn split_json(json: &str, parts: usize) -> Vec<&str> {
    let size = json.len().div_ceil(parts.max(1)).max(1);
    let mut out = Vec::with_capacity(parts);
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const MOCK: Chunking = Chunking { text: TextPieces::AtMost(8), json_parts: 4 };

    fn reply(tool: bool) -> Reply {
        Reply {
            id: "msg_1".into(),
            model: "claude-sonnet-4-5".into(),
            thinking: None,
            text: "Let me call the tool for that.".into(),
            tool: tool.then(|| ToolUse {
                id: "toolu_2".into(),
                name: "get_weather".into(),
                input: json!({ "city": "Zürich", "days": 1 }),
            }),
            stop_reason: if tool { StopReason::ToolUse } else { StopReason::EndTurn },
            input_tokens: 28,
            output_tokens: 9,
            cache_read_input_tokens: 0,
            cache_creation_input_tokens: 0,
        }
    }

    #[test]
    fn a_json_reply_is_written_in_anthropics_field_order() {
        assert_eq!(
            reply(true).to_json(),
            concat!(
                r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5","#,
                r#""content":[{"type":"text","text":"Let me call the tool for that."},"#,
                r#"{"type":"tool_use","id":"toolu_2","name":"get_weather","input":{"city":"Zürich","days":1}}],"#,
                r#""stop_reason":"tool_use","stop_sequence":null,"#,
                r#""usage":{"input_tokens":28,"output_tokens":9,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}"#
            )
        );
    }

    #[test]
    fn thinking_comes_first_with_its_signature_and_moves_the_other_blocks_up() {
        let mut r = reply(true);
        r.thinking = Some("Two words.".into());
        let json: Value = serde_json::from_str(&r.to_json()).unwrap();
        let types: Vec<_> = json["content"].as_array().unwrap().iter().map(|b| b["type"].clone()).collect();
        assert_eq!(types, [json!("thinking"), json!("text"), json!("tool_use")]);
        assert_eq!(json["content"][0]["thinking"], "Two words.");
        let events = r.events(&MOCK);
        let datas: Vec<Value> =
            events.iter().map(|e| serde_json::from_str(e.lines().nth(1).unwrap()[6..].trim()).unwrap()).collect();
        assert_eq!(datas[1]["content_block"], json!({"type": "thinking", "thinking": "", "signature": ""}));
        assert_eq!(datas[2]["delta"], json!({"type": "thinking_delta", "thinking": "Two "}));
        assert_eq!(datas[4]["delta"]["type"], "signature_delta");
        assert_eq!(datas[4]["delta"]["signature"], json["content"][0]["signature"]);
        assert_eq!(datas[5], json!({"type": "content_block_stop", "index": 0}));
        assert_eq!(datas[6]["content_block"]["type"], "text");
        assert_eq!(datas[6]["index"], 1);
        let tool_start = datas.iter().find(|d| d["content_block"]["type"] == "tool_use").unwrap();
        assert_eq!(tool_start["index"], 2);
    }

    #[test]
    fn a_stream_is_written_event_for_event_as_anthropic_does() {
        let text = |t: &str| {
            format!(r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":"{t}"}}}}"#)
        };
        let json = |p: &str| {
            let delta = format!(r#"{{"type":"input_json_delta","partial_json":"{p}"}}"#);
            format!(r#"{{"type":"content_block_delta","index":1,"delta":{delta}}}"#)
        };
        let mut datas = vec![
            concat!(
                r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","#,
                r#""model":"claude-sonnet-4-5","content":[],"stop_reason":null,"stop_sequence":null,"#,
                r#""usage":{"input_tokens":28,"output_tokens":1,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}}"#
            )
            .to_string(),
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#.into(),
            r#"{"type": "ping"}"#.into(),
        ];
        datas.extend(["Let ", "me ", "call ", "the ", "tool ", "for ", "that."].map(text));
        datas.push(r#"{"type":"content_block_stop","index":0}"#.into());
        datas.push(
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_2","name":"get_weather","input":{}}}"#
                .into(),
        );
        datas.extend(["", r#"{\"city\""#, r#":\"Züri"#, r#"ch\",\"da"#, r#"ys\":1}"#].map(json));
        datas.push(r#"{"type":"content_block_stop","index":1}"#.into());
        datas.push(
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":9}}"#
                .into(),
        );
        datas.push(r#"{"type":"message_stop"}"#.into());
        // Each event is named by its data's `type`.
        let expected: Vec<String> = datas
            .iter()
            .map(|d| {
                let name = serde_json::from_str::<Value>(d).unwrap()["type"].as_str().unwrap().to_string();
                format!("event: {name}\ndata: {d}\n\n")
            })
            .collect();
        assert_eq!(reply(true).events(&MOCK), expected);
    }

    #[test]
    fn a_stream_adds_up_to_the_json_reply() {
        for chunking in [MOCK, Chunking { text: TextPieces::Words(4), json_parts: 3 }] {
            let r = reply(true);
            let datas: Vec<Value> = r
                .events(&chunking)
                .iter()
                .map(|e| serde_json::from_str(e.lines().nth(1).unwrap().strip_prefix("data: ").unwrap()).unwrap())
                .collect();
            let text: String = datas.iter().filter_map(|d| d["delta"]["text"].as_str()).collect();
            let partial: String = datas.iter().filter_map(|d| d["delta"]["partial_json"].as_str()).collect();
            let full: Value = serde_json::from_str(&r.to_json()).unwrap();
            assert_eq!(text, full["content"][0]["text"].as_str().unwrap());
            assert_eq!(serde_json::from_str::<Value>(&partial).unwrap(), full["content"][1]["input"]);
        }
    }

    #[test]
    fn text_splits_by_words_or_into_at_most_so_many_pieces() {
        assert_eq!(split_text("a b c d e f g h i", TextPieces::Words(4)), ["a b c d ", "e f g h ", "i"]);
        assert_eq!(split_text("a b c d ", TextPieces::Words(4)), ["a b c d "]);
        let text = "one two three four five six seven eight nine ten eleven twelve";
        let pieces = split_text(text, TextPieces::AtMost(8));
        assert_eq!(pieces, ["one two ", "three four ", "five six ", "seven eight ", "nine ten ", "eleven twelve"]);
        assert_eq!(split_text("hi", TextPieces::AtMost(8)), ["hi"]);
        for pieces in [TextPieces::Words(4), TextPieces::AtMost(8)] {
            assert_eq!(split_text("", pieces), [""]);
            assert_eq!(split_text("Zürich  two\nlines ", pieces).concat(), "Zürich  two\nlines ");
        }
    }

    #[test]
    fn json_parts_concatenate_back_split_at_char_boundaries() {
        let json = r#"{"city":"Zürich","n":1}"#;
        for parts in [3, 4] {
            let pieces = split_json(json, parts);
            assert_eq!(pieces.len(), parts);
            assert_eq!(pieces.concat(), json);
            assert!(serde_json::from_str::<Value>(pieces[0]).is_err());
        }
        assert!(split_json("", 3).is_empty());
    }

    #[test]
    fn count_tokens_is_one_field() {
        assert_eq!(count_tokens_body(42), r#"{"input_tokens":42}"#);
    }
}
