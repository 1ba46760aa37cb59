//! The chain's cost: 1 and 3 stages of Rust plugins over 4, 16 and 64 accounts,
//! against native Rust ranking of the same data measured in the same run.
//!
//! `cargo bench -p poolgate --bench chain` runs criterion's groups, then prints a
//! per-call p50/p99 table with the ratio to native (the figures recorded in
//! docs/benchmarks.md).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion};
use poolgate::case::Case;
use poolgate::policy::types::{Account, QuotaWindow, Request, WindowKind};
use poolgate::policy::{BreakerConfig, Chain, Limits, MemoryState, PluginRef, PluginSpec, PolicyEngine, StageSpec};

const SIZES: [usize; 3] = [4, 16, 64];
const NOW: u64 = 1_760_000_000_000;

/// A realistic pool: 5h and 7d windows on every account, a per-model bucket on
/// every third, one cooling account.
fn pool(n: usize) -> Case {
    let accounts: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            let mut windows = vec![
                serde_json::json!({ "name": "5h", "utilization": (i * 37 % 100) as f64 / 100.0, "resets_at_ms": NOW + 3_600_000, "status": "allowed" }),
                serde_json::json!({ "name": "7d", "utilization": (i * 53 % 100) as f64 / 100.0, "resets_at_ms": NOW + 86_400_000, "status": "allowed" }),
            ];
            if i % 3 == 0 {
                windows.push(serde_json::json!({ "name": "7d_opus", "utilization": (i * 11 % 100) as f64 / 100.0, "status": "allowed" }));
            }
            let mut a = serde_json::json!({ "id": format!("acct-{i}"), "in_flight": i % 3, "max_in_flight": 4, "windows": windows });
            if i == 1 {
                a["cooldown"] = serde_json::json!({ "until_ms": NOW + 60_000, "reason": "transient" });
            }
            a
        })
        .collect();
    let case = serde_json::json!({
        "now_ms": NOW,
        "request": { "model": "claude-opus-4-1", "session": "bench-session" },
        "accounts": accounts,
    });
    Case::parse(&case.to_string()).unwrap()
}

/// The chains measured: one stage; three copies of one plugin (the goal's
/// like-for-like figure); and a realistic three-stage chain whose affinity stage
/// reads plugin state through the host on every call.
const CHAINS: [(&str, &[&str]); 3] = [
    ("1", &["builtin:headroom"]),
    ("3 same", &["builtin:headroom", "builtin:headroom", "builtin:headroom"]),
    ("3 mixed", &["builtin:skip-exhausted", "builtin:headroom", "builtin:affinity"]),
];

fn chain(engine: &Arc<PolicyEngine>, case: &Case, plugins: &[&str]) -> Chain {
    let specs = plugins
        .iter()
        .map(|p| {
            let r = PluginRef::parse(p);
            StageSpec {
                name: p.to_string(),
                plugin: PluginSpec {
                    scope: r.default_scope(),
                    plugin: r,
                    config_json: "{}".into(),
                    limits: Limits::default(),
                    max_idle: 2,
                    max_instances: 2,
                },
            }
        })
        .collect();
    poolgate::policy::block_on(Chain::load(
        engine,
        specs,
        case.pool(),
        Arc::new(MemoryState::default()),
        BreakerConfig::default(),
    ))
    .unwrap()
}

/// Native Rust headroom ranking over the same records (the baseline).
fn native_headroom(req: &Request, accounts: &[Account], windows: &[QuotaWindow]) -> Vec<u32> {
    let family = poolgate::account::model_family(&req.model);
    let key = |a: &Account| {
        let mut used: f64 = 0.0;
        for w in windows.iter().filter(|w| w.account == a.id) {
            match w.kind {
                WindowKind::FiveHour | WindowKind::SevenDay => used = used.max(w.utilization),
                WindowKind::SevenDayModel if family.is_some() => {
                    let name = poolgate::policy::names::resolve(w.name);
                    if name.strip_prefix("7d_") == family {
                        used = used.max(w.utilization);
                    }
                }
                _ => {}
            }
        }
        let h = 1.0 - used;
        let tier = if !a.usable {
            2
        } else if h <= 0.02 {
            1
        } else {
            0
        };
        (tier, h)
    };
    let keys: Vec<(u8, f64)> = accounts.iter().map(key).collect();
    let mut order: Vec<u32> = (0..accounts.len() as u32).collect();
    order.sort_by(|&a, &b| {
        let (ta, ha) = keys[a as usize];
        let (tb, hb) = keys[b as usize];
        ta.cmp(&tb).then(hb.partial_cmp(&ha).unwrap())
    });
    order
}

fn native_chain(req: &Request, accounts: &[Account], windows: &[QuotaWindow], stages: usize) -> Vec<u32> {
    let mut current: Vec<Account> = accounts.to_vec();
    let mut order = Vec::new();
    for _ in 0..stages {
        order = native_headroom(req, &current, windows);
        current = order.iter().map(|&i| current[i as usize]).collect();
    }
    order
}

fn criterion_groups(c: &mut Criterion, engine: &Arc<PolicyEngine>) {
    let rt = runtime();
    let mut group = c.benchmark_group("chain");
    group.measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(500));
    for n in SIZES {
        let case = pool(n);
        let req = case.request();
        let cands = case.candidates(poolgate::account::DEFAULT_FRESHNESS_MS);
        for (label, plugins) in CHAINS {
            let label = label.replace(' ', "-");
            let ch = chain(engine, &case, plugins);
            group.bench_with_input(BenchmarkId::new(format!("wasm-{label}"), n), &n, |b, _| {
                b.iter(|| black_box(rt.block_on(ch.rank(req.clone(), cands.clone()))))
            });
            let stages = plugins.len();
            group.bench_with_input(BenchmarkId::new(format!("native-{label}"), n), &n, |b, _| {
                b.iter(|| black_box(native_chain(&req, &cands.accounts, &cands.windows, stages)))
            });
        }
    }
    group.finish();
}

fn percentiles(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)].as_nanos() as f64 / 1000.0;
    (at(0.5), at(0.99))
}

/// A single-threaded runtime: chain calls are asynchronous, as in `serve`.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn measure(mut f: impl FnMut(), iters: usize) -> (f64, f64) {
    for _ in 0..iters / 10 {
        f();
    }
    let samples = (0..iters)
        .map(|_| {
            let t = poolgate::clock::machine_instant();
            f();
            t.elapsed()
        })
        .collect();
    percentiles(samples)
}

/// As [`measure`], for a chain: every call awaited inside one runtime, timed
/// from the call to its answer (what a request waits).
fn measure_chain(ch: &Chain, req: &Request, cands: &poolgate::policy::Candidates, iters: usize) -> (f64, f64) {
    runtime().block_on(async {
        for _ in 0..iters / 10 {
            black_box(ch.rank(req.clone(), cands.clone()).await);
        }
        let mut samples = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = poolgate::clock::machine_instant();
            black_box(ch.rank(req.clone(), cands.clone()).await);
            samples.push(t.elapsed());
        }
        percentiles(samples)
    })
}

fn summary(engine: &Arc<PolicyEngine>) {
    println!("\nper-call latency (µs), {} iterations each; ratio = wasm p50 / native p50", 20_000);
    println!(
        "{:<8} {:>8} {:>10} {:>10} {:>12} {:>12} {:>8}",
        "chain", "accounts", "wasm p50", "wasm p99", "native p50", "native p99", "ratio"
    );
    for (label, plugins) in CHAINS {
        for n in SIZES {
            let case = pool(n);
            let req = case.request();
            let cands = case.candidates(poolgate::account::DEFAULT_FRESHNESS_MS);
            let ch = chain(engine, &case, plugins);
            let (w50, w99) = measure_chain(&ch, &req, &cands, 20_000);
            let stages = plugins.len();
            let (n50, n99) = measure(
                || {
                    black_box(native_chain(&req, &cands.accounts, &cands.windows, stages));
                },
                20_000,
            );
            println!("{label:<8} {n:>8} {w50:>10.2} {w99:>10.2} {n50:>12.2} {n99:>12.2} {:>7.1}x", w50 / n50);
        }
    }
    for (label, plugins) in CHAINS {
        println!("{label}: {}", plugins.join(" → "));
    }
    handoff();
}

/// The alternative to calling plugins on the async workers (what the chain
/// above does): handing each chain run to a dedicated plugin thread and
/// waiting for the answer. This measures the round trip alone, with no work
/// on the other side — the least that design would add to every request.
fn handoff() {
    let (tx, rx) = std::sync::mpsc::channel::<tokio::sync::oneshot::Sender<u64>>();
    std::thread::spawn(move || {
        for reply in rx {
            let _ = reply.send(black_box(1));
        }
    });
    let iters = 20_000;
    let (p50, p99) = runtime().block_on(async {
        let mut samples = Vec::with_capacity(iters);
        for i in 0..iters + iters / 10 {
            let t = poolgate::clock::machine_instant();
            let (reply, answer) = tokio::sync::oneshot::channel();
            tx.send(reply).unwrap();
            black_box(answer.await.unwrap());
            if i >= iters / 10 {
                samples.push(t.elapsed());
            }
        }
        percentiles(samples)
    });
    println!("\nround trip to a dedicated plugin thread (no work): p50 {p50:.2} µs, p99 {p99:.2} µs");
}

fn main() {
    let engine = PolicyEngine::new(None).unwrap();
    // CHAIN_SUMMARY_ONLY=1: just the table (a quick A/B of two builds).
    if std::env::var_os("CHAIN_SUMMARY_ONLY").is_some() {
        summary(&engine);
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    criterion_groups(&mut c, &engine);
    c.final_summary();
    // `--profile-time` (for a profiler) or a filter argument: criterion only.
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    if args.is_empty() {
        summary(&engine);
    }
}
