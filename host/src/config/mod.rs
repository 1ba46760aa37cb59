//! The TOML configuration: the server, the pool of accounts, the policy chain,
//! and how upstream answers cool accounts down.
//!
//! Every key is documented in `docs/configuration.md`.

mod accounts;
mod cooldowns;
mod fallback;
pub mod headers;
pub mod ledger;
pub mod schema;
mod secrets;
mod server;
pub mod serving;
mod state;
pub mod telemetry;
pub mod validate;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

pub use crate::oauth::settings::{CLAUDE_CODE_CLIENT_ID, OAuthConfig, Overage};
pub use accounts::{ANTHROPIC_API, AccountConfig, AccountKind};
pub use cooldowns::CooldownConfig;
pub use fallback::FallbackConfig;
pub use ledger::{LedgerConfig, PriceConfig};
pub use secrets::{Credential, Resolved, ResolvedAccount, ResolvedFallback, Secret, base_prefix, digest};
pub use server::{ClientKey, GatewayConfig, LogFormat, ServerConfig, UnifiedHeaders};
pub use state::{Backend as StateBackendKind, StateConfig, prefix_problem, redact as redact_url};
pub use telemetry::TelemetryConfig;

use crate::policy::{self, BreakerConfig, Limits, PluginRef, PluginSpec, StageSpec};

/// Key paths → the line they were written on (for the meaning pass of
/// `validate` and the serving checks).
pub type LineIndex = std::collections::HashMap<String, usize>;

/// The whole configuration file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Listening, client keys, admin token, logs.
    #[serde(default)]
    pub server: ServerConfig,
    /// Failover, admission and upstream timeouts.
    #[serde(default)]
    pub gateway: GatewayConfig,
    /// Cooldown durations and ceilings by cause.
    #[serde(default)]
    pub cooldowns: CooldownConfig,
    /// The policy chain and the plugin sandbox.
    #[serde(default)]
    pub policy: PolicyConfig,
    /// OAuth endpoints and refresh timing of subscription seats.
    #[serde(default)]
    pub oauth: OAuthConfig,
    /// Model names OpenAI-shaped clients may use.
    #[serde(default)]
    pub models: ModelsConfig,
    /// Where learned state is kept: this process, or Redis shared by replicas.
    #[serde(default)]
    pub state: StateConfig,
    /// The usage ledger: where entries are kept, how often written.
    #[serde(default)]
    pub ledger: LedgerConfig,
    /// Traces to an OpenTelemetry backend (off without an endpoint).
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// Prices by model pattern (USD per million tokens), over the defaults.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub prices: std::collections::BTreeMap<String, PriceConfig>,
    /// The accounts of the pool.
    #[serde(default)]
    pub accounts: Vec<AccountConfig>,
    /// Backends for a populated pool that cannot serve, in order.
    #[serde(default)]
    pub fallback: Vec<FallbackConfig>,
    /// What the file refers to, resolved when it was loaded (secrets read once).
    #[serde(skip)]
    pub resolved: Option<std::sync::Arc<Resolved>>,
}

/// What the command line and the environment override in the file
/// (`--listen` / `POOLGATE_LISTEN`, `--log-format` / `POOLGATE_LOG_FORMAT`).
/// Captured once when `serve` starts and applied to every load after it, so a
/// reload reads the file as the start did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Replaces `server.listen`.
    pub listen: Option<String>,
    /// Replaces `server.log_format`.
    pub log_format: Option<LogFormat>,
}

impl Overrides {
    /// Writes the overrides into `config`.
    pub fn apply(&self, config: &mut Config) {
        if let Some(l) = &self.listen {
            config.server.listen.clone_from(l);
        }
        if let Some(f) = self.log_format {
            config.server.log_format = f;
        }
    }
}

/// `[models]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelsConfig {
    /// Names a Chat Completions client may send → the model it gets
    /// (`"gpt-4o" = "claude-sonnet-4-5"`); `claude-*` names pass as they are.
    #[serde(default)]
    pub aliases: std::collections::BTreeMap<String, String>,
}

/// `[policy]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Default deadline of one plugin call, ms.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Default memory cap per plugin instance, MiB.
    #[serde(default = "default_memory_mb")]
    pub memory_mb: usize,
    /// Where compiled plugins are cached; empty disables the disk cache.
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
    /// Quota readings older than this count as stale, ms.
    #[serde(default = "default_freshness_ms")]
    pub freshness_ms: u64,
    /// Warm instances kept per plugin (default: one per CPU).
    #[serde(default)]
    pub instances: Option<usize>,
    /// The most instances of one plugin alive at once when calls arrive
    /// together (default: [`policy::DEFAULT_INSTANCE_GROWTH`] × `instances`).
    #[serde(default)]
    pub max_instances: Option<usize>,
    /// CPU budget of building one plugin instance (instantiate + configure), ms.
    #[serde(default = "default_configure_timeout_ms")]
    pub configure_timeout_ms: u64,
    /// Largest plugin file accepted, MiB.
    #[serde(default = "default_max_plugin_mb")]
    pub max_plugin_mb: usize,
    /// How long compiling one plugin may take, ms.
    #[serde(default = "default_compile_timeout_ms")]
    pub compile_timeout_ms: u64,
    /// Size bound of the compiled-plugin disk cache, MiB.
    #[serde(default = "default_cache_max_mb")]
    pub cache_max_mb: usize,
    /// Bounds of plugin state.
    #[serde(default)]
    pub state: StateToml,
    /// The per-stage circuit breaker.
    #[serde(default)]
    pub breaker: BreakerToml,
    /// The stages, in order. Empty means the default chain.
    #[serde(default)]
    pub chain: Vec<StageConfig>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            timeout_ms: default_timeout_ms(),
            memory_mb: default_memory_mb(),
            cache_dir: None,
            freshness_ms: default_freshness_ms(),
            instances: None,
            max_instances: None,
            configure_timeout_ms: default_configure_timeout_ms(),
            max_plugin_mb: default_max_plugin_mb(),
            compile_timeout_ms: default_compile_timeout_ms(),
            cache_max_mb: default_cache_max_mb(),
            state: StateToml::default(),
            breaker: BreakerToml::default(),
            chain: Vec::new(),
        }
    }
}

fn default_timeout_ms() -> u64 {
    policy::DEFAULT_DEADLINE_MS
}
fn default_memory_mb() -> usize {
    policy::DEFAULT_MEMORY_MB
}
fn default_freshness_ms() -> u64 {
    crate::account::DEFAULT_FRESHNESS_MS
}

fn default_configure_timeout_ms() -> u64 {
    policy::DEFAULT_CONFIGURE_MS
}
fn default_max_plugin_mb() -> usize {
    policy::compile::DEFAULT_MAX_PLUGIN_MB
}
fn default_compile_timeout_ms() -> u64 {
    policy::compile::DEFAULT_COMPILE_TIMEOUT_MS
}
fn default_cache_max_mb() -> usize {
    policy::compile::DEFAULT_CACHE_MAX_MB
}

/// `[policy.state]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateToml {
    /// Bytes one plugin's state scope may hold, MiB.
    #[serde(default = "default_scope_mb")]
    pub max_scope_mb: usize,
    /// Bytes all scopes together may hold, MiB.
    #[serde(default = "default_total_mb")]
    pub max_total_mb: usize,
}

impl Default for StateToml {
    fn default() -> Self {
        StateToml { max_scope_mb: default_scope_mb(), max_total_mb: default_total_mb() }
    }
}

fn default_scope_mb() -> usize {
    policy::state::DEFAULT_SCOPE_MB
}
fn default_total_mb() -> usize {
    policy::state::DEFAULT_TOTAL_MB
}

/// `[policy.breaker]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BreakerToml {
    /// Consecutive failures that open a stage's breaker (0 = never).
    #[serde(default = "default_breaker_failures")]
    pub failures: u32,
    /// First cool-off, ms.
    #[serde(default = "default_breaker_cooldown")]
    pub cooldown_ms: u64,
    /// Longest cool-off, ms.
    #[serde(default = "default_breaker_max")]
    pub max_cooldown_ms: u64,
}

impl Default for BreakerToml {
    fn default() -> Self {
        let d = BreakerConfig::default();
        BreakerToml { failures: d.failures, cooldown_ms: d.cooldown_ms, max_cooldown_ms: d.max_cooldown_ms }
    }
}

fn default_breaker_failures() -> u32 {
    BreakerConfig::default().failures
}
fn default_breaker_cooldown() -> u64 {
    BreakerConfig::default().cooldown_ms
}
fn default_breaker_max() -> u64 {
    BreakerConfig::default().max_cooldown_ms
}

/// One `[[policy.chain]]` stage.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageConfig {
    /// `builtin:<name>` or a path to a `.wasm` component (relative to the config
    /// file).
    pub plugin: String,
    /// Name in decisions and status (default: the plugin reference).
    #[serde(default)]
    pub name: Option<String>,
    /// State scope (default: the built-in's name or the file stem).
    #[serde(default)]
    pub scope: Option<String>,
    /// This stage's call deadline, ms.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// This stage's memory cap, MiB.
    #[serde(default)]
    pub memory_mb: Option<usize>,
    /// How old a quota reading may be and still count as fresh for this
    /// stage, ms (default: `[policy] freshness_ms`).
    #[serde(default)]
    pub freshness_ms: Option<u64>,
    /// The plugin's own options, handed to `configure` as JSON.
    #[serde(default)]
    pub config: Option<toml::Table>,
}

/// The chain used when the config names none: drop accounts known to be
/// exhausted, order the rest by headroom, then keep each session on the account
/// that served it. Skip-exhausted first means no later stage ranks a seat whose
/// quota says it will refuse; headroom spreads new sessions as dario does;
/// affinity last, so a session's prompt cache stays warm on its account for as
/// long as that account is usable and unsaturated — and moves, by headroom, when
/// it is not (docs/strategies.md, "The default chain").
pub const DEFAULT_CHAIN: &[&str] = &["builtin:skip-exhausted", "builtin:headroom", "builtin:affinity"];

impl Config {
    /// Reads a config file and checks it completely — syntax, shape and meaning
    /// (credentials readable, ids unique, plugins present) — reporting every
    /// problem at once with its key path and line. Plugins themselves are checked
    /// when the chain loads.
    pub fn load(path: &Path) -> Result<Config> {
        Self::load_indexed(path).map(|(c, _)| c)
    }

    /// As [`Config::load`], also returning the line of every key, to locate
    /// problems found later (a plugin refusing its options).
    pub fn load_indexed(path: &Path) -> Result<(Config, validate::LineIndex)> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read config {}", path.display()))?;
        Self::load_text(path, &text)
    }

    /// As [`Config::load_indexed`], for the file's text already read (a reload
    /// checks that it read what the file watcher saw settle).
    pub fn load_text(path: &Path, text: &str) -> Result<(Config, validate::LineIndex)> {
        Self::load_with(path, text, &Overrides::default())
    }

    /// What `serve`, `check` and every reload load: the file's text with what
    /// the command line and the environment override in it applied *before*
    /// it is judged, so that the three judge the same configuration — one a
    /// reload could not reach without the start refusing it.
    pub fn load_with(path: &Path, text: &str, overrides: &Overrides) -> Result<(Config, validate::LineIndex)> {
        let (mut config, index) = validate::parse(text, &path.display().to_string())?;
        config.resolve_paths(path.parent().unwrap_or(Path::new(".")));
        overrides.apply(&mut config);
        config.state.locate_file(path);
        config.ledger.locate_file(path);
        let resolved = validate::meaning(&config, &index, &path.display().to_string(), Some(overrides))?;
        config.resolved = Some(std::sync::Arc::new(resolved));
        Ok((config, index))
    }

    /// [`Config::load_with`] of the file at `path`.
    pub fn load_file_with(path: &Path, overrides: &Overrides) -> Result<(Config, validate::LineIndex)> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read config {}", path.display()))?;
        Self::load_with(path, &text, overrides)
    }

    /// Reads a config file checking syntax and shape only: for tools that use the
    /// policy section without the pool's secrets (`poolgate rank`).
    pub fn read(path: &Path) -> Result<(Config, validate::LineIndex)> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read config {}", path.display()))?;
        let (mut config, index) = validate::parse(&text, &path.display().to_string())?;
        config.resolve_paths(path.parent().unwrap_or(Path::new(".")));
        Ok((config, index))
    }

    /// Makes plugin, token-file and credentials paths relative to the config file's directory.
    pub fn resolve_paths(&mut self, base: &Path) {
        for stage in &mut self.policy.chain {
            if !stage.plugin.starts_with("builtin:") && Path::new(&stage.plugin).is_relative() {
                stage.plugin = base.join(&stage.plugin).to_string_lossy().into_owned();
            }
        }
        for account in &mut self.accounts {
            for f in [&mut account.token_file, &mut account.credentials].into_iter().flatten() {
                if f.is_relative() {
                    *f = base.join(&*f);
                }
            }
        }
    }

    /// The stages to load: the configured chain, or the default one.
    pub fn stage_specs(&self) -> Result<Vec<StageSpec>> {
        let p = &self.policy;
        let defaults;
        let stages: &[StageConfig] = if p.chain.is_empty() {
            defaults = DEFAULT_CHAIN
                .iter()
                .filter(|s| policy::builtin_names().iter().any(|b| b == *s))
                .map(|s| StageConfig {
                    plugin: s.to_string(),
                    name: None,
                    scope: None,
                    timeout_ms: None,
                    memory_mb: None,
                    freshness_ms: None,
                    config: None,
                })
                .collect::<Vec<_>>();
            &defaults
        } else {
            &p.chain
        };
        let max_idle = p.instances.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
        // The default stays within what may be set (4,096), however many CPUs.
        let max_instances = p
            .max_instances
            .unwrap_or_else(|| max_idle.saturating_mul(policy::DEFAULT_INSTANCE_GROWTH).clamp(max_idle, 4096));
        if max_instances < max_idle {
            anyhow::bail!(
                "policy.max_instances ({max_instances}) is below policy.instances ({max_idle}): the pool keeps \
                 `instances` warm and grows to `max_instances` under demand"
            );
        }
        stages
            .iter()
            .map(|s| {
                let plugin = PluginRef::parse(&s.plugin);
                let config_json = serde_json::to_string(&s.config.clone().unwrap_or_default())?;
                let timeout = s.timeout_ms.unwrap_or(p.timeout_ms);
                Ok(StageSpec {
                    name: s.name.clone().unwrap_or_else(|| s.plugin.clone()),
                    plugin: PluginSpec {
                        scope: s.scope.clone().unwrap_or_else(|| plugin.default_scope()),
                        plugin,
                        config_json,
                        limits: Limits {
                            deadline: std::time::Duration::from_millis(timeout),
                            memory_bytes: s.memory_mb.unwrap_or(p.memory_mb) << 20,
                            configure_deadline: std::time::Duration::from_millis(p.configure_timeout_ms),
                            freshness_ms: s.freshness_ms.unwrap_or(p.freshness_ms),
                        },
                        max_idle,
                        max_instances,
                    },
                })
            })
            .collect()
    }

    /// The breaker settings.
    pub fn breaker(&self) -> BreakerConfig {
        let b = &self.policy.breaker;
        BreakerConfig { failures: b.failures, cooldown_ms: b.cooldown_ms, max_cooldown_ms: b.max_cooldown_ms }
    }

    /// The limits plugins are compiled under.
    pub fn compile_limits(&self) -> policy::CompileLimits {
        let p = &self.policy;
        policy::CompileLimits {
            max_plugin_bytes: p.max_plugin_mb << 20,
            timeout: std::time::Duration::from_millis(p.compile_timeout_ms),
            cache_max_bytes: (p.cache_max_mb as u64) << 20,
        }
    }

    /// The bounds of plugin state.
    pub fn state_limits(&self) -> policy::StateLimits {
        let s = &self.policy.state;
        policy::StateLimits { scope_bytes: s.max_scope_mb << 20, total_bytes: s.max_total_mb << 20 }
    }

    /// The compiled-plugin cache directory (`None` when disabled).
    pub fn cache_dir(&self) -> Option<PathBuf> {
        match &self.policy.cache_dir {
            Some(p) if p.as_os_str().is_empty() => None,
            Some(p) => Some(p.clone()),
            None => policy::PolicyEngine::default_cache_dir(),
        }
    }
}
