//! `poolgate plugin …`: tools for plugin authors — write a skeleton, build it,
//! run its fixtures, and check a component before deploying it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;

use crate::case::load_cases;
use crate::fixtures::run_all;
use crate::policy::{PluginRef, PolicyEngine};

mod build;
mod inspect;
mod new;

/// `poolgate plugin` subcommands.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Write a ready-to-build ranker skeleton in Rust, Python, JavaScript or C.
    ///
    /// Creates `<dir>/<name>/` (default dir: the current one) with the ranker's
    /// source, a `build.sh` that turns it into a component, a `fixtures/`
    /// directory with two passing cases, and a README with the exact commands.
    /// What it writes builds offline: Python, JavaScript and C skeletons carry a
    /// copy of the WIT contract (`wit/policy.wit`); a Rust skeleton carries a copy
    /// of poolgate-sdk in `vendor/` (the SDK depends on no crate), or depends on
    /// `--sdk <dir>`. `--force` rewrites a skeleton nobody has edited.
    ///
    /// Examples:
    ///   poolgate plugin new least-busy --lang python
    ///   poolgate plugin new least-busy --lang rust --dir ~/src
    ///   poolgate plugin new least-busy --lang rust --force --sdk ~/src/poolgate/sdk
    ///   poolgate plugin build least-busy        # build/, then fixtures, then dist/least-busy.wasm
    #[command(verbatim_doc_comment)]
    New(new::Args),
    /// Build a plugin, run its fixtures, and only then deploy the component.
    ///
    /// Runs the directory's `build.sh` (which `plugin new` writes), which writes
    /// an untested component to `build/`; inspects it (size, world version,
    /// imports, verdict); runs every case in `fixtures/` through it; and only
    /// when they all pass moves it into place — `dist/<file>`, or `--out` —
    /// with an atomic rename, so a gateway watching that file never loads an
    /// untested or half-written component. Exits non-zero, leaving the deployed
    /// file as it was, if the build fails, the component is incompatible or a
    /// case fails. An unchanged plugin is not rebuilt (`--rebuild` forces it).
    ///
    /// With `--config`, the component is compiled into that gateway's cache, so
    /// the reload after deploying it is a lookup rather than a compile (seconds
    /// for Python or JavaScript). A gateway compiling the same bytes meanwhile
    /// waits for this compile instead of repeating it.
    ///
    /// Examples:
    ///   poolgate plugin build least-busy
    ///   poolgate plugin build . --config /etc/poolgate/poolgate.toml --out /etc/poolgate/plugins/least-busy.wasm
    ///   poolgate plugin build examples/plugins/python --fixtures examples/plugins/fixtures
    #[command(verbatim_doc_comment)]
    Build(build::Args),
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
    /// Write the bindings of poolgate's contract for a language without a
    /// component toolchain of its own (C).
    ///
    /// For C: `policy.h`, `policy.c` and `policy_component_type.o` (link the .o:
    /// it carries the component type `plugin wrap` reads), generated from the
    /// contract this binary speaks — what `wit-bindgen c` does, with nothing to
    /// install. The C skeleton's build.sh runs it.
    ///
    /// Example:
    ///   poolgate plugin bindings c --out build/gen
    #[command(verbatim_doc_comment)]
    Bindings(BindingsArgs),
    /// Turn a core WebAssembly module built with those bindings into a component.
    ///
    /// What `wasm-tools component new` does: the module's embedded component type
    /// becomes the component's interface, and the wasi_snapshot_preview1 adapter
    /// is added only if the module imports WASI preview 1.
    ///
    /// Example:
    ///   poolgate plugin wrap build/core.wasm -o build/my-ranker.wasm
    #[command(verbatim_doc_comment)]
    Wrap(WrapArgs),
}

/// Arguments of `poolgate plugin bindings`.
#[derive(clap::Args)]
pub struct BindingsArgs {
    /// The language: `c`.
    #[arg(value_parser = ["c"])]
    lang: String,
    /// The directory to write them to.
    #[arg(long, default_value = "gen")]
    out: PathBuf,
}

/// Arguments of `poolgate plugin wrap`.
#[derive(clap::Args)]
pub struct WrapArgs {
    /// The core module.
    module: PathBuf,
    /// Where to write the component.
    #[arg(short, long)]
    out: PathBuf,
}

/// Which compile cache (and compile limits) a tool uses.
#[derive(clap::Args)]
pub struct CacheArgs {
    /// The gateway config the plugin is for: compile into the cache it uses
    /// (`policy.cache_dir`) under its limits, so that the gateway's reload
    /// finds the component compiled. Default: the default cache directory.
    #[arg(long, env = "POOLGATE_CONFIG")]
    config: Option<PathBuf>,
}

impl CacheArgs {
    fn engine(&self) -> Result<std::sync::Arc<PolicyEngine>> {
        let Some(path) = &self.config else {
            return PolicyEngine::new(PolicyEngine::default_cache_dir());
        };
        let (config, _) = crate::config::Config::read(path)?;
        let engine = PolicyEngine::new(config.cache_dir())?;
        engine.set_compile_limits(config.compile_limits());
        Ok(engine)
    }
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
    #[command(flatten)]
    cache: CacheArgs,
}

/// Arguments of `poolgate plugin inspect`.
#[derive(clap::Args)]
pub struct InspectArgs {
    /// The component file.
    file: PathBuf,
    /// Also list the functions of WASI imports and of a language runtime's own exports.
    #[arg(long)]
    full: bool,
    #[command(flatten)]
    cache: CacheArgs,
}

/// Runs a `poolgate plugin` subcommand.
pub fn run(cmd: Command) -> Result<ExitCode> {
    match cmd {
        Command::New(args) => new::run(args),
        Command::Build(args) => build::run(args),
        Command::Test(args) => test(args),
        Command::Bindings(args) => {
            let wit = include_str!("../../../wit/policy.wit");
            for name in poolgate_witgen::c_bindings_from_text("policy.wit", wit, "policy", &args.out)? {
                println!("{}", args.out.join(name).display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Wrap(args) => {
            let adapted = poolgate_witgen::component(&args.module, &args.out)?;
            let size = std::fs::metadata(&args.out)?.len();
            let note = if adapted { " (with the wasi_snapshot_preview1 adapter)" } else { "" };
            println!("{}: {size} bytes{note}", args.out.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Inspect(args) => {
            let engine = args.cache.engine()?;
            let report = inspect::inspect(&engine, &args.file, args.full)?;
            print!("{}", report.text);
            Ok(if report.compatible { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
    }
}

fn test(args: TestArgs) -> Result<ExitCode> {
    let engine = args.cache.engine()?;
    let cases = load_cases(&args.fixtures)?;
    let plugin = PluginRef::parse(&args.plugin);
    let results = run_all(&engine, &plugin, &cases, Duration::from_millis(args.timeout_ms));
    let failed = report(&results, args.verbose)?;
    println!("\n{} passed, {failed} failed ({} cases, {plugin})", results.len() - failed, results.len());
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Prints one line per case (and why a failing one failed); returns how many failed.
fn report(results: &[crate::fixtures::CaseResult], verbose: bool) -> Result<usize> {
    let mut failed = 0;
    for r in results {
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
            if verbose {
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
    Ok(failed)
}
