//! The one wasmtime [`Engine`] of the process, its linker, the thread that builds
//! plugin instances, and the compiler.
//!
//! Calls into plugins are asynchronous (see [`super::bounded`]), and two clocks
//! drive them:
//!
//! - **Fuel is the CPU budget** of a call — the deadline in ms times
//!   [`FUEL_PER_MS`] — counted by the guest's own instructions, so a budget
//!   measures what the plugin did, not how long the scheduler kept its thread
//!   waiting, and it fires however saturated the machine is.
//! - **The epoch makes a call yield**: a ticker thread advances the engine's
//!   epoch every millisecond while calls run, and a guest yields to the executor
//!   at the next tick. A guest spending its time in host calls (which burn no
//!   fuel: a loop of `log` or WASI calls) therefore still yields every
//!   millisecond, the call's wall-clock bound is checked each time, and the
//!   worker thread it runs on serves other requests in between. Should the
//!   ticker be starved of CPU, fuel still yields every [`YIELD_FUEL`].
//!
//! Instances are instantiated and configured on a thread of their own — never
//! on the threads that serve requests — so a plugin whose `configure` is slow
//! never stalls a request or `/healthz` (see [`super::pool`]). Calls start on
//! the request's thread and move to threads of their own once they have to
//! wait (see [`super::calls`]).

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use wasmtime::component::{Component, InstancePre, Linker};
use wasmtime::{Config, Engine};

use super::bindings::Policy;
use super::calls::{AbortOnDrop, CallThreads};
use super::compile::{CompileLimits, Compiler};
use super::sandbox::Sandbox;

/// Fuel (≈ WebAssembly operators) per millisecond of a call's budget. Measured
/// on the example rankers (docs/benchmarks.md, "The CPU budget is fuel"): on the
/// 2-core machine CI runs on, the Python ranker executes 7.7 million operators
/// per millisecond and the JavaScript one 12 million, so a 25 ms deadline is
/// about 25 ms of a plugin's own work there — somewhat more on a slower machine
/// — however busy the machine is.
pub const FUEL_PER_MS: u64 = 10_000_000;
/// A guest yields to the executor after this much fuel (about 0.1 ms of work):
/// rare enough that yielding costs nothing measurable (a JavaScript ranker over
/// 64 accounts yields ~25 times per call), often enough that a guest computing
/// for its whole budget never holds a worker thread for long.
pub const YIELD_FUEL: u64 = 1_000_000;

/// The process-wide plugin engine.
pub struct PolicyEngine {
    engine: Engine,
    linker: Linker<Sandbox>,
    compiler: Compiler,
    builder: Builder,
    calls: Arc<CallThreads>,
    builtins_ready: AtomicBool,
}

/// The wasmtime configuration every plugin is compiled and run with (the
/// compiler child process builds the same one, so its output loads here).
pub fn wasmtime_config() -> Config {
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .consume_fuel(true)
        .epoch_interruption(true)
        // Component-model async is for guests that export async functions;
        // rankers are synchronous functions called on a fiber, which needs none.
        .concurrency_support(false)
        .cranelift_opt_level(wasmtime::OptLevel::Speed)
        .max_wasm_stack(1 << 20)
        .async_stack_size(2 << 20);
    config
}

/// The plain engine (no linker, no builder), for the compiler child process.
pub fn bare_engine() -> Result<Engine> {
    Engine::new(&wasmtime_config()).map_err(anyhow::Error::from)
}

impl PolicyEngine {
    /// Builds the engine. `cache_dir` holds compiled components; `None` disables
    /// the disk cache.
    pub fn new(cache_dir: Option<PathBuf>) -> Result<Arc<Self>> {
        let engine = bare_engine()?;
        spawn_ticker(&engine);
        let mut linker = Linker::<Sandbox>::new(&engine);
        // WASI 0.2.12's `exit-with-code` is linked too: a guest whose runtime
        // reports its code through it has the code recorded. (`exit` carries
        // only success or failure: Rust's std reports any nonzero code as 1.)
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(anyhow::Error::from)?;
        Policy::add_to_linker::<_, wasmtime::component::HasSelf<_>>(&mut linker, |s| s).map_err(anyhow::Error::from)?;
        Ok(Arc::new(PolicyEngine {
            engine,
            linker,
            compiler: Compiler::new(cache_dir),
            builder: Builder::start()?,
            calls: Arc::new(CallThreads::start()?),
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

    /// The thread instances are built on.
    pub fn builder(&self) -> &Builder {
        &self.builder
    }

    /// Where plugin calls that have to wait run (see [`super::calls`]).
    pub fn calls(&self) -> &Arc<CallThreads> {
        &self.calls
    }

    /// Replaces the compile limits (size, budget, cache bound).
    pub fn set_compile_limits(&self, limits: CompileLimits) {
        self.compiler.set_limits(limits);
    }

    /// Changes each time a compile ends that a load refused with
    /// [`crate::policy::compile::StillCompiling`] had joined: the moment to retry it.
    pub fn finished_joins(&self) -> tokio::sync::watch::Receiver<u64> {
        self.compiler.finished_joins()
    }

    /// Compiles `bytes` (or takes them from a cache). `label` names the plugin in
    /// errors. Blocks; see [`PolicyEngine::compile_async`].
    pub fn compile(&self, bytes: &[u8], label: &str) -> Result<(Component, String)> {
        self.compiler.compile(&self.engine, bytes, label)
    }

    /// How many compiles this engine has run (not served from a cache); see
    /// [`Compiler::compiles_run`].
    pub fn compiles_run(&self) -> u64 {
        self.compiler.compiles_run()
    }

    /// [`PolicyEngine::compile`] on tokio's blocking pool, so that a compile of
    /// seconds never occupies an async worker.
    pub async fn compile_async(self: &Arc<Self>, bytes: Vec<u8>, label: String) -> Result<(Component, String)> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.compile(&bytes, &label)).await.context("the compile task failed")?
    }

    /// Compiles every built-in on a background thread, so that a swap to one
    /// is a cache lookup rather than a compile: a first compile on two busy
    /// cores can take longer than the second a reload is allowed. Startup does
    /// not wait for it; [`PolicyEngine::builtins_ready`] says when it is done.
    /// With a warm disk cache this is a few milliseconds of deserializing.
    pub fn warm_builtins(self: &Arc<Self>) {
        let engine = Arc::downgrade(self);
        let spawned = std::thread::Builder::new().name("poolgate-warm".into()).spawn(move || {
            let started = crate::clock::machine_instant();
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
}

/// Background builds (the pools' refills) running at once, engine-wide; more
/// wait their turn. Builds interleave on one thread, and a build's hard cap
/// counts the time others run: two CPU-heavy `configure`s share the thread
/// within their cap (see [`super::bounded::Limit::for_configure`]), a burst's
/// dozens would each run out of it.
pub const REFILL_BUILDS: usize = 2;

/// Two threads, each with a single-threaded tokio runtime, where plugin
/// instances are created, configured and torn down — never a request's worker.
/// Building is asynchronous (bounded by fuel and a wall clock), so a thread
/// interleaves builds. The pools' refills and teardowns run on one, at most
/// [`REFILL_BUILDS`] builds at once; a start or reload builds a stage's first
/// instance on the other, alone, so that its bound never counts a refill's
/// time. Both stop when the engine is dropped.
pub struct Builder {
    background: tokio::runtime::Handle,
    loads: tokio::runtime::Handle,
    refills: Arc<tokio::sync::Semaphore>,
    _stop: [tokio::sync::oneshot::Sender<()>; 2],
}

impl Builder {
    fn start() -> Result<Builder> {
        let (background, stop_background) = Self::thread("poolgate-plugins")?;
        let (loads, stop_loads) = Self::thread("poolgate-loads")?;
        let refills = Arc::new(tokio::sync::Semaphore::new(REFILL_BUILDS));
        Ok(Builder { background, loads, refills, _stop: [stop_background, stop_loads] })
    }

    /// A thread running a current-thread runtime until the sender is dropped.
    fn thread(name: &str) -> Result<(tokio::runtime::Handle, tokio::sync::oneshot::Sender<()>)> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new().name(name.into()).spawn(move || {
            runtime.block_on(async {
                let _ = stopped.await;
            });
        })?;
        Ok((handle, stop))
    }

    /// The background thread's runtime: where pools are refilled and
    /// instances torn down.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.background
    }

    /// Runs `task` on the background thread.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.background.spawn(task);
    }

    /// The engine-wide turns of background builds: a refill build holds one
    /// while it runs ([`REFILL_BUILDS`]).
    pub fn refills(&self) -> Arc<tokio::sync::Semaphore> {
        self.refills.clone()
    }

    /// Runs `task` on the load thread and waits for its result. Dropping
    /// the wait aborts the task (a start or reload that gives up leaves no
    /// build running there, nor the instance it was making).
    pub async fn run<T: Send + 'static>(&self, task: impl Future<Output = T> + Send + 'static) -> Result<T> {
        let mut task = AbortOnDrop(self.loads.spawn(task));
        (&mut task.0).await.context("the plugin load thread failed")
    }
}

/// How often the epoch advances while a plugin call runs: how long a guest may
/// go without yielding, host calls included.
pub const EPOCH_TICK: Duration = Duration::from_millis(1);
/// How often it advances while none runs: an idle gateway does not wake a
/// thread a thousand times a second. A call that starts during an idle spell
/// gets its first tick at most this late.
pub const IDLE_TICK: Duration = Duration::from_millis(10);

/// Plugin calls running now; the ticker slows down when there are none.
static ACTIVE_CALLS: AtomicUsize = AtomicUsize::new(0);

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

/// A measurement aid, not a setting: a tick in ms (1–1000) instead of
/// [`EPOCH_TICK`]. Under valgrind (`bench/instructions.sh`) code runs some 50
/// times slower, and a 1 ms tick makes most calls of a microsecond plugin
/// yield — a path a native run almost never takes — so the count would
/// measure valgrind, not the request path. Only how often a running guest
/// yields changes; every budget (fuel, the wall clock) is as configured.
pub const TICK_ENV: &str = "POOLGATE_EPOCH_TICK_MS";

/// The tick: [`EPOCH_TICK`], or what [`TICK_ENV`] says (logged).
fn epoch_tick() -> Duration {
    let Some(ms) = std::env::var(TICK_ENV).ok().and_then(|v| v.trim().parse::<u64>().ok()) else {
        return EPOCH_TICK;
    };
    let ms = ms.clamp(1, 1000);
    tracing::warn!("{TICK_ENV} is set: plugin calls yield every {ms} ms instead of 1 (a measurement aid)");
    Duration::from_millis(ms)
}

/// Advances the epoch for as long as the engine lives.
fn spawn_ticker(engine: &Engine) {
    let weak = engine.weak();
    let tick = epoch_tick();
    let idle = tick.max(IDLE_TICK);
    let spawned = std::thread::Builder::new().name("poolgate-epoch".into()).spawn(move || {
        while let Some(engine) = weak.upgrade() {
            engine.increment_epoch();
            drop(engine);
            let busy = ACTIVE_CALLS.load(Ordering::Acquire) > 0;
            #[allow(clippy::disallowed_methods, reason = "the ticker is a thread of its own: sleeping is its job")]
            std::thread::sleep(if busy { tick } else { idle });
        }
    });
    if let Err(e) = spawned {
        // Fuel still yields and still enforces the budget; calls that wait in
        // host calls are then bounded only when they yield on fuel.
        tracing::error!(error = %e, "cannot start the epoch ticker; plugin calls yield on fuel only");
    }
}

/// The WIT package this host implements, and the version track it accepts.
pub const WIT_PACKAGE: &str = "poolgate:policy";
/// The exact version of `wit/policy.wit` this host was built from.
pub const WIT_VERSION: &str = "0.1.1";
/// Accepted track: every `0.1.x`.
pub const WIT_TRACK: (u64, u64) = (0, 1);

/// Checks that `component` targets a policy world this host speaks and imports
/// nothing the host does not provide — each import checked against what the
/// linker actually holds, so a 0.1.x component calling a host function this
/// host lacks is refused here, naming it — and links it. The error names what
/// is wrong.
pub fn check_component(engine: &PolicyEngine, component: &Component) -> Result<InstancePre<Sandbox>> {
    let ty = component.component_type();
    let exports: Vec<String> = ty.exports(engine.engine()).map(|(n, _)| n.to_string()).collect();
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
    for (name, _) in ty.imports(engine.engine()) {
        if !import_granted(name) {
            bail!("it imports `{name}`, which poolgate does not provide to plugins");
        }
    }
    engine.linker().instantiate_pre(component).map_err(|e| {
        let why = format!("{:#}", anyhow::Error::from(e));
        anyhow::anyhow!("one of its imports is not what this host provides ({WIT_PACKAGE}@{WIT_VERSION}): {why}")
    })
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

/// The fuel of a budget of `d`.
pub fn fuel(d: Duration) -> u64 {
    (d.as_micros() as u64).saturating_mul(FUEL_PER_MS) / 1000
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
