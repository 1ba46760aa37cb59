//! What `GET /status` shows of an account: its learned state, seat and
//! operator disable, as plain data for JSON.

use std::sync::atomic::Ordering;

use serde::Serialize;

use super::super::cooldown::Streaks;
use super::{AccountState, RuntimeDisable, with_seat};
use crate::account::{ModelGate, Status, WindowReading};
use crate::config::AccountConfig;

impl AccountState {
    /// Whether the account has read a unified status or a subscription
    /// window (`learned::pooled`): a cheap look, without a snapshot.
    pub fn has_unified(&self) -> bool {
        let l = self.learned.lock();
        l.status != Status::Unknown || l.windows.keys().any(|k| crate::learned::pooled::is_pooled_window(k))
    }

    /// The account's state for `/status`.
    pub fn status(&self, config: &AccountConfig, now: u64) -> AccountStatus {
        let seat = self.seat();
        let unusable = seat.as_ref().and_then(|s| s.unusable_until(now));
        let l = self.learned.lock();
        AccountStatus {
            id: self.id.clone(),
            alias: config.alias().to_string(),
            primary: config.primary,
            enabled: config.enabled,
            kind: format!("{:?}", config.kind).to_lowercase(),
            base_url: config.base_url().to_string(),
            in_flight: self.in_flight(),
            max_in_flight: config.max_in_flight,
            cooldown: with_seat(l.cooldown, unusable).filter(|c| c.until_ms > now).map(|c| CooldownStatus {
                reason: c.reason.as_str(),
                until_ms: c.until_ms,
                remaining_ms: c.until_ms - now,
            }),
            model_gates: l.model_gates.iter().filter(|g| g.until_ms > now).cloned().collect(),
            unified_status: l.status,
            unified_reset_ms: l.reset_ms,
            representative_claim: l.representative_claim.clone(),
            overage_status: l.overage_status,
            overage_disabled_reason: l.overage_disabled_reason.clone(),
            organization_id: l.organization_id.clone(),
            reading_age_ms: l.last_reading_ms.map(|t| now.saturating_sub(t)),
            windows: l.windows.values().cloned().collect(),
            streaks: l.effective_streaks(now),
            last_status: l.last_status,
            same_subscription_as: Vec::new(),
            oauth: seat.map(|s| s.status(now)),
            runtime_disabled: self.runtime_disabled(),
            attempts: self.attempts.load(Ordering::Relaxed),
            successes: self.successes.load(Ordering::Relaxed),
            overflow: false,
        }
    }
}

/// One account in `GET /status`.
#[derive(Debug, Clone, Serialize)]
pub struct AccountStatus {
    /// Id.
    pub id: String,
    /// Alias.
    pub alias: String,
    /// Primary?
    pub primary: bool,
    /// Enabled?
    pub enabled: bool,
    /// `apikey` or `oauth`.
    pub kind: String,
    /// Upstream.
    pub base_url: String,
    /// Requests in flight.
    pub in_flight: u32,
    /// In-flight limit.
    pub max_in_flight: Option<u32>,
    /// The cooldown in force.
    pub cooldown: Option<CooldownStatus>,
    /// Per-family gates in force.
    pub model_gates: Vec<ModelGate>,
    /// Top-level unified status.
    pub unified_status: Status,
    /// Unified reset.
    pub unified_reset_ms: Option<u64>,
    /// The binding window.
    pub representative_claim: Option<String>,
    /// Overage status.
    pub overage_status: Option<Status>,
    /// Why overage is disabled.
    pub overage_disabled_reason: Option<String>,
    /// The upstream organization.
    pub organization_id: Option<String>,
    /// Age of the newest quota reading.
    pub reading_age_ms: Option<u64>,
    /// Quota windows.
    pub windows: Vec<WindowReading>,
    /// Failure streaks.
    pub streaks: Streaks,
    /// Status of the last answer.
    pub last_status: Option<u16>,
    /// Other accounts whose answers come from the same organization: one
    /// subscription under two ids, drawing on one quota.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub same_subscription_as: Vec<String>,
    /// Tried only after every usable account that is not (the pool's
    /// generation says; `false` for an account out of the pool).
    pub overflow: bool,
    /// An OAuth seat's token: expiry, refreshes, identity, `needs_login`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oauth: Option<crate::oauth::SeatStatus>,
    /// Set while an operator has taken the account out of routing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_disabled: Option<RuntimeDisable>,
    /// Attempts sent.
    pub attempts: u64,
    /// Attempts answered 2xx.
    pub successes: u64,
}

/// A cooldown in `/status`.
#[derive(Debug, Clone, Serialize)]
pub struct CooldownStatus {
    /// Cause.
    pub reason: &'static str,
    /// End.
    pub until_ms: u64,
    /// Time left.
    pub remaining_ms: u64,
}

/// Fills in `same_subscription_as`: the accounts sharing an organization id.
pub fn mark_shared_subscriptions(accounts: &mut [AccountStatus]) {
    let orgs: Vec<(String, Option<String>)> =
        accounts.iter().map(|a| (a.id.clone(), a.organization_id.clone())).collect();
    for a in accounts.iter_mut() {
        let Some(org) = a.organization_id.as_deref() else { continue };
        a.same_subscription_as =
            orgs.iter().filter(|(id, o)| *id != a.id && o.as_deref() == Some(org)).map(|(id, _)| id.clone()).collect();
    }
}
