//! `poolgate plugin …`: tools for plugin authors.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;

use crate::case::load_cases;
use crate::fixtures::run_all;
use crate::policy::{PluginRef, PolicyEngine};

/// `poolgate plugin` subcommands.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Run JSON fixture cases through a plugin and report pass/fail per case.
    ///
    /// Each case is the input of `poolgate rank` plus an `expect` block with the
    /// full `order` or the `head`, and optionally the `reason`. A case may carry
    /// the plugin's `config`, `observe` events to replay first, or a whole `chain`
    /// in which `self` stands for the plugin under test. Exits non-zero if any case
    /// fails.
    ///
    /// Examples:
    ///   poolgate plugin test builtin:headroom plugins/headroom/fixtures
    ///   poolgate plugin test ./my_ranker.wasm fixtures/basic.json
    Test(TestArgs),
}

/// Arguments of `poolgate plugin test`.
#[derive(clap::Args)]
pub struct TestArgs {
    /// `builtin:<name>` or a path to a `.wasm` component.
    plugin: String,
    /// A fixture file (one case or an array) or a directory of them.
    fixtures: PathBuf,
    /// Per-call deadline, ms (generous by default: fixtures test behaviour, not speed).
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
    /// Print the full decision record of failing cases.
    #[arg(long, short)]
    verbose: bool,
}

pub fn run(cmd: Command) -> Result<ExitCode> {
    match cmd {
        Command::Test(args) => test(args),
    }
}

fn test(args: TestArgs) -> Result<ExitCode> {
    let engine = PolicyEngine::new(PolicyEngine::default_cache_dir())?;
    let cases = load_cases(&args.fixtures)?;
    let plugin = PluginRef::parse(&args.plugin);
    let results = run_all(&engine, &plugin, &cases, Duration::from_millis(args.timeout_ms));
    let mut failed = 0;
    for r in &results {
        let file = r.file.file_name().map_or_else(String::new, |f| f.to_string_lossy().into_owned());
        if r.passed() {
            println!("ok    {file}: {}", r.name);
            continue;
        }
        failed += 1;
        println!("FAIL  {file}: {}", r.name);
        for f in &r.failures {
            println!("      {f}");
        }
        if let Some(d) = &r.decision {
            if args.verbose {
                println!("{}", serde_json::to_string_pretty(d)?);
            } else {
                for s in &d.stages {
                    let err = s.error.as_ref().map_or(String::new(), |e| format!(" error={}: {}", e.cause.as_str(), e.message));
                    println!("      stage {}: reason={:?} order={}{err}", s.stage, s.reason, s.order.join(" > "));
                }
            }
        }
    }
    println!("\n{} passed, {failed} failed ({} cases, {plugin})", results.len() - failed, results.len());
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
