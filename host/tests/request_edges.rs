//! The edges of a client request, through the real binary against the mock
//! upstream: which client headers reach an account (an allow-list), how large a
//! head may be (431), and what a POST body must be (415) — each refusal in
//! Anthropic's error shape, with a request id, and counted.

mod support;

use poolgate_mock_upstream::MockUpstream;
use serde_json::Value;
use support::{Gateway, config, message};

fn env() -> Vec<(&'static str, &'static str)> {
    vec![("KEY_A", "key-a"), ("PG_ADMIN", "admin")]
}

async fn metrics(gw: &Gateway) -> String {
    Gateway::client().get(format!("{}/metrics", gw.url)).send().await.unwrap().text().await.unwrap()
}

/// Asserts `r` is a refusal with `status` in Anthropic's shape and a request id.
async fn refused(r: reqwest::Response, status: u16) -> String {
    assert_eq!(r.status().as_u16(), status);
    assert!(r.headers().get("x-poolgate-request-id").is_some(), "{status} carries the request id");
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("application/json"));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    body["error"]["message"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_allowed_client_headers_reach_the_account() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let extra = "[gateway]\nforward_headers = [\"x-team-*\", \"x-trace\"]\n";
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], extra), &env());
    let sent = [
        ("anthropic-version", "2023-06-01"),
        ("anthropic-beta", "interleaved-thinking-2025-05-14"),
        ("anthropic-dangerous-direct-browser-access", "true"),
        ("x-stainless-os", "Linux"),
        ("x-app", "cli"),
        ("user-agent", "claude-cli/2.0.0 (external, cli)"),
        ("x-claude-code-session-id", "sess-1"),
        ("x-team-id", "7"),
        ("x-trace", "t-1"),
        ("cookie", "session=secret-cookie"),
        ("x-forwarded-for", "10.1.2.3"),
        ("x-forwarded-proto", "https"),
        ("forwarded", "for=10.1.2.3"),
        ("x-real-ip", "10.1.2.3"),
        ("via", "1.1 corp-proxy"),
        ("x-foo", "random"),
        ("x-poolgate-debug", "1"),
        ("authorization", "Bearer client-key"),
    ];
    let mut rq = Gateway::client().post(format!("{}/v1/messages", gw.url)).json(&message("claude-sonnet-4-5", false));
    for (k, v) in sent {
        rq = rq.header(k, v);
    }
    assert_eq!(rq.send().await.unwrap().status(), 200);
    let rec = mock.requests().pop().unwrap();
    for kept in [
        "anthropic-version",
        "anthropic-beta",
        "anthropic-dangerous-direct-browser-access",
        "x-stainless-os",
        "x-app",
        "user-agent",
        "x-claude-code-session-id",
        "x-team-id",
        "x-trace",
    ] {
        let want = sent.iter().find(|(k, _)| *k == kept).unwrap().1;
        assert_eq!(rec.header(kept), Some(want), "{kept} is forwarded: {:?}", rec.headers);
    }
    for gone in ["cookie", "x-forwarded-for", "x-forwarded-proto", "forwarded", "x-real-ip", "via", "x-foo"] {
        assert_eq!(rec.header(gone), None, "{gone} is stripped: {:?}", rec.headers);
    }
    assert_eq!(rec.header("x-poolgate-debug"), None);
    assert_eq!(rec.header("x-api-key"), Some("key-a"), "the account's credential, not the client's");
    assert_eq!(rec.header("authorization"), None);

    // An addition as wide as `x-*` forwards x-foo, but what is never
    // forwarded still stays.
    let extra = "[gateway]\nforward_headers = [\"x-*\"]\n";
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], extra), &env());
    let mut rq = Gateway::client().post(format!("{}/v1/messages", gw.url)).json(&message("claude-sonnet-4-5", false));
    for (k, v) in sent {
        rq = rq.header(k, v);
    }
    assert_eq!(rq.send().await.unwrap().status(), 200);
    let rec = mock.requests().pop().unwrap();
    assert_eq!(rec.header("x-foo"), Some("random"));
    for gone in ["x-forwarded-for", "x-forwarded-proto", "x-real-ip", "x-poolgate-debug", "cookie"] {
        assert_eq!(rec.header(gone), None, "{gone} is never forwarded: {:?}", rec.headers);
    }
    assert_eq!(rec.header("x-api-key"), Some("key-a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_over_the_limit_is_a_431_in_anthropics_shape() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], ""), &env());
    let send = |bytes: usize| {
        Gateway::client()
            .post(format!("{}/v1/messages", gw.url))
            .header("x-big", "v".repeat(bytes))
            .json(&message("m", false))
            .send()
    };
    // 32 KiB by default: 40 KB is over it, and so is 512 KB — both get
    // poolgate's own answer, not the HTTP server's empty one.
    for size in [40_000, 512 << 10] {
        let message = refused(send(size).await.unwrap(), 431).await;
        assert!(message.contains("32768 bytes: server.max_header_bytes"), "{message}");
    }
    assert_eq!(send(20_000).await.unwrap().status(), 200, "under the limit");
    assert!(metrics(&gw).await.contains("poolgate_refused_total{reason=\"headers_too_large\"} 2"));
    assert_eq!(mock.requests().len(), 1);

    // The limit is the configured one.
    let cfg =
        config(&mock.base_url(), &[("a", "KEY_A")], "").replace("[server]\n", "[server]\nmax_header_bytes = 65536\n");
    let gw = Gateway::start(&cfg, &env());
    let r = Gateway::client()
        .post(format!("{}/v1/messages", gw.url))
        .header("x-big", "v".repeat(40_000))
        .json(&message("m", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = Gateway::client()
        .post(format!("{}/v1/messages", gw.url))
        .header("x-big", "v".repeat(70_000))
        .json(&message("m", false))
        .send()
        .await
        .unwrap();
    refused(r, 431).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_body_must_be_declared_json() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], ""), &env());
    let body = message("m", false).to_string();
    let post = |content_type: Option<&str>| {
        let rq = Gateway::client().post(format!("{}/v1/messages", gw.url)).body(body.clone());
        match content_type {
            Some(t) => rq.header("content-type", t),
            None => rq,
        }
        .send()
    };
    let message = refused(post(Some("text/plain")).await.unwrap(), 415).await;
    assert!(message.contains("application/json") && message.contains("text/plain"), "{message}");
    refused(post(Some("application/x-www-form-urlencoded")).await.unwrap(), 415).await;
    refused(post(None).await.unwrap(), 415).await;
    assert!(mock.requests().is_empty(), "none reached an account");
    for accepted in ["application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8"] {
        assert_eq!(post(Some(accepted)).await.unwrap().status(), 200, "{accepted}");
    }
    // A GET has no body to judge.
    assert_eq!(Gateway::client().get(format!("{}/v1/models", gw.url)).send().await.unwrap().status(), 200);
    assert!(metrics(&gw).await.contains("poolgate_refused_total{reason=\"unsupported_media_type\"} 3"));
}

/// A body that is not one valid UTF-8 JSON object — empty, not UTF-8, not an
/// object — is refused with a 400 in the API's own shape and never reaches
/// an account (docs/errors.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_is_not_a_json_object_is_refused_and_never_forwarded() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], ""), &env());
    let post = |path: &'static str, body: Vec<u8>| {
        Gateway::client()
            .post(format!("{}{path}", gw.url))
            .header("content-type", "application/json")
            .header("anthropic-version", "2023-06-01")
            .body(body)
            .send()
    };
    let not_utf8 =
        b"{\"model\":\"claude-sonnet-4-5\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}";
    for (path, body, says) in [
        ("/v1/messages", Vec::new(), "body is empty"),
        ("/v1/messages", b"  \n".to_vec(), "body is empty"),
        ("/v1/messages", not_utf8.to_vec(), "body is not valid UTF-8"),
        ("/v1/messages", b"[1]".to_vec(), "body: Input should be a valid dictionary"),
        ("/v1/messages/count_tokens", Vec::new(), "body is empty"),
    ] {
        let message = refused(post(path, body).await.unwrap(), 400).await;
        assert!(message.starts_with(says), "{path}: {message}");
    }
    // The OpenAI route refuses in OpenAI's shape.
    let r = post("/v1/chat/completions", Vec::new()).await.unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert!(mock.requests().is_empty(), "nothing was forwarded");
    assert!(metrics(&gw).await.contains("poolgate_refused_total{reason=\"invalid_body\"} 5"), "{}", metrics(&gw).await);
}
