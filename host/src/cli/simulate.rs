//! `poolgate simulate`: see [`crate::simulate`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result, bail};

use crate::policy::PolicyEngine;
use crate::simulate::{self, Replay, Run, generate, import, plans::Plans, report, trace};

/// What to replay and through what.
#[derive(clap::Args)]
pub struct Args {
    /// A gateway config to compare (repeat for each; its chain, cooldowns,
    /// admission, affinity and fallbacks are used as `serve` would use them,
    /// its accounts become simulated ones).
    #[arg(long = "config", short, required = true)]
    configs: Vec<PathBuf>,
    /// The workload: a JSONL trace (see docs/simulator.md for the format).
    #[arg(long, conflicts_with_all = ["generate", "from_decisions"])]
    workload: Option<PathBuf>,
    /// The workload a gateway recorded: what `GET /admin/decisions` answered
    /// (a JSON array), or the log of `poolgate serve --log-format json`.
    #[arg(long, conflicts_with = "generate")]
    from_decisions: Option<PathBuf>,
    /// Make a workload instead: `team` (Claude Code sessions of a team).
    #[arg(long, value_parser = ["team"])]
    generate: Option<String>,
    /// People in a generated team.
    #[arg(long, default_value_t = 10)]
    people: u32,
    /// Days a generated workload lasts (day 0 is a Monday).
    #[arg(long, default_value_t = 7)]
    days: u32,
    /// The seed a generated workload is made from.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the generated workload here (to replay it later, or edit it).
    #[arg(long)]
    save_workload: Option<PathBuf>,
    /// The accounts' plans (what each window holds); see docs/simulator.md.
    #[arg(long)]
    pool: Option<PathBuf>,
    /// Start each account where a running gateway's account stands: a saved
    /// `GET /status` answer (how far into its windows, how much used).
    #[arg(long)]
    pool_status: Option<PathBuf>,
    /// Where the report (JSON) and the plots (SVG and PNG) go.
    #[arg(long, default_value = "simulation")]
    out: PathBuf,
}

/// Runs the simulation and prints the table.
pub fn run(args: Args) -> Result<ExitCode> {
    let (workload, end_ms) = match (&args.workload, &args.from_decisions, &args.generate) {
        (Some(path), _, _) => {
            let file = std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
            let w = trace::read(std::io::BufReader::new(file), &path.display().to_string())?;
            let end = Replay::midnight_after(&w);
            (w, end)
        }
        (None, Some(path), _) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            let w = import::from_decisions(&text, &path.display().to_string())?;
            let end = Replay::midnight_after(&w);
            (w, end)
        }
        (None, None, Some(_)) => (generate::team(args.people, args.days, args.seed), u64::from(args.days) * 86_400_000),
        (None, None, None) => {
            bail!("give a workload: --workload <trace.jsonl>, --from-decisions <file>, or --generate team")
        }
    };
    if let Some(path) = &args.save_workload {
        trace::write(&workload, std::io::BufWriter::new(std::fs::File::create(path)?))?;
    }
    let mut plans = match &args.pool {
        Some(path) => Plans::read(path)?,
        None => Plans::default(),
    };
    if let Some(path) = &args.pool_status {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let status = serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
        plans = plans.with_status(&status).with_context(|| path.display().to_string())?;
    }
    let labels = labels(&args.configs);
    let (first, _) = crate::config::Config::read(&args.configs[0])?;
    let engine = PolicyEngine::new(first.cache_dir())?;
    eprintln!("replaying {} requests through {} configurations …", workload.len(), args.configs.len());
    let started = crate::clock::machine_instant();
    let replay = Replay { workload: &workload, end_ms, plans: &plans };
    let runs = replay_all(&args, &labels, &replay, &engine)?;
    let figures: Vec<_> = runs.iter().map(|r| r.figures.clone()).collect();
    print!("{}", report::table(&figures));
    println!("\nstage time per decision (measured on this machine; varies run to run):");
    for run in &runs {
        let stages: Vec<String> = run.stage_us.iter().map(|(s, us)| format!("{s} {us:.0} µs")).collect();
        println!("  {}: {}", run.figures.config, stages.join(", "));
    }
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    let json = args.out.join("report.json");
    std::fs::write(&json, serde_json::to_string_pretty(&figures)? + "\n")?;
    let mut written = vec![json];
    written.extend(report::plots(&runs, &args.out)?);
    println!("\nreplayed in {:.1} s; written:", started.elapsed().as_secs_f64());
    for path in written {
        println!("  {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Each config replayed on a thread of its own (they share nothing but the
/// plugin engine), in the order given.
fn replay_all(args: &Args, labels: &[String], replay: &Replay<'_>, engine: &Arc<PolicyEngine>) -> Result<Vec<Run>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = args
            .configs
            .iter()
            .zip(labels)
            .map(|(path, label)| {
                let engine = engine.clone();
                scope.spawn(move || -> Result<Run> {
                    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                    runtime.block_on(simulate::run(label, path, replay, engine))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| bail!("a replay panicked"))).collect()
    })
}

/// A short name per config: its file stem, with the directory when two
/// stems are alike.
fn labels(configs: &[PathBuf]) -> Vec<String> {
    let stem = |p: &PathBuf| p.file_stem().map_or("config".into(), |s| s.to_string_lossy().into_owned());
    let stems: Vec<String> = configs.iter().map(stem).collect();
    configs
        .iter()
        .zip(&stems)
        .map(|(p, s)| if stems.iter().filter(|t| *t == s).count() > 1 { p.display().to_string() } else { s.clone() })
        .collect()
}
