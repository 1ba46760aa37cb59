//! What one replica tells the others about an account, and how a replica
//! folds what it hears into its own view: plain data and pure functions.
//!
//! Every replica writes only its own record of each account, and every fact
//! in it carries when it was learned. A replica merges the others' records
//! into its view fact by fact, by that time, so the merge is the same in any
//! order and any number of times (a join): a replica that was cut off and
//! comes back with old readings cannot overwrite newer ones, because nothing
//! is ever overwritten by arrival — only by observed time.
//!
//! - quota windows: per window, the newest `observed_at_ms` wins; a window
//!   with no observed time is treated as absent (seed 003: never trust an
//!   unstamped reading);
//! - the top-level status (status, reset, binding claim, overage): the
//!   newest reading wins;
//! - cooldowns: of those still in force and not lifted by a later success,
//!   the one that ends last wins (a 2xx clears as it does on one gateway:
//!   every cooldown a success lifts that was set before it; an operator's
//!   clear, every cooldown set before it);
//! - model gates: the same, per family;
//! - failure streaks: each replica's own count, summed by the reader while no
//!   success came after them (see `Learned::effective_streaks`).
//!
//! Records bind to the account's identity: a record whose identity differs
//! from this replica's idea of the account (another key under the same id, a
//! seat re-logged into another organization) is ignored, and so is one whose
//! times lie in the future beyond [`MAX_SKEW_MS`] (a broken clock would
//! otherwise win every merge for ever).
//!
//! The same record is what a single gateway keeps in its state file across a
//! restart (`gateway::persist`): `restore` merges it like a replica's, and
//! takes its streaks back as this gateway's own.

use serde::{Deserialize, Serialize};

use crate::account::{Cooldown, CooldownReason, ModelGate, Status, WindowReading};
use crate::learned::accounts::{Learned, REMOTE_STREAK_MS as STREAK_MS};
use crate::learned::cooldown::{Streaks, lifted_by_success};

/// The record format; a reader ignores records of another version.
pub const VERSION: u32 = 1;

/// How far in the future a shared time may lie before the record is refused
/// as garbage (clock skew between replicas is expected to be far below).
pub const MAX_SKEW_MS: u64 = 60_000;

/// One replica's record of one account.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountFacts {
    /// [`VERSION`].
    pub v: u32,
    /// Who the account's credential belongs to (see `AccountState::identity`).
    pub identity: String,
    /// When the record was written.
    pub written_ms: u64,
    /// Quota windows, each with its observed time.
    #[serde(default)]
    pub windows: Vec<WindowReading>,
    /// The newest top-level reading.
    #[serde(default)]
    pub top: Option<Top>,
    /// The cooldown in force, with when it was set.
    #[serde(default)]
    pub cooldown: Option<Stamped>,
    /// The last success (cooldowns it lifts, set before it, are over).
    #[serde(default)]
    pub cleared_ms: u64,
    /// The last new token of a seat.
    #[serde(default)]
    pub auth_cleared_ms: u64,
    /// The last operator's clear (every cooldown set before it is over).
    /// Left out while there was none, so that records stay readable by
    /// replicas that predate it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cleared_all_ms: u64,
    /// Model gates in force, with when each was set.
    #[serde(default)]
    pub gates: Vec<Gate>,
    /// When a success last cleared each family's gate.
    #[serde(default)]
    pub gates_cleared: Vec<(String, u64)>,
    /// The writer's own failure streaks.
    #[serde(default)]
    pub streaks: Streaks,
    /// When they last changed.
    #[serde(default)]
    pub streaks_ms: u64,
}

/// The top-level part of a quota reading.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Top {
    /// When it was read.
    pub at_ms: u64,
    /// Unified status.
    pub status: Status,
    /// Unified reset.
    #[serde(default)]
    pub reset_ms: Option<u64>,
    /// The binding window.
    #[serde(default)]
    pub claim: Option<String>,
    /// Overage status.
    #[serde(default)]
    pub overage_status: Option<Status>,
    /// Why overage is disabled.
    #[serde(default)]
    pub overage_reason: Option<String>,
}

/// A cooldown with when it was set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stamped {
    /// When it ends.
    pub until_ms: u64,
    /// Why.
    pub reason: CooldownReason,
    /// When it was set.
    pub set_ms: u64,
}

/// A model gate with when it was set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gate {
    /// The family.
    pub family: String,
    /// When it ends.
    pub until_ms: u64,
    /// When it was set.
    pub set_ms: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What merging a record did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Absorbed {
    /// Merged; whether anything in this replica's view changed.
    Merged(bool),
    /// The record is about another identity (or this replica does not know
    /// the account's yet): ignored.
    OtherIdentity,
    /// The record cannot be right (another version, times in the future,
    /// nonsense numbers): ignored, and counted as a backend error.
    Garbage(&'static str),
}

/// This replica's record of an account, as of `now`.
pub(crate) fn export(l: &Learned, identity: &str, now: u64) -> AccountFacts {
    let top = l.last_reading_ms.map(|at_ms| Top {
        at_ms,
        status: l.status,
        reset_ms: l.reset_ms,
        claim: l.representative_claim.clone(),
        overage_status: l.overage_status,
        overage_reason: l.overage_disabled_reason.clone(),
    });
    let gates = l
        .model_gates
        .iter()
        .filter(|g| g.until_ms > now)
        .map(|g| Gate {
            family: g.family.clone(),
            until_ms: g.until_ms,
            set_ms: l.gates_set_ms.get(&g.family).copied().unwrap_or(0),
        })
        .collect();
    AccountFacts {
        v: VERSION,
        identity: identity.to_string(),
        written_ms: now,
        windows: l.windows.values().filter(|w| w.observed_at_ms.is_some()).cloned().collect(),
        top,
        cooldown: l.cooldown.filter(|c| c.until_ms > now).map(|c| Stamped {
            until_ms: c.until_ms,
            reason: c.reason,
            set_ms: l.cooldown_set_ms,
        }),
        cleared_ms: l.cleared_ms,
        auth_cleared_ms: l.auth_cleared_ms,
        cleared_all_ms: l.cleared_all_ms,
        gates,
        gates_cleared: l.gates_cleared_ms.iter().map(|(f, t)| (f.clone(), *t)).collect(),
        streaks: l.streaks,
        streaks_ms: l.streaks_ms,
    }
}

/// Why `f` cannot be a record a replica wrote at or before `now`.
pub fn implausible(f: &AccountFacts, now: u64) -> Option<&'static str> {
    if f.v != VERSION {
        return Some("another record version");
    }
    let future = |t: u64| t > now.saturating_add(MAX_SKEW_MS);
    let stamps = [f.written_ms, f.cleared_ms, f.auth_cleared_ms, f.cleared_all_ms, f.streaks_ms]
        .into_iter()
        .chain(f.top.as_ref().map(|t| t.at_ms))
        .chain(f.cooldown.map(|c| c.set_ms))
        .chain(f.gates.iter().map(|g| g.set_ms))
        .chain(f.gates_cleared.iter().map(|(_, t)| *t))
        .chain(f.windows.iter().filter_map(|w| w.observed_at_ms));
    if stamps.into_iter().any(future) {
        return Some("times in the future");
    }
    if f.windows.iter().any(|w| !w.utilization.is_finite() || w.utilization < 0.0) {
        return Some("a utilization that is not a fraction");
    }
    None
}

/// Whether cooldown `c`, set at `set_ms`, is still in force at `now` after
/// the clears of `l`: `cleared_ms` (a success), `auth_cleared_ms` (a new
/// token) and `cleared_all_ms` (an operator's). A clear lifts what was set
/// before it, not what was set in the same millisecond (an answer that clears
/// and then sets, in that order).
fn alive(c: Stamped, l: &Learned, now: u64) -> bool {
    c.until_ms > now
        && c.set_ms >= l.cleared_all_ms
        && !(lifted_by_success(c.reason) && c.set_ms < l.cleared_ms)
        && !(c.reason == CooldownReason::Auth && c.set_ms < l.auth_cleared_ms)
}

/// Merges `f`, written by `replica`, into `l` — the view of an account whose
/// identity this replica takes to be `identity`.
pub(crate) fn absorb(l: &mut Learned, f: &AccountFacts, replica: &str, identity: Option<&str>, now: u64) -> Absorbed {
    let absorbed = merge(l, f, identity, now);
    if matches!(absorbed, Absorbed::Merged(_)) {
        absorb_streaks(l, f, replica, now);
    }
    absorbed
}

/// Merges `f` — this gateway's own record, read back from its state file
/// after a restart — into `l`, as [`absorb`] does a replica's; its streaks
/// become this gateway's own again (a cooldown's backoff goes on where it
/// was), unless they are older than a replica's streaks would be counted.
pub(crate) fn restore(l: &mut Learned, f: &AccountFacts, identity: Option<&str>, now: u64) -> Absorbed {
    let absorbed = merge(l, f, identity, now);
    let recent = now.saturating_sub(f.streaks_ms) < STREAK_MS;
    if matches!(absorbed, Absorbed::Merged(_)) && recent && f.streaks_ms > l.streaks_ms {
        l.streaks = f.streaks;
        l.streaks_ms = f.streaks_ms.min(now);
    }
    absorbed
}

/// The join of `f` into `l`, streaks aside.
fn merge(l: &mut Learned, f: &AccountFacts, identity: Option<&str>, now: u64) -> Absorbed {
    if let Some(why) = implausible(f, now) {
        return Absorbed::Garbage(why);
    }
    if identity != Some(f.identity.as_str()) {
        return Absorbed::OtherIdentity;
    }
    let mut changed = false;
    for w in &f.windows {
        // A writer's clock a little ahead must not freeze this replica's own
        // readings until it catches up: its times count as at most now.
        let Some(at) = w.observed_at_ms.map(|t| t.min(now)) else { continue };
        let newer = l.windows.get(&w.name).is_none_or(|mine| mine.observed_at_ms.is_none_or(|t| t < at));
        if newer {
            l.windows.insert(w.name.clone(), WindowReading { observed_at_ms: Some(at), ..w.clone() });
            changed = true;
        }
    }
    if let Some(top) = &f.top
        && l.last_reading_ms.is_none_or(|t| t < top.at_ms.min(now))
    {
        l.status = top.status;
        l.reset_ms = top.reset_ms;
        l.representative_claim = top.claim.clone();
        l.overage_status = top.overage_status;
        l.overage_disabled_reason = top.overage_reason.clone();
        l.last_reading_ms = Some(top.at_ms.min(now));
        changed = true;
    }
    changed |= join_cooldowns(l, f, now);
    changed |= join_gates(l, f, now);
    Absorbed::Merged(changed)
}

/// Another replica's own streaks, and a success it saw ending this one's.
fn absorb_streaks(l: &mut Learned, f: &AccountFacts, replica: &str, now: u64) {
    let streak = l.remote_streaks.get(replica).map(|(_, at)| *at);
    if streak.is_none_or(|at| at < f.streaks_ms) {
        l.remote_streaks.insert(replica.to_string(), (f.streaks, f.streaks_ms));
    }
    if f.cleared_ms > l.streaks_ms {
        l.streaks = Streaks { stream_cuts: l.streaks.stream_cuts, ..Streaks::default() };
    }
    if f.cleared_all_ms > l.streaks_ms {
        l.streaks = Streaks::default();
    }
    // Replicas that stopped writing (restarted under a new name, gone).
    l.remote_streaks.retain(|_, (_, at)| now.saturating_sub(*at) < STREAK_MS);
}

fn join_cooldowns(l: &mut Learned, f: &AccountFacts, now: u64) -> bool {
    let before = (l.cooldown, l.cooldown_set_ms);
    l.cleared_ms = l.cleared_ms.max(f.cleared_ms);
    l.auth_cleared_ms = l.auth_cleared_ms.max(f.auth_cleared_ms);
    l.cleared_all_ms = l.cleared_all_ms.max(f.cleared_all_ms);
    let mine = l.cooldown.map(|c| Stamped { until_ms: c.until_ms, reason: c.reason, set_ms: l.cooldown_set_ms });
    let best =
        [mine, f.cooldown].into_iter().flatten().filter(|c| alive(*c, l, now)).max_by_key(|c| (c.until_ms, c.set_ms));
    (l.cooldown, l.cooldown_set_ms) = match best {
        Some(c) => (Some(Cooldown { until_ms: c.until_ms, reason: c.reason }), c.set_ms),
        None => (None, l.cooldown_set_ms),
    };
    before.0 != l.cooldown
}

fn join_gates(l: &mut Learned, f: &AccountFacts, now: u64) -> bool {
    let mut changed = false;
    for (family, t) in &f.gates_cleared {
        let e = l.gates_cleared_ms.entry(family.clone()).or_insert(0);
        *e = (*e).max(*t);
    }
    for g in &f.gates {
        let cleared = l.gates_cleared_ms.get(&g.family).copied().unwrap_or(0);
        // As for cooldowns: the gate that ends last, and of two that end
        // together the one set last — else which one a replica keeps (and
        // so which later clear lifts it) depends on the order records came.
        let mine = l
            .model_gates
            .iter()
            .find(|m| m.family == g.family)
            .map(|m| (m.until_ms, l.gates_set_ms.get(&m.family).copied().unwrap_or(0)));
        if g.until_ms > now && g.set_ms >= cleared && mine.is_none_or(|m| m < (g.until_ms, g.set_ms)) {
            l.model_gates.retain(|m| m.family != g.family);
            l.model_gates.push(ModelGate { family: g.family.clone(), until_ms: g.until_ms });
            l.gates_set_ms.insert(g.family.clone(), g.set_ms);
            changed = true;
        }
    }
    // A gate of this replica's that another replica's success has since cleared.
    let (set, cleared) = (&l.gates_set_ms, &l.gates_cleared_ms);
    let n = l.model_gates.len();
    l.model_gates.retain(|m| {
        let set = set.get(&m.family).copied().unwrap_or(0);
        cleared.get(&m.family).is_none_or(|c| set >= *c)
    });
    changed | (n != l.model_gates.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_760_000_000_000;
    const ID: Option<&str> = Some("key:abc");

    fn window(name: &str, utilization: f64, at: u64) -> WindowReading {
        WindowReading {
            name: name.into(),
            utilization,
            resets_at_ms: Some(NOW + 3_600_000),
            status: if utilization >= 1.0 { Status::Rejected } else { Status::Allowed },
            observed_at_ms: Some(at),
        }
    }

    fn facts(windows: Vec<WindowReading>) -> AccountFacts {
        AccountFacts {
            v: VERSION,
            identity: "key:abc".into(),
            written_ms: NOW,
            windows,
            top: None,
            cooldown: None,
            cleared_ms: 0,
            auth_cleared_ms: 0,
            cleared_all_ms: 0,
            gates: Vec::new(),
            gates_cleared: Vec::new(),
            streaks: Streaks::default(),
            streaks_ms: 0,
        }
    }

    #[test]
    fn the_newest_reading_of_each_window_wins_in_any_order() {
        let old = facts(vec![window("5h", 0.9, NOW - 10), window("7d", 0.1, NOW - 10)]);
        let new = facts(vec![window("5h", 0.2, NOW - 5)]);
        for order in [[&old, &new], [&new, &old]] {
            let mut l = Learned::default();
            for f in order {
                absorb(&mut l, f, "b", ID, NOW);
            }
            assert_eq!(l.windows["5h"].utilization, 0.2, "a stale writer never overwrites a fresher reading");
            assert_eq!(l.windows["7d"].utilization, 0.1);
        }
    }

    #[test]
    fn an_unstamped_window_or_another_identity_is_absent() {
        let mut l = Learned::default();
        let mut unstamped = window("5h", 1.0, NOW);
        unstamped.observed_at_ms = None;
        absorb(&mut l, &facts(vec![unstamped]), "b", ID, NOW);
        assert!(l.windows.is_empty());
        let f = facts(vec![window("5h", 1.0, NOW)]);
        assert_eq!(absorb(&mut l, &f, "b", Some("key:other"), NOW), Absorbed::OtherIdentity);
        assert_eq!(absorb(&mut l, &f, "b", None, NOW), Absorbed::OtherIdentity);
        assert!(l.windows.is_empty());
    }

    #[test]
    fn future_times_and_nonsense_are_garbage() {
        let mut l = Learned::default();
        let f = facts(vec![window("5h", 0.1, NOW + MAX_SKEW_MS + 1)]);
        assert!(matches!(absorb(&mut l, &f, "b", ID, NOW), Absorbed::Garbage(_)));
        let f = facts(vec![window("5h", f64::NAN, NOW)]);
        assert!(matches!(absorb(&mut l, &f, "b", ID, NOW), Absorbed::Garbage(_)));
        assert!(l.windows.is_empty());
    }

    #[test]
    fn the_longer_cooldown_wins_and_a_later_success_clears_it() {
        let mut l = Learned {
            cooldown: Some(Cooldown { until_ms: NOW + 1_000, reason: CooldownReason::Overloaded }),
            cooldown_set_ms: NOW - 100,
            ..Learned::default()
        };
        let mut f = facts(vec![]);
        f.cooldown =
            Some(Stamped { until_ms: NOW + 60_000, reason: CooldownReason::WeeklyExhausted, set_ms: NOW - 50 });
        absorb(&mut l, &f, "b", ID, NOW);
        assert_eq!(l.cooldown.unwrap().reason, CooldownReason::WeeklyExhausted);
        // A shorter one from elsewhere changes nothing.
        f.cooldown = Some(Stamped { until_ms: NOW + 10, reason: CooldownReason::Transient, set_ms: NOW - 1 });
        assert_eq!(absorb(&mut l, &f, "c", ID, NOW), Absorbed::Merged(false));
        // A success after it, on another replica, lifts it.
        let mut ok = facts(vec![]);
        ok.cleared_ms = NOW - 10;
        absorb(&mut l, &ok, "c", ID, NOW);
        assert_eq!(l.cooldown, None);
        // ...and the record that still carries it cannot bring it back.
        f.cooldown =
            Some(Stamped { until_ms: NOW + 60_000, reason: CooldownReason::WeeklyExhausted, set_ms: NOW - 50 });
        absorb(&mut l, &f, "b", ID, NOW);
        assert_eq!(l.cooldown, None);
    }

    #[test]
    fn an_operators_clear_on_one_replica_lifts_every_older_cooldown_everywhere() {
        // Replica b still carries an overage rest (not lifted by a success).
        let mut here = Learned {
            cooldown: Some(Cooldown { until_ms: NOW + 60_000, reason: CooldownReason::Overage }),
            cooldown_set_ms: NOW - 100,
            ..Learned::default()
        };
        let mut cleared = facts(vec![]);
        cleared.cleared_all_ms = NOW - 10;
        absorb(&mut here, &cleared, "a", ID, NOW);
        assert_eq!(here.cooldown, None);
        let mut stale = facts(vec![]);
        stale.cooldown = Some(Stamped { until_ms: NOW + 60_000, reason: CooldownReason::Overage, set_ms: NOW - 100 });
        absorb(&mut here, &stale, "b", ID, NOW);
        assert_eq!(here.cooldown, None, "an older record cannot bring it back");
        stale.cooldown = Some(Stamped { until_ms: NOW + 60_000, reason: CooldownReason::Overage, set_ms: NOW - 5 });
        absorb(&mut here, &stale, "b", ID, NOW);
        assert!(here.cooldown.is_some(), "one set after the clear stands");
        let json = serde_json::to_string(&facts(vec![])).unwrap();
        assert!(!json.contains("cleared_all_ms"), "left out until there is one: older replicas read the record");
    }

    #[test]
    fn restoring_its_own_record_brings_back_its_streaks() {
        let mut f = facts(vec![]);
        f.streaks = Streaks { overloaded: 3, ..Streaks::default() };
        f.streaks_ms = NOW - 1_000;
        let mut l = Learned::default();
        assert_eq!(restore(&mut l, &f, ID, NOW), Absorbed::Merged(false));
        assert_eq!((l.streaks.overloaded, l.remote_streaks.len()), (3, 0));
        let mut old = Learned::default();
        restore(&mut old, &f, ID, NOW + STREAK_MS);
        assert_eq!(old.streaks.overloaded, 0, "a streak too old to count is not restored");
    }

    #[test]
    fn gates_join_per_family_and_clear_by_success() {
        let mut l = Learned::default();
        let mut f = facts(vec![]);
        f.gates = vec![Gate { family: "opus".into(), until_ms: NOW + 5_000, set_ms: NOW - 20 }];
        absorb(&mut l, &f, "b", ID, NOW);
        assert_eq!(l.model_gates.len(), 1);
        let mut ok = facts(vec![]);
        ok.gates_cleared = vec![("opus".into(), NOW - 10)];
        absorb(&mut l, &ok, "c", ID, NOW);
        assert!(l.model_gates.is_empty());
    }

    /// Found by fuzzing (`fuzz/corpus/replica_merge/regress-gate-tie`): two
    /// replicas' gates on one family ending together but set a millisecond
    /// apart — the view kept whichever arrived first, so a clear between the
    /// two lifted the gate on one replica and not on another.
    #[test]
    fn of_two_gates_ending_together_the_one_set_last_wins_in_any_order() {
        let gate = |set_ms| {
            let mut f = facts(vec![]);
            f.gates = vec![Gate { family: "opus".into(), until_ms: NOW + 5_000, set_ms }];
            f
        };
        let (early, late) = (gate(NOW - 20), gate(NOW - 19));
        for order in [[&early, &late], [&late, &early]] {
            let mut l = Learned::default();
            for f in order {
                absorb(&mut l, f, "b", ID, NOW);
            }
            assert_eq!(l.gates_set_ms.get("opus"), Some(&(NOW - 19)));
        }
    }

    #[test]
    fn export_then_absorb_reproduces_the_view() {
        let mut a = Learned::default();
        a.windows.insert("5h".into(), window("5h", 1.0, NOW - 1));
        a.last_reading_ms = Some(NOW - 1);
        a.status = Status::Rejected;
        a.cooldown = Some(Cooldown { until_ms: NOW + 9_000, reason: CooldownReason::SessionExhausted });
        a.cooldown_set_ms = NOW - 1;
        let f = export(&a, "key:abc", NOW);
        let json = serde_json::to_string(&f).unwrap();
        let back: AccountFacts = serde_json::from_str(&json).unwrap();
        let mut b = Learned::default();
        assert_eq!(absorb(&mut b, &back, "a", ID, NOW), Absorbed::Merged(true));
        assert_eq!((b.status, b.cooldown, b.windows.len()), (Status::Rejected, a.cooldown, 1));
        assert_eq!(absorb(&mut b, &back, "a", ID, NOW), Absorbed::Merged(false), "merging twice changes nothing");
    }
}
