//! The example rankers in Rust, Python, JavaScript and C (`examples/plugins/`),
//! built from source and run through the real host: each passes the same
//! fixtures and refuses a misspelt option by name; a chain that mixes languages
//! serves requests through `poolgate rank` and the chain API; and large
//! components compile at load, are cached by content hash, and load from that
//! cache without compiling again.
//!
//! A missing toolchain fails these tests with the command that installs it
//! (`.ci/setup` installs them all).

use crate::bounded;

use crate::example_plugins;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bounded::OutputWithin as _;
use example_plugins::{Built, Lang, built, engine, fixtures_dir, warm};
use poolgate::case::Case;
use poolgate::policy::plugin::Plugin;
use poolgate::policy::types::{Outcome, Request};
use poolgate::policy::{BreakerConfig, Chain, Limits, MemoryState, PluginRef, PluginSpec, PolicyEngine};

/// Builds `lang`'s example, runs the shared fixtures through it, and checks that
/// a misspelt option is refused with its name.
fn example_passes_fixtures(lang: Lang) {
    let b = built(lang);
    let engine = engine();
    let compile = warm(&engine, &b.wasm);
    let n = poolgate::fixtures::assert_fixtures(&engine, &b.wasm.display().to_string(), &fixtures_dir())
        .unwrap_or_else(|e| panic!("{lang:?} example: {e:#}"));
    assert!(n >= 12, "the shared fixtures hold {n} cases");

    let err = load(&engine, &b.wasm, r#"{"max_utilisation": 0.5}"#).err().expect("a misspelt option is refused");
    let msg = format!("{err:#}");
    assert!(msg.contains("max_utilisation"), "{lang:?}: the refusal names the option: {msg}");
    let err = load(&engine, &b.wasm, r#"{"max_utilization": 7}"#).err().expect("an out-of-range option is refused");
    assert!(format!("{err:#}").contains("max_utilization"), "{lang:?}: {err:#}");

    eprintln!(
        "{lang:?}: {n} fixture cases passed; {} KiB, built in {:.1} s{}, compile/load {:.2} s",
        b.size / 1024,
        b.build_time.as_secs_f64(),
        if b.rebuilt { "" } else { " (earlier, sources unchanged)" },
        compile.as_secs_f64()
    );
}

fn load(engine: &Arc<PolicyEngine>, wasm: &Path, config: &str) -> anyhow::Result<Plugin> {
    let case = fixture_pool();
    let plugin = PluginRef::Path(wasm.to_path_buf());
    let spec = PluginSpec {
        scope: plugin.default_scope(),
        plugin,
        config_json: config.to_string(),
        limits: Limits::default(),
        max_idle: 1,
        max_instances: 1,
    };
    poolgate::policy::block_on(Plugin::load(engine, spec, case.pool(), Arc::new(MemoryState::default())))
}

#[test]
fn rust_example_passes_the_shared_fixtures() {
    example_passes_fixtures(Lang::Rust);
}

#[test]
fn python_example_passes_the_shared_fixtures() {
    example_passes_fixtures(Lang::Python);
}

#[test]
fn javascript_example_passes_the_shared_fixtures() {
    example_passes_fixtures(Lang::Js);
}

#[test]
fn c_example_passes_the_shared_fixtures() {
    example_passes_fixtures(Lang::C);
}

/// The Python, JavaScript and C components are "pure": they import poolgate's
/// host interface and nothing else, so they need no WASI at all.
#[test]
fn non_rust_examples_import_no_wasi() {
    let engine = engine();
    for lang in [Lang::Python, Lang::Js, Lang::C] {
        let b = built(lang);
        warm(&engine, &b.wasm);
        let (component, _) = engine.compile(&std::fs::read(&b.wasm).unwrap(), "example").unwrap();
        let imports: Vec<String> =
            component.component_type().imports(engine.engine()).map(|(n, _)| n.to_string()).collect();
        assert!(imports.iter().all(|i| i.starts_with("poolgate:policy/")), "{lang:?} imports {imports:?}");
    }
}

/// A pool where every account has a 5h window; `hot` is over 0.9.
fn fixture_pool() -> Case {
    let text = std::fs::read_to_string(repo_root().join("examples/plugins/mixed/case.json")).unwrap();
    Case::parse(&text).unwrap()
}

fn repo_root() -> PathBuf {
    example_plugins::repo_root()
}

/// The mixed chain's config, with the example paths filled in, written to a
/// temporary directory; returns its path.
fn mixed_config(examples: &[Built]) -> PathBuf {
    let template = std::fs::read_to_string(repo_root().join("examples/plugins/mixed/mixed.toml")).unwrap();
    let cache = format!("[policy]\ncache_dir = {:?}\n", example_plugins::compile_cache_dir().display().to_string());
    let mut text = template.replace("[policy]\n", &cache);
    for b in examples {
        let rel = format!("../../../target/examples/{0}/reset-soonest-{0}.wasm", b.lang.dir_name());
        text = text.replace(&rel, &b.wasm.display().to_string());
    }
    let dir = std::env::temp_dir().join(format!("poolgate-mixed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mixed.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Python filter → Rust built-in → C filter → JavaScript tie-breaker, through
/// the `poolgate rank` binary on the documented case: every stage runs, none
/// fails, and each one's effect is visible in the decision record.
#[test]
fn a_mixed_language_chain_ranks_through_the_cli() {
    let examples = example_plugins::build_all_examples();
    let engine = engine();
    for b in &examples {
        warm(&engine, &b.wasm);
    }
    let config = mixed_config(&examples);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["rank", "--config"])
        .arg(&config)
        .arg("--input")
        .arg(repo_root().join("examples/plugins/mixed/case.json"))
        .output_within(Duration::from_secs(120));
    assert!(output.status.success(), "poolgate rank failed: {}", String::from_utf8_lossy(&output.stderr));
    let d: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(d["policy_errors"].as_array().map(Vec::len), Some(0), "{d:#}");
    let stages: Vec<&str> = d["stages"].as_array().unwrap().iter().map(|s| s["stage"].as_str().unwrap()).collect();
    assert_eq!(stages, ["python-filter", "headroom", "c-filter", "js-tie-breaker"], "{d:#}");
    let order = |i: usize| -> Vec<String> {
        d["stages"][i]["order"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
    };
    assert!(!order(0).contains(&"hot".to_string()), "the Python filter drops the hot account: {:?}", order(0));
    assert_eq!(d["stages"][1]["reason"], "headroom");
    assert!(!order(2).contains(&"warm".to_string()), "the C filter drops the warm account: {:?}", order(2));
    assert_eq!(d["reason"], "reset_soonest", "the JavaScript stage decides the head");
    let final_order: Vec<&str> = d["order"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    // Same reset for `roomy` and `tight`: headroom's order breaks the tie.
    assert_eq!(final_order, ["early", "roomy", "tight", "late"], "{d:#}");
}

/// The same chain through the chain API over many requests, as the gateway will
/// run it: outcomes feed back (a 429 penalises an account in Python's state
/// scope only), and no stage ever fails.
#[test]
fn a_mixed_language_chain_serves_requests_end_to_end() {
    let examples = example_plugins::build_all_examples();
    let engine = engine();
    for b in &examples {
        warm(&engine, &b.wasm);
    }
    let config = poolgate::config::Config::load(&mixed_config(&examples)).unwrap();
    let specs = config.stage_specs().unwrap();
    // Deadlines are per stage: the Python and JavaScript stages get more.
    let deadlines: Vec<u64> = specs.iter().map(|s| s.plugin.limits.deadline.as_millis() as u64).collect();
    assert_eq!(deadlines, [50, 25, 25, 50]);

    let case = fixture_pool();
    use poolgate::policy::block_on;
    let chain =
        block_on(Chain::load(&engine, specs, case.pool(), Arc::new(MemoryState::default()), BreakerConfig::default()))
            .expect("the mixed chain loads");
    let mut req = case.request();
    for i in 0..200u64 {
        req.id = i + 1;
        req.now_ms = case.now_ms + i;
        let d = block_on(chain.rank(req.clone(), case.candidates(poolgate::account::DEFAULT_FRESHNESS_MS)));
        assert!(d.policy_errors.is_empty(), "request {i}: {:?}", d.policy_errors);
        assert_eq!(d.order.head(), Some("early"), "request {i}");
        block_on(chain.observe(&req, 0, &Outcome::Success));
    }
    // A 429 on `early`: the Python stage (rate_limit_penalty_ms) skips it next time.
    let early = case.accounts.iter().position(|a| a.id == "early").unwrap() as u32;
    block_on(chain.observe(&req, early, &Outcome::RateLimited(None)));
    let next = Request { id: 999, now_ms: req.now_ms + 1, ..req.clone() };
    let d = block_on(chain.rank(next, case.candidates(poolgate::account::DEFAULT_FRESHNESS_MS)));
    assert!(d.policy_errors.is_empty(), "{:?}", d.policy_errors);
    assert_eq!(d.order.head(), Some("roomy"), "{d:?}");
}

/// Compiling happens at load, never on the request path, and the compiled
/// artifact is cached on disk by content hash: a restarted gateway (a fresh
/// engine) loads the 12–18 MB Python and JavaScript components from the cache
/// instead of compiling them for seconds. Counted, not timed (a busy machine
/// stretches any time): the fresh engine runs no compile, and the first call
/// is served by the instance made at load — the builder builds none. The
/// times are printed for information.
#[test]
fn large_components_load_from_the_compile_cache_after_a_restart() {
    for lang in [Lang::Python, Lang::Js] {
        let b = built(lang);
        warm(&engine(), &b.wasm); // the first load of this build, in any test
        let restarted = engine();
        let started = poolgate::clock::machine_instant();
        let plugin = load(&restarted, &b.wasm, "{}").unwrap_or_else(|e| panic!("{lang:?}: {e:#}"));
        let cached = started.elapsed();
        assert_eq!(restarted.compiles_run(), 0, "{lang:?}: the restarted engine compiled instead of loading the cache");

        // The first call is served by the instance made at load: no compile, no
        // instantiation on the request path.
        let made_at_load = plugin.pool_status();
        assert_eq!((made_at_load.live, made_at_load.idle), (1, 1), "{lang:?}: {made_at_load:?}");
        let case = fixture_pool();
        let c = case.candidates(poolgate::account::DEFAULT_FRESHNESS_MS);
        let started = poolgate::clock::machine_instant();
        poolgate::policy::block_on(plugin.rank(&case.request(), &c.accounts, &c.windows))
            .unwrap_or_else(|f| panic!("{lang:?}: {f:?}"));
        let first_call = started.elapsed();
        let builds = plugin.events().health(poolgate::policy::Phase::Configure).calls;
        assert_eq!(builds, 0, "{lang:?}: the builder made an instance for the first call");
        let after = plugin.pool_status();
        assert_eq!((after.live, after.peak), (1, 1), "{lang:?}: {after:?}");
        assert_eq!(restarted.compiles_run(), 0, "{lang:?}: the first call compiled");
        eprintln!(
            "{lang:?}: cached load {:.1} ms, first call {:.2} ms",
            cached.as_secs_f64() * 1e3,
            first_call.as_secs_f64() * 1e3
        );
    }
}
