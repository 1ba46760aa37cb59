//! The usage ledger through the real binary: what each client key used, to
//! the token, as the mock reported it — over the Anthropic and OpenAI SDKs,
//! JSON and streamed, every route — and entries that outlive the process.

use std::process::Command;
use std::time::Duration;

use poolgate_mock_upstream::MockUpstream;
use serde_json::Value;

use crate::bounded::OutputWithin as _;
use crate::support::{self, Gateway, config, sum_usage as sum, tempdir, usage_of as tokens};

const ADMIN: &str = "ledger-admin";

fn keys(ledger: &str) -> String {
    format!(
        "[[server.client_keys]]\nname = \"alice\"\nkey_env = \"ALICE\"\nteam = \"core\"\n\n\
         [[server.client_keys]]\nname = \"bob\"\nkey_env = \"BOB\"\n\n[ledger]\n{ledger}\n"
    )
}

fn env() -> Vec<(&'static str, &'static str)> {
    vec![("KEY_A", "key-a"), ("ALICE", "alice-key"), ("BOB", "bob-key"), ("PG_ADMIN", ADMIN)]
}

/// `tests/e2e/usage_mixed.py` as `key`: what the Anthropic answers said.
async fn mixed_run(url: &str, key: &'static str, rounds: u32) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/e2e/usage_mixed.py");
    let url = url.to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(script)
            .arg(url)
            .arg(key)
            .arg(rounds.to_string())
            .output_within(Duration::from_secs(120))
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "mixed run failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
}

pub(crate) async fn own_usage(gw: &Gateway, key: &str) -> Value {
    let r = Gateway::client().get(format!("{}/v1/usage", gw.url)).header("x-api-key", key).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_per_key_is_what_the_mock_reported_to_the_token_on_every_route() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], &keys("flush_ms = 100")), &env());

    let alice_seen = mixed_run(&gw.url, "alice-key", 3).await;
    let alice = sum(&mock.reported_usage());
    let bob_seen = mixed_run(&gw.url, "bob-key", 2).await;
    let reported = mock.reported_usage();
    assert_eq!(reported.len(), 20, "4 Messages answers a round (count_tokens reports no usage)");
    let bob = sum(&reported[12..]);
    assert!(alice.cache_read_input_tokens > 0 && alice.cache_creation_input_tokens > 0, "{alice:?}");

    // The Anthropic SDK saw the cache use the mock reported (only its
    // requests mark a breakpoint), and part of the rest.
    let seen = tokens(&alice_seen["anthropic_seen"]);
    assert_eq!(seen.cache_read_input_tokens, alice.cache_read_input_tokens);
    assert!(0 < seen.output_tokens && seen.output_tokens < alice.output_tokens, "{seen:?} {alice:?}");

    // Each key's own view, this UTC month (a run that crosses midnight stays
    // in one month but for one second a month): to the token, every request
    // counted.
    let mine = own_usage(&gw, "alice-key").await;
    assert_eq!((mine["key"].as_str(), mine["team"].as_str()), (Some("alice"), Some("core")));
    let month = &mine["usage"][2];
    assert_eq!(month["period"], "month");
    assert_eq!(tokens(month), alice, "{mine}");
    assert_eq!(month["requests"], 15, "five requests a round, count_tokens included");
    assert!(month["cost_usd"].as_f64().unwrap() > 0.0);
    assert_eq!(tokens(&own_usage(&gw, "bob-key").await["usage"][2]), bob, "bob's month");
    assert_eq!(bob_seen["requests"], 10);

    // The operator's report, as CSV, by key.
    let csv = Gateway::client()
        .get(format!("{}/admin/usage?by=key&format=csv", gw.url))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 3, "{csv}");
    let row = |line: &str| -> Vec<String> { line.split(',').map(str::to_string).collect() };
    let alice_row = row(lines[1]);
    assert_eq!(
        alice_row[..6],
        [
            "alice",
            "15",
            &alice.input_tokens.to_string(),
            &alice.output_tokens.to_string(),
            &alice.cache_read_input_tokens.to_string(),
            &alice.cache_creation_input_tokens.to_string()
        ]
    );
    assert_eq!(row(lines[2])[0], "bob");

    // By team, model and account; every model is one the mock answered.
    let report = support::admin_json(&gw.url, "/admin/usage?by=team,model,account", ADMIN).await;
    let rows = report["rows"].as_array().unwrap();
    assert!(rows.iter().all(|r| r["account"] == "a" && r["model"] == "claude-sonnet-4-5"), "{report}");
    let core: Vec<&Value> = rows.iter().filter(|r| r["team"] == "core").collect();
    assert_eq!(core.len(), 1);
    assert_eq!(tokens(core[0]), alice);

    // The decision record and the metrics carry it too.
    let decisions = support::admin_json(&gw.url, "/admin/decisions?limit=1", ADMIN).await;
    assert!(decisions.to_string().contains("\"usage\""), "{decisions}");
    let metrics = Gateway::client().get(format!("{}/metrics", gw.url)).send().await.unwrap().text().await.unwrap();
    let line = format!(
        "poolgate_client_tokens_total{{key=\"alice\",model=\"claude-sonnet-4-5\",kind=\"output\"}} {}",
        alice.output_tokens
    );
    assert!(metrics.contains(&line), "{line} not in:\n{metrics}");
    assert!(metrics.contains("poolgate_ledger_up 1"), "{metrics}");
}

/// A gateway on `ledger` (a file outside its own directory, which goes with it).
fn gateway_on(mock: &MockUpstream, ledger: &std::path::Path, flush_ms: u64) -> Gateway {
    let setting = format!("file = \"{}\"\nflush_ms = {flush_ms}", ledger.display());
    Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], &keys(&setting)), &env())
}

async fn send(gw: &Gateway, n: usize) {
    for i in 0..n {
        let r = Gateway::client()
            .post(format!("{}/v1/messages", gw.url))
            .header("x-api-key", "alice-key")
            .json(&support::message("claude-sonnet-4-5", i % 2 == 0))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
}

async fn requests_kept(gw: &Gateway) -> u64 {
    let r = support::admin_json(&gw.url, "/admin/usage", ADMIN).await;
    r["rows"].as_array().unwrap().first().map_or(0, |row| row["requests"].as_u64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_loses_no_entry_answered_a_flush_interval_before_and_a_stop_loses_none() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let dir = tempdir::Dir::new("ledger");
    let ledger = dir.0.join("usage").join("ledger.sqlite");

    let mut gw = gateway_on(&mock, &ledger, 200);
    send(&gw, 12).await;
    // Once the writer committed them (within a flush interval of the last
    // answer, on an idle machine): written entries survive a SIGKILL.
    support::eventually("the 12 entries written", Duration::from_secs(10), async || {
        let h = support::admin_json(&gw.url, "/status", ADMIN).await["ledger"].clone();
        h["written"] == 12 && h["queued"] == 0
    })
    .await;
    gw.signal("KILL");
    assert!(gw.wait(Duration::from_secs(10)).is_some());
    drop(gw);

    // A flush interval far longer than the run: only the stop writes them.
    let mut gw = gateway_on(&mock, &ledger, 60_000);
    assert_eq!(requests_kept(&gw).await, 12, "every entry of the killed run");
    send(&gw, 5).await;
    gw.terminate();
    assert!(gw.wait(Duration::from_secs(30)).is_some_and(|s| s.success()), "{}", gw.log());
    drop(gw);

    let gw = gateway_on(&mock, &ledger, 60_000);
    assert_eq!(requests_kept(&gw).await, 17, "the stopped run's five, written at its stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_without_a_ledger_says_so_and_a_bad_report_says_why() {
    let mock = MockUpstream::start().await;
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], &keys("file = \"\"")), &env());
    let r = Gateway::client().get(format!("{}/v1/usage", gw.url)).header("x-api-key", "bob-key").send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["type"], "not_found_error");
    let r = Gateway::client().get(format!("{}/v1/usage", gw.url)).header("x-api-key", "nope").send().await.unwrap();
    assert_eq!(r.status(), 401);
    drop(gw);
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], &keys("flush_ms = 100")), &env());
    for (query, says) in [
        ("by=colour", "by=`colour`"),
        ("from=yesterday", "from=`yesterday`"),
        ("from=2026-02-01&to=2026-01-01", "not after"),
    ] {
        let r =
            Gateway::client().get(format!("{}/admin/usage?{query}", gw.url)).bearer_auth(ADMIN).send().await.unwrap();
        assert_eq!(r.status(), 400);
        let body: Value = r.json().await.unwrap();
        assert!(body["error"]["message"].as_str().unwrap().contains(says), "{body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_before_its_closing_count_is_charged_an_estimate_and_flagged() {
    let mock = MockUpstream::start().await;
    mock.account("key-a").push(poolgate_mock_upstream::Step::ResetMidStream { after_events: 5 });
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], &keys("flush_ms = 100")), &env());
    let r = Gateway::client()
        .post(format!("{}/v1/messages", gw.url))
        .header("x-api-key", "bob-key")
        .json(&support::message("claude-sonnet-4-5", true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await;
    let report = support::admin_json(&gw.url, "/admin/usage?key=bob", ADMIN).await;
    let row = &report["rows"][0];
    assert_eq!((row["requests"].as_u64(), row["usage_unknown"].as_u64()), (Some(1), Some(1)), "{report}");
    assert!(row["output_tokens"].as_u64().unwrap() > 1, "more than message_start's early count: {report}");
    assert!(row["input_tokens"].as_u64().unwrap() > 0, "{report}");
}
