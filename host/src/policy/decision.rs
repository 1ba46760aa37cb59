//! The decision record: what the chain decided for one request, and why.

use serde::Serialize;

use super::breaker::BreakerStatus;
use super::fault::Fault;

/// The reason recorded when a stage failed and its input passed through.
pub const ROUTING_POLICY_ERROR: &str = "routing_policy_error";
/// The reason before any stage decided: pool order, usable accounts first.
pub const POOL_ORDER: &str = "pool_order";

/// What the chain decided for one request.
#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    /// Account ids, best first.
    pub order: Vec<String>,
    /// Why the head is first: the last stage that claimed it, or
    /// `routing_policy_error` when a failed stage's input passed through and no
    /// later stage decided.
    pub reason: String,
    /// Detail the deciding stage gave, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Every stage failure in this decision.
    pub policy_errors: Vec<PolicyError>,
    /// One record per stage, in chain order.
    pub stages: Vec<StageRecord>,
    /// Time spent in the whole chain, µs.
    pub duration_us: f64,
    /// The order as pool indices.
    #[serde(skip)]
    pub order_idx: Vec<u32>,
}

impl Decision {
    /// Whether any stage failed.
    pub fn has_policy_error(&self) -> bool {
        !self.policy_errors.is_empty()
    }
}

/// A failed stage, as recorded with `routing_policy_error`.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyError {
    /// The stage's name.
    pub stage: String,
    /// `trap`, `timeout`, `oom`, `invalid-output` or `error`.
    pub cause: super::fault::Cause,
    /// What happened.
    pub message: String,
}

/// What one stage did.
#[derive(Debug, Clone, Serialize)]
pub struct StageRecord {
    /// The stage's name.
    pub stage: String,
    /// The stage's own reason (empty: it did not claim the head).
    pub reason: String,
    /// The stage's detail line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The order after this stage (account ids).
    pub order: Vec<String>,
    /// Time spent in the stage, µs.
    pub duration_us: f64,
    /// The failure, if the stage failed (its input passed through).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Fault>,
    /// Set when the stage's breaker was open and the stage was skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bypassed: Option<BreakerStatus>,
    /// Set when the stage dropped every usable account and the host put them back.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub safety_valve: bool,
}
