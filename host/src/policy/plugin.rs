//! One configured plugin: its compiled component, its sandbox limits, and a pool of
//! ready instances.
//!
//! Instances are reused across calls (instantiating costs ~15 µs for a Rust guest
//! and milliseconds for Python or JavaScript; a call on a warm instance costs a few
//! µs) and thrown away after any trap, because a trapped instance cannot be entered
//! again. The pool holds at most one idle instance per worker thread; a call that
//! finds none idle builds a fresh one rather than waiting.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use parking_lot::Mutex;
use wasmtime::Store;

use wasmtime::component::{ComponentExportIndex, Func, TypedFunc};

use super::bindings::{Account, AccountInfo, Outcome, Policy, PolicyPre, QuotaWindow, Ranking, Request};
use super::engine::{CallGuard, EPOCH_TICK, PolicyEngine, check_component};
use super::fault::{Cause, Fault};
use super::lowering::{FastAccount, FastWindow, fast_accounts, fast_windows};
use super::sandbox::Sandbox;
use super::state::StateStore;
use crate::artifacts::BUILTINS;

/// Where a plugin comes from: `builtin:<name>` or a path to a `.wasm` component.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PluginRef {
    /// One of the plugins embedded in the binary.
    Builtin(String),
    /// A component file.
    Path(PathBuf),
}

impl PluginRef {
    /// Parses the `plugin` value of a chain stage.
    pub fn parse(s: &str) -> Self {
        match s.strip_prefix("builtin:") {
            Some(name) => PluginRef::Builtin(name.to_string()),
            None => PluginRef::Path(PathBuf::from(s)),
        }
    }

    /// The name used for the state scope when the stage names none: the built-in's
    /// name, or the file stem (so `ranker-v2.wasm` replacing `ranker-v2.wasm` keeps
    /// its state).
    pub fn default_scope(&self) -> String {
        match self {
            PluginRef::Builtin(name) => name.clone(),
            PluginRef::Path(p) => {
                p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| p.display().to_string())
            }
        }
    }

    /// Reads the component's bytes.
    pub fn read(&self) -> Result<Vec<u8>> {
        match self {
            PluginRef::Builtin(name) => {
                BUILTINS.iter().find(|(n, _)| n == name).map(|(_, b)| b.to_vec()).ok_or_else(|| {
                    anyhow!("unknown built-in `builtin:{name}`; built-ins are: {}", builtin_names().join(", "))
                })
            }
            PluginRef::Path(p) => std::fs::read(p).with_context(|| format!("cannot read plugin file {}", p.display())),
        }
    }
}

impl std::fmt::Display for PluginRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PluginRef::Builtin(n) => write!(f, "builtin:{n}"),
            PluginRef::Path(p) => write!(f, "{}", p.display()),
        }
    }
}

/// The names of the built-in plugins, as `builtin:<name>`.
pub fn builtin_names() -> Vec<String> {
    BUILTINS.iter().map(|(n, _)| format!("builtin:{n}")).collect()
}

/// The sandbox limits of one stage.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Deadline of one `rank` or `observe` call.
    pub deadline: Duration,
    /// Linear-memory cap per instance.
    pub memory_bytes: usize,
    /// Deadline of instantiation plus `configure` (language runtimes start slowly).
    pub configure_deadline: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            deadline: Duration::from_millis(super::DEFAULT_DEADLINE_MS),
            memory_bytes: super::DEFAULT_MEMORY_MB << 20,
            configure_deadline: Duration::from_secs(5),
        }
    }
}

/// What it takes to load one stage's plugin.
#[derive(Debug, Clone)]
pub struct PluginSpec {
    /// Where the component comes from.
    pub plugin: PluginRef,
    /// The stage's options as JSON (`{}` when none).
    pub config_json: String,
    /// The state scope.
    pub scope: String,
    /// Sandbox limits.
    pub limits: Limits,
    /// Idle instances kept for reuse.
    pub max_idle: usize,
}

struct Instance {
    store: Store<Sandbox>,
    policy: Policy,
    /// `rank`, type-checked against the bulk-lowering parameter types once.
    rank: Func,
}

/// The parameters `rank` is called with (see `lowering`).
type RankParams<'a> = (&'a Request, &'a [FastAccount], &'a [FastWindow]);
type RankResults = (Result<Ranking, String>,);

/// A loaded, configured plugin, ready to rank.
pub struct Plugin {
    label: Arc<str>,
    sha256: String,
    pre: PolicyPre<Sandbox>,
    rank_export: ComponentExportIndex,
    engine: wasmtime::Engine,
    spec: PluginSpec,
    pool: Vec<AccountInfo>,
    scope: Arc<str>,
    state: Arc<dyn StateStore>,
    idle: Mutex<Vec<Instance>>,
}

fn ticks(d: Duration) -> u64 {
    (d.as_micros().div_ceil(EPOCH_TICK.as_micros())) as u64 + 1
}

impl Plugin {
    /// Compiles (or takes from cache), checks, links and configures the plugin. The
    /// error says why a plugin is refused: not a component, wrong world or version,
    /// a forbidden import, or `configure` rejecting its options.
    pub fn load(
        engine: &PolicyEngine,
        spec: PluginSpec,
        pool: Vec<AccountInfo>,
        state: Arc<dyn StateStore>,
    ) -> Result<Self> {
        let label = spec.plugin.to_string();
        let bytes = spec.plugin.read()?;
        let (component, sha256) = engine.compile(&bytes, &label)?;
        check_component(engine.engine(), &component).with_context(|| format!("{label} is refused"))?;
        let instance_pre = engine
            .linker()
            .instantiate_pre(&component)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("{label} cannot be linked"))?;
        let pre = PolicyPre::new(instance_pre)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("{label} does not export the policy world"))?;
        let rank_export = rank_export(&component).with_context(|| format!("{label} exports no `rank`"))?;
        let plugin = Plugin {
            label: Arc::from(label.as_str()),
            sha256,
            pre,
            rank_export,
            engine: engine.engine().clone(),
            scope: Arc::from(spec.scope.as_str()),
            spec,
            pool,
            state,
            idle: Mutex::new(Vec::new()),
        };
        // Configure one instance now: a bad option must refuse the chain at load,
        // not fail the first request.
        let first = plugin.instantiate().map_err(|f| anyhow!("{label}: {}", f.message))?;
        plugin.idle.lock().push(first);
        Ok(plugin)
    }

    /// The plugin's label (`builtin:headroom`, or its path).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// SHA-256 of the component bytes.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The state scope.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The spec it was loaded from.
    pub fn spec(&self) -> &PluginSpec {
        &self.spec
    }

    fn instantiate(&self) -> Result<Instance, Fault> {
        let sandbox =
            Sandbox::new(self.label.clone(), self.scope.clone(), self.state.clone(), self.spec.limits.memory_bytes);
        let mut store = Store::new(&self.engine, sandbox);
        store.limiter(|s| &mut s.limiter);
        let _running = CallGuard::enter();
        store.set_epoch_deadline(ticks(self.spec.limits.configure_deadline));
        let instantiated = (|| {
            let instance = self.pre.instance_pre().instantiate(&mut store)?;
            let policy = Policy::new(&mut store, &instance)?;
            let rank = instance
                .get_func(&mut store, self.rank_export)
                .ok_or_else(|| wasmtime::format_err!("no `rank` export"))?;
            // Type-check once; calls then skip the check (see `rank`).
            rank.typed::<RankParams<'_>, RankResults>(&store)?;
            wasmtime::Result::Ok((policy, rank))
        })();
        let (policy, rank) =
            instantiated.map_err(|e| Fault::new(Cause::Error, format!("instantiation failed: {}", first_line(&e))))?;
        let denied = |s: &Store<Sandbox>| s.data().limiter.denied;
        match policy.poolgate_policy_ranker().call_configure(&mut store, &self.spec.config_json, &self.pool) {
            Ok(Ok(())) => {}
            Ok(Err(msg)) => return Err(Fault::new(Cause::Error, format!("configure refused its options: {msg}"))),
            Err(e) => {
                let f = Fault::from_call_error(&e, denied(&store));
                return Err(Fault::new(f.cause, format!("configure failed: {}", f.message)));
            }
        }
        store.data_mut().flush_stdio();
        Ok(Instance { store, policy, rank })
    }

    fn checkout(&self) -> Result<Instance, Fault> {
        if let Some(i) = self.idle.lock().pop() {
            return Ok(i);
        }
        self.instantiate()
    }

    fn checkin(&self, instance: Instance) {
        let mut idle = self.idle.lock();
        if idle.len() < self.spec.max_idle {
            idle.push(instance);
        }
    }

    /// Runs `f` on an instance under the call deadline. A trap (including a
    /// deadline or memory trap) discards the instance.
    fn call<T>(&self, req: &Request, f: impl FnOnce(&mut Instance) -> wasmtime::Result<T>) -> Result<T, Fault> {
        let mut inst = self.checkout()?;
        let _running = CallGuard::enter();
        inst.store.data_mut().begin_call(req.id, req.now_ms);
        inst.store.set_epoch_deadline(ticks(self.spec.limits.deadline));
        let result = f(&mut inst);
        inst.store.data_mut().flush_stdio();
        match result {
            Ok(v) => {
                self.checkin(inst);
                Ok(v)
            }
            Err(e) => Err(Fault::from_call_error(&e, inst.store.data().limiter.denied)),
        }
    }

    /// Asks the plugin to order `candidates`. Only the shape of the answer is
    /// checked here; the chain validates it against the input.
    pub fn rank(&self, req: &Request, candidates: &[Account], windows: &[QuotaWindow]) -> Result<Ranking, Fault> {
        self.call(req, |i| {
            // SAFETY: `rank` was type-checked against exactly these types when
            // the instance was created.
            let typed = unsafe { TypedFunc::<RankParams<'_>, RankResults>::new_unchecked(i.rank) };
            typed.call(&mut i.store, (req, fast_accounts(candidates), fast_windows(windows))).map(|(r,)| r)
        })?
        .map_err(|msg| Fault::new(Cause::Error, truncate(msg, 300)))
    }

    /// Reports an outcome. Failures are logged, never propagated: observing must not
    /// affect a request that has already been served.
    pub fn observe(&self, req: &Request, account: u32, outcome: &Outcome) -> Result<(), Fault> {
        self.call(req, |i| i.policy.poolgate_policy_ranker().call_observe(&mut i.store, req, account, *outcome))
    }

    /// Idle instances currently pooled.
    pub fn idle_instances(&self) -> usize {
        self.idle.lock().len()
    }
}

/// The index of `rank` inside the component's ranker export.
fn rank_export(component: &wasmtime::component::Component) -> Result<ComponentExportIndex> {
    let engine = component.engine();
    let iface = component
        .component_type()
        .exports(engine)
        .map(|(name, _)| name.to_string())
        .find(|n| n.starts_with("poolgate:policy/ranker@"))
        .ok_or_else(|| anyhow!("no ranker export"))?;
    let iface = component.get_export_index(None, &iface).ok_or_else(|| anyhow!("no ranker export"))?;
    component.get_export_index(Some(&iface), "rank").ok_or_else(|| anyhow!("no rank function"))
}

fn first_line(e: &wasmtime::Error) -> String {
    format!("{e:#}").lines().next().unwrap_or("").to_string()
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

// A chain is shared by every request task.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Plugin>();
};
