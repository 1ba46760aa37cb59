use super::*;

#[test]
fn a_messages_request_becomes_a_chat_request() {
    let req = json!({
        "model": "claude-x", "max_tokens": 100, "temperature": 0.2, "top_p": 0.9, "top_k": 5,
        "stop_sequences": ["END"], "metadata": {"user_id": "u1"}, "stream": true,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": true},
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm", "signature": "s"},
                {"type": "text", "text": "calling"},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "42"}]},
                {"type": "text", "text": "and?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                {"type": "image", "source": {"type": "url", "url": "https://x.test/i.png"}},
                {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}}]},
        ],
    });
    assert_eq!(
        messages_to_chat_request(&req, "gpt-4o").unwrap(),
        json!({
            "model": "gpt-4o", "max_completion_tokens": 100, "temperature": 0.2, "top_p": 0.9,
            "stop": ["END"], "user": "u1", "stream": true, "stream_options": {"include_usage": true},
            "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}}, "parallel_tool_calls": false,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "calling", "tool_calls": [
                    {"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "42"},
                {"role": "user", "content": [
                    {"type": "text", "text": "and?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "image_url", "image_url": {"url": "https://x.test/i.png"}},
                    {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBE"}}]},
            ],
        })
    );
}

#[test]
fn every_tool_choice_maps_back() {
    let choice = |c: Value| {
        let req = json!({"messages": [], "tools": [{"name": "f", "input_schema": {}}], "tool_choice": c});
        messages_to_chat_request(&req, "m").unwrap()["tool_choice"].clone()
    };
    assert_eq!(choice(json!({"type": "auto"})), json!("auto"));
    assert_eq!(choice(json!({"type": "any"})), json!("required"));
    assert_eq!(choice(json!({"type": "none"})), json!("none"));
    let req = json!({"messages": [], "tool_choice": {"type": "any"}});
    assert_eq!(messages_to_chat_request(&req, "m").unwrap().get("tool_choice"), None, "no tools, no choice");
}

#[test]
fn what_chat_completions_cannot_carry_is_refused() {
    let refused = [
        json!([1]),
        json!({"model": "x"}),
        json!({"messages": [{"role": "system", "content": "x"}]}),
        json!({"messages": [], "system": [{"type": "image"}]}),
        json!({"messages": [], "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
        json!({"messages": [], "tools": [{"name": "f"}], "tool_choice": {"type": "sometimes"}}),
        json!({"messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "x"}}]}]}),
        json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
            "content": [{"type": "image", "source": {}}]}]}]}),
        json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]}),
        json!({"messages": [{"role": "assistant", "content": [{"type": "server_tool_use"}]}]}),
    ];
    for req in refused {
        assert!(messages_to_chat_request(&req, "m").is_err(), "{req}");
    }
}

#[test]
fn a_chat_answer_becomes_a_message() {
    let chat = json!({"id": "chatcmpl-7", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "tool_calls",
        "message": {"role": "assistant", "content": "ok", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\":[1]}"}},
            {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "not json"}}]}}],
        "usage": {"prompt_tokens": 130, "completion_tokens": 5, "total_tokens": 135, "prompt_tokens_details": {"cached_tokens": 100}}});
    assert_eq!(
        chat_to_messages_answer(&chat, "claude-x"),
        json!({"id": "msg_7", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [{"type": "text", "text": "ok"},
                {"type": "tool_use", "id": "call_1", "name": "f", "input": {"x": [1]}},
                {"type": "tool_use", "id": "call_2", "name": "g", "input": {}}],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 30, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 100, "output_tokens": 5}})
    );
    let finish = |f: &str| {
        let chat = json!({"choices": [{"finish_reason": f, "message": {"content": "x"}}]});
        chat_to_messages_answer(&chat, "m")["stop_reason"].clone()
    };
    let got: Vec<Value> = ["stop", "length", "tool_calls", "function_call", "content_filter"].map(finish).into();
    assert_eq!(got, [json!("end_turn"), json!("max_tokens"), json!("tool_use"), json!("tool_use"), json!("refusal")]);
    let refusal = json!({"choices": [{"finish_reason": "stop", "message": {"content": null, "refusal": "no"}}]});
    let msg = chat_to_messages_answer(&refusal, "m");
    assert_eq!((msg["stop_reason"].as_str(), &msg["content"][0]["text"]), (Some("refusal"), &json!("no")));
}

#[test]
fn openai_errors_become_anthropic_envelopes() {
    let body = json!({"error": {"message": "why", "type": "x", "param": null, "code": null}});
    let cases = [
        (400, 400, "invalid_request_error"),
        (422, 422, "invalid_request_error"),
        (401, 401, "authentication_error"),
        (403, 403, "permission_error"),
        (404, 404, "not_found_error"),
        (429, 429, "rate_limit_error"),
        (500, 500, "api_error"),
        (503, 503, "overloaded_error"),
    ];
    for (status, want_status, kind) in cases {
        let (s, text) = openai_error_to_anthropic(status, &body);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            (s, v["error"]["type"].as_str(), v["error"]["message"].as_str()),
            (want_status, Some(kind), Some("why"))
        );
    }
    let (_, text) = openai_error_to_anthropic(502, &Value::Null);
    assert!(text.contains("backend error (HTTP 502)"), "{text}");
}

#[test]
fn an_anthropic_conversation_survives_the_backend_round_trip() {
    // Anthropic request -> chat request -> (the backend answers with the last
    // assistant message it was sent) -> Anthropic answer: same blocks.
    let assistant = json!([{"type": "text", "text": "a \"b\"\n"},
        {"type": "tool_use", "id": "toolu_9", "name": "f", "input": {"q": "日本", "n": [1, null]}}]);
    let req = json!({"model": "claude-x", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": assistant}]});
    let chat_req = messages_to_chat_request(&req, "m").unwrap();
    let last = chat_req["messages"].as_array().unwrap().last().unwrap().clone();
    let chat = json!({"id": "chatcmpl-1", "choices": [{"index": 0, "message": last, "finish_reason": "tool_calls"}]});
    let answer = chat_to_messages_answer(&chat, "claude-x");
    assert_eq!(answer["content"], assistant);
    assert_eq!(answer["stop_reason"], "tool_use");
}
