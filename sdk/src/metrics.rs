//! neurolink's per-account sort metrics and its two comparators, `expiry-first`
//! and `headroom-first` (neurolink `accountSortMetrics` / `accountRanking.ts`).
//!
//! The metrics are what the comparators and the precedence modifiers (affinity,
//! prefer-primary, spill) agree on: whether an account is usable, how good its
//! quota evidence is, whether it is saturated, and when its windows reset. Keeping
//! them in one place is what makes `expiry-first → affinity → spill` behave like
//! neurolink's single `rankAccounts`.
//!
//! Readings follow neurolink's reset-freshening: a window whose reset is absent or
//! has passed is not *ticking* and reads as fresh — 0 used, `allowed`, no reset.

use std::cmp::Ordering;
use std::collections::HashMap;

use crate::quota::is_fresh;
use crate::{Buckets, Candidate, Candidates, Freshness, QuotaWindow, Ranking, Request, WindowKind, WindowStatus};
use crate::{check_range, model_family};

/// Default session soft limit: a 5h window used this much demotes its account.
pub const DEFAULT_SESSION_SOFT_LIMIT: f64 = 0.97;
/// Default width of a session-reset bucket (15 minutes).
pub const DEFAULT_SESSION_RESET_TOLERANCE_MS: u64 = 15 * 60 * 1000;

/// How trustworthy an account's quota reading is, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Evidence {
    /// A reading no older than the freshness limit.
    Fresh,
    /// Stale, but every reported status was `allowed`.
    StaleKnown,
    /// Stale, and some status was not `allowed`: the old rejection is advisory
    /// only, so the reading is set aside until it is refreshed.
    RefreshDue,
    /// No reading at all.
    Unknown,
}

impl Evidence {
    /// neurolink's `quotaEvidenceRank`: fresh and stale-known tie at 0.
    pub fn rank(self) -> u8 {
        match self {
            Evidence::Fresh | Evidence::StaleKnown => 0,
            Evidence::RefreshDue => 1,
            Evidence::Unknown => 2,
        }
    }

    /// The name used in decision details.
    pub fn as_str(self) -> &'static str {
        match self {
            Evidence::Fresh => "fresh",
            Evidence::StaleKnown => "stale_known",
            Evidence::RefreshDue => "refresh_due",
            Evidence::Unknown => "unknown",
        }
    }
}

/// Whether an account's session is saturated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saturation {
    /// Room left.
    None,
    /// The 5h window is at or above the soft limit: demoted, still usable.
    Soft,
    /// A 5h/7d window or the unified status says `rejected`, or a ticking 5h/7d
    /// window is used up: not usable.
    Hard,
}

/// The ladder's settings, shared by every plugin that reads [`SortMetrics`].
#[derive(Debug, Clone)]
pub struct Ladder {
    /// 5h utilization at or above which an account is soft-saturated, in (0, 1].
    pub session_soft_limit: f64,
    /// Width of a session-reset bucket, ms.
    pub session_reset_tolerance_ms: u64,
    /// Which family each per-model bucket binds.
    pub buckets: Buckets,
}

impl Default for Ladder {
    fn default() -> Self {
        Ladder {
            session_soft_limit: DEFAULT_SESSION_SOFT_LIMIT,
            session_reset_tolerance_ms: DEFAULT_SESSION_RESET_TOLERANCE_MS,
            buckets: Buckets::default(),
        }
    }
}

impl Ladder {
    /// Builds the settings from the options `session_soft_limit`,
    /// `session_reset_tolerance_ms` and `buckets`, refusing an out-of-range value
    /// with the option's name.
    pub fn new(
        session_soft_limit: Option<f64>,
        session_reset_tolerance_ms: Option<u64>,
        buckets: HashMap<String, String>,
    ) -> Result<Self, String> {
        let soft = session_soft_limit.unwrap_or(DEFAULT_SESSION_SOFT_LIMIT);
        // (0, 1]: a limit of 0 would saturate every account, and NaN none.
        if soft.is_nan() || soft <= 0.0 || soft > 1.0 {
            return Err(format!("option `session_soft_limit` = {soft} is out of range (greater than 0, at most 1)"));
        }
        let tolerance = check_range(
            "session_reset_tolerance_ms",
            session_reset_tolerance_ms.unwrap_or(DEFAULT_SESSION_RESET_TOLERANCE_MS),
            1,
            7 * 24 * 3600 * 1000,
        )?;
        Ok(Ladder { session_soft_limit: soft, session_reset_tolerance_ms: tolerance, buckets: Buckets::new(buckets) })
    }

    /// The metrics of every candidate, by position.
    pub fn metrics(&self, req: &Request, candidates: &Candidates) -> Vec<SortMetrics> {
        let family = model_family(&req.model);
        candidates.iter().map(|c| self.metrics_of(&c, family, req.now_ms)).collect()
    }

    /// The metrics of one candidate for a request of model `family` at `now`.
    pub fn metrics_of(&self, c: &Candidate, family: Option<&str>, now: u64) -> SortMetrics {
        let has_quota = c.quota_freshness != Freshness::Unknown;
        let stale = c.quota_freshness == Freshness::Stale;
        let five = c.window(WindowKind::FiveHour);
        let seven = c.window(WindowKind::SevenDay);
        // Raw statuses as reported; an unreported one (`unknown`) is no evidence.
        let non_allowed = [Some(c.status), five.map(|w| w.status), seven.map(|w| w.status)]
            .into_iter()
            .flatten()
            .any(|s| s != WindowStatus::Unknown && s != WindowStatus::Allowed);
        let evidence = if !has_quota {
            Evidence::Unknown
        } else if !stale {
            Evidence::Fresh
        } else if non_allowed {
            Evidence::RefreshDue
        } else {
            Evidence::StaleKnown
        };
        // A stale rejection must not quarantine an account: its reading is set
        // aside entirely, as if there were none.
        let routing = matches!(evidence, Evidence::Fresh | Evidence::StaleKnown);
        let (five_t, seven_t) = if routing { (ticking(five, now), ticking(seven, now)) } else { (None, None) };
        let read = |t: Option<&QuotaWindow>| routing.then(|| t.map_or(0.0, |w| w.utilization));
        let session_used = read(five_t);
        let weekly_used = read(seven_t);

        let hard = routing
            && (status_of(five_t) == WindowStatus::Rejected
                || status_of(seven_t) == WindowStatus::Rejected
                || c.status == WindowStatus::Rejected
                || five_t.is_some_and(|w| w.utilization >= 1.0)
                || seven_t.is_some_and(|w| w.utilization >= 1.0));
        let soft = !hard && five_t.is_some_and(|w| w.utilization >= self.session_soft_limit);
        let saturation = if hard {
            Saturation::Hard
        } else if soft {
            Saturation::Soft
        } else {
            Saturation::None
        };

        // The bucket that binds the request's family, by the one definition
        // every built-in shares (`Buckets::binding`, whatever order the
        // windows came in), among the ticking ones: this ladder reads a window
        // whose reset is unknown or past as unused. A stale reading orders;
        // only a fresh one makes the account unusable (see `quota`).
        let scoped = match family {
            Some(f) if routing => {
                let any = c.model_windows().any(|(b, _)| self.buckets.family(b).eq_ignore_ascii_case(f));
                let ticking_one = self.buckets.binding_among(c, f, now, |w| ticking(Some(w), now).is_some());
                any.then_some(ticking_one)
            }
            _ => None,
        };
        let scoped_t = scoped.flatten();
        let scoped_used = scoped.map(|t| t.map_or(0.0, |w| w.utilization));
        let scoped_rejected = status_of(scoped_t) == WindowStatus::Rejected
            && scoped_t.is_some_and(|w| is_fresh(w.observed_at_ms, now, c.freshness_ms));
        let scoped_saturated = !stale && scoped_t.is_some_and(|w| w.utilization >= self.session_soft_limit);

        SortMetrics {
            id: c.id,
            primary: c.primary,
            usable: c.usable && !hard && !scoped_rejected,
            cooling_until: c.cooldown.map(|cd| cd.until_ms).filter(|&t| t > 0),
            evidence,
            saturation,
            scoped_saturated,
            session_used,
            weekly_used,
            scoped_used,
            session_reset: five_t.and_then(|w| w.resets_at_ms),
            session_reset_bucket: five_t.and_then(|w| w.resets_at_ms).map(|r| r / self.session_reset_tolerance_ms),
            weekly_reset: seven_t.and_then(|w| w.resets_at_ms),
        }
    }
}

/// The window if its reset is known and still ahead: only such a window's
/// reading counts. One whose reset is unknown or has passed reads as fresh.
fn ticking(w: Option<&QuotaWindow>, now: u64) -> Option<&QuotaWindow> {
    w.filter(|w| w.resets_at_ms.is_some_and(|r| r > now))
}

/// A ticking window's status; a window that is not ticking reads as allowed.
fn status_of(t: Option<&QuotaWindow>) -> WindowStatus {
    t.map_or(WindowStatus::Allowed, |w| w.status)
}

/// What the ladder knows about one candidate for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct SortMetrics {
    /// Pool index: the final tie-break (configuration order).
    pub id: u32,
    /// The operator's primary.
    pub primary: bool,
    /// The host would send the request here, and no reading says it will refuse.
    pub usable: bool,
    /// When the cooldown ends, if cooling.
    pub cooling_until: Option<u64>,
    /// Quality of the quota reading.
    pub evidence: Evidence,
    /// Session saturation.
    pub saturation: Saturation,
    /// The request's per-model window is at or above the soft limit.
    pub scoped_saturated: bool,
    /// 5h used (0 when not ticking); `None` without a usable reading.
    pub session_used: Option<f64>,
    /// 7d used (0 when not ticking); `None` without a usable reading.
    pub weekly_used: Option<f64>,
    /// The request's per-model window used (0 when not ticking); `None` when the
    /// account reports none for this model.
    pub scoped_used: Option<f64>,
    /// The ticking 5h window's reset.
    pub session_reset: Option<u64>,
    /// `floor(session reset / tolerance)`: resets in one bucket count as equal.
    pub session_reset_bucket: Option<u64>,
    /// The ticking 7d window's reset.
    pub weekly_reset: Option<u64>,
}

impl SortMetrics {
    /// Soft- or hard-saturated.
    pub fn saturated(&self) -> bool {
        self.saturation != Saturation::None
    }

    /// Why this account may not hold a session binding, take the primary's place
    /// or receive a spill (`"unusable"`, `"session_saturated"`), or `None` when it
    /// may: usable and not saturated.
    pub fn precedence_skip(&self) -> Option<&'static str> {
        if !self.usable {
            Some("unusable")
        } else if self.saturated() {
            Some("session_saturated")
        } else {
            None
        }
    }

    /// headroom-first's headroom: `min(1 − session used, 1 − weekly used)`, or
    /// `None` without a usable reading.
    pub fn headroom(&self) -> Option<f64> {
        Some((1.0 - self.session_used?).min(1.0 - self.weekly_used?))
    }
}

/// The rung of a ladder that decided between two accounts; its name is the
/// decision's reason (neurolink's `selectionReason` vocabulary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rung {
    /// One is usable, the other not.
    Availability,
    /// Both unusable: the sooner cooldown end first.
    CooldownRecovery,
    /// Better quota evidence first.
    QuotaEvidence,
    /// The unsaturated session first.
    SessionHeadroom,
    /// The unsaturated per-model window first.
    ScopedHeadroom,
    /// The sooner weekly reset first.
    WeeklyReset,
    /// The sooner session-reset bucket first.
    SessionReset,
    /// The more used per-model window first.
    ScopedUtilization,
    /// The more used weekly window first.
    WeeklyUtilization,
    /// More headroom first (headroom-first).
    Headroom,
    /// The operator's primary first.
    ConfiguredPrimary,
    /// Configuration order.
    InsertionOrder,
}

impl Rung {
    /// The reason string.
    pub fn as_str(self) -> &'static str {
        match self {
            Rung::Availability => "availability",
            Rung::CooldownRecovery => "cooldown_recovery",
            Rung::QuotaEvidence => "quota_evidence",
            Rung::SessionHeadroom => "session_headroom",
            Rung::ScopedHeadroom => "scoped_headroom",
            Rung::WeeklyReset => "weekly_reset",
            Rung::SessionReset => "session_reset",
            Rung::ScopedUtilization => "scoped_utilization",
            Rung::WeeklyUtilization => "weekly_utilization",
            Rung::Headroom => "headroom",
            Rung::ConfiguredPrimary => "configured_primary",
            Rung::InsertionOrder => "insertion_order",
        }
    }
}

/// Sooner first; an unknown time sorts last.
fn sooner(a: Option<u64>, b: Option<u64>) -> Ordering {
    a.unwrap_or(u64::MAX).cmp(&b.unwrap_or(u64::MAX))
}

/// Larger first, as a total order (adding 0.0 folds −0.0 into +0.0).
fn larger(a: f64, b: f64) -> Ordering {
    (b + 0.0).total_cmp(&(a + 0.0))
}

/// Runs the rungs in order; the first that is not a tie decides.
fn first_of(rungs: &[(Ordering, Rung)]) -> (Ordering, Rung) {
    rungs.iter().copied().find(|(o, _)| o.is_ne()).unwrap_or((Ordering::Equal, Rung::InsertionOrder))
}

/// The rungs every ladder starts with. `Err` carries the final answer when the
/// pair is decided by availability or both are unusable.
fn common_head(a: &SortMetrics, b: &SortMetrics) -> Result<[(Ordering, Rung); 3], (Ordering, Rung)> {
    if a.usable != b.usable {
        return Err((b.usable.cmp(&a.usable), Rung::Availability));
    }
    if !a.usable {
        return Err(first_of(&[
            (sooner(a.cooling_until, b.cooling_until), Rung::CooldownRecovery),
            (a.id.cmp(&b.id), Rung::InsertionOrder),
        ]));
    }
    Ok([
        (a.evidence.rank().cmp(&b.evidence.rank()), Rung::QuotaEvidence),
        (a.saturated().cmp(&b.saturated()), Rung::SessionHeadroom),
        (a.scoped_saturated.cmp(&b.scoped_saturated), Rung::ScopedHeadroom),
    ])
}

/// neurolink's expiry-first: availability → quota evidence → session saturation →
/// per-model saturation → soonest weekly reset → soonest session-reset bucket
/// (for two saturated accounts the session bucket comes first) → per-model
/// utilization → weekly utilization (higher first) → primary → pool index.
///
/// One deliberate difference: neurolink compares per-model utilization only when
/// both accounts report a per-model window, which is not transitive (with one
/// account lacking the window, three accounts can form a cycle). Here a missing
/// window reads as 0 used — the same reading neurolink gives a window whose reset
/// is unknown — so the order is total.
pub fn compare_expiry_first(a: &SortMetrics, b: &SortMetrics) -> (Ordering, Rung) {
    let head = match common_head(a, b) {
        Ok(head) => head,
        Err(decided) => return decided,
    };
    let weekly = (sooner(a.weekly_reset, b.weekly_reset), Rung::WeeklyReset);
    let session = (sooner(a.session_reset_bucket, b.session_reset_bucket), Rung::SessionReset);
    // Both saturated: the session that frees up first matters more than the week.
    let (r1, r2) = if a.saturated() && b.saturated() { (session, weekly) } else { (weekly, session) };
    first_of(&[
        head[0],
        head[1],
        head[2],
        r1,
        r2,
        (larger(a.scoped_used.unwrap_or(0.0), b.scoped_used.unwrap_or(0.0)), Rung::ScopedUtilization),
        (larger(a.weekly_used.unwrap_or(-1.0), b.weekly_used.unwrap_or(-1.0)), Rung::WeeklyUtilization),
        (b.primary.cmp(&a.primary), Rung::ConfiguredPrimary),
        (a.id.cmp(&b.id), Rung::InsertionOrder),
    ])
}

/// neurolink's headroom-first: the same ladder with the highest
/// `min(1 − session used, 1 − weekly used)` in place of the reset rungs (unknown
/// headroom last), then soonest weekly reset → primary → pool index.
pub fn compare_headroom_first(a: &SortMetrics, b: &SortMetrics) -> (Ordering, Rung) {
    let head = match common_head(a, b) {
        Ok(head) => head,
        Err(decided) => return decided,
    };
    let headroom = match (a.headroom(), b.headroom()) {
        (Some(x), Some(y)) => larger(x, y),
        (x, y) => y.is_some().cmp(&x.is_some()),
    };
    first_of(&[
        head[0],
        head[1],
        head[2],
        (headroom, Rung::Headroom),
        (sooner(a.weekly_reset, b.weekly_reset), Rung::WeeklyReset),
        (b.primary.cmp(&a.primary), Rung::ConfiguredPrimary),
        (a.id.cmp(&b.id), Rung::InsertionOrder),
    ])
}

/// Sorts the candidates by `cmp` over their `metrics` (by position) and names as
/// the reason the rung that put the head before the runner-up (`single_account`
/// when there is only one).
pub fn rank_by(
    candidates: &Candidates,
    metrics: &[SortMetrics],
    cmp: fn(&SortMetrics, &SortMetrics) -> (Ordering, Rung),
) -> Ranking {
    let mut order = candidates.input_order();
    order.sort_by(|&a, &b| cmp(&metrics[a as usize], &metrics[b as usize]).0);
    if order.len() < 2 {
        return Ranking::new(order, "single_account");
    }
    let (head, next) = (order[0], order[1]);
    let rung = cmp(&metrics[head as usize], &metrics[next as usize]).1;
    let detail =
        format!("{} before {} by {}", candidates.get(head).info.id, candidates.get(next).info.id, rung.as_str());
    Ranking::new(order, rung.as_str()).with_detail(detail)
}
