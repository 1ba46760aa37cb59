//! Reload triggers: the config file and every `.wasm` it references are watched,
//! and SIGHUP reloads too (`POST /admin/reload` is in `routes`).
//!
//! Watching polls file fingerprints (size, modification time, inode, and the
//! config's content hash) every 100 ms instead of subscribing to filesystem
//! events: editors save by rename, Kubernetes swaps a `..data` symlink, and
//! network filesystems drop events; a poll sees all of them the same way, costs
//! a few `stat` calls, and has no platform quirks. A change is acted on once the
//! files have stayed put for 150 ms (a copy in progress is not a config).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::Gateway;
use crate::gateway::reload::{ReloadRequest, Reloader};

/// How often the files are looked at.
pub const POLL: Duration = Duration::from_millis(100);
/// How long files must stay unchanged before a reload.
pub const SETTLE: Duration = Duration::from_millis(150);

/// (size, mtime s, mtime ns, inode) of a file that exists.
type Meta = (u64, i64, i64, u64);

/// Per watched file: its path, metadata and (for the config) content hash.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Print(Vec<(PathBuf, Option<Meta>, Option<[u8; 32]>)>);

fn print(config: &Path, plugins: &[PathBuf]) -> Print {
    let meta = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.len(), m.mtime(), m.mtime_nsec(), m.ino()));
    let mut out =
        vec![(config.to_path_buf(), meta(config), std::fs::read(config).ok().map(|b| Sha256::digest(&b).into()))];
    out.extend(plugins.iter().map(|p| (p.clone(), meta(p), None)));
    Print(out)
}

/// The `.wasm` files the running generation loads.
fn plugin_files(gw: &Gateway) -> Vec<PathBuf> {
    gw.generation()
        .config
        .policy
        .chain
        .iter()
        .filter(|s| !s.plugin.starts_with("builtin:"))
        .map(|s| PathBuf::from(&s.plugin))
        .collect()
}

/// Reloads whenever the config file or one of its plugins changes. Runs until
/// the gateway is dropped.
pub fn watch_files(gateway: &Arc<Gateway>, config: PathBuf, reload: Reloader) -> tokio::task::JoinHandle<()> {
    let weak = Arc::downgrade(gateway);
    // The files as loaded, taken now rather than when the task first runs: a
    // change made right after the gateway says it listens is a change.
    let mut last = print(&config, &plugin_files(gateway));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(POLL).await;
            let Some(gw) = weak.upgrade() else { return };
            let files = plugin_files(&gw);
            drop(gw);
            let mut now = print(&config, &files);
            if now == last {
                continue;
            }
            let seen = tokio::time::Instant::now();
            // Wait for the writer to finish.
            loop {
                tokio::time::sleep(SETTLE).await;
                let again = print(&config, &files);
                if again == now {
                    break;
                }
                now = again;
            }
            last = now;
            tracing::debug!(settle_ms = seen.elapsed().as_millis() as u64, "config or plugin file changed; reloading");
            let expect_sha256 = last.0[0].2;
            run(&weak, &reload, ReloadRequest { trigger: "file-watch", expect_sha256 }).await;
            // A new generation may reference other plugin files; a change to the
            // config during the reload is still seen on the next poll.
            if let Some(gw) = weak.upgrade() {
                let mut fresh = print(&config, &plugin_files(&gw));
                fresh.0[0] = last.0[0].clone();
                last = fresh;
            }
        }
    })
}

/// Reloads on every SIGHUP. Runs until the gateway is dropped.
#[cfg(unix)]
pub fn reload_on_sighup(gateway: &Arc<Gateway>, reload: Reloader) -> tokio::task::JoinHandle<()> {
    let weak = Arc::downgrade(gateway);
    // Listening before this returns, not when the task first runs: SIGHUP's
    // default action kills the process, and systemd hears READY=1 next.
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    tokio::spawn(async move {
        let Ok(mut hup) = hup else {
            tracing::warn!("cannot listen for SIGHUP; reload by file change or POST /admin/reload");
            return;
        };
        while hup.recv().await.is_some() {
            if weak.upgrade().is_none() {
                return;
            }
            run(&weak, &reload, ReloadRequest::now("sighup")).await;
        }
    })
}

/// Retries a refused reload when a compile it had joined, and given up waiting
/// for, finishes (`policy::compile::StillCompiling`): the compile's result is
/// in the cache by then, so the retry loads it. Only while the last reload
/// stands refused; a reload that succeeded since needs no retry. The compile
/// can end before the reload that gave up on it has recorded its refusal, so
/// the check waits for the reload under way to end first. Runs until the
/// gateway is dropped.
pub fn retry_after_compiles(gateway: &Arc<Gateway>, reload: Reloader) -> tokio::task::JoinHandle<()> {
    let weak = Arc::downgrade(gateway);
    let mut finished = gateway.engine.finished_joins();
    tokio::spawn(async move {
        while finished.changed().await.is_ok() {
            let Some(gw) = weak.upgrade() else { return };
            gw.reloads_settled().await;
            let refused = gw.last_reload.lock().as_ref().is_some_and(|r| !r.ok);
            drop(gw);
            if refused {
                tracing::info!("a compile the last (refused) reload was waiting for has finished; reloading");
                run(&weak, &reload, ReloadRequest::now("compile-finished")).await;
            }
        }
    })
}

/// Runs one reload. The reloader logs its outcome — what changed, or why it
/// was refused (`Gateway::refuse_reload`) — so a trigger adds no line of its
/// own: one refusal is one log line, and `/status` and the metrics count it.
/// A reload that panicked (its panic is logged by the panic hook) never got
/// to record its refusal; that is recorded here. A reload superseded by a
/// newer one has logged that (`Gateway::reload_in_turn`); the newer one's
/// outcome is logged when it ends.
async fn run(gateway: &std::sync::Weak<Gateway>, reload: &Reloader, request: ReloadRequest) {
    let trigger = request.trigger;
    if let Err(e) = tokio::spawn(reload(request)).await
        && let Some(gw) = gateway.upgrade()
    {
        let why = if e.is_panic() { "the reload panicked (see the panic line)" } else { "the reload was cancelled" };
        gw.refuse_reload(trigger, why);
    }
}
