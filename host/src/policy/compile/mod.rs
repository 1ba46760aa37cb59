//! Turning a component's bytes into machine code, within limits, and caching it.
//!
//! Compiling is the expensive step (0.1 s for a Rust plugin, 10–30 s for a
//! Python or JavaScript one, minutes for a huge component), so it happens at
//! load or reload, never on the request path, and it is bounded: a file over
//! `policy.max_plugin_mb` is refused before any work, and a compile that takes
//! longer than `policy.compile_timeout_ms` is abandoned and the plugin refused.
//!
//! Inside `poolgate` itself the compile runs in a child process (`poolgate
//! __compile-plugin`, at a lower CPU priority): a compile past its budget is
//! killed rather than left burning a core, and the compiler's own memory — which
//! for a large component is gigabytes — never joins the gateway's. When the
//! runtime is used as a library (tests, benches) the compile runs on a thread and
//! is abandoned at the budget.
//!
//! Two compiles of the same bytes never run at once against one cache
//! directory: whoever starts first holds a lock file beside the cache entry,
//! and any other compile of those bytes — another reload, `poolgate plugin
//! build --config` in another process — waits for it and loads its result
//! ([`Compiler::compile`]). One whose budget runs out while it waits is refused
//! with [`StillCompiling`], and [`Compiler::finished_joins`] says when the
//! compile it waited for ends, so the gateway can retry the reload then.
//!
//! Results are cached twice, both bounded: in memory by content hash (a reload of
//! an unchanged plugin costs nothing), least recently used first out; and on disk
//! by content hash plus the engine's compatibility hash (a restart costs a
//! deserialize, not a compile), oldest entries removed once the directory holds
//! more than `policy.cache_max_mb`.

mod child;

pub use child::run_child;
use child::{Spawn, precompile_in_child};

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Default largest plugin file accepted, MiB (a Python component is ~18 MiB).
pub const DEFAULT_MAX_PLUGIN_MB: usize = 64;
/// Default compile budget, ms (a Python component takes 10–20 s on 2 busy cores).
pub const DEFAULT_COMPILE_TIMEOUT_MS: u64 = 120_000;
/// Default size bound of the disk cache, MiB.
pub const DEFAULT_CACHE_MAX_MB: usize = 1024;
/// Compiled components kept in memory.
const MEMORY_ENTRIES: usize = 32;
/// Bytes of compiled code kept in memory.
const MEMORY_BYTES: usize = 512 << 20;

/// The hidden subcommand that compiles in a child process.
pub const SUBCOMMAND: &str = "__compile-plugin";

/// The limits a compile runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileLimits {
    /// Largest component file accepted, bytes.
    pub max_plugin_bytes: usize,
    /// How long a compile may take.
    pub timeout: Duration,
    /// Size bound of the disk cache, bytes.
    pub cache_max_bytes: u64,
}

impl Default for CompileLimits {
    fn default() -> Self {
        CompileLimits {
            max_plugin_bytes: DEFAULT_MAX_PLUGIN_MB << 20,
            timeout: Duration::from_millis(DEFAULT_COMPILE_TIMEOUT_MS),
            cache_max_bytes: (DEFAULT_CACHE_MAX_MB as u64) << 20,
        }
    }
}

static COMPILER_EXE: OnceLock<PathBuf> = OnceLock::new();

/// Makes compiles run in child processes of `exe` (the `poolgate` binary, which
/// handles [`SUBCOMMAND`]). Called once by the binary's `main`.
pub fn compile_in_subprocess(exe: PathBuf) {
    let _ = COMPILER_EXE.set(exe);
}

struct Cached {
    component: Component,
    bytes: usize,
    used: u64,
}

/// The compiler and its caches.
pub struct Compiler {
    cache_dir: Option<PathBuf>,
    memory: Mutex<(HashMap<String, Cached>, u64)>,
    limits: Mutex<CompileLimits>,
    /// Bumped each time a compile that a refused caller had joined ends.
    finished_joins: tokio::sync::watch::Sender<u64>,
    /// Lock files some thread is waiting on for `finished_joins`.
    awaited: Arc<Mutex<HashSet<PathBuf>>>,
    /// Compiles run (not served from either cache); see [`Compiler::compiles_run`].
    compiles_run: AtomicU64,
}

/// A compile of the same bytes was under way elsewhere (another reload or
/// another process sharing the cache directory), and it was still running when
/// this caller's compile budget ran out. Nothing was compiled twice;
/// [`Compiler::finished_joins`] changes when that compile ends.
#[derive(Debug)]
pub struct StillCompiling {
    label: String,
    budget: Duration,
}

impl std::fmt::Display for StillCompiling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: the same component is being compiled elsewhere (by another load in this process, or another \
             poolgate process sharing the compile cache, such as `plugin build --config`), still running after \
             this load's compile budget of {} s (policy.compile_timeout_ms); nothing was compiled twice, and a \
             gateway whose reload this refused retries it when that compile finishes",
            self.label,
            self.budget.as_secs_f64()
        )
    }
}

impl std::error::Error for StillCompiling {}

/// How often a compile waiting for another one looks again.
const JOIN_POLL: Duration = Duration::from_millis(50);

impl Compiler {
    /// A compiler caching on disk in `cache_dir` (`None`: memory only).
    pub fn new(cache_dir: Option<PathBuf>) -> Self {
        Compiler {
            cache_dir,
            memory: Mutex::new((HashMap::new(), 0)),
            limits: Mutex::new(CompileLimits::default()),
            finished_joins: tokio::sync::watch::Sender::new(0),
            awaited: Arc::default(),
            compiles_run: AtomicU64::new(0),
        }
    }

    /// How many compiles this compiler has run, finished or not: loads served
    /// from the memory or the disk cache run none. For tests and benchmarks
    /// that check a load took the cache (a restart that finds its cache
    /// compiles nothing), not a time it took.
    pub fn compiles_run(&self) -> u64 {
        self.compiles_run.load(Ordering::Relaxed)
    }

    /// Changes each time a compile ends that a caller refused with
    /// [`StillCompiling`] had been waiting for.
    pub fn finished_joins(&self) -> tokio::sync::watch::Receiver<u64> {
        self.finished_joins.subscribe()
    }

    /// Replaces the limits (on reload).
    pub fn set_limits(&self, limits: CompileLimits) {
        *self.limits.lock() = limits;
    }

    /// The limits in force.
    pub fn limits(&self) -> CompileLimits {
        *self.limits.lock()
    }

    /// Compiles `bytes` (or takes them from a cache). `label` names the plugin in
    /// errors. Blocks for as long as the compile takes: call off the async
    /// workers.
    pub fn compile(&self, engine: &Engine, bytes: &[u8], label: &str) -> Result<(Component, String)> {
        let limits = self.limits();
        if bytes.len() > limits.max_plugin_bytes {
            bail!(
                "{label} is {:.1} MiB, over the plugin size limit of {} MiB (policy.max_plugin_mb)",
                bytes.len() as f64 / (1 << 20) as f64,
                limits.max_plugin_bytes >> 20
            );
        }
        let sha = hex::encode(Sha256::digest(bytes));
        if let Some(c) = self.remembered(&sha) {
            return Ok((c, sha));
        }
        let key = format!("{sha}-{:016x}", compatibility_hash(engine));
        let cached = self.cache_dir.as_ref().map(|d| d.join(format!("{key}.cwasm")));
        let component = match cached.as_deref().and_then(|p| load_cached(engine, p)) {
            Some(c) => c,
            None => match &cached {
                Some(path) => self.compile_once(engine, bytes, label, limits, path)?,
                None => self.compile_now(engine, bytes, label, limits, limits.timeout, None)?,
            },
        };
        self.remember(&sha, &component);
        Ok((component, sha))
    }

    /// Compiles into the disk cache at `path`, unless a compile of the same
    /// bytes is under way (its lock file held): then waits for it and loads
    /// what it stored, within the budget.
    fn compile_once(
        &self,
        engine: &Engine,
        bytes: &[u8],
        label: &str,
        limits: CompileLimits,
        path: &Path,
    ) -> Result<Component> {
        let started = crate::clock::machine_instant();
        let lock_path = path.with_extension("lock");
        let mut waited = false;
        let lock = loop {
            let lock = match open_lock(&lock_path) {
                Ok(f) => f,
                Err(e) => {
                    tracing::warn!(plugin = label, error = %e, "cannot open the compile lock; compiling without it");
                    return self.compile_now(engine, bytes, label, limits, limits.timeout, Some(path));
                }
            };
            match lock.try_lock() {
                // The holder unlinks the file as it lets go: a lock taken on a
                // file no longer at `lock_path` excludes no one (a newcomer
                // creates a fresh one), so it is taken again on what is there.
                Ok(()) if same_file(&lock, &lock_path) => break lock,
                Ok(()) => continue,
                Err(std::fs::TryLockError::WouldBlock) => {}
                Err(std::fs::TryLockError::Error(e)) => {
                    tracing::warn!(plugin = label, error = %e, "cannot take the compile lock; compiling without it");
                    return self.compile_now(engine, bytes, label, limits, limits.timeout, Some(path));
                }
            }
            if !waited {
                tracing::info!(plugin = label, "the same component is being compiled elsewhere; waiting for it");
                waited = true;
            }
            if started.elapsed() >= limits.timeout {
                self.await_release(lock_path);
                return Err(StillCompiling { label: label.to_string(), budget: limits.timeout }.into());
            }
            #[allow(clippy::disallowed_methods, reason = "compiles run off the async workers (see `compile`)")]
            std::thread::sleep(JOIN_POLL);
        };
        // Whoever held the lock may have stored the result just now.
        let result = match load_cached(engine, path) {
            Some(c) => Ok(c),
            None => {
                let left = limits.timeout.saturating_sub(started.elapsed());
                self.compile_now(engine, bytes, label, limits, left, Some(path))
            }
        };
        // Stored (or failed) before the lock goes: a caller arriving now finds
        // the cache entry; one that opened the old file takes its lock, sees
        // the file gone from `lock_path`, and locks what is there instead.
        let _ = std::fs::remove_file(&lock_path);
        drop(lock);
        result
    }

    /// Compiles within `timeout` and stores the result at `path`.
    fn compile_now(
        &self,
        engine: &Engine,
        bytes: &[u8],
        label: &str,
        limits: CompileLimits,
        timeout: Duration,
        path: Option<&Path>,
    ) -> Result<Component> {
        self.compiles_run.fetch_add(1, Ordering::Relaxed);
        let started = crate::clock::machine_instant();
        let (c, serialized) = build(engine, bytes, label, limits.timeout, timeout)?;
        tracing::info!(plugin = label, elapsed_ms = started.elapsed().as_millis() as u64, "compiled plugin");
        if let Some(path) = path {
            match store_cached(&serialized, path) {
                Ok(()) => evict_disk(path.parent().unwrap_or(Path::new(".")), limits.cache_max_bytes),
                Err(e) => tracing::warn!(plugin = label, error = %e, "could not write the compiled-plugin cache"),
            }
        }
        Ok(c)
    }

    /// Waits (on a thread of its own, one per lock file) until the compile
    /// holding `lock_path` ends, then bumps `finished_joins`.
    fn await_release(&self, lock_path: PathBuf) {
        if !self.awaited.lock().insert(lock_path.clone()) {
            return;
        }
        let (awaited, finished) = (self.awaited.clone(), self.finished_joins.clone());
        let path = lock_path.clone();
        let spawned = std::thread::Builder::new().name("poolgate-compile-join".into()).spawn(move || {
            // A blocking lock: the holder is a compile with a budget of its
            // own, or a process whose death releases it. A file no longer
            // there was unlinked by its holder as it ended.
            if let Ok(f) = std::fs::File::options().write(true).open(&path) {
                while let Err(e) = f.lock() {
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        break;
                    }
                }
            }
            awaited.lock().remove(&path);
            finished.send_modify(|n| *n += 1);
        });
        if spawned.is_err() {
            self.awaited.lock().remove(&lock_path);
        }
    }

    fn remembered(&self, sha: &str) -> Option<Component> {
        let mut guard = self.memory.lock();
        let (map, clock) = &mut *guard;
        *clock += 1;
        let entry = map.get_mut(sha)?;
        entry.used = *clock;
        Some(entry.component.clone())
    }

    fn remember(&self, sha: &str, component: &Component) {
        let range = component.image_range();
        let bytes = (range.end as usize).saturating_sub(range.start as usize);
        let mut guard = self.memory.lock();
        let (map, clock) = &mut *guard;
        *clock += 1;
        map.insert(sha.to_string(), Cached { component: component.clone(), bytes, used: *clock });
        while map.len() > MEMORY_ENTRIES || map.values().map(|c| c.bytes).sum::<usize>() > MEMORY_BYTES {
            let Some(oldest) = map.iter().min_by_key(|(_, c)| c.used).map(|(k, _)| k.clone()) else { break };
            if oldest == sha && map.len() == 1 {
                break;
            }
            map.remove(&oldest);
        }
    }
}

/// Opens (creating) a compile lock file, for writing: some systems lock only
/// files open for writing.
fn open_lock(path: &Path) -> std::io::Result<std::fs::File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::File::options().create(true).truncate(false).write(true).open(path)
}

/// Whether `file` is the file now at `path` (not one unlinked since it was opened).
fn same_file(file: &std::fs::File, path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (file.metadata(), std::fs::metadata(path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (file, path);
        path.exists()
    }
}

fn compatibility_hash(engine: &Engine) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    h.finish()
}

/// Compiles within `timeout`: in a child process when one is configured (and
/// its output loads here), else on a thread that is abandoned at the budget.
/// Returns the component and its serialized form (for the disk cache).
/// `budget` is the whole compile budget; `timeout` what is left of it (less
/// after waiting for another compile of the same bytes).
fn build(
    engine: &Engine,
    bytes: &[u8],
    label: &str,
    budget: Duration,
    timeout: Duration,
) -> Result<(Component, Vec<u8>)> {
    let over = || {
        let spent = if timeout < budget {
            format!(
                "the {:.1} s left of the compile budget of {} s (policy.compile_timeout_ms), after {:.1} s spent \
                 waiting for another compile of the same component that ended without storing it",
                timeout.as_secs_f64(),
                budget.as_secs_f64(),
                (budget - timeout).as_secs_f64()
            )
        } else {
            format!("the compile budget of {} s (policy.compile_timeout_ms)", budget.as_secs_f64())
        };
        anyhow::anyhow!("{label}: compiling took longer than {spent}; the plugin is refused")
    };
    if let Some(exe) = COMPILER_EXE.get() {
        match precompile_in_child(exe, bytes, label, timeout) {
            Ok(Some(out)) => match deserialize(engine, &out) {
                Ok(c) => return Ok((c, out)),
                // The binary was replaced on disk since this process started.
                Err(e) => {
                    tracing::warn!(plugin = label, error = %format!("{e:#}"), "the compiler process's output does not load here; compiling in process")
                }
            },
            Ok(None) => return Err(over()),
            Err(e) if e.is::<Spawn>() => {
                tracing::warn!(plugin = label, error = %format!("{e:#}"), "compiling in process instead");
            }
            Err(e) => return Err(e),
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let (cloned, input) = (engine.clone(), bytes.to_vec());
    std::thread::Builder::new().name("poolgate-compile".into()).spawn(move || {
        let _ = tx.send(cloned.precompile_component(&input).map_err(anyhow::Error::from));
    })?;
    let out = match rx.recv_timeout(timeout) {
        Ok(r) => r.with_context(|| format!("{label} is not a valid WebAssembly component"))?,
        Err(_) => return Err(over()),
    };
    let c = deserialize(engine, &out).with_context(|| format!("{label}: the compiled code could not be loaded"))?;
    Ok((c, out))
}

fn deserialize(engine: &Engine, serialized: &[u8]) -> Result<Component> {
    // SAFETY: the bytes come from this binary's own compiler (the child is this
    // executable, built with the same engine configuration) or from this
    // process; wasmtime checks the header and the engine's compatibility.
    unsafe { Component::deserialize(engine, serialized) }.map_err(anyhow::Error::from)
}

/// A cached compiled component, if one exists and its checksum holds. A hit
/// refreshes the file's time, which is what eviction goes by.
fn load_cached(engine: &Engine, path: &Path) -> Option<Component> {
    let data = std::fs::read(path).ok()?;
    if data.len() < 32 {
        return None;
    }
    let (body, sum) = data.split_at(data.len() - 32);
    if Sha256::digest(body).as_slice() != sum {
        tracing::warn!(path = %path.display(), "compiled-plugin cache entry is corrupt; recompiling");
        let _ = std::fs::remove_file(path);
        return None;
    }
    if let Ok(f) = std::fs::File::options().append(true).open(path) {
        let _ = f.set_modified(crate::clock::system_time());
    }
    // SAFETY: the bytes are a serialization this process family wrote (the file
    // name carries the engine's compatibility hash) and the checksum above
    // proves they are intact; wasmtime further checks the header.
    unsafe { Component::deserialize(engine, body) }.ok()
}

/// Writes `serialized` to `path` with a trailing SHA-256, atomically.
fn store_cached(serialized: &[u8], path: &Path) -> Result<()> {
    let dir = path.parent().context("cache path has a directory")?;
    std::fs::create_dir_all(dir)?;
    let sum = Sha256::digest(serialized);
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(serialized)?;
        f.write_all(&sum)?;
    }
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Removes the least recently used `.cwasm` files of `dir` until it holds at
/// most `max_bytes`.
fn evict_disk(dir: &Path, max_bytes: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut files: Vec<(SystemTime, u64, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some((m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len(), e.path()))
        })
        .collect();
    let mut total: u64 = files.iter().map(|f| f.1).sum();
    if total <= max_bytes {
        return;
    }
    files.sort();
    for (_, len, path) in files {
        if total <= max_bytes {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            tracing::info!(path = %path.display(), "compiled-plugin cache over its bound; removed the oldest entry");
            total -= len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_disk_cache_drops_its_oldest_entries_past_the_bound() {
        let dir = std::env::temp_dir().join(format!("poolgate-evict-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            let p = dir.join(format!("{name}.cwasm"));
            std::fs::write(&p, vec![0u8; 1000]).unwrap();
            let f = std::fs::File::options().append(true).open(&p).unwrap();
            f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(1000 + i as u64)).unwrap();
        }
        std::fs::write(dir.join("other.txt"), vec![0u8; 5000]).unwrap();
        evict_disk(&dir, 2500);
        let left: Vec<bool> = ["a", "b", "c"].iter().map(|n| dir.join(format!("{n}.cwasm")).exists()).collect();
        assert_eq!(left, [false, true, true]);
        assert!(dir.join("other.txt").exists(), "only cache entries are touched");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
