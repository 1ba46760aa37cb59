//! `[cooldowns]`: how long an account rests after each kind of upstream answer.
//! The plan itself — which answer means which cooldown — is the gateway's
//! (`learned::cooldown`); this is only its settings.

use serde::{Deserialize, Serialize};

/// Cooldown durations and ceilings. Every value is in ms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CooldownConfig {
    /// A bare 429 without quota headers, when it has no `retry-after`.
    pub transient_ms: u64,
    /// Longest `retry-after` honoured for a transient 429.
    pub transient_max_ms: u64,
    /// A unified `rejected` without `retry-after`.
    pub unified_ms: u64,
    /// A window that says exhausted but names no reset.
    pub window_without_reset_ms: u64,
    /// Ceiling of a weekly (7d) exhaustion.
    pub weekly_ceiling_ms: u64,
    /// Ceiling of a session (5h) exhaustion.
    pub session_ceiling_ms: u64,
    /// Ceiling of a per-model exhaustion.
    pub model_ceiling_ms: u64,
    /// Ceiling of a unified rejection.
    pub unified_ceiling_ms: u64,
    /// First backoff after a 529; doubles per consecutive 529.
    pub overloaded_ms: u64,
    /// Longest 529 backoff.
    pub overloaded_max_ms: u64,
    /// First backoff after a 5xx or a connection failure; doubles per consecutive one.
    pub upstream_error_ms: u64,
    /// Longest 5xx backoff.
    pub upstream_error_max_ms: u64,
    /// Consecutive streams cut after their first byte that cool the account
    /// (for the `upstream_error` backoff, escalating per further cut); 0 never.
    pub stream_cuts: u32,
    /// First auth cooldown after a 401/403; doubles per consecutive one.
    pub auth_ms: u64,
    /// Longest auth cooldown.
    pub auth_max_ms: u64,
}

const MINUTE: u64 = 60_000;
const HOUR: u64 = 60 * MINUTE;

impl Default for CooldownConfig {
    fn default() -> Self {
        CooldownConfig {
            transient_ms: 10_000,
            transient_max_ms: 15 * MINUTE,
            unified_ms: 15 * MINUTE,
            window_without_reset_ms: MINUTE,
            weekly_ceiling_ms: 7 * 24 * HOUR + 12 * HOUR,
            session_ceiling_ms: 5 * HOUR + 15 * MINUTE,
            model_ceiling_ms: 7 * 24 * HOUR + 12 * HOUR,
            unified_ceiling_ms: 12 * HOUR,
            overloaded_ms: 1_000,
            overloaded_max_ms: 30_000,
            upstream_error_ms: 2_000,
            upstream_error_max_ms: 60_000,
            stream_cuts: 3,
            auth_ms: MINUTE,
            auth_max_ms: 30 * MINUTE,
        }
    }
}
