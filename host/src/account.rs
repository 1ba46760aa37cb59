//! The account model: what the gateway learns about an account — quota windows,
//! statuses, cooldowns, model gates — as plain data.
//!
//! Both the gateway (from live state) and `poolgate rank` (from a JSON case) build
//! [`AccountSnapshot`]s, so a case file reproduces exactly what a request saw.
//! Quota parsing, the cooldown plan and the account state all speak this model;
//! how it becomes the records a plugin receives is the policy runtime's business
//! (`policy::view`), which applies the rules every ranker relies on (a window
//! past its reset reads fresh; `usable` as defined here).

use serde::{Deserialize, Serialize};

/// Quota readings older than this are `stale` by default (neurolink's 15
/// minutes; the SDK's, so plugins and host agree).
pub const DEFAULT_FRESHNESS_MS: u64 = poolgate_sdk::quota::DEFAULT_FRESHNESS_MS;

/// A status as the upstream spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// `allowed`.
    Allowed,
    /// `allowed_warning`.
    AllowedWarning,
    /// `rejected` (or `throttled`, which every reference treats the same).
    #[serde(alias = "throttled")]
    Rejected,
    /// Not reported or not understood.
    #[default]
    Unknown,
}

impl Status {
    /// Parses a header value; anything unrecognised is `Unknown`.
    pub fn parse(s: &str) -> Status {
        let s = s.trim();
        let is = |name: &str| s.eq_ignore_ascii_case(name);
        if is("allowed") {
            Status::Allowed
        } else if is("allowed_warning") || is("allowed-warning") {
            Status::AllowedWarning
        } else if is("rejected") || is("throttled") {
            Status::Rejected
        } else {
            Status::Unknown
        }
    }
}

/// Why an account cools down (mirrors the WIT `cooldown-reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CooldownReason {
    /// The 7d window is exhausted.
    WeeklyExhausted,
    /// The 5h window is exhausted.
    SessionExhausted,
    /// A per-model bucket is exhausted (gates one family only).
    ModelExhausted,
    /// Unified status `rejected` without an exhausted window.
    UnifiedRejected,
    /// A bare 429: short burst limit.
    Transient,
    /// 529 / overloaded.
    Overloaded,
    /// 5xx or connect failure.
    UpstreamError,
    /// 401/403.
    Auth,
    /// Its answers were billed as extra usage and `[oauth] overage = "avoid"`:
    /// rested until its subscription windows reset.
    Overage,
    /// Disabled.
    Disabled,
}

impl CooldownReason {
    /// The snake_case name used in status, headers and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            CooldownReason::WeeklyExhausted => "weekly_exhausted",
            CooldownReason::SessionExhausted => "session_exhausted",
            CooldownReason::ModelExhausted => "model_exhausted",
            CooldownReason::UnifiedRejected => "unified_rejected",
            CooldownReason::Transient => "transient",
            CooldownReason::Overloaded => "overloaded",
            CooldownReason::UpstreamError => "upstream_error",
            CooldownReason::Auth => "auth",
            CooldownReason::Overage => "overage",
            CooldownReason::Disabled => "disabled",
        }
    }

    /// Every cause, for metrics that show each one, at zero when none is in force.
    pub const ALL: [CooldownReason; 10] = [
        CooldownReason::WeeklyExhausted,
        CooldownReason::SessionExhausted,
        CooldownReason::ModelExhausted,
        CooldownReason::UnifiedRejected,
        CooldownReason::Transient,
        CooldownReason::Overloaded,
        CooldownReason::UpstreamError,
        CooldownReason::Auth,
        CooldownReason::Overage,
        CooldownReason::Disabled,
    ];
}

/// An account-wide cooldown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cooldown {
    /// When it ends (ms since the epoch).
    pub until_ms: u64,
    /// Why.
    pub reason: CooldownReason,
}

/// A cooldown that gates one model family only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelGate {
    /// The gated family (`opus`, `sonnet`, `haiku`, `fable`, ...).
    pub family: String,
    /// When it ends.
    pub until_ms: u64,
}

/// One quota window reading.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowReading {
    /// `5h`, `7d`, `7d_<bucket>`, `overage`, `requests`, `tokens`, ...
    pub name: String,
    /// Fraction used; may exceed 1.0.
    pub utilization: f64,
    /// Reset time, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resets_at_ms: Option<u64>,
    /// The window's status.
    #[serde(default)]
    pub status: Status,
    /// When it was read; a case file may leave it out to mean "now".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at_ms: Option<u64>,
}

impl Clone for WindowReading {
    fn clone(&self) -> Self {
        let mut copy = WindowReading {
            name: String::new(),
            utilization: 0.0,
            resets_at_ms: None,
            status: Status::Unknown,
            observed_at_ms: None,
        };
        copy.clone_from(self);
        copy
    }

    /// Into the name's own buffer: a window updated by every answer keeps
    /// its name's allocation (`learned::accounts`, #30).
    fn clone_from(&mut self, source: &Self) {
        let WindowReading { name, utilization, resets_at_ms, status, observed_at_ms } = source;
        self.name.clone_from(name);
        (self.utilization, self.resets_at_ms, self.status, self.observed_at_ms) =
            (*utilization, *resets_at_ms, *status, *observed_at_ms);
    }
}

/// Everything the chain knows about one account at one moment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountSnapshot {
    /// The operator's id.
    pub id: String,
    /// Display alias (defaults to the id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// The configured primary.
    #[serde(default)]
    pub primary: bool,
    /// Overrides the derived usability (for cases that want to state it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usable: Option<bool>,
    /// Disabled by the operator or a durable error.
    #[serde(default)]
    pub disabled: bool,
    /// The account-wide cooldown, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooldown: Option<Cooldown>,
    /// Per-model-family cooldowns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub model_gates: Vec<ModelGate>,
    /// Requests in flight.
    #[serde(default)]
    pub in_flight: u32,
    /// In-flight limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    /// Top-level unified status.
    #[serde(default)]
    pub status: Status,
    /// Unified reset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resets_at_ms: Option<u64>,
    /// Quota windows.
    #[serde(default)]
    pub windows: Vec<WindowReading>,
}

impl AccountSnapshot {
    /// The alias, or the id when none is set.
    pub fn alias(&self) -> &str {
        self.alias.as_deref().unwrap_or(&self.id)
    }

    /// The active account-wide cooldown at `now`.
    pub fn active_cooldown(&self, now: u64) -> Option<Cooldown> {
        if self.disabled {
            return Some(Cooldown { until_ms: u64::MAX, reason: CooldownReason::Disabled });
        }
        self.cooldown.filter(|c| c.until_ms > now)
    }

    /// The model gate that applies to `family` at `now`.
    pub fn active_gate(&self, family: Option<&str>, now: u64) -> Option<&ModelGate> {
        let family = family?;
        self.model_gates.iter().find(|g| g.family == family && g.until_ms > now)
    }

    /// Whether the gateway would send a request for model `family` here at `now`.
    pub fn usable(&self, family: Option<&str>, now: u64) -> bool {
        self.usable.unwrap_or_else(|| self.active_cooldown(now).is_none() && self.active_gate(family, now).is_none())
    }
}

/// The model family of a model id, by substring (dario's `modelFamily()`): the
/// SDK's, so that a model gate and a plugin's bucket agree on the family.
pub use poolgate_sdk::quota::model_family;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cooldown_cause_is_in_all_once() {
        // A new cause fails to compile here until it is given the next
        // place: give it one in ALL too (the metrics show every cause in
        // ALL, at zero), and the next number below.
        let place = |r: CooldownReason| match r {
            CooldownReason::WeeklyExhausted => 0,
            CooldownReason::SessionExhausted => 1,
            CooldownReason::ModelExhausted => 2,
            CooldownReason::UnifiedRejected => 3,
            CooldownReason::Transient => 4,
            CooldownReason::Overloaded => 5,
            CooldownReason::UpstreamError => 6,
            CooldownReason::Auth => 7,
            CooldownReason::Overage => 8,
            CooldownReason::Disabled => 9,
        };
        let places: Vec<usize> = CooldownReason::ALL.iter().map(|r| place(*r)).collect();
        assert_eq!(places, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn model_gate_blocks_only_its_family() {
        let a = AccountSnapshot {
            id: "a".into(),
            model_gates: vec![ModelGate { family: "fable".into(), until_ms: 1000 }],
            ..Default::default()
        };
        assert!(!a.usable(Some("fable"), 500));
        assert!(a.usable(Some("opus"), 500));
        assert!(a.usable(None, 500));
        assert!(a.usable(Some("fable"), 1000));
    }
}
