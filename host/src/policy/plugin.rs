//! One configured plugin: its compiled component, its limits, and its pool of
//! warm instances — and the two calls a request makes into it.
//!
//! Loading compiles the component (off the async workers), checks it against
//! what the host provides, and configures one instance on the builder thread,
//! so that a plugin refusing its options refuses the configuration. The rest of
//! the pool is filled in the background and refilled whenever an instance is
//! thrown away (see [`super::pool`]).

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use tokio::sync::Notify;
use wasmtime::component::ComponentExportIndex;

use super::bindings::{Account, AccountInfo, Outcome, PolicyPre, QuotaWindow, Ranking, Request};
use super::breaker::{BreakerConfig, Phase};
use super::engine::{PolicyEngine, check_component};
use super::events::{StageEvents, wall_ms};
use super::fault::Fault;
use super::instance::{Budget, Instance};
use super::pool::{InstancePool, backoff};
use super::sandbox::{Sandbox, SandboxSpec};
use super::state::StateStore;
use super::stdio::LogBudget;
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
    /// CPU budget of one `rank` or `observe` call (and how long a call waits
    /// for a free instance).
    pub deadline: Duration,
    /// Memory cap per instance, all its memories and tables together.
    pub memory_bytes: usize,
    /// CPU budget of instantiation plus `configure` (language runtimes start
    /// slowly).
    pub configure_deadline: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            deadline: Duration::from_millis(super::DEFAULT_DEADLINE_MS),
            memory_bytes: super::DEFAULT_MEMORY_MB << 20,
            configure_deadline: Duration::from_millis(super::DEFAULT_CONFIGURE_MS),
        }
    }
}

impl Limits {
    /// The bounds of a `rank` or `observe` call: the deadline as CPU budget, and
    /// a wall-clock bound four times as long (at least 20 ms more) for a guest
    /// that waits or is starved.
    pub fn call_budget(&self) -> Budget {
        Budget { cpu: self.deadline, wall: (self.deadline * 4).max(self.deadline + Duration::from_millis(20)) }
    }

    /// The bounds of building an instance: the configure deadline as CPU
    /// budget, twice that as wall-clock bound.
    pub fn configure_budget(&self) -> Budget {
        Budget { cpu: self.configure_deadline, wall: self.configure_deadline * 2 }
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
    /// Warm instances kept (at least one).
    pub max_idle: usize,
}

/// What every instance of a plugin is built from.
struct Shared {
    label: Arc<str>,
    sha256: String,
    spec: PluginSpec,
    pre: PolicyPre<Sandbox>,
    rank_export: ComponentExportIndex,
    sandbox: SandboxSpec,
    pool_info: Vec<AccountInfo>,
    instances: InstancePool,
    events: Arc<StageEvents>,
}

impl Shared {
    async fn build(&self) -> Result<Instance, Fault> {
        let budget = self.spec.limits.configure_budget();
        Instance::create(
            &self.pre,
            self.rank_export,
            self.sandbox.clone(),
            &self.spec.config_json,
            &self.pool_info,
            budget,
        )
        .await
    }
}

/// A loaded, configured plugin, ready to rank.
pub struct Plugin {
    shared: Arc<Shared>,
    wake: Arc<Notify>,
}

impl Plugin {
    /// Compiles (or takes from cache), checks, links and configures the plugin. The
    /// error says why a plugin is refused: over a size or compile limit, not a
    /// component, wrong world or version, an import the host lacks, or
    /// `configure` failing or rejecting its options.
    pub async fn load(
        engine: &Arc<PolicyEngine>,
        spec: PluginSpec,
        pool: Vec<AccountInfo>,
        state: Arc<dyn StateStore>,
    ) -> Result<Self> {
        let events = StageEvents::new(&spec.plugin.to_string(), BreakerConfig::default());
        Self::load_with(engine, spec, pool, state, events).await
    }

    /// As [`Plugin::load`], reporting to a stage's `events`.
    pub async fn load_with(
        engine: &Arc<PolicyEngine>,
        spec: PluginSpec,
        pool: Vec<AccountInfo>,
        state: Arc<dyn StateStore>,
        events: Arc<StageEvents>,
    ) -> Result<Self> {
        let label = spec.plugin.to_string();
        let bytes = spec.plugin.read()?;
        let (component, sha256) = engine.compile_async(bytes, label.clone()).await?;
        let instance_pre = check_component(engine, &component).with_context(|| format!("{label} is refused"))?;
        let pre = PolicyPre::new(instance_pre)
            .map_err(anyhow::Error::from)
            .with_context(|| format!("{label} does not export the policy world"))?;
        let rank_export = rank_export(&component).with_context(|| format!("{label} exports no `rank`"))?;
        let label: Arc<str> = Arc::from(label.as_str());
        let sandbox = SandboxSpec {
            plugin: label.clone(),
            scope: Arc::from(spec.scope.as_str()),
            state,
            memory_bytes: spec.limits.memory_bytes,
            logs: Arc::new(LogBudget::default()),
        };
        let shared = Arc::new(Shared {
            label,
            sha256,
            instances: InstancePool::new(spec.max_idle),
            spec,
            pre,
            rank_export,
            sandbox,
            pool_info: pool,
            events,
        });
        // Configure one instance now: a bad option must refuse the chain at load,
        // not fail the first request.
        let first = {
            let shared = shared.clone();
            engine.builder().run(async move { shared.build().await }).await?
        };
        let first = first.map_err(|f| anyhow!("{}: {}", shared.label, f.message))?;
        shared.instances.adopt(first);
        let wake = shared.instances.wake_signal();
        engine.builder().spawn(refill(Arc::downgrade(&shared), wake.clone()));
        wake.notify_one();
        Ok(Plugin { shared, wake })
    }

    /// The plugin's label (`builtin:headroom`, or its path).
    pub fn label(&self) -> &str {
        &self.shared.label
    }

    /// SHA-256 of the component bytes.
    pub fn sha256(&self) -> &str {
        &self.shared.sha256
    }

    /// The state scope.
    pub fn scope(&self) -> &str {
        &self.shared.spec.scope
    }

    /// The spec it was loaded from.
    pub fn spec(&self) -> &PluginSpec {
        &self.shared.spec
    }

    /// The stage health record it reports to.
    pub fn events(&self) -> &Arc<StageEvents> {
        &self.shared.events
    }

    /// Asks the plugin to order `candidates`. Only the shape of the answer is
    /// checked here; the chain validates it against the input.
    pub async fn rank(&self, req: &Request, candidates: &[Account], windows: &[QuotaWindow]) -> Result<Ranking, Fault> {
        let budget = self.shared.spec.limits.call_budget();
        let mut lease = Lease::take(&self.shared.instances, budget.cpu).await?;
        let answer = lease.instance().rank(req, candidates, windows, budget).await;
        lease.finish(answer.is_ok());
        answer
    }

    /// Tells the plugin how a request ended on pool account `account`.
    pub async fn observe(&self, req: &Request, account: u32, outcome: &Outcome) -> Result<(), Fault> {
        let budget = self.shared.spec.limits.call_budget();
        let mut lease = Lease::take(&self.shared.instances, budget.cpu).await?;
        let done = lease.instance().observe(req, account, outcome, budget).await;
        lease.finish(done.is_ok());
        done
    }

    /// Idle instances currently pooled.
    pub fn idle_instances(&self) -> usize {
        self.shared.instances.idle()
    }

    /// Instances alive or being built.
    pub fn live_instances(&self) -> usize {
        self.shared.instances.live()
    }

    /// Bytes held by the idle instances.
    pub fn idle_memory_bytes(&self) -> usize {
        self.shared.instances.idle_memory_bytes()
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        // The builder holds only a weak reference; wake it so that it sees the
        // plugin is gone and ends.
        self.wake.notify_one();
    }
}

/// An instance out of the pool for one call. If the call's future is dropped
/// before it settles (the request went away mid-call), the instance — in an
/// unknown state — is discarded, never reused.
struct Lease<'a> {
    pool: &'a InstancePool,
    instance: Option<Instance>,
}

impl<'a> Lease<'a> {
    async fn take(pool: &'a InstancePool, wait: Duration) -> Result<Lease<'a>, Fault> {
        Ok(Lease { pool, instance: Some(pool.take(wait).await?) })
    }

    fn instance(&mut self) -> &mut Instance {
        self.instance.as_mut().expect("a lease holds its instance until it finishes")
    }

    /// Gives the instance back after a good call, or discards it after a bad one.
    fn finish(mut self, ok: bool) {
        let instance = self.instance.take().expect("a lease finishes once");
        if ok {
            self.pool.give_back(instance);
        } else {
            self.pool.discard(instance);
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(i) = self.instance.take() {
            self.pool.discard(i);
        }
    }
}

/// Keeps `shared`'s pool at its target for as long as the plugin lives: builds
/// an instance whenever one is missing, and backs off after failures, which are
/// reported to the stage like any other.
async fn refill(shared: Weak<Shared>, wake: Arc<Notify>) {
    let mut delay: Option<Duration> = None;
    loop {
        let Some(s) = shared.upgrade() else { return };
        if s.instances.reserve() {
            match s.build().await {
                Ok(instance) => {
                    s.instances.built(instance);
                    s.events.succeeded(Phase::Configure, wall_ms(), None);
                    delay = None;
                }
                Err(fault) => {
                    s.instances.build_failed(&fault);
                    s.events.failed(Phase::Configure, &fault, wall_ms(), None);
                    let wait = backoff(delay);
                    delay = Some(wait);
                    drop(s);
                    tokio::time::sleep(wait).await;
                }
            }
            continue;
        }
        drop(s);
        wake.notified().await;
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

// A chain is shared by every request task.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Plugin>();
};
