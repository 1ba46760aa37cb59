//! The bulk lowering of accounts and windows (policy::lowering) hands a guest
//! exactly what the host holds: random pools go in, a guest echoes every field
//! back, and the echo must match the host's records bit for bit.

use crate::common;

use common::*;
use poolgate::policy::types::{Account, QuotaWindow};
use serde_json::json;

/// The echo guest's canonical text, built on the host side.
fn expected(accounts: &[Account], windows: &[QuotaWindow]) -> String {
    let mut out = String::new();
    for a in accounts {
        out += &format!(
            "A{} p{} u{} c{:?} f{} m{:?} s{:?} r{:?} q{:?};",
            a.id,
            a.primary as u8,
            a.usable as u8,
            a.cooldown.map(|x| (x.until_ms, x.reason as u8)),
            a.in_flight,
            a.max_in_flight,
            a.status as u8,
            a.resets_at_ms,
            a.quota_freshness as u8
        );
        for w in windows.iter().filter(|w| w.account == a.id) {
            out += &format!(
                "W{} k{} n{} x{} r{:?} s{} o{};",
                w.account,
                w.kind as u8,
                w.name,
                w.utilization.to_bits(),
                w.resets_at_ms,
                w.status as u8,
                w.observed_at_ms
            );
        }
    }
    out
}

/// A small deterministic generator (no dependency needed for a test).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[(self.next() % xs.len() as u64) as usize]
    }
}

fn random_case(rng: &mut Rng, n: usize) -> poolgate::case::Case {
    let now: u64 = 1_760_000_000_000;
    let statuses = ["allowed", "allowed_warning", "rejected", "unknown"];
    let reasons = [
        "weekly_exhausted",
        "session_exhausted",
        "model_exhausted",
        "unified_rejected",
        "transient",
        "overloaded",
        "upstream_error",
        "auth",
        "disabled",
    ];
    let names = ["5h", "7d", "7d_oi", "7d_opus", "overage", "requests", "tokens", "mystery"];
    let accounts: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            let mut a = json!({
                "id": format!("acct{i}"),
                "primary": rng.next().is_multiple_of(5),
                "in_flight": rng.next() % 7,
                "status": rng.pick(&statuses),
            });
            if rng.next().is_multiple_of(2) {
                a["max_in_flight"] = json!(rng.next() % 20);
            }
            if rng.next().is_multiple_of(2) {
                a["resets_at_ms"] = json!(now + rng.next() % 10_000_000);
            }
            if rng.next().is_multiple_of(3) {
                a["cooldown"] = json!({ "until_ms": now + 1 + rng.next() % 1_000_000, "reason": rng.pick(&reasons) });
            }
            let windows: Vec<serde_json::Value> = (0..rng.next() % 4)
                .map(|_| {
                    let mut w = json!({
                        "name": rng.pick(&names),
                        "utilization": (rng.next() % 1200) as f64 / 1000.0,
                        "status": rng.pick(&statuses),
                        "observed_at_ms": now - rng.next() % 3_600_000,
                    });
                    if rng.next().is_multiple_of(2) {
                        w["resets_at_ms"] = json!(now + 1 + rng.next() % 1_000_000);
                    }
                    w
                })
                .collect();
            a["windows"] = json!(windows);
            a
        })
        .collect();
    poolgate::case::Case::parse(&json!({ "now_ms": now, "accounts": accounts }).to_string()).unwrap()
}

#[test]
fn a_guest_receives_exactly_what_the_host_holds() {
    let mut rng = Rng(0x9e3779b97f4a7c15);
    for round in 0..40 {
        let n = 1 + (round % 20);
        let case = random_case(&mut rng, n);
        let chain = chain(&case, vec![stage(&guest("misbehave"), json!({ "fault": "echo" }), 1000)]);
        let cands = case.candidates(poolgate::account::DEFAULT_FRESHNESS_MS);
        // The chain hands stage 1 the usable accounts first.
        let mut first: Vec<Account> = cands.accounts.clone();
        first.sort_by_key(|a| !a.usable);
        let want = expected(&first, &cands.windows);
        let d = poolgate::policy::block_on(chain.rank(case.request(), cands));
        assert!(d.policy_errors.is_empty(), "{:?}", d.policy_errors);
        assert_eq!(d.detail.as_deref(), Some(want.as_str()), "round {round}");
    }
}
