//! `poolgate check`: the validation `serve` runs before it starts, on its own.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

use crate::config::{Config, validate};
use crate::gateway::Gateway;
use crate::policy::PolicyEngine;

/// Arguments of `poolgate check`.
#[derive(clap::Args)]
pub struct Args {
    /// The config file (TOML).
    #[arg(long, short, env = "POOLGATE_CONFIG")]
    pub config: PathBuf,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let file = args.config.display().to_string();
    let (config, index) = match Config::load_indexed(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e:#}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let engine = PolicyEngine::new(config.cache_dir())?;
    let accounts: Vec<String> = config.accounts.iter().filter(|a| a.enabled).map(|a| a.id.clone()).collect();
    let bound = config.compile_limits().timeout + crate::gateway::RELOAD_TIMEOUT;
    let loaded = crate::policy::block_on(async move {
        match tokio::time::timeout(bound, Gateway::new(config, engine)).await {
            Ok(r) => r,
            Err(_) => Err(anyhow::anyhow!("loading the configuration took longer than {} s", bound.as_secs())),
        }
    });
    match loaded {
        Ok(gw) => {
            let g = gw.generation();
            let stages: Vec<String> = g.chain.status(0).into_iter().map(|s| s.name).collect();
            println!("{}: ok", args.config.display());
            println!(
                "  accounts: {}",
                if accounts.is_empty() { "none (requests will get 503)".into() } else { accounts.join(", ") }
            );
            println!("  chain:    {}", stages.join(" → "));
            println!("  listen:   {}", g.config.server.listen);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{file} has a problem:\n  {}", validate::locate(&format!("{e:#}"), &index, &file));
            Ok(ExitCode::FAILURE)
        }
    }
}
