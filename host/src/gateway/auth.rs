//! Who may call the gateway: client keys (stored as SHA-256, or read from the
//! environment) and the admin token. Keys are compared by hash in constant time
//! and never logged.

use anyhow::{Context, Result, bail};
use http::HeaderMap;
use sha2::{Digest, Sha256};

use crate::config::{ClientKey, ServerConfig};

/// SHA-256 of a key.
pub fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn parse_hex(hex_digest: &str) -> Result<[u8; 32]> {
    let bytes = hex::decode(hex_digest.trim()).context("not hex")?;
    bytes.try_into().map_err(|_| anyhow::anyhow!("not a SHA-256 (need 64 hex digits)"))
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The credential a client presented: `x-api-key`, else `Authorization: Bearer`.
pub fn presented(headers: &HeaderMap) -> Option<&str> {
    if let Some(k) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(k.trim());
    }
    let auth = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = auth.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The accepted client keys.
#[derive(Default, Clone)]
pub struct ClientKeys {
    keys: Vec<(String, [u8; 32])>,
}

impl ClientKeys {
    /// Resolves `[[server.client_keys]]`.
    pub fn from_config(keys: &[ClientKey]) -> Result<ClientKeys> {
        let mut out = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            let d = match (&k.sha256, &k.key_env) {
                (Some(h), None) => parse_hex(h).with_context(|| format!("[{i}] (`{}`).sha256", k.name))?,
                (None, Some(var)) => {
                    let v = std::env::var(var)
                        .with_context(|| format!("[{i}] (`{}`): environment variable {var} is not set", k.name))?;
                    if v.trim().is_empty() {
                        bail!("[{i}] (`{}`): environment variable {var} is empty", k.name);
                    }
                    digest(v.trim())
                }
                _ => bail!("[{i}] (`{}`): give exactly one of sha256 or key_env", k.name),
            };
            out.push((k.name.clone(), d));
        }
        Ok(ClientKeys { keys: out })
    }

    /// Keys given directly (the demo generates one).
    pub fn from_plain(named: &[(&str, &str)]) -> ClientKeys {
        ClientKeys { keys: named.iter().map(|(n, k)| (n.to_string(), digest(k))).collect() }
    }

    /// Whether any key is configured (no keys: the gateway is open).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The name of the key the request presents, if it is accepted.
    pub fn check(&self, headers: &HeaderMap) -> Option<&str> {
        let d = digest(presented(headers)?);
        self.keys.iter().find(|(_, k)| constant_time_eq(k, &d)).map(|(n, _)| n.as_str())
    }
}

/// The admin token (none: admin routes are closed).
#[derive(Default, Clone)]
pub struct AdminToken(Option<[u8; 32]>);

impl AdminToken {
    /// Resolves `server.admin_token_env` / `server.admin_token_sha256`.
    pub fn from_config(server: &ServerConfig) -> Result<AdminToken> {
        match (&server.admin_token_env, &server.admin_token_sha256) {
            (None, None) => Ok(AdminToken(None)),
            (Some(var), None) => {
                let v = std::env::var(var).with_context(|| format!("environment variable {var} is not set"))?;
                if v.trim().is_empty() {
                    bail!("environment variable {var} is empty");
                }
                Ok(AdminToken(Some(digest(v.trim()))))
            }
            (None, Some(h)) => Ok(AdminToken(Some(parse_hex(h).context("admin_token_sha256")?))),
            (Some(_), Some(_)) => bail!("give either admin_token_env or admin_token_sha256, not both"),
        }
    }

    /// A token given directly (the demo generates one).
    pub fn plain(token: &str) -> AdminToken {
        AdminToken(Some(digest(token)))
    }

    /// Whether admin routes are open at all.
    pub fn configured(&self) -> bool {
        self.0.is_some()
    }

    /// Whether the request carries the admin token.
    pub fn check(&self, headers: &HeaderMap) -> bool {
        match (&self.0, presented(headers)) {
            (Some(want), Some(got)) => constant_time_eq(want, &digest(got)),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_a_key_by_hash_from_either_header() {
        let keys = ClientKeys::from_config(&[ClientKey {
            name: "team".into(),
            sha256: Some(hex::encode(digest("s3cret"))),
            key_env: None,
        }])
        .unwrap();
        let mut h = HeaderMap::new();
        h.insert("x-api-key", "s3cret".parse().unwrap());
        assert_eq!(keys.check(&h), Some("team"));
        let mut h = HeaderMap::new();
        h.insert("authorization", "Bearer s3cret".parse().unwrap());
        assert_eq!(keys.check(&h), Some("team"));
        h.insert("authorization", "Bearer wrong".parse().unwrap());
        assert_eq!(keys.check(&h), None);
        assert_eq!(keys.check(&HeaderMap::new()), None);
    }

    #[test]
    fn a_malformed_hash_is_refused_with_its_position() {
        let err = ClientKeys::from_config(&[ClientKey { name: "x".into(), sha256: Some("abc".into()), key_env: None }])
            .err()
            .unwrap();
        assert!(format!("{err:#}").contains("[0] (`x`).sha256"), "{err:#}");
    }
}
