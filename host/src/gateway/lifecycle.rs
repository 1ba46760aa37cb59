//! Where the gateway is in its life, as the request path needs to see it:
//! whether it is draining (so `/readyz` answers 503 and a load balancer moves
//! traffic away), whether the shutdown grace period has ended (so every answer
//! still streaming is cut, with an SSE `error` event, and recorded as
//! `shutdown`), and how many client connections are open against the limit.
//!
//! The limit on connections exists because each one holds a file descriptor:
//! with the descriptors spent, `accept` fails and nobody — `/healthz`
//! included — gets in. The default is derived from the open-file limit, which
//! is first raised from its soft value to the hard one (the usual 1024 soft
//! limit is far below what a gateway needs; the hard limit is what the
//! operator allowed).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::watch;

/// Descriptors kept out of the client connections' share: the listener,
/// config and credential files, plugin cache, logs, the shared state backend,
/// the OAuth token endpoint and the runtime's own.
pub const RESERVED_FDS: u64 = 128;

/// The most client connections the derived default allows, however high the
/// open-file limit: each open connection costs buffers (tens of KiB), and a
/// team's gateway serves far fewer clients than this.
pub const AUTO_MAX_CONNECTIONS: usize = 16_384;

/// The fewest the derived default allows (a tiny open-file limit still lets
/// a few clients in).
pub const MIN_AUTO_CONNECTIONS: usize = 16;

/// The connection limit `server.max_connections = 0` means for an open-file
/// limit of `nofile`: half of what is left after [`RESERVED_FDS`], since each
/// client request in flight may hold an upstream connection too; within
/// [`MIN_AUTO_CONNECTIONS`]..=[`AUTO_MAX_CONNECTIONS`].
pub fn auto_connections(nofile: u64) -> usize {
    let share = nofile.saturating_sub(RESERVED_FDS) / 2;
    (share.min(AUTO_MAX_CONNECTIONS as u64) as usize).max(MIN_AUTO_CONNECTIONS)
}

/// The open-file limit of the process, before and after raising the soft
/// limit to the hard one (the same when it already was, or could not be).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit found at start.
    pub before: u64,
    /// The soft limit now in force.
    pub now: u64,
    /// The hard limit.
    pub hard: u64,
}

/// Raises the soft open-file limit (`RLIMIT_NOFILE`) to the hard one. `None`
/// when the limit cannot be read (no such limit on this platform).
#[allow(clippy::unnecessary_cast, reason = "rlim_t is u64 on Linux but not on every unix")]
pub fn raise_open_files() -> Option<OpenFiles> {
    #[cfg(unix)]
    {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit only writes the rlimit it is given.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
            return None;
        }
        let before = r.rlim_cur as u64;
        // An unlimited hard limit cannot be the soft one for descriptors
        // (Linux caps them at fs.nr_open): ask for a large finite number.
        let hard = if r.rlim_max == libc::RLIM_INFINITY { 1 << 20 } else { r.rlim_max as u64 };
        let mut now = before;
        if before < hard {
            let want = libc::rlimit { rlim_cur: hard as libc::rlim_t, rlim_max: r.rlim_max };
            // SAFETY: setrlimit only reads the rlimit it is given.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
                now = hard;
            }
        }
        Some(OpenFiles { before, now, hard })
    }
    #[cfg(not(unix))]
    None
}

/// The gateway's life, as requests see it.
pub struct Lifecycle {
    draining: AtomicBool,
    cut: AtomicBool,
    cut_signal: watch::Sender<bool>,
    open: watch::Sender<usize>,
    auto_limit: AtomicUsize,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle {
            draining: AtomicBool::new(false),
            cut: AtomicBool::new(false),
            cut_signal: watch::channel(false).0,
            open: watch::channel(0).0,
            auto_limit: AtomicUsize::new(auto_connections(1024)),
        }
    }
}

impl Lifecycle {
    /// Whether a shutdown has begun: `/readyz` answers 503.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Marks the shutdown begun.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Whether the grace period has ended: answers still open are cut.
    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::Acquire)
    }

    /// Ends the grace period: every answer still open is cut.
    pub fn cut_streams(&self) {
        self.cut.store(true, Ordering::Release);
        self.cut_signal.send_replace(true);
    }

    /// Resolves when the grace period ends (at once if it has).
    pub fn on_cut(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let mut rx = self.cut_signal.subscribe();
        Box::pin(async move {
            let _ = rx.wait_for(|cut| *cut).await;
        })
    }

    /// Sets the limit `server.max_connections = 0` stands for.
    pub fn set_auto_limit(&self, n: usize) {
        self.auto_limit.store(n, Ordering::Relaxed);
    }

    /// The connection limit in force for `configured` (`server.max_connections`).
    pub fn connection_limit(&self, configured: usize) -> usize {
        if configured == 0 { self.auto_limit.load(Ordering::Relaxed) } else { configured }
    }

    /// Client connections open now.
    pub fn connections(&self) -> usize {
        *self.open.borrow()
    }

    /// Counts a connection open until the slot is dropped.
    pub fn open_connection(self: &std::sync::Arc<Self>) -> Slot {
        self.open.send_modify(|n| *n += 1);
        Slot(self.clone())
    }

    /// Resolves once no client connection is open.
    pub async fn all_closed(&self) {
        let mut rx = self.open.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }
}

/// One open client connection, counted until dropped.
pub struct Slot(std::sync::Arc<Lifecycle>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.send_modify(|n| *n = n.saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn the_derived_limit_leaves_room_for_upstream_connections_and_files() {
        assert_eq!(auto_connections(1024), 448);
        assert_eq!(auto_connections(65_536), 16_384, "capped");
        assert_eq!(auto_connections(100), MIN_AUTO_CONNECTIONS, "a floor");
        // Every derived limit fits its descriptors: two per connection plus the reserve.
        for nofile in [256, 1024, 4096, 20_000] {
            assert!(2 * auto_connections(nofile) as u64 + RESERVED_FDS <= nofile, "{nofile}");
        }
    }

    #[test]
    fn an_explicit_limit_wins_over_the_derived_one() {
        let l = Lifecycle::default();
        l.set_auto_limit(448);
        assert_eq!(l.connection_limit(0), 448);
        assert_eq!(l.connection_limit(10), 10);
    }

    #[tokio::test]
    async fn connections_are_counted_until_their_slot_goes_and_the_cut_reaches_every_waiter() {
        let l = Arc::new(Lifecycle::default());
        let a = l.open_connection();
        let b = l.open_connection();
        assert_eq!(l.connections(), 2);
        drop(a);
        assert_eq!(l.connections(), 1);
        let closed = tokio::spawn({
            let l = l.clone();
            async move { l.all_closed().await }
        });
        drop(b);
        closed.await.unwrap();
        let waiters: Vec<_> = (0..3).map(|_| tokio::spawn(l.on_cut())).collect();
        assert!(!l.is_cut());
        l.cut_streams();
        for w in waiters {
            w.await.unwrap();
        }
        assert!(l.is_cut());
        l.on_cut().await;
    }

    #[test]
    fn raising_the_open_file_limit_never_lowers_it() {
        if let Some(f) = raise_open_files() {
            assert!(f.now >= f.before && f.now <= f.hard.max(f.before), "{f:?}");
        }
    }
}
