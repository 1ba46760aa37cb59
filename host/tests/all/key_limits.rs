//! A client key's limits through the real binary: a spent budget answers 429
//! on every route in the route's own shape, overspends by no more than the
//! requests in flight when it ran out, and holds across a restart; a model
//! the key may not use is a 403; a per-minute limit says when to retry.

use std::time::Duration;

use crate::bounded::OutputWithin as _;
use poolgate_mock_upstream::MockUpstream;
use serde_json::{Value, json};

use crate::support::{self, Gateway, config, messages, spent_tokens, tempdir};

const ADMIN: &str = "limits-admin";

fn env() -> Vec<(&'static str, &'static str)> {
    vec![("KEY_A", "key-a"), ("CAROL", "carol-key"), ("DAN", "dan-key"), ("PG_ADMIN", ADMIN)]
}

/// Carol: a daily token budget, two requests in flight at most. Dan: only
/// Haiku, three requests a minute.
fn limited(mock: &MockUpstream, ledger: &std::path::Path, budget: u64) -> Gateway {
    let extra = format!(
        "[[server.client_keys]]\nname = \"carol\"\nkey_env = \"CAROL\"\nbudget_tokens_day = {budget}\nmax_in_flight = 2\n\n\
         [[server.client_keys]]\nname = \"dan\"\nkey_env = \"DAN\"\nmodels = [\"claude-haiku-*\"]\nrequests_per_minute = 3\n\n\
         [ledger]\nfile = \"{}\"\nflush_ms = 100\n",
        ledger.display()
    );
    Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], &extra), &env())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_budget_is_a_429_on_every_route_overspent_by_at_most_what_was_in_flight() {
    // Answers that take a while, so requests overlap.
    let slow = poolgate_mock_upstream::Config { latency_ms: 30, ..Default::default() };
    let mock = MockUpstream::start_with(slow).await;
    mock.account("key-a");
    let dir = tempdir::Dir::new("limits");
    let ledger = dir.0.join("ledger.sqlite");
    let budget = 400;
    let gw = limited(&mock, &ledger, budget);

    // Four clients at once, each sending until refused: at most two requests
    // are in flight (max_in_flight), so the budget is passed by at most two
    // answers.
    let run = |stream: bool| {
        let (url, client) = (gw.url.clone(), Gateway::client());
        tokio::spawn(async move {
            let mut served = 0;
            loop {
                let r = client
                    .post(format!("{url}/v1/messages"))
                    .header("x-api-key", "carol-key")
                    .json(&support::message("claude-sonnet-4-5", stream))
                    .send()
                    .await
                    .unwrap();
                match r.status().as_u16() {
                    200 => {
                        served += 1;
                        let left = &r.headers()["x-poolgate-budget-day-tokens-remaining"];
                        assert!(left.to_str().unwrap().parse::<u64>().unwrap() <= 400, "{left:?}");
                        assert!(r.headers().contains_key("x-poolgate-budget-day-tokens-reset"));
                    }
                    429 if r.headers()["x-poolgate-key-limit"] == "max_in_flight" => {}
                    429 => return (served, r.headers().clone(), r.json::<Value>().await.unwrap()),
                    s => panic!("status {s}"),
                }
                r.bytes().await.unwrap();
            }
        })
    };
    let clients = [run(false), run(true), run(false), run(true)];
    let mut ended = Vec::new();
    for c in clients {
        ended.push(c.await.unwrap());
    }
    let served: usize = ended.iter().map(|(n, _, _)| n).sum();
    let (_, headers, body) = &ended[0];
    assert_eq!(headers["x-poolgate-key-limit"], "budget_day_tokens");
    assert_eq!(headers["x-poolgate-budget-day-tokens-remaining"], "0", "the refusal says what is left too");
    assert_eq!(headers["x-should-retry"], "false");
    assert!(headers["retry-after"].to_str().unwrap().parse::<u64>().unwrap() > 0);
    assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("day budget is spent"), "{body}");

    let spent = spent_tokens(&gw, "carol-key").await;
    let r =
        Gateway::client().get(format!("{}/v1/usage", gw.url)).header("x-api-key", "carol-key").send().await.unwrap();
    let budget_seen = &r.json::<Value>().await.unwrap()["budgets"][0];
    assert_eq!((budget_seen["unit"].as_str(), budget_seen["remaining"].as_u64()), (Some("tokens"), Some(0)));
    assert_eq!(budget_seen["spent"].as_u64(), Some(spent), "the meter and the ledger agree");
    let reported = mock.reported_usage();
    assert_eq!(reported.len(), served);
    let largest = reported.iter().map(|u| u.total()).max().unwrap();
    let overspend = spent.saturating_sub(budget);
    eprintln!("budget {budget} tokens, spent {spent}: overspent by {overspend} (one answer: at most {largest})");
    assert!(spent >= budget, "refused only once spent: {spent}");
    assert!(overspend <= 2 * largest, "overspent {overspend} > 2 × {largest}");

    // The status-line script Claude Code would run shows it.
    let line = status_line(&gw.url, "carol-key");
    assert!(line.starts_with("Sonnet 4.5 · poolgate carol · today "), "{line}");
    assert!(line.ends_with(" · day 0 tok left"), "{line}");

    // Every route that asks a model: count_tokens, and Chat Completions in
    // OpenAI's shape.
    let r = Gateway::client()
        .post(format!("{}/v1/messages/count_tokens", gw.url))
        .header("x-api-key", "carol-key")
        .json(&json!({"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        (r.status().as_u16(), r.headers()["x-poolgate-key-limit"].to_str().unwrap()),
        (429, "budget_day_tokens")
    );
    let r = Gateway::client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .bearer_auth("carol-key")
        .json(&json!({"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let body: Value = r.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("budget"), "OpenAI's shape: {body}");
    assert!(body.get("type").is_none(), "not Anthropic's envelope: {body}");
    let before = mock.requests().len();

    // A restart: the budget is still spent (read back from the ledger).
    drop(gw);
    let gw = limited(&mock, &ledger, budget);
    assert_eq!(messages(&gw, "carol-key", "claude-sonnet-4-5", false).await.status(), 429);
    assert_eq!(mock.requests().len(), before, "nothing refused reached the upstream");
    // A larger budget (a reload would do the same) lets carol on.
    drop(gw);
    let gw = limited(&mock, &ledger, budget * 10);
    assert_eq!(messages(&gw, "carol-key", "claude-sonnet-4-5", false).await.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_outside_the_keys_list_is_a_403_and_a_per_minute_limit_says_when_to_retry() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let dir = tempdir::Dir::new("limits");
    let gw = limited(&mock, &dir.0.join("ledger.sqlite"), 1_000_000);
    let r = messages(&gw, "dan-key", "claude-sonnet-4-5", false).await;
    assert_eq!(r.status(), 403);
    assert_eq!(r.headers()["x-poolgate-key-limit"], "model_not_allowed");
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["type"], "permission_error");
    for _ in 0..3 {
        assert_eq!(messages(&gw, "dan-key", "claude-haiku-4-5", true).await.status(), 200);
    }
    let r = messages(&gw, "dan-key", "claude-haiku-4-5", false).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["x-poolgate-key-limit"], "requests_per_minute");
    let retry: u64 = r.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert!(r.headers().get("x-should-retry").is_none(), "a per-minute limit is worth retrying");
    // Other keys are not held by dan's limits.
    assert_eq!(messages(&gw, "carol-key", "claude-sonnet-4-5", false).await.status(), 200);
    let metrics = Gateway::client().get(format!("{}/metrics", gw.url)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("poolgate_refused_total{reason=\"key_limit\"} 2"), "{metrics}");
}

#[test]
fn a_budget_without_a_ledger_is_refused_at_start_as_at_any_reload() {
    let dir = tempdir::Dir::new("limits");
    let path = dir.0.join("poolgate.toml");
    let text = "[[server.client_keys]]\nname = \"carol\"\nsha256 = \"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\"\n\
                budget_usd_day = 5.0\nmodels = [\"claude-*-x\"]\n\n[ledger]\nfile = \"\"\n";
    std::fs::write(&path, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["check", "--config"])
        .arg(&path)
        .output_within(Duration::from_secs(60));
    let said = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("server.client_keys[0]: key `carol` has a budget, which needs the usage ledger"), "{said}");
    assert!(said.contains("server.client_keys[0].models: `claude-*-x` is not a model name or `prefix*`"), "{said}");
}

/// What `docs/statusline/poolgate-statusline.py` prints for `key`, given the
/// JSON Claude Code passes it.
pub(crate) fn status_line(url: &str, key: &str) -> String {
    use std::io::Write as _;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/statusline/poolgate-statusline.py");
    let mut child = std::process::Command::new("python3")
        .arg(script)
        .env("ANTHROPIC_BASE_URL", url)
        .env("ANTHROPIC_API_KEY", key)
        .env_remove("ANTHROPIC_AUTH_TOKEN")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"model":{"id":"claude-sonnet-4-5","display_name":"Sonnet 4.5"}}"#)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
