//! Who may call the gateway: client keys (stored as SHA-256, or read from the
//! environment) and the admin token. Keys are compared by hash in constant time
//! and never logged.

use http::HeaderMap;

use crate::config::digest;

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
    /// Team tags by key name.
    teams: std::collections::HashMap<String, String>,
    /// The limits of the keys that have any, by name.
    policies: std::collections::HashMap<String, crate::ledger::limits::KeyPolicy>,
}

impl ClientKeys {
    /// The accepted keys: (name, SHA-256), as the config resolved them.
    pub fn new(keys: Vec<(String, [u8; 32])>) -> ClientKeys {
        ClientKeys { keys, teams: Default::default(), policies: Default::default() }
    }

    /// With each key's limits (keys without any are left out).
    pub fn with_policies(
        self,
        policies: impl IntoIterator<Item = (String, crate::ledger::limits::KeyPolicy)>,
    ) -> ClientKeys {
        let policies = policies.into_iter().filter(|(_, p)| !p.is_open()).collect();
        ClientKeys { policies, ..self }
    }

    /// The limits of the key called `name`; `None` for a key without any.
    pub fn policy(&self, name: &str) -> Option<&crate::ledger::limits::KeyPolicy> {
        self.policies.get(name)
    }

    /// With team tags: (key name, team).
    pub fn with_teams(self, teams: std::collections::HashMap<String, String>) -> ClientKeys {
        ClientKeys { teams, ..self }
    }

    /// The team tag of the key called `name`, if it has one.
    pub fn team(&self, name: &str) -> Option<&str> {
        self.teams.get(name).map(String::as_str)
    }

    /// Keys given directly (the demo generates one).
    pub fn from_plain(named: &[(&str, &str)]) -> ClientKeys {
        ClientKeys::new(named.iter().map(|(n, k)| (n.to_string(), digest(k))).collect())
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
    /// The token's SHA-256, as the config resolved it (none: admin routes closed).
    pub fn new(digest: Option<[u8; 32]>) -> AdminToken {
        AdminToken(digest)
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
        let keys = ClientKeys::new(vec![("team".into(), digest("s3cret"))]);
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
}
