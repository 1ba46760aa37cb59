//! One generation: a configuration fully loaded — credentials read, chain compiled
//! and configured, account state attached — and never changed afterwards. A
//! reload builds the next generation beside it and swaps the pointer; requests in
//! flight finish on the generation they started with.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{Result, bail};
use parking_lot::Mutex;

use super::accounts::AccountState;
use super::auth::{AdminToken, ClientKeys};
use super::metrics::Metrics;
use super::now_ms;
use super::upstream::Target;
use crate::config::headers::ForwardPolicy;
use crate::config::{AccountConfig, Config, Credential, OAuthConfig};
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
    pub chain: Chain,
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
    pub fallbacks: super::fallback::Fallbacks,
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
) -> Result<Target> {
    match credential {
        Credential::Static(secret) => Target::new(base, config.kind, secret, forward.clone()),
        Credential::Seat { path, stored } => {
            let seat = state.seat_for(path, oauth, || {
                let client = crate::oauth::TokenClient::new(oauth.clone())?;
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

impl Generation {
    /// Loads `config`. Every problem with credentials is reported at once; the
    /// chain is compiled, instantiated, configured and smoke-ranked — except
    /// the stages it keeps from the `previous` chain, unchanged (see
    /// [`Chain::load_reusing`]).
    pub async fn build(
        number: u64,
        config: Config,
        engine: &Arc<PolicyEngine>,
        plugin_state: &Arc<dyn StateStore>,
        states: &Mutex<HashMap<String, Arc<AccountState>>>,
        metrics: &Arc<Metrics>,
        previous: Option<&Chain>,
    ) -> Result<Generation> {
        // Secrets were read when the file was loaded; a config built in code is
        // resolved now.
        let resolved = config.resolved()?;
        let mut problems = Vec::new();
        let mut enabled = Vec::new();
        let mut disabled = Vec::new();
        let forward = Arc::new(ForwardPolicy::new(&config.gateway.forward_headers));
        for (i, account) in resolved.accounts.iter().enumerate() {
            let state = states
                .lock()
                .entry(account.config.id.clone())
                .or_insert_with(|| Arc::new(AccountState::new(&account.config.id)))
                .clone();
            let Some(credential) = &account.credential else {
                disabled.push((account.config.clone(), state));
                continue;
            };
            state.bind(binding(credential));
            match target(&account.base, &account.config, credential, &state, &config.oauth, &forward) {
                Ok(target) => enabled.push((account.config.clone(), target, state)),
                Err(e) => problems.push(format!("accounts[{i}] (`{}`): {e:#}", account.config.id)),
            }
        }
        let client_keys = ClientKeys::new(resolved.client_keys.clone());
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
        let keepalive = Some(std::time::Duration::from_millis(config.gateway.stream_keepalive_ms));
        let fallbacks = super::fallback::Fallbacks::new(&config.fallback, keepalive)?;
        let generation = Generation {
            number,
            config,
            chain,
            accounts,
            disabled,
            client_keys,
            admin,
            loaded_ms: now_ms(),
            fallbacks,
        };
        generation.smoke_rank().await?;
        Ok(generation)
    }

    /// Ranks a synthetic request over the real pool once, and tells the chain
    /// it was served, on the same path a request takes: a chain that cannot
    /// answer it is refused before it takes traffic.
    async fn smoke_rank(&self) -> Result<()> {
        if self.accounts.is_empty() || self.chain.is_empty() {
            return Ok(());
        }
        let now = now_ms();
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
        let failed = decision.policy_errors.iter().find(|e| e.cause != crate::policy::Cause::Bypassed);
        if let Some(e) = failed {
            bail!("policy.chain: stage `{}` failed its smoke test ({}): {}", e.stage, e.cause.as_str(), e.message);
        }
        let head = decision.order.indices().first().copied().unwrap_or(0);
        if let Some(e) = self.chain.observe(&req, head, &wit::Outcome::Success).await.first() {
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
        let snapshots = self
            .accounts
            .iter()
            .filter(|a| !exclude.contains(&a.index))
            .map(|a| (a.index, a.state.snapshot(&a.config)));
        view::candidates(snapshots, family, now, self.config.policy.freshness_ms)
    }

    /// The account at pool index `index`.
    pub fn account(&self, index: u32) -> Option<&PoolAccount> {
        self.accounts.get(index as usize)
    }
}
