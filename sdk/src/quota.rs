//! What a quota reading means: one definition, shared by every built-in, every
//! helper of this SDK and the host (which depends on this module for its
//! cooldowns), so that no two parts of poolgate can disagree about whether a
//! window is exhausted, fresh, or binds a request's model family.
//!
//! - A reading is **fresh** while its age is at most the freshness limit: the
//!   operator's `[policy] freshness_ms` (or the stage's own `freshness_ms`),
//!   which the host hands every plugin ([`crate::Pool::freshness_ms`];
//!   [`DEFAULT_FRESHNESS_MS`] where no host says). Freshness is per window: a
//!   two-day-old bucket reading is stale even when the account's 5h window
//!   was read a second ago.
//! - **One rule for stale readings, of every window kind** (5h, 7d, per-model,
//!   an API key's limits): a stale reading still **orders** — at its last
//!   value, until its window resets — but only a fresh one **excludes**. Usage
//!   only grows within a window, so an old reading is a floor on what is used
//!   now: setting it aside would send the next requests to the seat known to
//!   be fullest, which then answers, reads full again, and goes last again (a
//!   flap). A reading that says used up, though, strands a seat if it
//!   excludes for good; once stale it no longer excludes (the seat orders
//!   last, as fully used, and serves when nothing better can), and its reset
//!   reopens the window in any case (the host reset-freshens it).
//! - A window **says used up** when its status is `rejected` or its utilization
//!   is at least 1.0. It is **exhausted** ([`Exhaustion::Until`]) when it says
//!   so and its reset is known and still ahead. One that says so without a
//!   reset is [`Exhaustion::ResetUnknown`]: a filter fails open on it (a wrong
//!   "exhausted" costs a usable seat, a wrong "fine" one probe), while the host,
//!   holding an actual refusal, cools the account for a configured fallback.
//!   One whose reset has passed is [`Exhaustion::Open`] (reset-freshened).
//! - A utilization that is negative or not a number is no reading at all: the
//!   host drops it when it parses the headers.
//! - How much a window is **used** ([`used`]) is its utilization, and at least
//!   all of it when its status is `rejected`: a rejected window never reads as
//!   having room, whatever its number says.
//! - Every per-model bucket bound to a family counts, and which one binds is a
//!   function of the readings alone, never of their order (see
//!   [`crate::Buckets::binding`]): a 100% `7d_oi` is not hidden behind a 30%
//!   `7d_fable`, whichever the upstream listed first.

/// How long a reading stays fresh unless the operator configures otherwise
/// (`[policy] freshness_ms`): 15 minutes.
pub const DEFAULT_FRESHNESS_MS: u64 = 15 * 60 * 1000;

/// Whether a reading taken at `observed_at_ms` is fresh at `now_ms`.
pub fn is_fresh(observed_at_ms: u64, now_ms: u64, freshness_ms: u64) -> bool {
    now_ms.saturating_sub(observed_at_ms) <= freshness_ms
}

/// How much of window `w` is used, for ordering: its utilization (one that is
/// not a number counts as 0), at least 1.0 when the window is `rejected`.
pub fn used(w: &crate::QuotaWindow) -> f64 {
    let u = if w.utilization.is_finite() { w.utilization } else { 0.0 };
    if w.status == crate::WindowStatus::Rejected { u.max(1.0) } else { u }
}

/// Whether window `w` says it is used up: `rejected`, or at least 100% used.
pub fn says_used_up(w: &crate::QuotaWindow) -> bool {
    used(w) >= 1.0
}

/// A utilization worth keeping: finite and not negative (it may exceed 1.0).
pub fn utilization(value: f64) -> Option<f64> {
    (value.is_finite() && value >= 0.0).then_some(value)
}

/// What one window's reading says about using it at some moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exhaustion {
    /// Not used up, or used up but its reset has passed.
    Open,
    /// Used up until this time (ms since the epoch), which is still ahead.
    Until(u64),
    /// Used up, and the reading does not say until when.
    ResetUnknown,
}

impl Exhaustion {
    /// The reset of an exhausted window; `None` when open or unknown.
    pub fn until(self) -> Option<u64> {
        match self {
            Exhaustion::Until(t) => Some(t),
            _ => None,
        }
    }
}

/// What a window that is `rejected` (or not), used `utilization`, resetting at
/// `resets_at_ms`, says at `now_ms`.
pub fn exhaustion(rejected: bool, utilization: f64, resets_at_ms: Option<u64>, now_ms: u64) -> Exhaustion {
    if !(rejected || utilization >= 1.0) {
        return Exhaustion::Open;
    }
    match resets_at_ms {
        Some(r) if r > now_ms => Exhaustion::Until(r),
        Some(_) => Exhaustion::Open,
        None => Exhaustion::ResetUnknown,
    }
}

/// The model families the Anthropic quota headers distinguish, as lowercase names.
pub type ModelFamily = &'static str;

/// The family of a model id by substring, as dario's `modelFamily()`: `opus`,
/// `sonnet`, `haiku` or `fable`; anything else has none.
pub fn model_family(model: &str) -> Option<ModelFamily> {
    let m = model.as_bytes();
    ["opus", "sonnet", "haiku", "fable"]
        .into_iter()
        .find(|f| m.windows(f.len()).any(|w| w.eq_ignore_ascii_case(f.as_bytes())))
}

/// The window a unified `representative-claim` names: `five_hour` → `5h`,
/// `seven_day` → `7d`, `seven_day_overage_included` → `7d_oi` (the
/// included-overage credit, reported in the `7d_oi` headers; dario #1264),
/// `seven_day_<bucket>` → `7d_<bucket>` (`seven_day_opus`), `overage` →
/// `overage`; anything else → `None`.
pub fn claimed_window(claim: &str) -> Option<String> {
    let claim = claim.trim().to_ascii_lowercase();
    match claim.as_str() {
        "five_hour" | "5h" => Some("5h".into()),
        "seven_day" | "7d" => Some("7d".into()),
        "seven_day_overage_included" => Some("7d_oi".into()),
        "overage" => Some("overage".into()),
        c => {
            let bucket = c.strip_prefix("seven_day_").or_else(|| c.strip_prefix("7d_"))?;
            let plain = !bucket.is_empty() && bucket.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            plain.then(|| format!("7d_{bucket}"))
        }
    }
}

/// The bucket of a per-model window name (`7d_oi` → `oi`), if it is one.
pub fn bucket_of(window: &str) -> Option<&str> {
    window.strip_prefix("7d_").filter(|b| !b.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_760_000_000_000;

    #[test]
    fn exhausted_means_used_up_until_a_reset_still_ahead() {
        assert_eq!(exhaustion(true, 0.3, Some(NOW + 1), NOW), Exhaustion::Until(NOW + 1));
        assert_eq!(exhaustion(false, 1.0, Some(NOW + 1), NOW), Exhaustion::Until(NOW + 1));
        assert_eq!(exhaustion(false, 0.99, Some(NOW + 1), NOW), Exhaustion::Open);
        assert_eq!(exhaustion(true, 1.2, Some(NOW), NOW), Exhaustion::Open, "the reset has come");
        assert_eq!(exhaustion(true, 1.2, None, NOW), Exhaustion::ResetUnknown);
        assert_eq!(exhaustion(false, f64::NAN, Some(NOW + 1), NOW), Exhaustion::Open);
        assert_eq!(Exhaustion::Until(5).until(), Some(5));
        assert_eq!(Exhaustion::ResetUnknown.until(), None);
    }

    #[test]
    fn freshness_is_the_age_of_the_reading() {
        assert!(is_fresh(NOW - DEFAULT_FRESHNESS_MS, NOW, DEFAULT_FRESHNESS_MS));
        assert!(!is_fresh(NOW - DEFAULT_FRESHNESS_MS - 1, NOW, DEFAULT_FRESHNESS_MS));
        assert!(is_fresh(NOW + 5, NOW, 0), "a reading from a clock slightly ahead is fresh");
    }

    #[test]
    fn only_finite_non_negative_utilizations_are_readings() {
        assert_eq!(utilization(1.02), Some(1.02));
        assert_eq!(utilization(0.0), Some(0.0));
        assert_eq!(utilization(-0.1), None);
        assert_eq!(utilization(f64::NAN), None);
        assert_eq!(utilization(f64::INFINITY), None);
    }

    #[test]
    fn claims_name_their_window() {
        assert_eq!(claimed_window("five_hour").as_deref(), Some("5h"));
        assert_eq!(claimed_window("seven_day").as_deref(), Some("7d"));
        assert_eq!(claimed_window("seven_day_opus").as_deref(), Some("7d_opus"));
        assert_eq!(claimed_window("Seven_Day_OI").as_deref(), Some("7d_oi"));
        assert_eq!(claimed_window("seven_day_overage_included").as_deref(), Some("7d_oi"));
        assert_eq!(claimed_window("seven_day_").as_deref(), None);
        assert_eq!(claimed_window("something_else"), None);
        assert_eq!(bucket_of("7d_oi"), Some("oi"));
        assert_eq!(bucket_of("7d"), None);
        assert_eq!(model_family("claude-Opus-4-1"), Some("opus"));
        assert_eq!(model_family("gpt-4o"), None);
    }
}
