//! Helpers shared by the integration tests: a client, request builders and an SSE parser.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use poolgate_mock_upstream::MockUpstream;
use serde_json::{Value, json};

/// A client that never goes through a proxy from the environment.
pub fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// A client that gives up after `timeout`, for requests the mock is told to hang.
pub fn client_with_timeout(timeout: std::time::Duration) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder().no_proxy().timeout(timeout).build().unwrap()
}

/// A minimal valid Messages request body.
pub fn message_body(stream: bool) -> Value {
    json!({
        "model": "claude-sonnet-4-5-20250929",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": stream,
    })
}

/// A Messages request body with one `get_weather` tool.
pub fn tool_body(stream: bool) -> Value {
    let mut body = message_body(stream);
    body["tools"] = json!([{
        "name": "get_weather",
        "description": "Weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]},
    }, {"name": "unused", "input_schema": {"type": "object"}}]);
    body
}

/// `POST /v1/messages` with an `x-api-key`.
pub async fn post_messages(up: &MockUpstream, key: &str, body: &Value) -> reqwest::Response {
    client()
        .post(format!("{}/v1/messages", up.base_url()))
        .header("x-api-key", key)
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .unwrap()
}

/// The value of a response header, if present.
pub fn header<'a>(r: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

/// One parsed SSE event.
#[derive(Debug)]
pub struct Event {
    pub name: String,
    pub data: Value,
}

/// Parses an SSE body, asserting every `data:` line comes right after an `event:` line.
pub fn parse_sse(text: &str) -> Vec<Event> {
    let mut events = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.is_empty()) {
        let lines: Vec<&str> = block.lines().collect();
        assert_eq!(lines.len(), 2, "an event is one `event:` and one `data:` line: {block:?}");
        let name = lines[0].strip_prefix("event: ").unwrap_or_else(|| panic!("no event line: {block:?}"));
        let data = lines[1].strip_prefix("data: ").unwrap_or_else(|| panic!("no data line: {block:?}"));
        let data: Value = serde_json::from_str(data).unwrap();
        assert_eq!(data["type"], name, "the data's type names the event");
        events.push(Event { name: name.to_owned(), data });
    }
    events
}
