//! `[[accounts]]`: the upstream accounts of the pool and where their secrets live.
//!
//! Secrets are referenced, never written in the file: an environment variable or
//! a file path. A [`Secret`] prints as `***` so it cannot leak into logs; they
//! are read when the config is resolved (see [`super::secrets`]).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

use super::secrets::Secret;
use serde::{Deserialize, Serialize};

/// The default upstream.
pub const ANTHROPIC_API: &str = "https://api.anthropic.com";

/// How an account authenticates upstream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AccountKind {
    /// An API key, sent as `x-api-key`.
    #[default]
    ApiKey,
    /// A subscription OAuth access token, sent as `Authorization: Bearer` with the
    /// OAuth beta header.
    Oauth,
}

/// One `[[accounts]]` entry.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountConfig {
    /// Stable id: the key of the account's learned state and of plugin state.
    pub id: String,
    /// Display alias; fill-first orders by it (default: the id).
    #[serde(default)]
    pub alias: Option<String>,
    /// The primary account (prefer-primary puts it first).
    #[serde(default)]
    pub primary: bool,
    /// `api-key` or `oauth`.
    #[serde(default)]
    pub kind: AccountKind,
    /// Environment variable holding the API key or token.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// File holding the API key or token (first line).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// An OAuth seat's credentials file, which the gateway owns and refreshes
    /// (`poolgate login` or `poolgate accounts import` writes it).
    #[serde(default)]
    pub credentials: Option<PathBuf>,
    /// Upstream base URL.
    #[serde(default)]
    pub base_url: Option<String>,
    /// Most requests in flight on this account at once.
    #[serde(default)]
    pub max_in_flight: Option<u32>,
    /// Set to false to keep the account configured but unused.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Tried only after every usable account that is not overflow, whatever
    /// the chain's order. Default: an API key in a pool that also holds OAuth
    /// subscription seats is overflow (pay-as-you-go tokens are spent after
    /// prepaid seats); everything else is not.
    #[serde(default)]
    pub overflow: Option<bool>,
}

fn yes() -> bool {
    true
}

impl AccountConfig {
    /// Whether the account is overflow in a pool that does (`seats`) or does
    /// not hold OAuth seats: its `overflow`, else true for an API key beside
    /// seats.
    pub fn is_overflow(&self, seats: bool) -> bool {
        self.overflow.unwrap_or(seats && self.kind == AccountKind::ApiKey)
    }

    /// The alias, or the id.
    pub fn alias(&self) -> &str {
        self.alias.as_deref().unwrap_or(&self.id)
    }

    /// The upstream base URL, without a trailing slash.
    pub fn base_url(&self) -> &str {
        self.base_url.as_deref().unwrap_or(ANTHROPIC_API).trim_end_matches('/')
    }

    /// Reads a static credential from where the config says it is (an
    /// account with `credentials` has none: its seat refreshes its own).
    pub fn credential(&self) -> Result<Secret> {
        if self.credentials.is_some() {
            bail!("an account with `credentials` takes neither api_key_env nor token_file");
        }
        match (&self.api_key_env, &self.token_file) {
            (Some(var), None) => {
                let v = std::env::var(var).with_context(|| format!("environment variable {var} is not set"))?;
                Secret::new(v).with_context(|| format!("environment variable {var} is empty"))
            }
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
                Secret::new(text.lines().next().unwrap_or("").to_string())
                    .with_context(|| format!("{} is empty", path.display()))
            }
            (Some(_), Some(_)) => bail!("give either api_key_env or token_file, not both"),
            (None, None) => bail!("no credential: set api_key_env or token_file"),
        }
    }
}
