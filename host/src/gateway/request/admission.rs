//! Admission: per-account in-flight limits and a bounded FIFO for requests that
//! find every usable account full.
//!
//! A request takes the first account of its order that has room. If none has,
//! it queues; whenever a lease is released the oldest waiter is woken and tries
//! again over its own order. A woken waiter that still finds nothing (the freed
//! slot was on an account it cannot use) passes the wake-up to the next waiter and
//! keeps its place at the front, so a freed slot is never lost and order is kept.
//! Leases release on drop — when the response or stream ends, or when the client
//! goes away and the body is dropped.
//!
//! Admission says which accounts it skipped as full ([`Admitted::full`]), so
//! that a request served by the second account says the first was at its
//! limit rather than repeating why the chain put the first one first.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::learned::accounts::AccountState;
use crate::shared::{LeaseAnswer, RemoteLease, StateBackend};

/// An in-flight slot on one account; released when dropped.
pub struct Lease {
    account: Arc<AccountState>,
    queue: Arc<Admission>,
    /// The slot in the count shared by replicas, when there is one.
    remote: Option<RemoteLease>,
    /// Given back without waking a waiter: a slot held only while Redis was
    /// asked (waiters for a limit shared by replicas look again every
    /// [`REMOTE_RETRY`] anyway).
    quiet: bool,
}

impl Lease {
    /// The account this lease holds a slot on.
    pub fn account(&self) -> &Arc<AccountState> {
        &self.account
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.account.give_back();
        if let Some(r) = self.remote.take() {
            self.queue.backend.release(r);
        }
        if !self.quiet {
            self.queue.wake_one();
        }
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lease({})", self.account.id)
    }
}

/// A slot taken, and the accounts passed over on the way to it.
#[derive(Debug)]
pub struct Admitted {
    /// The slot.
    pub lease: Lease,
    /// Positions in the slots given to [`Admission::acquire`] of the
    /// accounts ahead of the leased one that were full (on this replica, or
    /// across replicas), in order.
    pub full: Vec<usize>,
}

/// Why admission failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The queue is full.
    QueueFull,
    /// Waited the whole timeout.
    Timeout,
}

struct Waiter {
    id: u64,
    wake: oneshot::Sender<()>,
}

/// The admission queue (one per gateway).
pub struct Admission {
    waiters: Mutex<VecDeque<Waiter>>,
    next_id: AtomicU64,
    /// Where in-flight limits are counted across replicas (the embedded
    /// backend does not: this replica's count is the count).
    backend: Arc<dyn StateBackend>,
}

/// How often a waiter looks again when the slots it waits for are held by
/// other replicas (whose releases wake no one here).
const REMOTE_RETRY: Duration = Duration::from_millis(20);

/// A candidate for admission: the account and its limit.
pub type Slot<'a> = (&'a Arc<AccountState>, Option<u32>);

impl Admission {
    /// A new, empty queue.
    pub fn new() -> Arc<Self> {
        Self::with_backend(Arc::new(crate::shared::Embedded))
    }

    /// A new, empty queue counting in-flight limits through `backend`.
    pub fn with_backend(backend: Arc<dyn StateBackend>) -> Arc<Self> {
        Arc::new(Admission { waiters: Mutex::new(VecDeque::new()), next_id: AtomicU64::new(0), backend })
    }

    /// Requests waiting now.
    pub fn depth(&self) -> usize {
        self.waiters.lock().len()
    }

    /// The first account of `slots` with room: on this replica, and across
    /// replicas for a limited account when the backend counts them (within
    /// `[state] lease_wait_ms`; past it, or with the backend away, this
    /// replica's count decides), with the positions of the full ones before
    /// it. Also whether a slot of a limit shared by replicas was full (the
    /// caller must look again: its release may happen on another replica).
    async fn try_take(self: &Arc<Self>, slots: &[Slot<'_>]) -> (Option<Admitted>, bool) {
        let mut remote_full = false;
        let mut full = Vec::new();
        for (i, (a, max)) in slots.iter().enumerate() {
            if !a.try_take(*max) {
                // A slot of a limit shared by replicas frees without a
                // wake-up here when it is another replica's.
                remote_full |= max.is_some() && self.backend.shares_leases();
                full.push(i);
                continue;
            }
            // From here the local slot is a lease: if the request goes away
            // while Redis is asked (the future is dropped), it is given back.
            let mut lease = Lease { account: Arc::clone(a), queue: Arc::clone(self), remote: None, quiet: false };
            if let Some(max) = max
                && self.backend.shares_leases()
            {
                match self.backend.lease(&a.id, *max).await {
                    LeaseAnswer::Granted(r) => lease.remote = Some(r),
                    LeaseAnswer::Full => {
                        remote_full = true;
                        lease.quiet = true;
                        full.push(i);
                        continue;
                    }
                    LeaseAnswer::Unavailable => {}
                }
            }
            return (Some(Admitted { lease, full }), remote_full);
        }
        (None, remote_full)
    }

    /// Wakes the oldest live waiter.
    fn wake_one(&self) {
        let mut q = self.waiters.lock();
        while let Some(w) = q.pop_front() {
            if w.wake.send(()).is_ok() {
                return;
            }
        }
    }

    /// Takes a slot on the first account of `slots` (in order) with room, waiting
    /// in line up to `timeout` when all are full; says which accounts ahead of
    /// it were full when it was taken. An empty `slots` is refused at once by
    /// the caller, never queued.
    pub async fn acquire(
        self: &Arc<Self>,
        slots: &[Slot<'_>],
        max_queued: usize,
        timeout: Duration,
    ) -> Result<Admitted, Refused> {
        // Newcomers go behind anyone already waiting.
        if self.depth() == 0
            && let (Some(admitted), _) = self.try_take(slots).await
        {
            return Ok(admitted);
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut front = false;
        loop {
            let (tx, rx) = oneshot::channel();
            {
                let mut q = self.waiters.lock();
                if !front && q.len() >= max_queued {
                    return Err(Refused::QueueFull);
                }
                let w = Waiter { id, wake: tx };
                if front { q.push_front(w) } else { q.push_back(w) }
            }
            // A slot may have been freed between the failed attempt and queueing.
            let (admitted, remote_full) = self.try_take(slots).await;
            if let Some(admitted) = admitted {
                self.waiters.lock().retain(|w| w.id != id);
                return Ok(admitted);
            }
            // A slot another replica holds frees without waking anyone here.
            let wait_until =
                if remote_full { deadline.min(tokio::time::Instant::now() + REMOTE_RETRY) } else { deadline };
            match tokio::time::timeout_at(wait_until, rx).await {
                Ok(Ok(())) => {
                    if let (Some(admitted), _) = self.try_take(slots).await {
                        return Ok(admitted);
                    }
                    // Not for us: pass the wake-up on and keep our place.
                    self.wake_one();
                    front = true;
                }
                Ok(Err(_)) => front = true,
                Err(_) if tokio::time::Instant::now() < deadline => {
                    // Time to look again: leave the line, keep the place.
                    self.waiters.lock().retain(|w| w.id != id);
                    front = true;
                }
                Err(_) => {
                    self.waiters.lock().retain(|w| w.id != id);
                    return Err(Refused::Timeout);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shared backend that answers every lease with `answer` (`None`: never).
    struct Leases(Option<bool>);

    #[async_trait::async_trait]
    impl StateBackend for Leases {
        fn status(&self) -> crate::shared::BackendStatus {
            crate::shared::BackendStatus::default()
        }
        fn start(self: Arc<Self>, _book: std::sync::Weak<crate::learned::AccountBook>) {}
        fn shares_leases(&self) -> bool {
            true
        }
        async fn lease(&self, account: &str, _max: u32) -> LeaseAnswer {
            match self.0 {
                None => std::future::pending().await,
                Some(true) => LeaseAnswer::Granted(RemoteLease { account: account.into(), member: "m".into() }),
                Some(false) => LeaseAnswer::Full,
            }
        }
    }

    #[tokio::test]
    async fn a_request_that_goes_away_while_redis_is_asked_gives_its_slot_back() {
        let q = Admission::with_backend(Arc::new(Leases(None)));
        let a = Arc::new(AccountState::new("a"));
        let slots = [(&a, Some(1))];
        let asking = q.acquire(&slots, 10, Duration::from_secs(1));
        assert!(tokio::time::timeout(Duration::from_millis(20), asking).await.is_err());
        assert_eq!(a.in_flight(), 0, "the local slot taken while asking is back");
    }

    #[tokio::test]
    async fn an_account_full_on_other_replicas_is_passed_over_and_its_slot_given_back() {
        let q = Admission::with_backend(Arc::new(Leases(Some(false))));
        let (a, b) = (Arc::new(AccountState::new("a")), Arc::new(AccountState::new("b")));
        let admitted = q.acquire(&[(&a, Some(1)), (&b, None)], 10, Duration::from_secs(1)).await.unwrap();
        assert_eq!(admitted.full, [0], "a was passed over as full");
        let lease = admitted.lease;
        assert_eq!((lease.account().id.as_str(), a.in_flight()), ("b", 0));
        drop(lease);
        let r = q.acquire(&[(&a, Some(1))], 10, Duration::from_millis(60)).await;
        assert_eq!(r.unwrap_err(), Refused::Timeout, "waited, looking again, until the deadline");
        assert_eq!((a.in_flight(), q.depth()), (0, 0));
    }

    #[tokio::test]
    async fn takes_the_first_account_with_room() {
        let q = Admission::new();
        let (a, b) = (Arc::new(AccountState::new("a")), Arc::new(AccountState::new("b")));
        let slots = [(&a, Some(1)), (&b, Some(1))];
        let l1 = q.acquire(&slots, 10, Duration::from_secs(1)).await.unwrap();
        let l2 = q.acquire(&slots, 10, Duration::from_secs(1)).await.unwrap();
        assert_eq!((l1.lease.account().id.as_str(), l2.lease.account().id.as_str()), ("a", "b"));
        assert_eq!((l1.full.as_slice(), l2.full.as_slice()), (&[][..], &[0][..]), "the second skipped a, full");
        let l1 = l1.lease;
        drop(l1);
        assert_eq!(a.in_flight(), 0);
    }

    // On paused time: a sleep lets every spawned waiter queue before the
    // next step (time moves only when all are idle), never a race.
    #[tokio::test(start_paused = true)]
    async fn waits_in_fifo_order_and_times_out() {
        let q = Admission::new();
        let a = Arc::new(AccountState::new("a"));
        let held = q.acquire(&[(&a, Some(1))], 10, Duration::from_secs(1)).await.unwrap().lease;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for n in 0..3 {
            let (q, a, order) = (q.clone(), a.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let lease = q.acquire(&[(&a, Some(1))], 10, Duration::from_secs(5)).await.unwrap().lease;
                order.lock().push(n);
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(lease);
            }));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(q.depth(), 3);
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock(), vec![0, 1, 2]);
        let _held = q.acquire(&[(&a, Some(1))], 10, Duration::from_secs(1)).await.unwrap().lease;
        let r = q.acquire(&[(&a, Some(1))], 10, Duration::from_millis(30)).await;
        assert_eq!(r.unwrap_err(), Refused::Timeout);
        assert_eq!(q.depth(), 0);
    }

    // On paused time: a sleep lets every spawned waiter queue before the
    // next step (time moves only when all are idle), never a race.
    #[tokio::test(start_paused = true)]
    async fn a_full_queue_refuses_at_once() {
        let q = Admission::new();
        let a = Arc::new(AccountState::new("a"));
        let _held = q.acquire(&[(&a, Some(1))], 1, Duration::from_secs(1)).await.unwrap().lease;
        let q2 = q.clone();
        let a2 = a.clone();
        let waiting =
            tokio::spawn(async move { q2.acquire(&[(&a2, Some(1))], 1, Duration::from_millis(500)).await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(q.acquire(&[(&a, Some(1))], 1, Duration::from_secs(1)).await.unwrap_err(), Refused::QueueFull);
        waiting.abort();
    }

    // On paused time: a sleep lets every spawned waiter queue before the
    // next step (time moves only when all are idle), never a race.
    #[tokio::test(start_paused = true)]
    async fn a_wake_up_for_an_account_a_waiter_cannot_use_is_passed_on() {
        let q = Admission::new();
        let (a, b) = (Arc::new(AccountState::new("a")), Arc::new(AccountState::new("b")));
        let hold_a = q.acquire(&[(&a, Some(1))], 10, Duration::from_secs(1)).await.unwrap().lease;
        let hold_b = q.acquire(&[(&b, Some(1))], 10, Duration::from_secs(1)).await.unwrap().lease;
        // First waiter can only use b; second can use a.
        let (q1, b1) = (q.clone(), b.clone());
        let only_b =
            tokio::spawn(async move { q1.acquire(&[(&b1, Some(1))], 10, Duration::from_secs(2)).await.is_ok() });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let (q2, a2) = (q.clone(), a.clone());
        let only_a =
            tokio::spawn(async move { q2.acquire(&[(&a2, Some(1))], 10, Duration::from_secs(2)).await.is_ok() });
        tokio::time::sleep(Duration::from_millis(10)).await;
        drop(hold_a);
        assert!(only_a.await.unwrap(), "the freed slot on a reached the waiter that can use it");
        drop(hold_b);
        assert!(only_b.await.unwrap());
    }
}
