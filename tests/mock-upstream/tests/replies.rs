//! Normal replies: the JSON and SSE shapes the Anthropic SDKs expect, tool use, and the
//! side endpoints (count_tokens, models, probes).

mod common;

use std::time::{Duration, Instant};

use common::{client, header, message_body, parse_sse, post_messages, tool_body};
use futures_util::StreamExt;
use poolgate_mock_upstream::{DEFAULT_TEXT, MockUpstream, Step};
use serde_json::{Value, json};

#[tokio::test]
async fn json_reply_has_the_message_shape_and_echoes_the_model() {
    let up = MockUpstream::start().await;
    up.account("k1");
    let r = post_messages(&up, "k1", &message_body(false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-type"), Some("application/json"));
    assert!(header(&r, "request-id").unwrap().starts_with("req_"));
    let m: Value = r.json().await.unwrap();
    assert!(m["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(m["type"], "message");
    assert_eq!(m["role"], "assistant");
    assert_eq!(m["model"], "claude-sonnet-4-5-20250929");
    assert_eq!(m["content"], json!([{"type": "text", "text": DEFAULT_TEXT}]));
    assert_eq!(m["stop_reason"], "end_turn");
    assert_eq!(m["stop_sequence"], Value::Null);
    for field in ["input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"] {
        assert!(m["usage"][field].is_u64(), "usage.{field}");
    }
    assert!(m["usage"]["input_tokens"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn text_step_replaces_the_reply_text_in_json_and_sse() {
    let up = MockUpstream::start().await;
    let a = up.account("k1");
    a.push(Step::Text("scripted words here".into()));
    a.push(Step::Text("streamed scripted words".into()));
    let m: Value = post_messages(&up, "k1", &message_body(false)).await.json().await.unwrap();
    assert_eq!(m["content"][0]["text"], "scripted words here");
    let body = post_messages(&up, "k1", &message_body(true)).await.text().await.unwrap();
    let text: String = parse_sse(&body)
        .iter()
        .filter(|e| e.data["delta"]["type"] == "text_delta")
        .map(|e| e.data["delta"]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(text, "streamed scripted words");
}

#[tokio::test]
async fn sse_events_follow_anthropic_order_each_data_after_an_event_line() {
    let up = MockUpstream::start().await;
    up.account("k1");
    let r = post_messages(&up, "k1", &message_body(true)).await;
    assert_eq!(r.status(), 200);
    assert!(header(&r, "content-type").unwrap().starts_with("text/event-stream"));
    assert!(header(&r, "request-id").is_some());
    let events = parse_sse(&r.text().await.unwrap());
    let names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(&names[..3], ["message_start", "content_block_start", "ping"]);
    let deltas = names.iter().filter(|n| **n == "content_block_delta").count();
    assert!(deltas >= 2, "several text deltas, got {names:?}");
    assert_eq!(&names[3 + deltas..], ["content_block_stop", "message_delta", "message_stop"]);

    let start = &events[0].data["message"];
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["model"], "claude-sonnet-4-5-20250929");
    assert_eq!(start["stop_reason"], Value::Null);
    assert!(start["usage"]["input_tokens"].as_u64().unwrap() > 0);
    let text: String =
        events[3..3 + deltas].iter().map(|e| e.data["delta"]["text"].as_str().unwrap().to_owned()).collect();
    assert_eq!(text, DEFAULT_TEXT);
    let delta = &events[events.len() - 2].data;
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert!(delta["usage"]["output_tokens"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn sse_events_arrive_as_separate_http_chunks() {
    let up = MockUpstream::start().await;
    up.account("k1");
    let r = post_messages(&up, "k1", &message_body(true)).await;
    let mut chunks = 0;
    let mut body = Vec::new();
    let mut stream = r.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        assert!(chunk.ends_with(b"\n\n"), "a chunk ends on an event boundary: {chunk:?}");
        body.extend_from_slice(&chunk);
        chunks += 1;
    }
    let events = parse_sse(std::str::from_utf8(&body).unwrap()).len();
    assert_eq!(chunks, events, "one chunked-encoding chunk per event");
}

#[tokio::test]
async fn tool_request_gets_a_tool_use_reply_in_json() {
    let up = MockUpstream::start().await;
    up.account("k1");
    let m: Value = post_messages(&up, "k1", &tool_body(false)).await.json().await.unwrap();
    assert_eq!(m["stop_reason"], "tool_use");
    let content = m["content"].as_array().unwrap();
    assert_eq!(content.len(), 2);
    assert_eq!(content[0]["type"], "text");
    assert_eq!(content[1]["type"], "tool_use");
    assert!(content[1]["id"].as_str().unwrap().starts_with("toolu_"));
    assert_eq!(content[1]["name"], "get_weather");
    assert_eq!(content[1]["input"], json!({"city": "mock", "days": 1}));
}

#[tokio::test]
async fn tool_stream_input_json_deltas_concatenate_to_the_input() {
    let up = MockUpstream::start().await;
    up.account("k1");
    let body = post_messages(&up, "k1", &tool_body(true)).await.text().await.unwrap();
    let events = parse_sse(&body);
    let tool_start = events
        .iter()
        .position(|e| e.name == "content_block_start" && e.data["content_block"]["type"] == "tool_use")
        .expect("a tool_use block starts");
    let block = &events[tool_start].data;
    assert_eq!(block["index"], 1);
    assert_eq!(block["content_block"]["name"], "get_weather");
    assert_eq!(block["content_block"]["input"], json!({}));
    assert!(events[..tool_start].iter().any(|e| e.name == "content_block_stop"), "text block closes first");
    let pieces: Vec<&str> = events[tool_start + 1..]
        .iter()
        .take_while(|e| e.name == "content_block_delta")
        .map(|e| {
            assert_eq!(e.data["delta"]["type"], "input_json_delta");
            e.data["delta"]["partial_json"].as_str().unwrap()
        })
        .collect();
    assert!(pieces.len() >= 3, "several pieces: {pieces:?}");
    let input: Value = serde_json::from_str(&pieces.concat()).expect("pieces concatenate to JSON");
    assert_eq!(input, json!({"city": "mock", "days": 1}));
    let names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(&names[names.len() - 3..], ["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(events[events.len() - 2].data["delta"]["stop_reason"], "tool_use");
}

#[tokio::test]
async fn query_string_is_accepted_and_recorded() {
    let up = MockUpstream::start().await;
    up.account("k1");
    let r = client()
        .post(format!("{}/v1/messages?beta=true", up.base_url()))
        .header("authorization", "Bearer k1")
        .json(&message_body(true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(up.requests()[0].path, "/v1/messages?beta=true");
}

#[tokio::test]
async fn malformed_messages_request_is_an_invalid_request_error() {
    let up = MockUpstream::start().await;
    up.account("k1");
    let r = post_messages(&up, "k1", &json!({"model": "m", "messages": []})).await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["type"], "error");
    assert_eq!(e["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn count_tokens_grows_with_the_request() {
    let up = MockUpstream::start().await;
    up.account("k1");
    let count = |body: Value| {
        let url = format!("{}/v1/messages/count_tokens", up.base_url());
        async move {
            let r = client().post(url).header("x-api-key", "k1").json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200);
            let v: Value = r.json().await.unwrap();
            assert_eq!(v.as_object().unwrap().len(), 1, "only input_tokens: {v}");
            v["input_tokens"].as_u64().unwrap()
        }
    };
    let small = count(message_body(false)).await;
    let mut big = message_body(false);
    big["messages"][0]["content"] = Value::from("word ".repeat(400));
    let big = count(big).await;
    assert!(small > 0 && big > small + 400, "small {small}, big {big}");
}

#[tokio::test]
async fn models_list_has_anthropic_page_shape() {
    let up = MockUpstream::start().await;
    up.account("k1");
    let r = client().get(format!("{}/v1/models", up.base_url())).header("x-api-key", "k1").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let page: Value = r.json().await.unwrap();
    let data = page["data"].as_array().unwrap();
    assert!(!data.is_empty());
    for model in data {
        assert_eq!(model["type"], "model");
        for field in ["id", "display_name", "created_at"] {
            assert!(model[field].is_string(), "{field} in {model}");
        }
    }
    assert_eq!(page["has_more"], false);
    assert_eq!(page["first_id"], data[0]["id"]);
    assert_eq!(page["last_id"], data[data.len() - 1]["id"]);
}

#[tokio::test]
async fn head_probes_answer_200_without_a_credential() {
    let up = MockUpstream::start().await;
    for path in ["/", "/api/hello"] {
        let r = client().head(format!("{}{path}", up.base_url())).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert!(header(&r, "request-id").is_some());
    }
    assert_eq!(up.served_by(), ["", ""]);
}

#[tokio::test]
async fn slow_stream_spaces_events_and_sends_the_first_at_once() {
    let up = MockUpstream::start().await;
    let a = up.account("k1");
    a.push(Step::SlowStream { chunk_delay_ms: 25 });
    let started = Instant::now();
    let r = post_messages(&up, "k1", &message_body(true)).await;
    let mut stream = r.bytes_stream();
    let mut arrivals = Vec::new();
    let mut body = Vec::new();
    while let Some(chunk) = stream.next().await {
        arrivals.push(started.elapsed());
        body.extend_from_slice(&chunk.unwrap());
    }
    let events = parse_sse(std::str::from_utf8(&body).unwrap()).len();
    let total = *arrivals.last().unwrap();
    assert!(total >= Duration::from_millis(25 * (events as u64 - 1)), "{events} events in {total:?}");
    assert!(arrivals[0] < total / 2, "first event at {:?} of {total:?}", arrivals[0]);
}
