//! The plugin-author CLI: `plugin inspect` on a good component, a wrong-version
//! one, one with a forbidden import and one calling a host function this host
//! lacks; loading such components fails naming the problem; `plugin new`
//! refuses bad names, and rewrites with `--force` only a skeleton nobody
//! edited; `rank --case` takes a multi-case fixture file. (The skeletons going
//! from `plugin new` to a deployed plugin are `walkthrough.rs`.)

use crate::bounded;

use crate::common;
use crate::example_plugins;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use bounded::OutputWithin as _;

use example_plugins::{Lang, built};

fn poolgate(args: &[&str], dir: &Path) -> Output {
    poolgate_with(args, dir, &[])
}

fn poolgate_with(args: &[&str], dir: &Path, env: &[(&str, PathBuf)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_poolgate"));
    cmd.args(args)
        .current_dir(dir)
        // Compiled components land in a cache under target/, not the user's.
        .env("XDG_CACHE_HOME", example_plugins::examples_target().join("xdg-cache"))
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC_WRAPPER");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output_within(Duration::from_secs(300))
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn inspect(path: &str) -> (bool, String) {
    let o = poolgate(&["plugin", "inspect", path], &example_plugins::repo_root());
    (o.status.success(), text(&o))
}

#[test]
fn inspect_describes_a_compatible_component() {
    let c = built(Lang::C);
    let (ok, out) = inspect(&c.wasm.display().to_string());
    assert!(ok, "{out}");
    assert!(out.contains("world      poolgate:policy@0.1.1"), "{out}");
    assert!(out.contains("rank: func(req: request, candidates: list<account>, windows: list<quota-window>) -> result<ranking, string>"), "{out}");
    assert!(out.contains("import poolgate:policy/host@0.1.1"), "{out}");
    assert!(out.contains(&format!("({} bytes)", c.size)), "{out}");
    assert!(out.contains("verdict    compatible"), "{out}");
}

#[test]
fn inspect_names_both_versions_of_a_wrong_version_component() {
    let (ok, out) = inspect(&common::guest("wit-v2"));
    assert!(!ok, "exit status says incompatible: {out}");
    assert!(out.contains("INCOMPATIBLE"), "{out}");
    assert!(out.contains("targets poolgate:policy@0.2.0") && out.contains("speaks poolgate:policy@0.1.1"), "{out}");
}

#[test]
fn inspect_names_a_forbidden_import() {
    let (ok, out) = inspect(&common::guest("forbidden-import"));
    assert!(!ok, "{out}");
    assert!(out.contains("forbidden import: `wasi:http/client@0.3.0`"), "{out}");
    // Everything else about it is fine, so that is the only problem listed.
    assert_eq!(out.matches("\n  - ").count(), 1, "{out}");
}

/// #23: a case whose `observe` traps fails `plugin test`, naming the
/// observation, the stage and the cause — however right its ranking is.
#[test]
fn plugin_test_fails_a_case_whose_observe_trapped() {
    let dir = std::env::temp_dir().join(format!("poolgate-observe-trap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let case = serde_json::json!([{
        "name": "observe traps",
        "now_ms": 1_760_000_000_000u64,
        "config": { "fault": "pass", "observe": "trap" },
        "accounts": [{ "id": "a" }, { "id": "b" }],
        "observe": [{ "at_ms": 1_759_999_990_000u64, "account": "a", "outcome": "success" }],
        "expect": { "order": ["a", "b"] }
    }]);
    std::fs::write(dir.join("cases.json"), case.to_string()).unwrap();
    let o = poolgate(&["plugin", "test", &common::guest("misbehave"), "cases.json"], &dir);
    let out = text(&o);
    assert!(!o.status.success(), "a trapped observe passed:\n{out}");
    assert!(out.contains("observe #1") && out.contains("trap"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// #23: WIT 0.1.1 added `host.freshness-ms`. A patch release only adds host
/// functions, so a plugin built against 0.1.0 still loads on this host and
/// its host calls (state, log, window names) still work.
#[test]
fn a_plugin_built_against_wit_0_1_0_loads_and_ranks_on_this_host() {
    let path = common::guest("wit-0-1-0");
    let (ok, out) = inspect(&path);
    assert!(ok, "{out}");
    assert!(out.contains("import poolgate:policy/host@0.1.0"), "{out}");
    assert!(out.contains("verdict    compatible"), "{out}");
    let case = common::pool_case(3);
    let chain = poolgate::policy::block_on(poolgate::policy::Chain::load(
        &common::ENGINE,
        vec![common::stage(&path, serde_json::json!({}), 25)],
        case.pool(),
        std::sync::Arc::new(poolgate::policy::MemoryState::default()),
        poolgate::policy::BreakerConfig::default(),
    ))
    .expect("a 0.1.0 plugin loads on a 0.1.1 host");
    let decision = poolgate::policy::block_on(chain.rank(case.request(), case.candidates(60_000)));
    assert!(decision.policy_errors.is_empty(), "{:?}", decision.policy_errors);
    assert!(decision.reason.starts_with("v010-yes-"), "{}", decision.reason);
    assert_eq!(decision.order.indices(), &[2, 1, 0]);
}

/// A 0.1.x component calling a host function this host lacks: its import
/// names pass, so only linking against what the host provides catches it —
/// and `inspect` does that, like loading does.
#[test]
fn inspect_and_load_refuse_a_host_function_this_host_lacks() {
    let (ok, out) = inspect(&common::guest("wit-next"));
    assert!(!ok, "{out}");
    assert!(out.contains("an import this host does not provide"), "{out}");
    assert!(out.contains("shiny-new"), "{out}");
    let case = common::pool_case(2);
    let err = poolgate::policy::block_on(poolgate::policy::Chain::load(
        &common::ENGINE,
        vec![common::stage(&common::guest("wit-next"), serde_json::json!({}), 25)],
        case.pool(),
        std::sync::Arc::new(poolgate::policy::MemoryState::default()),
        poolgate::policy::BreakerConfig::default(),
    ))
    .err()
    .expect("refused");
    assert!(format!("{err:#}").contains("shiny-new"), "{err:#}");
}

#[test]
fn inspect_refuses_a_core_module_and_a_non_wasm_file() {
    let dir = scratch("inspect");
    std::fs::write(dir.join("core.wasm"), b"\0asm\x01\0\0\0").unwrap();
    std::fs::write(dir.join("notes.wasm"), b"hello").unwrap();
    let (ok, out) = inspect(&dir.join("core.wasm").display().to_string());
    assert!(!ok && out.contains("core WebAssembly module, not a component"), "{out}");
    let (ok, out) = inspect(&dir.join("notes.wasm").display().to_string());
    assert!(!ok && out.contains("not a WebAssembly file"), "{out}");
}

/// The host refuses a wrong-version component at load, naming both versions.
#[test]
fn loading_a_wrong_version_component_fails_naming_both_versions() {
    let case = common::pool_case(2);
    let err = poolgate::policy::block_on(poolgate::policy::Chain::load(
        &common::ENGINE,
        vec![common::stage(&common::guest("wit-v2"), serde_json::json!({}), 25)],
        case.pool(),
        std::sync::Arc::new(poolgate::policy::MemoryState::default()),
        poolgate::policy::BreakerConfig::default(),
    ))
    .err()
    .expect("a 0.2.0 plugin is refused");
    let msg = format!("{err:#}");
    assert!(msg.contains("poolgate:policy@0.2.0"), "{msg}");
    assert!(msg.contains("poolgate:policy@0.1.1") && msg.contains("0.1.x"), "{msg}");
}

#[test]
fn loading_a_component_with_a_forbidden_import_fails_naming_it() {
    let case = common::pool_case(2);
    let err = poolgate::policy::block_on(poolgate::policy::Chain::load(
        &common::ENGINE,
        vec![common::stage(&common::guest("forbidden-import"), serde_json::json!({}), 25)],
        case.pool(),
        std::sync::Arc::new(poolgate::policy::MemoryState::default()),
        poolgate::policy::BreakerConfig::default(),
    ))
    .err()
    .expect("a plugin importing wasi:http is refused");
    assert!(format!("{err:#}").contains("wasi:http/client@0.3.0"), "{err:#}");
}

/// A fresh directory under target/ (inside the checkout, so a Rust skeleton
/// finds poolgate-sdk by path, as it would for a contributor).
fn scratch(name: &str) -> PathBuf {
    let dir = example_plugins::examples_target().join("scratch").join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn plugin_new_refuses_a_bad_name_and_an_existing_directory() {
    let dir = scratch("new-refusals");
    let o = poolgate(&["plugin", "new", "Bad_Name", "--lang", "c"], &dir);
    assert!(!o.status.success() && text(&o).contains("not a plugin name"), "{}", text(&o));
    assert!(poolgate(&["plugin", "new", "twice", "--lang", "c"], &dir).status.success());
    let o = poolgate(&["plugin", "new", "twice", "--lang", "c"], &dir);
    assert!(!o.status.success() && text(&o).contains("already exists"), "{}", text(&o));
}

/// `--force` rewrites a skeleton nobody edited (here: to depend on another
/// SDK), and refuses one that was edited, naming the files.
#[test]
fn plugin_new_force_rewrites_only_an_untouched_skeleton() {
    let dir = scratch("new-force");
    assert!(poolgate(&["plugin", "new", "redo", "--lang", "rust"], &dir).status.success());
    let plugin = dir.join("redo");
    let manifest = std::fs::read_to_string(plugin.join("Cargo.toml")).unwrap();
    assert!(manifest.contains("path = \"vendor/poolgate-sdk\""), "{manifest}");
    assert!(plugin.join("vendor/poolgate-sdk/src/lib.rs").is_file(), "the SDK is vendored");
    std::fs::write(plugin.join("notes.txt"), "mine").unwrap();

    let sdk = example_plugins::repo_root().join("sdk");
    let o = poolgate(&["plugin", "new", "redo", "--lang", "rust", "--force", "--sdk", sdk.to_str().unwrap()], &dir);
    assert!(o.status.success(), "{}", text(&o));
    let manifest = std::fs::read_to_string(plugin.join("Cargo.toml")).unwrap();
    assert!(manifest.contains(&format!("path = {:?}", sdk.display().to_string())), "{manifest}");
    assert!(!plugin.join("vendor/poolgate-sdk").exists(), "the vendored copy went with --sdk");
    assert_eq!(std::fs::read_to_string(plugin.join("notes.txt")).unwrap(), "mine", "files the author added stay");

    std::fs::write(plugin.join("src/lib.rs"), "// my ranker\n").unwrap();
    let o = poolgate(&["plugin", "new", "redo", "--lang", "rust", "--force"], &dir);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("was edited since") && text(&o).contains("src/lib.rs"), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(plugin.join("src/lib.rs")).unwrap(), "// my ranker\n", "nothing was lost");
}

/// `rank` takes the multi-case fixture files `plugin new` writes: `--case`
/// picks one by number or name, and a case's `expect` is reported.
#[test]
fn rank_picks_one_case_of_a_fixture_file() {
    let dir = scratch("rank-case");
    assert!(poolgate(&["plugin", "new", "cases", "--lang", "c"], &dir).status.success());
    let fixtures = dir.join("cases/fixtures/basic.json");
    let f = fixtures.to_str().unwrap();
    let o = poolgate(&["rank", "--input", f], &dir);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("holds 2 cases; pick one with --case"), "{}", text(&o));
    assert!(text(&o).contains("1  basic.json: the least busy account comes first"), "{}", text(&o));
    let o = poolgate(&["rank", "--input", f, "--case", "2"], &dir);
    assert!(o.status.success(), "{}", text(&o));
    let decision: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(decision["order"][0], "x", "the default chain keeps pool order, usable first");
    assert!(text(&o).contains("expect: met"), "{}", text(&o));
    let o = poolgate(&["rank", "--input", f, "--case", "the least busy account comes first"], &dir);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("expect: not met by this chain"), "{}", text(&o));
    let o = poolgate(&["rank", "--input", f, "--case", "9"], &dir);
    assert!(!o.status.success() && text(&o).contains("has no case `9`"), "{}", text(&o));
}

#[test]
fn every_plugin_subcommand_explains_itself_with_an_example() {
    for sub in ["new", "build", "test", "inspect"] {
        let o = poolgate(&["plugin", sub, "--help"], Path::new("."));
        let help = text(&o);
        assert!(o.status.success(), "{sub}: {help}");
        assert!(help.contains(&format!("poolgate plugin {sub}")), "`plugin {sub} --help` shows an example:\n{help}");
    }
}

/// #23: `plugin build` deploys only a tested component: without fixtures it
/// refuses before building, naming what to do, and nothing is placed.
#[test]
fn plugin_build_refuses_to_deploy_without_fixtures() {
    let dir = scratch("build-untested");
    assert!(poolgate(&["plugin", "new", "untested", "--lang", "c"], &dir).status.success());
    let plugin = dir.join("untested");
    std::fs::remove_dir_all(plugin.join("fixtures")).unwrap();
    let o = poolgate(&["plugin", "build", plugin.to_str().unwrap()], &dir);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("deploys a component only once its fixtures pass"), "{}", text(&o));
    assert!(!plugin.join("build").exists() && !plugin.join("dist").exists(), "nothing was built or placed");
}
