//! What a single gateway has learned, kept across a restart: each account's
//! quota readings, cooldowns, model gates and failure streaks, the operator's
//! runtime disables, and plugin state (affinity's session bindings) — in one
//! small JSON file, written atomically.
//!
//! Without it a restart forgets that a seat is exhausted for the week: the
//! first request after it probes the seat, gets the 429 again, and every
//! session loses the account its prompt cache is warm on.
//!
//! - **Format.** An account's learned state is the record replicas already
//!   exchange (`learned::facts`: every fact with its observed time, bound to
//!   the account's identity), so a restart is a merge like any other: an
//!   account whose credential changed since (another key under the same id, a
//!   seat logged into another organization) inherits nothing; cooldowns and
//!   gates that ended meanwhile are dropped; windows whose reset has passed
//!   read fresh, as always. Plugin state is its live entries with their
//!   expiry and write time, restored for the scopes the chain uses.
//! - **Writing.** Checked every `[state] file_write_ms` and written when an
//!   account's learned state changed (every account has a change counter),
//!   and once more at shutdown, after the last request. Plugin state changes
//!   with nearly every request (affinity stamps its binding), and a flooding
//!   plugin may hold tens of MiB, so it is copied at most every
//!   [`PLUGIN_EVERY`] checks (and at shutdown); the writes between reuse the
//!   last copy. A write goes to a temporary file in the same directory, is
//!   synced, renamed over the old one and the directory synced: a crash
//!   leaves the old file or the new one, never half of one. The file is 0600
//!   (session ids and organization ids are in it, never a credential).
//! - **Cost.** Copying, encoding and writing run on one thread of their own
//!   at a lower priority (`poolgate-state`, nice 10 on Linux), never on a
//!   request's worker: measured in a debug build, copying and writing a
//!   flooded plugin scope (150,000 entries, a 25 MB file before the copy was
//!   bounded) took 0.7–1.7 s of that thread, a rewrite reusing the copy
//!   30–150 ms — time the workers serving requests and `/healthz` must not
//!   wait behind.
//! - **Failures.** A file that cannot be read or parsed is logged, moved
//!   aside (`<file>.corrupt`) and ignored; a write that fails is logged once
//!   per distinct error and retried at the next change. Neither ever stops the
//!   gateway: it serves as it would have without the file.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::Gateway;
use crate::learned::accounts::{AccountState, RuntimeDisable};
use crate::learned::facts::{self, Absorbed, AccountFacts};
use crate::policy::{StateEntry, StateStore};

/// The file format; a file of another version is ignored (and kept aside).
pub const VERSION: u32 = 1;

/// The most bytes of plugin state the file holds (`StateStore::dump`'s
/// count: about what the entries take written out); past it the rest is left
/// out. Plugin state is bounded in memory (`[policy.state]`, 128 MiB in all by
/// default); this bounds what is copied and written when a plugin floods its
/// state. Affinity's default 5,000 sessions take about half a MiB.
pub const PLUGIN_BYTES_MAX: usize = 8 << 20;

/// Plugin state is copied into the file at most every this many checks
/// (`file_write_ms` each: 10 s by default), and at shutdown.
pub const PLUGIN_EVERY: u64 = 10;

/// The state file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateFile {
    /// [`VERSION`].
    pub v: u32,
    /// When it was written.
    pub written_ms: u64,
    /// By account id.
    #[serde(default)]
    pub accounts: BTreeMap<String, AccountRecord>,
    /// Plugin state.
    #[serde(default)]
    pub plugin: Vec<StateEntry>,
}

/// What the file keeps of one account.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountRecord {
    /// What was learned, bound to the identity it was learned about (absent
    /// while the account has none: a seat whose organization is unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facts: Option<AccountFacts>,
    /// The operator's runtime disable, if one is in force. Kept whatever the
    /// identity: it is about the account id, as a reload keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<RuntimeDisable>,
}

/// What a restart took back, for the log and `/status`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Restored {
    /// When the file was written.
    pub written_ms: u64,
    /// Accounts whose learned state was merged.
    pub accounts: usize,
    /// Of them, accounts cooling or gated now.
    pub cooling: usize,
    /// Runtime disables taken back.
    pub disabled: usize,
    /// Accounts whose credential changed since: nothing learned was taken.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub other_identity: Vec<String>,
    /// Records that cannot be right (times in the future, nonsense numbers).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<String>,
    /// Plugin-state entries taken back (live, in a scope the chain uses).
    pub plugin_entries: usize,
}

/// What the file keeps of `accounts` (id, state) at `now`.
pub fn account_records<'a>(
    accounts: impl IntoIterator<Item = (&'a str, &'a AccountState)>,
    now: u64,
) -> BTreeMap<String, AccountRecord> {
    let mut out = BTreeMap::new();
    for (id, state) in accounts {
        let facts = state.identity().map(|identity| facts::export(&state.learned(), &identity, now));
        let disabled = state.runtime_disabled();
        if facts.is_some() || disabled.is_some() {
            out.insert(id.to_string(), AccountRecord { facts, disabled });
        }
    }
    out
}

/// The plugin store's live entries at `now`, as the JSON array the file
/// holds (at most about [`PLUGIN_BYTES_MAX`]).
pub fn plugin_json(plugin: &dyn StateStore, now: u64) -> Result<Vec<u8>, String> {
    serde_json::to_vec(&plugin.dump(now, PLUGIN_BYTES_MAX)).map_err(|e| format!("cannot encode plugin state: {e}"))
}

/// The file's bytes: a [`StateFile`] written at `now`, its plugin entries
/// already encoded (`plugin`, a JSON array: a copy reused between writes).
pub fn encode(now: u64, accounts: &BTreeMap<String, AccountRecord>, plugin: &[u8]) -> Result<Vec<u8>, String> {
    let accounts = serde_json::to_vec(accounts).map_err(|e| format!("cannot encode accounts: {e}"))?;
    let mut out = Vec::with_capacity(accounts.len() + plugin.len() + 64);
    out.extend_from_slice(format!("{{\"v\":{VERSION},\"written_ms\":{now},\"accounts\":").as_bytes());
    out.extend_from_slice(&accounts);
    out.extend_from_slice(b",\"plugin\":");
    out.extend_from_slice(plugin);
    out.push(b'}');
    Ok(out)
}

/// Reads the file's text: `Err` names why it cannot be used.
pub fn parse(text: &[u8]) -> Result<StateFile, String> {
    #[derive(Deserialize)]
    struct Version {
        v: u32,
    }
    let version: Version = serde_json::from_slice(text).map_err(|e| format!("not a state file: {e}"))?;
    if version.v != VERSION {
        return Err(format!("format version {} (this poolgate reads {VERSION})", version.v));
    }
    serde_json::from_slice(text).map_err(|e| format!("not a state file: {e}"))
}

/// Merges `file` into the accounts (id, state) and the plugin store, at `now`.
/// Plugin entries are taken for the scopes in `scopes` only (a scope no stage
/// uses would be dropped at the next reload anyway).
pub fn restore<'a>(
    file: &StateFile,
    accounts: impl IntoIterator<Item = (&'a str, &'a AccountState)>,
    plugin: &dyn StateStore,
    scopes: &[&str],
    now: u64,
) -> Restored {
    let mut r = Restored { written_ms: file.written_ms, ..Restored::default() };
    for (id, state) in accounts {
        let Some(record) = file.accounts.get(id) else { continue };
        if let Some(d) = &record.disabled {
            state.restore_disable(d.clone());
            r.disabled += 1;
        }
        let Some(f) = &record.facts else { continue };
        let identity = state.identity();
        // Its own statement: the guard is gone before the arms look again.
        let absorbed = facts::restore(&mut state.learned(), f, identity.as_deref(), now);
        match absorbed {
            Absorbed::Merged(_) => {
                r.accounts += 1;
                let l = state.learned();
                if l.cooldown.is_some_and(|c| c.until_ms > now) || l.model_gates.iter().any(|g| g.until_ms > now) {
                    r.cooling += 1;
                }
            }
            Absorbed::OtherIdentity => r.other_identity.push(id.to_string()),
            Absorbed::Garbage(why) => r.refused.push(format!("{id}: {why}")),
        }
    }
    for e in file.plugin.iter().filter(|e| scopes.contains(&e.scope.as_str())) {
        if e.written <= now.saturating_add(facts::MAX_SKEW_MS) && plugin.restore(e, now) {
            r.plugin_entries += 1;
        }
    }
    r
}

/// Writes `bytes` to `path` so that it is either the old file or the new one:
/// a temporary file beside it (0600), synced, renamed over it, and the
/// directory synced so the rename itself survives a crash. Creates the
/// directory (0700) if needed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    create_dir(dir)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "state".into());
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let written = (|| {
        let mut f = open_private(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
        return written;
    }
    // The rename is durable once the directory is; a filesystem that cannot
    // sync a directory still has the whole file in place.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(unix)]
fn create_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

#[cfg(not(unix))]
fn create_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)
}

fn open_private(path: &Path) -> std::io::Result<std::fs::File> {
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    o.open(path)
}

/// Reads the file at `path`: `Ok(None)` when there is none yet.
pub fn read(path: &Path) -> Result<Option<StateFile>, String> {
    match std::fs::read(path) {
        Ok(text) => parse(&text).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read it: {e}")),
    }
}

/// The state file's health, for `/status` (`state_file`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct FileStatus {
    /// Where it is.
    pub path: PathBuf,
    /// What the start took back from it (absent: there was none, or it could
    /// not be used — see `restore_error`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restored: Option<Restored>,
    /// Why the file found at start was not used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore_error: Option<String>,
    /// The last successful write.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_write_ms: Option<u64>,
    /// Writes since start.
    pub writes: u64,
    /// The size of the last write, bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_write_bytes: Option<usize>,
    /// How long the last write took (copy, JSON, write and sync), ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_write_took_ms: Option<u64>,
    /// Why the last write failed, while it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// A gateway's state file: restored at start, written as things change.
pub struct Persist {
    path: PathBuf,
    every: Duration,
    /// The change counters of what the file holds (see [`Persist::fingerprint`]).
    written: Mutex<Option<(u64, u64)>>,
    /// The last copy of plugin state, reused until the next is due.
    plugin: Mutex<Option<PluginCopy>>,
    /// One write at a time (the background task and the one at shutdown).
    writing: tokio::sync::Mutex<()>,
    status: Mutex<FileStatus>,
}

/// A copy of plugin state, encoded.
#[derive(Clone)]
struct PluginCopy {
    /// The store's change counter it was taken at.
    changes: u64,
    /// When.
    at_ms: u64,
    json: Arc<Vec<u8>>,
}

/// Whether plugin state is copied again: never copied yet; or changed since
/// the copy (taken at change counter and time `copy`), and either the last
/// write (shutdown) or [`PLUGIN_EVERY`] checks of `every_ms` since the copy.
fn copy_due(copy: Option<(u64, u64)>, changes: u64, now: u64, every_ms: u64, last: bool) -> bool {
    copy.is_none_or(|(seen, at)| {
        seen != changes && (last || now.saturating_sub(at) >= every_ms.saturating_mul(PLUGIN_EVERY))
    })
}

/// A job for the writer thread.
type Job = Box<dyn FnOnce() + Send>;

/// Runs `job` on the writer thread (`poolgate-state`, started on first use,
/// at a lower priority) and waits for its result without holding a worker.
async fn on_writer<T: Send + 'static>(job: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    static WRITER: std::sync::OnceLock<Option<std::sync::mpsc::Sender<Job>>> = std::sync::OnceLock::new();
    let writer = WRITER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let started = std::thread::Builder::new().name("poolgate-state".into()).spawn(move || {
            lower_priority();
            while let Ok(job) = rx.recv() {
                job();
            }
        });
        started.ok().map(|_| tx)
    });
    let Some(writer) = writer else { return Err("the state writer thread could not be started".into()) };
    let (tx, rx) = tokio::sync::oneshot::channel();
    writer
        .send(Box::new(move || {
            let _ = tx.send(job());
        }))
        .map_err(|_| "the state writer thread is gone".to_string())?;
    rx.await.map_err(|_| "the state write was abandoned (it panicked)".to_string())
}

/// Makes the calling thread yield to the workers serving requests.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority(2) on this thread's own id (Linux schedules threads
    // by id) changes nothing but this thread's niceness; lowering it needs no
    // privilege, and a failure leaves the thread as it was.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10);
    }
}

impl Persist {
    /// A state file at `path`, checked for changes every `every`.
    pub fn new(path: PathBuf, every: Duration) -> Persist {
        let status = FileStatus { path: path.clone(), ..FileStatus::default() };
        Persist {
            path,
            every,
            written: Mutex::new(None),
            plugin: Mutex::new(None),
            writing: tokio::sync::Mutex::new(()),
            status: Mutex::new(status),
        }
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its health, for `/status`.
    pub fn status(&self) -> FileStatus {
        self.status.lock().clone()
    }

    /// What `gw` holds now, as change counters: every account's (they only
    /// grow) summed, and the plugin store's. Equal counters, nothing to write.
    fn fingerprint(gw: &Gateway) -> (u64, u64) {
        let accounts = gw.book.all().iter().map(|s| s.version()).fold(0u64, u64::wrapping_add);
        (accounts, gw.plugin_state.changes())
    }

    /// Takes back what the file holds into `gw` (its first generation built,
    /// before it serves). Never fails: a file that cannot be used is logged,
    /// moved aside and ignored.
    pub async fn restore(&self, gw: &Gateway) {
        let path = self.path.clone();
        let read = tokio::task::spawn_blocking(move || read(&path)).await.unwrap_or_else(|e| Err(e.to_string()));
        let file = match read {
            Ok(Some(file)) => file,
            Ok(None) => {
                tracing::info!(file = %self.path.display(), "no state file yet: starting with nothing learned");
                return;
            }
            Err(why) => {
                let mut aside = self.path.clone().into_os_string();
                aside.push(".corrupt");
                let aside = PathBuf::from(aside);
                let moved = std::fs::rename(&self.path, &aside).is_ok();
                tracing::warn!(
                    file = %self.path.display(),
                    error = %why,
                    kept_as = %if moved { aside.display().to_string() } else { "-".into() },
                    "the state file cannot be used; starting with nothing learned"
                );
                self.status.lock().restore_error = Some(why);
                return;
            }
        };
        let generation = gw.generation();
        let accounts: Vec<(&str, &AccountState)> = generation
            .accounts
            .iter()
            .map(|a| (a.config.id.as_str(), &*a.state))
            .chain(generation.disabled.iter().map(|(c, s)| (c.id.as_str(), &**s)))
            .collect();
        let scopes = generation.chain.scopes();
        let restored = restore(&file, accounts, &*gw.plugin_state, &scopes, gw.clock.now_ms());
        for id in &restored.other_identity {
            tracing::info!(account = %id, "the account's credential changed since the state file was written: nothing learned about the old one is restored");
        }
        for why in &restored.refused {
            tracing::warn!(record = %why, "a record of the state file cannot be right; ignored");
        }
        tracing::info!(
            file = %self.path.display(),
            accounts = restored.accounts,
            cooling = restored.cooling,
            disabled = restored.disabled,
            plugin_entries = restored.plugin_entries,
            age_ms = gw.clock.now_ms().saturating_sub(file.written_ms),
            "learned state restored"
        );
        self.status.lock().restored = Some(restored);
    }

    /// Writes the file if an account's learned state changed since the last
    /// write, or plugin state did and its copy is due (`last`: at shutdown,
    /// it is). The copy, the encoding and the write run on the writer thread:
    /// a large plugin store costs that thread, never a request's worker.
    pub async fn save(&self, gw: &Gateway, last: bool) {
        let _turn = self.writing.lock().await;
        let (accounts_v, plugin_v) = Self::fingerprint(gw);
        let now = gw.clock.now_ms();
        let cached = self.plugin.lock().clone();
        let every_ms = self.every.as_millis() as u64;
        let plugin_due = copy_due(cached.as_ref().map(|c| (c.changes, c.at_ms)), plugin_v, now, every_ms, last);
        let accounts_due = self.written.lock().is_none_or(|(a, _)| a != accounts_v);
        if !accounts_due && !plugin_due {
            return;
        }
        let generation = gw.generation();
        let accounts: Vec<(String, Arc<AccountState>)> = generation
            .accounts
            .iter()
            .map(|a| (a.config.id.clone(), a.state.clone()))
            .chain(generation.disabled.iter().map(|(c, s)| (c.id.clone(), s.clone())))
            .collect();
        drop(generation);
        let (plugin, path) = (gw.plugin_state.clone(), self.path.clone());
        let reuse = cached.as_ref().filter(|_| !plugin_due).map(|c| c.json.clone());
        let started = gw.clock.instant();
        let wrote = on_writer(move || {
            let records = account_records(accounts.iter().map(|(id, s)| (id.as_str(), &**s)), now);
            let json = match reuse {
                Some(json) => json,
                None => Arc::new(plugin_json(&*plugin, now)?),
            };
            let bytes = encode(now, &records, &json)?;
            write_atomic(&path, &bytes).map_err(|e| e.to_string())?;
            Ok::<_, String>((bytes.len(), json))
        })
        .await
        .and_then(|r| r);
        let took_ms = gw.clock.since(started).as_millis() as u64;
        match wrote {
            Ok((size, json)) => {
                tracing::debug!(file = %self.path.display(), bytes = size, took_ms, "state file written");
                let plugin_in_file = if plugin_due { plugin_v } else { cached.map_or(plugin_v, |c| c.changes) };
                if plugin_due {
                    *self.plugin.lock() = Some(PluginCopy { changes: plugin_v, at_ms: now, json });
                }
                *self.written.lock() = Some((accounts_v, plugin_in_file));
                let mut st = self.status.lock();
                if st.last_error.take().is_some() {
                    tracing::info!(file = %self.path.display(), "the state file is written again");
                }
                st.last_write_ms = Some(now);
                st.writes += 1;
                st.last_write_bytes = Some(size);
                st.last_write_took_ms = Some(took_ms);
            }
            Err(e) => self.failed(&e),
        }
    }

    /// A write failed: logged when the error is new (not every second).
    fn failed(&self, why: &str) {
        let mut st = self.status.lock();
        if st.last_error.as_deref() != Some(why) {
            tracing::warn!(file = %self.path.display(), error = %why, "cannot write the state file; learned state will not survive a restart until it can");
        }
        st.last_error = Some(why.to_string());
    }

    /// Writes the file whenever something changed, checked every
    /// `file_write_ms`, for as long as the gateway lives.
    pub fn spawn(self: Arc<Self>, gw: Weak<Gateway>) {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(self.every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(gw) = gw.upgrade() else { return };
                self.save(&gw, false).await;
            }
        });
    }
}

#[cfg(test)]
mod tests;
