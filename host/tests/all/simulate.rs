//! `poolgate simulate`, as an operator runs it: the real binary replays a
//! generated team workload through several configurations — built-in chains
//! and a user `.wasm` plugin — and the report holds what each policy claims
//! for itself, the same twice over.

use crate::bounded;
use crate::example_plugins::{Lang, built};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bounded::OutputWithin as _;
use serde_json::Value;

/// Four OAuth seats, ranked by `chain` (TOML stage tables).
fn config(dir: &Path, name: &str, chain: &[&str]) -> PathBuf {
    let mut text = String::new();
    for stage in chain {
        text.push_str(&format!("[[policy.chain]]\nplugin = {stage:?}\n\n"));
    }
    for id in ["seat-1", "seat-2", "seat-3", "seat-4"] {
        // The key is never read: a replay's accounts are simulated.
        text.push_str(&format!("[[accounts]]\nid = \"{id}\"\nkind = \"oauth\"\napi_key_env = \"UNSET_IN_TESTS\"\n\n"));
    }
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs `poolgate simulate` on a 2-person, 2-day team workload over
/// `configs`, writing to `out`; its report and what it printed.
fn simulate(configs: &[PathBuf], out: &Path) -> (Vec<Value>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_poolgate"));
    cmd.args(["simulate", "--generate", "team", "--people", "2", "--days", "2", "--seed", "7", "--out"]).arg(out);
    for c in configs {
        cmd.arg("--config").arg(c);
    }
    let output = cmd.output_within(Duration::from_secs(600));
    let printed = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{printed}");
    let report: Vec<Value> = serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    (report, printed)
}

fn by_name<'a>(report: &'a [Value], name: &str) -> &'a Value {
    report.iter().find(|f| f["config"] == name).unwrap_or_else(|| panic!("no {name} in {report:?}"))
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

#[test]
fn simulate_compares_chains_and_a_user_plugin_the_same_way_twice() {
    let dir = std::env::temp_dir().join(format!("poolgate-simulate-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let user = built(Lang::Rust).wasm.display().to_string();
    let configs = [
        config(&dir, "fill-first", &["builtin:fill-first", "builtin:affinity"]),
        config(&dir, "headroom", &["builtin:headroom"]),
        config(&dir, "headroom-affinity", &["builtin:headroom", "builtin:affinity"]),
        config(&dir, "expiry-first", &["builtin:expiry-first", "builtin:affinity"]),
        config(&dir, "reset-soonest", &[&user, "builtin:affinity"]),
    ];
    let (report, printed) = simulate(&configs, &dir.join("a"));
    for line in ["mid-session switches", "extra from switches", "wasted at 7d resets", "answered 429"] {
        assert!(printed.contains(line), "the table shows {line}:\n{printed}");
    }
    for plot in ["comparison", "utilization-fill-first", "utilization-reset-soonest"] {
        for ext in ["svg", "png"] {
            let file = format!("{plot}.{ext}");
            assert!(printed.contains(&file), "the paths of the plots are printed: {file}\n{printed}");
        }
        let png = std::fs::read(dir.join("a").join(format!("{plot}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000, "{plot}.png: {} bytes", png.len());
    }
    for f in &report {
        assert_eq!(n(&f["requests"]), n(&f["served"]), "{}: every request served", f["config"]);
        assert!(f["plugin_errors"].as_object().unwrap().is_empty(), "{f}");
    }

    // The small scenario's figures, pinned: a change to the generator, the
    // simulated provider or a built-in shows here first (update them with
    // the reason in the commit).
    let fill = by_name(&report, "fill-first");
    let pinned = |k: &str| n(&fill[k]);
    assert_eq!((pinned("requests"), pinned("switches"), pinned("ping_pongs")), (3606, 5, 0), "fill-first: {fill}");
    assert_eq!((pinned("cache_creation_tokens"), pinned("extra_cache_creation_from_switches")), (14_535_025, 367_922));
    assert_eq!((n(&fill["served_by"]["seat-1"]), n(&fill["served_by"]["seat-2"])), (2501, 1105));
    assert_eq!(n(&fill["wasted_total"]["7d"]), 60_000_000, "seat 4's week reset untouched");

    // Affinity keeps a session on its account: fewer switches, fewer cache
    // reads turned into writes.
    let (spread, kept) = (by_name(&report, "headroom"), by_name(&report, "headroom-affinity"));
    assert!(n(&kept["switches"]) * 10 < n(&spread["switches"]), "{kept}\n{spread}");
    assert!(n(&kept["cache_creation_tokens"]) < n(&spread["cache_creation_tokens"]));
    assert!(n(&kept["extra_cache_creation_from_switches"]) * 5 < n(&spread["extra_cache_creation_from_switches"]));

    // Fill-first keeps the backup seat fresh: the last seat serves least.
    let served = |f: &Value, id: &str| f["served_by"][id].as_u64().unwrap_or(0);
    assert!(served(fill, "seat-4") < served(fill, "seat-1"), "{fill}");
    assert!(served(fill, "seat-4") < served(spread, "seat-4"), "{fill}\n{spread}");

    // Expiry-first spends the weekly quota that resets soonest: less of it is
    // lost at its reset. The user plugin (the soonest 5h reset first, none
    // above 90%) spreads the week more evenly than fill-first too.
    let wasted_7d = |f: &Value| n(&f["wasted_total"]["7d"]);
    assert!(wasted_7d(by_name(&report, "expiry-first")) < wasted_7d(fill), "{report:?}");
    assert!(wasted_7d(by_name(&report, "reset-soonest")) < wasted_7d(fill), "{report:?}");

    // The same workload, configs and seed: the same report and plots, byte for byte.
    let (_, _) = simulate(&configs, &dir.join("b"));
    for file in ["report.json", "comparison.svg", "comparison.png", "utilization-expiry-first.svg"] {
        let (a, b) =
            (std::fs::read(dir.join("a").join(file)).unwrap(), std::fs::read(dir.join("b").join(file)).unwrap());
        assert!(a == b, "{file} differs between two runs");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_workload_that_is_not_one_is_refused_naming_its_line() {
    let dir = std::env::temp_dir().join(format!("poolgate-simulate-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let workload = dir.join("day.jsonl");
    std::fs::write(&workload, "{\"t_ms\":0,\"session\":\"s\",\"model\":\"claude-sonnet-4-5\",\"input_tokens\":1,\"output_tokens\":1}\nnot json\n").unwrap();
    let c = config(&dir, "c", &["builtin:headroom"]);
    let out = Command::new(env!("CARGO_BIN_EXE_poolgate"))
        .args(["simulate", "--config"])
        .arg(&c)
        .arg("--workload")
        .arg(&workload)
        .output_within(Duration::from_secs(120));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("day.jsonl:2: not a workload entry"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
