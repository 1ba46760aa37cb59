use super::*;
use serde_json::json;

fn aliases(m: &str) -> Option<String> {
    (m == "gpt-4o").then(|| "claude-sonnet-4-5".to_owned())
}

fn ok(req: Value) -> Translated {
    chat_to_messages(&req, &aliases).unwrap_or_else(|e| panic!("refused: {e}"))
}

fn err(req: Value) -> OpenAiError {
    chat_to_messages(&req, &aliases).expect_err("accepted")
}

fn with(extra: Value) -> Value {
    let mut req = json!({"model": "claude-x", "messages": [{"role": "user", "content": "hi"}]});
    for (k, v) in extra.as_object().unwrap() {
        req[k] = v.clone();
    }
    req
}

fn convo(messages: Value) -> Value {
    ok(json!({"model": "claude-x", "messages": messages})).body
}

#[test]
fn a_minimal_request_gets_the_default_max_tokens_and_blocks() {
    let t = ok(with(json!({})));
    assert_eq!(
        t.body,
        json!({"model": "claude-x", "max_tokens": 4096, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
    );
    assert_eq!((t.stream, t.include_usage, t.model.as_str(), t.session), (false, false, "claude-x", None));
}

#[test]
fn models_pass_or_go_through_the_aliases() {
    let t = ok(with(json!({"model": "gpt-4o"})));
    assert_eq!((t.body["model"].as_str(), t.model.as_str()), (Some("claude-sonnet-4-5"), "gpt-4o"));
    let e = err(with(json!({"model": "gpt-5"})));
    assert_eq!((e.status, e.param.as_deref(), e.code.as_deref()), (400, Some("model"), Some("model_not_found")));
    assert!(e.message.contains("`gpt-5`"), "{}", e.message);
}

#[test]
fn system_and_developer_messages_become_the_system_text_in_order() {
    let body = convo(json!([
        {"role": "system", "content": "one"},
        {"role": "user", "content": "hi"},
        {"role": "developer", "content": [{"type": "text", "text": "tw"}, {"type": "text", "text": "o"}]},
    ]));
    assert_eq!(body["system"], "one\n\ntwo");
    assert_eq!(body["messages"].as_array().unwrap().len(), 1);
}

#[test]
fn parts_become_blocks_and_images_their_sources() {
    let body = convo(json!([{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "text", "text": ""},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "high"}},
        {"type": "image_url", "image_url": {"url": "https://x.test/a.jpg"}},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBE", "filename": "a.pdf"}},
    ]}]));
    assert_eq!(
        body["messages"][0]["content"],
        json!([
            {"type": "text", "text": "look"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
            {"type": "image", "source": {"type": "url", "url": "https://x.test/a.jpg"}},
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}},
        ])
    );
}

#[test]
fn tool_calls_and_results_become_blocks_in_alternating_turns() {
    let body = convo(json!([
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}},
            {"id": "call.2", "type": "function", "function": {"name": "g", "arguments": ""}},
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "r1"},
        {"role": "user", "content": "and"},
        {"role": "tool", "tool_call_id": "call.2", "content": [{"type": "text", "text": "r2"}]},
        {"role": "assistant", "content": "done"},
    ]));
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "call_1", "name": "f", "input": {"x": 1}},
                {"type": "tool_use", "id": "call_2", "name": "g", "input": {}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "r1"},
                {"type": "tool_result", "tool_use_id": "call_2", "content": [{"type": "text", "text": "r2"}]},
                {"type": "text", "text": "and"},
            ]},
            {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
        ])
    );
}

#[test]
fn tools_and_every_tool_choice_map() {
    let tools = json!([
        {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "g"}},
    ]);
    let body = ok(with(json!({"tools": tools}))).body;
    assert_eq!(
        body["tools"],
        json!([
            {"name": "f", "description": "d", "input_schema": {"type": "object"}},
            {"name": "g", "input_schema": {"type": "object", "properties": {}}},
        ])
    );
    assert_eq!(body.get("tool_choice"), None);
    let choice = |c: Value, parallel: Value| {
        ok(with(json!({"tools": tools, "tool_choice": c, "parallel_tool_calls": parallel}))).body["tool_choice"].clone()
    };
    assert_eq!(choice(json!("auto"), Value::Null), json!({"type": "auto"}));
    assert_eq!(choice(json!("none"), json!(false)), json!({"type": "none"}));
    assert_eq!(choice(json!("required"), json!(true)), json!({"type": "any"}));
    assert_eq!(
        choice(json!({"type": "function", "function": {"name": "g"}}), json!(false)),
        json!({"type": "tool", "name": "g", "disable_parallel_tool_use": true})
    );
    assert_eq!(choice(Value::Null, json!(false)), json!({"type": "auto", "disable_parallel_tool_use": true}));
    // Without tools, auto and none mean nothing; a forced call is an error.
    let body = ok(with(json!({"tool_choice": "none", "parallel_tool_calls": false}))).body;
    assert_eq!((body.get("tools"), body.get("tool_choice")), (None, None));
    assert_eq!(err(with(json!({"tool_choice": "required"}))).param.as_deref(), Some("tool_choice"));
}

#[test]
fn sampling_limits_user_and_stream_map() {
    let t = ok(with(json!({
        "max_completion_tokens": 10, "max_tokens": 20, "temperature": 0.5, "top_p": 0.9,
        "stop": "END", "user": "u-1", "stream": true, "stream_options": {"include_usage": true},
        "seed": 7, "presence_penalty": 0.1,
    })));
    assert_eq!(t.body["max_tokens"], 10);
    assert_eq!((t.body["temperature"].as_f64(), t.body["top_p"].as_f64()), (Some(0.5), Some(0.9)));
    assert_eq!(t.body["stop_sequences"], json!(["END"]));
    assert_eq!(t.body["metadata"], json!({"user_id": "u-1"}));
    assert_eq!((t.body["stream"].as_bool(), t.stream, t.include_usage), (Some(true), true, true));
    assert_eq!(t.session.as_deref(), Some("u-1"));
    assert_eq!((t.body.get("seed"), t.body.get("presence_penalty")), (None, None));
    let t = ok(with(json!({"max_tokens": 20, "stop": ["a", "b"], "stream_options": {"include_usage": true}})));
    assert_eq!((t.body["max_tokens"].as_u64(), t.include_usage), (Some(20), false));
    assert_eq!(t.body["stop_sequences"], json!(["a", "b"]));
    let t = ok(with(json!({"stream": false, "n": 1, "logprobs": false, "response_format": {"type": "text"}})));
    assert_eq!((t.stream, t.body.get("stream")), (false, None));
}

#[test]
fn what_anthropic_cannot_do_is_refused_naming_the_field() {
    let cases = [
        (json!({"n": 2}), "n"),
        (json!({"logprobs": true}), "logprobs"),
        (json!({"top_logprobs": 3}), "logprobs"),
        (json!({"response_format": {"type": "json_object"}}), "response_format"),
        (json!({"response_format": {"type": "json_schema", "json_schema": {}}}), "response_format"),
        (json!({"audio": {"voice": "alloy"}}), "audio"),
        (json!({"modalities": ["text", "audio"]}), "audio"),
        (json!({"functions": [{"name": "f"}]}), "functions"),
        (json!({"function_call": "auto"}), "function_call"),
        (json!({"messages": [{"role": "critic", "content": "x"}]}), "messages[0].role"),
        (json!({"messages": [{"role": "function", "name": "f", "content": "x"}]}), "messages[0].role"),
        (json!({"messages": [{"content": "x"}]}), "messages[0].role"),
        (json!({"messages": []}), "messages"),
        (json!({"messages": [{"role": "system", "content": "x"}]}), "messages"),
        (json!({"messages": [{"role": "assistant", "content": null}]}), "messages"),
        (json!({"messages": "hi"}), "messages"),
        (json!({"model": 4}), "model"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"temperature": "hot"}), "temperature"),
        (json!({"stop": 3}), "stop"),
        (json!({"stream": "yes"}), "stream"),
        (json!({"user": 1}), "user"),
        (json!({"tools": [{"type": "custom", "custom": {}}]}), "tools[0]"),
        (json!({"tools": [{"type": "function", "function": {}}]}), "tools[0].function.name"),
        (json!({"tool_choice": "sometimes"}), "tool_choice"),
    ];
    for (extra, param) in cases {
        let e = err(with(extra.clone()));
        assert_eq!((e.status, e.kind, e.param.as_deref()), (400, "invalid_request_error", Some(param)), "{extra}");
    }
    let missing = [json!({"messages": []}), json!({"model": "claude-x"}), json!([1]), json!("x")];
    let params: Vec<Option<String>> = missing.iter().map(|r| err(r.clone()).param).collect();
    assert_eq!(params, [Some("model".into()), Some("messages".into()), None, None]);
}

#[test]
fn bad_contents_are_refused_naming_the_part() {
    let user = |content: Value| err(with(json!({"messages": [{"role": "user", "content": content}]}))).param;
    let part = |p: Value| user(json!([p]));
    assert_eq!(user(json!(3)), Some("messages[0].content".into()));
    assert_eq!(part(json!({"type": "input_audio", "input_audio": {}})), Some("messages[0].content[0]".into()));
    assert_eq!(
        part(json!({"type": "image_url", "image_url": {"url": "ftp://x"}})),
        Some("messages[0].content[0]".into())
    );
    let not_b64 = json!({"type": "image_url", "image_url": {"url": "data:image/png,raw"}});
    assert_eq!(part(not_b64), Some("messages[0].content[0]".into()));
    assert_eq!(part(json!({"type": "file", "file": {"file_id": "file-1"}})), Some("messages[0].content[0]".into()));
    assert_eq!(part(json!({"text": "no type"})), Some("messages[0].content[0]".into()));
    let system = json!({"messages": [{"role": "system", "content": [{"type": "image_url"}]}]});
    assert_eq!(err(with(system)).param, Some("messages[0].content[0]".into()));
}

#[test]
fn bad_tool_calls_and_results_are_refused() {
    let call = |args: &str| {
        let m = json!([{"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": args}}]}]);
        chat_to_messages(&json!({"model": "claude-x", "messages": m}), &aliases).map(|t| t.body)
    };
    assert_eq!(call(" ").unwrap()["messages"][0]["content"][0]["input"], json!({}));
    for bad in ["{\"x\":", "[1]", "nope"] {
        let e = call(bad).expect_err(bad);
        assert_eq!(e.param.as_deref(), Some("messages[0].tool_calls[0].function.arguments"), "{bad}");
        assert!(e.message.contains("`c`"));
    }
    let m = json!([{"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}}]);
    assert_eq!(err(with(json!({"messages": m}))).param.as_deref(), Some("messages[0].function_call"));
    let m = json!([{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}]);
    assert_eq!(err(with(json!({"messages": m}))).param.as_deref(), Some("messages[0].tool_calls[0].id"));
    let m = json!([{"role": "tool", "content": "r"}]);
    assert_eq!(err(with(json!({"messages": m}))).param.as_deref(), Some("messages[0].tool_call_id"));
}
