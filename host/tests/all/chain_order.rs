//! Chain semantics with two or more stages: each stage sees the previous order,
//! the last stage that claims the head names the reason, drops carry forward,
//! failures pass their input through, and the safety valve keeps a usable account.

use crate::common;

use common::*;
use serde_json::json;

fn misbehave(fault: &str) -> poolgate::policy::StageSpec {
    stage(&guest("misbehave"), json!({ "fault": fault }), 200)
}

fn reversed() -> poolgate::policy::StageSpec {
    // Reverses for every model but "boom".
    stage(&guest("misbehave"), json!({ "fault": "trap", "on_model": "boom" }), 200)
}

#[test]
fn each_stage_sees_the_previous_order_and_the_last_claim_wins() {
    let case = pool_case(4); // 5h utilization rises a0 < a1 < a2 < a3
    let chain = chain(&case, vec![stage("builtin:headroom", json!({}), 200), reversed()]);
    let d = rank(&chain, &case, "claude-sonnet-4-5");
    assert_eq!(d.stages[0].order, ["a0", "a1", "a2", "a3"]);
    assert_eq!(d.stages[0].reason, "headroom");
    assert_eq!(d.order, ["a3", "a2", "a1", "a0"]);
    assert_eq!(d.reason, "reversed");

    // The other way round: headroom has the last word.
    let chain = chain_with_state(
        &case,
        vec![reversed(), stage("builtin:headroom", json!({}), 200)],
        std::sync::Arc::new(poolgate::policy::MemoryState::default()),
    );
    let d = rank(&chain, &case, "claude-sonnet-4-5");
    assert_eq!(d.stages[0].order, ["a3", "a2", "a1", "a0"]);
    assert_eq!(d.order, ["a0", "a1", "a2", "a3"]);
    assert_eq!(d.reason, "headroom");
}

#[test]
fn an_empty_reason_leaves_the_earlier_reason_standing() {
    let case = pool_case(3);
    let chain = chain(&case, vec![stage("builtin:headroom", json!({}), 200), misbehave("pass")]);
    let d = rank(&chain, &case, "m");
    assert_eq!(d.reason, "headroom");
    assert_eq!(d.stages[1].reason, "");
}

#[test]
fn a_later_stage_is_told_who_decided_the_head() {
    let case = pool_case(3);
    let chain = chain(&case, vec![stage("builtin:headroom", json!({}), 200), misbehave("report-decided-by")]);
    let d = rank(&chain, &case, "m");
    assert_eq!(d.stages[1].detail.as_deref(), Some("saw Some(\"headroom\")"));
    // The first stage sees the reason before any stage decided.
    let chain = chain_with_state(
        &case,
        vec![misbehave("report-decided-by")],
        std::sync::Arc::new(poolgate::policy::MemoryState::default()),
    );
    let d = rank(&chain, &case, "m");
    assert_eq!(d.stages[0].detail.as_deref(), Some("saw Some(\"pool_order\")"));
}

#[test]
fn a_dropped_account_stays_dropped_for_later_stages() {
    let case = pool_case(4);
    let chain = chain(&case, vec![misbehave("drop-first"), reversed()]);
    let d = rank(&chain, &case, "m");
    assert_eq!(d.stages[0].order, ["a1", "a2", "a3"]);
    assert_eq!(d.order, ["a3", "a2", "a1"]);
}

#[test]
fn a_failed_middle_stage_passes_its_input_through_to_the_next() {
    let case = pool_case(4);
    let chain = chain(&case, vec![stage("builtin:headroom", json!({}), 200), misbehave("error"), reversed()]);
    let d = rank(&chain, &case, "m");
    assert_eq!(d.stages[1].order, ["a0", "a1", "a2", "a3"], "input passed through");
    assert!(d.stages[1].error.is_some());
    assert_eq!(d.policy_errors.len(), 1);
    assert_eq!(d.policy_errors[0].stage, "poolgate_guest_misbehave.wasm");
    // A later stage that decides the head overrides routing_policy_error.
    assert_eq!(d.reason, "reversed");
    assert_eq!(d.order, ["a3", "a2", "a1", "a0"]);
}

#[test]
fn a_failed_first_stage_serves_pool_order_with_usable_accounts_first() {
    let mut case = pool_case(4);
    case.accounts[0].cooldown = Some(poolgate::account::Cooldown {
        until_ms: case.now_ms + 60_000,
        reason: poolgate::account::CooldownReason::Transient,
    });
    let chain = chain(&case, vec![misbehave("trap")]);
    let d = rank(&chain, &case, "m");
    assert_eq!(d.reason, poolgate::policy::ROUTING_POLICY_ERROR);
    assert_eq!(d.order, ["a1", "a2", "a3", "a0"]);
}

#[test]
fn the_safety_valve_never_lets_the_chain_drop_every_usable_account() {
    let mut case = pool_case(3);
    // a2 is the only one kept by the stage, and it is cooling.
    case.accounts[2].cooldown = Some(poolgate::account::Cooldown {
        until_ms: case.now_ms + 60_000,
        reason: poolgate::account::CooldownReason::Transient,
    });
    let chain = chain(&case, vec![misbehave("drop-all-but-last")]);
    let d = rank(&chain, &case, "m");
    assert!(d.stages[0].safety_valve, "{d:?}");
    // Stage 1 got [a0, a1, a2] (usable first), kept [a2]; the host puts the
    // usable ones back after it.
    assert_eq!(d.order, ["a2", "a0", "a1"]);
    assert!(d.policy_errors.is_empty());
}

#[test]
fn a_stage_may_drop_accounts_while_a_usable_one_remains() {
    let case = pool_case(3);
    let chain = chain(&case, vec![misbehave("drop-all-but-last")]);
    let d = rank(&chain, &case, "m");
    assert!(!d.stages[0].safety_valve);
    assert_eq!(d.order, ["a2"]);
}
