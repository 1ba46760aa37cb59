//! Logs fit for a file, from the real binary with its stderr piped (as under
//! systemd or `2> poolgate.log`): no colour codes, `RUST_LOG` honoured unless
//! `POOLGATE_LOG` says otherwise, one short line per request with the full
//! decision record at debug — and a 400 that a client (the Anthropic Python
//! SDK here) reads in Anthropic's words, not the gateway's Rust types.

mod bounded;
mod support;

use std::process::Command;
use std::time::Duration;

use bounded::OutputWithin as _;
use poolgate_mock_upstream::MockUpstream;
use serde_json::Value;
use support::{Gateway, config, send_message};

const LIMIT: Duration = Duration::from_secs(10);

/// Starts a gateway over one account `a` at `base_url` with these log
/// variables (an empty value counts as unset) and `server.log_format`.
fn start(base_url: &str, poolgate_log: &str, rust_log: &str, format: &str) -> Gateway {
    let env =
        [("KEY_A", "key-a-secret"), ("PG_ADMIN", "admin"), ("POOLGATE_LOG", poolgate_log), ("RUST_LOG", rust_log)];
    let cfg = config(base_url, &[("a", "KEY_A")], "")
        .replace("[server]\n", &format!("[server]\nlog_format = \"{format}\"\n"));
    Gateway::start(&cfg, &env)
}

async fn served(gw: &Gateway) {
    let r = send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_piped_log_has_no_colour_and_rust_log_is_honoured() {
    let mock = MockUpstream::start().await;
    mock.account("key-a-secret");
    let gw = start(&mock.base_url(), "", "debug", "text");
    served(&gw).await;
    support::eventually("RUST_LOG=debug shows the decision record", LIMIT, async || {
        gw.log().contains("poolgate::decision")
    })
    .await;
    let log = gw.log();
    assert!(!log.contains("\x1b["), "no ANSI escapes in a piped log:\n{log:?}");
    assert!(log.contains("DEBUG poolgate::decision"), "{log}");
    assert!(log.contains(" INFO poolgate::request: answered request=1"), "{log}");
    assert!(!log.contains("key-a-secret"), "no credential in the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_request_is_one_info_line_and_its_record_is_at_debug() {
    let mock = MockUpstream::start().await;
    mock.account("key-a-secret");
    let gw = start(&mock.base_url(), "", "", "text");
    served(&gw).await;
    let r = Gateway::client().post(format!("{}/v1/messages", gw.url)).body("{}").send().await.unwrap();
    assert_eq!(r.status(), 415);
    support::eventually("a line per request", LIMIT, async || gw.log().matches("answered").count() == 2).await;
    let log = gw.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("poolgate::request")).collect();
    let ok = lines[0].split_once("answered ").unwrap().1;
    assert!(ok.starts_with("request=1 method=POST path=/v1/messages status=200 account=a ms="), "{ok}");
    let refused = lines[1].split_once("answered ").unwrap().1;
    assert!(refused.starts_with("request=2 method=POST path=/v1/messages status=415 account=- ms="), "{refused}");
    assert!(!log.contains("poolgate::decision") && !log.contains("\"attempts\""), "the record is at debug:\n{log}");
    assert!(!log.contains("key-a-secret"));

    // JSON logs are for machines: the whole record is in them by default.
    let gw = start(&mock.base_url(), "", "", "json");
    served(&gw).await;
    support::eventually("the record in the JSON log", LIMIT, async || gw.log().contains("poolgate::decision")).await;
    let log = gw.log();
    let record = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["target"] == "poolgate::decision")
        .unwrap();
    let record: Value = serde_json::from_str(record["fields"]["message"].as_str().unwrap()).unwrap();
    assert_eq!((record["account"].as_str(), record["path"].as_str()), (Some("a"), Some("/v1/messages")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poolgate_log_wins_over_rust_log() {
    // An account nobody listens on: every request logs a warning, then its line.
    // No cooldown, so the second request tries it too.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let cfg = config(&format!("http://{closed}"), &[("a", "KEY_A")], "[cooldowns]\nupstream_error_ms = 0\n");
    let env = [("KEY_A", "k"), ("PG_ADMIN", "admin"), ("POOLGATE_LOG", "warn"), ("RUST_LOG", "debug")];
    let gw = Gateway::start(&cfg, &env);
    for _ in 0..2 {
        let r = send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap();
        assert_eq!(r.status(), 502);
    }
    // The second warning comes after the first request's line would have.
    support::eventually("two warnings", LIMIT, async || gw.log().matches("upstream connection failed").count() >= 2)
        .await;
    let log = gw.log();
    assert!(!log.contains("answered") && !log.contains("DEBUG"), "POOLGATE_LOG=warn wins:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_hears_a_bad_field_in_anthropics_words() {
    let mock = MockUpstream::start().await;
    mock.account("key-a-secret");
    let gw = start(&mock.base_url(), "", "", "text");
    let script = r#"
import sys, anthropic
client = anthropic.Anthropic(base_url=sys.argv[1], api_key="client-key", max_retries=0)
try:
    client.messages.create(model=5, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
except anthropic.BadRequestError as e:
    print(e.body["error"]["type"], "|", e.body["error"]["message"])
"#;
    let url = gw.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3").args(["-c", script, &url]).output_within(Duration::from_secs(60))
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.trim(),
        "invalid_request_error | model: Input should be a valid string",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(mock.requests().is_empty());
}
