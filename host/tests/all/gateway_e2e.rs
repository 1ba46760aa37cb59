//! The gateway end to end: the real `poolgate` binary in front of the mock
//! Anthropic upstream, driven over HTTP.

use crate::support;

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use poolgate_mock_upstream::{MockUpstream, Quota, Step, Window};
use serde_json::{Value, json};
use support::{Gateway, config, message};

const ADMIN: &str = "admin-token-for-tests";

fn now_s() -> u64 {
    poolgate::clock::system_time().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

fn env3() -> Vec<(&'static str, &'static str)> {
    vec![("KEY_A", "key-a"), ("KEY_B", "key-b"), ("KEY_C", "key-c"), ("PG_ADMIN", ADMIN)]
}

async fn post(gw: &Gateway, body: &Value) -> reqwest::Response {
    Gateway::client()
        .post(format!("{}/v1/messages", gw.url))
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn status(gw: &Gateway) -> Value {
    gw.admin_json("/status", ADMIN).await
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> &'a str {
    r.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

fn exhausted(window: &str) -> Quota {
    let reset = now_s() + 3600;
    let w = Window { utilization: 1.0, status: "rejected".into(), reset_s: reset };
    let ok = Window { utilization: 0.2, status: "allowed".into(), reset_s: reset };
    Quota {
        status: Some("rejected".into()),
        reset_s: Some(reset),
        five_hour: Some(if window == "5h" { w.clone() } else { ok.clone() }),
        seven_day: Some(if window == "7d" { w } else { ok }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_fails_over_across_three_accounts_before_the_first_byte() {
    let mock = MockUpstream::start().await;
    let (a, b, c) = (mock.account("key-a"), mock.account("key-b"), mock.account("key-c"));
    a.set_quota(exhausted("5h"));
    a.push(Step::RateLimited { unified: true, retry_after: None });
    b.push(Step::Overloaded);
    c.set_default(Step::Text("from c".into()));
    let cfg = config(&mock.base_url(), &[("a", "KEY_A"), ("b", "KEY_B"), ("c", "KEY_C")], "");
    let gw = Gateway::start(&cfg, &env3());

    let r = post(&gw, &message("claude-sonnet-4-5", false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-poolgate-account"), "c");
    assert_eq!(header(&r, "x-poolgate-attempts"), "3");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["content"][0]["text"], "from c");
    assert_eq!(mock.served_by(), ["key-a", "key-b", "key-c"]);

    // a (session exhausted) and b (overloaded) are cooling: the next request goes
    // straight to c.
    mock.clear_requests();
    let r = post(&gw, &message("claude-sonnet-4-5", false)).await;
    assert_eq!(header(&r, "x-poolgate-account"), "c");
    assert_eq!(mock.served_by(), ["key-c"]);

    let st = status(&gw).await;
    let acct = |id: &str| st["accounts"].as_array().unwrap().iter().find(|x| x["id"] == id).unwrap().clone();
    assert_eq!(acct("a")["cooldown"]["reason"], "session_exhausted");
    assert_eq!(acct("b")["cooldown"]["reason"], "overloaded", "{}", gw.log());
    assert!(acct("c")["cooldown"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_where_every_account_cools_is_parked_and_never_reprobed() {
    let mock = MockUpstream::start().await;
    for k in ["key-a", "key-b"] {
        let acct = mock.account(k);
        acct.set_quota(exhausted("7d"));
        acct.set_default(Step::RateLimited { unified: true, retry_after: None });
    }
    let cfg = config(&mock.base_url(), &[("a", "KEY_A"), ("b", "KEY_B")], "");
    let gw = Gateway::start(&cfg, &env3());

    let r = post(&gw, &message("claude-sonnet-4-5", false)).await;
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "x-poolgate-pool"), "parked");
    let retry: u64 = header(&r, "retry-after").parse().unwrap();
    assert!((3000..=3601).contains(&retry), "retry-after {retry} ≈ the 7d reset an hour away");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert_eq!(mock.requests().len(), 2, "each account was tried once");

    // Parked accounts are not probed again before their reset.
    for _ in 0..3 {
        let r = post(&gw, &message("claude-sonnet-4-5", true)).await;
        assert_eq!(r.status(), 429);
        assert_eq!(header(&r, "x-poolgate-pool"), "parked");
    }
    assert_eq!(mock.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_reply_arrives_in_order_with_tool_use() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], ""), &env3());
    let mut body = message("claude-sonnet-4-5", true);
    body["tools"] = json!([{ "name": "get_weather", "description": "w", "input_schema": { "type": "object" } }]);
    let r = post(&gw, &body).await;
    assert_eq!(r.status(), 200);
    assert!(header(&r, "content-type").starts_with("text/event-stream"));
    assert_eq!(header(&r, "x-poolgate-account"), "a");
    let text = r.text().await.unwrap();
    let events: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(events.first(), Some(&"message_start"));
    assert_eq!(events.last(), Some(&"message_stop"));
    let partial: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v["delta"]["type"] == "input_json_delta")
        .map(|v| v["delta"]["partial_json"].as_str().unwrap().to_string())
        .collect();
    serde_json::from_str::<Value>(&partial).expect("tool input pieces form JSON");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_mid_way_ends_with_an_error_event_and_is_not_retried() {
    let mock = MockUpstream::start().await;
    mock.account("key-a").push(Step::ResetMidStream { after_events: 3 });
    mock.account("key-b");
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A"), ("b", "KEY_B")], ""), &env3());
    let r = post(&gw, &message("claude-sonnet-4-5", true)).await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.starts_with("event: message_start"), "{text}");
    assert!(text.ends_with("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"upstream stream interrupted (poolgate)\"}}\n\n"), "{text}");
    assert_eq!(mock.served_by(), ["key-a"], "no retry after the first byte");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_reset_before_the_response_fails_over() {
    let mock = MockUpstream::start().await;
    mock.account("key-a").push(Step::ResetBeforeResponse);
    mock.account("key-b");
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A"), ("b", "KEY_B")], ""), &env3());
    let r = post(&gw, &message("claude-sonnet-4-5", true)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-poolgate-account"), "b");
    assert!(r.text().await.unwrap().contains("message_stop"));
    assert_eq!(mock.served_by(), ["key-a", "key-b"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrecoverable_client_error_is_passed_through_without_failover() {
    let mock = MockUpstream::start().await;
    mock.account("key-a").push(Step::Status {
        status: 400,
        body: json!({ "type": "error", "error": { "type": "invalid_request_error", "message": "max_tokens: required" } }),
        headers: vec![],
    });
    mock.account("key-b");
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A"), ("b", "KEY_B")], ""), &env3());
    let r = post(&gw, &message("claude-sonnet-4-5", false)).await;
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["message"], "max_tokens: required");
    assert_eq!(mock.served_by(), ["key-a"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_queue_for_a_full_account_and_time_out_with_queue_timeout() {
    let mock = MockUpstream::start().await;
    let a = mock.account("key-a");
    a.set_default(Step::Delay { ms: 400, then: Box::new(Step::Ok) });
    let extra = "[gateway]\nqueue_timeout_ms = 1500\n";
    let cfg = config(&mock.base_url(), &[("a", "KEY_A")], extra).replace("base_url", "max_in_flight = 1\nbase_url");
    let gw = Gateway::start(&cfg, &env3());
    // Two at once on a one-slot account: the second waits for the first.
    let started = poolgate::clock::machine_instant();
    let m = message("m", false);
    let (r1, r2) = tokio::join!(post(&gw, &m), post(&gw, &m));
    assert_eq!((r1.status().as_u16(), r2.status().as_u16()), (200, 200));
    assert!(started.elapsed() >= Duration::from_millis(800), "served one after the other");

    // A wait longer than the queue timeout ends in 429 queue_timeout.
    a.set_default(Step::Delay { ms: 2500, then: Box::new(Step::Ok) });
    let slow = tokio::spawn({
        let url = gw.url.clone();
        async move {
            Gateway::client()
                .post(format!("{url}/v1/messages"))
                .json(&message("m", false))
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    support::eventually("the slow request holds the only slot", Duration::from_secs(10), async || {
        status(&gw).await["accounts"][0]["in_flight"] == 1
    })
    .await;
    let r = post(&gw, &message("m", false)).await;
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "x-poolgate-queue"), "queue_timeout");
    assert!(!header(&r, "retry-after").is_empty());
    assert_eq!(slow.await.unwrap(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_releases_its_slot() {
    let mock = MockUpstream::start().await;
    mock.account("key-a").push(Step::SlowStream { chunk_delay_ms: 300 });
    let cfg = config(&mock.base_url(), &[("a", "KEY_A")], "[gateway]\nqueue_timeout_ms = 3000\n")
        .replace("base_url", "max_in_flight = 1\nbase_url");
    let gw = Gateway::start(&cfg, &env3());
    let mut r = post(&gw, &message("m", true)).await;
    assert_eq!(r.status(), 200);
    let _first = r.chunk().await.unwrap();
    let st = status(&gw).await;
    assert_eq!(st["accounts"][0]["in_flight"], 1, "{}", gw.log());
    drop(r);
    // The lease is released when the gateway notices the client went away.
    let mut released = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if status(&gw).await["accounts"][0]["in_flight"] == 0 {
            released = true;
            break;
        }
    }
    assert!(released, "in_flight back to 0 after the client left");
    let r = post(&gw, &message("m", false)).await;
    assert_eq!(r.status(), 200, "the slot is free for the next request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_headers_pass_through_and_credentials_are_replaced() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let mut cfg = config(&mock.base_url(), &[("a", "KEY_A")], "");
    cfg.push_str("[[server.client_keys]]\nname = \"team\"\nkey_env = \"PG_CLIENT\"\n");
    let mut env = env3();
    env.push(("PG_CLIENT", "client-secret-123"));
    let gw = Gateway::start(&cfg, &env);
    let r = Gateway::client()
        .post(format!("{}/v1/messages?beta=true", gw.url))
        .header("x-api-key", "client-secret-123")
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "claude-code-20250219,oauth-2025-04-20")
        .header("x-claude-code-session-id", "sess-1")
        .header("connection", "keep-alive")
        .json(&message("claude-sonnet-4-5", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let rec = mock.requests().pop().unwrap();
    assert_eq!(rec.path, "/v1/messages?beta=true");
    assert_eq!(rec.credential, "key-a");
    let h = |n: &str| rec.headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    assert_eq!(h("anthropic-version").as_deref(), Some("2023-06-01"));
    assert_eq!(
        h("anthropic-beta").as_deref(),
        Some("claude-code-20250219"),
        "the OAuth flag is dropped for an API key"
    );
    assert_eq!(h("x-api-key").as_deref(), Some("key-a"));
    assert_eq!(h("x-claude-code-session-id").as_deref(), Some("sess-1"));
    assert!(h("authorization").is_none());

    // Unknown client key: 401 in Anthropic's shape, and Claude Code is told not to retry.
    let r = Gateway::client()
        .post(format!("{}/v1/messages", gw.url))
        .header("x-api-key", "nope")
        .json(&message("m", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(header(&r, "x-should-retry"), "false");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["type"], "authentication_error");
    // The health route stays open.
    let r = Gateway::client().get(format!("{}/healthz", gw.url)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // No secret ever reaches the log or the status page.
    let st = Gateway::client()
        .get(format!("{}/status", gw.url))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for secret in ["key-a", "client-secret-123", ADMIN] {
        assert!(!gw.log().contains(secret), "{secret} leaked into the log");
        assert!(!st.contains(secret), "{secret} leaked into /status");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauth_accounts_send_a_bearer_token_with_the_oauth_beta() {
    let mock = MockUpstream::start().await;
    mock.account("oauth-token-x");
    let cfg = format!(
        "[[accounts]]\nid = \"seat\"\nkind = \"oauth\"\napi_key_env = \"TOKEN\"\nbase_url = \"{}\"\n",
        mock.base_url()
    );
    let gw = Gateway::start(&cfg, &[("TOKEN", "oauth-token-x")]);
    let r = post(&gw, &message("claude-opus-4-1", false)).await;
    assert_eq!(r.status(), 200);
    let rec = mock.requests().pop().unwrap();
    let h = |n: &str| rec.headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    assert_eq!(h("authorization").as_deref(), Some("Bearer oauth-token-x"));
    assert_eq!(h("anthropic-beta").as_deref(), Some("oauth-2025-04-20"));
    assert!(h("x-api-key").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_and_setup_mistakes_answer_in_anthropics_shape() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let cfg = config(&mock.base_url(), &[("a", "KEY_A")], "").replace("[server]\n", "[server]\nmax_body_mb = 1\n");
    let gw = Gateway::start(&cfg, &env3());
    let big =
        json!({ "model": "m", "max_tokens": 1, "messages": [{ "role": "user", "content": "x".repeat(2 << 20) }] });
    let r = post(&gw, &big).await;
    assert_eq!(r.status(), 413);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["type"], "request_too_large");
    let bad = |body: &'static str| {
        Gateway::client()
            .post(format!("{}/v1/messages", gw.url))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    // What is wrong, in Anthropic's words: never the gateway's Rust types.
    for (body, says) in [
        ("{not json", "body is not valid JSON: key must be a string at line 1 column 2"),
        (r#"{"model":5,"messages":[]}"#, "model: Input should be a valid string"),
        (r#"{"model":"m","stream":"yes"}"#, "stream: Input should be a valid boolean"),
        ("[]", "body: Input should be a valid dictionary"),
    ] {
        let r = bad(body).await.unwrap();
        assert_eq!(r.status(), 400);
        let error = &r.json::<Value>().await.unwrap()["error"];
        assert_eq!(error["type"], "invalid_request_error");
        assert_eq!(error["message"], says);
    }
    // Claude Code's unauthenticated probes are answered cheaply.
    let r = Gateway::client().head(format!("{}/api/hello", gw.url)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(mock.requests().is_empty());

    // Zero accounts: 503 naming the mistake.
    let gw = Gateway::start("[policy]\n", &[]);
    let r = post(&gw, &message("m", false)).await;
    assert_eq!(r.status(), 503);
    assert_eq!(header(&r, "x-should-retry"), "false");
    let body: Value = r.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("[[accounts]]"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_headers_feed_the_chain_and_the_status_page() {
    let mock = MockUpstream::start().await;
    let reset = now_s() + 7200;
    mock.account("key-a").set_quota(Quota {
        status: Some("allowed".into()),
        five_hour: Some(Window { utilization: 0.9, status: "allowed".into(), reset_s: reset }),
        seven_day: Some(Window { utilization: 0.5, status: "allowed".into(), reset_s: reset }),
        ..Default::default()
    });
    mock.account("key-b").set_quota(Quota {
        status: Some("allowed".into()),
        five_hour: Some(Window { utilization: 0.1, status: "allowed".into(), reset_s: reset }),
        seven_day: Some(Window { utilization: 0.2, status: "allowed".into(), reset_s: reset }),
        buckets: vec![("oi".into(), Window { utilization: 0.97, status: "allowed".into(), reset_s: reset })],
        ..Default::default()
    });
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A"), ("b", "KEY_B")], ""), &env3());
    // Learn both accounts' quota (unknown quota ranks first, so each gets one request).
    post(&gw, &message("claude-sonnet-4-5", false)).await;
    post(&gw, &message("claude-sonnet-4-5", false)).await;
    // Sonnet: b has far more headroom.
    let r = post(&gw, &message("claude-sonnet-4-5", false)).await;
    assert_eq!(header(&r, "x-poolgate-account"), "b");
    assert_eq!(header(&r, "x-poolgate-reason"), "headroom");
    // Fable: b's 7d_oi bucket (0.97) binds fable, so a leads.
    let r = post(&gw, &message("claude-fable-5", false)).await;
    assert_eq!(header(&r, "x-poolgate-account"), "a");
    let st = status(&gw).await;
    let b = st["accounts"].as_array().unwrap().iter().find(|x| x["id"] == "b").unwrap();
    let windows: Vec<&str> = b["windows"].as_array().unwrap().iter().map(|w| w["name"].as_str().unwrap()).collect();
    assert_eq!(windows, ["5h", "7d", "7d_oi"]);
    assert!(b["reading_age_ms"].as_u64().unwrap() < 60_000);
    assert_eq!(st["chain"].as_array().unwrap().len(), 3, "the default chain: skip-exhausted → headroom → affinity");

    let decisions = gw.admin_json("/admin/decisions?limit=1", ADMIN).await;
    assert_eq!(decisions[0]["model"], "claude-fable-5");
    assert_eq!(decisions[0]["account"], "a");
    assert_eq!(decisions[0]["attempts"][0]["decision"]["order"][0], "a");

    let metrics = Gateway::client().get(format!("{}/metrics", gw.url)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("poolgate_requests_total{account=\"b\",status=\"200\"}"), "{metrics}");
    assert!(metrics.contains("poolgate_chain_duration_seconds_count"));
    // Admin routes need the token.
    let r = Gateway::client().get(format!("{}/status", gw.url)).send().await.unwrap();
    assert_eq!(r.status(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_an_open_stream_finish() {
    let mock = MockUpstream::start().await;
    mock.account("key-a").push(Step::SlowStream { chunk_delay_ms: 150 });
    let cfg = config(&mock.base_url(), &[("a", "KEY_A")], "").replace("[server]\n", "[server]\ndrain_ms = 200\n");
    let mut gw = Gateway::start(&cfg, &env3());
    let url = gw.url.clone();
    let stream = tokio::spawn(async move {
        let r = Gateway::client().post(format!("{url}/v1/messages")).json(&message("m", true)).send().await.unwrap();
        r.text().await.unwrap()
    });
    support::eventually("the stream is open", Duration::from_secs(10), async || {
        status(&gw).await["accounts"][0]["in_flight"] == 1
    })
    .await;
    gw.terminate();
    let text = stream.await.unwrap();
    assert!(text.trim_end().ends_with("data: {\"type\":\"message_stop\"}"), "{text}");
    let exit = tokio::task::spawn_blocking(move || gw.wait(Duration::from_secs(10))).await.unwrap();
    assert!(exit.is_some_and(|s| s.success()), "exited cleanly after the stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_says_which_request_it_was_and_only_an_accounts_names_it() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let mut cfg = config(&mock.base_url(), &[("a", "KEY_A")], "").replace("[server]\n", "[server]\nmax_body_mb = 1\n");
    cfg.push_str("[[server.client_keys]]\nname = \"team\"\nkey_env = \"PG_CLIENT\"\n");
    let mut env = env3();
    env.push(("PG_CLIENT", "client-secret-123"));
    let gw = Gateway::start(&cfg, &env);
    let send = |body: String, extra: Vec<(String, String)>| {
        let mut rq = Gateway::client()
            .post(format!("{}/v1/messages", gw.url))
            .header("content-type", "application/json")
            .body(body);
        for (k, v) in extra {
            rq = rq.header(k, v);
        }
        rq.send()
    };
    let key = || vec![("x-api-key".to_string(), "client-secret-123".to_string())];
    let ok = message("m", false).to_string();
    let mut many = key();
    many.extend((0..120).map(|i| (format!("x-extra-{i}"), "v".to_string())));
    let mut huge = key();
    huge.push(("x-huge".into(), "v".repeat(70 << 10)));
    let cases = [
        ("{not json".to_string(), key(), 400),
        (ok.clone(), vec![("x-api-key".into(), "wrong".into())], 401),
        ("x".repeat(2 << 20), key(), 413),
        (ok.clone(), many, 431),
        (ok.clone(), huge, 431),
    ];
    for (body, extra, status) in cases {
        let r = send(body, extra).await.unwrap();
        assert_eq!(r.status().as_u16(), status);
        assert!(r.headers().get("x-poolgate-request-id").is_some(), "{status} carries the request id");
        assert!(r.headers().get("x-poolgate-account").is_none(), "{status} is no account's answer");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["type"], "error", "{status} in Anthropic's shape: {body}");
    }
    assert!(mock.requests().is_empty(), "none of them reached an account");

    // A parked pool: the chain decided (it says why), but no account answered.
    mock.account("key-a").push(Step::RateLimited { unified: true, retry_after: Some("60".into()) });
    for _ in 0..2 {
        let r = send(ok.clone(), key()).await.unwrap();
        assert_eq!(r.status(), 429);
        assert_eq!(header(&r, "x-poolgate-pool"), "parked");
        assert!(r.headers().get("x-poolgate-account").is_none(), "a parked answer names no account");
        assert!(!header(&r, "x-poolgate-reason").is_empty());
        assert!(r.headers().get("x-poolgate-request-id").is_some());
    }
    assert_eq!(mock.requests().len(), 1, "a cooling account is not asked again");
}

/// Streams a request to `path` of the gateway at `url` (on a connection of its
/// own); the text it got, and when it ended.
fn stream(url: &str, path: &str, body: Value) -> tokio::task::JoinHandle<(String, Instant)> {
    let url = format!("{url}{path}");
    tokio::spawn(async move {
        let r = Gateway::client().post(url).header("anthropic-version", "2023-06-01").json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap_or_else(|e| format!("<cut: {e}>"));
        (text, poolgate::clock::machine_instant())
    })
}

/// Whether a new connection to the gateway is accepted at all.
async fn accepting(gw: &Gateway) -> bool {
    tokio::net::TcpStream::connect(gw.url.trim_start_matches("http://")).await.is_ok()
}

async fn get_status(gw: &Gateway, path: &str) -> u16 {
    Gateway::client().get(format!("{}{path}", gw.url)).send().await.map_or(0, |r| r.status().as_u16())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_then_cuts_what_is_still_open_as_shutdown() {
    const DRAIN_MS: u64 = 3000;
    const GRACE_MS: u64 = 6000;
    let mock = MockUpstream::start().await;
    let a = mock.account("key-a");
    // A second between events: both streams outlast the grace period.
    a.push(Step::SlowStream { chunk_delay_ms: 1000 });
    a.push(Step::SlowStream { chunk_delay_ms: 1000 });
    let cfg = config(&mock.base_url(), &[("a", "KEY_A")], "")
        .replace("[server]\n", &format!("[server]\ndrain_ms = {DRAIN_MS}\nshutdown_grace_ms = {GRACE_MS}\n"));
    let mut gw = Gateway::start(&cfg, &env3());
    let messages = stream(&gw.url, "/v1/messages", message("claude-sonnet-4-5", true));
    let chat = stream(
        &gw.url,
        "/v1/chat/completions",
        json!({"model": "claude-sonnet-4-5", "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
    );
    support::eventually("both streams are open", Duration::from_secs(10), async || {
        status(&gw).await["accounts"][0]["in_flight"] == 2
    })
    .await;
    assert_eq!(get_status(&gw, "/readyz").await, 200);
    // A kept-alive connection, as a load balancer pools them, idle at the signal.
    let mut pooled = tokio::net::TcpStream::connect(gw.url.trim_start_matches("http://")).await.unwrap();
    let body = serde_json::to_string(&message("claude-sonnet-4-5", false)).unwrap();
    let raw = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: g\r\ncontent-type: application/json\r\nanthropic-version: \
         2023-06-01\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    pooled.write_all(raw.as_bytes()).await.unwrap();
    let head = read_head(&mut pooled).await;
    assert!(head.starts_with("http/1.1 200") && !head.contains("connection: close"), "{head}");
    skip_body(&mut pooled, &head).await;

    let signalled = poolgate::clock::machine_instant();
    gw.terminate();
    // At once: not ready, so a load balancer stops sending…
    support::eventually("/readyz answers 503", Duration::from_secs(2), async || {
        get_status(&gw, "/readyz").await == 503
    })
    .await;
    // …but what it still sends during drain_ms is served, on connections that
    // then close (the client reconnects elsewhere).
    let r = post(&gw, &message("claude-sonnet-4-5", false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "connection"), "close");
    // The pooled connection was not closed under a request on its way: it
    // serves one more, and says it closes.
    pooled.write_all(raw.as_bytes()).await.unwrap();
    let head = read_head(&mut pooled).await;
    assert!(head.starts_with("http/1.1 200") && head.contains("connection: close"), "{head}");
    assert_eq!(get_status(&gw, "/healthz").await, 200);
    assert!(signalled.elapsed() < Duration::from_millis(DRAIN_MS), "within the drain window");
    // Then the listener closes.
    support::eventually("the listener closes", Duration::from_secs(10), async || !accepting(&gw).await).await;
    assert!(signalled.elapsed() >= Duration::from_millis(DRAIN_MS), "not before drain_ms: {:?}", signalled.elapsed());

    // The streams go on until the grace period ends, then end with an error
    // event — Anthropic's, and on the OpenAI route OpenAI's error chunk.
    let (text, ended) = messages.await.unwrap();
    assert!(ended - signalled >= Duration::from_millis(GRACE_MS), "cut at the grace's end: {:?}", ended - signalled);
    assert!(text.contains("event: content_block_delta"), "it streamed until then: {text}");
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    assert!(last.starts_with("event: error\ndata: "), "{text}");
    let event: Value = serde_json::from_str(last.split_once("data: ").unwrap().1).unwrap();
    assert_eq!(event["error"]["type"], "api_error");
    assert!(event["error"]["message"].as_str().unwrap().contains("shutting down"), "{event}");
    let (text, _) = chat.await.unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("data: ")).collect();
    assert_eq!(lines.last(), Some(&"data: [DONE]"), "{text}");
    let chunk: Value = serde_json::from_str(lines[lines.len() - 2].trim_start_matches("data: ")).unwrap();
    assert_eq!(chunk["error"]["type"], "server_error", "{text}");
    assert!(chunk["error"]["message"].as_str().unwrap().contains("shutting down"), "{chunk}");

    let exit = tokio::task::spawn_blocking(move || {
        let exit = gw.wait(Duration::from_secs(15));
        (exit, gw)
    });
    let (exit, gw) = exit.await.unwrap();
    assert!(exit.is_some_and(|s| s.success()), "exited cleanly");
    // Recorded as cut by the shutdown, not as clients that went away.
    let log = gw.log();
    assert_eq!(log.matches("\"outcome\":\"shutdown\"").count(), 2, "{log}");
    assert!(!log.contains("\"outcome\":\"client_gone\""), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_skips_the_drain_and_a_second_one_stops_at_once() {
    let mock = MockUpstream::start().await;
    mock.account("key-a").push(Step::SlowStream { chunk_delay_ms: 1000 });
    // The default grace (30 s) would let the stream finish.
    let mut gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], ""), &env3());
    let messages = stream(&gw.url, "/v1/messages", message("claude-sonnet-4-5", true));
    support::eventually("the stream is open", Duration::from_secs(10), async || {
        status(&gw).await["accounts"][0]["in_flight"] == 1
    })
    .await;
    gw.signal("INT");
    // No load balancer at a terminal: the listener closes at once.
    support::eventually("the listener closes", Duration::from_secs(3), async || !accepting(&gw).await).await;
    assert!(!messages.is_finished(), "the open stream goes on");
    let second = poolgate::clock::machine_instant();
    gw.signal("INT");
    let (text, ended) = messages.await.unwrap();
    assert!(text.trim_end().ends_with("shutdown grace period\"}}"), "{text}");
    // Far sooner than the grace period: at once, given a busy machine.
    assert!(ended - second < Duration::from_secs(10), "{:?}", ended - second);
    let exit = tokio::task::spawn_blocking(move || gw.wait(Duration::from_secs(15))).await.unwrap();
    assert!(exit.is_some_and(|s| s.success()));
}

/// A request still waiting for its upstream's head when the grace period
/// ends is answered — a 503 in Anthropic's shape, which an SDK retries — not
/// dropped with its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_for_its_upstream_at_the_grace_end_gets_a_503() {
    const GRACE_MS: u64 = 1000;
    let mock = MockUpstream::start().await;
    mock.account("key-a").push(Step::Hang);
    let cfg = config(&mock.base_url(), &[("a", "KEY_A")], "")
        .replace("[server]\n", &format!("[server]\ndrain_ms = 0\nshutdown_grace_ms = {GRACE_MS}\n"));
    let mut gw = Gateway::start(&cfg, &env3());
    let url = gw.url.clone();
    let waiting = tokio::spawn(async move {
        let r = Gateway::client()
            .post(format!("{url}/v1/messages"))
            .header("anthropic-version", "2023-06-01")
            .json(&message("claude-sonnet-4-5", false))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    });
    support::eventually("the request waits upstream", Duration::from_secs(10), async || {
        status(&gw).await["accounts"][0]["in_flight"] == 1
    })
    .await;
    gw.terminate();
    let (code, body) = tokio::time::timeout(Duration::from_secs(10), waiting).await.unwrap().unwrap();
    assert_eq!(code, 503, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["type"], "api_error", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("shutting down"), "{body}");
    let exit = tokio::task::spawn_blocking(move || {
        let exit = gw.wait(Duration::from_secs(15));
        (exit, gw)
    });
    let (exit, gw) = exit.await.unwrap();
    assert!(exit.is_some_and(|s| s.success()), "exited cleanly");
    let log = gw.log();
    assert!(log.contains("\"account\":\"a\",\"outcome\":\"shutdown\""), "the attempt names its account: {log}");
    assert!(log.contains("\"status\":503,\"outcome\":\"shutdown\""), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_hears_ready_reloading_and_stopping() {
    let dir = support::tempdir::Dir::new("notify");
    let path = dir.0.join("notify.sock");
    let socket = tokio::net::UnixDatagram::bind(&path).unwrap();
    let next = async || {
        let mut buf = [0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(30), socket.recv(&mut buf))
            .await
            .expect("a notification")
            .unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let cfg = config(&mock.base_url(), &[("a", "KEY_A")], "").replace("[server]\n", "[server]\ndrain_ms = 0\n");
    let socket_path = path.to_str().unwrap().to_string();
    let mut env: Vec<(&str, &str)> = env3();
    env.push(("NOTIFY_SOCKET", &socket_path));
    let mut gw = Gateway::start(&cfg, &env);
    let ready = next().await;
    assert!(ready.starts_with("READY=1\nSTATUS=poolgate listening on 127.0.0.1:"), "{ready}");
    assert!(ready.ends_with(gw.url.trim_start_matches("http://")), "{ready} names {}", gw.url);
    gw.signal("HUP");
    let reloading = next().await;
    assert!(reloading.starts_with("RELOADING=1\nMONOTONIC_USEC="), "{reloading}");
    let ready = next().await;
    assert!(ready.starts_with("READY=1\nSTATUS=serving configuration generation "), "{ready}");
    gw.terminate();
    assert!(next().await.starts_with("STOPPING=1\n"));
    let exit = tokio::task::spawn_blocking(move || gw.wait(Duration::from_secs(15))).await.unwrap();
    assert!(exit.is_some_and(|s| s.success()));
}

#[test]
fn the_example_systemd_unit_verifies() {
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/poolgate.service")).unwrap();
    let value = |key: &str| {
        unit.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix('=')).unwrap_or_else(|| panic!("no {key}"))
    };
    assert_eq!(value("Type"), "notify");
    assert_eq!(value("KillSignal"), "SIGTERM");
    // systemd must wait past the grace period, or it kills streams poolgate would end cleanly.
    let stop_s: u64 = value("TimeoutStopSec").parse().unwrap();
    let grace_ms = poolgate::config::Config::default().server.shutdown_grace_ms;
    assert!(stop_s * 1000 > grace_ms + 5_000, "TimeoutStopSec={stop_s} vs shutdown_grace_ms={grace_ms}");
    let Ok(version) = std::process::Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("skipped: systemd-analyze is not installed, so the unit is not verified");
        return;
    };
    assert!(version.status.success());
    // As installed, with the binary where the unit expects it.
    let dir = support::tempdir::Dir::new("unit");
    let path = dir.0.join("poolgate.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/poolgate", env!("CARGO_BIN_EXE_poolgate"))).unwrap();
    let out = std::process::Command::new("systemd-analyze").arg("verify").arg(&path).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // verify exits 0 on some problems (an unknown value is "ignored"): any
    // line about the unit fails.
    assert!(out.status.success(), "{said}");
    assert!(!said.lines().any(|l| l.contains("poolgate.service")), "{said}");
}

/// The primary first (`prefer-primary`), with one slot; a second account.
fn primary_with_one_slot(base: &str) -> String {
    format!(
        "[server]\nadmin_token_env = \"PG_ADMIN\"\n\n\
         [[policy.chain]]\nplugin = \"builtin:prefer-primary\"\n\n\
         [[accounts]]\nid = \"a\"\nprimary = true\nmax_in_flight = 1\napi_key_env = \"KEY_A\"\nbase_url = \"{base}\"\n\n\
         [[accounts]]\nid = \"b\"\napi_key_env = \"KEY_B\"\nbase_url = \"{base}\"\n"
    )
}

/// The newest decision record.
async fn last_record(gw: &Gateway) -> Value {
    gw.admin_json("/admin/decisions?limit=1", ADMIN).await[0].clone()
}

/// When the chain's head cannot take a request and another account serves,
/// the reason says why the head was passed over, and so does the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_from_the_second_account_says_why_the_first_was_passed_over() {
    let mock = MockUpstream::start().await;
    let (a, b) = (mock.account("key-a"), mock.account("key-b"));
    a.push(Step::Delay { ms: 3_000, then: Box::new(Step::Ok) });
    let gw = Gateway::start(&primary_with_one_slot(&mock.base_url()), &env3());

    // The primary's only slot is held by a slow request.
    let slow = tokio::spawn({
        let url = gw.url.clone();
        async move { Gateway::client().post(format!("{url}/v1/messages")).json(&message("m", false)).send().await }
    });
    support::eventually("the slow request holds a's slot", Duration::from_secs(10), async || {
        status(&gw).await["accounts"][0]["in_flight"] == 1
    })
    .await;
    let r = post(&gw, &message("claude-sonnet-4-5", false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-poolgate-account"), "b");
    assert_eq!(header(&r, "x-poolgate-reason"), "preferred_primary; passed over a full");
    let record = last_record(&gw).await;
    assert_eq!(record["account"], "b");
    assert_eq!(record["passed_over"], json!([{ "account": "a", "attempt": 0, "cause": "full" }]), "{record}");
    assert_eq!(slow.await.unwrap().unwrap().status(), 200);

    // The primary refuses (529): the answer is b's, and says a failed over.
    a.push(Step::Overloaded);
    let r = post(&gw, &message("claude-sonnet-4-5", false)).await;
    assert_eq!((r.status().as_u16(), header(&r, "x-poolgate-account")), (200, "b"));
    let reason = header(&r, "x-poolgate-reason");
    assert!(reason.ends_with("; passed over a failed-over:529"), "{reason}");
    let record = last_record(&gw).await;
    assert_eq!(record["passed_over"], json!([{ "account": "a", "attempt": 0, "cause": "failed-over:529" }]));

    // Now a cools and the chain ranks b first: nothing is passed over.
    let r = post(&gw, &message("claude-sonnet-4-5", false)).await;
    assert_eq!(header(&r, "x-poolgate-account"), "b");
    assert!(!header(&r, "x-poolgate-reason").contains("passed over"), "{:?}", r.headers());
    assert!(last_record(&gw).await.get("passed_over").is_none());
    assert_eq!(b.count(), 3);
}

/// Reads a response head (lowercased) from `socket`.
async fn read_head(socket: &mut tokio::net::TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(socket.read(&mut byte).await.unwrap(), 1, "closed mid-head");
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).to_ascii_lowercase()
}

/// Reads the `content-length` body the head announced.
async fn skip_body(socket: &mut tokio::net::TcpStream, head: &str) {
    let len: usize =
        head.lines().find_map(|l| l.strip_prefix("content-length: ")).map(|v| v.trim().parse().unwrap()).unwrap();
    let mut body = vec![0u8; len];
    socket.read_exact(&mut body).await.unwrap();
}
