//! One configured plugin: its compiled component, its limits, and its pool of
//! warm instances — and the two calls a request makes into it.
//!
//! Loading compiles the component (off the async workers), checks it against
//! what the host provides, and configures one instance on the builder thread,
//! so that a plugin refusing its options refuses the configuration. The rest of
//! the pool is filled in the background and refilled whenever an instance is
//! thrown away, and grown under demand (see [`super::pool`]).
//!
//! The refill builds on the engine's builder thread, as many instances at once
//! as the pool is short of, each bounded by the configure budget and, on top of
//! that, by a hard cap of its own ([`BUILD_SLACK`] past the budget's hard
//! cap) that no pattern of waiting inside `configure` can extend. A build
//! that fails or runs out is a failure of the stage's `configure` phase like
//! any other: counted, shown in `/status` and the metrics with its cause, and
//! held against the breaker. The builds hold only what building needs (the
//! `Recipe`), never the plugin itself, and are aborted when the plugin is
//! dropped — a swap never waits for, nor keeps alive, a build that hangs.

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use sha2::Digest;
use tokio::sync::Notify;
use wasmtime::component::ComponentExportIndex;

use super::bindings::{Account, AccountInfo, Outcome, PolicyPre, QuotaWindow, Ranking, Request};
use super::bounded::Spent;
use super::breaker::{BreakerConfig, Phase};
use super::engine::{PolicyEngine, check_component};
use super::events::{StageEvents, wall_ms};
use super::fault::{Cause, Fault};
use super::instance::{Budget, Instance};
use super::pool::{InstancePool, PoolStatus, Wait, backoff};
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

    /// The state scope of a stage that names none: `builtin:<name>` for a
    /// built-in, `file:<absolute path>` for a component file.
    ///
    /// Distinct plugins get distinct scopes — a third-party `affinity.wasm`
    /// never reads or evicts `builtin:affinity`'s bindings, nor does one
    /// `ranker.wasm` another directory's — while a new build replacing the file
    /// at the same path keeps the state its predecessor left (a hot swap keeps
    /// affinity bindings). The path is made absolute but not canonical: a
    /// deployment that re-points a symlink (`current.wasm → v2.wasm`) keeps its
    /// state too. Stages that should share state set the same `scope`.
    pub fn default_scope(&self) -> String {
        match self {
            PluginRef::Builtin(name) => format!("builtin:{name}"),
            PluginRef::Path(p) => {
                let absolute = std::path::absolute(p).unwrap_or_else(|_| p.clone());
                format!("file:{}", absolute.display())
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// CPU budget of one `rank` or `observe` call (and how long a call waits
    /// for a free instance).
    pub deadline: Duration,
    /// Memory cap per instance, all its memories and tables together.
    pub memory_bytes: usize,
    /// CPU budget of instantiation plus `configure` (language runtimes start
    /// slowly).
    pub configure_deadline: Duration,
    /// Not a limit but what the plugin is told: how old a quota reading may be
    /// and still count as fresh (`host.freshness-ms`; `[policy] freshness_ms`
    /// or the stage's own).
    pub freshness_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            deadline: Duration::from_millis(super::DEFAULT_DEADLINE_MS),
            memory_bytes: super::DEFAULT_MEMORY_MB << 20,
            configure_deadline: Duration::from_millis(super::DEFAULT_CONFIGURE_MS),
            freshness_ms: crate::account::DEFAULT_FRESHNESS_MS,
        }
    }
}

impl Limits {
    /// The bounds of a `rank` or `observe` call: the deadline as CPU budget
    /// (fuel), and on the wall clock the deadline plus its slack for the
    /// plugin's own time — running and waiting summed — with a hard cap of four
    /// times that (see [`super::bounded`]).
    pub fn call_budget(&self) -> Budget {
        Budget::for_deadline(self.deadline)
    }

    /// The bounds of building an instance (instantiation and `configure`
    /// together): the configure deadline as fuel, the same own-time
    /// arithmetic, and a hard cap of twice the deadline plus 2 s.
    pub fn configure_budget(&self) -> Budget {
        Budget::for_configure(self.configure_deadline)
    }
}

/// What it takes to load one stage's plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// The most instances alive at once under demand (at least `max_idle`;
    /// see [`super::pool`]).
    pub max_instances: usize,
}

/// How far past its hard cap a build may run before the refill
/// gives up on it, whatever the call's own bounds do.
pub const BUILD_SLACK: Duration = Duration::from_secs(1);

/// What building one instance takes, shared by the plugin and its builds (a
/// build holds this, not the plugin).
struct Recipe {
    pre: PolicyPre<Sandbox>,
    rank_export: ComponentExportIndex,
    sandbox: SandboxSpec,
    config_json: String,
    pool_info: Vec<AccountInfo>,
    budget: Budget,
}

impl Recipe {
    /// Builds one instance, cut at the budget's hard cap plus
    /// [`BUILD_SLACK`] whatever happens inside (the bounds inside the build
    /// cut it first; this holds if they do not).
    async fn build(&self) -> Result<Instance, Fault> {
        let cap = self.budget.wall.cap + BUILD_SLACK;
        let build = Instance::create(
            &self.pre,
            self.rank_export,
            self.sandbox.clone(),
            &self.config_json,
            &self.pool_info,
            self.budget,
        );
        match tokio::time::timeout(cap, build).await {
            Ok(built) => built,
            Err(_) => Err(Fault::new(
                Cause::Timeout,
                format!(
                    "building an instance (instantiate and configure) ran for {} ms: its hard cap (twice \
                     `configure_timeout_ms`, plus 2 s) and {} ms more: cut",
                    cap.as_millis(),
                    BUILD_SLACK.as_millis()
                ),
            )),
        }
    }
}

/// What every instance of a plugin is built from.
struct Shared {
    label: Arc<str>,
    sha256: String,
    spec: PluginSpec,
    /// The bounds of each `rank` and `observe` call, worked out once.
    call_budget: Budget,
    recipe: Arc<Recipe>,
    instances: InstancePool,
    events: Arc<StageEvents>,
}

/// A loaded, configured plugin, ready to rank.
pub struct Plugin {
    shared: Arc<Shared>,
    /// Dropped after `shared` (fields drop in order): the refill task sees
    /// the plugin gone only once it can no longer reach it.
    _alive: tokio::sync::oneshot::Sender<()>,
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
        let bytes = Self::read(&spec.plugin).await?;
        Self::load_with(engine, spec, bytes, pool, state, events).await
    }

    /// Reads a plugin's bytes and their SHA-256, off the async workers (a
    /// Python component is 18 MiB).
    pub async fn read(plugin: &PluginRef) -> Result<(Vec<u8>, String)> {
        let plugin = plugin.clone();
        tokio::task::spawn_blocking(move || {
            let bytes = plugin.read()?;
            let sha256 = hex::encode(sha2::Sha256::digest(&bytes));
            Ok((bytes, sha256))
        })
        .await
        .context("the plugin read task failed")?
    }

    /// Whether this plugin is what loading `spec` from bytes hashing to
    /// `sha256` over `pool` would build — then a reload keeps it, warm
    /// instances, state and breaker included, instead of configuring it anew.
    pub fn is_built_from(&self, spec: &PluginSpec, sha256: &str, pool: &[AccountInfo]) -> bool {
        let same_pool = |a: &AccountInfo, b: &AccountInfo| (&a.id, &a.alias, a.primary) == (&b.id, &b.alias, b.primary);
        self.shared.spec == *spec
            && self.shared.sha256 == sha256
            && self.shared.recipe.pool_info.len() == pool.len()
            && self.shared.recipe.pool_info.iter().zip(pool).all(|(a, b)| same_pool(a, b))
    }

    /// As [`Plugin::load`], from bytes already read (see [`Plugin::read`]),
    /// reporting to a stage's `events`.
    pub async fn load_with(
        engine: &Arc<PolicyEngine>,
        spec: PluginSpec,
        (bytes, _): (Vec<u8>, String),
        pool: Vec<AccountInfo>,
        state: Arc<dyn StateStore>,
        events: Arc<StageEvents>,
    ) -> Result<Self> {
        let label = spec.plugin.to_string();
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
            freshness_ms: spec.limits.freshness_ms,
        };
        let recipe = Arc::new(Recipe {
            pre,
            rank_export,
            sandbox,
            config_json: spec.config_json.clone(),
            pool_info: pool,
            budget: spec.limits.configure_budget(),
        });
        let shared = Arc::new(Shared {
            label,
            sha256,
            instances: InstancePool::new(spec.max_idle, spec.max_instances, Some(engine.builder().handle().clone())),
            call_budget: spec.limits.call_budget(),
            spec,
            recipe,
            events,
        });
        // Configure one instance now: a bad option must refuse the chain at load,
        // not fail the first request.
        super::loading::phase(super::loading::LoadPhase::Configure);
        let first = {
            let recipe = shared.recipe.clone();
            engine.builder().run(async move { recipe.build().await }).await?
        };
        let first = first.map_err(|f| anyhow!("{}: {}", shared.label, f.message))?;
        shared.instances.adopt(first);
        let wake = shared.instances.wake_signal();
        let (alive, gone) = tokio::sync::oneshot::channel();
        let turns = engine.builder().refills();
        engine.builder().spawn(refill(Arc::downgrade(&shared), wake.clone(), turns, gone));
        wake.notify_one();
        Ok(Plugin { shared, _alive: alive })
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
        let budget = self.shared.call_budget;
        let mut lease = Lease::take(&self.shared.instances, Wait::Rank(budget.cpu)).await?;
        let mut spent = Spent::default();
        let answer = lease.instance().rank(req, candidates, windows, budget, &mut spent).await;
        self.shared.instances.record_call(Phase::Rank, spent.total, spent.own());
        self.note_cost(lease.instance(), budget);
        lease.finish(answer.is_ok());
        answer
    }

    /// Tells the plugin how a request ended on pool account `account`.
    pub async fn observe(&self, req: &Request, account: u32, outcome: &Outcome) -> Result<(), Fault> {
        let budget = self.shared.call_budget;
        // No client waits for it: it queues for an instance (within the
        // pool's bound) rather than being dropped when the pool is busy.
        let mut lease = Lease::take(&self.shared.instances, Wait::Observe).await?;
        let mut spent = Spent::default();
        let done = lease.instance().observe(req, account, outcome, budget, &mut spent).await;
        self.shared.instances.record_call(Phase::Observe, spent.total, spent.own());
        self.note_cost(lease.instance(), budget);
        lease.finish(done.is_ok());
        done
    }

    /// What the call `instance` just made cost, for the stage's high-water marks.
    fn note_cost(&self, instance: &Instance, budget: Budget) {
        self.shared.events.note_cost(instance.fuel_burned(budget), instance.memory_bytes());
    }

    /// Warm instances the pool keeps.
    pub fn target_instances(&self) -> usize {
        self.shared.instances.target()
    }

    /// How long calls hold an instance, on average.
    pub fn call_times(&self) -> super::pool::CallTimes {
        self.shared.instances.call_times()
    }

    /// The pool's size and queue (see [`super::pool`]).
    pub fn pool_status(&self) -> PoolStatus {
        self.shared.instances.status()
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

/// An instance out of the pool for one call. If the call's future is dropped
/// before it settles (the request went away mid-call), the instance — in an
/// unknown state — is discarded, never reused.
struct Lease<'a> {
    pool: &'a InstancePool,
    instance: Option<Instance>,
}

impl<'a> Lease<'a> {
    async fn take(pool: &'a InstancePool, wait: Wait) -> Result<Lease<'a>, Fault> {
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

/// Keeps `shared`'s pool at its size for as long as the plugin lives: builds
/// an instance whenever one is missing or calls wait that no running build
/// will serve (several at once, up to the pool's bound), trims what a burst
/// left once it is over, and backs off after failures, which are reported to
/// the stage like any other. Each build waits for one of the engine's
/// background `turns` first. It holds the plugin only between builds; the
/// builds hold the [`Recipe`], and are aborted (the `JoinSet` dropped) once
/// the plugin is gone (`gone`).
async fn refill(
    shared: Weak<Shared>,
    wake: Arc<Notify>,
    turns: Arc<tokio::sync::Semaphore>,
    mut gone: tokio::sync::oneshot::Receiver<()>,
) {
    let mut builds = tokio::task::JoinSet::new();
    let mut delay: Option<Duration> = None;
    let mut retry_at: Option<tokio::time::Instant> = None;
    loop {
        let trimming = {
            let Some(s) = shared.upgrade() else { return };
            if retry_at.is_some_and(|t| tokio::time::Instant::now() >= t) {
                retry_at = None;
            }
            while retry_at.is_none() && s.instances.reserve() {
                let (recipe, turns) = (s.recipe.clone(), turns.clone());
                builds.spawn(async move {
                    let _turn = turns.acquire_owned().await;
                    let started = crate::clock::machine_instant();
                    (recipe.build().await, started.elapsed())
                });
            }
            s.instances.trim();
            s.instances.above_keep()
        };
        let retry = async move {
            match retry_at {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        let trim = async move {
            match trimming {
                true => tokio::time::sleep(super::pool::TRIM_AFTER / 4).await,
                false => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut gone => return,
            () = wake.notified() => {}
            () = retry => {}
            () = trim => {}
            Some(done) = builds.join_next() => {
                let Some(s) = shared.upgrade() else { return };
                match done {
                    Ok((Ok(instance), took)) => {
                        s.instances.built(instance, took);
                        s.events.succeeded(Phase::Configure, wall_ms(), None);
                        delay = None;
                    }
                    Ok((Err(fault), _)) => failed(&s, &fault, &mut delay, &mut retry_at),
                    Err(e) => {
                        let fault = Fault::new(Cause::Host, format!("the instance build task failed: {e}"));
                        failed(&s, &fault, &mut delay, &mut retry_at);
                    }
                }
            }
        }
    }
}

/// A build failed: counted against the stage, and no new build starts until
/// the back-off has passed.
fn failed(s: &Shared, fault: &Fault, delay: &mut Option<Duration>, retry_at: &mut Option<tokio::time::Instant>) {
    s.instances.build_failed(fault);
    s.events.failed(Phase::Configure, fault, wall_ms(), None);
    let wait = backoff(*delay);
    *delay = Some(wait);
    *retry_at = Some(tokio::time::Instant::now() + wait);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_of_distinct_plugins_are_distinct_and_a_path_keeps_its_own() {
        let builtin = PluginRef::parse("builtin:affinity").default_scope();
        let file = PluginRef::parse("/srv/plugins/affinity.wasm").default_scope();
        let elsewhere = PluginRef::parse("/opt/other/affinity.wasm").default_scope();
        assert_eq!(builtin, "builtin:affinity");
        assert_eq!(file, "file:/srv/plugins/affinity.wasm");
        assert_ne!(file, elsewhere, "same stem, different plugins");
        // A new build at the same path: the same scope, so its state is kept.
        assert_eq!(PluginRef::parse("/srv/plugins/affinity.wasm").default_scope(), file);
        // A relative path is made absolute, so it names one file wherever it runs.
        let relative = PluginRef::parse("affinity.wasm").default_scope();
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(relative, format!("file:{}", cwd.join("affinity.wasm").display()));
    }
}
