//! What the config refers to rather than holds, resolved once: account
//! credentials (from the environment or a file), client-key and admin-token
//! digests, and upstream base URLs checked and normalised.
//!
//! Resolution is the config's last step and the gateway's input: a load reads
//! each secret exactly once, every problem is reported with its key path, and
//! the gateway builds its pieces from the resolved values without parsing
//! anything itself.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use super::{AccountConfig, Config, ServerConfig};

/// SHA-256 of a key.
pub fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn parse_hex(hex_digest: &str) -> Result<[u8; 32]> {
    let bytes = hex::decode(hex_digest.trim()).context("not hex")?;
    bytes.try_into().map_err(|_| anyhow::anyhow!("not a SHA-256 (need 64 hex digits)"))
}

/// A credential. Never printed, never serialized.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a non-empty credential (surrounding whitespace removed).
    pub fn new(value: String) -> Result<Secret> {
        let v = value.trim();
        if v.is_empty() {
            bail!("empty credential");
        }
        Ok(Secret(v.to_string()))
    }

    /// The credential, for the one place that sends it upstream.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

pub use crate::https::base_prefix;

/// One account, resolved.
#[derive(Debug, Clone)]
pub struct ResolvedAccount {
    /// Its `[[accounts]]` entry.
    pub config: AccountConfig,
    /// The base URL every request path is appended to (see [`base_prefix`]).
    pub base: String,
    /// Its credential; `None` for a disabled account (its secret is not read).
    pub credential: Option<Credential>,
}

/// Where an account's credential comes from.
#[derive(Debug, Clone)]
pub enum Credential {
    /// A key or token that does not change (`api_key_env`, `token_file`).
    Static(Secret),
    /// An OAuth seat's credentials file, read at load and refreshed by the
    /// gateway (`credentials`).
    Seat {
        /// The file.
        path: std::path::PathBuf,
        /// What it held at load.
        stored: crate::oauth::StoredCredential,
    },
}

fn account_credential(a: &AccountConfig) -> Result<Credential> {
    match &a.credentials {
        Some(path) => {
            if a.api_key_env.is_some() || a.token_file.is_some() {
                bail!("an account with `credentials` takes neither api_key_env nor token_file");
            }
            if a.kind != super::AccountKind::Oauth {
                bail!("`credentials` is for OAuth seats: set kind = \"oauth\"");
            }
            let stored = crate::oauth::StoredCredential::read(path).with_context(|| {
                format!("run `poolgate login {}` or `poolgate accounts import {0} --from <file>`", a.id)
            })?;
            Ok(Credential::Seat { path: path.clone(), stored })
        }
        None => a.credential().map(Credential::Static),
    }
}

/// Everything a config refers to, resolved.
#[derive(Debug, Clone, Default)]
pub struct Resolved {
    /// The accounts, in configuration order.
    pub accounts: Vec<ResolvedAccount>,
    /// Accepted client keys: (name, SHA-256).
    pub client_keys: Vec<(String, [u8; 32])>,
    /// The admin token's SHA-256, if admin routes are open.
    pub admin: Option<[u8; 32]>,
    /// The `[[fallback]]` backends, in configuration order.
    pub fallbacks: Vec<ResolvedFallback>,
}

/// One fallback backend, resolved.
#[derive(Debug, Clone)]
pub struct ResolvedFallback {
    /// The base URL every request path is appended to (see [`base_prefix`]).
    pub base: String,
    /// Its API key (`api_key_env`), sent as a bearer token; `None` for a
    /// backend that takes none.
    pub key: Option<Secret>,
}

/// A resolution problem: the key path it concerns and what is wrong.
pub type Problem = (String, String);

impl Config {
    /// Resolves what the config refers to, reading each secret once; every
    /// problem is returned at once, each with its key path.
    pub fn resolve(&self) -> Result<Resolved, Vec<Problem>> {
        let mut problems = Vec::new();
        let admin = admin_token(&self.server).unwrap_or_else(|e| {
            let key = if self.server.admin_token_sha256.is_some() && self.server.admin_token_env.is_none() {
                "server.admin_token_sha256"
            } else {
                "server.admin_token_env"
            };
            problems.push((key.to_string(), format!("{e:#}")));
            None
        });
        let mut client_keys = Vec::new();
        for (i, k) in self.server.client_keys.iter().enumerate() {
            match client_key(k) {
                Ok(d) => client_keys.push((k.name.clone(), d)),
                Err(e) => problems.push((format!("server.client_keys[{i}]"), format!("{e:#}"))),
            }
        }
        let mut accounts = Vec::new();
        for (i, a) in self.accounts.iter().enumerate() {
            let base = base_prefix(a.base_url())
                .map_err(|e| problems.push((format!("accounts[{i}].base_url"), e.to_string())))
                .ok();
            let credential = match a.enabled.then(|| account_credential(a)) {
                None => Ok(None),
                Some(Ok(c)) => Ok(Some(c)),
                Some(Err(e)) => {
                    let key = if a.credentials.is_some() {
                        "credentials"
                    } else if a.token_file.is_some() {
                        "token_file"
                    } else {
                        "api_key_env"
                    };
                    problems.push((format!("accounts[{i}].{key}"), format!("{e:#}")));
                    Err(())
                }
            };
            if let (Some(base), Ok(credential)) = (base, credential) {
                accounts.push(ResolvedAccount { config: a.clone(), base, credential });
            }
        }
        let mut fallbacks = Vec::new();
        for (i, f) in self.fallback.iter().enumerate() {
            let base =
                base_prefix(&f.base_url).map_err(|e| problems.push((format!("fallback[{i}].base_url"), e.to_string())));
            let key = match &f.api_key_env {
                None => Ok(None),
                Some(var) => std::env::var(var)
                    .with_context(|| format!("environment variable {var} is not set"))
                    .and_then(Secret::new)
                    .map(Some)
                    .map_err(|e| problems.push((format!("fallback[{i}].api_key_env"), format!("{e:#}")))),
            };
            if let (Ok(base), Ok(key)) = (base, key) {
                fallbacks.push(ResolvedFallback { base, key });
            }
        }
        if problems.is_empty() { Ok(Resolved { accounts, client_keys, admin, fallbacks }) } else { Err(problems) }
    }

    /// The resolution made when the file was loaded, or a fresh one (a config
    /// built in code); problems joined into one error.
    pub fn resolved(&self) -> Result<Arc<Resolved>> {
        if let Some(r) = &self.resolved {
            return Ok(r.clone());
        }
        self.resolve().map(Arc::new).map_err(|problems| {
            let lines: Vec<String> = problems.into_iter().map(|(key, msg)| format!("{key}: {msg}")).collect();
            anyhow::anyhow!("{}", lines.join("\n"))
        })
    }
}

fn client_key(k: &super::ClientKey) -> Result<[u8; 32]> {
    match (&k.sha256, &k.key_env) {
        (Some(h), None) => parse_hex(h).with_context(|| format!("(`{}`).sha256", k.name)),
        (None, Some(var)) => {
            let v =
                std::env::var(var).with_context(|| format!("(`{}`): environment variable {var} is not set", k.name))?;
            if v.trim().is_empty() {
                bail!("(`{}`): environment variable {var} is empty", k.name);
            }
            Ok(digest(v.trim()))
        }
        _ => bail!("(`{}`): give exactly one of sha256 or key_env", k.name),
    }
}

fn admin_token(server: &ServerConfig) -> Result<Option<[u8; 32]>> {
    match (&server.admin_token_env, &server.admin_token_sha256) {
        (None, None) => Ok(None),
        (Some(var), None) => {
            let v = std::env::var(var).with_context(|| format!("environment variable {var} is not set"))?;
            if v.trim().is_empty() {
                bail!("environment variable {var} is empty");
            }
            Ok(Some(digest(v.trim())))
        }
        (None, Some(h)) => Ok(Some(parse_hex(h).context("admin_token_sha256")?)),
        (Some(_), Some(_)) => bail!("give either admin_token_env or admin_token_sha256, not both"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClientKey;

    #[test]
    fn a_malformed_hash_is_refused_with_its_position() {
        let mut config = Config::default();
        config.server.client_keys.push(ClientKey {
            name: "x".into(),
            sha256: Some("abc".into()),
            key_env: None,
            ..Default::default()
        });
        let problems = config.resolve().err().unwrap();
        assert_eq!(problems[0].0, "server.client_keys[0]");
        assert!(problems[0].1.contains("(`x`).sha256"), "{problems:?}");
    }

    #[test]
    fn base_urls_are_normalised_and_refused_when_not_http() {
        assert_eq!(base_prefix("https://api.example.test/base/").unwrap(), "https://api.example.test/base");
        for bad in ["ftp://x", "not a url", "http://"] {
            assert!(base_prefix(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_disabled_account_keeps_its_secret_unread() {
        let mut config = Config::default();
        config.accounts.push(AccountConfig {
            id: "off".into(),
            api_key_env: Some("POOLGATE_TEST_UNSET_VARIABLE".into()),
            enabled: false,
            ..Default::default()
        });
        let r = config.resolve().unwrap();
        assert!(r.accounts[0].credential.is_none());
    }
}
