//! A Chat Completions stream as an Anthropic one, for the fallback: chunks in,
//! `message_start`, content blocks, `message_delta`, `message_stop` out.
//!
//! Text and tool-call deltas are passed the moment they come. Only the end
//! waits: OpenAI sends the finish reason, then (with `include_usage`) the
//! usage in a later chunk, and Anthropic's `message_delta` carries both, so it
//! is written at `[DONE]` (or [`MessagesStream::finish`]).

use serde_json::{Value, json};

use super::reverse::{anthropic_usage, message_id, stop_reason};
use crate::error::ErrorType;
use crate::sse;

/// Turns `chat.completion.chunk`s into Anthropic's framed events.
#[derive(Debug)]
pub struct MessagesStream {
    model: String,
    started: bool,
    /// The Anthropic index of the block now open, if one is.
    open: Option<usize>,
    /// The next block's index.
    next: usize,
    /// The Anthropic block index of each OpenAI tool call index.
    tools: Vec<(u64, usize)>,
    finish: Option<&'static str>,
    usage: Value,
    done: bool,
    parser: sse::Parser,
}

impl MessagesStream {
    /// A stream answering as `model` (the client's name).
    pub fn new(model: &str) -> MessagesStream {
        MessagesStream {
            model: model.to_owned(),
            started: false,
            open: None,
            next: 0,
            tools: Vec::new(),
            finish: None,
            usage: Value::Null,
            done: false,
            parser: sse::Parser::new(),
        }
    }

    /// The events for raw backend bytes (`data: {chunk}` lines, cut anywhere,
    /// ending with `data: [DONE]`).
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        self.feed_into(bytes, &mut out);
        super::frames(&out)
    }

    /// [`MessagesStream::feed`], appending the events to `out` (no
    /// allocation per event).
    pub fn feed_into(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        for event in self.parser.feed(bytes) {
            if event.data == "[DONE]" {
                self.finish_into(out);
                continue;
            }
            match serde_json::from_str::<Value>(&event.data) {
                Ok(chunk) => self.push_into(&chunk, out),
                Err(_) => self.fail(ErrorType::Api, "the backend sent a chunk that is not JSON (poolgate)", out),
            }
        }
    }

    /// The events for one chunk.
    pub fn push(&mut self, chunk: &Value) -> Vec<String> {
        let mut out = Vec::new();
        self.push_into(chunk, &mut out);
        super::frames(&out)
    }

    /// [`MessagesStream::push`], appending the events to `out`.
    pub fn push_into(&mut self, chunk: &Value, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        if let Some(message) = chunk["error"]["message"].as_str() {
            return self.fail(ErrorType::Api, message, out);
        }
        if !self.started {
            self.started = true;
            let message = json!({"id": message_id(chunk["id"].as_str().unwrap_or("")), "type": "message",
                "role": "assistant", "model": self.model, "content": [], "stop_reason": null,
                "stop_sequence": null, "usage": {"input_tokens": 0, "output_tokens": 0}});
            event(out, "message_start", &json!({"type": "message_start", "message": message}));
        }
        if !chunk["usage"].is_null() {
            self.usage = chunk["usage"].clone();
        }
        let Some(choice) = chunk["choices"].get(0) else { return };
        let delta = &choice["delta"];
        if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            if self.open.is_none() || self.tools.iter().any(|&(_, b)| Some(b) == self.open) {
                self.open_block(json!({"type": "text", "text": ""}), out);
            }
            let data = json!({"type": "content_block_delta", "index": self.open,
                "delta": {"type": "text_delta", "text": text}});
            event(out, "content_block_delta", &data);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            self.tool_delta(call, out);
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finish = Some(stop_reason(Some(reason)));
        }
    }

    /// The closing events: the open block's stop, `message_delta` with the
    /// stop reason and usage, `message_stop`; an `error` event instead if the
    /// backend never said why it finished (a cut stream). Nothing twice.
    pub fn finish(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        self.finish_into(&mut out);
        super::frames(&out)
    }

    /// [`MessagesStream::finish`], appending the events to `out`.
    pub fn finish_into(&mut self, out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        let Some(stop) = self.finish else {
            return self.fail(ErrorType::Api, "the backend stream ended before the answer did (poolgate)", out);
        };
        self.done = true;
        self.close(out);
        let usage = anthropic_usage(&self.usage);
        let data =
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": usage});
        event(out, "message_delta", &data);
        out.extend_from_slice(sse::frame("message_stop", r#"{"type":"message_stop"}"#).as_bytes());
    }

    /// A tool call's delta: the first (with its id and name) opens a
    /// `tool_use` block, arguments become `input_json_delta`s.
    fn tool_delta(&mut self, call: &Value, out: &mut Vec<u8>) {
        let i = call["index"].as_u64().unwrap_or(0);
        let block = match self.tools.iter().find(|&&(t, _)| t == i) {
            // A call whose block is already closed (another call, or text,
            // came between its parts): Anthropic's blocks run one after the
            // other and never reopen, so the stream cannot carry it.
            Some(&(_, b)) if self.open != Some(b) => {
                return self.fail(
                    ErrorType::Api,
                    "the backend interleaved the parts of parallel tool calls, which an Anthropic stream cannot \
                     carry (poolgate)",
                    out,
                );
            }
            Some(&(_, b)) => b,
            None => {
                let b = self.open_block(
                    json!({"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": {}}),
                    out,
                );
                self.tools.push((i, b));
                b
            }
        };
        if let Some(args) = call["function"]["arguments"].as_str().filter(|a| !a.is_empty()) {
            let data = json!({"type": "content_block_delta", "index": block,
                "delta": {"type": "input_json_delta", "partial_json": args}});
            event(out, "content_block_delta", &data);
        }
    }

    fn open_block(&mut self, block: Value, out: &mut Vec<u8>) -> usize {
        self.close(out);
        let index = self.next;
        self.next += 1;
        self.open = Some(index);
        event(
            out,
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        );
        index
    }

    fn close(&mut self, out: &mut Vec<u8>) {
        if let Some(index) = self.open.take() {
            event(out, "content_block_stop", &json!({"type": "content_block_stop", "index": index}));
        }
    }

    fn fail(&mut self, kind: ErrorType, message: &str, out: &mut Vec<u8>) {
        // Once: the rest of a read that already failed (more chunks that are
        // not JSON) must not add events after the one that ended the stream.
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        out.extend_from_slice(sse::error_event(kind, message).as_bytes());
    }
}

/// Appends one framed event: `event: <name>`, its data as one JSON line.
fn event(out: &mut Vec<u8>, name: &str, data: &Value) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    serde_json::to_writer(&mut *out, data).expect("an event serializes");
    out.extend_from_slice(b"\n\n");
}

impl super::Translation for MessagesStream {
    fn feed_into(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        MessagesStream::feed_into(self, bytes, out);
    }

    fn finish_into(&mut self, out: &mut Vec<u8>) {
        MessagesStream::finish_into(self, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A backend stream: role chunk, text in two deltas, a tool call whose
    /// arguments come in parts, the finish reason, the usage chunk, `[DONE]`.
    const BACKEND: &str = concat!(
        r#"data: {"id":"chatcmpl-9","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#,
        "\n\n",
        r#"data: {"id":"chatcmpl-9","choices":[{"index":0,"delta":{"content":"Hi "},"finish_reason":null}]}"#,
        "\n\n",
        r#"data: {"id":"chatcmpl-9","choices":[{"index":0,"delta":{"content":"café"},"finish_reason":null}]}"#,
        "\n\n",
        r#"data: {"id":"chatcmpl-9","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"weather","arguments":""}}]},"finish_reason":null}]}"#,
        "\n\n",
        r#"data: {"id":"chatcmpl-9","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"ci"}}]},"finish_reason":null}]}"#,
        "\n\n",
        r#"data: {"id":"chatcmpl-9","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ty\":\"Paris\"}"}}]},"finish_reason":null}]}"#,
        "\n\n",
        r#"data: {"id":"chatcmpl-9","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
        "\n\n",
        r#"data: {"id":"chatcmpl-9","choices":[],"usage":{"prompt_tokens":130,"completion_tokens":30,"total_tokens":160,"prompt_tokens_details":{"cached_tokens":100}}}"#,
        "\n\n",
        "data: [DONE]\n\n",
    );

    fn expected() -> Vec<(String, Value)> {
        let message = json!({"id": "msg_9", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 0, "output_tokens": 0}});
        let text =
            |t: &str| json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}});
        let args = |a: &str| json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": a}});
        [
            ("message_start", json!({"type": "message_start", "message": message})),
            ("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
            ("content_block_delta", text("Hi ")),
            ("content_block_delta", text("café")),
            ("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
            ("content_block_start", json!({"type": "content_block_start", "index": 1,
                "content_block": {"type": "tool_use", "id": "call_1", "name": "weather", "input": {}}})),
            ("content_block_delta", args("{\"ci")),
            ("content_block_delta", args("ty\":\"Paris\"}")),
            ("content_block_stop", json!({"type": "content_block_stop", "index": 1})),
            ("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
                "usage": {"input_tokens": 30, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 100, "output_tokens": 30}})),
            ("message_stop", json!({"type": "message_stop"})),
        ]
        .into_iter()
        .map(|(n, v)| (n.to_owned(), v))
        .collect()
    }

    fn parsed(frames: &[String]) -> Vec<(String, Value)> {
        let mut p = sse::Parser::new();
        frames
            .iter()
            .flat_map(|f| p.feed(f.as_bytes()))
            .map(|e| (e.name, serde_json::from_str(&e.data).unwrap()))
            .collect()
    }

    #[test]
    fn a_backend_stream_cut_at_every_byte_gives_the_same_events() {
        let bytes = BACKEND.as_bytes();
        for cut in 0..=bytes.len() {
            let mut s = MessagesStream::new("claude-x");
            let mut out = s.feed(&bytes[..cut]);
            out.extend(s.feed(&bytes[cut..]));
            assert_eq!(parsed(&out), expected(), "cut at {cut}");
            assert_eq!(s.finish(), Vec::<String>::new());
        }
    }

    #[test]
    fn a_cut_stream_or_an_error_chunk_ends_with_an_error_event() {
        let mut s = MessagesStream::new("m");
        s.feed(
            BACKEND
                .split("data: {\"id\":\"chatcmpl-9\",\"choices\":[{\"index\":0,\"delta\":{},")
                .next()
                .unwrap()
                .as_bytes(),
        );
        let out = s.finish();
        assert_eq!(out.len(), 1);
        assert!(out[0].starts_with("event: error\n") && out[0].contains("api_error"), "{out:?}");
        let mut s = MessagesStream::new("m");
        let out = s.feed(b"data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\"}}\n\n");
        assert_eq!(out, [sse::error_event(ErrorType::Api, "boom")]);
        assert_eq!(s.feed(BACKEND.as_bytes()), Vec::<String>::new());
    }

    /// Found by fuzzing (`fuzz/corpus/openai_stream/regress-two-bad-chunks`):
    /// two chunks that are not JSON in one read ended the stream with two
    /// `error` events, the second after the stream was over.
    #[test]
    fn a_reverse_stream_fails_once_however_many_bad_chunks_follow() {
        let mut s = MessagesStream::new("claude-x");
        let mut out = s.feed(b"data: nope\n\ndata: again\n\n");
        out.extend(s.feed(b"data: {nope\n\n"));
        out.extend(s.finish());
        assert_eq!(out.len(), 1, "one error event: {out:?}");
        assert!(out[0].starts_with("event: error\n"));
    }

    /// Found by fuzzing (`fuzz/corpus/openai_stream/regress-interleaved-tools`):
    /// the arguments of tool call 0 arriving after call 1 had opened its
    /// block went out as a delta to block 0, already closed — an event order
    /// Anthropic's grammar has no place for. The stream ends with an error.
    #[test]
    fn arguments_of_a_tool_call_whose_block_closed_end_the_stream_with_an_error() {
        let call = |index: u64, id: Option<&str>, args: &str| {
            let function = match id {
                Some(_) => json!({"name": "f", "arguments": args}),
                None => json!({"arguments": args}),
            };
            let mut c = json!({"index": index, "function": function});
            if let Some(id) = id {
                c["id"] = json!(id);
            }
            json!({"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [c]}}]})
        };
        let mut s = MessagesStream::new("claude-x");
        let mut out = s.push(&call(0, Some("call_0"), "{\"a\":"));
        out.extend(s.push(&call(1, Some("call_1"), "{}")));
        out.extend(s.push(&call(0, None, "1}")));
        out.extend(s.finish());
        let names: Vec<&str> = out.iter().map(|e| e.lines().next().unwrap()).collect();
        assert_eq!(
            names,
            [
                "event: message_start",
                "event: content_block_start",
                "event: content_block_delta",
                "event: content_block_stop",
                "event: content_block_start",
                "event: content_block_delta",
                "event: error"
            ]
        );
    }
}
