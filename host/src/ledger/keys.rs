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
/// and in the store): every field optional. Flattened into the structs that
/// carry it, so it does not deny unknown fields itself: they do.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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

impl KeyLimits {
    /// These limits with every field `over` states put over them.
    pub fn merged(&self, over: &KeyLimits) -> KeyLimits {
        KeyLimits {
            models: over.models.clone().or_else(|| self.models.clone()),
            max_in_flight: over.max_in_flight.or(self.max_in_flight),
            requests_per_minute: over.requests_per_minute.or(self.requests_per_minute),
            tokens_per_minute: over.tokens_per_minute.or(self.tokens_per_minute),
            budget_tokens_day: over.budget_tokens_day.or(self.budget_tokens_day),
            budget_tokens_week: over.budget_tokens_week.or(self.budget_tokens_week),
            budget_tokens_month: over.budget_tokens_month.or(self.budget_tokens_month),
            budget_usd_day: over.budget_usd_day.or(self.budget_usd_day),
            budget_usd_week: over.budget_usd_week.or(self.budget_usd_week),
            budget_usd_month: over.budget_usd_month.or(self.budget_usd_month),
        }
    }
}

/// What creating or changing a key says about it (every field optional on
/// a change: what is left out stays). A field it does not know is refused
/// ([`KeySpec::parse`]): a misspelt budget must not pass as no budget.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct KeySpec {
    /// Its name (creating only).
    #[serde(default)]
    pub name: Option<String>,
    /// A team tag.
    #[serde(default)]
    pub team: Option<String>,
    /// Who holds it.
    #[serde(default)]
    pub owner: Option<String>,
    /// When it expires: ms since the epoch, `YYYY-MM-DD` or RFC 3339.
    #[serde(default)]
    pub expires: Option<String>,
    /// Its limits.
    #[serde(default, flatten)]
    pub limits: KeyLimits,
}

impl KeySpec {
    /// The fields of a JSON object, refusing any it does not know (serde's
    /// `deny_unknown_fields` does not combine with the flattened limits).
    pub fn parse(json: &[u8]) -> Result<KeySpec, String> {
        let value: serde_json::Value = serde_json::from_slice(json).map_err(|e| e.to_string())?;
        let limits = ["models", "max_in_flight", "requests_per_minute", "tokens_per_minute"]
            .into_iter()
            .chain(["budget_tokens_day", "budget_tokens_week", "budget_tokens_month"])
            .chain(["budget_usd_day", "budget_usd_week", "budget_usd_month"]);
        let fields: Vec<&str> = ["name", "team", "owner", "expires"].into_iter().chain(limits).collect();
        if let Some(unknown) =
            value.as_object().into_iter().flat_map(|o| o.keys()).find(|k| !fields.contains(&k.as_str()))
        {
            return Err(format!("unknown field `{unknown}`; known: {}", fields.join(", ")));
        }
        serde_json::from_value(value).map_err(|e| e.to_string())
    }
}

/// A new key from `spec` at `now_ms`, and its secret (shown once); refused,
/// with why, when its name is taken (by a key in `existing` or a config
/// key in `reserved`) or a field is wrong.
pub fn create(
    spec: &KeySpec,
    existing: &[KeyRecord],
    reserved: &[String],
    now_ms: u64,
) -> Result<(KeyRecord, String), String> {
    let name = spec.name.clone().ok_or("a key needs a name")?;
    if !valid_name(&name) {
        return Err(format!("`{name}` is not a key name: 1 to 64 of letters, digits, - _ . @"));
    }
    if name == "-" || reserved.contains(&name) || existing.iter().any(|k| k.name == name) {
        return Err(format!("a key named `{name}` exists already"));
    }
    let secret = new_secret().map_err(|e| format!("cannot make a key: {e:#}"))?;
    let record = KeyRecord {
        name,
        sha256: hex_digest(&secret),
        team: None,
        owner: None,
        expires_ms: None,
        revoked_ms: None,
        created_ms: now_ms,
        limits: KeyLimits::default(),
    };
    Ok((change(&record, spec)?, secret))
}

/// `key` changed as `spec` says (its name and secret stay).
pub fn change(key: &KeyRecord, spec: &KeySpec) -> Result<KeyRecord, String> {
    if spec.name.as_ref().is_some_and(|n| *n != key.name) {
        return Err("a key's name cannot change (create another, revoke this one)".into());
    }
    let limits = key.limits.merged(&spec.limits);
    let problems = limits.problems();
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    let expires_ms = match &spec.expires {
        Some(t) => Some(
            super::calendar::parse_time(t)
                .ok_or_else(|| format!("expires `{t}` is not a time (ms since the epoch, YYYY-MM-DD or RFC 3339)"))?,
        ),
        None => key.expires_ms,
    };
    Ok(KeyRecord {
        team: spec.team.clone().or_else(|| key.team.clone()),
        owner: spec.owner.clone().or_else(|| key.owner.clone()),
        expires_ms,
        limits,
        ..key.clone()
    })
}

/// The SHA-256 of `secret`, hex (as the store keeps keys).
pub fn hex_digest(secret: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(secret.as_bytes()))
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
    fn a_key_is_created_once_by_name_and_changed_field_by_field() {
        let spec = KeySpec {
            name: Some("ci".into()),
            team: Some("build".into()),
            limits: KeyLimits { budget_usd_day: Some(5.0), ..KeyLimits::default() },
            ..KeySpec::default()
        };
        let (key, secret) = create(&spec, &[], &[], 7).unwrap();
        assert_eq!((key.sha256.clone(), key.created_ms, key.team.as_deref()), (hex_digest(&secret), 7, Some("build")));
        assert!(create(&spec, std::slice::from_ref(&key), &[], 8).unwrap_err().contains("exists already"));
        assert!(create(&spec, &[], &["ci".into()], 8).unwrap_err().contains("exists already"), "a config key's name");
        let more = KeySpec {
            expires: Some("2027-01-01".into()),
            limits: KeyLimits { max_in_flight: Some(2), ..KeyLimits::default() },
            ..KeySpec::default()
        };
        let changed = change(&key, &more).unwrap();
        assert_eq!((changed.limits.budget_usd_day, changed.limits.max_in_flight), (Some(5.0), Some(2)));
        assert_eq!(changed.expires_ms, Some(1_798_761_600_000));
        assert_eq!(changed.sha256, key.sha256);
        let bad = KeySpec { expires: Some("soon".into()), ..KeySpec::default() };
        assert!(change(&key, &bad).unwrap_err().contains("`soon`"));
    }

    #[test]
    fn a_spec_with_a_field_it_does_not_know_is_refused() {
        let spec = KeySpec::parse(br#"{"name":"ci","budget_usd_day":5,"models":["claude-*"]}"#).unwrap();
        assert_eq!((spec.limits.budget_usd_day, spec.name.as_deref()), (Some(5.0), Some("ci")));
        let refused = KeySpec::parse(br#"{"name":"ci","budget_usd_daily":5}"#).unwrap_err();
        assert!(refused.starts_with("unknown field `budget_usd_daily`"), "{refused}");
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
