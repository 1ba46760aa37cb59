//! Claude Code's gateway contract, line by line, through the real binary
//! (docs/claude-code.md names the test of each line): what Claude Code sends
//! reaches the account byte for byte; what the account answers reaches
//! Claude Code as it was sent; what poolgate answers itself reads to Claude
//! Code as Anthropic's would; and the streams poolgate writes itself never
//! go silent long enough for a client's watchdog.
//!
//! The byte-for-byte checks send raw HTTP over a socket, so that nothing
//! between the test and the gateway (a client library normalising headers)
//! could hide a change; the last test drives the real Claude Code CLI through
//! a recording tap and compares what it sent with what the account received.
//!
//! The tests are here; `wire` holds the raw HTTP they speak and read back,
//! `upstreams` what stands around the gateway (scripted upstreams, the tap,
//! the CLI).

mod upstreams;
mod wire;

use crate::support;

use std::time::Duration;

use poolgate_mock_upstream::{MockUpstream, Quota, Step};
use serde_json::{Value, json};
use support::{Gateway, config, message};
use upstreams::{SCRIPTED_STREAM, claude_cli, scripted_upstream, slow_openai_backend, tap};
use wire::{CC_BODY, CC_HEADERS, all, anthropic_lines, cc_request, raw, requests_in, sha};

const ADMIN: &str = "cc-admin";

/// H-1, H-2, H-5, B-1 (E-1: the query stays): every `anthropic-*` request
/// header reaches an API-key account byte for byte — repeated lines stay
/// lines, unknown flags and headers pass — and the body's bytes are the
/// client's. A seat's request gets the same lines plus the OAuth flag as a
/// line of its own (H-3), never a rewrite of the client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_claude_code_sends_reaches_the_account_byte_for_byte() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    mock.account("seat-token");
    let mut cfg = config(&mock.base_url(), &[("a", "KEY_A")], "");
    cfg.push_str(&format!(
        "[[accounts]]\nid = \"seat\"\nkind = \"oauth\"\napi_key_env = \"SEAT_TOKEN\"\nbase_url = \"{}\"\nenabled = \
         false\n\n[[server.client_keys]]\nname = \"dev\"\nkey_env = \"DEV_KEY\"\n",
        mock.base_url()
    ));
    let env = [("KEY_A", "key-a"), ("SEAT_TOKEN", "seat-token"), ("DEV_KEY", "dev-key"), ("PG_ADMIN", ADMIN)];
    let gw = Gateway::start(&cfg, &env);
    let sent: Vec<(String, String)> =
        CC_HEADERS.iter().map(|(k, v)| (k.to_ascii_lowercase(), v.trim_start().to_string())).collect();

    let (status, _, body) = raw(&gw, &cc_request("/v1/messages?beta=true", "dev-key", CC_BODY)).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let rec = mock.requests().pop().unwrap();
    assert_eq!(rec.path, "/v1/messages?beta=true");
    assert_eq!(rec.credential, "key-a");
    assert_eq!(anthropic_lines(&rec.headers), anthropic_lines(&sent), "every anthropic-* line, in order");
    assert_eq!(sha(&rec.body), sha(CC_BODY.as_bytes()), "the body, byte for byte");
    for (name, value) in [("x-claude-code-session-id", CC_HEADERS[3].1), ("user-agent", CC_HEADERS[2].1)] {
        assert_eq!(rec.header(name), Some(value), "{name}");
    }
    assert_eq!(rec.header("x-api-key"), Some("key-a"), "the account's credential, never the client's");

    // The same request to a seat: the client's lines byte for byte, the OAuth
    // flag appended to the last one (one header stays as many lines as sent).
    std::fs::write(
        gw.config_path(),
        cfg.replace("enabled = false\n", "").replace("id = \"a\"", "id = \"a\"\nenabled = false"),
    )
    .unwrap();
    reload(&gw).await;
    let (status, _, _) = raw(&gw, &cc_request("/v1/messages", "dev-key", CC_BODY)).await;
    assert_eq!(status, 200);
    let rec = mock.requests().pop().unwrap();
    assert_eq!(rec.credential, "seat-token");
    let mut expected = anthropic_lines(&sent);
    let last = expected.iter().rposition(|(n, _)| n == "anthropic-beta").unwrap();
    expected[last].1.push_str(",oauth-2025-04-20");
    assert_eq!(anthropic_lines(&rec.headers), expected);
    assert_eq!(sha(&rec.body), sha(CC_BODY.as_bytes()));
}

async fn reload(gw: &Gateway) {
    let r = Gateway::client().post(format!("{}/admin/reload", gw.url)).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}

/// ER-1: the answer of the account that served reaches
/// the client as it was sent — the whole `anthropic-ratelimit-unified-*`
/// family (a member no list knows included), `request-id`, `x-should-retry`
/// and `retry-after` (made whole seconds when it was not), an error's status
/// and body untouched — also after a failover, where it is the serving
/// account's answer that speaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_serving_account_answers_reaches_claude_code_as_sent() {
    let mock = MockUpstream::start().await;
    let a = mock.account("key-a");
    let b = mock.account("key-b");
    let cfg = config(&mock.base_url(), &[("a", "KEY_A"), ("b", "KEY_B")], "");
    let gw = Gateway::start(&cfg, &[("KEY_A", "key-a"), ("KEY_B", "key-b"), ("PG_ADMIN", ADMIN)]);
    let unified = vec![
        ("anthropic-ratelimit-unified-status".to_string(), "allowed_warning".to_string()),
        ("anthropic-ratelimit-unified-5h-utilization".into(), "0.42".into()),
        ("anthropic-ratelimit-unified-5h-reset".into(), "1999999999".into()),
        ("anthropic-ratelimit-unified-representative-claim".into(), "five_hour".into()),
        ("anthropic-ratelimit-unified-zz-probe".into(), "1".into()),
        ("request-id".into(), "req_zz".into()),
        ("x-should-retry".into(), "true".into()),
        ("retry-after".into(), "7".into()),
    ];
    let answer = json!({"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-5",
        "content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","stop_sequence":null,
        "usage":{"input_tokens":3,"output_tokens":1}});
    // a fails over (529); b's answer is the one relayed.
    a.push(Step::Overloaded);
    b.push(Step::Status { status: 200, body: answer.clone(), headers: unified.clone() });
    let request = cc_request("/v1/messages", "", CC_BODY);
    let (status, headers, body) = raw(&gw, &request).await;
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap(), answer);
    for (name, value) in &unified {
        assert_eq!(all(&headers, name), [value.as_str()], "{name}");
    }
    assert_eq!(all(&headers, "x-poolgate-account"), ["b"]);

    // An error is the account's: status, body and headers as sent; a
    // fractional retry-after goes out in whole seconds.
    let error = json!({"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 250000 tokens > 200000 maximum"},"request_id":"req_400"});
    let headers_400 = vec![
        ("request-id".to_string(), "req_400".to_string()),
        ("x-should-retry".into(), "false".into()),
        ("retry-after".into(), "1.5".into()),
    ];
    // (a cools after its 529, and the session is bound to b: b answers.)
    b.push(Step::Status { status: 400, body: error.clone(), headers: headers_400 });
    let (status, headers, body) = raw(&gw, &request).await;
    assert_eq!(status, 400);
    assert_eq!(body, serde_json::to_vec(&error).unwrap(), "the error body, byte for byte");
    assert_eq!(all(&headers, "request-id"), ["req_400"]);
    assert_eq!(all(&headers, "x-should-retry"), ["false"]);
    assert_eq!(all(&headers, "retry-after"), ["2"]);
}

/// ER-6, R-1, R-2: when the whole pool is out of plan quota, poolgate's own
/// 429 carries what Anthropic's would — unified status `rejected`, the
/// soonest reset, the window that binds — with `retry-after` in whole
/// seconds, so Claude Code shows the limit and when it lifts. A full queue
/// is a throttle, not a plan limit: no unified headers, so Claude Code backs
/// off and retries (docs/claude-code.md, why).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_out_of_quota_answers_as_anthropic_would_and_a_full_queue_as_a_throttle() {
    let mock = MockUpstream::start().await;
    let now = poolgate::clock::system_time().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    for (key, reset) in [("key-a", now + 3_000), ("key-b", now + 2_000)] {
        let acct = mock.account(key);
        // A 5h window spent, resetting at `reset`.
        acct.set_quota(Quota::unified_at(1.0, 0.5, reset - 5 * 3600));
        acct.push(Step::RateLimited { unified: true, retry_after: None });
    }
    let cfg = config(&mock.base_url(), &[("a", "KEY_A"), ("b", "KEY_B")], "");
    let gw = Gateway::start(&cfg, &[("KEY_A", "key-a"), ("KEY_B", "key-b"), ("PG_ADMIN", ADMIN)]);
    let (status, headers, body) = raw(&gw, &cc_request("/v1/messages", "", CC_BODY)).await;
    assert_eq!(status, 429, "{}", String::from_utf8_lossy(&body));
    assert_eq!(all(&headers, "anthropic-ratelimit-unified-status"), ["rejected"]);
    let reset: u64 = all(&headers, "anthropic-ratelimit-unified-reset")[0].parse().unwrap();
    assert!(reset.abs_diff(now + 2_000) <= 2, "the soonest reset: {reset} vs {}", now + 2_000);
    assert_eq!(all(&headers, "anthropic-ratelimit-unified-representative-claim"), ["five_hour"]);
    let retry: u64 = all(&headers, "retry-after")[0].parse().expect("retry-after in whole seconds");
    assert!(retry.abs_diff(2_000) <= 2, "{retry}");
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_error");

    // A full queue: one account, one slot held by a slow stream, no queue.
    let mock = MockUpstream::start().await;
    let a = mock.account("key-a");
    a.push(Step::SlowStream { chunk_delay_ms: 400 });
    let cfg = config(&mock.base_url(), &[("a", "KEY_A")], "[gateway]\nqueue_max = 0\n")
        .replace("base_url", "max_in_flight = 1\nbase_url");
    let gw = Gateway::start(&cfg, &[("KEY_A", "key-a"), ("PG_ADMIN", ADMIN)]);
    let held = Gateway::client()
        .post(format!("{}/v1/messages", gw.url))
        .header("anthropic-version", "2023-06-01")
        .json(&message("claude-sonnet-4-5", true))
        .send()
        .await
        .unwrap();
    assert_eq!(held.status(), 200);
    let (status, headers, _) = raw(&gw, &cc_request("/v1/messages", "", CC_BODY)).await;
    assert_eq!(status, 429);
    assert_eq!(all(&headers, "x-poolgate-queue"), ["queue_full"]);
    assert!(all(&headers, "anthropic-ratelimit-unified-status").is_empty(), "a throttle: {headers:?}");
    assert!(all(&headers, "retry-after")[0].parse::<u64>().is_ok());
    drop(held);
}

/// E-4, D-2, D-3, D-4: the startup probes are answered at once without a
/// credential, and model discovery (`GET /v1/models?limit=1000` with the
/// client's key, as Claude Code sends it) is one page: `has_more: false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_are_answered_at_once_and_discovery_is_one_page() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let mut cfg = config(&mock.base_url(), &[("a", "KEY_A")], "");
    cfg.push_str("[[server.client_keys]]\nname = \"dev\"\nkey_env = \"DEV_KEY\"\n");
    let gw = Gateway::start(&cfg, &[("KEY_A", "key-a"), ("DEV_KEY", "dev-key"), ("PG_ADMIN", ADMIN)]);
    for path in ["/", "/api/hello"] {
        let started = poolgate::clock::machine_instant();
        let (status, _, body) =
            raw(&gw, format!("HEAD {path} HTTP/1.1\r\nHost: g\r\nConnection: close\r\n\r\n").as_bytes()).await;
        assert_eq!(status, 200, "HEAD {path}");
        assert!(body.is_empty());
        // Generous: the point is "no upstream round trip, no auth dance".
        assert!(started.elapsed() < Duration::from_secs(2), "HEAD {path} took {:?}", started.elapsed());
    }
    assert!(mock.requests().is_empty(), "a probe never reaches an account");
    let r = Gateway::client()
        .get(format!("{}/v1/models?limit=1000", gw.url))
        .header("x-api-key", "dev-key")
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let page: Value = r.json().await.unwrap();
    assert_eq!(page["has_more"], false, "{page}");
    assert!(page["data"].as_array().is_some_and(|d| !d.is_empty() && d.iter().all(|m| m["id"].is_string())));
    assert_eq!(mock.requests().pop().unwrap().path, "/v1/models?limit=1000");
}

/// ST-5: a stream poolgate writes itself never stays silent longer than
/// `gateway.stream_keepalive_ms` — an OpenAI-shaped client's translation
/// (Anthropic's pings have no OpenAI form) gets SSE comments, an Anthropic
/// client answered by a fallback backend gets Anthropic's `ping` events — and
/// the content arrives whole around them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_poolgate_writes_itself_are_kept_alive() {
    let mock = MockUpstream::start().await;
    let a = mock.account("key-a");
    a.push(Step::SlowStream { chunk_delay_ms: 400 });
    let backend = slow_openai_backend(Duration::from_millis(500)).await;
    let extra = format!(
        "[gateway]\nstream_keepalive_ms = 100\n\n[[fallback]]\nname = \"local\"\nbase_url = \"{backend}\"\nmodel = \
         \"m\"\n"
    );
    let gw = Gateway::start(
        &config(&mock.base_url(), &[("a", "KEY_A")], &extra),
        &[("KEY_A", "key-a"), ("PG_ADMIN", ADMIN)],
    );
    let chat = json!({"model":"claude-sonnet-4-5","stream":true,"messages":[{"role":"user","content":"hi"}]});
    let text = Gateway::client()
        .post(format!("{}/v1/chat/completions", gw.url))
        .json(&chat)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let pings = text.matches(": keep-alive\n\n").count();
    assert!(pings >= 3, "comments in the silences: {pings} in\n{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let content: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect();
    assert_eq!(content, poolgate_mock_upstream::DEFAULT_TEXT);

    // The pool parked (a 429 with unified headers): the fallback answers, slowly.
    a.push(Step::RateLimited { unified: true, retry_after: Some("600".into()) });
    let text = Gateway::client()
        .post(format!("{}/v1/messages", gw.url))
        .header("anthropic-version", "2023-06-01")
        .json(&message("claude-sonnet-4-5", true))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let pings = text.matches("event: ping\ndata: {\"type\":\"ping\"}\n\n").count();
    assert!(pings >= 3, "{pings} pings in\n{text}");
    assert!(text.contains("event: message_stop"), "{text}");
    assert!(text.contains("\"from the \"") && text.contains("\"fallback\""), "{text}");
}

/// ST-1 to ST-5, R-4: a stream is relayed as it arrives — each event reaches
/// the client while later ones are still to come — and whole: the client's
/// bytes are the upstream's, pings and comments included, through
/// `message_stop` and the usage-only `message_delta` after it, with the
/// upstream's `content-type`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_relayed_as_it_arrives_byte_for_byte() {
    let gap = Duration::from_millis(300);
    let upstream = scripted_upstream(gap).await;
    let gw = Gateway::start(&config(&upstream, &[("a", "KEY_A")], ""), &[("KEY_A", "key-a"), ("PG_ADMIN", ADMIN)]);
    let started = poolgate::clock::machine_instant();
    let mut r = Gateway::client()
        .post(format!("{}/v1/messages", gw.url))
        .header("anthropic-version", "2023-06-01")
        .json(&message("claude-sonnet-4-5", true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["content-type"], "text/event-stream; charset=utf-8");
    assert_eq!(r.headers()["request-id"], "req_stream");
    let mut got = Vec::new();
    let mut first_at = None;
    while let Some(chunk) = r.chunk().await.unwrap() {
        first_at.get_or_insert(started.elapsed());
        got.extend_from_slice(&chunk);
    }
    let total = started.elapsed();
    assert_eq!(String::from_utf8(got).unwrap(), SCRIPTED_STREAM.concat(), "the upstream's bytes, whole");
    let whole = gap * (SCRIPTED_STREAM.len() as u32 - 1);
    assert!(total >= whole, "{total:?}");
    // The first event came long before the stream ended: nothing buffered.
    assert!(first_at.unwrap() < whole / 2, "first byte after {:?} of {total:?}", first_at.unwrap());
}

/// The real Claude Code CLI, through a recording tap, against the gateway
/// and the mock: the bytes it sent — every `anthropic-*` line and the body —
/// are what the account received, and what the account answered (the unified
/// family, `request-id`) is what Claude Code read; and what its key used, in
/// the ledger, is what the mock reported, to the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_claude_code_cli_through_a_recording_tap() {
    let Some(claude) = claude_cli() else {
        assert!(
            std::env::var_os("POOLGATE_REQUIRE_CLAUDE").is_none(),
            "POOLGATE_REQUIRE_CLAUDE is set but no Claude Code CLI was found (POOLGATE_CLAUDE or claude on PATH)"
        );
        eprintln!("skipped: no Claude Code CLI (set POOLGATE_CLAUDE, or run ./test.sh, which installs it)");
        return;
    };
    let mock = MockUpstream::start().await;
    let a = mock.account("key-a");
    let mut quota = Quota::unified(0.42, 0.17);
    quota.extra.push(("anthropic-ratelimit-unified-zz-probe".into(), "1".into()));
    a.set_quota(quota);
    let mut cfg = config(&mock.base_url(), &[("a", "KEY_A")], "");
    cfg.push_str("[[server.client_keys]]\nname = \"dev\"\nkey_env = \"DEV_KEY\"\n");
    let gw = Gateway::start(&cfg, &[("KEY_A", "key-a"), ("DEV_KEY", "dev-key"), ("PG_ADMIN", ADMIN)]);
    let (url, taped) = tap(gw.url.trim_start_matches("http://").to_string()).await;
    let home = support::tempdir::Dir::new("cc-home");
    let out = tokio::process::Command::new(&claude)
        .args(["-p", "say hi", "--tools", "", "--output-format", "json"])
        .env("HOME", &home.0)
        .env("ANTHROPIC_BASE_URL", &url)
        .env("ANTHROPIC_API_KEY", "dev-key")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env_remove("ANTHROPIC_AUTH_TOKEN")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out).await.expect("claude finished").unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "claude failed: {printed}\n{}", String::from_utf8_lossy(&out.stderr));
    let result: Value = serde_json::from_str(printed.trim()).unwrap_or_else(|_| panic!("{printed}"));
    assert_eq!(result["is_error"], false, "{result}");
    assert!(result["result"].as_str().is_some_and(|r| r.contains("mock upstream")), "{result}");

    let (to_gateway, to_client) = {
        let taped = taped.lock();
        (taped.to_gateway.clone(), taped.to_client.concat())
    };
    let sent: Vec<_> = to_gateway.iter().flat_map(|c| requests_in(c)).collect();
    let turns: Vec<_> = sent.iter().filter(|(line, _, _)| line.starts_with("POST /v1/messages")).collect();
    assert!(
        !turns.is_empty(),
        "Claude Code sent no Messages request: {:?}",
        sent.iter().map(|s| &s.0).collect::<Vec<_>>()
    );
    let received: Vec<_> = mock.requests().into_iter().filter(|r| r.path.starts_with("/v1/messages")).collect();
    assert_eq!(received.len(), turns.len());
    for ((line, headers, body), rec) in turns.iter().zip(&received) {
        assert!(line.contains(&rec.path), "{line} vs {}", rec.path);
        assert_eq!(anthropic_lines(&rec.headers), anthropic_lines(headers), "the anthropic-* lines Claude Code sent");
        assert_eq!(sha(&rec.body), sha(body), "the body Claude Code sent");
    }
    // What Claude Code read: the account's unified family and request id.
    let answered = String::from_utf8_lossy(&to_client).to_ascii_lowercase();
    for needle in [
        "anthropic-ratelimit-unified-status: allowed",
        "anthropic-ratelimit-unified-5h-utilization: 0.42",
        "anthropic-ratelimit-unified-zz-probe: 1",
        "request-id: req_",
    ] {
        assert!(answered.contains(needle), "{needle} missing in what Claude Code read:\n{answered}");
    }

    // What Claude Code's key used, as the gateway's ledger counts it, is what
    // the mock reported — to the token, cache reads and writes included.
    let reported = support::sum_usage(&mock.reported_usage());
    assert!(reported.output_tokens > 0 && reported.cache_creation_input_tokens > 0, "{reported:?}");
    let mine = crate::usage_ledger::own_usage(&gw, "dev-key").await;
    assert_eq!(mine["key"], "dev");
    assert_eq!(support::usage_of(&mine["usage"][2]), reported, "{mine}");
    let report = support::admin_json(&gw.url, "/admin/usage?by=key", ADMIN).await;
    assert_eq!(support::usage_of(&report["rows"][0]), reported, "{report}");
}
