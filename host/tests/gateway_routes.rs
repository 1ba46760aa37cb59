//! More of the gateway's surface end to end: the other API routes, cooldown causes
//! the status page reports, and JSON logs with decision records.

mod support;

use poolgate_mock_upstream::{MockUpstream, Step};
use serde_json::Value;
use support::{Gateway, config, message};

const ADMIN: &str = "routes-admin";

fn env2() -> Vec<(&'static str, &'static str)> {
    vec![("KEY_A", "key-a"), ("KEY_B", "key-b"), ("PG_ADMIN", ADMIN)]
}

async fn account_status(gw: &Gateway, id: &str) -> Value {
    let st = gw.admin_json("/status", ADMIN).await;
    st["accounts"].as_array().unwrap().iter().find(|a| a["id"] == id).unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_and_models_are_forwarded_to_an_account() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], ""), &env2());
    let r = Gateway::client()
        .post(format!("{}/v1/messages/count_tokens", gw.url))
        .json(&serde_json::json!({ "model": "claude-sonnet-4-5", "messages": [{ "role": "user", "content": "hi" }] }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.json::<Value>().await.unwrap()["input_tokens"].as_u64().unwrap() > 0);
    let r = Gateway::client().get(format!("{}/v1/models", gw.url)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-poolgate-account"], "a");
    assert!(!r.json::<Value>().await.unwrap()["data"].as_array().unwrap().is_empty());
    let paths: Vec<String> = mock.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/v1/messages/count_tokens", "/v1/models"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_routes_and_wrong_methods_answer_in_anthropics_error_shape() {
    let mock = MockUpstream::start().await;
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], ""), &env2());
    let client = Gateway::client();
    for (request, status, kind) in [
        (client.get(format!("{}/v1/nope", gw.url)), 404, "not_found_error"),
        (client.get(format!("{}/v1/messages", gw.url)), 405, "invalid_request_error"),
        (client.delete(format!("{}/v1/models", gw.url)), 405, "invalid_request_error"),
    ] {
        let r = request.send().await.unwrap();
        assert_eq!(r.status(), status);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], kind, "{body}");
    }
    assert!(mock.requests().is_empty(), "nothing reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_credential_cools_the_account_and_fails_over() {
    let mock = MockUpstream::start().await;
    mock.account("key-b");
    // key-a is unknown to the mock: every request with it gets 401.
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A"), ("b", "KEY_B")], ""), &env2());
    let r = Gateway::client().post(format!("{}/v1/messages", gw.url)).json(&message("m", false)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-poolgate-account"], "b");
    let a = account_status(&gw, "a").await;
    assert_eq!(a["cooldown"]["reason"], "auth");
    assert!(a["cooldown"]["remaining_ms"].as_u64().unwrap() > 50_000, "60 s for the first refusal");
    assert_eq!(a["streaks"]["auth"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_429_is_a_short_transient_cooldown_not_a_park() {
    let mock = MockUpstream::start().await;
    mock.account("key-a").push(Step::RateLimited { unified: false, retry_after: None });
    mock.account("key-b");
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A"), ("b", "KEY_B")], ""), &env2());
    let r = Gateway::client().post(format!("{}/v1/messages", gw.url)).json(&message("m", false)).send().await.unwrap();
    assert_eq!(r.headers()["x-poolgate-account"], "b");
    let a = account_status(&gw, "a").await;
    assert_eq!(a["cooldown"]["reason"], "transient");
    assert!(a["cooldown"]["remaining_ms"].as_u64().unwrap() <= 10_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_with_retry_after_on_the_last_account_is_passed_on_when_others_remain_usable() {
    // One account: its 429 with retry-after makes the pool park, and the local
    // answer carries a retry-after of its own.
    let mock = MockUpstream::start().await;
    mock.account("key-a").push(Step::RateLimited { unified: false, retry_after: Some("7".into()) });
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], ""), &env2());
    let r = Gateway::client().post(format!("{}/v1/messages", gw.url)).json(&message("m", false)).send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["x-poolgate-pool"], "parked");
    let retry: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((6..=7).contains(&retry), "{retry}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_the_decision_record() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let cfg =
        config(&mock.base_url(), &[("a", "KEY_A")], "").replace("[server]\n", "[server]\nlog_format = \"json\"\n");
    let gw = Gateway::start(&cfg, &env2());
    let r = Gateway::client()
        .post(format!("{}/v1/messages", gw.url))
        .json(&message("claude-haiku-4-5", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await;
    support::eventually("the decision is logged", std::time::Duration::from_secs(10), async || {
        gw.log().contains("poolgate::decision")
    })
    .await;
    let log = gw.log();
    let line = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["target"] == "poolgate::decision")
        .unwrap_or_else(|| panic!("no decision line in:\n{log}"));
    let record = &line["fields"]["record"];
    assert_eq!(record["model"], "claude-haiku-4-5");
    assert_eq!(record["account"], "a");
    assert_eq!(record["status"], 200);
    assert_eq!(record["outcome"], "complete");
}
