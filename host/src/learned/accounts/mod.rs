//! What the gateway has learned about each account: its quota readings, cooldowns,
//! failure streaks, counters and in-flight count.
//!
//! This state is keyed by account id and outlives configuration generations: a
//! reload that keeps an account keeps what was learned about it, and a request
//! that started on an old generation releases its lease on the same counter.
//!
//! So does an operator's runtime disable (`POST /admin/accounts/{id}/disable`):
//! it holds until the operator enables the account again, whatever a reload
//! changes about it (see [`AccountState::disable`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::Serialize;

use super::cooldown::{self, Answer, CooldownConfig, Plan, Streaks};
use super::quota::QuotaReading;
use crate::account::{Cooldown, CooldownReason, ModelGate, Status, WindowReading};
use crate::oauth::Seat;

mod status;
mod view;
pub use status::{AccountStatus, CooldownStatus, mark_shared_subscriptions};

/// Learned state of one account.
#[derive(Debug)]
pub struct AccountState {
    /// The account's id.
    pub id: String,
    learned: Mutex<Learned>,
    in_flight: AtomicU32,
    /// Requests sent to this account (every attempt).
    pub attempts: AtomicU64,
    /// Attempts answered 2xx.
    pub successes: AtomicU64,
    /// An OAuth seat's token and refresh state, kept across reloads like
    /// everything else learned about the account.
    seat: Mutex<Option<Arc<Seat>>>,
    /// Counts this replica's own changes to what is learned, so that a
    /// shared backend writes an account only when it changed.
    version: AtomicU64,
    /// Who the account's credential belongs to (see [`AccountState::identity`]).
    binding: Mutex<Option<String>>,
    /// Set while an operator has taken the account out of routing.
    runtime_disabled: Mutex<Option<RuntimeDisable>>,
    /// Whether `runtime_disabled` is set: read by every rank, without a lock.
    out_of_routing: AtomicBool,
}

/// An operator's runtime disable of an account: not routed to until enabled
/// again (`POST /admin/accounts/{id}/enable`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeDisable {
    /// When (ms since the epoch).
    pub at_ms: u64,
    /// Who, as the operator named themselves (`admin` when they did not).
    pub by: String,
    /// Why, as they said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What an operator's clear lifted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Cleared {
    /// The cooldown in force, if one was lifted.
    pub cooldown: Option<Cooldown>,
    /// The model gates in force that were lifted.
    pub gates: Vec<ModelGate>,
}

/// What is learned about an account. Every fact a replica may share carries
/// when it was learned, so that replicas merge by observed time
/// (`crate::learned::facts`).
#[derive(Debug, Default)]
pub(crate) struct Learned {
    pub(crate) windows: BTreeMap<String, WindowReading>,
    pub(crate) status: Status,
    pub(crate) reset_ms: Option<u64>,
    pub(crate) representative_claim: Option<String>,
    pub(crate) overage_status: Option<Status>,
    pub(crate) overage_disabled_reason: Option<String>,
    pub(crate) organization_id: Option<String>,
    pub(crate) last_reading_ms: Option<u64>,
    pub(crate) cooldown: Option<Cooldown>,
    /// When the cooldown in force was set.
    pub(crate) cooldown_set_ms: u64,
    /// The last operator's clear: every cooldown set before it is over,
    /// whatever its cause, on every replica.
    pub(crate) cleared_all_ms: u64,
    /// The last 2xx: cooldowns a success lifts that were set before it are over.
    pub(crate) cleared_ms: u64,
    /// The last new token of a seat: auth cooldowns set before it are over.
    pub(crate) auth_cleared_ms: u64,
    pub(crate) model_gates: Vec<ModelGate>,
    /// When each family's gate was set, and when a success last cleared it.
    pub(crate) gates_set_ms: BTreeMap<String, u64>,
    pub(crate) gates_cleared_ms: BTreeMap<String, u64>,
    /// This replica's own failure streaks, and when they last changed.
    pub(crate) streaks: Streaks,
    pub(crate) streaks_ms: u64,
    /// Other replicas' own streaks, by replica, with when they changed.
    pub(crate) remote_streaks: BTreeMap<String, (Streaks, u64)>,
    pub(crate) last_status: Option<u16>,
}

/// How long another replica's failure streak counts toward this one's, when
/// no success has been seen since.
pub(crate) const REMOTE_STREAK_MS: u64 = 10 * 60 * 1000;

impl Learned {
    /// The streaks a cooldown decision counts: this replica's, plus every
    /// other replica's that changed after the last success anyone saw (one
    /// account failing on three replicas is one failing account).
    fn effective_streaks(&self, now: u64) -> Streaks {
        let mut s = self.streaks;
        for (r, at) in self.remote_streaks.values() {
            if *at > self.cleared_ms.max(self.cleared_all_ms) && now.saturating_sub(*at) < REMOTE_STREAK_MS {
                s.auth = s.auth.saturating_add(r.auth);
                s.overloaded = s.overloaded.saturating_add(r.overloaded);
                s.upstream_error = s.upstream_error.saturating_add(r.upstream_error);
                s.stream_cuts = s.stream_cuts.saturating_add(r.stream_cuts);
            }
        }
        s
    }

    fn set_cooldown(&mut self, c: Cooldown, now: u64) {
        self.cooldown = Some(c);
        self.cooldown_set_ms = now;
    }
}

/// What recording an answer changed, for metrics and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Nothing worth reporting.
    None,
    /// A new cooldown started.
    Cooled(CooldownReason),
    /// A model family was gated.
    Gated(String),
    /// Cooldowns were lifted.
    Cleared,
}

impl AccountState {
    /// Fresh state for account `id`.
    pub fn new(id: &str) -> Self {
        AccountState {
            id: id.to_string(),
            learned: Mutex::new(Learned::default()),
            in_flight: AtomicU32::new(0),
            attempts: AtomicU64::new(0),
            successes: AtomicU64::new(0),
            seat: Mutex::new(None),
            version: AtomicU64::new(0),
            binding: Mutex::new(None),
            runtime_disabled: Mutex::new(None),
            out_of_routing: AtomicBool::new(false),
        }
    }

    /// Takes the account out of routing until [`AccountState::enable`]; the
    /// disable already in force, if there was one (it stays as it was).
    ///
    /// A reload keeps it, even one that changes the account's credential: the
    /// operator took it out for a reason the file does not know, and an
    /// unrelated edit silently sending traffic back to it is the surprise to
    /// avoid. Enabling it is one request.
    pub fn disable(&self, by: &str, note: Option<String>, now: u64) -> Result<RuntimeDisable, RuntimeDisable> {
        let mut d = self.runtime_disabled.lock();
        if let Some(existing) = d.clone() {
            return Err(existing);
        }
        let set = RuntimeDisable { at_ms: now, by: by.to_string(), note };
        *d = Some(set.clone());
        self.out_of_routing.store(true, Ordering::Release);
        // The state file records it (`persist`).
        self.changed();
        Ok(set)
    }

    /// Routes to the account again; the disable that was in force, if any.
    pub fn enable(&self) -> Option<RuntimeDisable> {
        let mut d = self.runtime_disabled.lock();
        let was = d.take();
        self.out_of_routing.store(false, Ordering::Release);
        drop(d);
        if was.is_some() {
            self.changed();
        }
        was
    }

    /// The operator's disable in force, if any.
    pub fn runtime_disabled(&self) -> Option<RuntimeDisable> {
        self.runtime_disabled.lock().clone()
    }

    /// Whether an operator has taken the account out of routing.
    pub fn is_runtime_disabled(&self) -> bool {
        self.out_of_routing.load(Ordering::Acquire)
    }

    /// Restores a disable read back from the state file.
    pub(crate) fn restore_disable(&self, d: RuntimeDisable) {
        *self.runtime_disabled.lock() = Some(d);
        self.out_of_routing.store(true, Ordering::Release);
    }

    /// An operator's clear at `now`: lifts the cooldown in force (with
    /// `cooldown`) and the model gates of `gates` (`None`: every gate),
    /// resets the failure streaks a cleared cooldown escalated from, and
    /// stamps the clear so that other replicas' records set before it cannot
    /// bring any of it back (`learned::facts`).
    pub fn clear(&self, cooldown: bool, gates: Option<&[String]>, now: u64) -> Cleared {
        let mut l = self.learned.lock();
        self.changed();
        let mut cleared = Cleared::default();
        if cooldown {
            cleared.cooldown = l.cooldown.filter(|c| c.until_ms > now);
            l.cooldown = None;
            l.cleared_all_ms = now;
            l.streaks = Streaks::default();
            l.streaks_ms = now;
        }
        let lift = |family: &str| gates.is_none_or(|g| g.iter().any(|f| f == family));
        let (lifted, kept): (Vec<ModelGate>, Vec<ModelGate>) = l.model_gates.drain(..).partition(|g| lift(&g.family));
        l.model_gates = kept;
        for g in &lifted {
            l.gates_cleared_ms.insert(g.family.clone(), now);
        }
        if let Some(families) = gates {
            // A gate another replica set before now, not here yet, is lifted too.
            for f in families {
                l.gates_cleared_ms.insert(f.clone(), now);
            }
        }
        cleared.gates = lifted.into_iter().filter(|g| g.until_ms > now).collect();
        cleared
    }

    /// Sets who a static credential belongs to: an API key's fingerprint
    /// (`None` for a seat, whose identity follows its tokens).
    pub fn bind(&self, binding: Option<String>) {
        *self.binding.lock() = binding;
    }

    /// Who the account's answers belong to: the configured binding, else the
    /// organization its answers named. Shared readings are exchanged only
    /// between replicas that agree on it; `None` shares nothing.
    pub fn identity(&self) -> Option<String> {
        if let Some(b) = self.binding.lock().clone() {
            return Some(b);
        }
        // A seat's identity is the one its tokens belong to now (a new login
        // may be another organization's), else what its answers named.
        if let Some(org) = self.seat().and_then(|s| s.organization()) {
            return Some(format!("org:{org}"));
        }
        self.learned.lock().organization_id.as_ref().map(|o| format!("org:{o}"))
    }

    /// This replica's changes so far (see `AccountState::learned`).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    fn changed(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// What is learned, for the shared backend to export or merge into.
    pub(crate) fn learned(&self) -> parking_lot::MutexGuard<'_, Learned> {
        self.learned.lock()
    }

    /// The account's OAuth seat for credentials file `path`: the one it has if
    /// it is for that file and was made with the same `[oauth]` settings, else
    /// a new one from `make`.
    pub fn seat_for(
        &self,
        path: &std::path::Path,
        config: &crate::config::OAuthConfig,
        make: impl FnOnce() -> anyhow::Result<Arc<Seat>>,
    ) -> anyhow::Result<Arc<Seat>> {
        let mut slot = self.seat.lock();
        if let Some(s) = slot.as_ref().filter(|s| s.path() == path && s.config() == config) {
            return Ok(s.clone());
        }
        let seat = make()?;
        *slot = Some(seat.clone());
        Ok(seat)
    }

    /// The account's OAuth seat, if it is one.
    pub fn seat(&self) -> Option<Arc<Seat>> {
        self.seat.lock().clone()
    }

    /// Forgets what was learned about the account's quota and cooldowns: its
    /// seat now belongs to another identity, whose readings are not these.
    pub fn forget_learned(&self) {
        let mut l = self.learned.lock();
        self.changed();
        *l = Learned::default();
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Takes an in-flight slot if fewer than `max` are taken.
    pub fn try_take(&self, max: Option<u32>) -> bool {
        let max = max.unwrap_or(u32::MAX);
        self.in_flight.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).is_ok()
    }

    /// Gives a slot back.
    pub fn give_back(&self) {
        let _ = self.in_flight.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_sub(1)));
    }

    /// The cooldown in force at `now`, if any.
    pub fn cooldown(&self, now: u64) -> Option<Cooldown> {
        self.learned.lock().cooldown.filter(|c| c.until_ms > now)
    }

    /// Merges a quota reading (windows are replaced by name; a reading never
    /// overwrites a newer one). With `account_wide` false the top-level status
    /// is the bucket's, not the account's: a per-model rejection says
    /// `rejected` at the top, but only for that model's family (dario #1385),
    /// so the account reads `allowed_warning`.
    fn merge(l: &mut Learned, r: &QuotaReading, now: u64, account_wide: bool) {
        if r.is_empty() && r.organization_id.is_none() {
            return;
        }
        if let Some(org) = &r.organization_id {
            // Another subscription now answers under this account id (a
            // re-login to a different identity): nothing learned about the
            // old one is this one's.
            if l.organization_id.as_ref().is_some_and(|o| o != org) {
                tracing::warn!(organization = %org, "the account answers as another organization now; its old quota readings and cooldowns are dropped");
                *l = Learned::default();
            }
            // Every answer names it, and every seat of the organization
            // merges it (`merge_shared`): copied only when it changes.
            if l.organization_id.as_deref() != Some(org.as_str()) {
                l.organization_id = Some(org.clone());
            }
        }
        if r.is_empty() {
            return;
        }
        if l.last_reading_ms.is_some_and(|t| t > now) {
            return;
        }
        for w in &r.windows {
            // A window read before is updated in place: its name (twice, as
            // key and field) is not copied again for every answer (#30).
            match l.windows.get_mut(&w.name) {
                Some(known) => known.clone_from(w),
                None => drop(l.windows.insert(w.name.clone(), w.clone())),
            }
        }
        if let Some(s) = r.status {
            // A rejection attributed to one bucket is on that bucket's window;
            // the account as a whole still serves the other families.
            (l.status, l.reset_ms) = if account_wide { (s, r.reset_ms) } else { (Status::AllowedWarning, None) };
        }
        if r.representative_claim.is_some() {
            l.representative_claim.clone_from(&r.representative_claim);
        }
        if r.overage_status.is_some() {
            l.overage_status = r.overage_status;
            l.overage_disabled_reason.clone_from(&r.overage_disabled_reason);
        }
        l.last_reading_ms = Some(now);
    }

    /// Records how an attempt ended: merges its quota reading, updates streaks and
    /// applies the cooldown plan.
    pub fn record(
        &self,
        answer: Answer,
        reading: &QuotaReading,
        family: Option<&str>,
        cfg: &CooldownConfig,
        now: u64,
    ) -> Change {
        let mut l = self.learned.lock();
        // Under the lock: a flush that reads this version exports what follows.
        self.changed();
        let auth_cooling = l.cooldown.is_some_and(|c| c.reason == CooldownReason::Auth && c.until_ms > now);
        self.count_streaks(&mut l, answer, auth_cooling, now);
        let plan = cooldown::plan(answer, reading, family, l.effective_streaks(now), cfg, now);
        let account_wide = reading.rejected_bucket.is_none() && !matches!(plan, Plan::GateModel { .. });
        Self::merge(&mut l, reading, now, account_wide);
        // A burst of 401s while already cooling does not escalate (dario: burst-safe).
        if matches!(answer, Answer::Status(401 | 403)) && auth_cooling {
            return Change::None;
        }
        Self::apply(&mut l, plan, family, now)
    }

    /// Updates the streaks and the last status for how an attempt ended; an
    /// auth failure while already cooling for auth is not counted again.
    fn count_streaks(&self, l: &mut Learned, answer: Answer, auth_cooling: bool, now: u64) {
        let streaks_before = l.streaks;
        match answer {
            Answer::Status(s) => {
                l.last_status = Some(s);
                if (200..300).contains(&s) {
                    self.successes.fetch_add(1, Ordering::Relaxed);
                    // Whether this answer streams whole is known at its end
                    // (`stream_ended`); its status alone clears the rest.
                    l.streaks = Streaks { stream_cuts: l.streaks.stream_cuts, ..Streaks::default() };
                }
                match s {
                    401 | 403 if !auth_cooling => l.streaks.auth += 1,
                    529 => l.streaks.overloaded += 1,
                    500..=599 => l.streaks.upstream_error += 1,
                    _ => {}
                }
            }
            Answer::ConnectFailed => {
                l.last_status = None;
                l.streaks.upstream_error += 1;
            }
        }
        if l.streaks != streaks_before {
            l.streaks_ms = now;
        }
    }

    /// Applies a cooldown plan; what changed.
    fn apply(l: &mut Learned, plan: Plan, family: Option<&str>, now: u64) -> Change {
        match plan {
            Plan::Keep => Change::None,
            Plan::Cool { until_ms, reason } => {
                // A cooldown never shortens one already in force for a longer cause.
                if l.cooldown.is_some_and(|c| c.until_ms > until_ms) {
                    return Change::None;
                }
                l.set_cooldown(Cooldown { until_ms, reason }, now);
                Change::Cooled(reason)
            }
            Plan::GateModel { family, until_ms } => {
                Self::gate(l, &family, until_ms, now);
                Change::Gated(family)
            }
            Plan::Clear { gates } => {
                // What other replicas set before this success is lifted too
                // (`learned::facts`): stamped before any gate this answer sets.
                l.cleared_ms = now;
                if let Some(f) = family {
                    l.gates_cleared_ms.insert(f.to_string(), now);
                }
                let had = l.cooldown.is_some_and(|c| c.until_ms > now && cooldown::lifted_by_success(c.reason));
                if had {
                    l.cooldown = None;
                }
                // A success for a gated family proves the gate stale.
                if let Some(f) = family {
                    l.model_gates.retain(|g| g.family != f);
                }
                let gated = gates.first().map(|(f, _)| f.clone());
                for (f, until_ms) in gates {
                    Self::gate(l, &f, until_ms, now);
                }
                match (had, gated) {
                    (_, Some(f)) => Change::Gated(f),
                    (true, None) => Change::Cleared,
                    (false, None) => Change::None,
                }
            }
        }
    }

    /// Cools the account until `until_ms` for `reason`, unless a longer
    /// cooldown is in force (`now_ms`: when).
    pub fn cool(&self, until_ms: u64, reason: CooldownReason, now_ms: u64) -> Change {
        let mut l = self.learned.lock();
        if l.cooldown.is_some_and(|c| c.until_ms >= until_ms) {
            return Change::None;
        }
        self.changed();
        l.set_cooldown(Cooldown { until_ms, reason }, now_ms);
        Change::Cooled(reason)
    }

    /// Lifts a cooldown for a refused credential: the seat has a new token
    /// (a refresh, or a new login), which that refusal says nothing about.
    pub fn clear_auth_cooldown(&self, now_ms: u64) {
        let mut l = self.learned.lock();
        self.changed();
        l.auth_cleared_ms = now_ms;
        if l.cooldown.is_some_and(|c| c.reason == CooldownReason::Auth) {
            l.cooldown = None;
            l.streaks.auth = 0;
        }
    }

    /// Takes a quota reading that came from elsewhere than an answer (the
    /// usage endpoint): the same merge, no cooldown plan.
    pub fn take_reading(&self, r: &QuotaReading, now: u64) {
        let mut l = self.learned.lock();
        self.changed();
        Self::merge(&mut l, r, now, r.rejected_bucket.is_none());
    }

    /// When the newest quota reading was taken.
    pub fn last_reading_ms(&self) -> Option<u64> {
        self.learned.lock().last_reading_ms
    }

    /// Whether the account's answers come from organization `org` (no copy:
    /// this runs for every account on every answer that names one).
    pub fn is_organization(&self, org: &str) -> bool {
        self.learned.lock().organization_id.as_deref() == Some(org)
    }

    /// Takes a quota reading another account of the same subscription (the
    /// same organization) received: one subscription, one quota (dario's
    /// `sharesWindowWith`). Cooldowns and streaks stay each account's own.
    pub fn merge_shared(&self, r: &QuotaReading, now: u64) {
        let mut l = self.learned.lock();
        self.changed();
        Self::merge(&mut l, r, now, r.rejected_bucket.is_none());
    }

    /// Gates `family` until `until_ms`, replacing its earlier gate.
    fn gate(l: &mut Learned, family: &str, until_ms: u64, now: u64) {
        l.model_gates.retain(|g| g.family != family && g.until_ms > now);
        l.model_gates.push(ModelGate { family: family.to_string(), until_ms });
        l.gates_set_ms.insert(family.to_string(), now);
    }

    /// Records how an answer that reached the client ended: whole, or cut
    /// after its first byte. Cuts in a row count toward cooling the account
    /// (see [`cooldown::after_cut`]); an answer that ends whole resets them.
    pub fn stream_ended(&self, whole: bool, cfg: &CooldownConfig, now: u64) -> Change {
        let mut l = self.learned.lock();
        if whole {
            if l.streaks.stream_cuts != 0 {
                self.changed();
                l.streaks.stream_cuts = 0;
                l.streaks_ms = now;
            }
            return Change::None;
        }
        self.changed();
        l.streaks.stream_cuts = l.streaks.stream_cuts.saturating_add(1);
        l.streaks_ms = now;
        match cooldown::after_cut(l.effective_streaks(now), cfg, now) {
            Plan::Cool { until_ms, reason } if l.cooldown.is_none_or(|c| c.until_ms <= until_ms) => {
                l.set_cooldown(Cooldown { until_ms, reason }, now);
                Change::Cooled(reason)
            }
            _ => Change::None,
        }
    }
}

/// The cooldown an account is under: the one learned, or — for a seat whose
/// access token expired while its refreshes fail, `unusable` until the
/// keeper's next try — `upstream_error` (the token endpoint is an upstream
/// that failed), whichever ends later. Not stored: it ends the moment a
/// refresh succeeds, and is no other replica's business.
fn with_seat(learned: Option<Cooldown>, unusable: Option<u64>) -> Option<Cooldown> {
    let seat = unusable.map(|until_ms| Cooldown { until_ms, reason: CooldownReason::UpstreamError });
    match (learned, seat) {
        (Some(l), Some(s)) => Some(if l.until_ms >= s.until_ms { l } else { s }),
        (l, s) => l.or(s),
    }
}

#[cfg(test)]
mod tests;
