use super::*;

/// An Anthropic stream as it comes over the wire: text (one delta with a
/// two-byte character), a tool call whose input comes in parts that are no JSON
/// on their own, cached prompt tokens, a ping and a thinking block between.
const UPSTREAM: &str = concat!(
    "event: message_start\n",
    r#"data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"cache_creation_input_tokens":20,"cache_read_input_tokens":100,"output_tokens":1}}}"#,
    "\n\n",
    "event: content_block_start\n",
    r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
    "\n\n",
    "event: content_block_delta\n",
    r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hm"}}"#,
    "\n\n",
    "event: content_block_stop\n",
    r#"data: {"type":"content_block_stop","index":0}"#,
    "\n\n",
    "event: content_block_start\n",
    r#"data: {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
    "\n\n",
    "event: ping\n",
    r#"data: {"type": "ping"}"#,
    "\n\n",
    "event: content_block_delta\n",
    r#"data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi "}}"#,
    "\n\n",
    "event: content_block_delta\n",
    r#"data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"café"}}"#,
    "\n\n",
    "event: content_block_stop\n",
    r#"data: {"type":"content_block_stop","index":1}"#,
    "\n\n",
    "event: content_block_start\n",
    r#"data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_1","name":"weather","input":{}}}"#,
    "\n\n",
    "event: content_block_delta\n",
    r#"data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":""}}"#,
    "\n\n",
    "event: content_block_delta\n",
    r#"data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"ci"}}"#,
    "\n\n",
    "event: content_block_delta\n",
    r#"data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"ty\": \"Paris\"}"}}"#,
    "\n\n",
    "event: content_block_stop\n",
    r#"data: {"type":"content_block_stop","index":2}"#,
    "\n\n",
    "event: message_delta\n",
    r#"data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":30}}"#,
    "\n\n",
    "event: message_stop\n",
    r#"data: {"type":"message_stop"}"#,
    "\n\n",
);

const HEAD: &str =
    r#"{"id":"chatcmpl-msg_1","object":"chat.completion.chunk","created":7,"model":"gpt-4o","choices":["#;

/// The chunks expected for [`UPSTREAM`], each `choices` and `usage` written out.
fn expected(include_usage: bool) -> Vec<String> {
    let tail = if include_usage { r#","usage":null}"# } else { "}" };
    let choice = |delta: &str, finish: &str| {
        format!("data: {HEAD}{{\"index\":0,\"delta\":{delta},\"logprobs\":null,\"finish_reason\":{finish}}}]{tail}\n\n")
    };
    let mut out = vec![
        choice(r#"{"content":"","role":"assistant"}"#, "null"),
        choice(r#"{"content":"Hi "}"#, "null"),
        choice(r#"{"content":"café"}"#, "null"),
        choice(
            r#"{"tool_calls":[{"function":{"arguments":"","name":"weather"},"id":"toolu_1","index":0,"type":"function"}]}"#,
            "null",
        ),
        choice(r#"{"tool_calls":[{"function":{"arguments":"{\"ci"},"index":0}]}"#, "null"),
        choice(r#"{"tool_calls":[{"function":{"arguments":"ty\": \"Paris\"}"},"index":0}]}"#, "null"),
        choice("{}", r#""tool_calls""#),
    ];
    if include_usage {
        out.push(format!(
            "data: {HEAD}],\"usage\":{{\"completion_tokens\":30,\"prompt_tokens\":130,\"prompt_tokens_details\":{{\"cached_tokens\":100}},\"total_tokens\":160}}}}\n\n"
        ));
    }
    out.push(DONE.to_owned());
    out
}

fn run(include_usage: bool, pieces: &[&[u8]]) -> Vec<String> {
    let mut s = ChatStream::new("gpt-4o", 7, include_usage);
    let mut out: Vec<String> = pieces.iter().flat_map(|p| s.feed(p)).collect();
    out.extend(s.finish());
    assert_eq!(s.finish(), Vec::<String>::new(), "finish twice");
    out
}

#[test]
fn a_stream_cut_at_every_byte_gives_the_same_exact_chunks() {
    let bytes = UPSTREAM.as_bytes();
    for include_usage in [false, true] {
        let want = expected(include_usage);
        assert_eq!(run(include_usage, &[bytes]), want);
        for cut in 0..=bytes.len() {
            assert_eq!(run(include_usage, &[&bytes[..cut], &bytes[cut..]]), want, "cut at {cut}");
        }
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(run(include_usage, &singles), want);
    }
}

#[test]
fn each_event_is_answered_as_it_arrives() {
    // The chunk for a delta comes out of the push of that delta, not later.
    let mut s = ChatStream::new("gpt-4o", 7, false);
    let mut parser = sse::Parser::new();
    let counts: Vec<usize> = parser
        .feed(UPSTREAM.as_bytes())
        .iter()
        .map(|e| s.push(&e.name, &serde_json::from_str(&e.data).unwrap()).len())
        .collect();
    assert_eq!(counts, [1, 0, 0, 0, 0, 0, 1, 1, 0, 1, 0, 1, 1, 0, 1, 0]);
}

#[test]
fn an_error_event_is_an_error_chunk_then_done() {
    let mut s = ChatStream::new("m", 7, false);
    s.feed(UPSTREAM.split("event: content_block_stop").next().unwrap().as_bytes());
    let out = s.feed(
        b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
    );
    assert_eq!(
        out,
        [
            r#"data: {"error":{"code":"overloaded","message":"Overloaded","param":null,"type":"server_error"}}"#
                .to_owned()
                + "\n\n",
            DONE.to_owned(),
        ]
    );
    assert_eq!(s.feed(UPSTREAM.as_bytes()), Vec::<String>::new());
    assert_eq!(s.finish(), Vec::<String>::new());
}

#[test]
fn a_stream_cut_short_ends_with_an_error_and_bad_json_too() {
    let mut s = ChatStream::new("m", 7, false);
    assert_eq!(s.feed(UPSTREAM.split("event: message_delta").next().unwrap().as_bytes()).len(), 6);
    let out = s.finish();
    assert!(out[0].starts_with(r#"data: {"error":{"#) && out[0].contains("server_error"), "{out:?}");
    assert_eq!(out[1], DONE);
    let mut s = ChatStream::new("m", 7, false);
    let out = s.feed(b"event: message_start\ndata: {oops\n\n");
    assert!(out[0].contains("not JSON") && out[1] == DONE, "{out:?}");
}

#[test]
fn a_stop_without_a_message_delta_still_finishes_and_a_start_is_not_needed() {
    let mut s = ChatStream::new("m", 7, false);
    let delta = serde_json::json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}});
    let out = s.push("content_block_delta", &delta);
    assert_eq!(out.len(), 2, "the role chunk comes first: {out:?}");
    let out = s.push("message_stop", &serde_json::json!({"type": "message_stop"}));
    assert!(out[0].contains(r#""finish_reason":"stop""#), "{out:?}");
    assert_eq!(s.finish(), [DONE]);
}

/// Found by fuzzing (`fuzz/corpus/openai_stream/regress-two-bad-events`):
/// two events that are not JSON in one read ended the stream twice — two
/// error chunks and two `[DONE]`s, the second after the stream was over.
#[test]
fn a_stream_fails_once_however_many_bad_events_follow() {
    let mut s = ChatStream::new("gpt-4o", 1, false);
    let mut out = s.feed(b"event: ping\ndata: nope\n\nevent: ping\ndata: again\n\n");
    out.extend(s.feed(b"data: {nope\n\n"));
    out.extend(s.finish());
    assert_eq!(out.iter().filter(|l| l.as_str() == DONE).count(), 1, "{out:?}");
    assert_eq!(out.len(), 2, "one error chunk, then [DONE]: {out:?}");
}
