//! `poolgate-chaos`: the chaos run (and the soak) from the command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use poolgate_chaos::{Settings, run};

#[derive(Parser)]
#[command(
    version,
    about = "Runs the real poolgate binary under a mixed workload while upstream accounts, seats, \
    plugins, reloads and Redis misbehave, and prints what it survived."
)]
struct Args {
    /// The poolgate binary (`cargo build --release` puts it in target/release).
    #[arg(long, default_value = "target/release/poolgate")]
    gateway: PathBuf,
    /// How long the workload runs, seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Clients sending at once.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Gateway replicas (2 or more share a Redis that the run kills and restarts).
    #[arg(long, default_value_t = 2)]
    replicas: usize,
    /// The seed of every random choice (a run is repeatable up to timing).
    #[arg(long, default_value_t = 29)]
    seed: u64,
    /// The hostile test plugin (tests/guests/misbehave, built by the host's build.rs into
    /// target/wasm-guests/wasm32-wasip2/release/misbehave.wasm) for hot swaps to a plugin that traps,
    /// loops, exhausts its memory or answers nonsense.
    #[arg(long)]
    hostile: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let dir = std::env::temp_dir().join(format!("poolgate-chaos-{}", std::process::id()));
    let settings = Settings {
        gateway: args.gateway,
        duration: Duration::from_secs(args.seconds),
        clients: args.clients,
        replicas: args.replicas,
        seed: args.seed,
        hostile_plugin: args.hostile,
        dir: dir.clone(),
    };
    let result = run(&settings).await;
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok(report) => {
            print!("{report}");
            if report.verdict().is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Err(e) => {
            eprintln!("poolgate-chaos: {e:#}");
            ExitCode::FAILURE
        }
    }
}
