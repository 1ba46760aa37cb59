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
//!   exchange (`shared::facts`: every fact with its observed time, bound to
//!   the account's identity), so a restart is a merge like any other: an
//!   account whose credential changed since (another key under the same id, a
//!   seat logged into another organization) inherits nothing; cooldowns and
//!   gates that ended meanwhile are dropped; windows whose reset has passed
//!   read fresh, as always. Plugin state is its live entries with their
//!   expiry and write time, restored for the scopes the chain uses.
//! - **Writing.** Checked every `[state] file_write_ms` and written when
//!   anything changed (every account's change counter, the plugin store's),
//!   and once more at shutdown, after the last request. A write goes to a
//!   temporary file in the same directory, is synced, renamed over the old
//!   one and the directory synced: a crash leaves the old file or the new
//!   one, never half of one. The file is 0600 (session ids and organization
//!   ids are in it, never a credential).
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

use super::accounts::{AccountState, RuntimeDisable};
use super::{Gateway, now_ms};
use crate::policy::{StateEntry, StateStore};
use crate::shared::facts::{self, Absorbed, AccountFacts};

/// The file format; a file of another version is ignored (and kept aside).
pub const VERSION: u32 = 1;

/// The most plugin-state bytes (keys and values) the file holds; past it the
/// rest is left out. Plugin state is bounded in memory (`[policy.state]`,
/// 128 MiB in all by default); this bounds what is copied and written every
/// `file_write_ms` when a plugin floods its state.
pub const PLUGIN_BYTES_MAX: usize = 16 << 20;

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

/// Builds the file from `accounts` (id, state) and the plugin store at `now`.
pub fn snapshot<'a>(
    accounts: impl IntoIterator<Item = (&'a str, &'a AccountState)>,
    plugin: &dyn StateStore,
    now: u64,
) -> StateFile {
    let mut out = BTreeMap::new();
    for (id, state) in accounts {
        let facts = state.identity().map(|identity| facts::export(&state.learned(), &identity, now));
        let disabled = state.runtime_disabled();
        if facts.is_some() || disabled.is_some() {
            out.insert(id.to_string(), AccountRecord { facts, disabled });
        }
    }
    let entries = plugin.dump(now, PLUGIN_BYTES_MAX);
    StateFile { v: VERSION, written_ms: now, accounts: out, plugin: entries }
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
    /// Why the last write failed, while it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// A gateway's state file: restored at start, written as things change.
pub struct Persist {
    path: PathBuf,
    every: Duration,
    /// The change counters the last write saw (see [`Persist::fingerprint`]).
    written: Mutex<Option<(u64, u64)>>,
    /// One write at a time (the background task and the one at shutdown).
    writing: tokio::sync::Mutex<()>,
    status: Mutex<FileStatus>,
}

impl Persist {
    /// A state file at `path`, checked for changes every `every`.
    pub fn new(path: PathBuf, every: Duration) -> Persist {
        let status = FileStatus { path: path.clone(), ..FileStatus::default() };
        Persist {
            path,
            every,
            written: Mutex::new(None),
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
        let accounts = gw.account_states().iter().map(|s| s.version()).fold(0u64, u64::wrapping_add);
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
                let aside = self.path.with_extension("json.corrupt");
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
        let restored = restore(&file, accounts, &*gw.plugin_state, &scopes, now_ms());
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
            age_ms = now_ms().saturating_sub(file.written_ms),
            "learned state restored"
        );
        self.status.lock().restored = Some(restored);
    }

    /// Writes the file if anything changed since the last write. The copy,
    /// the JSON and the write run on the blocking pool: a large plugin store
    /// costs a thread there, never a request's worker.
    pub async fn save(&self, gw: &Gateway) {
        let _turn = self.writing.lock().await;
        let seen = Self::fingerprint(gw);
        if *self.written.lock() == Some(seen) {
            return;
        }
        let now = now_ms();
        let generation = gw.generation();
        let accounts: Vec<(String, Arc<AccountState>)> = generation
            .accounts
            .iter()
            .map(|a| (a.config.id.clone(), a.state.clone()))
            .chain(generation.disabled.iter().map(|(c, s)| (c.id.clone(), s.clone())))
            .collect();
        drop(generation);
        let (plugin, path) = (gw.plugin_state.clone(), self.path.clone());
        let wrote = tokio::task::spawn_blocking(move || {
            let file = snapshot(accounts.iter().map(|(id, s)| (id.as_str(), &**s)), &*plugin, now);
            let bytes = serde_json::to_vec(&file).map_err(|e| format!("cannot serialize it: {e}"))?;
            write_atomic(&path, &bytes).map_err(|e| e.to_string())
        })
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
        match wrote {
            Ok(()) => {
                *self.written.lock() = Some(seen);
                let mut st = self.status.lock();
                if st.last_error.take().is_some() {
                    tracing::info!(file = %self.path.display(), "the state file is written again");
                }
                st.last_write_ms = Some(now);
                st.writes += 1;
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
                self.save(&gw).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::{CooldownReason, Status, WindowReading};
    use crate::config::CooldownConfig;
    use crate::gateway::cooldown::Answer;
    use crate::gateway::quota::QuotaReading;
    use crate::policy::MemoryState;

    const NOW: u64 = 1_760_000_000_000;
    const HOUR: u64 = 3_600_000;

    fn exhausted() -> QuotaReading {
        QuotaReading {
            status: Some(Status::Rejected),
            reset_ms: Some(NOW + HOUR),
            windows: vec![WindowReading {
                name: "7d".into(),
                utilization: 1.0,
                resets_at_ms: Some(NOW + HOUR),
                status: Status::Rejected,
                observed_at_ms: Some(NOW),
            }],
            ..QuotaReading::default()
        }
    }

    fn account(id: &str, key: &str) -> AccountState {
        let a = AccountState::new(id);
        a.bind(Some(format!("key:{key}")));
        a
    }

    fn round_trip(file: &StateFile) -> StateFile {
        parse(&serde_json::to_vec(file).unwrap()).unwrap()
    }

    #[test]
    fn an_exhausted_account_and_a_binding_come_back_after_a_restart() {
        let a = account("a", "k1");
        let cfg = CooldownConfig::default();
        a.record(Answer::Status(429), &exhausted(), None, &cfg, NOW);
        assert_eq!(a.cooldown(NOW).unwrap().reason, CooldownReason::WeeklyExhausted);
        let plugin = MemoryState::default();
        plugin.set("builtin:affinity", "session-1", "a|1", Some(HOUR), NOW);
        plugin.set("builtin:gone", "k", "v", None, NOW);
        let file = round_trip(&snapshot([("a", &a)], &plugin, NOW));

        let later = NOW + 60_000;
        let (fresh, store) = (account("a", "k1"), MemoryState::default());
        let r = restore(&file, [("a", &fresh)], &store, &["builtin:affinity"], later);
        assert_eq!((r.accounts, r.cooling, r.plugin_entries), (1, 1, 1));
        assert_eq!(fresh.cooldown(later).map(|c| c.reason), Some(CooldownReason::WeeklyExhausted));
        assert_eq!(store.get("builtin:affinity", "session-1", later).as_deref(), Some("a|1"));
        assert_eq!(store.get("builtin:gone", "k", later), None, "a scope no stage uses is not taken back");
    }

    #[test]
    fn another_key_under_the_same_id_inherits_nothing_but_the_disable() {
        let a = account("a", "k1");
        a.record(Answer::Status(429), &exhausted(), None, &CooldownConfig::default(), NOW);
        a.disable("alice", Some("rotating".into()), NOW).unwrap();
        let file = round_trip(&snapshot([("a", &a)], &MemoryState::default(), NOW));
        let rotated = account("a", "k2");
        let r = restore(&file, [("a", &rotated)], &MemoryState::default(), &[], NOW + 1);
        assert_eq!(r.other_identity, ["a"]);
        assert_eq!(rotated.cooldown(NOW + 1), None);
        assert_eq!(rotated.runtime_disabled().map(|d| d.by), Some("alice".into()), "the operator's act is the id's");
    }

    #[test]
    fn cooldowns_and_bindings_that_ended_meanwhile_are_dropped() {
        let a = account("a", "k1");
        a.record(Answer::Status(529), &QuotaReading::default(), None, &CooldownConfig::default(), NOW);
        let until = a.cooldown(NOW).unwrap().until_ms;
        let plugin = MemoryState::default();
        plugin.set("builtin:affinity", "s", "a|1", Some(1_000), NOW);
        let file = round_trip(&snapshot([("a", &a)], &plugin, NOW));
        let (fresh, store) = (account("a", "k1"), MemoryState::default());
        let r = restore(&file, [("a", &fresh)], &store, &["builtin:affinity"], until + 1);
        assert_eq!((r.accounts, r.cooling, r.plugin_entries), (1, 0, 0));
        assert_eq!(fresh.cooldown(until + 1), None);
    }

    #[test]
    fn garbage_another_version_or_an_empty_file_is_refused_with_a_reason() {
        assert!(parse(b"").unwrap_err().contains("not a state file"));
        assert!(parse(b"{\"v\":1,\"written_ms\":").unwrap_err().contains("not a state file"));
        assert!(parse(b"{\"v\":2,\"written_ms\":0}").unwrap_err().contains("version 2"));
        assert!(parse(b"{\"v\":1,\"written_ms\":0,\"surprise\":1}").is_err());
        assert!(parse(b"{\"v\":1,\"written_ms\":0}").is_ok());
    }

    #[test]
    fn a_record_from_the_future_is_refused() {
        let a = account("a", "k1");
        let file = round_trip(&snapshot([("a", &a)], &MemoryState::default(), NOW + 10 * HOUR));
        let r = restore(&file, [("a", &account("a", "k1"))], &MemoryState::default(), &[], NOW);
        assert_eq!(r.refused.len(), 1, "{r:?}");
    }

    #[test]
    fn a_write_replaces_the_file_whole_and_leaves_no_temporary_file() {
        let dir = std::env::temp_dir().join(format!("poolgate-persist-{}-{}", std::process::id(), NOW));
        let path = dir.join("nested").join("state.json");
        write_atomic(&path, b"{\"v\":1,\"written_ms\":1}").unwrap();
        write_atomic(&path, b"{\"v\":1,\"written_ms\":2}").unwrap();
        assert_eq!(read(&path).unwrap().unwrap().written_ms, 2);
        let left: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, ["state.json"]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        assert_eq!(read(&dir.join("none.json")).unwrap(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
