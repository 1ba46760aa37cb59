//! A failing plugin never costs a request — inside `poolgate serve`, the way it
//! runs in production, not only in the CLI.
//!
//! Each test starts the real binary in front of the mock upstream with a
//! hostile plugin in its chain and drives at least 100 requests through it
//! (four at a time), while a prober checks that `/healthz` keeps answering
//! within 50 ms and a sampler watches the gateway's resident memory. Every
//! request must be served (200), each failure recorded with its cause, the
//! breaker must open where it should, and memory must stay under a ceiling. The
//! last test swaps each hostile plugin in under load: no request may fail.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use poolgate_mock_upstream::MockUpstream;
use serde_json::{Value, json};
use support::{Gateway, send_message, tempdir};

const ADMIN: &str = "faults-admin";
const REQUESTS: usize = 120;
const CONCURRENCY: usize = 4;
/// The most `/healthz` may take while a plugin misbehaves.
const HEALTHZ_MS: u128 = 50;

fn misbehave() -> String {
    poolgate::artifacts::test_guest("misbehave").expect("the misbehave guest").to_string()
}

/// A gateway with two accounts and `stages` (TOML `[[policy.chain]]` tables).
fn start(mock: &MockUpstream, dir: tempdir::Dir, stages: &str) -> Gateway {
    mock.account("key-a");
    mock.account("key-b");
    let config = format!(
        "[server]\nadmin_token_env = \"PG_ADMIN\"\ndecisions_kept = 1000\n\n\
         [[accounts]]\nid = \"a\"\napi_key_env = \"KEY_A\"\nbase_url = \"{base}\"\n\n\
         [[accounts]]\nid = \"b\"\napi_key_env = \"KEY_B\"\nbase_url = \"{base}\"\n\n{stages}",
        base = mock.base_url()
    );
    let path = dir.0.join("poolgate.toml");
    std::fs::write(&path, config).unwrap();
    Gateway::start_file(&path, &[("KEY_A", "key-a"), ("KEY_B", "key-b"), ("PG_ADMIN", ADMIN)], dir)
}

/// The model the traffic asks for. The misbehave guest faults only for it, so
/// a hostile plugin passes the smoke test at load (another model) and fails on
/// live traffic — the worst case: nothing stops it before requests reach it.
const MODEL: &str = "claude-haiku-4-5";

/// One misbehave stage with `options` (a TOML inline table body; empty for a
/// plugin that takes none), then headroom.
fn hostile(plugin: &str, options: &str, timeout_ms: u64) -> String {
    let config =
        if options.is_empty() { String::new() } else { format!("config = {{ {options}, on_model = \"{MODEL}\" }}\n") };
    format!(
        "[[policy.chain]]\nplugin = \"{plugin}\"\nname = \"hostile\"\ntimeout_ms = {timeout_ms}\n{config}\n\
         [[policy.chain]]\nplugin = \"builtin:headroom\"\n"
    )
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// What a run through the gateway saw.
struct Run {
    statuses: Vec<u16>,
    /// Response headers of interest, per request: (x-poolgate-reason, x-poolgate-policy-error).
    headers: Vec<(String, String)>,
    slowest_request: Duration,
    slowest_healthz: Duration,
    peak_rss_kib: u64,
}

impl Run {
    fn assert_all_served(&self, what: &str) {
        let failed: Vec<_> = self.statuses.iter().filter(|s| **s != 200).collect();
        assert!(failed.is_empty(), "{what}: {} of {} requests failed: {failed:?}", failed.len(), self.statuses.len());
        assert!(self.statuses.len() >= 100, "{what}: only {} requests", self.statuses.len());
        assert!(
            self.slowest_healthz.as_millis() < HEALTHZ_MS,
            "{what}: /healthz took {:?} while the plugin misbehaved",
            self.slowest_healthz
        );
    }
}

/// Drives `n` requests, `CONCURRENCY` at a time, while probing `/healthz` and
/// sampling the gateway's memory.
async fn drive(gw: &Gateway, n: usize) -> Run {
    let done = Arc::new(AtomicBool::new(false));
    let slowest_healthz = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(rss_kib(gw.pid())));
    let prober = {
        let (url, done, slowest, peak, pid) =
            (gw.url.clone(), done.clone(), slowest_healthz.clone(), peak.clone(), gw.pid());
        tokio::spawn(async move {
            let client = Gateway::client();
            while !done.load(Ordering::Acquire) {
                let t = Instant::now();
                let r = client.get(format!("{url}/healthz")).send().await;
                let took = t.elapsed().as_micros() as u64;
                assert!(r.is_ok_and(|r| r.status() == 200), "/healthz failed");
                slowest.fetch_max(took, Ordering::AcqRel);
                peak.fetch_max(rss_kib(pid), Ordering::AcqRel);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..CONCURRENCY {
        let (url, next) = (gw.url.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let client = Gateway::client();
            let mut seen = Vec::new();
            while (next.fetch_add(1, Ordering::AcqRel) as usize) < n {
                let t = Instant::now();
                let r = send_message(&client, &url, MODEL).await;
                let (status, headers) = match r {
                    Ok(r) => {
                        let h =
                            |name: &str| r.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                        let headers = (h("x-poolgate-reason"), h("x-poolgate-policy-error"));
                        let status = r.status().as_u16();
                        let _ = r.bytes().await;
                        (status, headers)
                    }
                    Err(_) => (0, Default::default()),
                };
                seen.push((status, headers, t.elapsed()));
            }
            seen
        }));
    }
    let mut run = Run {
        statuses: Vec::new(),
        headers: Vec::new(),
        slowest_request: Duration::ZERO,
        slowest_healthz: Duration::ZERO,
        peak_rss_kib: 0,
    };
    for w in workers {
        for (status, headers, took) in w.await.unwrap() {
            run.statuses.push(status);
            run.headers.push(headers);
            run.slowest_request = run.slowest_request.max(took);
        }
    }
    done.store(true, Ordering::Release);
    prober.await.unwrap();
    run.slowest_healthz = Duration::from_micros(slowest_healthz.load(Ordering::Acquire));
    run.peak_rss_kib = peak.load(Ordering::Acquire);
    run
}

async fn decisions(gw: &Gateway) -> Vec<Value> {
    let v = gw.admin_json("/admin/decisions?limit=1000", ADMIN).await;
    v.as_array().cloned().unwrap_or_default()
}

/// Every policy error of the decisions (rank phase), as (cause, message).
fn rank_errors(decisions: &[Value]) -> Vec<(String, String)> {
    errors(decisions, "policy_errors")
}

/// Every background error (observe, configure) the decisions picked up.
fn background_errors(decisions: &[Value]) -> Vec<(String, String)> {
    errors(decisions, "background_errors")
}

fn errors(decisions: &[Value], key: &str) -> Vec<(String, String)> {
    decisions
        .iter()
        .flat_map(|d| d["attempts"].as_array().cloned().unwrap_or_default())
        .flat_map(|a| a["decision"][key].as_array().cloned().unwrap_or_default())
        .map(|e| {
            let phase = e["phase"].as_str().unwrap_or("").to_string();
            let cause = e["cause"].as_str().unwrap_or("").to_string();
            (
                if key == "policy_errors" { cause } else { format!("{phase}:{cause}") },
                e["message"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

async fn hostile_stage(gw: &Gateway) -> Value {
    let st = gw.admin_json("/status", ADMIN).await;
    st["chain"].as_array().unwrap().iter().find(|s| s["name"] == "hostile").cloned().expect("the hostile stage")
}

/// Runs `options` through the gateway and checks the common promise; returns
/// the run and the decisions for case-specific checks.
async fn through_serve(what: &str, options: &str, timeout_ms: u64) -> (Gateway, MockUpstream, Run, Vec<Value>) {
    let mock = MockUpstream::start().await;
    let gw = start(&mock, tempdir::Dir::new("faults"), &hostile(&misbehave(), options, timeout_ms));
    let run = drive(&gw, REQUESTS).await;
    run.assert_all_served(what);
    let d = decisions(&gw).await;
    (gw, mock, run, d)
}

/// The breaker opened: later requests record the stage as bypassed.
async fn assert_breaker_opened(gw: &Gateway, d: &[Value], what: &str) {
    let causes: Vec<String> = rank_errors(d).into_iter().map(|(c, _)| c).collect();
    assert!(causes.iter().any(|c| c == "bypassed"), "{what}: the breaker never opened: {causes:?}");
    let stage = hostile_stage(gw).await;
    assert_ne!(stage["breaker"]["state"], "closed", "{what}: {stage:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_plugin_is_a_recorded_trap_with_its_message_and_the_breaker_opens() {
    let (gw, _mock, run, d) = through_serve("panic", "fault = \"trap\"", 25).await;
    let traps: Vec<_> = rank_errors(&d).into_iter().filter(|(c, _)| c == "trap").collect();
    assert!(!traps.is_empty());
    let message = &traps[0].1;
    assert!(message.contains("misbehave: deliberate panic"), "the panic's message is in the cause: {message}");
    assert!(message.contains("src/lib.rs:"), "and its location: {message}");
    assert_breaker_opened(&gw, &d, "panic").await;
    assert!(run.headers.iter().all(|(_, pe)| pe.starts_with("hostile:")), "{:?}", &run.headers[..3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_prints_and_floods_stdio_is_served_and_its_log_is_bounded() {
    let (gw, _mock, _run, d) = through_serve("print", "fault = \"print\"", 25).await;
    assert!(rank_errors(&d).is_empty(), "{:?}", rank_errors(&d));
    assert!(gw.log().contains("misbehave says hello on stderr"), "stdio reaches the log");
    drop(gw);

    // 2 MiB of output per call makes a call slow (ms of host calls), so calls
    // may queue for an instance past their deadline: timeouts, never a trap.
    let (gw, _mock, _run, d) = through_serve("print-flood", "fault = \"print-flood\", bytes = 1048576", 25).await;
    let errs = rank_errors(&d);
    assert!(errs.iter().all(|(c, _)| c == "timeout" || c == "bypassed"), "{errs:?}");
    let lines = gw.log().lines().filter(|l| l.contains("guest stdio")).count();
    // 120 calls × 2 MiB of output: the per-call cap and the per-plugin rate
    // leave a few hundred lines.
    assert!(lines < 1000, "{lines} stdio lines logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_plugin_is_cut_at_its_wall_clock_bound() {
    let (gw, _mock, run, d) = through_serve("sleep", "fault = \"sleep\", ms = 10000", 25).await;
    let timeouts: Vec<_> = rank_errors(&d).into_iter().filter(|(c, _)| c == "timeout").collect();
    assert!(!timeouts.is_empty(), "{:?}", rank_errors(&d));
    assert!(timeouts[0].1.contains("wall-clock bound"), "{}", timeouts[0].1);
    assert!(run.slowest_request < Duration::from_secs(2), "a 10 s sleep held a request {:?}", run.slowest_request);
    assert_breaker_opened(&gw, &d, "sleep").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_opens_a_socket_or_exits_is_refused_and_served() {
    let (_gw, _mock, _run, d) = through_serve("socket", "fault = \"socket\", addr = \"127.0.0.1:9\"", 25).await;
    let errs = rank_errors(&d);
    assert!(errs.iter().any(|(c, m)| c == "error" && m.contains("socket refused")), "{errs:?}");

    let (_gw, _mock, _run, d) = through_serve("exit", "fault = \"exit\"", 25).await;
    let errs = rank_errors(&d);
    // Rust's std on wasip2 reports every nonzero code through WASI 0.2's
    // `exit(err)`, which the host receives as 1.
    assert!(errs.iter().any(|(c, m)| c == "trap" && m.contains("the plugin called exit(1)")), "{errs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_in_observe_are_counted_recorded_and_open_the_breaker() {
    for (mode, cause) in [("trap", "trap"), ("loop", "timeout")] {
        let what = format!("observe {mode}");
        let options = format!("fault = \"pass\", observe = \"{mode}\"");
        let (gw, _mock, _run, d) = through_serve(&what, &options, 25).await;
        let bg = background_errors(&d);
        assert!(bg.iter().any(|(c, _)| *c == format!("observe:{cause}")), "{what}: {bg:?}");
        let stage = hostile_stage(&gw).await;
        assert!(stage["observe"]["failures"].as_u64().unwrap() >= 5, "{what}: {stage:#}");
        assert_eq!(stage["observe"]["last"]["cause"], cause, "{what}: {stage:#}");
        assert_breaker_opened(&gw, &d, &what).await;
        let metrics = Gateway::client().get(format!("{}/metrics", gw.url)).send().await.unwrap().text().await.unwrap();
        assert!(
            metrics.lines().any(|l| l.starts_with("poolgate_policy_background_errors_total")
                && l.contains("phase=\"observe\"")
                && l.contains(&format!("cause=\"{cause}\""))),
            "{what}: {metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_configure_never_reaches_a_request() {
    for mode in ["spin-after-first", "sleep-after-first"] {
        let options = format!("fault = \"pass\", configure = \"{mode}\", ms = 3000");
        let (_gw, _mock, run, d) = through_serve(mode, &options, 25).await;
        assert!(rank_errors(&d).is_empty(), "{mode}: {:?}", rank_errors(&d));
        assert!(run.slowest_request < Duration::from_secs(1), "{mode}: a request waited {:?}", run.slowest_request);
    }
    // A configure that fails on every new instance: the first one serves, the
    // failures are recorded and counted, and the breaker opens on them.
    let options = "fault = \"pass\", configure = \"trap-after-first\"";
    let (gw, _mock, _run, d) = through_serve("failing builds", options, 25).await;
    let bg = background_errors(&d);
    let stage = hostile_stage(&gw).await;
    assert!(stage["configure"]["failures"].as_u64().unwrap() >= 1 || !bg.is_empty(), "{stage:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_flooding_its_state_stays_within_its_bytes() {
    let (gw, _mock, run, d) = through_serve("state flood", "fault = \"state-flood\", bytes = 65536", 25).await;
    assert!(rank_errors(&d).is_empty(), "{:?}", rank_errors(&d));
    let baseline = rss_kib(gw.pid());
    // 120 requests × 16 × 64 KiB = 120 MiB written; the scope keeps 16 MiB.
    let run2 = drive(&gw, REQUESTS).await;
    run2.assert_all_served("state flood, second round");
    let peak = run.peak_rss_kib.max(run2.peak_rss_kib);
    assert!(peak < 400 * 1024, "gateway RSS reached {} MiB", peak / 1024);
    assert!(rss_kib(gw.pid()) < baseline + 64 * 1024, "RSS keeps growing: {} → {} KiB", baseline, rss_kib(gw.pid()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_with_many_memories_is_capped_as_a_whole() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("memories");
    // 12 memories, each growing 1 MiB per call: the per-instance cap (64 MiB)
    // stops it on its sixth call; a per-memory cap would let it reach 700 MiB.
    let wasm = dir.0.join("many-memories.wasm");
    std::fs::write(&wasm, support::hostile_components::many_memories(12, 16)).unwrap();
    let gw = start(&mock, dir, &hostile(wasm.to_str().unwrap(), "", 25));
    let run = drive(&gw, REQUESTS).await;
    run.assert_all_served("many memories");
    let d = decisions(&gw).await;
    assert!(rank_errors(&d).iter().any(|(c, _)| c == "oom"), "{:?}", rank_errors(&d));
    assert!(run.peak_rss_kib < 400 * 1024, "gateway RSS reached {} MiB", run.peak_rss_kib / 1024);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_long_or_unsafe_reason_is_invalid_output_and_never_a_header() {
    for (what, options) in [
        ("huge reason", "fault = \"huge-reason\", bytes = 65536"),
        ("header reason", "fault = \"header-reason\""),
        ("huge detail", "fault = \"huge-detail\", bytes = 1048576"),
    ] {
        let (_gw, _mock, run, d) = through_serve(what, options, 25).await;
        let errs = rank_errors(&d);
        assert!(errs.iter().any(|(c, _)| c == "invalid-output"), "{what}: {errs:?}");
        assert!(run.headers.iter().all(|(reason, _)| reason.len() <= 128), "{what}: a long reason reached a header");
        assert!(run.headers.iter().all(|(reason, _)| !reason.contains("evil")), "{what}");
    }
}

/// Host calls burn no fuel: a plugin looping on them (a huge `log`, a huge
/// state key) is still cut at its wall-clock bound, yields every millisecond
/// meanwhile, and never holds a worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_looping_on_host_calls_is_cut_at_its_wall_clock_bound() {
    for options in [
        "fault = \"log-loop\", bytes = 1048576",
        "fault = \"state-get-loop\", bytes = 8388608",
        "fault = \"state-set-loop\", bytes = 2048",
        "fault = \"log-loop\", bytes = 1",
    ] {
        let (gw, _mock, run, d) = through_serve(options, options, 25).await;
        let errs = rank_errors(&d);
        let timeouts: Vec<_> = errs.iter().filter(|(c, _)| c == "timeout").collect();
        assert!(!timeouts.is_empty(), "{options}: {errs:?}");
        assert!(timeouts[0].1.contains("wall-clock bound"), "{options}: {}", timeouts[0].1);
        assert!(run.slowest_request < Duration::from_secs(1), "{options}: a request took {:?}", run.slowest_request);
        let log_lines = gw.log().lines().count();
        assert!(log_lines < 5_000, "{options}: {log_lines} log lines");
    }
}

/// A plugin that fails every other call is not left running forever: the
/// breaker counts failures over a window, not only in a row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_failing_half_its_calls_opens_the_breaker() {
    let (gw, _mock, _run, d) = through_serve("half", "fault = \"trap\", every = 2", 25).await;
    assert_breaker_opened(&gw, &d, "every other call traps").await;
}

/// A configure that loops on host calls yields like any call: the builder
/// thread keeps serving every other plugin, and a reload away from it is quick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configure_looping_on_host_calls_does_not_block_a_reload() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("configure-loop");
    let path = dir.0.join("poolgate.toml");
    let hostile_stage =
        hostile(&misbehave(), "fault = \"pass\", configure = \"log-loop-after-first\", bytes = 1048576", 25);
    let gw = start(&mock, dir, &hostile_stage);
    // The builder is now stuck building the second instance (for 10 s, its
    // configure bound). Swap the stage away.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let text = std::fs::read_to_string(&path).unwrap();
    let swapped = text.replace(&hostile_stage, "[[policy.chain]]\nplugin = \"builtin:headroom\"\nname = \"plain\"\n");
    let saved = Instant::now();
    std::fs::write(&path, swapped).unwrap();
    loop {
        let st = gw.admin_json("/status", ADMIN).await;
        if st["chain"][0]["name"] == "plain" {
            break;
        }
        assert!(saved.elapsed() < Duration::from_secs(3), "the reload waited for the stuck configure:\n{}", gw.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let run = drive(&gw, REQUESTS).await;
    run.assert_all_served("after the swap");
}

/// An error of tens of MiB with a line break every other byte costs the host
/// little; a plugin's log line cannot pass for one of the gateway's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_errors_and_forged_log_lines_are_defused() {
    // 8 MiB of "a\n": joining its lines before cutting them cost 16 bytes of
    // host memory per guest byte; lifting it at all costs a copy, which a
    // bigger string would make long enough to be felt by /healthz.
    let (gw, _mock, run, d) = through_serve("err lines", "fault = \"err-lines\", bytes = 8388608", 25).await;
    assert!(rank_errors(&d).iter().any(|(c, m)| c == "error" && m.len() <= 700), "{:?}", &rank_errors(&d)[..1]);
    assert!(run.peak_rss_kib < 600 * 1024, "gateway RSS reached {} MiB", run.peak_rss_kib / 1024);
    drop(gw);
    let (gw, _mock, _run, _d) = through_serve("forge", "fault = \"forge-log\"", 25).await;
    let forged = gw.log().lines().filter(|l| l.trim_start().starts_with("2026-12-01T00:00:00.000000Z")).count();
    assert_eq!(forged, 0, "a plugin wrote a line of its own into the gateway's log");
    assert!(gw.log().contains("innocent\\n2026-12-01"), "the message is there, escaped");
}

/// The hostile guests, swapped in one after another under steady load and
/// swapped back out: not one request fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_plugins_hot_swapped_in_under_load_lose_no_request() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("swap-hostile");
    let path = dir.0.join("poolgate.toml");
    let memories = dir.0.join("many-memories.wasm");
    std::fs::write(&memories, support::hostile_components::many_memories(12, 16)).unwrap();
    let head = format!(
        "[server]\nadmin_token_env = \"PG_ADMIN\"\n\n\
         [[accounts]]\nid = \"a\"\napi_key_env = \"KEY_A\"\nbase_url = \"{base}\"\n\n\
         [[accounts]]\nid = \"b\"\napi_key_env = \"KEY_B\"\nbase_url = \"{base}\"\n\n",
        base = mock.base_url()
    );
    std::fs::write(&path, format!("{head}[[policy.chain]]\nplugin = \"builtin:headroom\"\n")).unwrap();
    mock.account("key-a");
    mock.account("key-b");
    let gw = Gateway::start_file(&path, &[("KEY_A", "key-a"), ("KEY_B", "key-b"), ("PG_ADMIN", ADMIN)], dir);

    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (url, stop) = (gw.url.clone(), stop.clone());
        tokio::spawn(async move {
            let client = Gateway::client();
            let mut statuses = Vec::new();
            while !stop.load(Ordering::Acquire) {
                let r = send_message(&client, &url, MODEL).await;
                statuses.push(r.map(|r| r.status().as_u16()).unwrap_or(0));
            }
            statuses
        })
    };
    let guest = misbehave();
    let hostile_options = [
        "fault = \"trap\"",
        "fault = \"sleep\", ms = 10000",
        "fault = \"pass\", observe = \"loop\"",
        "fault = \"pass\", configure = \"sleep-after-first\", ms = 3000",
        "fault = \"state-flood\", bytes = 65536",
        "fault = \"huge-reason\", bytes = 65536",
        "fault = \"print-flood\", bytes = 1048576",
        "fault = \"exit\"",
        "fault = \"log-loop\", bytes = 1048576",
        "fault = \"pass\", configure = \"log-loop-after-first\", bytes = 1048576",
        "fault = \"trap\", every = 2",
    ];
    let mut swaps = Vec::new();
    for options in hostile_options {
        swaps.push(hostile(&guest, options, 25));
        swaps.push("[[policy.chain]]\nplugin = \"builtin:headroom\"\n".to_string());
    }
    swaps.push(hostile(memories.to_str().unwrap(), "", 25));
    for (i, stages) in swaps.iter().enumerate() {
        std::fs::write(&path, format!("{head}{stages}")).unwrap();
        let r = Gateway::client().post(format!("{}/admin/reload", gw.url)).bearer_auth(ADMIN).send().await.unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap_or(json!({}));
        assert_eq!(status, 200, "swap {i} refused: {body}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stop.store(true, Ordering::Release);
    let statuses = load.await.unwrap();
    let failed = statuses.iter().filter(|s| **s != 200).count();
    assert!(statuses.len() >= 100, "only {} requests", statuses.len());
    assert_eq!(failed, 0, "{failed} of {} requests failed during the swaps", statuses.len());
}
