//! `poolgate serve`: run the gateway from a config file.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;

use crate::config::{Config, Overrides, validate};
use sha2::{Digest, Sha256};

use crate::gateway::http::{server, signals};
use crate::gateway::reload::{ReloadRequest, Reloader};
use crate::gateway::{Gateway, ReloadError, watch};
use crate::policy::PolicyEngine;

/// Arguments of `poolgate serve`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    source: super::ConfigArgs,
}

/// The log format `serve` writes in, known before the config is loaded:
/// `--log-format` / `POOLGATE_LOG_FORMAT`, else the file's `[server]
/// log_format` read leniently (a file whose other parts do not validate still
/// names it), else text.
pub fn log_format(args: &Args) -> crate::config::LogFormat {
    use crate::config::LogFormat;
    let named = args.source.log_format.clone().or_else(|| {
        let text = std::fs::read_to_string(&args.source.config).ok()?;
        let table: toml::Table = toml::from_str(&text).ok()?;
        Some(table.get("server")?.get("log_format")?.as_str()?.to_string())
    });
    if named.as_deref() == Some("json") { LogFormat::Json } else { LogFormat::Text }
}

pub fn run(args: Args) -> Result<ExitCode> {
    let overrides = args.source.overrides();
    let path = args.source.config;
    // Before the credentials files are read: a rotated pair a killed gateway
    // wrote but never renamed into place (logged once logging is set up).
    let recovered = super::login::recover_seats(&path);
    let (config, index) = Config::load_file_with(&path, &overrides)?;
    super::init_tracing(config.server.log_format, true);
    crate::logs::install_panic_hook();
    for line in recovered {
        tracing::warn!("{line}");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let file = path.display().to_string();
    runtime
        .block_on(serve(config, Some((path, overrides))))
        .map_err(|e| anyhow::anyhow!(validate::locate(&format!("{e:#}"), &index, &file)))?;
    Ok(ExitCode::SUCCESS)
}

/// Starts the gateway for `config` (loaded from `source`, if any: the file and
/// what the command line overrides in it, which every reload reads the same
/// way) and serves until SIGTERM (which drains first: `server.drain_ms`) or
/// SIGINT (which does not); a second signal stops at once.
pub async fn serve(config: Config, source: Option<(PathBuf, Overrides)>) -> Result<()> {
    let engine = PolicyEngine::new(config.cache_dir())?;
    let path = source.as_ref().map(|(p, _)| p.clone());
    let reloader = source.map(|(p, overrides)| reloader(p, overrides));
    // Before anything can report ready: a SIGTERM from then on is handled (a
    // signal's default action would kill the process without a drain).
    let mut signals = signals::Signals::new()?;
    let running = server::Running::start(config, engine, reloader).await?;
    if let (Some(path), Some(reload)) = (path, running.reloader.clone()) {
        watch::watch_files(&running.gateway, path, reload.clone());
        watch::reload_on_sighup(&running.gateway, reload.clone());
        watch::retry_after_compiles(&running.gateway, reload);
    }
    let g = running.gateway.generation();
    // Past the log filter: whoever started it needs to know where it listens
    // (and tests find the address by this text, in either format).
    crate::logs::line(
        tracing::Level::INFO,
        "poolgate",
        &format!(
            "poolgate listening on http://{} ({} accounts, {} chain stages)",
            running.addr,
            g.accounts.len(),
            g.chain.len()
        ),
        &[
            ("addr", running.addr.to_string().into()),
            ("accounts", g.accounts.len().into()),
            ("stages", g.chain.len().into()),
        ],
    );
    drop(g);
    // Listening, and every signal handler in place (SIGHUP's default action
    // would kill the process): ready.
    crate::gateway::http::sd_notify::ready(&format!("poolgate listening on {}", running.addr));
    let gateway = running.gateway.clone();
    let first = signals.next().await;
    tracing::info!(signal = first.name(), "shutting down");
    let served = running.shutdown(first.stop(), signals).await;
    // After the last request: what it taught is in the file too — bounded,
    // so a hung disk (a stale NFS mount) cannot hold the exit past what a
    // service manager waits for.
    if tokio::time::timeout(FINAL_SAVE, gateway.save_state()).await.is_err() {
        tracing::warn!(
            timeout_ms = FINAL_SAVE.as_millis() as u64,
            "state file not saved at shutdown: the write did not finish"
        );
    }
    // The last requests' traces, exported before the exit.
    gateway.close_telemetry(FINAL_SAVE).await;
    // Every answered request's usage entry, written before the exit.
    let ledger = gateway.clone();
    if tokio::time::timeout(FINAL_SAVE, tokio::task::spawn_blocking(move || ledger.close_ledger())).await.is_err() {
        tracing::warn!(timeout_ms = FINAL_SAVE.as_millis() as u64, "usage ledger not flushed at shutdown");
    }
    served
}

/// How long the state file's last save may take at shutdown.
const FINAL_SAVE: std::time::Duration = std::time::Duration::from_secs(5);

/// The reload hook of a gateway started from the file `p`: each reload reads
/// the file in its turn (superseding any reload still loading, so the newest
/// file wins), with the same `overrides` the start applied — `--listen` among
/// them, so a reload never sees the file's own `listen` as a change — and is
/// judged as a start would judge it (see `Gateway::reload_in_turn`).
fn reloader(p: PathBuf, overrides: Overrides) -> server::MakeReloader {
    Box::new(move |gw: &Arc<Gateway>| {
        // Weak: the hook lives in the gateway's own routes.
        let gw = Arc::downgrade(gw);
        let r: Reloader = Arc::new(move |request: ReloadRequest| {
            let (gw, p, overrides) = (gw.clone(), p.clone(), overrides.clone());
            Box::pin(async move {
                let gw = gw.upgrade().ok_or_else(|| ReloadError::Refused("the gateway is shutting down".into()))?;
                let trigger = request.trigger;
                let file = p.display().to_string();
                // Checked before taking a turn too: a turn supersedes a reload
                // still loading, and a watcher's reload of a file that is
                // still changing must not stop one without loading anything.
                if let Some(want) = request.expect_sha256
                    && std::fs::read(&p).is_ok_and(|b| <[u8; 32]>::from(Sha256::digest(&b)) != want)
                {
                    tracing::debug!(file, "config changed again before its reload ran; waiting for it to settle");
                    return Ok(gw.generation().number);
                }
                let turn = gw.reload_turn().await?;
                let text = match std::fs::read_to_string(&p) {
                    Ok(t) => t,
                    Err(e) => return Err(gw.refuse_in_turn(&turn, trigger, format!("cannot read config {file}: {e}"))),
                };
                // An empty file is a write in progress (a truncate before
                // the new text), or a mistake: never a configuration that
                // should drop every account and the admin token.
                if text.trim().is_empty() {
                    let message = format!("config {file} is empty; the running configuration stays");
                    return Err(gw.refuse_in_turn(&turn, trigger, message));
                }
                if let Some(want) = request.expect_sha256
                    && <[u8; 32]>::from(Sha256::digest(text.as_bytes())) != want
                {
                    // Rewritten since the watcher saw it settle: it will see
                    // that change and come back once the file is whole.
                    tracing::debug!(file, "config changed again before its reload ran; waiting for it to settle");
                    return Ok(gw.pass_turn(&turn, trigger));
                }
                match Config::load_with(&p, &text, &overrides) {
                    Ok((config, index)) => {
                        gw.reload_in_turn(&turn, config, trigger, &|m| validate::locate(m, &index, &file)).await
                    }
                    Err(e) => Err(gw.refuse_in_turn(&turn, trigger, format!("{e:#}"))),
                }
            })
        });
        r
    }) as server::MakeReloader
}
