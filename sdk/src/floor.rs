//! dario's headroom floor: where an account stands for a request, shared by the
//! rankers that drain seats to a floor (`headroom`, `fill-first`).
//!
//! An account is *ineligible* when the host cannot use it or its top-level
//! status says rejected until a future reset; *drained* when its headroom is at
//! or below the floor (it still serves when nothing else can); otherwise it is
//! *above the floor*. Ineligible accounts carry the time they recover, so an
//! all-parked pool can be ordered by soonest recovery.

use crate::{Buckets, Candidate, Config, Options, WindowStatus, check_range};

/// How close to the floor counts as at it. Headroom is `1 − utilization`, and
/// `1 − 0.98` is 0.020000000000000018 in f64: without a tolerance an account
/// reported at exactly 98% would sit "above" a 0.02 floor. 1e-9 is far below
/// any utilization the upstream reports (two to four decimals) and far above
/// f64 rounding of values near 1.
pub const FLOOR_EPSILON: f64 = 1e-9;

/// Where an account stands, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Standing {
    /// Usable, and headroom above the floor.
    AboveFloor,
    /// Usable, but headroom at or below the floor.
    Drained,
    /// Not usable, or rejected until a future reset.
    Ineligible,
}

/// An account's standing for one request.
#[derive(Debug, Clone, Copy)]
pub struct Seat {
    /// Where it stands.
    pub standing: Standing,
    /// `1 − max(5h, 7d, the request family's buckets)`.
    pub headroom: f64,
    /// For ineligible accounts: when they can serve again (`u64::MAX` = unknown).
    pub recovery: u64,
}

/// The default of the `floor` option.
const DEFAULT_FLOOR: f64 = 0.02;

/// A floor and the bucket map that decides which per-model windows count.
#[derive(Debug, Clone)]
pub struct Floor {
    floor: f64,
    buckets: Buckets,
}

impl Floor {
    /// Reads the options `floor` (fraction in [0, 1], default 0.02) and
    /// `buckets` (bucket → model family); any other option is refused.
    pub fn configure(config: &Config) -> Result<Floor, String> {
        let mut o = config.options();
        let floor = Floor::read(&mut o)?;
        o.done()?;
        Ok(floor)
    }

    /// Reads the options `floor` and `buckets` from `o`, for a ranker that takes
    /// options of its own besides them (it calls [`Options::done`] itself).
    pub fn read(o: &mut Options) -> Result<Floor, String> {
        let floor = check_range("floor", o.f64("floor")?.unwrap_or(DEFAULT_FLOOR), 0.0, 1.0)?;
        let buckets = Buckets::new(o.string_map("buckets")?.unwrap_or_default());
        Ok(Floor { floor, buckets })
    }

    /// Where `account` stands for a request of model `family` at `now_ms`.
    pub fn seat(&self, account: &Candidate, family: Option<&str>, now_ms: u64) -> Seat {
        let headroom = self.buckets.headroom(account, family, now_ms);
        let rejected = account.status == WindowStatus::Rejected && account.resets_at_ms.is_none_or(|r| r > now_ms);
        let standing = if !account.usable || rejected {
            Standing::Ineligible
        } else if headroom <= self.floor + FLOOR_EPSILON {
            Standing::Drained
        } else {
            Standing::AboveFloor
        };
        let recovery = match (&account.cooldown, rejected) {
            (Some(c), _) => c.until_ms,
            (None, true) => account.resets_at_ms.unwrap_or(u64::MAX),
            (None, false) => u64::MAX,
        };
        Seat { standing, headroom, recovery }
    }
}
