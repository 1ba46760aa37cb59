//! One hostile guest at a time through `poolgate serve`: each way a plugin
//! can fail or misbehave — traps, floods, sleeps, sockets, memory, state,
//! reasons it may not give, huge host calls, forged log lines, a name like a
//! built-in's — is recorded with its cause and costs no request.

use super::*;

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
        // Every failure counted by its cause (the web page's chain table).
        let by_cause = stage["observe"]["by_cause"][cause].as_u64().unwrap_or(0);
        assert!((5..=stage["observe"]["failures"].as_u64().unwrap()).contains(&by_cause), "{what}: {stage:#}");
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
