//! One generation: a configuration fully loaded — credentials read, chain compiled
//! and configured, account state attached — and never changed afterwards. A
//! reload builds the next generation beside it and swaps the pointer; requests in
//! flight finish on the generation they started with.
//!
//! Loading one is bounded phase by phase ([`LoadBounds`]), at start, in `check`
//! and on every reload alike: each stage's compile by the compile budget, its
//! `configure` by the configure budget, the smoke test by the stages' call
//! deadlines — each plus [`LOAD_SLACK`]. This is the outer bound: it holds
//! whatever a plugin does inside (the inner bounds of each call may be
//! defeated by a plugin that waits in many short pieces), and a load past it
//! is dropped — its build on the plugin builder thread aborted — and refused,
//! naming the stage and the phase.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};

use crate::clock::Clock;
use crate::config::headers::ForwardPolicy;
use crate::config::{AccountConfig, Config, Credential, OAuthConfig};
use crate::gateway::auth::{AdminToken, ClientKeys};
use crate::gateway::request::upstream::{Target, Transport};
use crate::learned::AccountBook;
use crate::learned::accounts::AccountState;
use crate::metrics::Metrics;
use crate::policy::loading::{self, LoadPhase, LoadWatch, Step};
use crate::policy::types::{self as wit, AccountInfo};
use crate::policy::view;
use crate::policy::{Candidates, Chain, Fault, Phase, PolicyEngine, StateStore};

/// An account of this generation's pool.
pub struct PoolAccount {
    /// Its index in the chain's pool table.
    pub index: u32,
    /// Its configuration.
    pub config: AccountConfig,
    /// Where its requests go, with its credential.
    pub target: Target,
    /// What the gateway has learned about it (shared across generations).
    pub state: Arc<AccountState>,
    /// Tried only after every usable account that is not (see
    /// `AccountConfig::overflow`).
    pub overflow: bool,
}

/// A loaded configuration.
pub struct Generation {
    /// Counts up from 1 with every successful load.
    pub number: u64,
    /// The configuration it was built from.
    pub config: Config,
    /// The policy chain.
    pub chain: Arc<Chain>,
    /// Enabled accounts, in pool order.
    pub accounts: Vec<PoolAccount>,
    /// Disabled accounts (shown in `/status`, never routed to).
    pub disabled: Vec<(AccountConfig, Arc<AccountState>)>,
    /// Accepted client keys.
    pub client_keys: ClientKeys,
    /// The admin token.
    pub admin: AdminToken,
    /// When it was loaded.
    pub loaded_ms: u64,
    /// `[[fallback]]` backends, for a populated pool that cannot serve.
    pub fallbacks: crate::gateway::request::fallback::Fallbacks,
    /// What tokens cost, by model (`[prices]` over the defaults).
    pub prices: crate::ledger::prices::Prices,
}

/// Where an account's requests go: with its static credential, or through
/// its OAuth seat (kept from the last generation when it is the same file).
fn target(
    base: &str,
    config: &AccountConfig,
    credential: &Credential,
    state: &AccountState,
    oauth: &OAuthConfig,
    forward: &Arc<ForwardPolicy>,
    http: &Arc<dyn Transport>,
) -> Result<Target> {
    match credential {
        Credential::Static(secret) => Target::new(base, config.kind, secret, forward.clone()),
        Credential::Seat { path, stored } => {
            let seat = state.seat_for(path, oauth, || {
                let carrier = Arc::new(super::seat_keeper::ViaTransport(http.clone()));
                let client = crate::oauth::TokenClient::with_carrier(oauth.clone(), carrier);
                crate::oauth::Seat::new(&config.id, path.clone(), stored, client)
            })?;
            Ok(Target::seat(base, seat, forward.clone()))
        }
    }
}

/// Who a credential belongs to, for sharing what is learned about it with
/// replicas that hold the same one: an API key by its fingerprint (a prefix
/// of its SHA-256, never the key); a seat by the organization its tokens
/// belong to now (`AccountState::identity`).
fn binding(credential: &Credential) -> Option<String> {
    match credential {
        Credential::Static(secret) => {
            Some(format!("key:{}", &hex::encode(crate::config::digest(secret.expose()))[..16]))
        }
        // A seat's identity follows its tokens (`AccountState::identity`).
        Credential::Seat { .. } => None,
    }
}

/// How far past its own bound one phase of a load may run before the load is
/// given up: what a busy machine adds between an inner bound firing and the
/// load noticing (scheduling, dropping a half-built instance).
pub const LOAD_SLACK: Duration = Duration::from_secs(2);

/// The outer bound of each phase of loading a generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadBounds {
    /// Reading and compiling one stage's plugin: `[policy] compile_timeout_ms`
    /// plus the slack.
    pub compile: Duration,
    /// Instantiating one stage's first instance and running its `configure`:
    /// the build's own hard cap (twice `[policy] configure_timeout_ms` plus
    /// 2 s; see [`crate::policy::bounded::Limit::for_configure`]) plus the slack.
    pub configure: Duration,
    /// The smoke test through the whole chain: per stage, a `rank` (waiting
    /// for an instance at most its deadline, then its hard cap) and an
    /// `observe` (queued at most the observe queue's wait, then its hard cap),
    /// plus the slack. A stage a reload keeps shares its live pool with
    /// traffic, so its smoke calls may queue.
    pub smoke: Duration,
}

impl LoadBounds {
    /// The bounds of loading `config`.
    pub fn of(config: &Config) -> Result<LoadBounds> {
        let specs = config.stage_specs()?;
        let configure = specs.iter().map(|s| s.plugin.limits.configure_budget().wall.cap).max().unwrap_or_default();
        let smoke: Duration = specs
            .iter()
            .map(|s| {
                let limits = &s.plugin.limits;
                limits.deadline + crate::policy::pool::OBSERVE_WAIT + limits.call_budget().wall.cap * 2
            })
            .sum();
        Ok(LoadBounds {
            compile: config.compile_limits().timeout + LOAD_SLACK,
            configure: configure + LOAD_SLACK,
            smoke: smoke + LOAD_SLACK,
        })
    }

    /// The bound of `phase`.
    pub fn of_phase(&self, phase: LoadPhase) -> Duration {
        match phase {
            // Nothing before the chain waits on a plugin.
            LoadPhase::Prepare => LOAD_SLACK,
            LoadPhase::Compile => self.compile,
            LoadPhase::Configure => self.configure,
            LoadPhase::Smoke => self.smoke,
        }
    }

    /// The longest a load of `stages` stages may take, every one compiled and
    /// configured anew.
    pub fn total(&self, stages: usize) -> Duration {
        LOAD_SLACK + (self.compile + self.configure) * stages as u32 + self.smoke
    }

    /// Why a load that is at `step` at `now` is given up; `None` while it is
    /// within the bound of its phase.
    pub fn overdue(&self, step: &Step, now: Instant) -> Option<String> {
        let bound = self.of_phase(step.phase);
        if now.saturating_duration_since(step.since) < bound {
            return None;
        }
        let slack = LOAD_SLACK.as_secs();
        let why = match step.phase {
            LoadPhase::Prepare => "preparing the accounts".to_string(),
            LoadPhase::Compile => format!("reading and compiling: [policy] compile_timeout_ms plus {slack} s of slack"),
            LoadPhase::Configure => format!(
                "instantiating and running `configure`: its hard cap, twice [policy] configure_timeout_ms plus 2 s, \
                 and {slack} s of slack"
            ),
            LoadPhase::Smoke => format!(
                "ranking and observing a test request: each stage's waits for an instance and hard caps, plus \
                 {slack} s of slack"
            ),
        };
        let place = match &step.stage {
            Some((i, name)) => format!("policy.chain[{i}] (`{name}`)"),
            None => "policy.chain".to_string(),
        };
        Some(format!(
            "{place}: {} did not finish within {:.1} s ({why}); the load was given up and its build dropped",
            step.phase.as_str(),
            bound.as_secs_f64(),
        ))
    }
}

/// Resolves, with the refusal, once the load `watch` follows overstays a phase.
/// The load's phases are real work (compiles, `configure`) timed on the
/// machine's clock, whatever clock the gateway runs on.
async fn overdue(watch: &LoadWatch, bounds: &LoadBounds) -> String {
    loop {
        let changed = watch.changed();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let step = watch.now();
        let deadline = step.since + bounds.of_phase(step.phase);
        tokio::select! {
            () = tokio::time::sleep_until(deadline.into()) => {
                if let Some(why) = bounds.overdue(&watch.now(), crate::clock::machine_instant()) {
                    return why;
                }
            }
            () = &mut changed => {}
        }
    }
}

/// What a generation is built against: what outlives it.
#[derive(Clone, Copy)]
pub struct Around<'a> {
    /// The plugin engine.
    pub engine: &'a Arc<PolicyEngine>,
    /// Plugin state, shared by every generation.
    pub plugin_state: &'a Arc<dyn StateStore>,
    /// Learned account state: each account of the config is bound to its entry.
    pub book: &'a AccountBook,
    /// Where stage failures are counted.
    pub metrics: &'a Arc<Metrics>,
    /// The gateway's clock.
    pub clock: &'a Clock,
    /// What every upstream request goes through, seats' token refreshes too.
    pub http: &'a Arc<dyn Transport>,
}

impl Generation {
    /// [`Generation::build`] within [`LoadBounds`]: a load that overstays a
    /// phase is dropped (nothing of it keeps running) and refused, naming the
    /// stage and the phase.
    pub async fn build_bounded(
        number: u64,
        config: Config,
        around: &Around<'_>,
        previous: Option<&Chain>,
    ) -> Result<Generation> {
        let bounds = LoadBounds::of(&config)?;
        let watch = LoadWatch::new(crate::clock::machine_instant());
        let build = watch.scope(Self::build(number, config, around, previous));
        tokio::select! {
            built = build => built,
            why = overdue(&watch, &bounds) => Err(anyhow!(why)),
        }
    }

    /// Loads `config`. Every problem with credentials is reported at once; the
    /// chain is compiled, instantiated, configured and smoke-ranked — except
    /// the stages it keeps from the `previous` chain, unchanged (see
    /// [`Chain::load_reusing`]).
    pub async fn build(
        number: u64,
        config: Config,
        around: &Around<'_>,
        previous: Option<&Chain>,
    ) -> Result<Generation> {
        let Around { engine, plugin_state, book, metrics, clock, http } = *around;
        // Secrets were read when the file was loaded; a config built in code is
        // resolved now.
        let resolved = config.resolved()?;
        let mut problems = Vec::new();
        let mut enabled = Vec::new();
        let mut disabled = Vec::new();
        // Propagation on: `traceparent` and `tracestate` pass the allow-list,
        // and `attempt::send` puts the gateway's in place of the client's
        // (or none, when it traces nothing).
        let mut forward = config.gateway.forward_headers.clone();
        if config.telemetry.propagate_upstream {
            forward.extend(["traceparent".to_string(), "tracestate".to_string()]);
        }
        let forward = Arc::new(ForwardPolicy::new(&forward));
        for (i, account) in resolved.accounts.iter().enumerate() {
            let state = book.entry(&account.config.id);
            let Some(credential) = &account.credential else {
                disabled.push((account.config.clone(), state));
                continue;
            };
            state.bind(binding(credential));
            match target(&account.base, &account.config, credential, &state, &config.oauth, &forward, http) {
                Ok(target) => enabled.push((account.config.clone(), target, state)),
                Err(e) => problems.push(format!("accounts[{i}] (`{}`): {e:#}", account.config.id)),
            }
        }
        let teams = config.server.client_keys.iter().filter_map(|k| Some((k.name.clone(), k.team.clone()?)));
        let policies = config.server.client_keys.iter().map(|k| (k.name.clone(), k.policy()));
        let client_keys =
            ClientKeys::new(resolved.client_keys.clone()).with_teams(teams.collect()).with_policies(policies);
        let admin = AdminToken::new(resolved.admin);
        if !problems.is_empty() {
            bail!("{}", problems.join("\n"));
        }
        let pool: Vec<AccountInfo> =
            enabled.iter().map(|(c, _, _)| view::pool_entry(&c.id, c.alias(), c.primary)).collect();
        let chain =
            Chain::load_reusing(engine, config.stage_specs()?, pool, plugin_state.clone(), config.breaker(), previous)
                .await?;
        let sink = metrics.clone();
        chain.set_sink(Arc::new(move |stage: &str, phase: Phase, fault: &Fault| {
            sink.policy_error(stage, phase, fault.cause.as_str())
        }));
        let accounts: Vec<PoolAccount> = enabled
            .into_iter()
            .enumerate()
            .map(|(i, (config, target, state))| PoolAccount { index: i as u32, config, target, state, overflow: false })
            .collect::<Vec<_>>();
        let seats = accounts.iter().any(|a| a.config.kind == crate::config::AccountKind::Oauth);
        let accounts =
            accounts.into_iter().map(|a| PoolAccount { overflow: a.config.is_overflow(seats), ..a }).collect();
        let fallbacks = crate::gateway::request::fallback::Fallbacks::new(&config.fallback, &resolved.fallbacks)?;
        let prices = crate::config::ledger::prices(&config.prices);
        let generation = Generation {
            number,
            config,
            chain: Arc::new(chain),
            accounts,
            disabled,
            client_keys,
            admin,
            loaded_ms: clock.now_ms(),
            fallbacks,
            prices,
        };
        loading::phase(LoadPhase::Smoke);
        generation.smoke_rank(clock.now_ms()).await?;
        metrics.zeros(&generation.roster());
        Ok(generation)
    }

    /// What its counters are labelled by, for their zeros: a reload that adds
    /// an account, a seat, a stage or a backend shows its counters from the
    /// moment it is in force (not before: a refused load shows nothing).
    fn roster(&self) -> crate::metrics::Roster<'_> {
        let seat = |a: &&PoolAccount| a.config.kind == crate::config::AccountKind::Oauth;
        crate::metrics::Roster {
            accounts: self.accounts.iter().map(|a| a.config.id.as_str()).collect(),
            seats: self.accounts.iter().filter(seat).map(|a| a.config.id.as_str()).collect(),
            stages: self.chain.stage_names().collect(),
            backends: self.fallbacks.markers().collect(),
        }
    }

    /// Ranks a synthetic request over the real pool once, and tells the chain
    /// it was served, on the same path a request takes: a chain that cannot
    /// answer it is refused before it takes traffic.
    async fn smoke_rank(&self, now: u64) -> Result<()> {
        if self.accounts.is_empty() || self.chain.is_empty() {
            return Ok(());
        }
        let req = wit::Request {
            id: 0,
            now_ms: now,
            model: "claude-sonnet-4-5".into(),
            session: None,
            api: wit::ApiShape::Messages,
            attempt: 0,
            replayable: true,
            decided_by: None,
        };
        let decision = self.chain.rank(req.clone(), self.candidates(None, now, &[])).await;
        // A stage its breaker bypasses is one a reload kept as it was (a new
        // stage's breaker starts closed): the breaker already judged it, and
        // refusing the reload for it would refuse every reload while it rests.
        // `busy` is traffic's, not the plugin's: a kept stage shares its live
        // pool with the requests being served.
        let excused =
            |c: crate::policy::Cause| matches!(c, crate::policy::Cause::Bypassed | crate::policy::Cause::Busy);
        let failed = decision.policy_errors.iter().find(|e| !excused(e.cause));
        if let Some(e) = failed {
            bail!("policy.chain: stage `{}` failed its smoke test ({}): {}", e.stage, e.cause.as_str(), e.message);
        }
        let head = decision.order.indices().first().copied().unwrap_or(0);
        let observed = self.chain.observe(&req, head, &wit::Outcome::Success).await;
        if let Some(e) = observed.iter().find(|e| !excused(e.cause)) {
            bail!(
                "policy.chain: stage `{}` failed its smoke test in observe ({}): {}",
                e.stage,
                e.cause.as_str(),
                e.message
            );
        }
        Ok(())
    }

    /// The candidates for a request of model `family` at `now`, leaving out the
    /// pool indices in `exclude` (accounts already tried).
    pub fn candidates(&self, family: Option<&str>, now: u64, exclude: &[u32]) -> Candidates {
        let freshness_ms = self.config.policy.freshness_ms;
        let mut windows = Vec::new();
        let accounts = self
            .accounts
            .iter()
            .filter(|a| !exclude.contains(&a.index))
            .map(|a| {
                a.state.with_view(&a.config, now, |snapshot, readings| {
                    view::account(snapshot, readings, a.index, family, now, freshness_ms, &mut windows)
                })
            })
            .collect();
        Candidates { accounts, windows }
    }

    /// The account at pool index `index`.
    pub fn account(&self, index: u32) -> Option<&PoolAccount> {
        self.accounts.get(index as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(toml: &str) -> Config {
        toml::from_str(toml).unwrap()
    }

    #[test]
    fn each_phase_is_bounded_by_its_own_budget_plus_the_slack() {
        let c = config(
            "[policy]\nconfigure_timeout_ms = 1000\ncompile_timeout_ms = 3000\ntimeout_ms = 50\n\
             [[policy.chain]]\nplugin = \"builtin:headroom\"\n[[policy.chain]]\nplugin = \"builtin:affinity\"\n\
             timeout_ms = 100\n",
        );
        let b = LoadBounds::of(&c).unwrap();
        assert_eq!(b.compile, Duration::from_secs(3) + LOAD_SLACK);
        // The build's hard cap: twice the deadline plus 2 s.
        assert_eq!(b.configure, Duration::from_secs(4) + LOAD_SLACK);
        // Per stage: its deadline, the observe queue's 5 s, and two hard caps
        // (4 × (deadline + max(20 ms, a quarter)) + 100 ms): 380 and 600 ms.
        assert_eq!(b.smoke, Duration::from_millis(50 + 5000 + 760 + 100 + 5000 + 1200) + LOAD_SLACK);
        assert_eq!(b.total(2), LOAD_SLACK + (b.compile + b.configure) * 2 + b.smoke);
    }

    #[test]
    fn a_load_is_overdue_only_past_the_bound_of_the_phase_it_is_in_and_says_where() {
        let b = LoadBounds {
            compile: Duration::from_secs(10),
            configure: Duration::from_secs(4),
            smoke: Duration::from_secs(3),
        };
        let t0 = crate::clock::machine_instant();
        let step = |phase, stage: Option<(usize, &str)>| Step {
            stage: stage.map(|(i, n)| (i, n.to_string())),
            phase,
            since: t0,
            seq: 1,
        };
        let configuring = step(LoadPhase::Configure, Some((1, "stuck")));
        assert_eq!(b.overdue(&configuring, t0 + Duration::from_millis(3999)), None);
        let why = b.overdue(&configuring, t0 + Duration::from_secs(4)).unwrap();
        assert!(why.starts_with("policy.chain[1] (`stuck`): configure did not finish within 4.0 s"), "{why}");
        assert!(why.contains("configure_timeout_ms"), "{why}");
        // The same time is well within a compile.
        assert_eq!(b.overdue(&step(LoadPhase::Compile, Some((0, "a"))), t0 + Duration::from_secs(4)), None);
        let why = b.overdue(&step(LoadPhase::Compile, Some((0, "a"))), t0 + Duration::from_secs(11)).unwrap();
        assert!(why.starts_with("policy.chain[0] (`a`): compile did not finish"), "{why}");
        let why = b.overdue(&step(LoadPhase::Smoke, None), t0 + Duration::from_secs(3)).unwrap();
        assert!(why.starts_with("policy.chain: smoke test did not finish within 3.0 s"), "{why}");
    }
}
