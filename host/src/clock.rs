//! The time, read in one place: a [`Clock`] is handed to everything that asks
//! it, so that tests and the policy simulator can run the real quota,
//! cooldown, admission and OAuth code on time they control.
//!
//! Two readings, for two uses:
//! - **wall time**, milliseconds since the Unix epoch ([`Clock::now_ms`]):
//!   what quota readings, cooldowns, token expiry, decision records and
//!   replicated facts are stamped with. They are compared across restarts and
//!   replicas, so they cannot be monotonic.
//! - **monotonic time** ([`Clock::instant`]): deadlines and durations within
//!   one process (how long a load took, when a connection's head is due).
//!
//! A clock is the system's ([`Clock::system`], what `serve` runs on), manual
//! ([`Clock::manual`]: still until [`Clock::advance`] moves both readings
//! together), or follows tokio's time ([`Clock::following_tokio`]: under a
//! paused runtime, `tokio::time::sleep` and every timer advance it, so a
//! whole gateway runs on virtual time). `.clippy.toml` bans
//! `SystemTime::now` and `Instant::now` outside this module; the plugin
//! runtime's epoch ticker (`policy`) measures CPU budgets, not time of day,
//! and keeps its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of wall and monotonic time. Cheap to clone; clones share time.
#[derive(Clone)]
pub struct Clock {
    source: Arc<Source>,
}

enum Source {
    System,
    Manual { wall_ms: AtomicU64, base: Instant, elapsed_ns: AtomicU64 },
    Tokio { wall_ms: u64, base: tokio::time::Instant },
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &*self.source {
            Source::System => "system",
            Source::Manual { .. } => "manual",
            Source::Tokio { .. } => "tokio",
        };
        write!(f, "Clock({kind}, {} ms)", self.now_ms())
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl Clock {
    /// The system's clocks.
    pub fn system() -> Clock {
        Clock { source: Arc::new(Source::System) }
    }

    /// A clock that stands at `wall_ms` until [`Clock::advance`] moves it.
    pub fn manual(wall_ms: u64) -> Clock {
        #[allow(clippy::disallowed_methods, reason = "the clock module is where time is read")]
        let base = Instant::now();
        Clock {
            source: Arc::new(Source::Manual { wall_ms: AtomicU64::new(wall_ms), base, elapsed_ns: AtomicU64::new(0) }),
        }
    }

    /// A clock that starts at `wall_ms` and moves with tokio's time: real
    /// time normally, virtual time under a paused runtime
    /// (`tokio::time::pause`), where every timer and sleep advances it.
    pub fn following_tokio(wall_ms: u64) -> Clock {
        Clock { source: Arc::new(Source::Tokio { wall_ms, base: tokio::time::Instant::now() }) }
    }

    /// Milliseconds since the Unix epoch (zero on a clock set before it).
    pub fn now_ms(&self) -> u64 {
        match &*self.source {
            Source::System => system_since_epoch().as_millis() as u64,
            Source::Manual { wall_ms, .. } => wall_ms.load(Ordering::Acquire),
            Source::Tokio { wall_ms, base } => wall_ms + base.elapsed().as_millis() as u64,
        }
    }

    /// The time since the Unix epoch.
    pub fn since_epoch(&self) -> Duration {
        match &*self.source {
            Source::System => system_since_epoch(),
            _ => Duration::from_millis(self.now_ms()),
        }
    }

    /// A monotonic reading, for deadlines and durations.
    pub fn instant(&self) -> Instant {
        match &*self.source {
            // tokio's reading: the same as the system's, except under a
            // paused runtime, where the gateway's timers (tokio's) run too.
            Source::System => tokio::time::Instant::now().into_std(),
            Source::Manual { base, elapsed_ns, .. } => *base + Duration::from_nanos(elapsed_ns.load(Ordering::Acquire)),
            Source::Tokio { .. } => tokio::time::Instant::now().into_std(),
        }
    }

    /// How long since `earlier` (a reading of this clock).
    pub fn since(&self, earlier: Instant) -> Duration {
        self.instant().saturating_duration_since(earlier)
    }

    /// Moves a manual clock forward by `by`, wall and monotonic time together.
    ///
    /// # Panics
    /// On a clock that is not manual: the system's and tokio's time move on
    /// their own.
    pub fn advance(&self, by: Duration) {
        match &*self.source {
            Source::Manual { wall_ms, elapsed_ns, .. } => {
                elapsed_ns.fetch_add(by.as_nanos() as u64, Ordering::AcqRel);
                wall_ms.fetch_add(by.as_millis() as u64, Ordering::AcqRel);
            }
            _ => panic!("only a manual clock is advanced by hand"),
        }
    }
}

fn system_since_epoch() -> Duration {
    #[allow(clippy::disallowed_methods, reason = "the clock module is where time is read")]
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()
}

/// Milliseconds since the Unix epoch on the system's clock: for the edges
/// that are not a gateway (the command line, the demo's terminal table).
/// Inside the gateway, read its [`Clock`].
pub fn now_ms() -> u64 {
    system_since_epoch().as_millis() as u64
}

/// The system's wall time, for a file's modification time.
pub fn system_time() -> SystemTime {
    #[allow(clippy::disallowed_methods, reason = "the clock module is where time is read")]
    SystemTime::now()
}

/// The machine's monotonic time, never virtual: for measuring real work — a
/// plugin call against its budget, a compile, a log line's rate — which
/// takes the machine's time whatever clock the gateway runs on, and for
/// tests and benchmarks timing a real process from outside.
pub fn machine_instant() -> Instant {
    #[allow(clippy::disallowed_methods, reason = "the clock module is where time is read")]
    Instant::now()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_stands_still_until_advanced() {
        let clock = Clock::manual(1_000);
        let (wall, mono) = (clock.now_ms(), clock.instant());
        assert_eq!(wall, 1_000);
        assert_eq!(clock.instant(), mono, "monotonic time stands too");
        let shared = clock.clone();
        shared.advance(Duration::from_millis(2_500));
        assert_eq!(clock.now_ms(), 3_500, "clones share time");
        assert_eq!(clock.since(mono), Duration::from_millis(2_500));
    }

    #[test]
    fn the_gateways_clippy_bans_keep_the_workspaces() {
        // clippy reads the nearest configuration only: host/.clippy.toml
        // must repeat every ban of the workspace's.
        let workspace = include_str!("../../.clippy.toml");
        let gateway = include_str!("../.clippy.toml");
        for ban in workspace.lines().filter(|l| l.trim_start().starts_with("{ path")) {
            assert!(gateway.contains(ban.trim()), "host/.clippy.toml lacks the workspace's ban {ban}");
        }
        assert!(gateway.contains("std::time::Instant::now") && gateway.contains("std::time::SystemTime::now"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_tokio_clock_moves_with_virtual_time() {
        let clock = Clock::following_tokio(10_000);
        let mono = clock.instant();
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(clock.now_ms(), 10_000 + 3_600_000);
        assert_eq!(clock.since(mono), Duration::from_secs(3600));
    }
}
