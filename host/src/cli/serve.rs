//! `poolgate serve`: run the gateway from a config file.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use crate::config::Config;
use crate::gateway::routes::{AppState, Reloader};
use crate::gateway::{Gateway, server};
use crate::policy::PolicyEngine;

/// Arguments of `poolgate serve`.
#[derive(clap::Args)]
pub struct Args {
    /// The config file (TOML).
    #[arg(long, short, env = "POOLGATE_CONFIG")]
    pub config: PathBuf,
    /// Listen address; overrides `server.listen`.
    #[arg(long, env = "POOLGATE_LISTEN")]
    pub listen: Option<String>,
    /// `text` or `json` log lines; overrides `server.log_format`.
    #[arg(long, env = "POOLGATE_LOG_FORMAT", value_parser = ["text", "json"])]
    pub log_format: Option<String>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let mut config = Config::load(&args.config)?;
    if let Some(l) = &args.listen {
        config.server.listen = l.clone();
    }
    if let Some(f) = &args.log_format {
        config.server.log_format = if f == "json" { crate::config::LogFormat::Json } else { crate::config::LogFormat::Text };
    }
    super::init_tracing(config.server.log_format);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(serve(config, Some(args.config)))?;
    Ok(ExitCode::SUCCESS)
}

/// Starts the gateway for `config` (loaded from `path`, if any) and serves until
/// SIGINT/SIGTERM.
pub async fn serve(config: Config, path: Option<PathBuf>) -> Result<()> {
    let engine = PolicyEngine::new(config.cache_dir())?;
    let listen = config.server.listen.clone();
    let grace = Duration::from_millis(config.server.shutdown_grace_ms);
    let gateway = tokio::task::block_in_place(|| Gateway::new(config, engine))?;
    let listener = server::bind(&listen).await?;
    let addr = listener.local_addr()?;
    server::check_exposure(&addr, !gateway.generation().client_keys.is_empty())?;
    let reloader: Option<Reloader> = path.map(|p| {
        let gw = gateway.clone();
        let r: Reloader = Arc::new(move |trigger: &str| {
            let config = Config::load(&p).map_err(|e| format!("{e:#}"))?;
            gw.reload(config, trigger).map_err(|e| format!("{e:#}"))
        });
        r
    });
    let g = gateway.generation();
    tracing::info!(%addr, accounts = g.accounts.len(), stages = g.chain.len(), "poolgate listening");
    eprintln!("poolgate listening on http://{addr} ({} accounts, {} chain stages)", g.accounts.len(), g.chain.len());
    drop(g);
    server::serve(listener, AppState { gateway, reloader }, grace, server::termination()).await
}
