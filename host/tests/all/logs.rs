//! Logs fit for a file, from the real binary with its stderr piped (as under
//! systemd or `2> poolgate.log`): no colour codes, `RUST_LOG` honoured unless
//! `POOLGATE_LOG` says otherwise, one short line per request with the full
//! decision record at debug — and a 400 that a client (the Anthropic Python
//! SDK here) reads in Anthropic's words, not the gateway's Rust types.

use crate::bounded;
use crate::support;

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
    assert!(log.contains(" INFO poolgate::request: answered request="), "{log}");
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
    let (id, ok) = ok.strip_prefix("request=").unwrap().split_once(' ').unwrap();
    let id: u64 = id.parse().unwrap();
    assert!(
        ok.starts_with("method=POST path=/v1/messages status=200 account=a client=- model=claude-sonnet-4-5 ms="),
        "{ok}"
    );
    let refused = lines[1].split_once("answered ").unwrap().1;
    let next = format!("request={} method=POST path=/v1/messages status=415 account=- client=- model=- ms=", id + 1);
    assert!(refused.starts_with(&next), "{refused}");
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
    let record = &record["fields"]["record"];
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

/// The config file of a gateway a test edits: a pool of one account `a` at
/// `base_url`, a client key `team` (in `PG_CLIENT`), and `[server]` lines.
fn keyed_config(base_url: &str, server: &str) -> String {
    config(base_url, &[("a", "KEY_A")], "[[server.client_keys]]\nname = \"team\"\nkey_env = \"PG_CLIENT\"\n")
        .replace("[server]\n", &format!("[server]\n{server}"))
}

/// Every line `gw` wrote so far, parsed: the test fails on a line that is not
/// one JSON object.
fn json_lines(gw: &Gateway) -> Vec<Value> {
    let log = gw.log();
    log.lines()
        .map(|l| match serde_json::from_str::<Value>(l) {
            Ok(v) if v.is_object() => v,
            _ => panic!("a stderr line that is not a JSON object: {l:?}\nin:\n{log}"),
        })
        .collect()
}

fn sighup(gw: &Gateway) {
    let _ = Command::new("kill").arg("-HUP").arg(gw.pid().to_string()).status();
}

/// Two problems the reload refuses, on two lines of its message.
const BROKEN: &str = "[gateway]\nmax_attempts = \"many\"\n[cooldowns]\nbogus_ms = 5\n";

/// `POOLGATE_LOG_FORMAT=json`: every line on stderr is a JSON object — the
/// banner, a warning about the environment written before the subscriber
/// exists, the request lines, the decision records (objects, not strings), a
/// refused reload (its problems in one string) and the shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_json_mode_every_stderr_line_is_a_json_object() {
    let mock = MockUpstream::start().await;
    mock.account("key-a-secret");
    let dir = support::tempdir::Dir::new("json-logs");
    let path = dir.0.join("poolgate.toml");
    let cfg = keyed_config(&mock.base_url(), "");
    std::fs::write(&path, &cfg).unwrap();
    let env = [
        ("KEY_A", "key-a-secret"),
        ("PG_ADMIN", "admin"),
        ("PG_CLIENT", "client-secret"),
        ("POOLGATE_LOG_FORMAT", "json"),
        // Not a filter: warned about, and the default (records included) applies.
        ("POOLGATE_LOG", "poolgate=loud"),
        ("RUST_LOG", ""),
    ];
    let mut gw = Gateway::start_file(&path, &env, dir);
    let client = Gateway::client();
    let r = client
        .post(format!("{}/v1/messages", gw.url))
        .header("x-api-key", "client-secret")
        .json(&support::message("claude-sonnet-4-5", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let id = r.headers()["x-poolgate-request-id"].to_str().unwrap().parse::<u64>().unwrap();
    let _ = r.bytes().await;
    std::fs::write(&path, format!("{cfg}{BROKEN}")).unwrap();
    support::eventually("the refused reload", LIMIT, async || gw.log().contains("reload refused")).await;
    support::eventually("the decision record", LIMIT, async || gw.log().contains("poolgate::decision")).await;
    gw.terminate();
    assert!(gw.wait(Duration::from_secs(40)).is_some_and(|s| s.success()), "{}", gw.log());

    let lines = json_lines(&gw);
    let find = |what: &str| {
        lines
            .iter()
            .find(|v| v["fields"]["message"].as_str().is_some_and(|m| m.contains(what)))
            .unwrap_or_else(|| panic!("no line saying {what:?} in {lines:#?}"))
    };
    let banner = find("poolgate listening on http://");
    assert_eq!(banner["fields"]["addr"].as_str(), gw.url.strip_prefix("http://"));
    assert_eq!(banner["fields"]["accounts"], 1);
    let warning = find("ignoring POOLGATE_LOG=");
    assert_eq!(warning["level"], "WARN");
    let refused = find("reload refused");
    let error = refused["fields"]["error"].as_str().unwrap();
    assert!(error.contains("max_attempts") && error.contains("bogus_ms") && error.contains('\n'), "{error}");
    assert!(find("shutting down")["timestamp"].is_string());

    let request = lines.iter().find(|v| v["target"] == "poolgate::request").unwrap();
    let f = &request["fields"];
    assert_eq!((f["request"].as_u64(), f["status"].as_u64()), (Some(id), Some(200)), "{request}");
    assert_eq!(
        (&f["client"], &f["model"], &f["account"]),
        (&Value::from("team"), &"claude-sonnet-4-5".into(), &"a".into())
    );

    let decision = lines.iter().find(|v| v["target"] == "poolgate::decision").unwrap();
    let record = &decision["fields"]["record"];
    assert!(record.is_object(), "the record is an object, not a string: {decision}");
    assert_eq!((record["id"].as_u64(), record["client"].as_str()), (Some(id), Some("team")));
    assert_eq!(record["attempts"][0]["account"], "a");
    assert_eq!(record["outcome"], "complete");
    let log = gw.log();
    assert!(!log.contains("key-a-secret") && !log.contains("client-secret"), "no secret in the log");
}

/// The error a start fails with, and a command line clap refuses, are one
/// JSON line when JSON was asked for — by the file itself (read before the
/// rest of it validates) or by the environment — and one line in text mode.
#[test]
fn a_failed_start_is_one_line_in_its_format() {
    let dir = support::tempdir::Dir::new("bad-start");
    let path = dir.0.join("poolgate.toml");
    let bad = keyed_config("http://127.0.0.1:9", "log_format = \"json\"\n") + BROKEN;
    std::fs::write(&path, &bad).unwrap();
    let serve = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_poolgate"));
        cmd.arg("serve").args(args).env_remove("POOLGATE_LOG_FORMAT").env_remove("POOLGATE_CONFIG");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output_within(Duration::from_secs(60));
        assert!(!out.status.success());
        String::from_utf8(out.stderr).unwrap()
    };
    let path_arg = path.to_str().unwrap();
    let env = [("KEY_A", "k"), ("PG_ADMIN", "admin"), ("PG_CLIENT", "c")];
    let stderr = serve(&["--config", path_arg, "--listen", "127.0.0.1:0"], &env);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let v: Value = serde_json::from_str(&stderr).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    let message = v["fields"]["message"].as_str().unwrap();
    assert_eq!(v["level"], "ERROR");
    assert!(message.contains("max_attempts") && message.contains("bogus_ms"), "{message}");

    // Text, by the flag over the file: still one line, its breaks escaped.
    let stderr = serve(&["--config", path_arg, "--listen", "127.0.0.1:0", "--log-format", "text"], &env);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("ERROR poolgate: ") && stderr.contains("\\n") && stderr.contains("bogus_ms"), "{stderr}");

    // A typo on the command line of a JSON-logging unit.
    let stderr = serve(&["--config", path_arg, "--lisen", "x"], &[("POOLGATE_LOG_FORMAT", "json")]);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let v: Value = serde_json::from_str(&stderr).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    assert!(v["fields"]["message"].as_str().unwrap().contains("--lisen"), "{v}");
}

/// A reload refused for two problems is one line in text mode, and the file
/// watcher and a SIGHUP meeting the same file do not write the problems out
/// twice (nor does the trigger add a line of its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_reload_is_one_line_logged_once() {
    let mock = MockUpstream::start().await;
    mock.account("key-a-secret");
    let dir = support::tempdir::Dir::new("refused-reload");
    let path = dir.0.join("poolgate.toml");
    let cfg = keyed_config(&mock.base_url(), "");
    std::fs::write(&path, &cfg).unwrap();
    let env = [("KEY_A", "key-a-secret"), ("PG_ADMIN", "admin"), ("PG_CLIENT", "c")];
    let gw = Gateway::start_file(&path, &env, dir);
    std::fs::write(&path, format!("{cfg}{BROKEN}")).unwrap();
    support::eventually("the file watch's refusal", LIMIT, async || gw.log().contains("reload refused")).await;
    sighup(&gw);
    support::eventually("the SIGHUP's refusal", LIMIT, async || gw.log().contains("refused again")).await;
    let status = gw.admin_json("/status", "admin").await;
    assert_eq!(status["config"]["last_reload"]["consecutive_failures"], 2, "both refusals counted: {status}");
    // The file watch looks every 100 ms: time for a duplicate line to show up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = gw.log();
    let with_problems: Vec<&str> = log.lines().filter(|l| l.contains("bogus_ms")).collect();
    assert_eq!(with_problems.len(), 1, "the problems once, on one line:\n{log}");
    let line = with_problems[0];
    assert!(line.contains("ERROR") && line.contains("max_attempts") && line.contains("\\n"), "{line}");
    assert!(log.lines().any(|l| l.contains("WARN") && l.contains("trigger=\"sighup\"") && l.contains("refusals=2")));
    assert!(!log.contains("not applied") && !log.contains("SIGHUP reload refused"), "{log}");
}

/// Request ids are unique across restarts: a gateway started after another
/// on the same config hands out none the first did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_never_repeat_across_a_restart() {
    let mock = MockUpstream::start().await;
    mock.account("key-a-secret");
    let cfg = config(&mock.base_url(), &[("a", "KEY_A")], "");
    let env = [("KEY_A", "key-a-secret"), ("PG_ADMIN", "admin")];
    let mut runs = Vec::new();
    for _ in 0..2 {
        let gw = Gateway::start(&cfg, &env);
        let mut ids = Vec::new();
        for i in 0..4 {
            // Served and refused requests draw from the same counter.
            let r = if i == 3 {
                Gateway::client().get(format!("{}/nowhere", gw.url)).send().await.unwrap()
            } else {
                send_message(&Gateway::client(), &gw.url, "claude-sonnet-4-5").await.unwrap()
            };
            ids.push(r.headers()["x-poolgate-request-id"].to_str().unwrap().parse::<u64>().unwrap());
        }
        drop(gw);
        runs.push(ids);
    }
    let (first, second) = (&runs[0], &runs[1]);
    assert!(first.windows(2).all(|w| w[1] == w[0] + 1), "{first:?}");
    assert!(second[0] > *first.last().unwrap(), "the second run starts past the first: {runs:?}");
    // Below 2^53: exact wherever the id is read as a JSON number.
    assert!(second.iter().all(|id| *id < 1 << 53), "{runs:?}");
}
