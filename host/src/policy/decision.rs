//! The decision record: what the chain decided for one request, and why.

use std::sync::Arc;

use serde::{Serialize, Serializer};

use super::breaker::{BreakerStatus, Phase};
use super::fault::Fault;

/// The reason recorded when a stage failed and its input passed through.
pub const ROUTING_POLICY_ERROR: &str = "routing_policy_error";
/// The reason before any stage decided: pool order, usable accounts first.
pub const POOL_ORDER: &str = "pool_order";

/// An order of accounts: pool indices, written out as the accounts' ids. Keeping
/// indices makes recording each stage's order cheap on the request path; the ids
/// are looked up only when a decision is serialized.
#[derive(Clone)]
pub struct Order {
    idx: Vec<u32>,
    ids: Arc<[String]>,
}

impl Order {
    /// An order of pool indices over the pool's `ids`.
    pub fn new(idx: Vec<u32>, ids: Arc<[String]>) -> Self {
        Order { idx, ids }
    }

    /// The pool indices.
    pub fn indices(&self) -> &[u32] {
        &self.idx
    }

    /// The id at position `i`.
    pub fn id(&self, i: usize) -> Option<&str> {
        self.idx.get(i).and_then(|&p| self.ids.get(p as usize)).map(String::as_str)
    }

    /// The ids in order.
    pub fn ids(&self) -> Vec<String> {
        (0..self.idx.len()).filter_map(|i| self.id(i).map(str::to_string)).collect()
    }

    /// The first account's id.
    pub fn head(&self) -> Option<&str> {
        self.id(0)
    }

    /// The ids joined with `sep` (for messages).
    pub fn join(&self, sep: &str) -> String {
        (0..self.idx.len()).map(|i| self.id(i).unwrap_or("?")).collect::<Vec<_>>().join(sep)
    }

    /// How many accounts.
    pub fn len(&self) -> usize {
        self.idx.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.idx.is_empty()
    }
}

impl std::fmt::Debug for Order {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries((0..self.idx.len()).map(|i| self.id(i).unwrap_or("?"))).finish()
    }
}

impl PartialEq<[&str]> for Order {
    fn eq(&self, other: &[&str]) -> bool {
        self.idx.len() == other.len() && (0..self.idx.len()).all(|i| self.id(i) == Some(other[i]))
    }
}

impl<const N: usize> PartialEq<[&str; N]> for Order {
    fn eq(&self, other: &[&str; N]) -> bool {
        self == &other[..]
    }
}

impl PartialEq<Vec<String>> for Order {
    fn eq(&self, other: &Vec<String>) -> bool {
        self.idx.len() == other.len() && (0..self.idx.len()).all(|i| self.id(i) == Some(other[i].as_str()))
    }
}

impl Serialize for Order {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq((0..self.idx.len()).map(|i| self.id(i).unwrap_or("?")))
    }
}

/// What the chain decided for one request.
#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    /// Account ids, best first.
    pub order: Order,
    /// Why the head is first: the last stage that claimed it, or
    /// `routing_policy_error` when a failed stage's input passed through and no
    /// later stage decided.
    pub reason: String,
    /// Detail the deciding stage gave, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Every stage failure in this decision (a stage bypassed by its breaker
    /// among them, with cause `bypassed`).
    pub policy_errors: Vec<PolicyError>,
    /// Failures outside any ranking since the previous decision: an `observe`
    /// that failed after its request was answered, or a new instance that could
    /// not be built. They did not affect this decision; they are here so that
    /// the record shows them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub background_errors: Vec<PolicyError>,
    /// One record per stage, in chain order.
    pub stages: Vec<StageRecord>,
    /// Time spent in the whole chain, µs.
    pub duration_us: f64,
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
    /// `rank`, `observe` or `configure`.
    pub phase: Phase,
    /// `trap`, `timeout`, `oom`, `invalid-output`, `error`, `host` or `bypassed`.
    pub cause: super::fault::Cause,
    /// What happened.
    pub message: String,
}

impl PolicyError {
    /// The record of `fault` in `phase` of `stage`.
    pub fn new(stage: &str, phase: Phase, fault: &Fault) -> Self {
        PolicyError { stage: stage.to_string(), phase, cause: fault.cause, message: fault.message.clone() }
    }
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
    pub order: Order,
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
