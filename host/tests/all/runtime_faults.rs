//! Every way a plugin can misbehave ends in a served decision that records
//! `routing_policy_error` with the right cause — and the next call succeeds.

use crate::common;

use common::*;
use poolgate::policy::{Cause, ROUTING_POLICY_ERROR};
use serde_json::json;

/// A chain of the misbehaving guest, faulting only for model `boom`.
fn faulty(fault: &str, deadline_ms: u64) -> (poolgate::case::Case, poolgate::policy::Chain) {
    faulty_with(json!({ "fault": fault, "on_model": "boom" }), deadline_ms)
}

fn faulty_with(config: serde_json::Value, deadline_ms: u64) -> (poolgate::case::Case, poolgate::policy::Chain) {
    let case = pool_case(4);
    let chain = chain(&case, vec![stage(&guest("misbehave"), config, deadline_ms)]);
    (case, chain)
}

/// The fault becomes `routing_policy_error` with `cause`, the input order (pool
/// order) is served, and a following healthy request is ranked by the plugin.
fn assert_fault_then_recovery(fault: &str, cause: Cause) -> String {
    assert_fault_then_recovery_with(json!({ "fault": fault, "on_model": "boom" }), cause)
}

fn assert_fault_then_recovery_with(config: serde_json::Value, cause: Cause) -> String {
    let fault = config["fault"].as_str().unwrap().to_string();
    // Only the endless loop needs a short deadline; the other faults must not race
    // one on a loaded machine.
    let deadline = if fault == "loop" { 20 } else { 2_000 };
    let (case, chain) = faulty_with(config, deadline);
    let d = rank(&chain, &case, "boom");
    assert_eq!(d.reason, ROUTING_POLICY_ERROR, "{fault}: {d:?}");
    assert_eq!(d.policy_errors.len(), 1, "{fault}");
    assert_eq!(d.policy_errors[0].cause, cause, "{fault}: {:?}", d.policy_errors[0]);
    assert_eq!(d.stages[0].error.as_ref().unwrap().cause, cause);
    assert_eq!(d.order, ["a0", "a1", "a2", "a3"], "{fault}: input passes through");

    let next = rank(&chain, &case, "fine");
    assert!(next.policy_errors.is_empty(), "{fault}: next call failed: {next:?}");
    assert_eq!(next.reason, "reversed");
    assert_eq!(next.order, ["a3", "a2", "a1", "a0"]);
    d.policy_errors[0].message.clone()
}

#[test]
fn a_trapping_plugin_is_a_trap() {
    assert_fault_then_recovery("trap", Cause::Trap);
}

/// The loop never ends by itself, so the test ending at all shows the cut,
/// and the message says a bound of the call's cut it — never a wall-clock
/// bound of the test's, which a busy machine breaks.
#[test]
fn an_endless_loop_is_a_timeout() {
    let msg = assert_fault_then_recovery("loop", Cause::Timeout);
    assert!(msg.contains("rank cut after"), "{msg}");
}

#[test]
fn unbounded_allocation_is_oom() {
    assert_fault_then_recovery("oom", Cause::Oom);
}

#[test]
fn duplicate_indices_are_invalid_output() {
    let msg = assert_fault_then_recovery("duplicate", Cause::InvalidOutput);
    assert!(msg.contains("twice"), "{msg}");
}

#[test]
fn unknown_indices_are_invalid_output() {
    let msg = assert_fault_then_recovery("unknown", Cause::InvalidOutput);
    assert!(msg.contains("out of range"), "{msg}");
}

#[test]
fn an_empty_order_is_invalid_output() {
    let msg = assert_fault_then_recovery("empty", Cause::InvalidOutput);
    assert_eq!(msg, "empty order");
}

#[test]
fn an_oversize_order_is_invalid_output() {
    assert_fault_then_recovery("oversize", Cause::InvalidOutput);
}

#[test]
fn a_returned_err_is_an_error() {
    let msg = assert_fault_then_recovery("error", Cause::Error);
    assert!(msg.contains("deliberate error"), "{msg}");
}

#[test]
fn reading_a_file_is_refused() {
    let msg = assert_fault_then_recovery("read-file", Cause::Error);
    assert!(msg.starts_with("file read refused"), "{msg}");
}

#[test]
fn the_environment_is_empty() {
    let msg = assert_fault_then_recovery("env", Cause::Error);
    assert!(msg.starts_with("environment empty"), "{msg}");
}

#[test]
fn opening_a_socket_is_refused() {
    // Something is listening, so only the sandbox can make the connect fail.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let msg =
        assert_fault_then_recovery_with(json!({ "fault": "socket", "on_model": "boom", "addr": addr }), Cause::Error);
    assert!(msg.starts_with("socket refused"), "{msg}");
}

#[test]
fn a_plugin_that_refuses_its_options_refuses_the_chain() {
    let case = pool_case(2);
    let err = poolgate::policy::block_on(poolgate::policy::Chain::load(
        &ENGINE,
        vec![stage(&guest("misbehave"), json!({ "fault": "configure" }), 20)],
        case.pool(),
        std::sync::Arc::new(poolgate::policy::MemoryState::default()),
        Default::default(),
    ))
    .err()
    .expect("refused");
    let msg = format!("{err:#}");
    assert!(msg.contains("configure refused its options"), "{msg}");
    assert!(msg.contains("option `fault`"), "{msg}");
}

#[test]
fn a_file_that_is_not_a_component_is_refused() {
    let dir = std::env::temp_dir().join(format!("pg-notwasm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("junk.wasm");
    std::fs::write(&path, b"not wasm at all").unwrap();
    let case = pool_case(2);
    let err = poolgate::policy::block_on(poolgate::policy::Chain::load(
        &ENGINE,
        vec![stage(path.to_str().unwrap(), json!({}), 20)],
        case.pool(),
        std::sync::Arc::new(poolgate::policy::MemoryState::default()),
        Default::default(),
    ))
    .err()
    .expect("refused");
    assert!(format!("{err:#}").contains("is not a valid WebAssembly component"), "{err:#}");
}

#[test]
fn repeated_failures_open_the_breaker_and_the_stage_is_bypassed() {
    let (case, chain) = faulty("error", 20);
    for _ in 0..5 {
        assert_eq!(rank(&chain, &case, "boom").policy_errors.len(), 1);
    }
    // Open: the stage is skipped without being called — and the decision says
    // so, as a policy error with cause `bypassed`, never as a healthy pool order.
    let d = rank(&chain, &case, "boom");
    assert_eq!(d.reason, ROUTING_POLICY_ERROR);
    assert_eq!(d.policy_errors.len(), 1);
    assert_eq!(d.policy_errors[0].cause, Cause::Bypassed);
    let bypass = d.stages[0].bypassed.as_ref().expect("bypassed");
    assert_eq!(bypass.state, "open");
    assert_eq!(d.order, ["a0", "a1", "a2", "a3"]);
    assert_eq!(chain.status(case.now_ms)[0].breaker.state, "open");
}

#[test]
fn guest_stdio_does_not_break_the_call() {
    let (case, chain) = faulty("print", 20);
    let d = rank(&chain, &case, "boom");
    assert!(d.policy_errors.is_empty(), "{d:?}");
    assert_eq!(d.reason, "printed");
}

/// Threads that keep every core busy for as long as the guard lives.
struct Saturated(std::sync::Arc<std::sync::atomic::AtomicBool>, Vec<std::thread::JoinHandle<()>>);

impl Saturated {
    fn new() -> Saturated {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = (0..cores * 2)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_add(1));
                    }
                })
            })
            .collect();
        Saturated(stop, threads)
    }
}

impl Drop for Saturated {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.1.drain(..) {
            let _ = t.join();
        }
    }
}

/// The budget counts the plugin's own work (fuel), so a plugin that needs
/// microseconds never times out however often its thread is set aside — even
/// with a 1 ms deadline on a machine whose every core is busy.
#[test]
fn a_fast_plugin_never_times_out_on_a_saturated_machine() {
    let case = pool_case(16);
    let chain = chain(&case, vec![stage("builtin:headroom", json!({}), 1), stage("builtin:headroom", json!({}), 1)]);
    let _busy = Saturated::new();
    let started = poolgate::clock::machine_instant();
    let mut calls = 0;
    while calls < 3_000 || started.elapsed() < std::time::Duration::from_secs(2) {
        let d = rank(&chain, &case, "claude-sonnet-4-5");
        assert!(d.policy_errors.is_empty(), "call {calls}: {:?}", d.policy_errors);
        calls += 1;
    }
}

/// And a runaway plugin is cut within its bounds on that saturated machine:
/// the deadline does not stretch because a ticker thread waits for a core.
#[test]
fn an_endless_loop_is_cut_in_time_on_a_saturated_machine() {
    let (case, chain) = faulty("loop", 25);
    let _busy = Saturated::new();
    for _ in 0..3 {
        let started = poolgate::clock::machine_instant();
        let d = rank(&chain, &case, "boom");
        let took = started.elapsed();
        assert_eq!(d.policy_errors[0].cause, Cause::Timeout, "{d:?}");
        assert!(took < std::time::Duration::from_millis(500), "a 25 ms deadline took {took:?}");
    }
}

/// One bulk-memory instruction is not interruptible: a `memory.fill` over
/// 200 MiB (possible only with a raised `memory_mb`) runs to its end on the
/// thread that called, whatever the deadline — what it costs is bounded by the
/// memory an instance may hold, and measured here (docs/writing-plugins.md
/// states the figure and the bound at the largest `memory_mb`). The call still
/// ends, and the next one is served.
#[test]
fn one_memory_fill_runs_to_its_end_bounded_by_the_instance_memory() {
    let case = pool_case(4);
    let mut spec =
        stage(&guest("misbehave"), json!({ "fault": "pool-fill", "on_model": "boom", "bytes": 200 << 20 }), 25);
    spec.plugin.limits.memory_bytes = 256 << 20;
    // The breaker would open on the failing fills; this test measures them.
    let no_breaker = poolgate::policy::BreakerConfig { failures: 0, ..Default::default() };
    let chain = poolgate::policy::block_on(poolgate::policy::Chain::load(
        &ENGINE,
        vec![spec],
        case.pool(),
        std::sync::Arc::new(poolgate::policy::MemoryState::default()),
        no_breaker,
    ))
    .unwrap();
    let mut fills = Vec::new();
    for _ in 0..6 {
        let started = poolgate::clock::machine_instant();
        let d = rank(&chain, &case, "boom");
        let took = started.elapsed();
        // A fresh instance fills (answered, or cut as `timeout` right after the
        // instruction); one that filled already cannot grow again (`error`).
        let cause = d.policy_errors.first().map(|e| e.cause);
        if cause != Some(Cause::Error) {
            fills.push((took, cause));
        }
        assert!(took < std::time::Duration::from_secs(10), "one fill held the call {took:?}");
        let next = rank(&chain, &case, "fine");
        assert!(next.policy_errors.is_empty(), "{:?}", next.policy_errors);
    }
    eprintln!("calls with one 200 MiB memory.fill: {fills:?}");
    assert!(!fills.is_empty());
}

/// The attack of #22: `rank` is a loop of 10 ms sleeps, each far under any
/// single-wait bound. The waits add up, and the call is cut when they reach
/// its budget (25 ms deadline + 20 ms slack), as a `timeout` whose message
/// names the phase and where the time went.
#[test]
fn a_rank_napping_in_short_pieces_is_cut_at_its_budget() {
    let (case, chain) = faulty_with(json!({ "fault": "budget-nap", "on_model": "boom", "ms": 10 }), 25);
    for _ in 0..3 {
        let started = poolgate::clock::machine_instant();
        let d = rank(&chain, &case, "boom");
        let took = started.elapsed();
        let e = &d.policy_errors[0];
        assert_eq!(e.cause, Cause::Timeout, "{d:?}");
        assert!(e.message.starts_with("rank cut after "), "{}", e.message);
        assert!(e.message.contains("most of it waiting in host calls"), "{}", e.message);
        // The budget is 45 ms and the hard cap 180 ms; a second leaves room
        // for a debug build on two busy cores. Before #22 this call never ended.
        assert!(took < std::time::Duration::from_secs(1), "a 45 ms budget took {took:?}");
    }
    assert!(rank(&chain, &case, "fine").policy_errors.is_empty());
}

/// The same in `configure`: a build made of short sleeps is cut at its budget
/// (here 200 ms + 50 ms slack), and the load is refused naming the phase.
#[test]
fn a_configure_napping_in_short_pieces_is_refused_within_its_budget() {
    let case = pool_case(2);
    let mut spec = stage(&guest("misbehave"), json!({ "fault": "pass", "configure": "budget-nap", "ms": 20 }), 25);
    spec.plugin.limits.configure_deadline = std::time::Duration::from_millis(200);
    let started = poolgate::clock::machine_instant();
    let err = poolgate::policy::block_on(poolgate::policy::Chain::load(
        &ENGINE,
        vec![spec],
        case.pool(),
        std::sync::Arc::new(poolgate::policy::MemoryState::default()),
        Default::default(),
    ))
    .err()
    .expect("refused");
    let took = started.elapsed();
    let msg = format!("{err:#}");
    assert!(msg.contains("configure cut after"), "{msg}");
    assert!(msg.contains("over its budget of 250 ms"), "{msg}");
    // Compiling the guest (cached after the first test) plus 250 ms of naps;
    // before #22 the load never ended.
    assert!(took < std::time::Duration::from_secs(20), "took {took:?}");
}
