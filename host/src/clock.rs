//! The time, read in one place.
//!
//! Wall-clock milliseconds since the Unix epoch are what quota readings,
//! cooldowns, token expiry and replicated facts are stamped with (they are
//! compared across restarts and replicas, so they cannot be monotonic).

use std::time::Duration;

/// The time since the Unix epoch (zero on a clock set before it).
pub fn since_epoch() -> Duration {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default()
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    since_epoch().as_millis() as u64
}
