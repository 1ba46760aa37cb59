//! `poolgate-chaos`: the chaos run (and the soak) from the command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use poolgate_chaos::soak::{SoakSettings, soak};
use poolgate_chaos::{Settings, run};

#[derive(Parser)]
#[command(
    version,
    about = "Runs the real poolgate binary under a mixed workload while upstream accounts, seats, \
    plugins, reloads and Redis misbehave, and prints what it survived."
)]
struct Args {
    #[command(subcommand)]
    soak: Option<Command>,
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

#[derive(clap::Subcommand)]
enum Command {
    /// Holds thousands of slow streams open through one gateway, round after round, and
    /// prints its memory and descriptors before, at the height and after each round.
    Soak {
        /// The poolgate binary.
        #[arg(long, default_value = "target/release/poolgate")]
        gateway: PathBuf,
        /// Streams open at once.
        #[arg(long, default_value_t = 10_000)]
        streams: usize,
        /// Milliseconds between two events of a stream (a stream has ~13 events).
        #[arg(long, default_value_t = 5_000)]
        event_ms: u64,
        /// Rounds.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Seconds after a round's last stream before its "after" figures (past the gateway's
        /// 90 s idle timeout for upstream connections, checked every few seconds).
        #[arg(long, default_value_t = 120)]
        settle_secs: u64,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let dir = std::env::temp_dir().join(format!("poolgate-chaos-{}", std::process::id()));
    if let Some(Command::Soak { gateway, streams, event_ms, rounds, settle_secs }) = args.soak {
        let settle = Duration::from_secs(settle_secs);
        let settings = SoakSettings { gateway, streams, event_ms, rounds, settle, dir: dir.clone() };
        let result = soak(&settings).await;
        let _ = std::fs::remove_dir_all(&dir);
        return match result {
            Ok(report) => {
                print!("{report}");
                if report.verdict().is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
            }
            Err(e) => {
                eprintln!("poolgate-chaos soak: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
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
