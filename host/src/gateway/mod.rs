//! The gateway: an Anthropic Messages proxy that sends each request to the account
//! the policy chain ranks first, learns quota from every answer, cools accounts
//! down by cause, fails over before the first byte, and explains every decision.
//!
//! What the gateway learns about accounts lives below it, in
//! `crate::learned`; this module routes and serves. Three layers, top down:
//!
//! - [`http`]: the HTTP surface — the listener and its staged shutdown
//!   ([`http::server`]), what one connection may hold ([`http::conn`]), the
//!   routes ([`http::routes`]), systemd's readiness ([`http::sd_notify`]).
//!   Nothing below imports it.
//! - [`request`]: one client request end to end, as named phases in the
//!   order they run — read ([`request::read`]), rank, admit
//!   ([`request::admission`]), attempt and learn ([`request::attempt`],
//!   through [`request::upstream`]'s `Transport`), commit and relay
//!   ([`request::relay`], [`request::body`]), or answer when no account can
//!   ([`request::unserved`], [`request::fallback`], [`request::errors`]), and
//!   finish ([`request::finish`]), which keeps the record
//!   ([`request::record`]). **The chain is called in `request::Exchange::rank`.**
//! - Beside them, what a running gateway holds across requests:
//!   [`generation`] (one loaded configuration, swapped atomically; its
//!   client keys and admin token are [`auth`]'s; [`keys`] adds those
//!   managed at run time), [`reload`]
//!   (a new generation built beside the running one; a newer reload
//!   supersedes one still loading), [`watch`] (what triggers one), [`change`]
//!   (what it changed, in words), [`lifecycle`] (the shutdown as requests see
//!   it), [`admin`] (operators acting on accounts at run time), [`persist`]
//!   (learned state kept across a restart), [`seat_keeper`] (the task that
//!   keeps subscription seats' tokens fresh).

pub mod admin;
pub mod auth;
pub mod change;
pub mod generation;
pub mod http;
pub mod keys;
pub mod lifecycle;
pub mod memory;
pub mod persist;
pub mod reload;
pub mod request;
pub mod seat_keeper;
pub mod sessions;
pub mod watch;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Result;
use arc_swap::ArcSwap;
use parking_lot::Mutex;

use crate::clock::Clock;
use crate::config::Config;
use crate::learned::AccountBook;
use crate::learned::accounts::AccountState;
use crate::metrics::Metrics;
use crate::policy::{MemoryState, PolicyEngine, StateStore};
pub use generation::Generation;
pub use reload::{ReloadError, ReloadStatus};

/// The first request id of a gateway started `since_epoch` after the Unix
/// epoch: its start time in microseconds. Ids then go up by one per request,
/// so a restarted gateway's ids are all new as long as the run before it
/// handed out fewer ids than microseconds passed between the two starts —
/// under one request per microsecond (1 M/s) on average, far above what one
/// gateway serves — and the clock did not step back across the restart. The
/// ids stay below 2^53 (exact as a JSON number in any parser) until the year
/// 2255. Replicas running at once each count from their own start: pair the id
/// with the replica to tell their requests apart.
pub fn first_request_id(since_epoch: Duration) -> u64 {
    (since_epoch.as_micros() as u64).max(1)
}

/// The pooled HTTP client requests go upstream through.
fn pooled_client(config: &Config) -> Result<Arc<request::upstream::Upstream>> {
    Ok(Arc::new(request::upstream::Upstream::new(Duration::from_millis(config.gateway.connect_timeout_ms))?))
}

/// The tracing `[telemetry]` (and the `OTEL_*` environment) asks for.
fn start_telemetry(config: &Config, metrics: &Arc<Metrics>) -> Result<Option<Arc<crate::telemetry::Telemetry>>> {
    let settings = crate::config::telemetry::settings(&config.telemetry, &|k| std::env::var(k).ok())
        .map_err(|(key, why)| anyhow::anyhow!("{key}: {why}"))?;
    let Some(settings) = settings else { return Ok(None) };
    // An endpoint may carry a user and password: never shown.
    let (raw, shown) = (settings.endpoint.clone(), crate::config::redact_url(&settings.endpoint));
    for note in &settings.notes {
        tracing::warn!("{note}");
    }
    tracing::info!(
        endpoint = %shown,
        protocol = ?settings.protocol,
        ratio = settings.sampler.ratio,
        "tracing requests to an OTLP endpoint"
    );
    crate::telemetry::Telemetry::start(settings, metrics.clone())
        .map(Some)
        .map_err(|e| anyhow::anyhow!("{}", format!("{e:#}").replace(&raw, &shown)))
}

/// The usage ledger `[ledger]` asks for: its database reached (or its file
/// opened and created) now, so a start that cannot keep usage refuses to
/// start, naming the setting.
fn open_ledger(
    config: &Config,
    meters: &Arc<crate::ledger::limits::Meters>,
    clock: &Clock,
) -> Result<Option<Arc<crate::ledger::Ledger>>> {
    let Some(store) =
        crate::ledger::open(config.ledger.url.as_deref(), config.ledger.file_path.as_deref(), config.ledger.setting())?
    else {
        return Ok(None);
    };
    let tuning = crate::ledger::Tuning {
        flush: Duration::from_millis(config.ledger.flush_ms),
        queue_max: config.ledger.queue_max,
    };
    Ok(Some(crate::ledger::Ledger::start(store, tuning, meters.clone(), clock.clone())))
}

/// What a gateway is assembled from besides its configuration.
struct Parts {
    plugin_state: Arc<dyn StateStore>,
    http: Arc<dyn request::upstream::Transport>,
    metrics: Arc<Metrics>,
    shared: Arc<dyn crate::shared::StateBackend>,
    clock: Clock,
    /// Whether requests may be traced (`[telemetry]`): a serving gateway's
    /// are; a test's or the simulator's, on time of their own, never are —
    /// a production config replayed must not send made-up traces.
    traced: bool,
}

/// Everything the gateway shares across requests.
pub struct Gateway {
    current: ArcSwap<Generation>,
    /// Learned account state, by account id; outlives generations.
    pub book: Arc<AccountBook>,
    /// Plugin state, shared by every generation (affinity survives a swap).
    pub plugin_state: Arc<dyn StateStore>,
    /// The plugin engine.
    pub engine: Arc<PolicyEngine>,
    /// The admission queue.
    pub admission: Arc<request::admission::Admission>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The last decision records.
    pub decisions: request::record::DecisionLog,
    /// What sends requests to accounts: the pooled HTTP client
    /// ([`request::upstream::Upstream`]), or a scripted one in tests.
    pub http: Arc<dyn request::upstream::Transport>,
    /// The next request id: seeded from the start time ([`first_request_id`]).
    next_request: AtomicU64,
    /// The last reload's outcome.
    pub last_reload: Mutex<Option<ReloadStatus>>,
    /// The last [`reload::HISTORY`] reloads' outcomes, oldest first.
    pub reload_history: Mutex<std::collections::VecDeque<ReloadStatus>>,
    /// The reloads: which is newest, how the last one ended.
    reloads: reload::Reloads,
    /// When the gateway started.
    pub started_ms: u64,
    /// Where learned state is shared with other replicas (the embedded
    /// backend shares nothing): `crate::shared`.
    pub shared: Arc<dyn crate::shared::StateBackend>,
    /// The address the listener is bound to (set once it is): a reload cannot
    /// move it, so reloads are judged against it.
    pub listening: std::sync::OnceLock<std::net::SocketAddr>,
    /// Draining, streams cut at the end of the grace period, connections open.
    pub lifecycle: Arc<lifecycle::Lifecycle>,
    /// The state file, when there is one (`[state] file`).
    pub persist: Option<Arc<persist::Persist>>,
    /// The operators' actions on accounts, for `/status`.
    pub admin: admin::AdminLog,
    /// The web page's one-time sign-in tickets and the sessions they opened.
    pub sessions: sessions::Sessions,
    /// What every part of the gateway reads the time from.
    pub clock: Clock,
    /// The usage ledger (`[ledger]`), when there is one.
    pub ledger: Option<Arc<crate::ledger::Ledger>>,
    /// Each client key's meter: in flight, the last minute, what it spent
    /// this day, week and month (kept across reloads; seeded from the
    /// ledger at start).
    pub meters: Arc<crate::ledger::limits::Meters>,
    /// The client keys managed at run time (read from the ledger's store).
    pub runtime_keys: ArcSwap<keys::RuntimeKeys>,
    /// This process's name in ledger entries (`[state] replica`, else host
    /// and process id): with the request id, unique across replicas.
    pub replica: Arc<str>,
    /// Traces to an OpenTelemetry backend (`[telemetry]`), when on.
    pub telemetry: Option<Arc<crate::telemetry::Telemetry>>,
}

impl Gateway {
    /// Builds the serving gateway and its first generation from `config`.
    pub async fn new(config: Config, engine: Arc<PolicyEngine>) -> Result<Arc<Gateway>> {
        let metrics = Arc::new(Metrics::default());
        let local = Arc::new(MemoryState::with_limits(config.state_limits()));
        if !config.state.shared() {
            let (http, shared, clock) = (pooled_client(&config)?, Arc::new(crate::shared::Embedded), Clock::system());
            let parts = Parts { plugin_state: local, http, metrics, shared, clock, traced: true };
            return Self::assemble(config, engine, parts).await;
        }
        // Replicas: the same in-process store, whose writes are also shared.
        let clock = Clock::system();
        let outbox = Arc::new(crate::shared::plugin::Outbox::default());
        let plugin = Arc::new(crate::shared::plugin::SharedPluginState::new(local, outbox.clone(), clock.clone()));
        let backend =
            crate::shared::redis::Redis::new(&config.state, plugin.clone(), outbox, metrics.clone(), clock.clone())?;
        let http = pooled_client(&config)?;
        let parts = Parts { plugin_state: plugin, http, metrics, shared: Arc::new(backend), clock, traced: true };
        Self::assemble(config, engine, parts).await
    }

    /// A gateway sending upstream through `http` and reading the time from
    /// `clock`: a gateway in a test or the policy simulator, on time the
    /// caller moves. It never traces requests.
    pub async fn with_transport_and_clock(
        config: Config,
        engine: Arc<PolicyEngine>,
        plugin_state: Arc<dyn StateStore>,
        http: Arc<dyn request::upstream::Transport>,
        clock: Clock,
    ) -> Result<Arc<Gateway>> {
        let metrics = Arc::new(Metrics::default());
        let shared = Arc::new(crate::shared::Embedded);
        let parts = Parts { plugin_state, http, metrics, shared, clock, traced: false };
        Self::assemble(config, engine, parts).await
    }

    async fn assemble(config: Config, engine: Arc<PolicyEngine>, parts: Parts) -> Result<Arc<Gateway>> {
        let Parts { plugin_state, http, metrics, shared, clock, traced } = parts;
        let book = Arc::new(AccountBook::default());
        engine.set_compile_limits(config.compile_limits());
        let around = generation::Around {
            engine: &engine,
            plugin_state: &plugin_state,
            book: &book,
            metrics: &metrics,
            clock: &clock,
            http: &http,
        };
        let first = Generation::build_bounded(1, config, &around, None).await?;
        plugin_state.retain_scopes(&first.chain.scopes());
        let decisions = request::record::DecisionLog::new(first.config.server.decisions_kept);
        let state = &first.config.state;
        let persist = state
            .file_path
            .clone()
            .map(|p| Arc::new(persist::Persist::new(p, Duration::from_millis(state.file_write_ms))));
        let meters = Arc::default();
        let ledger = open_ledger(&first.config, &meters, &clock)?;
        let replica: Arc<str> =
            first.config.state.replica.clone().unwrap_or_else(crate::shared::redis::replica_name).into();
        let telemetry = if traced { start_telemetry(&first.config, &metrics)? } else { None };
        let gateway = Arc::new(Gateway {
            current: ArcSwap::from_pointee(first),
            book,
            plugin_state,
            engine,
            admission: request::admission::Admission::with_backend(shared.clone()),
            metrics,
            decisions,
            http,
            next_request: AtomicU64::new(first_request_id(clock.since_epoch())),
            last_reload: Mutex::new(None),
            reload_history: Mutex::default(),
            reloads: reload::Reloads::default(),
            started_ms: clock.now_ms(),
            shared: shared.clone(),
            listening: std::sync::OnceLock::new(),
            lifecycle: Arc::default(),
            persist,
            admin: admin::AdminLog::default(),
            sessions: sessions::Sessions::default(),
            clock,
            ledger,
            replica,
            meters,
            runtime_keys: ArcSwap::default(),
            telemetry,
        });
        // What each key spent this day, week and month before this start:
        // a budget holds across a restart (and one a reload adds later
        // counts it too).
        let setting = gateway.generation().config.ledger.setting();
        if let Some(l) = &gateway.ledger {
            l.read_totals().await.map_err(|e| anyhow::anyhow!("{setting}: {e:#}"))?;
        }
        if gateway.ledger.is_some() {
            keys::refresh(&gateway).await.map_err(|e| anyhow::anyhow!("{setting}: {e:#}"))?;
            keys::spawn_refresh(Arc::downgrade(&gateway));
        }
        gateway.share_seats(&gateway.generation());
        // What this gateway learned before a restart, before it serves and
        // before replicas merge their records into it.
        if let Some(p) = &gateway.persist {
            p.restore(&gateway).await;
            p.clone().spawn(Arc::downgrade(&gateway));
        }
        shared.start(Arc::downgrade(&gateway.book));
        Ok(gateway)
    }

    /// Lets the seats of `generation` share their refreshes with other
    /// replicas, when the backend shares.
    fn share_seats(&self, generation: &Generation) {
        let Some(share) = self.shared.clone().credentials() else { return };
        for a in &generation.accounts {
            if let Some(seat) = a.target.oauth_seat() {
                seat.share_with(share.clone());
            }
        }
    }

    /// The learned state of account `id`, if this replica has one.
    pub fn account_state(&self, id: &str) -> Option<Arc<AccountState>> {
        self.book.get(id)
    }

    /// The generation in force (requests hold on to the one they started with).
    pub fn generation(&self) -> Arc<Generation> {
        self.current.load_full()
    }

    /// Writes the state file now if anything changed (at shutdown, after the
    /// last request); nothing without one.
    pub async fn save_state(&self) {
        if let Some(p) = &self.persist {
            p.save(self, true).await;
        }
    }

    /// Writes the state file in the background, now rather than at the next
    /// check (after an operator's action).
    pub fn save_state_soon(self: &Arc<Self>) {
        let Some(p) = self.persist.clone() else { return };
        let gw = self.clone();
        tokio::spawn(async move { p.save(&gw, false).await });
    }

    /// Exports the traces still queued, waiting at most `within` (at
    /// shutdown, after the last request).
    pub async fn close_telemetry(&self, within: Duration) {
        if let Some(t) = &self.telemetry {
            t.close(within).await;
        }
    }

    /// Writes what the ledger holds and stops its writer (at shutdown, after
    /// the last request).
    pub fn close_ledger(&self) {
        if let Some(l) = &self.ledger {
            l.stop();
        }
    }

    /// A new request id, unique across restarts ([`first_request_id`]).
    pub fn next_request_id(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }
}
