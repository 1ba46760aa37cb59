//! What a well-formed stream is, checked event by event.
//!
//! The big gateways' trackers are full of stream defects that only show under
//! mixed load: a thinking delta inside a text block, a second `message_start`,
//! a stream cut without an `error` event. A client SDK fails on each in its own
//! way, so the chaos run checks every stream it reads against the grammar the
//! SDKs assume — Anthropic's for Messages, OpenAI's for Chat Completions — and
//! counts each break.

use serde_json::Value;

/// How a stream ended, once read whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ending {
    /// Complete: `message_stop` last (Messages), `[DONE]` after a finish (Chat).
    Whole,
    /// Ended with an `error` event (Messages) or an error chunk then `[DONE]`
    /// (Chat), the events before it well formed: a cut the client is told of.
    CleanError,
    /// The grammar broke: what broke first.
    Broken(String),
}

/// One event of a stream: its `event:` name (`message` when it has none, as
/// OpenAI's have none) and its data, parsed and as sent.
#[derive(Clone, Debug)]
pub struct Event {
    /// The `event:` field, or `message`.
    pub name: String,
    /// The data, parsed (`Null` if it is not JSON).
    pub data: Value,
    /// The data as sent.
    pub raw: String,
}

/// Reads an SSE body with the parser the gateway and its tests use
/// (`poolgate_wire::sse`, the rules a browser follows); the second value is
/// whether the body ends where an event does — a cut mid-event leaves that
/// event unread and says so.
pub fn events(body: &str) -> (Vec<Event>, bool) {
    let complete = body.is_empty() || body.ends_with("\n\n");
    let parsed = poolgate_wire::sse::Parser::new().feed(body.as_bytes());
    let out = parsed
        .into_iter()
        .map(|e| Event { data: serde_json::from_str(&e.data).unwrap_or(Value::Null), name: e.name, raw: e.data })
        .collect();
    (out, complete)
}

/// Checks a Messages stream: one `message_start` first; blocks opened at the
/// next index, each delta of its block's kind and into the open block, each
/// closed before the next opens; one `message_delta` with no block open;
/// `message_stop` last. `ping` may come anywhere after `message_start`; an
/// `error` event ends the stream cleanly wherever it comes.
pub fn messages(body: &str) -> Ending {
    let (events, complete) = events(body);
    let mut m = Machine::default();
    for (i, e) in events.iter().enumerate() {
        if e.name == "error" {
            return match (i + 1 == events.len(), complete) {
                (true, true) => Ending::CleanError,
                _ => Ending::Broken(format!("events after an error event (event {i})")),
            };
        }
        if let Err(why) = m.step(e) {
            return Ending::Broken(format!("event {i} `{}`: {why}", e.name));
        }
    }
    match (m.stopped, complete) {
        (true, true) => Ending::Whole,
        (_, false) => Ending::Broken("cut in the middle of an event".into()),
        (false, true) => Ending::Broken(format!("ended after {} events without message_stop or error", events.len())),
    }
}

#[derive(Default)]
struct Machine {
    started: bool,
    /// The open block: its index and type.
    open: Option<(u64, String)>,
    next_index: u64,
    delta_seen: bool,
    stopped: bool,
}

impl Machine {
    fn step(&mut self, e: &Event) -> Result<(), String> {
        if self.stopped {
            return Err("after message_stop".into());
        }
        let data_type = e.data["type"].as_str().unwrap_or("");
        if e.name != "message" && data_type != e.name {
            return Err(format!("data type `{data_type}` under event `{}`", e.name));
        }
        match data_type {
            "message_start" if self.started => Err("a second message_start".into()),
            "message_start" => {
                self.started = true;
                Ok(())
            }
            _ if !self.started => Err("before message_start".into()),
            "ping" => Ok(()),
            "content_block_start" => self.open_block(&e.data),
            "content_block_delta" => self.delta(&e.data),
            "content_block_stop" => match self.open.take() {
                Some((i, _)) if Some(i) == e.data["index"].as_u64() => Ok(()),
                Some((i, _)) => Err(format!("stops index {} while {i} is open", e.data["index"])),
                None => Err("stops a block none opened".into()),
            },
            "message_delta" if self.open.is_some() => Err("message_delta with a block open".into()),
            "message_delta" if self.delta_seen => Err("a second message_delta".into()),
            "message_delta" => {
                self.delta_seen = true;
                Ok(())
            }
            "message_stop" if !self.delta_seen => Err("message_stop before message_delta".into()),
            "message_stop" => {
                self.stopped = true;
                Ok(())
            }
            other => Err(format!("unknown event type `{other}`")),
        }
    }

    fn open_block(&mut self, data: &Value) -> Result<(), String> {
        if let Some((i, _)) = &self.open {
            return Err(format!("opens a block while {i} is open"));
        }
        if self.delta_seen {
            return Err("opens a block after message_delta".into());
        }
        let index = data["index"].as_u64().ok_or("no index")?;
        if index != self.next_index {
            return Err(format!("opens index {index}, expected {}", self.next_index));
        }
        let kind = data["content_block"]["type"].as_str().ok_or("no content_block.type")?;
        self.open = Some((index, kind.to_string()));
        self.next_index += 1;
        Ok(())
    }

    fn delta(&self, data: &Value) -> Result<(), String> {
        let Some((open, kind)) = &self.open else { return Err("a delta with no block open".into()) };
        if data["index"].as_u64() != Some(*open) {
            return Err(format!("a delta for index {} while {open} is open", data["index"]));
        }
        let delta = data["delta"]["type"].as_str().unwrap_or("");
        let fits = match kind.as_str() {
            "text" => matches!(delta, "text_delta" | "citations_delta"),
            "thinking" => matches!(delta, "thinking_delta" | "signature_delta"),
            "tool_use" | "server_tool_use" => delta == "input_json_delta",
            _ => false,
        };
        if fits { Ok(()) } else { Err(format!("a `{delta}` inside a `{kind}` block")) }
    }
}

/// Checks a Chat Completions stream: `data:` lines of `chat.completion.chunk`
/// objects, the first with `delta.role = "assistant"`; no content after a
/// `finish_reason`; `[DONE]` last. An error chunk (`{"error": …}`) then
/// `[DONE]` is a clean end wherever it comes.
pub fn chat(body: &str) -> Ending {
    let (events, complete) = events(body);
    if !complete {
        return Ending::Broken("cut in the middle of a chunk".into());
    }
    let datas: Vec<&str> = events.iter().map(|e| e.raw.as_str()).collect();
    if datas.last() != Some(&"[DONE]") {
        return Ending::Broken(format!("ended after {} chunks without [DONE]", events.len()));
    }
    let (mut role, mut finished) = (false, false);
    for (i, d) in datas[..datas.len() - 1].iter().enumerate() {
        let Ok(v) = serde_json::from_str::<Value>(d) else { return Ending::Broken(format!("chunk {i} is not JSON")) };
        if v.get("error").is_some() {
            return if i + 2 == datas.len() {
                Ending::CleanError
            } else {
                Ending::Broken(format!("chunks after the error chunk {i}"))
            };
        }
        if v["object"] != "chat.completion.chunk" {
            return Ending::Broken(format!("chunk {i} is a `{}`", v["object"]));
        }
        let Some(choice) = v["choices"].as_array().and_then(|c| c.first()) else { continue };
        if !role {
            if choice["delta"]["role"] != "assistant" {
                return Ending::Broken("the first chunk gives no role".into());
            }
            role = true;
        }
        let content = choice["delta"]["content"].as_str().is_some_and(|c| !c.is_empty())
            || choice["delta"]["tool_calls"].is_array();
        if finished && content {
            return Ending::Broken(format!("content in chunk {i} after the finish"));
        }
        finished |= !choice["finish_reason"].is_null();
    }
    if finished { Ending::Whole } else { Ending::Broken("[DONE] without a finish_reason".into()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(name: &str, data: &str) -> String {
        format!("event: {name}\ndata: {data}\n\n")
    }

    fn whole(blocks: &[(&str, &str)]) -> Vec<String> {
        let mut out = vec![ev("message_start", r#"{"type":"message_start","message":{}}"#)];
        for (i, (kind, delta)) in blocks.iter().enumerate() {
            out.push(ev(
                "content_block_start",
                &format!(r#"{{"type":"content_block_start","index":{i},"content_block":{{"type":"{kind}"}}}}"#),
            ));
            out.push(ev(
                "content_block_delta",
                &format!(r#"{{"type":"content_block_delta","index":{i},"delta":{{"type":"{delta}"}}}}"#),
            ));
            out.push(ev("content_block_stop", &format!(r#"{{"type":"content_block_stop","index":{i}}}"#)));
        }
        out.push(ev("message_delta", r#"{"type":"message_delta","delta":{}}"#));
        out.push(ev("message_stop", r#"{"type":"message_stop"}"#));
        out
    }

    #[test]
    fn a_whole_stream_of_thinking_text_and_tool_blocks_is_whole() {
        let s = whole(&[("thinking", "signature_delta"), ("text", "text_delta"), ("tool_use", "input_json_delta")]);
        assert_eq!(messages(&s.concat()), Ending::Whole);
    }

    #[test]
    fn each_break_of_the_grammar_is_named() {
        let base = whole(&[("thinking", "thinking_delta"), ("text", "text_delta")]);
        let broken = |s: Vec<String>| match messages(&s.concat()) {
            Ending::Broken(why) => why,
            other => panic!("{other:?} for {s:?}"),
        };
        let mut twice = base.clone();
        twice.insert(1, base[0].clone());
        assert!(broken(twice).contains("second message_start"));
        let wrong_kind = whole(&[("text", "thinking_delta")]);
        assert!(broken(wrong_kind).contains("thinking_delta` inside a `text"));
        let mut unclosed = base.clone();
        unclosed.remove(3);
        assert!(broken(unclosed).contains("while 0 is open"));
        let mut no_stop = base.clone();
        no_stop.pop();
        assert!(broken(no_stop).contains("without message_stop"));
        let mut half = base.concat();
        half.truncate(half.len() - 5);
        assert!(broken(vec![half]).contains("middle of an event"));
        let mut after_stop = base.clone();
        after_stop.push(base[1].clone());
        assert!(broken(after_stop).contains("after message_stop"));
    }

    #[test]
    fn an_error_event_ends_a_stream_cleanly_only_as_its_last_event() {
        let mut s = whole(&[("text", "text_delta")]);
        s.truncate(3);
        s.push(ev("error", r#"{"type":"error","error":{"type":"api_error"}}"#));
        assert_eq!(messages(&s.concat()), Ending::CleanError);
        s.push(ev("ping", r#"{"type":"ping"}"#));
        assert!(matches!(messages(&s.concat()), Ending::Broken(_)));
    }

    #[test]
    fn a_chat_stream_needs_a_role_a_finish_and_done() {
        let chunk = |delta: &str, finish: &str| {
            format!(
                "data: {{\"object\":\"chat.completion.chunk\",\"choices\":[{{\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
            )
        };
        let good = [chunk(r#"{"role":"assistant","content":""}"#, "null"), chunk(r#"{"content":"hi"}"#, "null")];
        let done = "data: [DONE]\n\n";
        let whole = format!("{}{}{done}", good.concat(), chunk("{}", "\"stop\""));
        assert_eq!(chat(&whole), Ending::Whole);
        assert!(matches!(chat(&format!("{}{done}", good.concat())), Ending::Broken(_)));
        assert!(matches!(chat(&good.concat()), Ending::Broken(_)));
        let error = format!("{}data: {{\"error\":{{\"type\":\"api_error\"}}}}\n\n{done}", good.concat());
        assert_eq!(chat(&error), Ending::CleanError);
        let late = format!("{}{}{}{done}", good.concat(), chunk("{}", "\"stop\""), chunk(r#"{"content":"x"}"#, "null"));
        assert!(matches!(chat(&late), Ending::Broken(_)));
    }
}
