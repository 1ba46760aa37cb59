//! The plain-data view of an account that the chain ranks, and the one place it is
//! turned into the WIT record.
//!
//! Both the gateway (from live state) and `poolgate rank` (from a JSON case) build
//! [`AccountSnapshot`]s, so a case file reproduces exactly what a request saw. The
//! conversion applies the rules every ranker relies on:
//! - a window whose reset has passed reads as fresh: 0 used, `allowed`
//!   (neurolink's reset-freshening; dario v6.0.46), and so does an account-level
//!   `rejected` whose reset has passed — so a stale reading never strands a seat;
//! - `usable` = not cooling, not disabled, and not gated for the request's model
//!   family, unless the snapshot overrides it.

use serde::{Deserialize, Serialize};

use crate::policy::bindings as wit;
use crate::policy::names;

/// Quota readings older than this are `stale` by default (neurolink's 15 minutes).
pub const DEFAULT_FRESHNESS_MS: u64 = 15 * 60 * 1000;

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

    fn to_wit(self) -> wit::WindowStatus {
        match self {
            Status::Allowed => wit::WindowStatus::Allowed,
            Status::AllowedWarning => wit::WindowStatus::AllowedWarning,
            Status::Rejected => wit::WindowStatus::Rejected,
            Status::Unknown => wit::WindowStatus::Unknown,
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
            CooldownReason::Disabled => "disabled",
        }
    }

    fn to_wit(self) -> wit::CooldownReason {
        use wit::CooldownReason as W;
        match self {
            CooldownReason::WeeklyExhausted => W::WeeklyExhausted,
            CooldownReason::SessionExhausted => W::SessionExhausted,
            CooldownReason::ModelExhausted => W::ModelExhausted,
            CooldownReason::UnifiedRejected => W::UnifiedRejected,
            CooldownReason::Transient => W::Transient,
            CooldownReason::Overloaded => W::Overloaded,
            CooldownReason::UpstreamError => W::UpstreamError,
            CooldownReason::Auth => W::Auth,
            CooldownReason::Disabled => W::Disabled,
        }
    }
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowReading {
    /// "5h", "7d", "7d_<bucket>", "overage", "requests", "tokens", ...
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

    /// The pool entry handed to `configure`.
    pub fn info(&self) -> wit::AccountInfo {
        wit::AccountInfo { id: self.id.clone(), alias: self.alias().to_string(), primary: self.primary }
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

    /// The WIT record for pool index `index`, as a request for `family` at `now`
    /// sees it; the account's windows are appended to `windows`.
    pub fn to_wit(
        &self,
        index: u32,
        family: Option<&str>,
        now: u64,
        freshness_ms: u64,
        windows: &mut Vec<wit::QuotaWindow>,
    ) -> wit::Account {
        let mut newest: Option<u64> = None;
        for w in &self.windows {
            let observed = w.observed_at_ms.unwrap_or(now);
            newest = Some(newest.map_or(observed, |n: u64| n.max(observed)));
            let rolled_over = w.resets_at_ms.is_some_and(|r| r <= now);
            windows.push(wit::QuotaWindow {
                account: index,
                kind: window_kind(&w.name),
                name: names::intern(&w.name),
                utilization: if rolled_over { 0.0 } else { w.utilization },
                resets_at_ms: w.resets_at_ms,
                status: if rolled_over { wit::WindowStatus::Allowed } else { w.status.to_wit() },
                observed_at_ms: observed,
            });
        }
        let status = match self.resets_at_ms {
            Some(r) if r <= now && self.status == Status::Rejected => Status::Allowed,
            _ => self.status,
        };
        // A model gate shows as a cooldown for this request only.
        let cooling = self.active_cooldown(now).or_else(|| {
            self.active_gate(family, now)
                .map(|g| Cooldown { until_ms: g.until_ms, reason: CooldownReason::ModelExhausted })
        });
        wit::Account {
            id: index,
            primary: self.primary,
            usable: self.usable(family, now),
            cooldown: cooling.map(|c| wit::Cooldown { until_ms: c.until_ms, reason: c.reason.to_wit() }),
            in_flight: self.in_flight,
            max_in_flight: self.max_in_flight,
            status: status.to_wit(),
            resets_at_ms: self.resets_at_ms,
            quota_freshness: match newest {
                None => wit::Freshness::Unknown,
                Some(t) if now.saturating_sub(t) <= freshness_ms => wit::Freshness::Fresh,
                Some(_) => wit::Freshness::Stale,
            },
        }
    }
}

/// The kind of a window by its name.
pub fn window_kind(name: &str) -> wit::WindowKind {
    use wit::WindowKind as K;
    match name {
        "5h" => K::FiveHour,
        "7d" => K::SevenDay,
        "overage" => K::Overage,
        "requests" => K::Requests,
        "tokens" | "input_tokens" | "output_tokens" | "input-tokens" | "output-tokens" => K::Tokens,
        n if n.starts_with("7d_") => K::SevenDayModel,
        _ => K::Other,
    }
}

/// The model family of a model id, by substring (dario's `modelFamily()`).
pub fn model_family(model: &str) -> Option<&'static str> {
    let m = model.to_ascii_lowercase();
    ["opus", "sonnet", "haiku", "fable"].into_iter().find(|f| m.contains(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(name: &str, u: f64, reset: Option<u64>, status: Status) -> WindowReading {
        WindowReading { name: name.into(), utilization: u, resets_at_ms: reset, status, observed_at_ms: Some(0) }
    }

    #[test]
    fn a_window_past_its_reset_reads_fresh() {
        let a = AccountSnapshot {
            id: "a".into(),
            windows: vec![
                window("5h", 1.02, Some(100), Status::Rejected),
                window("7d", 0.5, Some(10_000), Status::Allowed),
            ],
            status: Status::Rejected,
            resets_at_ms: Some(100),
            ..Default::default()
        };
        let mut ws = Vec::new();
        let w = a.to_wit(0, None, 100, DEFAULT_FRESHNESS_MS, &mut ws);
        assert_eq!(ws[0].utilization, 0.0);
        assert_eq!(ws[0].status, wit::WindowStatus::Allowed);
        assert_eq!(ws[1].utilization, 0.5);
        assert_eq!(w.status, wit::WindowStatus::Allowed);
        ws.clear();
        let before = a.to_wit(0, None, 99, DEFAULT_FRESHNESS_MS, &mut ws);
        assert_eq!(ws[0].utilization, 1.02);
        assert_eq!(before.status, wit::WindowStatus::Rejected);
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
        let w = a.to_wit(0, Some("fable"), 500, DEFAULT_FRESHNESS_MS, &mut Vec::new());
        assert_eq!(w.cooldown.map(|c| c.reason), Some(wit::CooldownReason::ModelExhausted));
    }

    #[test]
    fn freshness_follows_the_newest_reading() {
        let mut a = AccountSnapshot { id: "a".into(), ..Default::default() };
        let fresh = |a: &AccountSnapshot, now| a.to_wit(0, None, now, 1000, &mut Vec::new()).quota_freshness;
        assert_eq!(fresh(&a, 0), wit::Freshness::Unknown);
        a.windows.push(window("5h", 0.1, None, Status::Allowed));
        assert_eq!(fresh(&a, 1000), wit::Freshness::Fresh);
        assert_eq!(fresh(&a, 1001), wit::Freshness::Stale);
    }

    #[test]
    fn window_kinds_by_name() {
        assert_eq!(window_kind("7d_oi"), wit::WindowKind::SevenDayModel);
        assert_eq!(window_kind("5h"), wit::WindowKind::FiveHour);
        assert_eq!(window_kind("weird"), wit::WindowKind::Other);
    }
}
