//! The one wasmtime [`Engine`] of the process, its linker, the epoch ticker that
//! enforces deadlines, and the compiled-component cache.
//!
//! Compiling a component is the expensive step (0.1 s for a Rust plugin, 15–30 s for
//! a Python or JavaScript one), so it happens at load or reload, never on the
//! request path, and its result is cached twice: in memory by content hash (a
//! reload of an unchanged plugin costs nothing) and on disk by content hash plus the
//! engine's compatibility hash (a restart costs a deserialize, not a compile).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine};

use super::bindings::Policy;
use super::sandbox::Sandbox;

/// How often the epoch advances; deadlines are whole ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// In-memory compiled components kept before the map is cleared.
const MEMORY_CACHE_ENTRIES: usize = 64;

/// The process-wide plugin engine.
pub struct PolicyEngine {
    engine: Engine,
    linker: Linker<Sandbox>,
    cache_dir: Option<PathBuf>,
    compiled: Mutex<HashMap<String, Component>>,
    builtins_ready: AtomicBool,
}

impl PolicyEngine {
    /// Builds the engine. `cache_dir` holds compiled components; `None` disables
    /// the disk cache.
    pub fn new(cache_dir: Option<PathBuf>) -> Result<Arc<Self>> {
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .epoch_interruption(true)
            // Synchronous rankers need no component-model async; leaving it off
            // makes every call cheaper.
            .concurrency_support(false)
            .cranelift_opt_level(wasmtime::OptLevel::Speed)
            .max_wasm_stack(1 << 20);
        let engine = Engine::new(&config).map_err(anyhow::Error::from)?;
        let mut linker = Linker::<Sandbox>::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(anyhow::Error::from)?;
        Policy::add_to_linker::<_, wasmtime::component::HasSelf<_>>(&mut linker, |s| s).map_err(anyhow::Error::from)?;
        spawn_ticker(&engine);
        Ok(Arc::new(PolicyEngine {
            engine,
            linker,
            cache_dir,
            compiled: Mutex::new(HashMap::new()),
            builtins_ready: AtomicBool::new(false),
        }))
    }

    /// The default disk cache: `$XDG_CACHE_HOME/poolgate/components` (or the
    /// platform's cache directory).
    pub fn default_cache_dir() -> Option<PathBuf> {
        dirs::cache_dir().map(|d| d.join("poolgate").join("components"))
    }

    /// The wasmtime engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The linker holding WASI and the poolgate host interface.
    pub fn linker(&self) -> &Linker<Sandbox> {
        &self.linker
    }

    /// Compiles every built-in on a background thread, so that a swap to one
    /// is a cache lookup rather than a compile: a first compile on two busy
    /// cores can take longer than the second a reload is allowed. Startup does
    /// not wait for it; [`PolicyEngine::builtins_ready`] says when it is done.
    /// With a warm disk cache this is a few milliseconds of deserializing.
    pub fn warm_builtins(self: &Arc<Self>) {
        let engine = Arc::downgrade(self);
        let spawned = std::thread::Builder::new().name("poolgate-warm".into()).spawn(move || {
            let started = Instant::now();
            for (name, bytes) in crate::artifacts::BUILTINS {
                let Some(e) = engine.upgrade() else { return };
                if let Err(err) = e.compile(bytes, &format!("builtin:{name}")) {
                    tracing::warn!(plugin = name, error = %format!("{err:#}"), "could not compile a built-in");
                }
            }
            if let Some(e) = engine.upgrade() {
                e.builtins_ready.store(true, Ordering::Release);
                tracing::debug!(elapsed_ms = started.elapsed().as_millis() as u64, "built-in plugins compiled");
            }
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "could not start compiling the built-ins in the background");
        }
    }

    /// Whether every built-in is compiled and in memory.
    pub fn builtins_ready(&self) -> bool {
        self.builtins_ready.load(Ordering::Acquire)
    }

    /// Compiles `bytes` (or takes them from a cache). `label` names the plugin in
    /// errors.
    pub fn compile(&self, bytes: &[u8], label: &str) -> Result<(Component, String)> {
        let sha = hex::encode(Sha256::digest(bytes));
        if let Some(c) = self.compiled.lock().get(&sha) {
            return Ok((c.clone(), sha));
        }
        let key = format!("{sha}-{:016x}", self.compatibility_hash());
        let cached = self.cache_dir.as_ref().map(|d| d.join(format!("{key}.cwasm")));
        let component = match cached.as_deref().and_then(|p| self.load_cached(p)) {
            Some(c) => c,
            None => {
                let started = std::time::Instant::now();
                let c = Component::new(&self.engine, bytes)
                    .map_err(anyhow::Error::from)
                    .with_context(|| format!("{label} is not a valid WebAssembly component"))?;
                tracing::info!(plugin = label, elapsed_ms = started.elapsed().as_millis() as u64, "compiled plugin");
                if let Some(path) = &cached
                    && let Err(e) = store_cached(&c, path)
                {
                    tracing::warn!(plugin = label, error = %e, "could not write the compiled-plugin cache");
                }
                c
            }
        };
        let mut map = self.compiled.lock();
        if map.len() >= MEMORY_CACHE_ENTRIES {
            map.clear();
        }
        map.insert(sha.clone(), component.clone());
        Ok((component, sha))
    }

    fn compatibility_hash(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.engine.precompile_compatibility_hash().hash(&mut h);
        h.finish()
    }

    /// A cached compiled component, if one exists and its checksum holds.
    fn load_cached(&self, path: &Path) -> Option<Component> {
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
        // SAFETY: the bytes are a serialization this process family wrote (the file
        // name carries the engine's compatibility hash) and the checksum above
        // proves they are intact; wasmtime further checks the header.
        unsafe { Component::deserialize(&self.engine, body) }.ok()
    }
}

/// Writes `component` to `path` with a trailing SHA-256, atomically.
fn store_cached(component: &Component, path: &Path) -> Result<()> {
    let dir = path.parent().context("cache path has a directory")?;
    std::fs::create_dir_all(dir)?;
    let mut body = component.serialize().map_err(anyhow::Error::from)?;
    let sum = Sha256::digest(&body);
    body.extend_from_slice(&sum);
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, &body)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Plugin calls running now; the ticker slows down when there are none.
static ACTIVE_CALLS: AtomicUsize = AtomicUsize::new(0);

/// How often the epoch advances while no plugin call is running. A call that
/// starts during an idle sleep gets its first tick up to this late, so a deadline
/// never fires early and at most this much late; in exchange an idle gateway
/// does not wake a thread a thousand times a second.
pub const IDLE_TICK: Duration = Duration::from_millis(10);

/// Marks a plugin call as running for as long as it lives.
pub struct CallGuard(());

impl CallGuard {
    /// Counts a call in.
    pub fn enter() -> CallGuard {
        ACTIVE_CALLS.fetch_add(1, Ordering::AcqRel);
        CallGuard(())
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        ACTIVE_CALLS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Advances the epoch for as long as the engine lives: every tick while a plugin
/// call runs, every idle tick otherwise.
fn spawn_ticker(engine: &Engine) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("poolgate-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                let busy = ACTIVE_CALLS.load(Ordering::Acquire) > 0;
                std::thread::sleep(if busy { EPOCH_TICK } else { IDLE_TICK });
            }
        })
        .expect("spawning the epoch thread");
}

/// The WIT package this host implements, and the version track it accepts.
pub const WIT_PACKAGE: &str = "poolgate:policy";
/// The exact version of `wit/policy.wit` this host was built from.
pub const WIT_VERSION: &str = "0.1.0";
/// Accepted track: every `0.1.x`.
pub const WIT_TRACK: (u64, u64) = (0, 1);

/// Checks that `component` targets a policy world this host speaks, and imports
/// nothing the host does not grant. The error names what is wrong.
pub fn check_component(engine: &Engine, component: &Component) -> Result<()> {
    let ty = component.component_type();
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
    let ranker = exports.iter().find(|n| n.starts_with("poolgate:policy/ranker"));
    let Some(ranker) = ranker else {
        bail!(
            "it is not a poolgate policy component: it exports [{}], not `{WIT_PACKAGE}/ranker@{}.{}.x`",
            exports.join(", "),
            WIT_TRACK.0,
            WIT_TRACK.1
        );
    };
    let version = ranker.split_once('@').map(|(_, v)| v).unwrap_or("");
    if !version_accepted(version) {
        bail!(
            "it targets {WIT_PACKAGE}@{version}, but this host speaks {WIT_PACKAGE}@{WIT_VERSION} and accepts \
             only {}.{}.x; rebuild the plugin against a {}.{}.x WIT (poolgate's wit/policy.wit)",
            WIT_TRACK.0,
            WIT_TRACK.1,
            WIT_TRACK.0,
            WIT_TRACK.1
        );
    }
    for (name, _) in ty.imports(engine) {
        if !import_granted(name) {
            bail!("it imports `{name}`, which poolgate does not provide to plugins");
        }
    }
    Ok(())
}

/// Whether a `poolgate:policy` version (`0.1.3`) is on the accepted track.
pub fn version_accepted(version: &str) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u64>().ok());
    matches!(
        (parts.next(), parts.next()),
        (Some(Some(major)), Some(Some(minor))) if (major, minor) == WIT_TRACK
    )
}

/// Whether the host links an import of this name for plugins: its own
/// interfaces on the accepted track, and the WASI 0.2 interfaces a language
/// runtime imports (linked with nothing granted).
pub fn import_granted(name: &str) -> bool {
    if let Some(rest) = name.strip_prefix("poolgate:policy/") {
        let version = rest.split_once('@').map(|(_, v)| v).unwrap_or("");
        return version_accepted(version);
    }
    // The WASI 0.2 interfaces a language runtime imports to start. They are linked
    // but grant nothing: no preopens, no environment, no sockets.
    const WASI: [&str; 6] =
        ["wasi:cli/", "wasi:io/", "wasi:clocks/", "wasi:random/", "wasi:filesystem/", "wasi:sockets/"];
    WASI.iter().any(|p| name.starts_with(p)) && name.contains("@0.2.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_the_0_1_track() {
        assert!(version_accepted("0.1.0"));
        assert!(version_accepted("0.1.7"));
        assert!(!version_accepted("0.2.0"));
        assert!(!version_accepted("1.1.0"));
        assert!(!version_accepted(""));
    }

    #[test]
    fn the_version_constant_matches_the_wit_file() {
        let wit = include_str!("../../../wit/policy.wit");
        assert!(wit.contains(&format!("package {WIT_PACKAGE}@{WIT_VERSION};")), "update WIT_VERSION");
        assert!(version_accepted(WIT_VERSION));
    }

    #[test]
    fn grants_wasi_p2_and_the_host_interface_only() {
        assert!(import_granted("poolgate:policy/host@0.1.0"));
        assert!(import_granted("wasi:cli/stderr@0.2.6"));
        assert!(!import_granted("poolgate:policy/host@0.2.0"));
        assert!(!import_granted("wasi:http/outgoing-handler@0.2.6"));
        assert!(!import_granted("wasi:cli/stderr@0.3.0"));
    }
}
