//! Client keys managed at run time — `poolgate keys create|list|update|revoke`
//! and `/admin/keys` — kept in the ledger's store beside the usage they
//! account for, so every replica on one store sees the same keys.
//!
//! A key is stored as its SHA-256 only: the key itself is shown once, when it
//! is created, and never again. A revoked key is kept (its usage stays
//! attributed to its name) and refused; an expired one is refused from its
//! expiry on.

use serde::{Deserialize, Serialize};

use super::calendar::Period;
use super::limits::{Amount, Budget, KeyPolicy};

/// What a key may do, as it is written (in the config's `[[server.client_keys]]`
/// and in the store): every field optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyLimits {
    /// The models it may ask for: names or `prefix*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// Most requests in flight at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    /// Most requests started in any 60 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u32>,
    /// Most tokens (every kind) answered in any 60 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u64>,
    /// Tokens per UTC day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_tokens_day: Option<u64>,
    /// Tokens per ISO week.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_tokens_week: Option<u64>,
    /// Tokens per calendar month.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_tokens_month: Option<u64>,
    /// USD per UTC day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_usd_day: Option<f64>,
    /// USD per ISO week.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_usd_week: Option<f64>,
    /// USD per calendar month.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_usd_month: Option<f64>,
}

impl KeyLimits {
    /// The policy these limits make.
    pub fn policy(&self) -> KeyPolicy {
        let mut budgets = Vec::new();
        for (period, tokens, usd) in [
            (Period::Day, self.budget_tokens_day, self.budget_usd_day),
            (Period::Week, self.budget_tokens_week, self.budget_usd_week),
            (Period::Month, self.budget_tokens_month, self.budget_usd_month),
        ] {
            budgets.extend(tokens.map(|t| Budget { period, amount: Amount::Tokens(t) }));
            budgets.extend(usd.map(|u| Budget { period, amount: Amount::NanoUsd((u * 1e9).round() as u64) }));
        }
        KeyPolicy {
            models: self.models.clone().unwrap_or_default(),
            max_in_flight: self.max_in_flight,
            requests_per_minute: self.requests_per_minute,
            tokens_per_minute: self.tokens_per_minute,
            budgets,
        }
    }

    /// What is wrong with these limits, if anything (a model pattern that is
    /// not a name or `prefix*`, a budget that is negative or not a number,
    /// a limit of 0).
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for m in self.models.iter().flatten() {
            let stars = m.matches('*').count();
            if m.is_empty() || stars > 1 || (stars == 1 && !m.ends_with('*')) {
                out.push(format!("models: `{m}` is not a model name or `prefix*`"));
            }
        }
        for (name, v) in [
            ("max_in_flight", self.max_in_flight.map(u64::from)),
            ("requests_per_minute", self.requests_per_minute.map(u64::from)),
            ("tokens_per_minute", self.tokens_per_minute),
        ] {
            if v == Some(0) {
                out.push(format!("{name}: 0 would refuse every request (leave it out for no limit)"));
            }
        }
        for (name, v) in [
            ("budget_usd_day", self.budget_usd_day),
            ("budget_usd_week", self.budget_usd_week),
            ("budget_usd_month", self.budget_usd_month),
        ] {
            if v.is_some_and(|v| !v.is_finite() || v < 0.0) {
                out.push(format!("{name}: not an amount of USD"));
            }
        }
        out
    }
}

/// A key managed at run time, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// Its name: in logs, records, metrics and reports (unique, and never a
    /// config key's).
    pub name: String,
    /// The key's SHA-256, hex.
    pub sha256: String,
    /// A team tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// Who holds it (a person, a job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Refused from this time on (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
    /// Refused since this time (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_ms: Option<u64>,
    /// When it was created.
    pub created_ms: u64,
    /// What it may do.
    #[serde(default)]
    pub limits: KeyLimits,
}

impl KeyRecord {
    /// Why the key is refused at `now_ms`, if it is.
    pub fn refused(&self, now_ms: u64) -> Option<String> {
        if let Some(at) = self.revoked_ms {
            return Some(format!("this client key was revoked at {}", super::calendar::rfc3339(at)));
        }
        match self.expires_ms {
            Some(at) if at <= now_ms => Some(format!("this client key expired at {}", super::calendar::rfc3339(at))),
            _ => None,
        }
    }
}

/// A new key: `pg-` and 32 random bytes in hex.
pub fn new_secret() -> anyhow::Result<String> {
    Ok(format!("pg-{}", crate::random::random_hex(32)?))
}

/// Whether `name` can name a key: 1–64 of letters, digits, `-`, `_`, `.`, `@`
/// (it appears in logs, metrics labels and CSV).
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revoked_or_expired_key_says_since_when() {
        let mut k = KeyRecord {
            name: "ci".into(),
            sha256: "ab".into(),
            team: None,
            owner: None,
            expires_ms: Some(1_764_547_200_000),
            revoked_ms: None,
            created_ms: 0,
            limits: KeyLimits::default(),
        };
        assert_eq!(k.refused(1_764_547_199_999), None);
        assert_eq!(k.refused(1_764_547_200_000).unwrap(), "this client key expired at 2025-12-01T00:00:00Z");
        k.revoked_ms = Some(5_000);
        assert!(k.refused(0).unwrap().contains("revoked at 1970-01-01T00:00:05Z"));
    }

    #[test]
    fn limits_say_what_is_wrong_and_names_are_label_safe() {
        let limits = KeyLimits {
            models: Some(vec!["claude-*-x".into()]),
            max_in_flight: Some(0),
            budget_usd_day: Some(-1.0),
            ..KeyLimits::default()
        };
        assert_eq!(limits.problems().len(), 3, "{:?}", limits.problems());
        assert!(valid_name("ci-bot.build@team_a"));
        assert!(!valid_name("") && !valid_name("a b") && !valid_name("x\"y") && !valid_name(&"a".repeat(65)));
        assert!(new_secret().unwrap().starts_with("pg-") && new_secret().unwrap().len() == 67);
    }
}
