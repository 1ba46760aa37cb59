//! An Anthropic stream as a Chat Completions stream, event by event.
//!
//! Each upstream event is translated the moment it arrives and nothing is held
//! back: a client sees the first word when Anthropic sends it. The only state
//! kept is what later chunks repeat (the id) or need (which Anthropic block is
//! which tool call, the usage so far).

use serde::Serialize;
use serde_json::{Map, Value, json};

use super::OpenAiError;
use super::error::from_anthropic;
use super::response::{chat_id, finish_reason, usage};
use crate::sse;

/// The last line of every Chat Completions stream.
pub const DONE: &str = "data: [DONE]\n\n";

/// Turns Anthropic's stream events into `chat.completion.chunk` lines
/// (`data: {json}\n\n`, then `data: [DONE]\n\n`).
///
/// Feed it events already read ([`ChatStream::push`]) or the raw body as it
/// comes ([`ChatStream::feed`]), then call [`ChatStream::finish`] when the
/// upstream body ends. Chunks come in OpenAI's order: one with
/// `delta.role = "assistant"`, the content and tool-call deltas, one with the
/// `finish_reason`, with `include_usage` one with `choices: []` and the usage
/// (and `"usage": null` in all the others, as OpenAI writes them), then
/// `[DONE]`.
#[derive(Debug)]
pub struct ChatStream {
    model: String,
    created: u64,
    include_usage: bool,
    id: String,
    started: bool,
    /// The Anthropic block index of each tool call, at its OpenAI index.
    tools: Vec<u64>,
    /// Anthropic's usage so far (`message_start`, then `message_delta`).
    usage: Map<String, Value>,
    finished: bool,
    stopped: bool,
    done: bool,
    parser: sse::Parser,
}

#[derive(Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<Choice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Value>,
}

#[derive(Serialize)]
struct Choice {
    index: u32,
    delta: Value,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
}

impl ChatStream {
    /// A stream answering as `model` (the client's name), created at
    /// `created_s` (Unix seconds), ending with a usage chunk if `include_usage`.
    pub fn new(model: &str, created_s: u64, include_usage: bool) -> ChatStream {
        ChatStream {
            model: model.to_owned(),
            created: created_s,
            include_usage,
            id: chat_id(""),
            started: false,
            tools: Vec::new(),
            usage: Map::new(),
            finished: false,
            stopped: false,
            done: false,
            parser: sse::Parser::new(),
        }
    }

    /// The lines for raw upstream bytes: they are read as server-sent events
    /// (cut anywhere) and each complete one is [`ChatStream::push`]ed. An event
    /// whose data is not JSON ends the stream with an error.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        self.feed_into(bytes, &mut out);
        super::frames(&out)
    }

    /// [`ChatStream::feed`], appending the lines to `out` (no allocation per
    /// line: what a gateway streaming many answers calls).
    pub fn feed_into(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        for event in self.parser.feed(bytes) {
            match serde_json::from_str::<Value>(&event.data) {
                Ok(data) => self.push_into(&event.name, &data, out),
                Err(_) => self.fail("the upstream sent an event that is not JSON (poolgate)", out),
            }
        }
    }

    /// The lines for one Anthropic event, `event` its name and `data` its JSON.
    /// Events with nothing to say to an OpenAI client (`ping`,
    /// `content_block_stop`, thinking deltas) give none.
    pub fn push(&mut self, event: &str, data: &Value) -> Vec<String> {
        let mut out = Vec::new();
        self.push_into(event, data, &mut out);
        super::frames(&out)
    }

    /// [`ChatStream::push`], appending the lines to `out`.
    pub fn push_into(&mut self, event: &str, data: &Value, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        let kind = if event.is_empty() || event == "message" { data["type"].as_str().unwrap_or("") } else { event };
        match kind {
            "message_start" => {
                let message = &data["message"];
                self.id = chat_id(message["id"].as_str().unwrap_or(""));
                self.add_usage(&message["usage"]);
                self.start(out);
            }
            "content_block_start" => self.block_start(data, out),
            "content_block_delta" => self.block_delta(data, out),
            "message_delta" => {
                self.add_usage(&data["usage"]);
                let reason = finish_reason(data["delta"]["stop_reason"].as_str());
                self.finish_chunks(reason, out);
            }
            "message_stop" => {
                self.finish_chunks("stop", out);
                self.stopped = true;
            }
            "error" => {
                let err = from_anthropic(200, data);
                self.error_lines(&err, out);
            }
            _ => {}
        }
    }

    /// The lines that end the stream, once the upstream body has ended:
    /// `[DONE]`, after an error chunk if Anthropic's stream stopped before its
    /// `message_stop` (a client must not take a cut answer for a whole one).
    /// Nothing after the stream already ended.
    pub fn finish(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        self.finish_into(&mut out);
        super::frames(&out)
    }

    /// [`ChatStream::finish`], appending the lines to `out`.
    pub fn finish_into(&mut self, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        if !self.stopped {
            return self.fail("the upstream stream ended before the answer did (poolgate)", out);
        }
        self.done = true;
        out.extend_from_slice(DONE.as_bytes());
    }

    fn start(&mut self, out: &mut Vec<u8>) {
        if !self.started {
            self.started = true;
            self.chunk(out, json!({"role": "assistant", "content": ""}), None);
        }
    }

    fn block_start(&mut self, data: &Value, out: &mut Vec<u8>) {
        self.start(out);
        let block = &data["content_block"];
        match block["type"].as_str() {
            Some("text") => self.text(block["text"].as_str().unwrap_or(""), out),
            Some("tool_use") => {
                let index = self.tools.len();
                self.tools.push(data["index"].as_u64().unwrap_or(u64::MAX));
                let call = json!({"index": index, "id": block["id"], "type": "function",
                    "function": {"name": block["name"], "arguments": ""}});
                self.chunk(out, json!({"tool_calls": [call]}), None);
            }
            _ => {}
        }
    }

    fn block_delta(&mut self, data: &Value, out: &mut Vec<u8>) {
        self.start(out);
        let delta = &data["delta"];
        match delta["type"].as_str() {
            Some("text_delta") => self.text(delta["text"].as_str().unwrap_or(""), out),
            Some("input_json_delta") => {
                let part = delta["partial_json"].as_str().unwrap_or("");
                let block = data["index"].as_u64();
                let Some(index) = self.tools.iter().position(|&b| Some(b) == block) else { return };
                if !part.is_empty() {
                    let call = json!({"index": index, "function": {"arguments": part}});
                    self.chunk(out, json!({"tool_calls": [call]}), None);
                }
            }
            _ => {}
        }
    }

    fn text(&self, text: &str, out: &mut Vec<u8>) {
        if !text.is_empty() {
            self.chunk(out, json!({"content": text}), None);
        }
    }

    /// The `finish_reason` chunk and the usage chunk, once.
    fn finish_chunks(&mut self, reason: &'static str, out: &mut Vec<u8>) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        self.start(out);
        self.chunk(out, json!({}), Some(reason));
        if self.include_usage {
            let chunk = Chunk {
                id: &self.id,
                object: "chat.completion.chunk",
                created: self.created,
                model: &self.model,
                choices: Vec::new(),
                usage: Some(usage(&Value::Object(self.usage.clone()))),
            };
            frame(out, &chunk);
        }
    }

    /// Anthropic's usage numbers, later ones replacing earlier ones (the
    /// `message_delta` totals are final).
    fn add_usage(&mut self, u: &Value) {
        if let Some(u) = u.as_object() {
            for (k, v) in u.iter().filter(|(_, v)| v.is_u64()) {
                self.usage.insert(k.clone(), v.clone());
            }
        }
    }

    fn fail(&mut self, message: &str, out: &mut Vec<u8>) {
        let err =
            OpenAiError { status: 502, message: message.to_owned(), kind: "server_error", param: None, code: None };
        self.error_lines(&err, out);
    }

    /// An error chunk (OpenAI's error body as the data) and `[DONE]`.
    fn error_lines(&mut self, err: &OpenAiError, out: &mut Vec<u8>) {
        // Once: the rest of a read that already failed (more events that are
        // not JSON) must not add chunks after the `[DONE]` that ended it.
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        out.extend_from_slice(b"data: ");
        serde_json::to_writer(&mut *out, &err.to_body()).expect("an error serializes");
        out.extend_from_slice(b"\n\n");
        out.extend_from_slice(DONE.as_bytes());
    }

    fn chunk(&self, out: &mut Vec<u8>, delta: Value, finish: Option<&'static str>) {
        frame(
            out,
            &Chunk {
                id: &self.id,
                object: "chat.completion.chunk",
                created: self.created,
                model: &self.model,
                choices: vec![Choice { index: 0, delta, logprobs: None, finish_reason: finish }],
                usage: self.include_usage.then_some(Value::Null),
            },
        )
    }
}

fn frame(out: &mut Vec<u8>, chunk: &Chunk<'_>) {
    out.extend_from_slice(b"data: ");
    serde_json::to_writer(&mut *out, chunk).expect("a chunk serializes");
    out.extend_from_slice(b"\n\n");
}

impl super::Translation for ChatStream {
    fn feed_into(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        ChatStream::feed_into(self, bytes, out);
    }

    fn finish_into(&mut self, out: &mut Vec<u8>) {
        ChatStream::finish_into(self, out);
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
