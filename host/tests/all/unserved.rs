//! When no account can serve, the status names the real cause — through the
//! real binary, against the mock upstream: refused credentials are a 503 that
//! names the accounts (never the upstream's 401, which a client reads as its
//! own key being wrong), an outage is a 502 and then a 503 while the accounts
//! cool, and only a quota is a 429.

use crate::bounded;
use crate::support;

use std::process::Command;
use std::time::Duration;

use bounded::OutputWithin as _;
use poolgate_mock_upstream::{MockUpstream, Quota, Step, Window};
use serde_json::{Value, json};
use support::{Gateway, config, send_message};

const ADMIN: &str = "admin-token-for-unserved";

fn env() -> Vec<(&'static str, &'static str)> {
    vec![("KEY_A", "key-a-secret"), ("KEY_B", "key-b-secret"), ("PG_ADMIN", ADMIN)]
}

fn refused(status: u16, kind: &str) -> Step {
    let body = json!({ "type": "error", "error": { "type": kind, "message": "invalid x-api-key" } });
    Step::Status { status, body, headers: vec![] }
}

/// Sends one request; its status, headers and JSON body.
async fn ask(gw: &Gateway) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    let (status, headers) = (r.status().as_u16(), r.headers().clone());
    (status, headers, r.json().await.unwrap())
}

async fn metrics(gw: &Gateway) -> String {
    Gateway::client().get(format!("{}/metrics", gw.url)).send().await.unwrap().text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_whose_credentials_are_all_refused_answers_503_naming_the_accounts() {
    let mock = MockUpstream::start().await;
    mock.account("key-a-secret").set_default(refused(401, "authentication_error"));
    mock.account("key-b-secret").set_default(refused(403, "permission_error"));
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A"), ("b", "KEY_B")], ""), &env());

    // Both tried now, and both cooling for `auth` on the second request: the
    // answer is the same, and no account is asked again.
    for round in ["tried", "cooling"] {
        let (status, headers, body) = ask(&gw).await;
        assert_eq!(status, 503, "{round}: {body}");
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "api_error", "{round}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("re-authenticate account `a`, `b`"), "{round}: {message}");
        assert!(!message.contains("secret"), "no credential in the answer: {message}");
        assert!(headers.get("x-should-retry").is_none(), "{round}: retryable");
        assert!(headers.get("x-poolgate-account").is_none(), "{round}: no account's answer");
        assert_eq!(headers["x-poolgate-pool"], "auth_refused", "{round}");
        assert!(headers.get("x-poolgate-request-id").is_some());
    }
    assert_eq!(mock.requests().len(), 2, "each account was asked once");

    let decisions = gw.admin_json("/admin/decisions?limit=1", ADMIN).await;
    assert_eq!(decisions[0]["outcome"], "auth_refused");
    assert_eq!(
        decisions[0]["blocked"][0],
        json!({"account": "a", "cause": "auth", "detail": "cooling: auth",
        "until_ms": decisions[0]["blocked"][0]["until_ms"]})
    );
    let text = metrics(&gw).await;
    assert!(text.contains("poolgate_unserved_total{cause=\"auth_refused\"} 2"), "{text}");
    assert!(!text.contains("poolgate_parked_total 1"), "not parked: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_outage_is_a_502_then_a_503_while_the_accounts_cool() {
    let mock = MockUpstream::start().await;
    mock.account("key-a-secret").set_default(Step::ServerError(500));
    mock.account("key-b-secret").set_default(Step::Overloaded);
    // A cooldown long enough that the second request surely finds both cooling.
    let extra = "[cooldowns]\nupstream_error_ms = 600000\nupstream_error_max_ms = 600000\noverloaded_ms = 600000\noverloaded_max_ms = 600000\n";
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A"), ("b", "KEY_B")], extra), &env());

    let (status, headers, body) = ask(&gw).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["error"]["type"], "api_error");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("`a` (HTTP 500") && message.contains("`b` (HTTP 529"), "{message}");
    assert_eq!(headers["x-poolgate-pool"], "upstream_failed");
    assert!(headers.get("x-poolgate-account").is_none());

    let (status, headers, body) = ask(&gw).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["type"], "api_error");
    assert_eq!(headers["x-poolgate-pool"], "upstream_cooling");
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((500..=600).contains(&retry), "the soonest recovery, ~600 s: {retry}");
    assert_eq!(mock.requests().len(), 2, "cooling accounts are not asked");
    let text = metrics(&gw).await;
    assert!(text.contains("poolgate_unserved_total{cause=\"upstream_failed\"} 1"), "{text}");
    assert!(text.contains("poolgate_unserved_total{cause=\"upstream_cooling\"} 1"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_mixed_causes_a_quota_is_a_429_and_a_refusal_beats_an_outage() {
    let mock = MockUpstream::start().await;
    let reset = poolgate_mock_upstream::now_s() + 1800;
    let spent = Window { utilization: 1.0, status: "rejected".into(), reset_s: reset };
    let quota = mock.account("key-a-secret");
    quota.set_quota(Quota { status: Some("rejected".into()), five_hour: Some(spent), ..Default::default() });
    quota.set_default(Step::RateLimited { unified: true, retry_after: None });
    mock.account("key-b-secret").set_default(refused(401, "authentication_error"));
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A"), ("b", "KEY_B")], ""), &env());
    let (status, headers, body) = ask(&gw).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert_eq!(headers["x-poolgate-pool"], "parked");
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1700..=1800).contains(&retry), "a's reset, not b's auth cooldown: {retry}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("re-authenticate account `b`"), "{message}");

    let mock = MockUpstream::start().await;
    mock.account("key-a-secret").set_default(refused(401, "authentication_error"));
    mock.account("key-b-secret").set_default(Step::ServerError(503));
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A"), ("b", "KEY_B")], ""), &env());
    let (status, headers, body) = ask(&gw).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(headers["x-poolgate-pool"], "auth_refused");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("re-authenticate account `a`") && message.contains("`b` failing upstream"), "{message}");
    assert!(headers.get("x-poolgate-account").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_sdk_sees_a_server_error_not_an_invalid_key() {
    let mock = MockUpstream::start().await;
    mock.account("key-a-secret").set_default(refused(401, "authentication_error"));
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], ""), &env());
    let script = r#"
import sys, anthropic
client = anthropic.Anthropic(base_url=sys.argv[1], api_key="client-key", max_retries=0)
try:
    client.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    print("no error")
except anthropic.AuthenticationError as e:
    print("authentication error", e)
except anthropic.APIStatusError as e:
    print("status", e.status_code, type(e).__name__, e.body["error"]["message"])
"#;
    let url = gw.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3").args(["-c", script, &url]).output_within(Duration::from_secs(60))
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("status 503 ServiceUnavailableError poolgate: every upstream account was refused"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
