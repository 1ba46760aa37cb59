//! `POST /v1/chat/completions` through the real binary and the mock upstream:
//! an OpenAI-shaped request is served by the pool as a Messages request, and
//! the answer — JSON, stream, error — comes back in OpenAI's shape.

use crate::support;

use poolgate_mock_upstream::{MockUpstream, Step};
use serde_json::{Value, json};
use support::{Gateway, config};

async fn chat(gw: &Gateway, body: &Value) -> reqwest::Response {
    Gateway::client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .bearer_auth("unused")
        .json(body)
        .send()
        .await
        .unwrap()
}

fn gateway(mock: &MockUpstream) -> Gateway {
    mock.account("key-a");
    mock.account("key-b");
    let cfg = config(&mock.base_url(), &[("a", "KEY_A"), ("b", "KEY_B")], "");
    Gateway::start(&cfg, &[("KEY_A", "key-a"), ("KEY_B", "key-b"), ("PG_ADMIN", "chat-admin")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chat_completion_is_served_by_the_pool_in_openais_shape() {
    let mock = MockUpstream::start().await;
    mock.account("key-a").push(Step::Text("hello from the pool".into()));
    let gw = gateway(&mock);
    let r = chat(
        &gw,
        &json!({ "model": "claude-sonnet-4-5", "max_tokens": 64, "user": "session-7",
                 "messages": [{ "role": "system", "content": "be brief" }, { "role": "user", "content": "hi" }] }),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-poolgate-account"], "a");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion", "{v}");
    assert_eq!(v["model"], "claude-sonnet-4-5");
    assert_eq!(v["choices"][0]["message"]["content"], "hello from the pool");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["usage"]["total_tokens"].as_u64() > Some(0), "{v}");
    // Upstream it was a Messages request, with the system prompt lifted.
    let sent = mock.requests().pop().unwrap();
    assert_eq!(sent.path, "/v1/messages");
    let body = sent.json();
    assert_eq!(body["system"], "be brief", "{body}");
    assert_eq!(body["messages"][0]["role"], "user");
    assert!(sent.header("anthropic-version").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_chat_completion_arrives_as_chunks_and_done() {
    let mock = MockUpstream::start().await;
    mock.account("key-a").push(Step::Text("one two three".into()));
    let gw = gateway(&mock);
    let r = chat(
        &gw,
        &json!({ "model": "claude-sonnet-4-5", "stream": true, "stream_options": { "include_usage": true },
                 "messages": [{ "role": "user", "content": "count" }] }),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let text = r.text().await.unwrap();
    let chunks: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant", "{text}");
    let content: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect::<Vec<_>>().concat();
    assert_eq!(content, "one two three");
    assert!(chunks.iter().any(|c| c["choices"][0]["finish_reason"] == "stop"), "{text}");
    assert!(chunks.iter().any(|c| c["usage"]["completion_tokens"].as_u64() > Some(0)), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completions_fail_over_and_refuse_in_openais_shape() {
    let mock = MockUpstream::start().await;
    mock.account("key-a").push(Step::Overloaded);
    mock.account("key-b").push(Step::Text("from b".into()));
    let gw = gateway(&mock);
    let r =
        chat(&gw, &json!({ "model": "claude-sonnet-4-5", "messages": [{ "role": "user", "content": "hi" }] })).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-poolgate-account"], "b", "failed over like a Messages request");
    // Unsupported parameters: a 400 in OpenAI's shape, nothing sent upstream.
    let before = mock.requests().len();
    let r =
        chat(&gw, &json!({ "model": "claude-sonnet-4-5", "n": 2, "messages": [{ "role": "user", "content": "hi" }] }))
            .await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains('n'), "{v}");
    assert_eq!(mock.requests().len(), before);
    // An error of the gateway's own (every account refuses its key) is OpenAI-shaped too.
    mock.account("key-a").set_default(Step::Status {
        status: 401,
        body: json!({"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}),
        headers: vec![],
    });
    mock.account("key-b").set_default(Step::Status {
        status: 401,
        body: json!({"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}),
        headers: vec![],
    });
    let r =
        chat(&gw, &json!({ "model": "claude-sonnet-4-5", "messages": [{ "role": "user", "content": "hi" }] })).await;
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].is_string() && v.get("type").is_none(), "OpenAI's envelope: {v}");
    assert!(status >= 500, "never the client's key: {status} {v}");
}

/// The official OpenAI Python SDK, unchanged, against the gateway: a plain
/// call, a stream with usage, tool calls, a tool result, a streamed tool call
/// and a refusal of an unsupported parameter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_python_sdk_works_through_the_gateway() {
    use std::process::Command;
    let probe = Command::new("python3").args(["-c", "import openai"]).output().unwrap();
    assert!(
        probe.status.success(),
        "the OpenAI Python SDK is missing: `python3 -m pip install openai==2.14.0` (./test.sh installs it)"
    );
    let mock = MockUpstream::start().await;
    let gw = gateway(&mock);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/e2e/openai_client.py");
    let url = gw.url.clone();
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        tokio::task::spawn_blocking(move || Command::new("python3").arg(script).arg(url).output()),
    )
    .await
    .expect("the SDK client finished within 120 s")
    .unwrap()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "SDK client failed:\n{stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        gw.log()
    );
    for check in ["create", "stream", "tools", "tool_result", "tool_stream", "refusal"] {
        assert!(stdout.contains(&format!("\"check\": \"{check}\"")), "missing {check}:\n{stdout}");
    }
}

/// `[models] aliases` maps the names OpenAI clients send; a name that is
/// neither `claude-*` nor an alias is refused by name. An OpenAI client's
/// `GET /v1/models` (no `anthropic-version`) is answered in OpenAI's shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliases_map_model_names_and_openai_clients_get_openais_model_list() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let cfg =
        config(&mock.base_url(), &[("a", "KEY_A")], "[models]\naliases = { \"gpt-4o\" = \"claude-sonnet-4-5\" }\n");
    let gw = Gateway::start(&cfg, &[("KEY_A", "key-a"), ("PG_ADMIN", "chat-admin")]);
    let r = chat(&gw, &json!({ "model": "gpt-4o", "messages": [{ "role": "user", "content": "hi" }] })).await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["model"], "gpt-4o", "the answer names the model the client asked for");
    assert_eq!(mock.requests().pop().unwrap().json()["model"], "claude-sonnet-4-5");
    let r = chat(&gw, &json!({ "model": "gpt-5-unknown", "messages": [{ "role": "user", "content": "hi" }] })).await;
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("gpt-5-unknown"));
    let page: Value =
        Gateway::client().get(format!("{}/v1/models", gw.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(page["object"], "list", "{page}");
    assert_eq!(page["data"][0]["object"], "model", "{page}");
    let anthropic: Value = Gateway::client()
        .get(format!("{}/v1/models", gw.url))
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(anthropic.get("has_more").is_some(), "Anthropic clients keep Anthropic's page: {anthropic}");
}

/// The decision record and the metrics keep the status the chat client got,
/// not the account's: the answer is translated before the request finishes.
/// An account's error whose OpenAI status differs (Anthropic's
/// `overloaded_error` is a 503 to OpenAI clients), an answer that breaks
/// before it is whole (a 502, not a 200 with an empty completion), and the
/// pool's own answer when every account is overloaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_and_the_metrics_keep_the_status_the_chat_client_got() {
    let mock = MockUpstream::start().await;
    let gw = gateway(&mock);
    let ask = json!({ "model": "claude-sonnet-4-5", "messages": [{ "role": "user", "content": "hi" }] });
    let overloaded = json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}});
    let last = async || gw.admin_json("/admin/decisions?limit=1", "chat-admin").await[0].clone();
    let mut seen = Vec::new();

    // A 4xx does not fail over: the account's own answer, translated.
    mock.account("key-a").push(Step::Status { status: 400, body: overloaded.clone(), headers: vec![] });
    let r = chat(&gw, &ask).await;
    assert_eq!(r.status(), 503, "overloaded_error is OpenAI's 503");
    assert_eq!(r.headers()["x-poolgate-account"], "a", "the account's answer");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "overloaded", "{v}");
    let record = last().await;
    assert_eq!(record["status"], 503, "{record}");
    assert_eq!(record["attempts"][0]["status"], 400, "the attempt keeps what the account said: {record}");
    seen.push(("a".to_owned(), 503));

    // Headers and half the body, then a reset: the answer is read whole to be
    // translated, so nothing reached the client yet — the next account serves.
    mock.account("key-a").push(Step::ResetMidStream { after_events: 0 });
    let r = chat(&gw, &ask).await;
    assert_eq!((r.status().as_u16(), r.headers()["x-poolgate-account"].to_str().unwrap()), (200, "b"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion", "{v}");
    let record = last().await;
    let first = &record["attempts"][0];
    assert_eq!((first["account"].as_str(), first["outcome"].as_str()), (Some("a"), Some("failover")), "{record}");
    assert!(first["failure"].as_str().unwrap_or("").contains("broke"), "{record}");
    seen.push(("b".to_owned(), 200));

    // Every account cuts its answer: nothing whole to translate, a 502.
    mock.account("key-a").push(Step::ResetMidStream { after_events: 0 });
    mock.account("key-b").push(Step::ResetMidStream { after_events: 0 });
    let r = chat(&gw, &ask).await;
    assert_eq!(r.status(), 502);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "server_error", "{v}");
    let record = last().await;
    assert_eq!(record["status"].as_u64(), Some(502), "{record}");
    seen.push((record["account"].as_str().unwrap_or("-").to_owned(), 502));

    // Every account overloaded: the pool's own answer.
    mock.account("key-a").set_default(Step::Overloaded);
    mock.account("key-b").set_default(Step::Overloaded);
    let r = chat(&gw, &ask).await;
    let status = r.status().as_u16();
    assert!(status >= 500, "{status}");
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].is_string() && v.get("type").is_none(), "OpenAI's envelope: {v}");
    let record = last().await;
    assert_eq!(record["status"], status, "{record}");
    seen.push((record["account"].as_str().unwrap_or("-").to_owned(), status));

    let metrics = Gateway::client().get(format!("{}/metrics", gw.url)).send().await.unwrap().text().await.unwrap();
    for (account, status) in seen {
        let line = format!("poolgate_requests_total{{account=\"{account}\",status=\"{status}\"}}");
        assert!(metrics.contains(&line), "{line} in:\n{metrics}");
    }
}
