//! Seeded property tests of the comparator built-ins (headroom, fill-first,
//! expiry-first, headroom-first), through the real WASM path:
//!
//! 1. the order does not depend on the order the stage receives its candidates
//!    (the final tie-break is the pool index, never the input position);
//! 2. the order is transitive: for any three accounts, "a before b" and
//!    "b before c" ranked in pairs imply "a before c", and every pair agrees with
//!    the full ranking.
//!
//! Pools are random but drawn from small sets of values, so that ties — where a
//! comparator's later rungs and its tie-break are exercised — are common. A
//! failure prints the seed and the case, which reproduce it exactly. (Both
//! properties fail on neurolink's own per-model utilization rule, which compares
//! only accounts that both report a per-model window; see docs/strategies.md.)
//!
//! Also here: every built-in refuses a bad option at load, naming the option.
// The pairwise checks index a square matrix by both coordinates; loops over
// indices read more plainly than iterator chains there.
#![allow(
    clippy::needless_range_loop,
    reason = "pairs of indices (i, j) into the same order read clearer as index loops"
)]

use crate::common;

use std::sync::Arc;

use common::ENGINE;
use poolgate::account::DEFAULT_FRESHNESS_MS;
use poolgate::case::Case;
use poolgate::policy::plugin::Plugin;
use poolgate::policy::types::{Account, QuotaWindow, Request};
use poolgate::policy::{Limits, MemoryState, PluginRef, PluginSpec};
use serde_json::{Value, json};

const COMPARATORS: [&str; 4] = ["headroom", "fill-first", "expiry-first", "headroom-first"];
const CASES: usize = 300;
const NOW: u64 = 1_760_000_000_000;
const MIN: u64 = 60_000;
const HOUR: u64 = 60 * MIN;
const DAY: u64 = 24 * HOUR;

/// xorshift64*: small, seeded, good enough to shuffle fixtures.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }
    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

fn window(rng: &mut Rng, name: &str, resets: &[Option<u64>]) -> Value {
    let mut w = json!({
        "name": name,
        "utilization": rng.pick(&[0.0, 0.2, 0.5, 0.9, 0.96, 0.97, 0.98, 0.99, 1.0, 1.02]),
        "status": rng.pick(&["allowed", "allowed", "allowed", "allowed", "allowed_warning", "rejected", "unknown"]),
    });
    if let Some(reset) = rng.pick(resets) {
        w["resets_at_ms"] = json!(reset);
    }
    if let Some(observed) = rng.pick(&[None, None, Some(NOW - 5 * MIN), Some(NOW - 20 * MIN)]) {
        w["observed_at_ms"] = json!(observed);
    }
    w
}

/// A random pool of 2–8 accounts, rich in ties. In half the pools every account
/// shares one 5h/7d reading, so that the late rungs (per-model utilization,
/// primary, pool index) decide.
fn random_case(rng: &mut Rng) -> Case {
    random_case_with(rng, false)
}

/// As [`random_case`]; with `fable`, accounts also report `7d_fable` buckets
/// and `7d_oi` ones in any state, so that two buckets often bind one family.
fn random_case_with(rng: &mut Rng, fable: bool) -> Case {
    let n = 2 + rng.below(7);
    let session_resets =
        [None, Some(NOW - MIN), Some(NOW + HOUR), Some(NOW + HOUR), Some(NOW + 70 * MIN), Some(NOW + 2 * HOUR)];
    let weekly_resets = [None, Some(NOW - MIN), Some(NOW + DAY), Some(NOW + DAY), Some(NOW + 3 * DAY)];
    let shared = rng.chance(50).then(|| [window(rng, "5h", &session_resets), window(rng, "7d", &weekly_resets)]);
    let accounts: Vec<Value> = (0..n)
        .map(|i| {
            let mut a = json!({
                "id": format!("a{i}"),
                "alias": rng.pick(&["1-main", "2-spill", "10-x", "B", "a", "a"]),
                "primary": rng.chance(20),
                "in_flight": rng.below(4),
            });
            if rng.chance(15) {
                a["cooldown"] = json!({ "until_ms": NOW + rng.pick(&[MIN, 5 * MIN, 5 * MIN]), "reason": "transient" });
            }
            if rng.chance(10) {
                a["status"] = json!("rejected");
                a["resets_at_ms"] = json!(rng.pick(&[NOW - MIN, NOW + 10 * MIN]));
            }
            let mut windows = Vec::new();
            if let Some(shared) = &shared {
                windows.extend(shared.iter().cloned());
            } else {
                if rng.chance(80) {
                    windows.push(window(rng, "5h", &session_resets));
                }
                if rng.chance(80) {
                    windows.push(window(rng, "7d", &weekly_resets));
                }
            }
            if rng.chance(50) {
                let mut oi = window(rng, "7d_oi", &weekly_resets);
                if shared.is_some() {
                    // Below the soft limit and not rejected: let its utilization decide.
                    oi["utilization"] = json!(rng.pick(&[0.0, 0.2, 0.5, 0.9]));
                    oi["status"] = json!("allowed");
                }
                windows.push(oi);
            }
            if rng.chance(20) {
                windows.push(window(rng, "7d_opus", &weekly_resets));
            }
            if fable && rng.chance(60) {
                windows.push(window(rng, "7d_fable", &weekly_resets));
                if !windows.iter().any(|w| w["name"] == "7d_oi") {
                    windows.push(window(rng, "7d_oi", &weekly_resets));
                }
            }
            a["windows"] = Value::Array(windows);
            a
        })
        .collect();
    let model = rng.pick(&["claude-fable-5", "claude-fable-5", "claude-sonnet-4-5", "claude-opus-4-1", ""]);
    let case = json!({ "now_ms": NOW, "request": { "model": model }, "accounts": accounts });
    Case::parse(&case.to_string()).expect("generated case parses")
}

fn load(name: &str, case: &Case) -> Plugin {
    let plugin = PluginRef::parse(&format!("builtin:{name}"));
    let spec = PluginSpec {
        scope: plugin.default_scope(),
        plugin,
        config_json: "{}".into(),
        limits: Limits { deadline: std::time::Duration::from_secs(1), ..Limits::default() },
        max_idle: 1,
        max_instances: 1,
    };
    poolgate::policy::block_on(Plugin::load(&ENGINE, spec, case.pool(), Arc::new(MemoryState::default())))
        .expect("plugin loads")
}

/// Ranks `accounts` (a subset of the case's, in any order) and answers with
/// the pool indices in the plugin's order, plus its reason.
fn rank(plugin: &Plugin, req: &Request, accounts: &[Account], windows: &[QuotaWindow]) -> (Vec<u32>, String) {
    let (ids, reason) = rank_any(plugin, req, accounts, windows);
    assert_eq!(ids.len(), accounts.len(), "a comparator drops nothing");
    (ids, reason)
}

/// As [`rank`], for any built-in: a filter may drop accounts.
fn rank_any(plugin: &Plugin, req: &Request, accounts: &[Account], windows: &[QuotaWindow]) -> (Vec<u32>, String) {
    let r = poolgate::policy::block_on(plugin.rank(req, accounts, windows)).expect("rank succeeds");
    (r.order.iter().map(|&i| accounts[i as usize].id).collect(), r.reason)
}

/// Every account's windows in a random order (still grouped by account, as
/// the host sends them).
fn permute_windows(rng: &mut Rng, windows: &[QuotaWindow]) -> Vec<QuotaWindow> {
    let mut out = Vec::with_capacity(windows.len());
    for group in windows.chunk_by(|a, b| a.account == b.account) {
        let mut group = group.to_vec();
        rng.shuffle(&mut group);
        out.extend(group);
    }
    out
}

fn seed_for(name: &str, property: u64) -> u64 {
    name.bytes().fold(0x9e37_79b9_7f4a_7c15 ^ property, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

#[test]
fn a_comparator_does_not_depend_on_the_input_order() {
    for name in COMPARATORS {
        let seed = seed_for(name, 1);
        let mut rng = Rng::new(seed);
        for n in 0..CASES {
            let case = random_case(&mut rng);
            let plugin = load(name, &case);
            let req = case.request();
            let c = case.candidates(DEFAULT_FRESHNESS_MS);
            let expected = rank(&plugin, &req, &c.accounts, &c.windows);
            for _ in 0..4 {
                let mut shuffled = c.accounts.clone();
                rng.shuffle(&mut shuffled);
                let got = rank(&plugin, &req, &shuffled, &c.windows);
                assert_eq!(
                    got,
                    expected,
                    "{name}, seed {seed:#x}, case {n}: input {:?} changed the order\n{}",
                    shuffled.iter().map(|a| a.id).collect::<Vec<_>>(),
                    serde_json::to_string(&case).unwrap()
                );
            }
        }
    }
}

#[test]
fn a_comparator_is_transitive_and_agrees_with_its_pairs() {
    for name in COMPARATORS {
        let seed = seed_for(name, 2);
        let mut rng = Rng::new(seed);
        for n in 0..CASES {
            let case = random_case(&mut rng);
            let plugin = load(name, &case);
            let req = case.request();
            let c = case.candidates(DEFAULT_FRESHNESS_MS);
            let k = c.accounts.len();
            let context = || format!("{name}, seed {seed:#x}, case {n}\n{}", serde_json::to_string(&case).unwrap());
            // before[x][y]: x ranks ahead of y when only the two are ranked.
            let mut before = vec![vec![false; k]; k];
            for x in 0..k {
                for y in 0..k {
                    if x != y {
                        let pair = [c.accounts[x], c.accounts[y]];
                        before[x][y] = rank(&plugin, &req, &pair, &c.windows).0[0] == c.accounts[x].id;
                    }
                }
            }
            for x in 0..k {
                for y in 0..k {
                    if x != y {
                        assert_ne!(before[x][y], before[y][x], "pair order depends on input order: {}", context());
                    }
                }
            }
            for a in 0..k {
                for b in 0..k {
                    for d in 0..k {
                        if a != b && b != d && a != d && before[a][b] && before[b][d] {
                            assert!(before[a][d], "a{a} < a{b} < a{d} but not a{a} < a{d}: {}", context());
                        }
                    }
                }
            }
            let (full, _) = rank(&plugin, &req, &c.accounts, &c.windows);
            let at = |id: u32| full.iter().position(|&p| p == id).unwrap();
            for x in 0..k {
                for y in 0..k {
                    if x != y && before[x][y] {
                        assert!(
                            at(c.accounts[x].id) < at(c.accounts[y].id),
                            "the full order {full:?} disagrees with the pair a{x} < a{y}: {}",
                            context()
                        );
                    }
                }
            }
        }
    }
}

const BUILTINS: [&str; 8] = [
    "skip-exhausted",
    "headroom",
    "fill-first",
    "expiry-first",
    "headroom-first",
    "affinity",
    "prefer-primary",
    "spill",
];

/// #23: which bucket binds a family is a function of the readings, never of
/// the order the upstream listed them in: permuting an account's windows
/// changes no built-in's order or reason.
#[test]
fn no_builtin_depends_on_the_order_of_an_accounts_windows() {
    for name in BUILTINS {
        let seed = seed_for(name, 3);
        let mut rng = Rng::new(seed);
        for n in 0..CASES / 2 {
            let case = random_case_with(&mut rng, true);
            let plugin = load(name, &case);
            let req = case.request();
            let c = case.candidates(DEFAULT_FRESHNESS_MS);
            let expected = rank_any(&plugin, &req, &c.accounts, &c.windows);
            for _ in 0..4 {
                let windows = permute_windows(&mut rng, &c.windows);
                let got = rank_any(&plugin, &req, &c.accounts, &windows);
                assert_eq!(
                    got,
                    expected,
                    "{name}, seed {seed:#x}, case {n}: reordering the windows changed the decision\n{}",
                    serde_json::to_string(&case).unwrap()
                );
            }
        }
    }
}

/// #23: a `rejected` bucket never raises headroom: marking one of an
/// account's buckets rejected never moves it earlier in headroom's order.
#[test]
fn a_rejected_bucket_never_moves_an_account_earlier_in_headroom() {
    use poolgate::policy::types::WindowStatus;
    let seed = seed_for("headroom", 4);
    let mut rng = Rng::new(seed);
    let plugin = load("headroom", &random_case(&mut Rng::new(1)));
    for n in 0..CASES {
        let case = random_case_with(&mut rng, true);
        let req = case.request();
        let c = case.candidates(DEFAULT_FRESHNESS_MS);
        let (before, _) = rank(&plugin, &req, &c.accounts, &c.windows);
        let buckets: Vec<usize> = (0..c.windows.len())
            .filter(|&i| c.windows[i].kind == poolgate::policy::types::WindowKind::SevenDayModel)
            .collect();
        if buckets.is_empty() {
            continue;
        }
        let i = buckets[rng.below(buckets.len())];
        let mut windows = c.windows.clone();
        windows[i].status = WindowStatus::Rejected;
        let account = windows[i].account;
        let (after, _) = rank(&plugin, &req, &c.accounts, &windows);
        let at = |order: &[u32]| order.iter().position(|&a| a == account).unwrap();
        assert!(
            at(&after) >= at(&before),
            "seed {seed:#x}, case {n}: rejecting window {i} moved account {account} from {} to {}\n{}",
            at(&before),
            at(&after),
            serde_json::to_string(&case).unwrap()
        );
    }
}

#[test]
fn a_bad_option_refuses_the_plugin_and_is_named() {
    let case = common::pool_case(2);
    let bad = [
        ("headroom", json!({ "floor": 2.0 }), "floor"),
        ("headroom", json!({ "flor": 0.1 }), "flor"),
        ("fill-first", json!({ "floor": -0.5 }), "floor"),
        ("fill-first", json!({ "buckets": 3 }), "buckets"),
        ("expiry-first", json!({ "session_soft_limit": 0.0 }), "session_soft_limit"),
        ("expiry-first", json!({ "session_soft_limit": 1.01 }), "session_soft_limit"),
        ("expiry-first", json!({ "session_reset_tolerance_ms": 0 }), "session_reset_tolerance_ms"),
        ("headroom-first", json!({ "session_reset_tolerance_ms": 60000 }), "session_reset_tolerance_ms"),
        ("headroom-first", json!({ "session_soft_limit": "high" }), "session_soft_limit"),
        ("affinity", json!({ "idle_ttl_ms": 59_999 }), "idle_ttl_ms"),
        ("affinity", json!({ "idle_ttl_ms": 86_400_001 }), "idle_ttl_ms"),
        ("affinity", json!({ "max_sessions": 0 }), "max_sessions"),
        ("prefer-primary", json!({ "primary": "a0" }), "primary"),
        ("spill", json!({ "spill_inflight": 101 }), "spill_inflight"),
        ("spill", json!({ "spill_inflight": -1 }), "spill_inflight"),
        ("skip-exhausted", json!({ "buckets": ["oi"] }), "buckets"),
    ];
    for (name, config, option) in bad {
        let plugin = PluginRef::parse(&format!("builtin:{name}"));
        let spec = PluginSpec {
            scope: plugin.default_scope(),
            plugin,
            config_json: config.to_string(),
            limits: Limits::default(),
            max_idle: 1,
            max_instances: 1,
        };
        let err = match poolgate::policy::block_on(Plugin::load(
            &ENGINE,
            spec,
            case.pool(),
            Arc::new(MemoryState::default()),
        )) {
            Ok(_) => panic!("builtin:{name} accepted {config}"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.contains(&format!("`{option}`")), "builtin:{name} with {config}: {err}");
    }
    // And the defaults and the edges of every range are accepted.
    let good = [
        ("affinity", json!({ "idle_ttl_ms": 60_000, "max_sessions": 1 })),
        ("affinity", json!({ "idle_ttl_ms": 86_400_000, "session_soft_limit": 1.0 })),
        ("spill", json!({ "spill_inflight": 100 })),
        (
            "expiry-first",
            json!({ "session_soft_limit": 0.5, "session_reset_tolerance_ms": 1, "buckets": { "xy": "opus" } }),
        ),
    ];
    for name in COMPARATORS.iter().chain(&["affinity", "prefer-primary", "spill", "skip-exhausted"]) {
        load(name, &case);
    }
    for (name, config) in good {
        let plugin = PluginRef::parse(&format!("builtin:{name}"));
        let spec = PluginSpec {
            scope: plugin.default_scope(),
            plugin,
            config_json: config.to_string(),
            limits: Limits::default(),
            max_idle: 1,
            max_instances: 1,
        };
        if let Err(e) =
            poolgate::policy::block_on(Plugin::load(&ENGINE, spec, case.pool(), Arc::new(MemoryState::default())))
        {
            panic!("builtin:{name} refused {config}: {e:#}");
        }
    }
}
