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

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use poolgate_mock_upstream::MockUpstream;
use serde_json::{Value, json};
use support::{Gateway, send_message, tempdir};

const ADMIN: &str = "faults-admin";
const REQUESTS: usize = 120;
const CONCURRENCY: usize = 4;
/// How much longer than a reference server on the same machine, probed right
/// after it, `/healthz` may take while a plugin misbehaves: nine probes in
/// ten within this… A busy machine (a CI box running other builds) slows both
/// alike; a worker held by the plugin slows only the gateway's, in every
/// probe that lands on it. Counting the excess over the reference, not the
/// latency itself, keeps the bound about the gateway.
const HEALTHZ_MS: u128 = 50;
/// …and none beyond this.
const HEALTHZ_MAX_MS: u128 = 1000;

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
    /// How long each request took, in the order they ended per worker.
    latencies: Vec<Duration>,
    slowest_healthz: Duration,
    /// The 90th percentile of the `/healthz` probes, as their excess over a
    /// reference probe made right after each (see [`HEALTHZ_MS`]).
    healthz_p90: Duration,
    peak_rss_kib: u64,
}

impl Run {
    /// The 99th percentile of the request latencies.
    fn p99(&self) -> Duration {
        let mut l = self.latencies.clone();
        l.sort();
        l[(l.len() * 99 / 100).min(l.len() - 1)]
    }

    fn assert_all_served(&self, what: &str) {
        let failed: Vec<_> = self.statuses.iter().zip(&self.headers).filter(|(s, _)| **s != 200).collect();
        assert!(failed.is_empty(), "{what}: {} of {} requests failed: {failed:?}", failed.len(), self.statuses.len());
        assert!(self.statuses.len() >= 100, "{what}: only {} requests", self.statuses.len());
        assert!(
            self.healthz_p90.as_millis() < HEALTHZ_MS && self.slowest_healthz.as_millis() < HEALTHZ_MAX_MS,
            "{what}: /healthz took {:?} (p90) and {:?} (slowest) longer than a reference server while the plugin misbehaved",
            self.healthz_p90,
            self.slowest_healthz
        );
    }
}

/// Drives `n` requests, `CONCURRENCY` at a time, while probing `/healthz` and
/// sampling the gateway's memory.
async fn drive(gw: &Gateway, n: usize) -> Run {
    let done = Arc::new(AtomicBool::new(false));
    let healthz = Arc::new(parking_lot::Mutex::new(Vec::<u64>::new()));
    let peak = Arc::new(AtomicU64::new(rss_kib(gw.pid())));
    let (reference, _stop_reference) = reference_server().await;
    let prober = {
        let (url, done, slowest, peak, pid) = (gw.url.clone(), done.clone(), healthz.clone(), peak.clone(), gw.pid());
        tokio::spawn(async move {
            let client = Gateway::client();
            while !done.load(Ordering::Acquire) {
                let t = poolgate::clock::machine_instant();
                let r = client.get(format!("{url}/healthz")).send().await;
                let took = t.elapsed().as_micros() as u64;
                assert!(r.is_ok_and(|r| r.status() == 200), "/healthz failed");
                let t = poolgate::clock::machine_instant();
                let r = client.get(&reference).send().await;
                let baseline = t.elapsed().as_micros() as u64;
                assert!(r.is_ok_and(|r| r.status() == 200), "the reference server failed");
                slowest.lock().push(took.saturating_sub(baseline));
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
                let t = poolgate::clock::machine_instant();
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
                    // The client's error stands in for the headers: a
                    // failure then says what the connection saw.
                    Err(e) => (0, (format!("{e:#?}"), String::new())),
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
        latencies: Vec::new(),
        slowest_healthz: Duration::ZERO,
        healthz_p90: Duration::ZERO,
        peak_rss_kib: 0,
    };
    for w in workers {
        for (status, headers, took) in w.await.unwrap() {
            run.statuses.push(status);
            run.headers.push(headers);
            run.slowest_request = run.slowest_request.max(took);
            run.latencies.push(took);
        }
    }
    done.store(true, Ordering::Release);
    prober.await.unwrap();
    let mut probes = std::mem::take(&mut *healthz.lock());
    probes.sort_unstable();
    let at = |q: f64| probes.get(((probes.len() as f64 - 1.0) * q) as usize).copied().unwrap_or(0);
    run.slowest_healthz = Duration::from_micros(at(1.0));
    run.healthz_p90 = Duration::from_micros(at(0.9));
    run.peak_rss_kib = peak.load(Ordering::Acquire);
    run
}

/// A server that answers `GET /` with 200 and nothing else, on its own
/// thread and runtime (not the test's, which the probes and requests load):
/// how long a trivial answer takes on this machine right now. It stops when
/// the returned sender is dropped.
async fn reference_server() -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            listener.set_nonblocking(true).unwrap();
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
            let _ = axum::serve(listener, app).with_graceful_shutdown(async move { drop(stopped.await) }).await;
        });
    });
    (url, stop)
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

/// The breaker opened: later requests record the stage as bypassed. A stage
/// whose failures are slow (calls cut at their wall-clock bound) needs time,
/// not requests, to fail enough — meanwhile requests skip it as `busy` at
/// little cost — so traffic goes on until it opens (at most 10 s). Returns the
/// decisions then.
async fn assert_breaker_opened(gw: &Gateway, what: &str) -> Vec<Value> {
    let started = poolgate::clock::machine_instant();
    loop {
        let d = decisions(gw).await;
        let stage = hostile_stage(gw).await;
        let causes: Vec<String> = rank_errors(&d).into_iter().map(|(c, _)| c).collect();
        if stage["breaker"]["state"] != "closed" && causes.iter().any(|c| c == "bypassed") {
            return d;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{what}: the breaker never opened: {causes:?} {stage:#}");
        let run = drive(gw, 40).await;
        assert!(run.statuses.iter().all(|s| *s == 200), "{what}: {:?}", run.statuses);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_plugin_is_a_recorded_trap_with_its_message_and_the_breaker_opens() {
    let (gw, _mock, run, d) = through_serve("panic", "fault = \"trap\"", 25).await;
    let traps: Vec<_> = rank_errors(&d).into_iter().filter(|(c, _)| c == "trap").collect();
    assert!(!traps.is_empty());
    let message = &traps[0].1;
    assert!(message.contains("misbehave: deliberate panic"), "the panic's message is in the cause: {message}");
    assert!(message.contains("src/lib.rs:"), "and its location: {message}");
    assert_breaker_opened(&gw, "panic").await;
    assert!(run.headers.iter().all(|(_, pe)| pe.starts_with("hostile:")), "{:?}", &run.headers[..3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_prints_and_floods_stdio_is_served_and_its_log_is_bounded() {
    let (gw, _mock, _run, d) = through_serve("print", "fault = \"print\"", 25).await;
    assert!(rank_errors(&d).is_empty(), "{:?}", rank_errors(&d));
    assert!(gw.log().contains("misbehave says hello on stderr"), "stdio reaches the log");
    drop(gw);

    // 2 MiB of output per call makes a call slow (ms of host calls), so calls
    // may queue for an instance past their deadline: timeouts or busy skips,
    // never a trap.
    let (gw, _mock, _run, d) = through_serve("print-flood", "fault = \"print-flood\", bytes = 1048576", 25).await;
    let errs = rank_errors(&d);
    assert!(errs.iter().all(|(c, _)| c == "timeout" || c == "busy" || c == "bypassed"), "{errs:?}");
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
    assert!(timeouts[0].1.contains("rank cut after"), "{}", timeouts[0].1);
    assert!(run.slowest_request < Duration::from_secs(2), "a 10 s sleep held a request {:?}", run.slowest_request);
    assert_breaker_opened(&gw, "sleep").await;
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
        let (gw, _mock, _run, _) = through_serve(&what, &options, 25).await;
        let d = assert_breaker_opened(&gw, &what).await;
        let bg = background_errors(&d);
        assert!(bg.iter().any(|(c, _)| *c == format!("observe:{cause}")), "{what}: {bg:?}");
        let stage = hostile_stage(&gw).await;
        assert!(stage["observe"]["failures"].as_u64().unwrap() >= 5, "{what}: {stage:#}");
        assert_eq!(stage["observe"]["last"]["cause"], cause, "{what}: {stage:#}");
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

/// Tiny entries cost the most for what they hold: eight stages, each with a
/// scope of its own, write 500 fresh tiny entries (a ~12-byte key, a 1-byte
/// value) a call under a 32 MiB total (4 MiB a scope). Counted at a third of
/// their cost (a fixed 96 bytes an entry, each key held twice) the gateway
/// grew by 67 MiB for its 32 MiB of state; counted at their cost, by 30 MiB
/// (measured on two busy cores, debug build).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_entries_across_eight_scopes_stay_within_the_state_total() {
    const TOTAL_MIB: u64 = 32;
    // What the gateway may grow by beyond the state's total while it serves
    // 240 requests through nine stages: 1,000 kept decision records, the
    // allocator's free lists in several arenas, the runtime's caches. The
    // whole growth measured 29–30 MiB (the store at most its 32 MiB); with
    // the old count, 67–68 MiB: past this bound.
    const SLACK_MIB: u64 = 24;
    let mock = MockUpstream::start().await;
    let guest = misbehave();
    // No state file: its periodic copy of the store (up to 8 MiB written out)
    // is bounded on its own and would blur what this measures.
    let mut stages = String::from("[state]\nfile = \"\"\n\n[policy.state]\nmax_scope_mb = 4\nmax_total_mb = 32\n\n");
    for i in 0..8 {
        stages += &format!(
            "[[policy.chain]]\nplugin = \"{guest}\"\nname = \"tiny{i}\"\nscope = \"tiny{i}\"\ntimeout_ms = 250\n\
             config = {{ fault = \"state-tiny\", per_call = 500, on_model = \"{MODEL}\" }}\n\n"
        );
    }
    stages += "[[policy.chain]]\nplugin = \"builtin:headroom\"\n";
    let gw = start(&mock, tempdir::Dir::new("tiny"), &stages);
    // The baseline: every stage built and called, nothing written yet.
    let client = Gateway::client();
    for _ in 0..20 {
        let r = send_message(&client, &gw.url, FINE).await.unwrap();
        assert_eq!(r.status(), 200);
    }
    let baseline = rss_kib(gw.pid());
    // 240 calls a stage at most, 500 entries each: 120,000 entries a scope,
    // where 4 MiB holds about 15,000 (and held 38,000 counted the old way).
    let run = drive(&gw, 2 * REQUESTS).await;
    run.assert_all_served("tiny state entries in eight scopes");
    let d = decisions(&gw).await;
    let full: std::collections::BTreeSet<String> = d
        .iter()
        .flat_map(|d| d["attempts"].as_array().cloned().unwrap_or_default())
        .flat_map(|a| a["decision"]["stages"].as_array().cloned().unwrap_or_default())
        .filter(|s| s["reason"] == "tiny-full")
        .filter_map(|s| s["stage"].as_str().map(str::to_string))
        .collect();
    assert!(full.len() >= 4, "the scopes never filled: only {full:?}");
    let grew = run.peak_rss_kib.saturating_sub(baseline);
    assert!(
        grew <= (TOTAL_MIB + SLACK_MIB) * 1024,
        "RSS grew {} MiB (from {} MiB) with {TOTAL_MIB} MiB of state allowed",
        grew / 1024,
        baseline / 1024
    );
    eprintln!("RSS grew {} KiB from {} KiB; stages that filled: {full:?}", grew, baseline);
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
        ("huge detail", "fault = \"huge-detail\", bytes = 65536"),
        ("detail over the host-call limit", "fault = \"huge-detail\", bytes = 1048576"),
    ] {
        let (_gw, _mock, run, d) = through_serve(what, options, 25).await;
        let errs = rank_errors(&d);
        // An answer over what one call may pass the host (1 MiB) is refused
        // before it is copied: a trap that says so.
        let refused = |(c, m): &(String, String)| {
            c == "invalid-output" || (c == "trap" && m.contains("more than 1 MiB in one call"))
        };
        assert!(errs.iter().any(refused), "{what}: {errs:?}");
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
        "fault = \"state-get-loop\", bytes = 524288",
        "fault = \"state-set-loop\", bytes = 2048",
        "fault = \"log-loop\", bytes = 1",
    ] {
        let (gw, _mock, run, d) = through_serve(options, options, 25).await;
        let errs = rank_errors(&d);
        let timeouts: Vec<_> = errs.iter().filter(|(c, _)| c == "timeout").collect();
        assert!(!timeouts.is_empty(), "{options}: {errs:?}");
        assert!(timeouts[0].1.contains("rank cut after"), "{options}: {}", timeouts[0].1);
        assert!(run.slowest_request < Duration::from_secs(1), "{options}: a request took {:?}", run.slowest_request);
        let log_lines = gw.log().lines().count();
        assert!(log_lines < 5_000, "{options}: {log_lines} log lines");
    }
}

/// A plugin that fails every other call is not left running forever: the
/// breaker counts failures over a window, not only in a row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_failing_half_its_calls_opens_the_breaker() {
    let (gw, _mock, _run, _d) = through_serve("half", "fault = \"trap\", every = 2", 25).await;
    assert_breaker_opened(&gw, "every other call traps").await;
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
    // Wait until the builder is stuck building the second instance (for 10 s,
    // its configure bound), then swap the stage away.
    support::eventually("the builder starts a second instance", Duration::from_secs(10), async || {
        gw.admin_json("/status", ADMIN).await["chain"][0]["live_instances"].as_u64() >= Some(2)
    })
    .await;
    let text = std::fs::read_to_string(&path).unwrap();
    let swapped = text.replace(&hostile_stage, "[[policy.chain]]\nplugin = \"builtin:headroom\"\nname = \"plain\"\n");
    let saved = poolgate::clock::machine_instant();
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

/// A reload keeps every stage it leaves as it was — warm instances, state and
/// breaker — so reloading an unchanged file, or one that changes only other
/// settings, never runs a plugin's `configure` again; a stage whose options
/// change is built anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_the_stages_it_leaves_as_they_were() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("reload-keeps");
    let path = dir.0.join("poolgate.toml");
    // Every instance but the scope's first sleeps 4 s in `configure`: a
    // reload that rebuilt the stage would wait that long for its first one.
    let slow =
        |ms: u64| hostile(&misbehave(), &format!("fault = \"pass\", configure = \"sleep-after-first\", ms = {ms}"), 25);
    let gw = start(&mock, dir, &slow(4000));
    let reload = async || {
        let took = poolgate::clock::machine_instant();
        let r = Gateway::client().post(format!("{}/admin/reload", gw.url)).bearer_auth(ADMIN).send().await.unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
        took.elapsed()
    };
    let unchanged = reload().await;
    assert!(unchanged < Duration::from_secs(2), "an unchanged reload took {unchanged:?}");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("{text}\n[cooldowns]\noverloaded_ms = 1234\n")).unwrap();
    let other = reload().await;
    assert!(other < Duration::from_secs(2), "a reload changing only [cooldowns] took {other:?}");
    let st = gw.admin_json("/status", ADMIN).await;
    assert_eq!(st["chain"][0]["name"], "hostile", "{st}");
    // New options: a new plugin, whose first instance is not the scope's first.
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace(&slow(4000), &slow(300))).unwrap();
    let changed = reload().await;
    assert!(changed >= Duration::from_millis(300), "a stage with new options was not built anew ({changed:?})");
    drive(&gw, REQUESTS).await.assert_all_served("after the reloads");
}

/// An error of tens of MiB with a line break every other byte costs the host
/// little; a plugin's log line cannot pass for one of the gateway's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_errors_and_forged_log_lines_are_defused() {
    // Almost 1 MiB of "a\n" (what one call may pass the host): joining its
    // lines before cutting them cost 16 bytes of host memory per guest byte.
    let (gw, _mock, run, d) = through_serve("err lines", "fault = \"err-lines\", bytes = 1000000", 25).await;
    assert!(rank_errors(&d).iter().any(|(c, m)| c == "error" && m.len() <= 700), "{:?}", &rank_errors(&d)[..1]);
    assert!(run.peak_rss_kib < 600 * 1024, "gateway RSS reached {} MiB", run.peak_rss_kib / 1024);
    drop(gw);
    // 8 MiB of it is refused before it is copied at all.
    let (gw, _mock, run, d) = through_serve("err lines", "fault = \"err-lines\", bytes = 8388608", 25).await;
    let errs = rank_errors(&d);
    assert!(errs.iter().any(|(c, m)| c == "trap" && m.contains("more than 1 MiB in one call")), "{:?}", &errs[..1]);
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
        let took = poolgate::clock::machine_instant();
        let r = Gateway::client().post(format!("{}/admin/reload", gw.url)).bearer_auth(ADMIN).send().await.unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap_or(json!({}));
        assert_eq!(status, 200, "swap {i} refused: {body}\n{}", gw.log());
        // A reload away from a plugin whose `configure` is slow or loops must
        // not wait for it (nor for a file-watch reload of the same file that
        // rebuilt it): unchanged stages are kept, never configured again.
        assert!(took.elapsed() < Duration::from_secs(5), "swap {i} took {:?}:\n{}", took.elapsed(), gw.log());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stop.store(true, Ordering::Release);
    let statuses = load.await.unwrap();
    let failed = statuses.iter().filter(|s| **s != 200).count();
    assert!(statuses.len() >= 100, "only {} requests", statuses.len());
    assert_eq!(failed, 0, "{failed} of {} requests failed during the swaps", statuses.len());
}

/// The stage record of the hostile stage in each decision: (reason, duration µs,
/// error cause).
fn hostile_records(decisions: &[Value]) -> Vec<(String, f64, Option<String>)> {
    decisions
        .iter()
        .flat_map(|d| d["attempts"].as_array().cloned().unwrap_or_default())
        .flat_map(|a| a["decision"]["stages"].as_array().cloned().unwrap_or_default())
        .filter(|s| s["stage"] == "hostile")
        .map(|s| {
            (
                s["reason"].as_str().unwrap_or("").to_string(),
                s["duration_us"].as_f64().unwrap_or(0.0),
                s["error"]["cause"].as_str().map(str::to_string),
            )
        })
        .collect()
}

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string()
}

/// A model the misbehave guest answers well (reason `reversed`).
const FINE: &str = "claude-opus-4-1";
/// A model it answers slowly (`slow_model`).
const SLOW: &str = "claude-sonnet-4-5";

/// Sends `FINE` requests until the hostile stage ranks one (reason `reversed`)
/// or `within` passes; whether it did.
async fn ranked_again(gw: &Gateway, within: Duration) -> bool {
    let client = Gateway::client();
    let started = poolgate::clock::machine_instant();
    while started.elapsed() < within {
        let r = send_message(&client, &gw.url, FINE).await.unwrap();
        assert_eq!(r.status(), 200);
        if header(&r, "x-poolgate-reason") == "reversed" {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// The breaker's probe rides on a request whose client goes away mid-call: the
/// request's future is dropped with the probe in it. The probe must come back,
/// so that the next request probes the (healthy) stage and closes the breaker
/// — not leave it half-open and bypassed until the next reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_probe_whose_request_goes_away_hands_the_probe_on() {
    let mock = MockUpstream::start().await;
    let stages = format!(
        "[policy.breaker]\nfailures = 3\ncooldown_ms = 300\nmax_cooldown_ms = 300\n\n\
         [[policy.chain]]\nplugin = \"{}\"\nname = \"hostile\"\ntimeout_ms = 400\n\
         config = {{ fault = \"trap\", on_model = \"{MODEL}\", slow_model = \"{SLOW}\", ms = 300 }}\n",
        misbehave()
    );
    let gw = start(&mock, tempdir::Dir::new("probe-cancel"), &stages);
    let client = Gateway::client();
    for _ in 0..3 {
        assert_eq!(send_message(&client, &gw.url, MODEL).await.unwrap().status(), 200);
    }
    assert_eq!(hostile_stage(&gw).await["breaker"]["state"], "open");
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The probe: a request the plugin takes 300 ms over (within its 500 ms
    // budget), whose client leaves after 100 ms.
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(100)).build().unwrap();
    assert!(send_message(&impatient, &gw.url, SLOW).await.is_err(), "the client gave up");
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(
        ranked_again(&gw, Duration::from_secs(3)).await,
        "the stage stayed bypassed after its probe's request went away: {:#}",
        hostile_stage(&gw).await
    );
    let stage = hostile_stage(&gw).await;
    assert_eq!(stage["breaker"]["state"], "closed", "{stage:#}");
    assert_eq!(stage["breaker"]["trips"], 1, "the lost probe counted as no failure: {stage:#}");
}

/// The probe finds no free instance: every instance was thrown away by the
/// failures that opened the breaker, and rebuilding takes a while (a slow
/// `configure`). That is a `busy` skip, not the plugin's fault: the probe
/// passes to a later request, which closes the breaker once an instance is
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breaker_probe_that_finds_no_free_instance_hands_the_probe_on() {
    let mock = MockUpstream::start().await;
    let stages = format!(
        "[policy]\ninstances = 3\n\n\
         [policy.breaker]\nfailures = 3\ncooldown_ms = 300\nmax_cooldown_ms = 300\n\n\
         [[policy.chain]]\nplugin = \"{}\"\nname = \"hostile\"\n\
         config = {{ fault = \"trap\", on_model = \"{MODEL}\", configure = \"sleep-after-first\", ms = 1000 }}\n",
        misbehave()
    );
    let gw = start(&mock, tempdir::Dir::new("probe-busy"), &stages);
    let started = poolgate::clock::machine_instant();
    while hostile_stage(&gw).await["idle_instances"] != 3 {
        assert!(started.elapsed() < Duration::from_secs(10), "the pool never filled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Three traps throw away all three instances and open the breaker; each
    // replacement takes a second to build.
    let client = Gateway::client();
    for _ in 0..3 {
        assert_eq!(send_message(&client, &gw.url, MODEL).await.unwrap().status(), 200);
    }
    assert_eq!(hostile_stage(&gw).await["breaker"]["state"], "open");
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(
        ranked_again(&gw, Duration::from_secs(5)).await,
        "the stage stayed bypassed after its probe found no instance: {:#}",
        hostile_stage(&gw).await
    );
    let d = decisions(&gw).await;
    assert!(rank_errors(&d).iter().any(|(c, _)| c == "busy"), "a probe met the empty pool: {:?}", rank_errors(&d));
    let stage = hostile_stage(&gw).await;
    assert_eq!((stage["breaker"]["state"].as_str(), stage["breaker"]["trips"].as_u64()), (Some("closed"), Some(1)));
}

/// One host call the epoch cannot interrupt — asking for 64 MiB of random
/// bytes, writing 48 MiB to stdout in one `write` — would hold a worker (and
/// `/healthz`) for as long as it takes. Each is refused at its limit instead,
/// as a trap whose message names the limit; a call within it works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_huge_host_call_is_refused_at_its_limit_and_never_stalls_a_worker() {
    for (options, limit) in [
        ("fault = \"random-bytes\", bytes = 67108864", "at most 64 KiB"),
        ("fault = \"insecure-random-bytes\", bytes = 67108864", "at most 64 KiB"),
        ("fault = \"stdout-write\", bytes = 50331648", "more than 1 MiB in one call"),
        ("fault = \"state-get-loop\", bytes = 8388608", "more than 1 MiB in one call"),
    ] {
        let (_gw, _mock, run, d) = through_serve(options, options, 25).await;
        let errs = rank_errors(&d);
        let traps: Vec<_> = errs.iter().filter(|(c, _)| c == "trap").collect();
        assert!(!traps.is_empty(), "{options}: {errs:?}");
        assert!(traps.iter().all(|(_, m)| m.contains(limit)), "{options}: {traps:?}");
        // While trapped instances are rebuilt, requests may find none free.
        assert!(errs.iter().all(|(c, _)| ["trap", "busy", "bypassed"].contains(&c.as_str())), "{options}: {errs:?}");
        assert!(run.slowest_request < Duration::from_secs(1), "{options}: a request took {:?}", run.slowest_request);
    }
    for options in ["fault = \"random-bytes\", bytes = 65536", "fault = \"stdout-write\", bytes = 65536"] {
        let (_gw, _mock, _run, d) = through_serve(options, options, 25).await;
        assert!(rank_errors(&d).is_empty(), "{options}: {:?}", rank_errors(&d));
    }
}

/// A plugin that fills its scope (150,000 tiny entries) and then lowers its
/// `state-limit` to 1 evicts in bounded batches, not all at once under the
/// lock every plugin's state calls share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lowering_the_limit_of_a_full_scope_never_stalls_a_worker() {
    let options = "fault = \"state-evict\", entries = 150000, per_call = 4000";
    // A 250 ms deadline (1 s busy bound): filling 4,000 entries a call takes a
    // debug build tens of ms, and several hundred on two cores that also run
    // the rest of the suite — that is the plugin's own work, not the stall this
    // test is about (/healthz is what measures that).
    // Two instances, as many as the pool may grow to: each fills its own
    // count of entries, and the scope must fill within the run.
    let mock = MockUpstream::start().await;
    let stages = format!("[policy]\ninstances = 2\nmax_instances = 2\n\n{}", hostile(&misbehave(), options, 250));
    let gw = start(&mock, tempdir::Dir::new("state-evict"), &stages);
    drive(&gw, REQUESTS).await.assert_all_served("state evict");
    let d = decisions(&gw).await;
    let records = hostile_records(&d);
    assert!(records.iter().any(|(reason, _, _)| reason == "evicted"), "the scope never filled: {:?}", &records[..3]);
    // Calls may find both instances busy; none fails.
    let errs = rank_errors(&d);
    assert!(errs.iter().all(|(c, _)| c == "busy"), "{errs:?}");
}

/// `routing_policy_error` (and `pool_order`) are the host's to give: a plugin
/// answering one would claim a failure that is recorded nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_cannot_answer_a_reason_reserved_for_the_host() {
    for reserved in ["routing_policy_error", "pool_order"] {
        let options = format!("fault = \"reason\", reason = \"{reserved}\"");
        let (_gw, _mock, run, d) = through_serve(&options, &options, 25).await;
        let errs = rank_errors(&d);
        assert!(errs.iter().any(|(c, m)| c == "invalid-output" && m.contains("reserved for the host")), "{errs:?}");
        for (reason, policy_error) in &run.headers {
            if reason == "routing_policy_error" {
                assert!(
                    policy_error.starts_with("hostile:"),
                    "an error with none recorded: {reason} / {policy_error:?}"
                );
            }
            assert_ne!(reason, "pool_order", "a stage claimed no stage decided");
        }
    }
}

/// A fault's message carries the guest's text — its `Err`, its panic message,
/// its stderr — into the gateway's log, and so does the detail of a good
/// answer (in the logged decision record). A carriage return, a line separator
/// or a right-to-left override in it reaches the log escaped, on every path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn line_breaks_and_bidi_overrides_in_a_fault_reach_the_log_escaped() {
    for fault in ["err-forge", "trap-forge", "detail-forge"] {
        let options = format!("fault = \"{fault}\"");
        let (gw, _mock, _run, d) = through_serve(&options, &options, 25).await;
        let log = gw.log();
        let raw = ['\r', '\u{2028}', '\u{2029}', '\u{85}', '\u{b}', '\u{202e}'];
        assert!(!log.chars().any(|c| raw.contains(&c)), "{fault}: a raw control or separator reached the log");
        assert!(log.contains("FORGED via CR"), "{fault}: the message is there");
        if fault != "detail-forge" {
            // (The detail is in a JSON record, which escapes the backslashes.)
            assert!(log.contains("innocent\\r2026-12-01"), "{fault}: escaped");
            assert!(log.contains("FORGED via CR\\u{2028}LS\\u{2029}PS\\u{85}NEL\\u{b}VT\\u{202e}RTL"), "{fault}");
        }
        let errs = rank_errors(&d);
        assert!(errs.iter().all(|(_, m)| !m.chars().any(|c| raw.contains(&c))), "{fault}: {errs:?}");
    }
}

/// A plugin that succeeds but takes 460 ms (in `observe`, within its budget:
/// a 400 ms deadline gives 500 ms of own time) with one instance: nearly
/// every `rank` finds it busy (`max_instances = 1`: the pool may not grow). That is recorded as `busy` — not as a `timeout` of the plugin, never
/// held against it by the breaker — with a message that says how long its
/// calls take and what to do; since the measured hold times say no instance
/// comes back within the deadline, requests do not wait it out for nothing;
/// and a stage skipped for most requests says so in `/status`, the metrics and
/// `x-poolgate-reason`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_plugin_with_too_few_instances_is_busy_with_the_remedy_and_costs_little() {
    let mock = MockUpstream::start().await;
    let stages = format!(
        "[policy]\ninstances = 1\nmax_instances = 1\n\n{}",
        hostile(&misbehave(), "fault = \"pass\", observe = \"sleep\", ms = 460", 400)
    );
    let gw = start(&mock, tempdir::Dir::new("busy"), &stages);
    let run = drive(&gw, REQUESTS * 2).await;
    run.assert_all_served("slow observe");
    let d = decisions(&gw).await;
    let errs = rank_errors(&d);
    assert!(errs.iter().any(|(c, _)| c == "busy"), "{errs:?}");
    assert!(errs.iter().all(|(c, _)| c == "busy"), "only busy skips, never a timeout of the plugin: {errs:?}");
    let message = &errs[0].1;
    // Calls hold an instance longer than a request may wait: the remedy is a
    // faster plugin first, more instances second.
    assert!(message.contains("make the plugin's calls faster (or raise `[policy] max_instances`, now 1)"), "{message}");
    assert!(message.contains("ms (observe)"), "the message says how long calls take: {message}");
    // Skipped for most requests: said in /status, the metrics and the answers.
    assert!(
        message.contains("stage hostile skipped as busy for") && message.contains("of its last 64 rankings"),
        "{message}"
    );
    let noted = run.headers.iter().filter(|(reason, _)| reason.contains("; stage hostile skipped as busy for")).count();
    assert!(
        noted > 0,
        "x-poolgate-reason says the stage is mostly skipped: {:?}",
        &run.headers[run.headers.len() - 3..]
    );
    let stage = hostile_stage(&gw).await;
    assert_eq!(stage["breaker"]["state"], "closed", "{stage:#}");
    assert_eq!(stage["rank"]["failures"], 0, "{stage:#}");
    assert!(stage["rank"]["busy"].as_u64().unwrap() > 0, "{stage:#}");
    assert_eq!(stage["instances"], 1, "{stage:#}");
    assert_eq!(stage["pool"]["max"], 1, "{stage:#}");
    assert!(stage["call_ms"]["observe"].as_f64().unwrap() >= 40.0, "{stage:#}");
    assert!(
        stage["busy_share"]["busy"].as_u64().unwrap() * 2 > stage["busy_share"]["of"].as_u64().unwrap(),
        "{stage:#}"
    );
    assert!(stage["warning"].as_str().unwrap().contains("off in effect"), "{stage:#}");
    let metrics = Gateway::client().get(format!("{}/metrics", gw.url)).send().await.unwrap().text().await.unwrap();
    assert!(
        metrics.lines().any(|l| l.starts_with("poolgate_policy_errors_total")
            && l.contains("cause=\"busy\"")
            && l.contains("stage=\"hostile\"")),
        "{metrics}"
    );
    let share = metrics
        .lines()
        .find(|l| l.starts_with("poolgate_stage_busy_share{") && l.contains("stage=\"hostile\""))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert!(share.is_some_and(|s| s > 0.5), "{metrics}");
    // Waiting the whole deadline for an instance that will not come would cost
    // every request 400 ms.
    let mut waits: Vec<f64> = hostile_records(&d).into_iter().map(|(_, us, _)| us).collect();
    waits.sort_by(f64::total_cmp);
    let median = waits[waits.len() / 2];
    assert!(median < 10_000.0, "the median request waited {median} µs for an instance");
}

/// A third-party `affinity.wasm` is not `builtin:affinity`: its state scope is
/// its own, so emptying it leaves the built-in's session bindings alone — and
/// the built-in keeps them across a reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_named_like_a_builtin_has_a_state_scope_of_its_own() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("scopes");
    let impostor = dir.0.join("affinity.wasm");
    std::fs::copy(misbehave(), &impostor).unwrap();
    let path = dir.0.join("poolgate.toml");
    // The impostor runs first: sharing the built-in's scope, it would empty
    // the session bindings before every ranking.
    let stages = format!(
        "[[policy.chain]]\nplugin = \"{}\"\nname = \"hostile\"\nconfig = {{ fault = \"state-clobber\" }}\n\n\
         [[policy.chain]]\nplugin = \"builtin:affinity\"\n",
        impostor.display()
    );
    let gw = start(&mock, dir, &stages);
    let client = Gateway::client();
    let send = |session: &'static str| {
        let (client, url) = (client.clone(), gw.url.clone());
        async move {
            let r = client
                .post(format!("{url}/v1/messages"))
                .header("anthropic-version", "2023-06-01")
                .header("x-claude-code-session-id", session)
                .json(&support::message(MODEL, false))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let reason = header(&r, "x-poolgate-reason");
            let _ = r.bytes().await;
            reason
        }
    };
    // The first request binds the session (in `observe`); every later one
    // finds the binding, though the impostor empties its own scope each time.
    send("s-1").await;
    for i in 0..3 {
        assert_eq!(send("s-1").await, "session_affinity", "request {i}: the binding was evicted by another plugin");
    }
    // A reload (same plugins, a changed option): the binding is still there.
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace(
            "plugin = \"builtin:affinity\"\n",
            "plugin = \"builtin:affinity\"\nconfig = { idle_ttl_ms = 7200000 }\n",
        ),
    )
    .unwrap();
    let r = Gateway::client().post(format!("{}/admin/reload", gw.url)).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    assert_eq!(send("s-1").await, "session_affinity", "the binding did not survive the reload");
}

/// Opens `n` streams at once (released together by a barrier), each its own
/// Claude Code session, and reads each to its end: the statuses.
async fn burst(url: &str, n: usize, wave: usize) -> Vec<u16> {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    poolgate::https::install_crypto();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (barrier, client, url) = (barrier.clone(), client.clone(), url.to_string());
            tokio::spawn(async move {
                let user_id =
                    json!({ "device_id": "d", "account_uuid": "u", "session_id": format!("burst-{wave}-{i}") })
                        .to_string();
                let body = json!({
                    "model": "claude-sonnet-4-5", "max_tokens": 64, "stream": true,
                    "metadata": { "user_id": user_id },
                    "messages": [{ "role": "user", "content": "hello" }],
                });
                barrier.wait().await;
                match client
                    .post(format!("{url}/v1/messages"))
                    .header("anthropic-version", "2023-06-01")
                    .json(&body)
                    .send()
                    .await
                {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        match r.bytes().await {
                            Ok(b) if String::from_utf8_lossy(&b).contains("message_stop") => status,
                            _ => 0,
                        }
                    }
                    Err(_) => 0,
                }
            })
        })
        .collect();
    let mut statuses = Vec::with_capacity(n);
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    statuses
}

/// #23: the operator's freshness reaches the plugins end to end: `[policy]
/// freshness_ms`, a stage's own `freshness_ms` over it, and a reload that
/// changes it, each seen by the plugin (`host.freshness-ms`) in the decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_freshness_reaches_every_stage_and_follows_a_reload() {
    let mock = MockUpstream::start().await;
    let stages = |policy: u64, own: u64| {
        format!(
            "[policy]\nfreshness_ms = {policy}\n\n             [[policy.chain]]\nplugin = \"{m}\"\nname = \"inherits\"\nconfig = {{ fault = \"freshness\" }}\n\n             [[policy.chain]]\nplugin = \"{m}\"\nname = \"own\"\nfreshness_ms = {own}\n             config = {{ fault = \"freshness\" }}\n",
            m = misbehave()
        )
    };
    let dir = tempdir::Dir::new("freshness");
    let path = dir.0.join("poolgate.toml");
    let gw = start(&mock, dir, &stages(123_000, 4_000));
    let seen = || async {
        let r = send_message(&Gateway::client(), &gw.url, MODEL).await.unwrap();
        assert_eq!(r.status(), 200);
        let d = decisions(&gw).await;
        let newest = d.first().expect("a decision").clone();
        let reasons: Vec<String> = newest["attempts"][0]["decision"]["stages"]
            .as_array()
            .unwrap_or_else(|| panic!("stage records: {newest:#}"))
            .iter()
            .map(|s| s["reason"].as_str().unwrap_or_default().to_string())
            .collect();
        reasons
    };
    assert_eq!(seen().await, ["freshness-123000", "freshness-4000"]);
    let text = std::fs::read_to_string(&path).unwrap();
    let text = text
        .replace("freshness_ms = 123000", "freshness_ms = 60000")
        .replace("freshness_ms = 4000", "freshness_ms = 7000");
    std::fs::write(&path, text).unwrap();
    let r = Gateway::client().post(format!("{}/admin/reload", gw.url)).bearer_auth(ADMIN).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(seen().await, ["freshness-60000", "freshness-7000"]);
}

/// A morning burst: 200 slow streams opening at once, wave after wave, through
/// the built-in default chain on this 2-core machine. The built-ins answer in
/// microseconds: no ranking may skip a stage as `busy`, no `observe` call may
/// be lost and no request fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_streams_opening_together_skips_no_stage_loses_no_observe_and_fails_no_request() {
    const STREAMS: usize = 200;
    const WAVES: usize = 10;
    let mock = MockUpstream::start().await;
    let mut accounts = String::new();
    let mut env = vec![("PG_ADMIN".to_string(), ADMIN.to_string())];
    for i in 0..4 {
        mock.account(&format!("key-{i}")).set_default(poolgate_mock_upstream::Step::SlowStream { chunk_delay_ms: 40 });
        accounts +=
            &format!("[[accounts]]\nid = \"a{i}\"\napi_key_env = \"KEY_{i}\"\nbase_url = \"{}\"\n\n", mock.base_url());
        env.push((format!("KEY_{i}"), format!("key-{i}")));
    }
    let dir = tempdir::Dir::new("burst");
    let path = dir.0.join("poolgate.toml");
    std::fs::write(&path, format!("[server]\nadmin_token_env = \"PG_ADMIN\"\n\n{accounts}")).unwrap();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let gw = Gateway::start_file(&path, &env, dir);
    let started = poolgate::clock::machine_instant();
    // Each wave opens while the streams of the last ones are still running.
    let mut waves = Vec::new();
    for wave in 0..WAVES {
        let gw_url = gw.url.clone();
        waves.push(tokio::spawn(async move { burst(&gw_url, STREAMS, wave).await }));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let mut failed = 0;
    for w in waves {
        failed += w.await.unwrap().iter().filter(|s| **s != 200).count();
    }
    let took = started.elapsed();
    let status = gw.admin_json("/status", ADMIN).await;
    let stages = status["chain"].as_array().unwrap();
    let mut report = Vec::new();
    let (mut rank_busy, mut observe_busy, mut dropped) = (0, 0, 0);
    for s in stages {
        rank_busy += s["rank"]["busy"].as_u64().unwrap();
        observe_busy += s["observe"]["busy"].as_u64().unwrap();
        dropped += s["pool"]["observe_dropped"].as_u64().unwrap();
        let per_instance = s["idle_memory_bytes"].as_u64().unwrap() / s["idle_instances"].as_u64().unwrap().max(1);
        report.push(format!(
            "{}: rank calls {} busy {}, observe calls {} busy {}, instances peak {} (max {}), {} KiB each, call_ms {}",
            s["name"],
            s["rank"]["calls"],
            s["rank"]["busy"],
            s["observe"]["calls"],
            s["observe"]["busy"],
            s["pool"]["peak"],
            s["pool"]["max"],
            per_instance >> 10,
            s["call_ms"]
        ));
        if s["rank"]["busy"].as_u64() > Some(0) {
            report.push(format!("  rank: {}", s["rank"]));
        }
    }
    eprintln!("{} streams in {took:?}\n{}", STREAMS * WAVES, report.join("\n"));
    assert_eq!(failed, 0, "requests failed in the burst");
    assert_eq!((observe_busy, dropped), (0, 0), "observe calls lost:\n{}", report.join("\n"));
    // A microsecond call that yields (its thread preempted at an epoch tick)
    // moves to the plugin call threads instead of waiting, its instance held,
    // behind every request task of the burst (policy/calls.rs): before that,
    // this debug build on two cores skipped 0 to 23 % of rankings as `busy`.
    let rankings = STREAMS * WAVES * stages.len();
    eprintln!("{rank_busy} of {rankings} rankings skipped as busy");
    assert_eq!(rank_busy, 0, "fast stages skipped as busy in the burst:\n{}", report.join("\n"));
}

/// A later `configure` that never ends — naps of 100 ms, forever — would leave
/// the pool empty and the stage skipped with nothing recorded. The refill
/// builds in parallel (two at once here), cuts each build at its bound, counts
/// it as a `configure` timeout in `/status` and `/metrics`, and the breaker
/// opens on those failures; every request is served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_builds_that_never_end_are_cut_counted_and_open_the_breaker() {
    let mock = MockUpstream::start().await;
    let stages = format!(
        "[policy]\ninstances = 3\nconfigure_timeout_ms = 200\n\n\
         [policy.breaker]\nfailures = 3\ncooldown_ms = 60000\n\n\
         [[policy.chain]]\nplugin = \"{}\"\nname = \"hostile\"\n\
         config = {{ fault = \"pass\", configure = \"pool-nap-after-first\" }}\n",
        misbehave()
    );
    let gw = start(&mock, tempdir::Dir::new("refill-naps"), &stages);
    let mut seen_parallel = false;
    let started = poolgate::clock::machine_instant();
    let stage = loop {
        let stage = hostile_stage(&gw).await;
        seen_parallel |= stage["pool"]["building"].as_u64().unwrap() >= 2;
        if stage["breaker"]["state"] == "open" {
            break stage;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the breaker never opened on failing builds: {stage:#}");
        let r = send_message(&Gateway::client(), &gw.url, MODEL).await.unwrap();
        assert_eq!(r.status(), 200);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(seen_parallel, "the two missing instances were built one at a time: {stage:#}");
    assert!(stage["configure"]["failures"].as_u64().unwrap() >= 3, "{stage:#}");
    assert_eq!(stage["configure"]["last"]["cause"], "timeout", "{stage:#}");
    assert!(stage["pool"]["live"].as_u64().unwrap() <= 3, "{stage:#}");
    let metrics = Gateway::client().get(format!("{}/metrics", gw.url)).send().await.unwrap().text().await.unwrap();
    assert!(
        metrics.lines().any(|l| l.starts_with("poolgate_policy_background_errors_total")
            && l.contains("stage=\"hostile\"")
            && l.contains("phase=\"configure\"")
            && l.contains("cause=\"timeout\"")),
        "{metrics}"
    );
    let run = drive(&gw, REQUESTS).await;
    run.assert_all_served("while the breaker is open on failing builds");
}

/// A stage whose `configure` holds `mib` MiB and then sleeps 200 ms at a time,
/// forever: no per-wait timer cuts it, only the bound on the whole load.
fn napping(mib: usize) -> String {
    format!(
        "[[policy.chain]]\nplugin = \"{}\"\nname = \"stuck\"\n\
         config = {{ fault = \"pass\", configure = \"reload-nap\", ms = 200, bytes = {} }}\n\n\
         [[policy.chain]]\nplugin = \"builtin:headroom\"\n",
        misbehave(),
        mib << 20
    )
}

/// `[policy]` with the configure budget of the reload tests below.
fn configure_timeout(ms: u64) -> String {
    format!("[policy]\nconfigure_timeout_ms = {ms}\n\n")
}

/// POST /admin/reload: the status, the JSON answer and how long it took.
async fn admin_reload(url: String) -> (u16, Value, Duration) {
    let started = poolgate::clock::machine_instant();
    let (status, body) = support::admin_post(&url, "/admin/reload", Some(ADMIN), "").await;
    (status, body, started.elapsed())
}

/// Waits until the gateway's RSS is under `kib`; false if it is not within 10 s.
async fn rss_settles_under(gw: &Gateway, kib: u64) -> bool {
    let started = poolgate::clock::machine_instant();
    while started.elapsed() < Duration::from_secs(10) {
        if rss_kib(gw.pid()) < kib {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// A reload whose `configure` never ends is refused within its bound (twice
/// `configure_timeout_ms` plus 2 s: 4 s here), naming the stage and the phase,
/// and its build is dropped: four such reloads, each holding 48 MiB in the
/// napping instance, leave the gateway's RSS within 40 MiB of where it was
/// (measured: 4–20 MiB, what allocators keep; a build left running would add
/// 48 MiB each), requests keep being served and the running configuration
/// stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_whose_configure_never_ends_is_refused_in_its_bound_and_leaves_nothing() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("reload-nap");
    let path = dir.0.join("poolgate.toml");
    let plain = "[[policy.chain]]\nplugin = \"builtin:headroom\"\nname = \"plain\"\n";
    let gw = start(&mock, dir, &format!("{}{plain}", configure_timeout(1000)));
    let good = std::fs::read_to_string(&path).unwrap();
    drive(&gw, 40).await;
    let baseline = rss_kib(gw.pid());
    std::fs::write(&path, good.replace(plain, &napping(48))).unwrap();
    for i in 0..4 {
        let (status, body, took) = admin_reload(gw.url.clone()).await;
        assert_eq!(status, 422, "reload {i}: {body}");
        let errors = body["errors"].to_string();
        assert!(errors.contains("policy.chain[0] (`stuck`)"), "reload {i} names the stage: {errors}");
        assert!(errors.contains("configure"), "reload {i} names the phase: {errors}");
        // 4 s bound, plus compiling the guest once and a busy machine.
        assert!(took < Duration::from_secs(20), "reload {i} took {took:?}");
        eprintln!("refused reload {i} answered in {took:?}, RSS {} KiB: {errors}", rss_kib(gw.pid()));
    }
    let settled = rss_settles_under(&gw, baseline + 40 * 1024).await;
    eprintln!("RSS {baseline} KiB before, {} KiB after four refused reloads", rss_kib(gw.pid()));
    assert!(settled, "four refused reloads left RSS at {} KiB (from {baseline} KiB)", rss_kib(gw.pid()));
    let st = gw.admin_json("/status", ADMIN).await;
    assert_eq!(st["config"]["generation"], 1, "{st}");
    assert_eq!(st["chain"][0]["name"], "plain", "{st}");
    drive(&gw, REQUESTS).await.assert_all_served("after the refused reloads");
}

/// A newer reload supersedes one stuck in `configure` rather than waiting
/// behind it: the stuck build is dropped (its memory comes back), the newer
/// configuration loads promptly — in seconds, where the stuck one's bound is
/// 22 s — and the admin POST of the superseded reload answers with the
/// outcome of the reload that superseded it (`superseded_by` naming its
/// trigger), as docs/configuration.md (Reloading) says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_reload_supersedes_one_stuck_in_configure() {
    let mock = MockUpstream::start().await;
    let dir = tempdir::Dir::new("reload-supersede");
    let path = dir.0.join("poolgate.toml");
    let plain = "[[policy.chain]]\nplugin = \"builtin:headroom\"\nname = \"plain\"\n";
    let gw = start(&mock, dir, &format!("{}{plain}", configure_timeout(10_000)));
    let good = std::fs::read_to_string(&path).unwrap();
    drive(&gw, 40).await;
    let baseline = rss_kib(gw.pid());
    std::fs::write(&path, good.replace(plain, &napping(48))).unwrap();
    let stuck = tokio::spawn(admin_reload(gw.url.clone()));
    // The napping instance holds its 48 MiB: the stuck build is under way.
    support::eventually("the stuck configure runs", Duration::from_secs(30), async || {
        rss_kib(gw.pid()) > baseline + 40 * 1024
    })
    .await;
    eprintln!("RSS {} KiB with the stuck configure running", rss_kib(gw.pid()));
    std::fs::write(&path, good.replace("name = \"plain\"", "name = \"winner\"")).unwrap();
    let (status, body, took) = admin_reload(gw.url.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert!(took < Duration::from_secs(8), "the newer reload waited for the stuck one: {took:?}");
    let (status, first, first_took) = stuck.await.unwrap();
    assert_eq!(status, 200, "the superseded reload answers with the winner's outcome: {first}");
    assert_eq!(first["ok"], true, "{first}");
    assert!(first["superseded_by"].is_string(), "{first}");
    assert!(first_took < Duration::from_secs(20), "the superseded reload answered after {first_took:?}");
    let st = gw.admin_json("/status", ADMIN).await;
    assert_eq!(st["chain"][0]["name"], "winner", "the newest file is loaded: {st}");
    // The winner is the newer admin reload or the file watcher's (it saw the
    // write too); if both loaded, the superseded one names the first.
    let (won, now) = (first["generation"].as_u64().unwrap_or(0), st["config"]["generation"].as_u64().unwrap_or(0));
    assert!(won >= 2 && won <= now, "{first} {st}");
    assert_eq!(st["config"]["last_reload"]["ok"], true, "{st}");
    let settled = rss_settles_under(&gw, baseline + 24 * 1024).await;
    eprintln!(
        "RSS {baseline} KiB before, {} KiB after; the newer reload took {took:?}, the superseded one answered \
         after {first_took:?}: {first}",
        rss_kib(gw.pid())
    );
    assert!(settled, "the superseded build's memory stayed: {} KiB (from {baseline} KiB)", rss_kib(gw.pid()));
    drive(&gw, REQUESTS).await.assert_all_served("after the superseding reload");
}

/// The attacks of #22: a plugin whose `rank`, `observe` or `configure` is a
/// loop of short sleeps (10 ms, far under any single-wait bound — a retry loop
/// with a short sleep). The waits add up to the call's budget (25 ms deadline +
/// 20 ms slack), the call is cut as `timeout` naming the phase, the breaker
/// counts it and opens, and no request fails or is held: p99 under 1 s, which
/// is the 45 ms budget (180 ms hard cap) with room for a debug build on two
/// cores shared with other builds. Before #22 such a `rank` held each request
/// until its client gave up, with nothing recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_napping_in_short_pieces_is_cut_at_its_budget_in_every_phase() {
    const P99: Duration = Duration::from_secs(1);
    let (gw, _mock, run, d) = through_serve("rank naps", "fault = \"budget-nap\", ms = 10", 25).await;
    assert!(run.p99() < P99, "rank naps: p99 {:?}", run.p99());
    let timeouts: Vec<_> = rank_errors(&d).into_iter().filter(|(c, _)| c == "timeout").collect();
    assert!(!timeouts.is_empty(), "{:?}", rank_errors(&d));
    let message = &timeouts[0].1;
    assert!(message.starts_with("rank cut after "), "{message}");
    assert!(message.contains("over its budget of 45 ms (25 ms deadline + 20 ms slack)"), "{message}");
    assert!(message.contains("most of it waiting in host calls"), "{message}");
    assert_breaker_opened(&gw, "rank naps").await;
    drop(gw);

    let options = "fault = \"pass\", observe = \"budget-nap\", ms = 10";
    let (gw, _mock, run, _) = through_serve("observe naps", options, 25).await;
    assert!(run.p99() < P99, "observe naps: p99 {:?}", run.p99());
    let d = assert_breaker_opened(&gw, "observe naps").await;
    let bg = background_errors(&d);
    let observed: Vec<_> = bg.iter().filter(|(c, _)| c == "observe:timeout").collect();
    assert!(!observed.is_empty(), "{bg:?}");
    assert!(observed[0].1.starts_with("observe cut after "), "{}", observed[0].1);
    let stage = hostile_stage(&gw).await;
    assert_eq!(stage["observe"]["last"]["cause"], "timeout", "{stage:#}");
    drop(gw);

    // Every instance but the first naps in `configure` (with a 300 ms
    // configure deadline: a 375 ms budget). The first serves; the refill's
    // builds are cut, recorded and counted.
    let options = "fault = \"pass\", configure = \"budget-nap-after-first\", ms = 10";
    let mock = MockUpstream::start().await;
    let stages = format!("[policy]\nconfigure_timeout_ms = 300\n\n{}", hostile(&misbehave(), options, 25));
    let gw = start(&mock, tempdir::Dir::new("configure-naps"), &stages);
    support::eventually("a napping build is cut and counted", Duration::from_secs(10), async || {
        hostile_stage(&gw).await["configure"]["failures"].as_u64() >= Some(1)
    })
    .await;
    let run = drive(&gw, REQUESTS).await;
    run.assert_all_served("configure naps");
    assert!(run.p99() < P99, "configure naps: p99 {:?}", run.p99());
    let stage = hostile_stage(&gw).await;
    let last = &stage["configure"]["last"];
    assert_eq!(last["cause"], "timeout", "{stage:#}");
    let message = last["message"].as_str().unwrap();
    assert!(message.starts_with("configure cut after "), "{message}");
    assert!(message.contains("over its budget of 375 ms"), "{message}");
}

/// `rank` calls come before queued `observe` calls. One instance, whose
/// `observe` takes 10 ms: 100 requests at once leave a second of observes
/// queued behind them. The requests that follow are ranked at once — a `rank`
/// waits at most for the call in progress, never behind the queue — so no
/// ranking is skipped as `busy`. (With one queue for both, each of them waited
/// behind the backlog past its 200 ms deadline and was skipped.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_observes_never_make_a_ranking_wait_behind_them() {
    let mock = MockUpstream::start().await;
    let stages = format!(
        "[policy]\ninstances = 1\nmax_instances = 1\n\n{}",
        hostile(&misbehave(), "fault = \"pass\", observe = \"sleep\", ms = 10", 200)
    );
    let gw = start(&mock, tempdir::Dir::new("observe-queue"), &stages);
    let client = Gateway::client();
    let at_once: Vec<_> = (0..100).map(|_| send_message(&client, &gw.url, MODEL)).collect();
    for r in futures_util::future::join_all(at_once).await {
        assert_eq!(r.unwrap().status(), 200);
    }
    let backlog = hostile_stage(&gw).await["pool"]["observe_queued"].as_u64().unwrap();
    let run = drive(&gw, REQUESTS).await;
    run.assert_all_served("after a backlog of observes");
    let stage = hostile_stage(&gw).await;
    assert!(backlog >= 20, "no backlog of observes to wait behind ({backlog}): {stage:#}");
    assert_eq!(stage["rank"]["busy"], 0, "rankings waited behind {backlog} queued observes: {stage:#}");
}
