//! Client keys managed at run time, through the real binary: created over
//! `/admin/keys` and with `poolgate keys`, used at once (or within the
//! refresh), held to their limits, refused once revoked — never shown twice.

use std::process::Command;
use std::time::Duration;

use poolgate_mock_upstream::MockUpstream;
use serde_json::{Value, json};

use crate::bounded::OutputWithin as _;
use crate::support::{self, Gateway, config, tempdir};

const ADMIN: &str = "keys-admin";

fn gateway(mock: &MockUpstream, ledger: &std::path::Path) -> Gateway {
    let extra = format!(
        "[[server.client_keys]]\nname = \"alice\"\nkey_env = \"ALICE\"\n\n[ledger]\nfile = \"{}\"\nflush_ms = 100\n",
        ledger.display()
    );
    let env = [("KEY_A", "key-a"), ("ALICE", "alice-key"), ("PG_ADMIN", ADMIN)];
    Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], &extra), &env)
}

async fn admin(gw: &Gateway, path: &str, body: Value) -> (u16, Value) {
    support::admin_post(&gw.url, path, Some(ADMIN), &body.to_string()).await
}

async fn ask(gw: &Gateway, key: &str) -> reqwest::Response {
    Gateway::client()
        .post(format!("{}/v1/messages", gw.url))
        .header("x-api-key", key)
        .json(&support::message("claude-sonnet-4-5", false))
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_made_over_admin_works_at_once_is_held_to_its_limits_and_is_refused_once_revoked() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let dir = tempdir::Dir::new("keys");
    let gw = gateway(&mock, &dir.0.join("ledger.sqlite"));

    let (status, made) =
        admin(&gw, "/admin/keys", json!({"name": "ci", "team": "build", "models": ["claude-haiku-*"]})).await;
    assert_eq!(status, 201, "{made}");
    let secret = made["key"].as_str().unwrap().to_string();
    assert!(secret.starts_with("pg-"));

    // In force at once: its model list holds; another model is a 403.
    assert_eq!(ask(&gw, &secret).await.status(), 403);
    let (status, changed) =
        admin(&gw, "/admin/keys/ci", json!({"models": ["claude-sonnet-*"], "budget_tokens_day": 1000000})).await;
    assert_eq!(status, 200, "{changed}");
    let r = ask(&gw, &secret).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("x-poolgate-budget-day-tokens-remaining"));
    let usage: Value = Gateway::client()
        .get(format!("{}/v1/usage", gw.url))
        .header("x-api-key", &secret)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!((usage["key"].as_str(), usage["team"].as_str()), (Some("ci"), Some("build")), "{usage}");

    // Listed without the key; a name taken (a config key's) is refused.
    let listed = support::admin_json(&gw.url, "/admin/keys", ADMIN).await;
    assert!(!listed.to_string().contains(&secret), "{listed}");
    assert!(!listed.to_string().contains(&secret[3..]), "never the key, in any form");
    let names: Vec<&str> = listed["keys"].as_array().unwrap().iter().map(|k| k["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["alice", "ci"]);
    let (status, body) = admin(&gw, "/admin/keys", json!({"name": "alice"})).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("exists already"));

    // Revoked: refused, saying so.
    assert_eq!(admin(&gw, "/admin/keys/ci/revoke", json!({})).await.0, 200);
    let r = ask(&gw, &secret).await;
    assert_eq!(r.status(), 401);
    let body: Value = r.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("revoked"), "{body}");
    assert_eq!(ask(&gw, "alice-key").await.status(), 200, "config keys are untouched");
    assert!(!gw.log().contains(&secret), "the key is never logged");
}

fn cli(gw: &Gateway, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .arg("keys")
        .args(args)
        .arg("--config")
        .arg(gw.config_path())
        .output_within(Duration::from_secs(60));
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "poolgate keys {args:?}: {text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_made_with_the_cli_is_read_by_the_running_gateway_within_the_refresh() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let dir = tempdir::Dir::new("keys");
    let gw = gateway(&mock, &dir.0.join("ledger.sqlite"));
    let printed = cli(&gw, &["create", "bot", "--team", "agents", "--max-in-flight", "2"]);
    let secret = printed.lines().last().unwrap().trim().to_string();
    assert!(secret.starts_with("pg-"), "{printed}");
    support::eventually("the new key accepted", Duration::from_secs(10), async || {
        ask(&gw, &secret).await.status() == 200
    })
    .await;
    let listed = cli(&gw, &["list"]);
    assert!(listed.contains("bot") && listed.contains("agents") && !listed.contains(&secret), "{listed}");
    cli(&gw, &["revoke", "bot"]);
    support::eventually("the revoked key refused", Duration::from_secs(10), async || {
        ask(&gw, &secret).await.status() == 401
    })
    .await;
    assert!(cli(&gw, &["list"]).contains("revoked at"));
}
