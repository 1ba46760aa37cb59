//! What crosses the gateway: client headers pass, credentials are replaced,
//! an OAuth seat sends its bearer token; limits and setup mistakes answer in
//! Anthropic's shape, quota headers feed the chain and `/status`, and every
//! answer names its request.

use super::*;

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
