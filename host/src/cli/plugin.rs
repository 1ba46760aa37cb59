//! `poolgate plugin …`: tools for plugin authors — write a skeleton, build it,
//! run its fixtures, and check a component before deploying it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::case::load_cases;
use crate::fixtures::run_all;
use crate::policy::{PluginRef, PolicyEngine};

mod inspect;
mod new;

/// `poolgate plugin` subcommands.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Write a ready-to-build ranker skeleton in Rust, Python, JavaScript or C.
    ///
    /// Creates `<dir>/<name>/` (default dir: the current one) with the ranker's
    /// source, a `build.sh` that turns it into a component, a `fixtures/`
    /// directory with a first passing case, and a README with the exact commands.
    /// Python, JavaScript and C skeletons carry a copy of the WIT contract
    /// (`wit/policy.wit`); a Rust skeleton depends on poolgate-sdk — by path when
    /// created inside a poolgate checkout, otherwise as the README explains.
    ///
    /// Examples:
    ///   poolgate plugin new least-busy --lang python
    ///   poolgate plugin new least-busy --lang rust --dir ~/src
    ///   poolgate plugin build least-busy && poolgate plugin test least-busy/target/least-busy.wasm least-busy/fixtures
    #[command(verbatim_doc_comment)]
    New(new::Args),
    /// Build a plugin directory into a component and check that poolgate can load it.
    ///
    /// Runs the directory's `build.sh` (which `plugin new` writes, and which every
    /// example under examples/plugins/ has), takes the component path it prints
    /// last, and inspects that component: size, world version, imports. Exits
    /// non-zero if the build fails or the component is incompatible. The
    /// per-language commands build.sh runs are listed in docs/writing-plugins.md.
    ///
    /// Examples:
    ///   poolgate plugin build least-busy
    ///   poolgate plugin build examples/plugins/python
    #[command(verbatim_doc_comment)]
    Build(BuildArgs),
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
    #[command(verbatim_doc_comment)]
    Test(TestArgs),
    /// Print a component's world, imports and size, and say whether poolgate can load it.
    ///
    /// A component is refused when it does not export `poolgate:policy/ranker`,
    /// when it targets a version of poolgate:policy outside the track this host
    /// accepts (the message names both versions), or when it imports anything
    /// poolgate does not provide (e.g. `wasi:http`). Exits non-zero for an
    /// incompatible component. Reading the types compiles the component once
    /// (seconds for Python or JavaScript); the result is cached like the gateway's.
    ///
    /// Examples:
    ///   poolgate plugin inspect target/examples/python/reset-soonest-python.wasm
    ///   poolgate plugin inspect ./my_ranker.wasm
    #[command(verbatim_doc_comment)]
    Inspect(InspectArgs),
}

/// Arguments of `poolgate plugin build`.
#[derive(clap::Args)]
pub struct BuildArgs {
    /// The plugin directory (holding `build.sh`).
    #[arg(default_value = ".")]
    dir: PathBuf,
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

/// Arguments of `poolgate plugin inspect`.
#[derive(clap::Args)]
pub struct InspectArgs {
    /// The component file.
    file: PathBuf,
    /// Also list the functions of WASI imports.
    #[arg(long)]
    full: bool,
}

/// Runs a `poolgate plugin` subcommand.
pub fn run(cmd: Command) -> Result<ExitCode> {
    match cmd {
        Command::New(args) => new::run(args),
        Command::Build(args) => build(args),
        Command::Test(args) => test(args),
        Command::Inspect(args) => {
            let engine = PolicyEngine::new(PolicyEngine::default_cache_dir())?;
            let report = inspect::inspect(&engine, &args.file, args.full)?;
            print!("{}", report.text);
            Ok(if report.compatible { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
    }
}

fn build(args: BuildArgs) -> Result<ExitCode> {
    let script = args.dir.join("build.sh");
    if !script.is_file() {
        bail!(
            "{} has no build.sh; `poolgate plugin new <name> --lang rust|python|js|c` writes one \
             (docs/writing-plugins.md lists the per-language commands)",
            args.dir.display()
        );
    }
    let started = std::time::Instant::now();
    let output = std::process::Command::new("bash")
        .arg(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    print!("{stdout}");
    if !output.status.success() {
        bail!("{} failed ({})", script.display(), output.status);
    }
    let wasm = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| PathBuf::from(l.trim()))
        .filter(|p| p.is_file())
        .with_context(|| format!("{} did not print the path of the component it built", script.display()))?;
    println!("built {} in {:.1} s\n", wasm.display(), started.elapsed().as_secs_f64());
    let engine = PolicyEngine::new(PolicyEngine::default_cache_dir())?;
    let report = inspect::inspect(&engine, &wasm, false)?;
    print!("{}", report.text);
    Ok(if report.compatible { ExitCode::SUCCESS } else { ExitCode::FAILURE })
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
                    let err = s
                        .error
                        .as_ref()
                        .map_or(String::new(), |e| format!(" error={}: {}", e.cause.as_str(), e.message));
                    println!("      stage {}: reason={:?} order={}{err}", s.stage, s.reason, s.order.join(" > "));
                }
            }
        }
    }
    println!("\n{} passed, {failed} failed ({} cases, {plugin})", results.len() - failed, results.len());
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
