//! The pool's quota as one account's `anthropic-ratelimit-unified-*` would
//! say it — what a client behind the gateway is told about the quota it
//! draws on (`[gateway] unified_headers = "pool"`, docs/keys.md).
//!
//! Why rewrite them at all: Claude Code's status line and its near-limit
//! warnings read these headers as *the developer's* plan. Relayed from
//! whichever seat served, they describe one seat of many — a developer is
//! warned at 90 % of a seat while the pool has four fresh ones, or sees 3 %
//! while the pool is nearly parked. Pooled, they describe what the
//! developer actually has: the pool's seats together.
//!
//! The semantics, per window (`5h`, `7d`, each per-model `7d_<bucket>`),
//! over the accounts that can serve (not disabled) and have read that
//! window:
//!
//! - **utilization** — the mean of the accounts' utilizations: the fraction
//!   of the pool's capacity used, seats of one plan being of one size; a
//!   window whose reset has passed counts as 0 (it reset);
//! - **reset** — the soonest future reset among the accounts that used some
//!   of it: when capacity first comes back;
//! - **status** — `rejected` when every account's window reads rejected,
//!   `allowed_warning` when every one reads at least a warning, else
//!   `allowed`: the pool is as near its limit as its freshest seat.
//!
//! The top-level `status` follows the same rule over the accounts' top-level
//! statuses; `representative-claim` names the window with the highest
//! pooled utilization and `reset` is that window's. Plain data, a pure
//! function of the accounts' readings ([`pooled_seats`]) and the time.

use std::borrow::Cow;

use crate::account::{Status, WindowReading};

/// One window of the pool.
#[derive(Debug, Clone, PartialEq)]
pub struct PooledWindow {
    /// `5h`, `7d`, `7d_<bucket>`.
    pub name: String,
    /// The mean utilization (a fraction; may pass 1.0).
    pub utilization: f64,
    /// The soonest future reset of a used account's window, ms.
    pub reset_ms: Option<u64>,
    /// As the least-used account's window reads.
    pub status: Status,
}

/// The pool's unified quota.
#[derive(Debug, Clone, PartialEq)]
pub struct PooledQuota {
    /// Accounts counted (those with any unified reading).
    pub accounts: usize,
    /// The top-level status.
    pub status: Status,
    /// The windows, in name order.
    pub windows: Vec<PooledWindow>,
}

impl PooledQuota {
    /// The binding window: the highest pooled utilization (the first by name
    /// on a tie).
    pub fn binding(&self) -> Option<&PooledWindow> {
        self.windows.iter().fold(None, |best: Option<&PooledWindow>, w| match best {
            Some(b) if b.utilization >= w.utilization => Some(b),
            _ => Some(w),
        })
    }
}

/// Whether a window name is one of the subscription windows pooled here.
pub fn is_pooled_window(name: &str) -> bool {
    name == "5h" || name == "7d" || name.starts_with("7d_")
}

/// The claim a window is named by in `representative-claim`: `five_hour`,
/// `seven_day`, `seven_day_<bucket>`.
pub fn claim(window: &str) -> String {
    match window {
        "5h" => "five_hour".into(),
        "7d" => "seven_day".into(),
        w => match w.strip_prefix("7d_") {
            Some(bucket) => format!("seven_day_{bucket}"),
            None => w.to_string(),
        },
    }
}

/// The least severe of `statuses` (every one at least this severe); `None`
/// when none is known.
fn least_severe(statuses: impl Iterator<Item = Status>) -> Option<Status> {
    let rank = |s: Status| match s {
        Status::Allowed => 0,
        Status::AllowedWarning => 1,
        Status::Rejected => 2,
        Status::Unknown => 3,
    };
    statuses.filter(|s| *s != Status::Unknown).min_by_key(|s| rank(*s))
}

/// What pooling reads of one account besides its windows.
#[derive(Debug, Clone, Copy)]
pub struct Seat {
    /// Disabled (never serving).
    pub disabled: bool,
    /// The top-level unified status.
    pub status: Status,
    /// The top-level reset, ms.
    pub resets_at_ms: Option<u64>,
}

/// One pooled window (see [`is_pooled_window`]) of one account.
#[derive(Debug, Clone)]
pub struct SeatWindow<'a> {
    /// The account's place in the seats.
    pub seat: usize,
    /// The window's name.
    pub name: Cow<'a, str>,
    /// As read.
    pub utilization: f64,
    /// As read.
    pub resets_at_ms: Option<u64>,
    /// As read.
    pub status: Status,
}

impl<'a> SeatWindow<'a> {
    /// Window `w` of seat `seat`, named `name`, if it is a pooled window.
    pub fn of(seat: usize, w: &WindowReading, name: Cow<'a, str>) -> Option<SeatWindow<'a>> {
        let (utilization, resets_at_ms, status) = (w.utilization, w.resets_at_ms, w.status);
        is_pooled_window(&w.name).then_some(SeatWindow { seat, name, utilization, resets_at_ms, status })
    }
}

/// The pool's unified quota at `now_ms`, from each account's top-level
/// reading (`seats`, in pool order) and its pooled windows (`windows`, each
/// account's in its order), read under each account's lock in turn without
/// copying a snapshot of it (#30); `None` when no serving account has read a
/// subscription window or a unified status (an API-key pool: nothing to pool).
pub fn pooled_seats(seats: &[Seat], windows: &[SeatWindow<'_>], now_ms: u64) -> Option<PooledQuota> {
    let has_window = |seat: usize| windows.iter().any(|w| w.seat == seat);
    let serving: Vec<usize> = (0..seats.len())
        .filter(|&i| !seats[i].disabled && (seats[i].status != Status::Unknown || has_window(i)))
        .collect();
    if serving.is_empty() {
        return None;
    }
    let is_serving = |seat: usize| serving.binary_search(&seat).is_ok();
    let mut names: Vec<&str> = windows.iter().filter(|w| is_serving(w.seat)).map(|w| &*w.name).collect();
    names.sort_unstable();
    names.dedup();
    let windows = names
        .into_iter()
        .map(|name| {
            let readings: Vec<&SeatWindow<'_>> =
                serving.iter().filter_map(|&s| windows.iter().find(|w| w.seat == s && w.name == name)).collect();
            let reset = |w: &&SeatWindow<'_>| w.resets_at_ms.filter(|&r| r > now_ms);
            let used = |w: &&SeatWindow<'_>| if reset(w).is_some() { w.utilization } else { 0.0 };
            let utilization = readings.iter().map(used).sum::<f64>() / readings.len() as f64;
            PooledWindow {
                name: name.to_string(),
                utilization,
                reset_ms: readings.iter().filter(|w| used(w) > 0.0).filter_map(reset).min(),
                status: least_severe(readings.iter().map(|w| match reset(w) {
                    Some(_) => w.status,
                    None => Status::Allowed,
                }))
                .unwrap_or(Status::Unknown),
            }
        })
        .collect();
    // A status whose reset has passed no longer holds.
    let status = least_severe(serving.iter().map(|&i| match seats[i].resets_at_ms {
        Some(r) if r <= now_ms && seats[i].status != Status::Unknown => Status::Allowed,
        _ => seats[i].status,
    }))
    .unwrap_or(Status::Unknown);
    Some(PooledQuota { accounts: serving.len(), status, windows })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::AccountSnapshot;

    /// [`pooled_seats`] of whole snapshots, as the tests write them.
    fn pooled(accounts: &[AccountSnapshot], now_ms: u64) -> Option<PooledQuota> {
        let mut seats = Vec::with_capacity(accounts.len());
        let mut windows = Vec::new();
        for a in accounts {
            seats.push(Seat { disabled: a.disabled, status: a.status, resets_at_ms: a.resets_at_ms });
            let seat = seats.len() - 1;
            windows.extend(a.windows.iter().filter_map(|w| SeatWindow::of(seat, w, Cow::Borrowed(w.name.as_str()))));
        }
        pooled_seats(&seats, &windows, now_ms)
    }

    const NOW: u64 = 1_800_000_000_000;

    fn seat(id: &str, status: Status, windows: &[(&str, f64, u64, Status)]) -> AccountSnapshot {
        AccountSnapshot {
            id: id.into(),
            status,
            windows: windows
                .iter()
                .map(|&(name, utilization, reset_in_ms, status)| WindowReading {
                    name: name.into(),
                    utilization,
                    resets_at_ms: Some(NOW + reset_in_ms),
                    status,
                    observed_at_ms: Some(NOW),
                })
                .collect(),
            ..AccountSnapshot::default()
        }
    }

    #[test]
    fn a_pool_reads_as_its_seats_together() {
        use Status::*;
        let accounts = [
            seat("a", AllowedWarning, &[("5h", 0.9, 3_600_000, AllowedWarning), ("7d", 0.5, 86_400_000, Allowed)]),
            seat("b", Allowed, &[("5h", 0.1, 7_200_000, Allowed), ("7d_opus", 0.8, 3_600_000, AllowedWarning)]),
            seat("c", Allowed, &[("5h", 0.0, 600_000, Allowed)]),
            AccountSnapshot { id: "key".into(), ..AccountSnapshot::default() }, // an API key: no windows
        ];
        let q = pooled(&accounts, NOW).unwrap();
        assert_eq!((q.accounts, q.status), (3, Allowed), "one seat warned, the others did not");
        let w = |n: &str| q.windows.iter().find(|w| w.name == n).unwrap().clone();
        assert!((w("5h").utilization - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(w("5h").reset_ms, Some(NOW + 3_600_000), "the soonest reset of a seat that used some");
        assert_eq!(w("5h").status, Allowed);
        assert_eq!((w("7d").utilization, w("7d").status), (0.5, Allowed), "only the seats that read it");
        assert_eq!(w("7d_opus").status, AllowedWarning, "every seat that read it warned");
        assert_eq!(q.binding().unwrap().name, "7d_opus");
        assert_eq!(claim("7d_opus"), "seven_day_opus");
    }

    #[test]
    fn a_window_past_its_reset_counts_as_reset_and_disabled_seats_not_at_all() {
        use Status::*;
        let mut spent = seat("a", Rejected, &[("5h", 1.0, 0, Rejected)]);
        spent.windows[0].resets_at_ms = Some(NOW - 1);
        spent.resets_at_ms = Some(NOW - 1);
        let mut off = seat("b", Rejected, &[("5h", 1.0, 3_600_000, Rejected)]);
        off.disabled = true;
        let q = pooled(&[spent, off], NOW).unwrap();
        assert_eq!((q.accounts, q.status), (1, Allowed));
        assert_eq!((q.windows[0].utilization, q.windows[0].reset_ms, q.windows[0].status), (0.0, None, Allowed));
        assert_eq!(pooled(&[AccountSnapshot::default()], NOW), None, "nothing to pool");
    }
}
