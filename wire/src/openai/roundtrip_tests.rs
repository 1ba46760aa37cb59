//! Round trips over generated conversations: chat → messages → (an upstream
//! answering with each assistant turn) → chat keeps every text, every tool call
//! (id, name, arguments) and every tool result; and a streamed answer adds up
//! to the same message as the plain one, however its bytes are cut.

use serde_json::{Map, Value, json};

use super::*;
use crate::sse;

/// splitmix64: deterministic, so a failure names a seed that replays it.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A non-empty text (empty ones are dropped by design) with what JSON and
    /// SSE framing must survive: quotes, backslashes, newlines, `data: `,
    /// multi-byte characters.
    fn text(&mut self) -> String {
        const PIECES: &[&str] = &["a", "b", "Zz", " ", "\n", "\"", "\\", "é", "日本", "🙂", "{", "}", "data: ", "\r\n"];
        let n = 1 + self.below(12);
        (0..n).map(|_| PIECES[self.below(PIECES.len() as u64) as usize]).collect()
    }

    fn arguments(&mut self) -> Value {
        let mut m = Map::new();
        for k in 0..self.below(4) {
            let v = match self.below(4) {
                0 => json!(self.below(1000)),
                1 => json!(self.text()),
                2 => json!([self.text(), self.below(5), null]),
                _ => json!({"nested": self.text(), "flag": self.below(2) == 0}),
            };
            m.insert(format!("k{k}"), v);
        }
        Value::Object(m)
    }
}

/// A conversation: user texts, assistant texts and tool calls, tool results,
/// with same-role runs (two users, two assistants) as clients send them.
fn conversation(rng: &mut Rng) -> Vec<Value> {
    let mut out = vec![json!({"role": "system", "content": rng.text()})];
    let mut call = 0;
    for _ in 0..1 + rng.below(6) {
        for _ in 0..1 + rng.below(2) {
            out.push(json!({"role": "user", "content": rng.text()}));
        }
        for _ in 0..1 + rng.below(2) {
            let text = if rng.below(3) == 0 { Value::Null } else { json!(rng.text()) };
            let mut m = json!({"role": "assistant", "content": text});
            let mut ids = Vec::new();
            let calls: Vec<Value> = (0..rng.below(3))
                .map(|_| {
                    call += 1;
                    ids.push(format!("call_{call}"));
                    let args = rng.arguments().to_string();
                    json!({"id": format!("call_{call}"), "type": "function",
                        "function": {"name": format!("tool_{}", rng.below(3)), "arguments": args}})
                })
                .collect();
            if calls.is_empty() && m["content"].is_null() {
                m["content"] = json!(rng.text());
            }
            if !calls.is_empty() {
                m["tool_calls"] = Value::Array(calls);
            }
            out.push(m);
            for id in ids {
                out.push(json!({"role": "tool", "tool_call_id": id, "content": rng.text()}));
            }
        }
    }
    out
}

/// What a run of same-side messages must keep: texts, tool calls (id, name,
/// parsed arguments) and tool results (id, text), each in order.
#[derive(Debug, Default, PartialEq)]
struct Kept {
    texts: Vec<String>,
    calls: Vec<(String, String, Value)>,
    results: Vec<(String, String)>,
}

/// The original conversation in runs: a user and the tool results after an
/// assistant are one side, as Anthropic sees them.
fn expected_runs(conversation: &[Value]) -> Vec<(&'static str, Kept)> {
    let mut runs: Vec<(&'static str, Kept)> = Vec::new();
    for m in conversation.iter().filter(|m| m["role"] != "system") {
        let side = if m["role"] == "assistant" { "assistant" } else { "user" };
        if runs.last().is_none_or(|(s, _)| *s != side) {
            runs.push((side, Kept::default()));
        }
        let kept = &mut runs.last_mut().unwrap().1;
        match m["role"].as_str().unwrap() {
            "tool" => kept.results.push((str_of(&m["tool_call_id"]), str_of(&m["content"]))),
            _ => kept.texts.extend(m["content"].as_str().map(str::to_owned)),
        }
        for c in m["tool_calls"].as_array().into_iter().flatten() {
            let args = serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
            kept.calls.push((str_of(&c["id"]), str_of(&c["function"]["name"]), args));
        }
    }
    runs
}

fn str_of(v: &Value) -> String {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v}")).to_owned()
}

/// A user turn of the translated request, read back.
fn user_turn(turn: &Value) -> Kept {
    let mut kept = Kept::default();
    for b in turn["content"].as_array().unwrap() {
        match b["type"].as_str().unwrap() {
            "text" => kept.texts.push(str_of(&b["text"])),
            "tool_result" => kept.results.push((str_of(&b["tool_use_id"]), str_of(&b["content"]))),
            other => panic!("unexpected block {other}"),
        }
    }
    kept
}

/// The upstream's answer if it said exactly this assistant turn.
fn answer_of(turn: &Value, seed: u64) -> Value {
    let content = turn["content"].clone();
    let tool = content.as_array().unwrap().iter().any(|b| b["type"] == "tool_use");
    json!({"id": format!("msg_{seed}"), "type": "message", "role": "assistant", "model": "claude-x",
        "content": content, "stop_reason": if tool { "tool_use" } else { "end_turn" }, "stop_sequence": null,
        "usage": {"input_tokens": 3, "output_tokens": 4}})
}

/// An assistant turn, answered by the upstream and translated back to a
/// chat.completion message, read back.
fn assistant_turn(turn: &Value, seed: u64) -> Kept {
    let chat = messages_to_chat(&answer_of(turn, seed), "gpt-4o", 1);
    let message = &chat["choices"][0]["message"];
    let mut kept = Kept::default();
    // The chat message joins the texts: they are split back at the turn's
    // block lengths to be compared one by one.
    let joined = message["content"].as_str().unwrap_or("");
    let mut at = 0;
    for b in turn["content"].as_array().unwrap().iter().filter(|b| b["type"] == "text") {
        let len = b["text"].as_str().unwrap().len();
        kept.texts.push(joined[at..at + len].to_owned());
        at += len;
    }
    assert_eq!(at, joined.len(), "no text beyond the blocks'");
    for c in message["tool_calls"].as_array().into_iter().flatten() {
        let args = serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
        kept.calls.push((str_of(&c["id"]), str_of(&c["function"]["name"]), args));
    }
    kept
}

#[test]
fn chat_to_messages_and_back_keeps_texts_tool_calls_and_results() {
    for seed in 0..300 {
        let mut rng = Rng(seed);
        let convo = conversation(&mut rng);
        let req = json!({"model": "claude-x", "messages": convo});
        let t = chat_to_messages(&req, &|_| None).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(t.body["system"], convo[0]["content"], "seed {seed}");
        let turns = t.body["messages"].as_array().unwrap();
        let want = expected_runs(&convo);
        assert_eq!(turns.len(), want.len(), "seed {seed}: turns alternate");
        for (turn, (side, kept)) in turns.iter().zip(want) {
            assert_eq!(turn["role"], side, "seed {seed}");
            let got = if side == "user" { user_turn(turn) } else { assistant_turn(turn, seed) };
            assert_eq!(got, kept, "seed {seed}");
        }
    }
}

/// Anthropic's events for an answer, its texts and JSON cut at random places.
fn events_of(answer: &Value, rng: &mut Rng) -> String {
    let mut start = answer.clone();
    start["content"] = json!([]);
    start["stop_reason"] = Value::Null;
    let mut out = vec![sse::frame("message_start", &json!({"type": "message_start", "message": start}).to_string())];
    for (index, b) in answer["content"].as_array().unwrap().iter().enumerate() {
        let (open, whole, kind, key) = match b["type"].as_str().unwrap() {
            "text" => (json!({"type": "text", "text": ""}), str_of(&b["text"]), "text_delta", "text"),
            _ => {
                let open = json!({"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}});
                (open, b["input"].to_string(), "input_json_delta", "partial_json")
            }
        };
        let data = json!({"type": "content_block_start", "index": index, "content_block": open});
        out.push(sse::frame("content_block_start", &data.to_string()));
        for piece in cut(&whole, rng) {
            let data = json!({"type": "content_block_delta", "index": index, "delta": {"type": kind, key: piece}});
            out.push(sse::frame("content_block_delta", &data.to_string()));
        }
        let data = json!({"type": "content_block_stop", "index": index});
        out.push(sse::frame("content_block_stop", &data.to_string()));
    }
    let delta = json!({"type": "message_delta", "delta": {"stop_reason": answer["stop_reason"], "stop_sequence": null},
        "usage": {"output_tokens": 4}});
    out.push(sse::frame("message_delta", &delta.to_string()));
    out.push(sse::frame("message_stop", r#"{"type":"message_stop"}"#));
    out.concat()
}

/// `s` in 1–4 pieces cut at character boundaries (some maybe empty).
fn cut(s: &str, rng: &mut Rng) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    let mut bounds: Vec<usize> = (0..rng.below(4)).map(|_| rng.below(chars.len() as u64 + 1) as usize).collect();
    bounds.extend([0, chars.len()]);
    bounds.sort_unstable();
    bounds.windows(2).map(|w| chars[w[0]..w[1]].iter().collect()).collect()
}

/// The chunks of a stream added up, as an OpenAI client library does: the
/// message (content and tool calls) and the finish reason.
fn accumulate(lines: &[String]) -> (Value, Value) {
    let mut content = String::new();
    let mut calls: Vec<Value> = Vec::new();
    let mut finish = Value::Null;
    assert_eq!(lines.last().map(String::as_str), Some(DONE));
    for line in &lines[..lines.len() - 1] {
        let chunk: Value = serde_json::from_str(line.strip_prefix("data: ").unwrap().trim_end()).unwrap();
        let Some(choice) = chunk["choices"].get(0) else { continue };
        content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        for c in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let i = c["index"].as_u64().unwrap() as usize;
            if i == calls.len() {
                let function = json!({"name": c["function"]["name"], "arguments": ""});
                calls.push(json!({"id": c["id"], "type": "function", "function": function}));
            }
            let args = str_of(&calls[i]["function"]["arguments"]) + c["function"]["arguments"].as_str().unwrap();
            calls[i]["function"]["arguments"] = json!(args);
        }
        if !choice["finish_reason"].is_null() {
            finish = choice["finish_reason"].clone();
        }
    }
    let content = if content.is_empty() && !calls.is_empty() { Value::Null } else { json!(content) };
    let mut message = json!({"role": "assistant", "content": content, "refusal": null});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    (message, finish)
}

#[test]
fn a_streamed_answer_adds_up_to_the_plain_one_however_it_is_cut() {
    for seed in 0..300 {
        let mut rng = Rng(seed);
        let convo = conversation(&mut rng);
        let t = chat_to_messages(&json!({"model": "claude-x", "messages": convo}), &|_| None).unwrap();
        for turn in t.body["messages"].as_array().unwrap().iter().filter(|m| m["role"] == "assistant") {
            let answer = answer_of(turn, seed);
            let plain = &messages_to_chat(&answer, "gpt-4o", 1)["choices"][0];
            let bytes = events_of(&answer, &mut rng).into_bytes();
            let mut stream = ChatStream::new("gpt-4o", 1, true);
            let mut lines = Vec::new();
            let mut at = 0;
            while at < bytes.len() {
                let n = (1 + rng.below(40) as usize).min(bytes.len() - at);
                lines.extend(stream.feed(&bytes[at..at + n]));
                at += n;
            }
            lines.extend(stream.finish());
            let (message, finish) = accumulate(&lines);
            assert_eq!(message, plain["message"], "seed {seed}");
            assert_eq!(finish, plain["finish_reason"], "seed {seed}");
        }
    }
}
