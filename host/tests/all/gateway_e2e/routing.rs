//! Which account serves, end to end: failover before the first byte, a pool
//! that cools and is parked, streams relayed whole or cut with an error event,
//! a full account's queue, a client that goes away mid-stream, and the reason
//! that says why the chain's head was passed over.

use super::*;

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
