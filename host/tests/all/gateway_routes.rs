//! More of the gateway's surface end to end: the other API routes, cooldown causes
//! the status page reports, and JSON logs with decision records.

use crate::support;

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

/// a (the primary) first, then b; `alias` lets a reload change a.
fn primary_first(base: &str, alias: &str) -> String {
    format!(
        "[server]\nadmin_token_env = \"PG_ADMIN\"\n\n\
         [[policy.chain]]\nplugin = \"builtin:prefer-primary\"\n\n\
         [[accounts]]\nid = \"a\"\nalias = \"{alias}\"\nprimary = true\napi_key_env = \"KEY_A\"\nbase_url = \"{base}\"\n\n\
         [[accounts]]\nid = \"b\"\napi_key_env = \"KEY_B\"\nbase_url = \"{base}\"\n"
    )
}

/// Which account answered a Messages request.
async fn served_by(gw: &Gateway) -> String {
    let r = Gateway::client().post(format!("{}/v1/messages", gw.url)).json(&message("m", false)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.headers()["x-poolgate-account"].to_str().unwrap().to_string()
}

/// An operator lifts a stale cooldown, takes an account out of routing and
/// puts it back, with the admin token; a reload that changes the account
/// keeps it out; every action is logged and in `/status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_clear_disable_and_enable_accounts_with_the_admin_token() {
    let mock = MockUpstream::start().await;
    let (a, b) = (mock.account("key-a"), mock.account("key-b"));
    let dir = support::tempdir::Dir::new("admin");
    let path = dir.0.join("poolgate.toml");
    std::fs::write(&path, primary_first(&mock.base_url(), "first")).unwrap();
    let gw = Gateway::start_file(&path, &env2(), dir);
    let post =
        async |path: &str, token: Option<&str>, body: &str| support::admin_post(&gw.url, path, token, body).await;

    // a answers 529 and cools for a while: b serves.
    a.push(Step::Overloaded);
    assert_eq!(served_by(&gw).await, "b");
    assert_eq!(account_status(&gw, "a").await["cooldown"]["reason"], "overloaded");

    // Refused without the token, or with another; an unknown account or
    // action is a 404 and a body that says nothing sensible a 400, each in the
    // API's error shape; none of them changes anything.
    for token in [None, Some("not-the-token")] {
        let (status, body) = post("/admin/accounts/a/clear", token, "").await;
        assert_eq!((status, body["error"]["type"].as_str()), (401, Some("authentication_error")), "{body}");
    }
    let (status, body) = post("/admin/accounts/nobody/disable", Some(ADMIN), "").await;
    assert_eq!((status, body["error"]["type"].as_str()), (404, Some("not_found_error")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("`nobody`"));
    assert_eq!(post("/admin/accounts/a/explode", Some(ADMIN), "").await.0, 404);
    let (status, body) = post("/admin/accounts/a/disable", Some(ADMIN), "{\"cooldown\":true}").await;
    assert_eq!((status, body["error"]["type"].as_str()), (400, Some("invalid_request_error")), "{body}");
    assert_eq!(account_status(&gw, "a").await["cooldown"]["reason"], "overloaded");

    // Clear: the cooldown is lifted, and the primary serves again.
    let (status, body) = post("/admin/accounts/a/clear", Some(ADMIN), "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["cleared"]["cooldown"]["reason"], "overloaded");
    assert!(account_status(&gw, "a").await["cooldown"].is_null());
    assert_eq!(served_by(&gw).await, "a");

    // Disable: nothing goes to a, even as the primary.
    let (status, body) =
        post("/admin/accounts/a/disable", Some(ADMIN), r#"{"by":"alice","note":"key under review"}"#).await;
    assert_eq!((status, body["changed"].as_bool()), (200, Some(true)), "{body}");
    let before = a.count();
    for _ in 0..3 {
        assert_eq!(served_by(&gw).await, "b");
    }
    let st = account_status(&gw, "a").await;
    assert_eq!((st["runtime_disabled"]["by"].as_str(), st["enabled"].as_bool()), (Some("alice"), Some(true)));

    // A reload that changes a keeps it out, and says so.
    std::fs::write(&path, primary_first(&mock.base_url(), "renamed")).unwrap();
    let (status, body) = post("/admin/reload", Some(ADMIN), "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(account_status(&gw, "a").await["alias"], "renamed");
    assert_eq!(served_by(&gw).await, "b");
    assert_eq!(a.count(), before, "a disabled account gets no request");
    assert!(gw.log().contains("stays disabled at run time across the reload"), "{}", gw.log());

    // Enable: the primary serves again.
    let (status, body) = post("/admin/accounts/a/enable", Some(ADMIN), r#"{"by":"alice"}"#).await;
    assert_eq!(
        (status, body["changed"].as_bool(), body["was"]["note"].as_str()),
        (200, Some(true), Some("key under review"))
    );
    assert_eq!(served_by(&gw).await, "a");
    assert!(account_status(&gw, "a").await.get("runtime_disabled").is_none());

    // Every action, newest first, with who did it.
    let st = gw.admin_json("/status", ADMIN).await;
    let actions: Vec<(&str, &str)> = st["admin_actions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| (x["action"].as_str().unwrap(), x["by"].as_str().unwrap()))
        .collect();
    assert_eq!(actions, [("enable", "alice"), ("disable", "alice"), ("clear", "admin")]);
    let log = gw.log();
    assert!(log.lines().any(|l| l.contains("admin action") && l.contains("disable") && l.contains("alice")), "{log}");
    assert!(b.count() >= 5);
}
