//! `poolgate check`: the validation `serve` runs before it starts, on its own.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

use crate::config::{Config, validate};
use crate::gateway::Generation;
use crate::policy::PolicyEngine;

/// Arguments of `poolgate check`: the same as `serve`'s, so that the file is
/// judged with what the command line and the environment override in it
/// (`--listen`, `POOLGATE_LISTEN`, …) exactly as `serve` would run it.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    source: super::ConfigArgs,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let path: PathBuf = args.source.config.clone();
    let file = path.display().to_string();
    let (config, index) = match Config::load_file_with(&path, &args.source.overrides()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e:#}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let engine = PolicyEngine::new(config.cache_dir())?;
    engine.set_compile_limits(config.compile_limits());
    let accounts: Vec<String> = config.accounts.iter().filter(|a| a.enabled).map(|a| a.id.clone()).collect();
    // Exactly what `serve` builds for a generation — credentials, the chain
    // compiled, configured and smoke-tested, within the same bounds — and
    // nothing it would serve with.
    let loaded = crate::policy::block_on(async move {
        let state: std::sync::Arc<dyn crate::policy::StateStore> =
            std::sync::Arc::new(crate::policy::MemoryState::with_limits(config.state_limits()));
        let metrics = std::sync::Arc::new(crate::metrics::Metrics::default());
        let accounts = Default::default();
        let clock = crate::clock::Clock::system();
        let connect = std::time::Duration::from_millis(config.gateway.connect_timeout_ms);
        let http: std::sync::Arc<dyn crate::gateway::request::upstream::Transport> =
            std::sync::Arc::new(crate::gateway::request::upstream::Upstream::new(connect)?);
        let around = crate::gateway::generation::Around {
            engine: &engine,
            plugin_state: &state,
            book: &accounts,
            metrics: &metrics,
            clock: &clock,
            http: &http,
        };
        Generation::build_bounded(1, config, &around, None).await
    });
    match loaded {
        Ok(g) => {
            let stages: Vec<String> = g.chain.status(0).into_iter().map(|s| s.name).collect();
            println!("{}: ok", path.display());
            println!(
                "  accounts: {}",
                if accounts.is_empty() { "none (requests will get 503)".into() } else { accounts.join(", ") }
            );
            println!("  chain:    {}", stages.join(" → "));
            println!("  listen:   {}", g.config.server.listen);
            if g.config.state.shared() {
                // Named, not reached: `check` does not connect to anything.
                println!(
                    "  state:    shared through {} (prefix {})",
                    g.config.state.redacted_url(),
                    g.config.state.key_prefix
                );
            }
            match &g.config.state.file_path {
                Some(p) => println!("  learned:  kept across restarts in {}", p.display()),
                None if g.config.state.shared() => println!("  learned:  kept across restarts in Redis"),
                None => println!("  learned:  forgotten at restart ([state] file = \"\")"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{file} has a problem:\n  {}", validate::locate(&format!("{e:#}"), &index, &file));
            Ok(ExitCode::FAILURE)
        }
    }
}
