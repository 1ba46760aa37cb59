//! Memory given back after a burst of connections closes.
//!
//! glibc's malloc keeps what its per-thread arenas freed for the next
//! allocation, and gives back only what lies at the top of a heap: after
//! 10,000 streams closed the gateway still held their ~500 MiB, and grew
//! round after round of them (the soak in docs/reliability.md). `malloc_trim`
//! hands every arena's free pages back to the system (`madvise`), so once the
//! open client connections and requests in flight (an HTTP/2 client carries
//! a hundred streams on one connection) have fallen to half their height,
//! the gateway trims — and once more after the upstream connections those streams used
//! have outlived their idle timeout and closed too. A trim walks the arenas'
//! free lists (milliseconds, under each arena's lock), so it runs only after
//! such a drop, at most every 10 s, on a blocking thread.

use std::sync::Arc;
use std::time::Duration;

use super::Gateway;

/// How often the open connections are looked at.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// The least time between two trims, ms.
const MIN_GAP_MS: u64 = 10_000;
/// The smallest drop worth a trim: a few connections free little.
const MIN_DROP: usize = 64;
/// When to trim again after a drop, ms: past the upstream connections' 90 s
/// idle timeout (`https::client`), when what the idle ones kept is free too.
const FOLLOW_UP_MS: u64 = 100_000;

/// When to trim, from the connections open over time (time passed in).
#[derive(Debug, Default)]
pub struct Trimmer {
    high: usize,
    last_ms: Option<u64>,
    follow_up_ms: Option<u64>,
}

impl Trimmer {
    /// Whether to trim now, `open` connections being open at `now_ms`.
    pub fn observe(&mut self, open: usize, now_ms: u64) -> bool {
        self.high = self.high.max(open);
        let rested = self.last_ms.is_none_or(|t| now_ms >= t + MIN_GAP_MS);
        let dropped = open <= self.high / 2 && self.high - open >= MIN_DROP;
        let follow_up = self.follow_up_ms.is_some_and(|t| now_ms >= t);
        if !rested || !(dropped || follow_up) {
            return false;
        }
        self.follow_up_ms = dropped.then_some(now_ms + FOLLOW_UP_MS);
        self.high = open;
        self.last_ms = Some(now_ms);
        true
    }
}

/// Watches the gateway's connections for as long as it runs, trimming after
/// each drop.
pub fn spawn(gateway: &Arc<Gateway>) {
    let gw = Arc::downgrade(gateway);
    tokio::spawn(async move {
        let mut trimmer = Trimmer::default();
        let mut tick = tokio::time::interval(LOOK_EVERY);
        loop {
            tick.tick().await;
            let Some(gw) = gw.upgrade() else { return };
            // Streams count with connections: 1,000 streams over ten HTTP/2
            // connections closing is a drop of ten connections, which alone
            // never reached `MIN_DROP` (#30: 63 MiB kept after them).
            let streams: usize = gw.generation().accounts.iter().map(|a| a.state.in_flight() as usize).sum();
            if trimmer.observe(gw.lifecycle.connections() + streams, gw.clock.now_ms()) {
                drop(gw);
                let _ = tokio::task::spawn_blocking(trim).await;
            }
        }
    });
}

/// Gives free heap pages back to the system (glibc only: other allocators
/// return memory by themselves, or not at all).
fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer and only walks glibc's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_follows_a_drop_to_half_then_once_more_past_the_idle_timeout() {
        let mut t = Trimmer::default();
        assert!(!t.observe(10_000, 0), "rising: nothing to give back");
        assert!(!t.observe(6_000, 1_000), "not yet half");
        assert!(t.observe(4_000, 2_000), "half gone");
        assert!(!t.observe(0, 5_000), "within 10 s of the last trim");
        assert!(t.observe(0, 12_000), "another half gone, 10 s later");
        assert!(!t.observe(0, 50_000), "nothing new");
        assert!(t.observe(0, 112_000), "past the upstream idle timeout");
        assert!(!t.observe(0, 300_000), "once");
    }

    #[test]
    fn a_few_connections_closing_cost_no_trim() {
        let mut t = Trimmer::default();
        assert!(!t.observe(40, 0));
        assert!(!t.observe(0, 20_000), "a drop of 40 frees too little");
    }
}
