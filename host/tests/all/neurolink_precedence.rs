//! neurolink's precedence, reproduced by a chain of built-ins:
//! `skip-exhausted → expiry-first → affinity → prefer-primary → spill` orders a
//! request `[bound, primary, …rest]`, spill never splits a bound session, and a
//! session follows the account that served it across requests — including the
//! A → B → A transient-cooldown ping-pong neurolink's affinity was built to stop.
//!
//! These run several requests against one chain (the fixtures run one), and read
//! each stage's own detail, which is where a modifier that does not act reports
//! why (`affinity skipped: expired`).

use crate::common;

use std::sync::Arc;

use common::*;
use poolgate::case::Case;
use poolgate::policy::types::Outcome;
use poolgate::policy::{Chain, Decision, MemoryState, StageSpec};
use serde_json::{Value, json};

const NOW: u64 = 1_760_000_000_000;
const MIN: u64 = 60_000;
const HOUR: u64 = 60 * MIN;
const DAY: u64 = 24 * HOUR;
const SESSION: &str = "0b6f7c1e-session";

/// An account with fresh, ticking 5h and 7d windows.
fn account(id: &str, session_used: f64, weekly_reset: u64) -> Value {
    json!({
        "id": id,
        "windows": [
            { "name": "5h", "utilization": session_used, "resets_at_ms": NOW + 2 * HOUR, "status": "allowed" },
            { "name": "7d", "utilization": 0.3, "resets_at_ms": weekly_reset, "status": "allowed" }
        ]
    })
}

fn case(accounts: Vec<Value>, session: Option<&str>, now: u64) -> Case {
    let mut c = json!({ "now_ms": now, "request": { "model": "claude-sonnet-4-5" }, "accounts": accounts });
    if let Some(s) = session {
        c["request"]["session"] = json!(s);
    }
    Case::parse(&c.to_string()).unwrap()
}

fn neurolink_chain(spill: u32) -> Vec<StageSpec> {
    vec![
        stage("builtin:skip-exhausted", json!({}), 500),
        stage("builtin:expiry-first", json!({}), 500),
        stage("builtin:affinity", json!({}), 500),
        stage("builtin:prefer-primary", json!({}), 500),
        stage("builtin:spill", json!({ "spill_inflight": spill }), 500),
    ]
}

fn run(chain: &Chain, case: &Case) -> Decision {
    poolgate::policy::block_on(chain.rank(case.request(), case.candidates(poolgate::account::DEFAULT_FRESHNESS_MS)))
}

/// Reports a successful response of `case`'s request on `account`.
fn served(chain: &Chain, case: &Case, account: &str) {
    let index = case.accounts.iter().position(|a| a.id == account).unwrap() as u32;
    poolgate::policy::block_on(chain.observe(&case.request(), index, &Outcome::Success));
}

fn stage_detail<'d>(d: &'d Decision, name: &str) -> &'d str {
    let s = d.stages.iter().find(|s| s.stage == name).unwrap_or_else(|| panic!("no stage {name}"));
    s.detail.as_deref().unwrap_or("")
}

#[test]
fn bound_then_primary_then_the_ranking() {
    let mut accounts =
        vec![account("a", 0.2, NOW + DAY), account("b", 0.2, NOW + 3 * DAY), account("p", 0.2, NOW + 3 * DAY)];
    accounts[2]["primary"] = json!(true);
    let c = case(accounts, Some(SESSION), NOW);
    let chain = chain(&c, neurolink_chain(0));

    // Unbound: the primary leads, then the ranking (a's week expires first).
    let d = run(&chain, &c);
    assert_eq!(d.order, ["p", "a", "b"]);
    assert_eq!(d.reason, "preferred_primary");
    assert_eq!(stage_detail(&d, "builtin:affinity"), "affinity skipped: expired");

    // b serves the session: [bound, primary, …rest].
    served(&chain, &c, "b");
    let d = run(&chain, &c);
    assert_eq!(d.order, ["b", "p", "a"]);
    assert_eq!(d.reason, "session_affinity");
    assert_eq!(stage_detail(&d, "builtin:prefer-primary"), "primary placed behind the session binding");
}

#[test]
fn a_session_follows_the_account_that_served_it_without_ping_pong() {
    // a's week expires first, so the ranking alone always prefers a.
    let healthy = || vec![account("a", 0.2, NOW + DAY), account("b", 0.2, NOW + 3 * DAY)];
    let state = Arc::new(MemoryState::default());
    let first = case(healthy(), Some(SESSION), NOW);
    let chain = chain_with_state(&first, neurolink_chain(2), state.clone());

    let d = run(&chain, &first);
    assert_eq!(d.order, ["a", "b"]);
    served(&chain, &first, "a");

    // a trips a transient cooldown: the session moves to b and b serves it.
    let mut cooling = healthy();
    cooling[0]["cooldown"] = json!({ "until_ms": NOW + 6 * MIN, "reason": "transient" });
    let second = case(cooling, Some(SESSION), NOW + MIN);
    let d = run(&chain, &second);
    assert_eq!(d.order.head(), Some("b"));
    assert_eq!(stage_detail(&d, "builtin:affinity"), "affinity skipped: unusable (`a`)");
    served(&chain, &second, "b");

    // a recovers and is the better-ranked account again, but the session stays on b.
    let third = case(healthy(), Some(SESSION), NOW + 10 * MIN);
    let d = run(&chain, &third);
    assert_eq!(d.order, ["b", "a"]);
    assert_eq!(d.reason, "session_affinity");

    // b gets busy: spill never splits the bound session.
    let mut busy = healthy();
    busy[1]["in_flight"] = json!(5);
    let fourth = case(busy, Some(SESSION), NOW + 11 * MIN);
    let d = run(&chain, &fourth);
    assert_eq!(d.order, ["b", "a"]);
    assert_eq!(stage_detail(&d, "builtin:spill"), "spill skipped: the head is pinned by session_affinity");

    // An unbound session on a busy head is spilled as usual.
    let mut busy_a = healthy();
    busy_a[0]["in_flight"] = json!(2);
    let d = run(&chain, &case(busy_a, Some("another-session"), NOW + 11 * MIN));
    assert_eq!(d.order, ["b", "a"]);
    assert_eq!(d.reason, "spill_inflight");
}

#[test]
fn affinity_reports_why_it_did_not_act() {
    let pool = || vec![account("a", 0.2, NOW + DAY), account("b", 0.2, NOW + 3 * DAY)];
    let c = case(pool(), Some(SESSION), NOW);
    let chain = chain(&c, neurolink_chain(0));
    let detail = |c: &Case| stage_detail(&run(&chain, c), "builtin:affinity").to_string();

    assert_eq!(detail(&case(pool(), None, NOW)), "affinity skipped: no_session");
    assert_eq!(detail(&c), "affinity skipped: expired");

    served(&chain, &c, "b");
    let mut saturated = pool();
    saturated[1]["windows"][0]["utilization"] = json!(0.97);
    assert_eq!(detail(&case(saturated, Some(SESSION), NOW + MIN)), "affinity skipped: session_saturated (`b`)");

    // Dropped by skip-exhausted: no longer a candidate at all.
    let mut spent = pool();
    spent[1]["windows"][1] =
        json!({ "name": "7d", "utilization": 1.0, "resets_at_ms": NOW + DAY, "status": "rejected" });
    let d = run(&chain, &case(spent, Some(SESSION), NOW + MIN));
    assert_eq!(d.order, ["a"]);
    assert_eq!(stage_detail(&d, "builtin:skip-exhausted"), "dropped `b` (7d exhausted until 1760086400000)");
    assert_eq!(stage_detail(&d, "builtin:affinity"), "affinity skipped: unusable (`b` is not a candidate)");

    let later = case(pool(), Some(SESSION), NOW + HOUR + 1);
    assert_eq!(detail(&later), "affinity skipped: expired");
}

#[test]
fn reading_a_binding_does_not_refresh_it_but_serving_does() {
    let pool = || vec![account("a", 0.2, NOW + DAY), account("b", 0.2, NOW + 3 * DAY)];
    let c = case(pool(), Some(SESSION), NOW);
    let chain =
        chain(&c, vec![stage("builtin:expiry-first", json!({}), 500), stage("builtin:affinity", json!({}), 500)]);
    served(&chain, &c, "b");

    // Read half-way through the TTL: still bound, and not refreshed.
    assert_eq!(run(&chain, &case(pool(), Some(SESSION), NOW + 30 * MIN)).order, ["b", "a"]);
    assert_eq!(run(&chain, &case(pool(), Some(SESSION), NOW + HOUR)).order, ["b", "a"]);
    assert_eq!(run(&chain, &case(pool(), Some(SESSION), NOW + HOUR + 1)).order, ["a", "b"]);

    // A response served half-way through does refresh it.
    let c = case(pool(), Some("second"), NOW);
    served(&chain, &c, "b");
    served(&chain, &case(pool(), Some("second"), NOW + 30 * MIN), "b");
    assert_eq!(run(&chain, &case(pool(), Some("second"), NOW + HOUR + 1)).order, ["b", "a"]);
}

#[test]
fn a_binding_survives_a_new_instance_and_a_hot_swap() {
    let pool = || vec![account("a", 0.2, NOW + DAY), account("b", 0.2, NOW + 3 * DAY)];
    let state = Arc::new(MemoryState::default());
    let c = case(pool(), Some(SESSION), NOW);
    let affinity = || vec![stage("builtin:affinity", json!({}), 500)];
    let old = chain_with_state(&c, affinity(), state.clone());
    served(&old, &c, "b");
    drop(old);

    // A new configuration generation: new instances, same state scope.
    let new = chain_with_state(&c, vec![stage("builtin:expiry-first", json!({}), 500), affinity().remove(0)], state);
    let d = run(&new, &case(pool(), Some(SESSION), NOW + MIN));
    assert_eq!(d.order, ["b", "a"]);
    assert_eq!(d.reason, "session_affinity");
}

#[test]
fn skip_exhausted_keeps_the_last_way_out() {
    let spent = |id: &str| json!({ "id": id, "windows": [ { "name": "7d", "utilization": 1.0, "resets_at_ms": NOW + DAY, "status": "rejected" } ] });
    let c = case(vec![spent("a"), spent("b")], None, NOW);
    let chain = chain(&c, neurolink_chain(0));
    let d = run(&chain, &c);
    assert_eq!(d.order, ["a", "b"]);
    assert!(stage_detail(&d, "builtin:skip-exhausted").starts_with("kept every candidate"), "{d:?}");
    assert!(d.policy_errors.is_empty());
}

#[test]
fn prefer_primary_reports_why_it_did_not_act() {
    let mut accounts = vec![account("a", 0.2, NOW + DAY), account("p", 0.98, NOW + 3 * DAY)];
    accounts[1]["primary"] = json!(true);
    let c = case(accounts, None, NOW);
    let chain = chain(&c, vec![stage("builtin:prefer-primary", json!({}), 500)]);
    assert_eq!(stage_detail(&run(&chain, &c), "builtin:prefer-primary"), "prefer-primary skipped: session_saturated");
    let c = case(vec![account("a", 0.2, NOW + DAY)], None, NOW);
    let chain = common::chain(&c, vec![stage("builtin:prefer-primary", json!({}), 500)]);
    assert_eq!(
        stage_detail(&run(&chain, &c), "builtin:prefer-primary"),
        "prefer-primary skipped: no primary among the candidates"
    );
}
