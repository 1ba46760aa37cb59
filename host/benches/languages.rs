//! What a plugin's language costs: the reset-soonest example in Rust, Python,
//! JavaScript and C (`examples/plugins/`), built from source, measured in one
//! run so the ratios against Rust are fair on a noisy machine.
//!
//! `cargo bench -p poolgate --bench languages` prints, per language: component
//! size and build time; first load (a full compile) and cached load (a fresh
//! engine reading the on-disk cache, i.e. a restart); the first `rank` call
//! after load; and p50/p99 of `rank` on a warm instance over 16 and 64
//! accounts, with how many calls would have missed the default 25 ms deadline.
//! The figures are recorded in docs/benchmarks.md and each example's README.
//! `LANG_BENCH_ITERS` caps the iterations per size (default 20,000; Python and
//! JavaScript stop after 4 s per size).

#[path = "../tests/all/bounded/mod.rs"]
#[allow(dead_code, reason = "the integration tests' helper, of which the bench uses part")]
mod bounded;
#[path = "../tests/all/example_plugins/mod.rs"]
#[allow(dead_code, reason = "the integration tests' helper, of which the bench uses part")]
mod example_plugins;

use std::sync::Arc;
use std::time::Duration;

use example_plugins::{Built, Lang};
use poolgate::case::Case;
use poolgate::policy::plugin::Plugin;
use poolgate::policy::{Limits, MemoryState, PluginRef, PluginSpec, PolicyEngine};

const NOW: u64 = 1_760_000_000_000;
const SIZES: [usize; 2] = [16, 64];

/// A realistic pool: 5h and 7d windows on every account, resets spread over
/// five hours, one account in ten over the 0.9 limit (so the ranker skips some).
fn pool(n: usize) -> Case {
    let accounts: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            let used = if i % 10 == 7 { 0.95 } else { (i * 37 % 90) as f64 / 100.0 };
            serde_json::json!({
                "id": format!("acct-{i}"),
                "in_flight": i % 3,
                "windows": [
                    { "name": "5h", "utilization": used, "resets_at_ms": NOW + 60_000 * ((i * 53 % 300) as u64 + 1), "status": "allowed" },
                    { "name": "7d", "utilization": (i * 53 % 100) as f64 / 100.0, "resets_at_ms": NOW + 86_400_000, "status": "allowed" },
                ],
            })
        })
        .collect();
    let case = serde_json::json!({ "now_ms": NOW, "request": { "model": "claude-sonnet-4-5" }, "accounts": accounts });
    Case::parse(&case.to_string()).unwrap()
}

fn load(engine: &Arc<PolicyEngine>, b: &Built, case: &Case) -> Plugin {
    let plugin = PluginRef::Path(b.wasm.clone());
    let spec = PluginSpec {
        scope: plugin.default_scope(),
        plugin,
        config_json: "{}".into(),
        // Generous: the bench measures the calls, it does not cut them short.
        limits: Limits { deadline: Duration::from_secs(1), ..Limits::default() },
        max_idle: 1,
        max_instances: 1,
    };
    poolgate::policy::block_on(Plugin::load(engine, spec, case.pool(), Arc::new(MemoryState::default())))
        .expect("the example loads")
}

struct Row {
    lang: Lang,
    size: u64,
    build: Duration,
    first_load: Duration,
    cached_load: Duration,
    first_call: Duration,
    /// (accounts, p50, p99, calls, calls over the default deadline)
    calls: Vec<(usize, Duration, Duration, usize, usize)>,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn measure(b: &Built) -> Row {
    let bytes = std::fs::read(&b.wasm).unwrap();
    let cache = example_plugins::examples_target().join("bench-cache").join(b.lang.dir_name());
    let _ = std::fs::remove_dir_all(&cache);

    // First load: nothing cached, the component is compiled (what a new
    // plugin costs at load or reload, off the request path).
    let cold = PolicyEngine::new(Some(cache.clone())).unwrap();
    let t = poolgate::clock::machine_instant();
    cold.compile(&bytes, "bench").unwrap();
    let first_load = t.elapsed();

    // Cached load: a restarted gateway, same cache directory.
    let restarted = PolicyEngine::new(Some(cache)).unwrap();
    let t = poolgate::clock::machine_instant();
    restarted.compile(&bytes, "bench").unwrap();
    let cached_load = t.elapsed();

    let deadline = Duration::from_millis(poolgate::policy::DEFAULT_DEADLINE_MS);
    let iters: usize = std::env::var("LANG_BENCH_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let budget = Duration::from_secs(4);
    let mut first_call = Duration::ZERO;
    let mut calls = Vec::new();
    for n in SIZES {
        let case = pool(n);
        let plugin = load(&restarted, b, &case);
        let c = case.candidates(poolgate::account::DEFAULT_FRESHNESS_MS);
        let mut req = case.request();
        // Calls are asynchronous, as in `serve`: time them inside one runtime.
        let samples = poolgate::policy::block_on(async {
            let t = poolgate::clock::machine_instant();
            plugin.rank(&req, &c.accounts, &c.windows).await.unwrap();
            if n == SIZES[0] {
                first_call = t.elapsed();
            }
            for _ in 0..100 {
                plugin.rank(&req, &c.accounts, &c.windows).await.unwrap();
            }
            let mut samples = Vec::with_capacity(iters);
            let started = poolgate::clock::machine_instant();
            while samples.len() < iters && (samples.len() < 200 || started.elapsed() < budget) {
                req.id += 1;
                let t = poolgate::clock::machine_instant();
                let r = plugin.rank(&req, &c.accounts, &c.windows).await.unwrap();
                samples.push(t.elapsed());
                std::hint::black_box(r);
            }
            samples
        });
        let mut samples = samples;
        samples.sort();
        let over = samples.iter().filter(|d| **d > deadline).count();
        calls.push((n, percentile(&samples, 0.5), percentile(&samples, 0.99), samples.len(), over));
    }
    Row { lang: b.lang, size: b.size, build: b.build_time, first_load, cached_load, first_call, calls }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    // `cargo bench` passes `--bench`; a plain `cargo test --benches` run passes
    // nothing and should not spend minutes compiling 18 MB components.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let built = example_plugins::build_all_examples();
    let rows: Vec<Row> = built.iter().map(measure).collect();
    let rust = &rows[0];

    println!("\n## Plugins in other languages: reset-soonest, one rank call on a warm instance\n");
    println!(
        "| language | size | build | first load (compile) | cached load | first call | accounts | p50 µs | p99 µs | p50 vs Rust | calls | over 25 ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        for (i, (n, p50, p99, count, over)) in r.calls.iter().enumerate() {
            let base = rust.calls[i].1;
            let head = if i == 0 {
                format!(
                    "| {} | {:.1} KiB | {:.1} s | {:.2} s | {:.1} ms | {:.2} ms ",
                    r.lang,
                    r.size as f64 / 1024.0,
                    r.build.as_secs_f64(),
                    r.first_load.as_secs_f64(),
                    r.cached_load.as_secs_f64() * 1e3,
                    r.first_call.as_secs_f64() * 1e3,
                )
            } else {
                "| | | | | | ".to_string()
            };
            println!(
                "{head}| {n} | {:.1} | {:.1} | {:.1}x | {count} | {over} |",
                us(*p50),
                us(*p99),
                us(*p50) / us(base)
            );
        }
    }
    println!("\nfirst load vs cached load (restart):");
    for r in &rows {
        println!(
            "  {}: {:.2} s → {:.1} ms ({:.0}x faster)",
            r.lang,
            r.first_load.as_secs_f64(),
            r.cached_load.as_secs_f64() * 1e3,
            r.first_load.as_secs_f64() / r.cached_load.as_secs_f64().max(1e-9)
        );
    }
}
