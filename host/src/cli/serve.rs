//! `poolgate serve`: run the gateway from a config file.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;

use crate::config::{Config, validate};
use sha2::{Digest, Sha256};

use crate::gateway::routes::{ReloadRequest, Reloader};
use crate::gateway::{Gateway, server, watch};
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
    let (mut config, index) = Config::load_indexed(&args.config)?;
    if let Some(l) = &args.listen {
        config.server.listen = l.clone();
    }
    if let Some(f) = &args.log_format {
        config.server.log_format =
            if f == "json" { crate::config::LogFormat::Json } else { crate::config::LogFormat::Text };
    }
    super::init_tracing(config.server.log_format, true);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let file = args.config.display().to_string();
    runtime
        .block_on(serve(config, Some(args.config)))
        .map_err(|e| anyhow::anyhow!(validate::locate(&format!("{e:#}"), &index, &file)))?;
    Ok(ExitCode::SUCCESS)
}

/// Starts the gateway for `config` (loaded from `path`, if any) and serves until
/// SIGINT/SIGTERM.
pub async fn serve(config: Config, path: Option<PathBuf>) -> Result<()> {
    let engine = PolicyEngine::new(config.cache_dir())?;
    let reloader = path.clone().map(|p| {
        Box::new(move |gw: &Arc<Gateway>| {
            // Weak: the hook lives in the gateway's own routes.
            let gw = Arc::downgrade(gw);
            let r: Reloader = Arc::new(move |request: ReloadRequest| {
                let (gw, p) = (gw.clone(), p.clone());
                Box::pin(async move {
                    let gw = gw.upgrade().ok_or("the gateway is shutting down")?;
                    let trigger = request.trigger;
                    let turn = gw.reload_turn().await;
                    let file = p.display().to_string();
                    let text = match std::fs::read_to_string(&p) {
                        Ok(t) => t,
                        Err(e) => {
                            let message = format!("cannot read config {file}: {e}");
                            gw.refuse_reload(trigger, &message);
                            return Err(message);
                        }
                    };
                    // An empty file is a write in progress (a truncate before
                    // the new text), or a mistake: never a configuration that
                    // should drop every account and the admin token.
                    if text.trim().is_empty() {
                        let message = format!("config {file} is empty; the running configuration stays");
                        gw.refuse_reload(trigger, &message);
                        return Err(message);
                    }
                    if let Some(want) = request.expect_sha256
                        && <[u8; 32]>::from(Sha256::digest(text.as_bytes())) != want
                    {
                        // Rewritten since the watcher saw it settle: it will see
                        // that change and come back once the file is whole.
                        tracing::debug!(file, "config changed again before its reload ran; waiting for it to settle");
                        return Ok(gw.generation().number);
                    }
                    match Config::load_text(&p, &text) {
                        Ok((config, index)) => {
                            gw.reload_in_turn(&turn, config, trigger, &|m| validate::locate(m, &index, &file)).await
                        }
                        Err(e) => {
                            let message = format!("{e:#}");
                            gw.refuse_reload(trigger, &message);
                            Err(message)
                        }
                    }
                })
            });
            r
        }) as server::MakeReloader
    });
    let running = server::Running::start(config, engine, reloader).await?;
    if let (Some(path), Some(reload)) = (path, running.reloader.clone()) {
        watch::watch_files(&running.gateway, path, reload.clone());
        watch::reload_on_sighup(&running.gateway, reload);
    }
    let g = running.gateway.generation();
    tracing::info!(addr = %running.addr, accounts = g.accounts.len(), stages = g.chain.len(), "poolgate listening");
    eprintln!(
        "poolgate listening on http://{} ({} accounts, {} chain stages)",
        running.addr,
        g.accounts.len(),
        g.chain.len()
    );
    drop(g);
    let gateway = running.gateway.clone();
    server::termination().await;
    running.stop();
    let served = running.wait().await;
    // After the last request: what it taught is in the file too.
    gateway.save_state().await;
    served
}
