//! Failures on cue: rate limits with and without quota headers, overload, server errors,
//! authentication, connection resets, hangs and delays.

mod common;

use std::time::{Duration, Instant};

use common::{client, header, message_body, post_messages};
use futures_util::StreamExt;
use poolgate_mock_upstream::{MockUpstream, Quota, Step, Window};
use serde_json::{Value, json};

async fn error_of(r: reqwest::Response) -> Value {
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["type"], "error", "Anthropic error envelope: {e}");
    assert!(e["error"]["message"].is_string(), "{e}");
    e["error"].clone()
}

fn ratelimit_headers(r: &reqwest::Response) -> Vec<String> {
    r.headers().keys().map(|k| k.as_str().to_owned()).filter(|k| k.starts_with("anthropic-ratelimit")).collect()
}

#[tokio::test]
async fn bare_429_has_no_ratelimit_headers_and_message_error() {
    let up = MockUpstream::start().await;
    let a = up.account("k1");
    a.set_quota(Quota::unified(0.5, 0.4));
    a.push(Step::RateLimited { unified: false, retry_after: None });
    let r = post_messages(&up, "k1", &message_body(false)).await;
    assert_eq!(r.status(), 429);
    assert_eq!(ratelimit_headers(&r), Vec::<String>::new());
    assert!(header(&r, "retry-after").is_none());
    assert!(header(&r, "request-id").is_some());
    let e = error_of(r).await;
    assert_eq!(e, json!({"type": "rate_limit_error", "message": "Error"}));
}

#[tokio::test]
async fn unified_429_carries_the_quota_as_rejected_and_retry_after() {
    let up = MockUpstream::start().await;
    let a = up.account("k1");
    let quota = Quota { five_hour: Some(Window::new(1.02, "rejected", 1_900_000_000)), ..Quota::unified(0.0, 0.3) };
    a.set_quota(quota);
    a.push(Step::RateLimited { unified: true, retry_after: Some("17".into()) });
    let r = post_messages(&up, "k1", &message_body(true)).await;
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "anthropic-ratelimit-unified-status"), Some("rejected"));
    assert_eq!(header(&r, "anthropic-ratelimit-unified-5h-utilization"), Some("1.02"));
    assert_eq!(header(&r, "anthropic-ratelimit-unified-7d-utilization"), Some("0.3"));
    assert!(header(&r, "anthropic-ratelimit-unified-reset").unwrap().parse::<u64>().is_ok());
    assert_eq!(header(&r, "retry-after"), Some("17"));
    assert_eq!(error_of(r).await["type"], "rate_limit_error");
}

#[tokio::test]
async fn unified_429_without_a_scripted_quota_still_names_status_reset_and_claim() {
    let up = MockUpstream::start().await;
    up.account("k1").push(Step::RateLimited { unified: true, retry_after: None });
    let r = post_messages(&up, "k1", &message_body(false)).await;
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "anthropic-ratelimit-unified-status"), Some("rejected"));
    assert!(header(&r, "anthropic-ratelimit-unified-reset").is_some());
    assert!(header(&r, "anthropic-ratelimit-unified-representative-claim").is_some());
    assert!(header(&r, "retry-after").is_none());
}

#[tokio::test]
async fn overloaded_is_529_overloaded_error() {
    let up = MockUpstream::start().await;
    up.account("k1").push(Step::Overloaded);
    let r = post_messages(&up, "k1", &message_body(true)).await;
    assert_eq!(r.status(), 529);
    assert_eq!(header(&r, "content-type"), Some("application/json"));
    assert_eq!(error_of(r).await["type"], "overloaded_error");
}

#[tokio::test]
async fn server_error_uses_the_scripted_status_and_api_error() {
    let up = MockUpstream::start().await;
    up.account("k1").push(Step::ServerError(503));
    let r = post_messages(&up, "k1", &message_body(false)).await;
    assert_eq!(r.status(), 503);
    assert_eq!(error_of(r).await["type"], "api_error");
}

#[tokio::test]
async fn status_step_sends_any_status_body_and_headers() {
    let up = MockUpstream::start().await;
    let a = up.account("k1");
    let body = json!({"type": "error", "error": {"type": "permission_error", "message": "nope"}});
    a.push(Step::Status { status: 403, body: body.clone(), headers: vec![("X-Should-Retry".into(), "false".into())] });
    a.push(Step::Status { status: 502, body: Value::from("<html>bad gateway</html>"), headers: vec![] });
    let r = post_messages(&up, "k1", &message_body(false)).await;
    assert_eq!(r.status(), 403);
    assert_eq!(header(&r, "x-should-retry"), Some("false"));
    assert!(header(&r, "anthropic-organization-id").is_some());
    assert_eq!(r.json::<Value>().await.unwrap(), body);
    let r = post_messages(&up, "k1", &message_body(false)).await;
    assert_eq!(r.status(), 502);
    assert_eq!(r.text().await.unwrap(), "<html>bad gateway</html>");
}

#[tokio::test]
async fn unknown_or_missing_credential_is_401_authentication_error() {
    let up = MockUpstream::start().await;
    up.account("known");
    let r = post_messages(&up, "unknown", &message_body(false)).await;
    assert_eq!(r.status(), 401);
    assert!(header(&r, "request-id").unwrap().starts_with("req_"));
    assert!(header(&r, "anthropic-organization-id").is_none());
    let e = error_of(r).await;
    assert_eq!(e, json!({"type": "authentication_error", "message": "invalid x-api-key"}));

    let r = client().post(format!("{}/v1/messages", up.base_url())).json(&message_body(false)).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let r = client()
        .get(format!("{}/v1/models", up.base_url()))
        .header("authorization", "Bearer wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(up.served_by(), ["", "", ""]);
}

#[tokio::test]
async fn reset_before_response_is_a_client_error_without_status() {
    let up = MockUpstream::start().await;
    up.account("k1").push(Step::ResetBeforeResponse);
    let err = client()
        .post(format!("{}/v1/messages", up.base_url()))
        .header("x-api-key", "k1")
        .json(&message_body(false))
        .send()
        .await
        .expect_err("the connection is dropped without a response");
    assert!(err.status().is_none(), "{err:?}");
    assert_eq!(up.served_by(), ["k1"], "recorded before the reset");
    // The next request is served normally on a new connection.
    assert_eq!(post_messages(&up, "k1", &message_body(false)).await.status(), 200);
}

#[tokio::test]
async fn reset_mid_stream_delivers_the_first_events_then_fails() {
    let up = MockUpstream::start().await;
    up.account("k1").push(Step::ResetMidStream { after_events: 3 });
    let r = post_messages(&up, "k1", &message_body(true)).await;
    assert_eq!(r.status(), 200);
    let mut stream = r.bytes_stream();
    let mut body = Vec::new();
    let mut failed = false;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(chunk) => body.extend_from_slice(&chunk),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "the stream ends in an error, not a clean end");
    let text = String::from_utf8(body).unwrap();
    let events = common::parse_sse(&text);
    let names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["message_start", "content_block_start", "ping"]);
}

#[tokio::test]
async fn reset_mid_json_sends_a_truncated_body() {
    let up = MockUpstream::start().await;
    up.account("k1").push(Step::ResetMidStream { after_events: 2 });
    let r = post_messages(&up, "k1", &message_body(false)).await;
    assert_eq!(r.status(), 200);
    let full: usize = header(&r, "content-length").unwrap().parse().unwrap();
    let mut stream = r.bytes_stream();
    let mut got = 0;
    let mut failed = false;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(chunk) => got += chunk.len(),
            Err(_) => failed = true,
        }
    }
    assert!(failed && got < full, "got {got} of {full} bytes, failed: {failed}");
}

#[tokio::test]
async fn hang_never_answers_until_the_client_gives_up() {
    let up = MockUpstream::start().await;
    up.account("k1").push(Step::Hang);
    let started = Instant::now();
    let err = client()
        .post(format!("{}/v1/messages", up.base_url()))
        .header("x-api-key", "k1")
        .json(&message_body(false))
        .timeout(Duration::from_millis(300))
        .send()
        .await
        .expect_err("no answer");
    assert!(err.is_timeout(), "{err:?}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(up.requests().len(), 1, "recorded while hanging");
}

#[tokio::test]
async fn delay_waits_then_plays_the_inner_step() {
    let up = MockUpstream::start().await;
    up.account("k1").push(Step::Delay { ms: 150, then: Box::new(Step::Overloaded) });
    let started = Instant::now();
    let r = post_messages(&up, "k1", &message_body(false)).await;
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert_eq!(r.status(), 529);
}
