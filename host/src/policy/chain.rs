//! The chain: where a request's account order is decided.
//!
//! Stage 1 sees the pool order with usable accounts first; every later stage sees
//! the order the previous one left. A stage may reorder and drop, but its answer
//! must be a permutation of a non-empty subset of what it received, and the host
//! checks every answer. A stage that fails in any way — trap, deadline, memory,
//! `Err`, an invalid answer, a failure of the host while serving it — is skipped:
//! its input passes through and the decision records `routing_policy_error` with
//! the stage and the cause. The request is still served. A stage whose breaker
//! is open is skipped the same way, with cause `bypassed`, so a broken policy
//! never looks healthy. And whatever the stages do, the chain never drops every
//! usable account (the last-path safety valve).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};

use super::bindings::{Account, AccountInfo, Outcome, QuotaWindow, Ranking, Request};
use super::breaker::{Admit, BreakerConfig, BreakerStatus, Phase, Ticket};
use super::calls::{CallThreads, Run};
use super::decision::{Decision, Order, POOL_ORDER, PolicyError, ROUTING_POLICY_ERROR, StageRecord};
use super::engine::PolicyEngine;
use super::events::{BusyShare, FaultSink, HighWater, PhaseHealth, RECENT_RANKS, StageEvents};
use super::fault::{Cause, Fault, escape_controls};
use super::plugin::{Plugin, PluginSpec};
use super::pool::{CallTimes, PoolStatus};
use super::state::StateStore;

/// What the chain ranks: the candidate accounts (each `id` a pool index) and
/// every window of every candidate.
#[derive(Debug, Clone, Default)]
pub struct Candidates {
    /// The accounts, in pool order.
    pub accounts: Vec<Account>,
    /// Their quota windows, grouped by account.
    pub windows: Vec<QuotaWindow>,
}

/// One stage to load.
#[derive(Debug, Clone)]
pub struct StageSpec {
    /// The stage's name in decisions, status and metrics.
    pub name: String,
    /// The plugin and its options.
    pub plugin: PluginSpec,
}

struct Stage {
    name: String,
    /// Shared with the next generation's chain when a reload leaves the
    /// stage as it was.
    plugin: Arc<Plugin>,
    events: Arc<StageEvents>,
}

/// A loaded chain, shared by every request of one configuration generation.
pub struct Chain {
    stages: Vec<Stage>,
    calls: Arc<CallThreads>,
    pool: Arc<Vec<AccountInfo>>,
    ids: Arc<[String]>,
}

/// A stage's health, for `/status`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StageStatus {
    /// The stage's name.
    pub name: String,
    /// `builtin:<name>` or the component's path.
    pub plugin: String,
    /// SHA-256 of the component.
    pub sha256: String,
    /// The breaker.
    pub breaker: BreakerStatus,
    /// Warm instances the pool keeps (`[policy] instances`).
    pub instances: usize,
    /// Warm instances ready for reuse.
    pub idle_instances: usize,
    /// Instances alive (idle, in a call, or being built).
    pub live_instances: usize,
    /// Memory held by the idle instances, bytes.
    pub idle_memory_bytes: usize,
    /// How long its calls hold an instance, on average (ms): with
    /// `instances`, what decides whether a request finds one free.
    pub call_ms: CallTimes,
    /// The pool's size under demand and its `observe` queue (see [`super::pool`]).
    pub pool: PoolStatus,
    /// How many of its last `rank` calls were skipped as `busy`.
    pub busy_share: BusyShare,
    /// Set while the stage is skipped as `busy` for most requests: what that
    /// means and what to do (the last busy message says the measured cause).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// Failures of `rank`, since the stage was loaded.
    pub rank: PhaseHealth,
    /// Failures of `observe`.
    pub observe: PhaseHealth,
    /// Failures to build (instantiate and configure) a new instance.
    pub configure: PhaseHealth,
    /// The most fuel one call burned and the most memory one instance held.
    pub high_water: HighWater,
}

impl Stage {
    /// Calls the stage's `rank` when its breaker admits the call; a bypass is
    /// a fault, marked in `record`. `ticket` lives in the caller's frame, so
    /// that dropping the request mid-call still hands a probe back.
    async fn call_rank<'s>(
        &'s self,
        req: &mut Request,
        current: &[Account],
        windows: &[QuotaWindow],
        reason: &str,
        record: &mut StageRecord,
        ticket: &mut Option<Ticket<'s>>,
    ) -> Result<Ranking, Fault> {
        match self.events.breaker.admit(req.now_ms) {
            Admit::Bypass(until) => {
                record.bypassed = Some(self.events.breaker.status(req.now_ms));
                Err(Fault::new(
                    Cause::Bypassed,
                    format!("its breaker is open after repeated failures; next probe at {until} ms"),
                ))
            }
            Admit::Call(t) => {
                *ticket = Some(t);
                // Into the previous stage's buffer: one copy per request,
                // not one per stage.
                let by = req.decided_by.get_or_insert_with(String::new);
                by.clear();
                by.push_str(reason);
                let outcome = self
                    .plugin
                    .rank(req, current, windows)
                    .await
                    .and_then(|r| validate_answer(&r, current.len()).map(|()| r));
                if outcome.is_ok() {
                    self.events.succeeded(Phase::Rank, req.now_ms, ticket.take());
                }
                outcome
            }
        }
    }

    /// Counts a failed `rank` against the stage (breaker, metrics), says why a
    /// busy stage is busy, and logs the skip unless the breaker bypassed it.
    fn rank_failed(&self, mut fault: Fault, now_ms: u64, ticket: Option<Ticket<'_>>) -> Fault {
        self.events.failed(Phase::Rank, &fault, now_ms, ticket);
        if fault.cause == Cause::Busy
            && let Some(w) = mostly_busy(&self.name, self.events.busy_share())
        {
            fault.message = format!("{w}; {}", fault.message);
        }
        if fault.cause != Cause::Bypassed {
            tracing::warn!(stage = %self.name, cause = fault.cause.as_str(), message = %fault.message, "routing_policy_error: stage skipped");
        }
        fault
    }
}

impl Chain {
    /// Loads every stage; the error names the stage that could not be loaded.
    pub async fn load(
        engine: &Arc<PolicyEngine>,
        specs: Vec<StageSpec>,
        pool: Vec<AccountInfo>,
        state: Arc<dyn StateStore>,
        breaker: BreakerConfig,
    ) -> Result<Chain> {
        Self::load_reusing(engine, specs, pool, state, breaker, None).await
    }

    /// As [`Chain::load`], keeping every stage of `previous` that the new
    /// configuration leaves as it was: same name, plugin bytes, options,
    /// scope, limits, instances, breaker settings and pool. A kept stage keeps
    /// its warm instances and its breaker; nothing of it is configured again —
    /// so a reload that changes an account's settings, or none at all (a file
    /// saved twice), never waits for a plugin's `configure`.
    pub async fn load_reusing(
        engine: &Arc<PolicyEngine>,
        specs: Vec<StageSpec>,
        pool: Vec<AccountInfo>,
        state: Arc<dyn StateStore>,
        breaker: BreakerConfig,
        previous: Option<&Chain>,
    ) -> Result<Chain> {
        let mut stages = Vec::with_capacity(specs.len());
        for (i, spec) in specs.into_iter().enumerate() {
            let context = || format!("policy.chain[{i}] (`{}`)", spec.name);
            super::loading::stage(i, &spec.name);
            let read = Plugin::read(&spec.plugin.plugin).await.with_context(context)?;
            let kept = previous.and_then(|p| {
                p.stages.iter().find(|s| {
                    s.name == spec.name
                        && s.events.breaker.config() == breaker
                        && s.plugin.is_built_from(&spec.plugin, &read.1, &pool)
                })
            });
            if let Some(kept) = kept {
                stages.push(Stage { name: spec.name, plugin: kept.plugin.clone(), events: kept.events.clone() });
                continue;
            }
            let events = StageEvents::new(&spec.name, breaker);
            let plugin = Plugin::load_with(engine, spec.plugin, read, pool.clone(), state.clone(), events.clone())
                .await
                .with_context(context)?;
            stages.push(Stage { name: spec.name, plugin: Arc::new(plugin), events });
        }
        let ids = pool.iter().map(|a| a.id.clone()).collect();
        Ok(Chain { stages, calls: engine.calls().clone(), pool: Arc::new(pool), ids })
    }

    /// Reports every stage failure from now on to `sink` (the gateway's metrics).
    pub fn set_sink(&self, sink: FaultSink) {
        for s in &self.stages {
            s.events.set_sink(sink.clone());
        }
    }

    /// The pool table the chain was configured with.
    pub fn pool(&self) -> &[AccountInfo] {
        &self.pool
    }

    /// How many stages the chain has.
    pub fn len(&self) -> usize {
        self.stages.len()
    }

    /// Whether the chain has no stages (then the order is the pool order).
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// The stages' names, in chain order.
    pub fn stage_names(&self) -> impl Iterator<Item = &str> {
        self.stages.iter().map(|s| s.name.as_str())
    }

    /// The state scopes its stages use.
    pub fn scopes(&self) -> Vec<&str> {
        self.stages.iter().map(|s| s.plugin.scope()).collect()
    }

    /// Each stage's health.
    pub fn status(&self, now_ms: u64) -> Vec<StageStatus> {
        self.stages
            .iter()
            .map(|s| StageStatus {
                name: s.name.clone(),
                plugin: s.plugin.label().to_string(),
                sha256: s.plugin.sha256().to_string(),
                breaker: s.events.breaker.status(now_ms),
                instances: s.plugin.target_instances(),
                idle_instances: s.plugin.idle_instances(),
                live_instances: s.plugin.live_instances(),
                idle_memory_bytes: s.plugin.idle_memory_bytes(),
                call_ms: s.plugin.call_times(),
                pool: s.plugin.pool_status(),
                busy_share: s.events.busy_share(),
                warning: mostly_busy(&s.name, s.events.busy_share()).map(|w| {
                    format!("{w}: the stage is off in effect though its breaker is closed; see `rank.last_busy`")
                }),
                rank: s.events.health(Phase::Rank),
                observe: s.events.health(Phase::Observe),
                configure: s.events.health(Phase::Configure),
                high_water: s.events.high_water(),
            })
            .collect()
    }

    /// The plugin (`builtin:<name>` or its path) and SHA-256 of stage
    /// `name`, and its breaker's state now: what a trace's stage span says.
    pub fn stage_facts(&self, name: &str, now_ms: u64) -> Option<(&str, &str, &'static str)> {
        let s = self.stages.iter().find(|s| s.name == name)?;
        Some((s.plugin.label(), s.plugin.sha256(), s.events.breaker.status(now_ms).state))
    }

    /// Whether any stage has a call running (an instance alive that is not
    /// idle): an `observe` left running after its request, or a build.
    pub fn calls_running(&self) -> bool {
        self.stages.iter().any(|s| s.plugin.live_instances() != s.plugin.idle_instances())
    }

    fn order(&self, accounts: &[Account]) -> Order {
        Order::new(accounts.iter().map(|a| a.id).collect(), self.ids.clone())
    }

    /// Decides the order of `candidates` for `req`, as [`Chain::rank`] does,
    /// on the request's thread while no call waits and on the call threads
    /// from the first that does (see [`super::calls`]): what the gateway
    /// calls for every request.
    pub fn decide(self: &Arc<Self>, req: Request, candidates: Candidates) -> Run<'_, Decision> {
        let chain = self.clone();
        self.calls.run(move || async move { chain.rank(req, candidates).await })
    }

    /// Tells every stage how a request ended, as [`Chain::observe`] does,
    /// without waiting: the calls run at once when they finish in one go
    /// (microseconds: the common case), so that what they store — an affinity
    /// binding — is in place before the client can send its next request; a
    /// call that has to wait goes on on the call threads.
    pub fn observe_detached(self: &Arc<Self>, req: Request, account: u32, outcome: Outcome) {
        let chain = self.clone();
        self.calls.detach(async move {
            chain.observe(&req, account, &outcome).await;
        });
    }

    /// Decides the order of `candidates` for `req`, on the caller's thread.
    pub async fn rank(&self, mut req: Request, candidates: Candidates) -> Decision {
        let started = crate::clock::machine_instant();
        let Candidates { accounts, windows } = candidates;
        let mut current = initial_order(accounts);
        let mut reason = POOL_ORDER.to_string();
        let mut detail = None;
        let mut policy_errors = Vec::new();
        let mut background_errors = Vec::new();
        let mut records = Vec::with_capacity(self.stages.len());

        for stage in &self.stages {
            stage.events.take_pending(&mut background_errors);
            if current.is_empty() {
                break;
            }
            let t0 = crate::clock::machine_instant();
            let mut record = StageRecord {
                stage: stage.name.clone(),
                reason: String::new(),
                detail: None,
                order: Order::new(Vec::new(), self.ids.clone()),
                duration_us: 0.0,
                error: None,
                bypassed: None,
                safety_valve: false,
            };
            // The breaker's ticket lives as long as the call: if this future is
            // dropped mid-call (the request went away), dropping it hands a
            // probe back to the breaker.
            let mut ticket = None;
            let outcome = stage.call_rank(&mut req, &current, &windows, &reason, &mut record, &mut ticket).await;
            match outcome {
                Ok(mut ranking) => {
                    let (next, valve) = apply(current, &ranking.order);
                    current = next;
                    record.safety_valve = valve;
                    // The detail is the plugin's free text, and the decision
                    // record is logged: escaped like everything a guest says.
                    if let Some(d) = &mut ranking.detail
                        && let Cow::Owned(escaped) = escape_controls(d)
                    {
                        *d = escaped;
                    }
                    if !ranking.reason.is_empty() {
                        reason = ranking.reason.clone();
                        detail = ranking.detail.clone();
                    }
                    record.reason = ranking.reason;
                    record.detail = ranking.detail;
                }
                Err(fault) => {
                    let fault = stage.rank_failed(fault, req.now_ms, ticket.take());
                    reason = ROUTING_POLICY_ERROR.to_string();
                    detail =
                        Some(format!("stage `{}` failed ({}): {}", stage.name, fault.cause.as_str(), fault.message));
                    policy_errors.push(PolicyError::new(&stage.name, Phase::Rank, &fault));
                    if record.bypassed.is_none() {
                        record.error = Some(fault);
                    }
                }
            }
            record.order = self.order(&current);
            record.duration_us = micros(t0);
            records.push(record);
        }

        Decision {
            order: self.order(&current),
            reason,
            detail,
            policy_errors,
            background_errors,
            stages: records,
            duration_us: micros(started),
        }
    }

    /// Tells every stage how the request ended on pool account `account`. A
    /// stage whose breaker is open is not asked. Failures are counted like any
    /// other (breaker, metrics) and shown in the next decision record; they are
    /// also returned.
    ///
    /// The stages are told at once, not one after another: a stage that has
    /// to queue for an instance holds back no other stage's `observe`.
    pub async fn observe(&self, req: &Request, account: u32, outcome: &Outcome) -> Vec<PolicyError> {
        let calls = self.stages.iter().filter(|s| s.events.breaker.allows_observe()).map(|stage| async move {
            match stage.plugin.observe(req, account, outcome).await {
                Ok(()) => {
                    stage.events.succeeded(Phase::Observe, req.now_ms, None);
                    None
                }
                Err(f) => {
                    stage.events.failed(Phase::Observe, &f, req.now_ms, None);
                    Some(PolicyError::new(&stage.name, Phase::Observe, &f))
                }
            }
        });
        futures_util::future::join_all(calls).await.into_iter().flatten().collect()
    }

    /// For a stage skipped as `busy` for most of its recent calls: a short
    /// note saying so (one line of ASCII, for `x-poolgate-reason`).
    pub fn mostly_busy(&self, stage: &str) -> Option<String> {
        let s = self.stages.iter().find(|s| s.name == stage)?;
        mostly_busy(&s.name, s.events.busy_share())
    }
}

/// `stage skipped as busy for N of its last M rankings`, when that is most.
fn mostly_busy(name: &str, share: BusyShare) -> Option<String> {
    share.mostly().then(|| {
        format!("stage {} skipped as busy for {} of its last {} rankings", escape_controls(name), share.busy, share.of)
    })
}

const _: () = assert!(RECENT_RANKS <= 64);

fn micros(t: Instant) -> f64 {
    (t.elapsed().as_nanos() as f64 / 100.0).round() / 10.0
}

/// Pool order, usable accounts first (stable).
fn initial_order(mut candidates: Vec<Account>) -> Vec<Account> {
    candidates.sort_by_key(|a| !a.usable);
    candidates
}

/// Longest `reason` a stage may give: it is copied into the
/// `x-poolgate-reason` response header.
pub const MAX_REASON_BYTES: usize = 128;
/// Longest `detail` a stage may give.
pub const MAX_DETAIL_BYTES: usize = 4096;

/// Reasons only the host gives: `pool_order` (no stage decided) and
/// `routing_policy_error` (a stage failed, and the decision records why). A
/// stage answering one of them would claim what did not happen — an error with
/// none recorded, or no decision where there was one — so the answer is
/// invalid output.
pub const RESERVED_REASONS: [&str; 2] = [POOL_ORDER, ROUTING_POLICY_ERROR];

/// Checks a stage's whole answer: its order (see [`validate_order`]), a reason
/// short enough and plain enough (printable ASCII) to travel in a response
/// header and not one the host reserves ([`RESERVED_REASONS`]), and a detail
/// within its limit.
pub fn validate_answer(r: &Ranking, n: usize) -> Result<(), Fault> {
    validate_order(&r.order, n)?;
    let invalid = |m: String| Err(Fault::new(Cause::InvalidOutput, m));
    if r.reason.len() > MAX_REASON_BYTES {
        return invalid(format!("reason is {} bytes, over the limit of {MAX_REASON_BYTES}", r.reason.len()));
    }
    if let Some(c) = r.reason.chars().find(|c| !(' '..='~').contains(c)) {
        return invalid(format!("reason holds {c:?}; a reason is printable ASCII (it travels in a header)"));
    }
    if RESERVED_REASONS.contains(&r.reason.as_str()) {
        return invalid(format!(
            "reason `{}` is reserved for the host (it means {}); answer a reason of your own, or \"\" to leave the \
             current one",
            r.reason,
            if r.reason == POOL_ORDER { "no stage decided" } else { "a stage failed" }
        ));
    }
    if let Some(d) = &r.detail
        && d.len() > MAX_DETAIL_BYTES
    {
        return invalid(format!("detail is {} bytes, over the limit of {MAX_DETAIL_BYTES}", d.len()));
    }
    Ok(())
}

/// Checks that `order` is a permutation of a non-empty subset of `0..n`.
pub fn validate_order(order: &[u32], n: usize) -> Result<(), Fault> {
    let invalid = |m: String| Err(Fault::new(Cause::InvalidOutput, m));
    if order.is_empty() {
        return invalid("empty order".into());
    }
    if order.len() > n {
        return invalid(format!("order has {} entries for {n} candidates", order.len()));
    }
    let mut seen = vec![false; n];
    for &i in order {
        let Some(slot) = seen.get_mut(i as usize) else {
            return invalid(format!("index {i} is out of range (0..{n})"));
        };
        if *slot {
            return invalid(format!("index {i} appears twice"));
        }
        *slot = true;
    }
    Ok(())
}

/// Applies a validated order. If the stage kept no usable account while it was
/// given some, the dropped usable accounts are appended in input order; the flag
/// says so.
fn apply(input: Vec<Account>, order: &[u32]) -> (Vec<Account>, bool) {
    let had_usable = input.iter().any(|a| a.usable);
    let mut slots: Vec<Option<Account>> = input.into_iter().map(Some).collect();
    let mut out: Vec<Account> = order.iter().filter_map(|&i| slots[i as usize].take()).collect();
    let valve = had_usable && !out.iter().any(|a| a.usable);
    if valve {
        out.extend(slots.into_iter().flatten().filter(|a| a.usable));
    }
    (out, valve)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_problem() {
        assert!(validate_order(&[2, 0, 1], 3).is_ok());
        assert!(validate_order(&[1], 3).is_ok());
        let msg = |o: &[u32], n| validate_order(o, n).unwrap_err().message;
        assert_eq!(msg(&[], 3), "empty order");
        assert_eq!(msg(&[0, 0], 3), "index 0 appears twice");
        assert_eq!(msg(&[0, 5], 3), "index 5 is out of range (0..3)");
        assert_eq!(msg(&[0, 1, 2, 0], 3), "order has 4 entries for 3 candidates");
        assert_eq!(validate_order(&[], 3).unwrap_err().cause, Cause::InvalidOutput);
    }

    #[test]
    fn reasons_and_details_are_bounded() {
        let ranking = |reason: &str, detail: Option<String>| Ranking { order: vec![0], reason: reason.into(), detail };
        assert!(validate_answer(&ranking("most_headroom", Some("x".repeat(4096))), 1).is_ok());
        let msg = |r: Ranking| validate_answer(&r, 1).unwrap_err().message;
        assert_eq!(msg(ranking(&"r".repeat(129), None)), "reason is 129 bytes, over the limit of 128");
        assert!(msg(ranking("a\r\nx-evil: 1", None)).contains("printable ASCII"));
        assert!(msg(ranking("naïve", None)).contains("printable ASCII"));
        assert_eq!(msg(ranking("ok", Some("d".repeat(4097)))), "detail is 4097 bytes, over the limit of 4096");
        for reserved in RESERVED_REASONS {
            let f = validate_answer(&ranking(reserved, None), 1).unwrap_err();
            assert_eq!(f.cause, Cause::InvalidOutput);
            assert!(f.message.contains("is reserved for the host"), "{}", f.message);
        }
        assert!(validate_answer(&ranking("routing_policy_error_free", None), 1).is_ok());
    }
}
