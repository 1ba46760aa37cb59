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

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::accounts::AccountState;

/// An in-flight slot on one account; released when dropped.
pub struct Lease {
    account: Arc<AccountState>,
    queue: Arc<Admission>,
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
        self.queue.wake_one();
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lease({})", self.account.id)
    }
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
#[derive(Default)]
pub struct Admission {
    waiters: Mutex<VecDeque<Waiter>>,
    next_id: AtomicU64,
}

/// A candidate for admission: the account and its limit.
pub type Slot<'a> = (&'a Arc<AccountState>, Option<u32>);

impl Admission {
    /// A new, empty queue.
    pub fn new() -> Arc<Self> {
        Arc::new(Admission::default())
    }

    /// Requests waiting now.
    pub fn depth(&self) -> usize {
        self.waiters.lock().len()
    }

    fn try_take(self: &Arc<Self>, slots: &[Slot<'_>]) -> Option<Lease> {
        slots
            .iter()
            .find(|(a, max)| a.try_take(*max))
            .map(|(a, _)| Lease { account: Arc::clone(a), queue: Arc::clone(self) })
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
    /// in line up to `timeout` when all are full. An empty `slots` is refused at
    /// once by the caller, never queued.
    pub async fn acquire(
        self: &Arc<Self>,
        slots: &[Slot<'_>],
        max_queued: usize,
        timeout: Duration,
    ) -> Result<Lease, Refused> {
        // Newcomers go behind anyone already waiting.
        if self.depth() == 0
            && let Some(lease) = self.try_take(slots)
        {
            return Ok(lease);
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
            if let Some(lease) = self.try_take(slots) {
                self.waiters.lock().retain(|w| w.id != id);
                return Ok(lease);
            }
            match tokio::time::timeout_at(deadline, rx).await {
                Ok(Ok(())) => {
                    if let Some(lease) = self.try_take(slots) {
                        return Ok(lease);
                    }
                    // Not for us: pass the wake-up on and keep our place.
                    self.wake_one();
                    front = true;
                }
                Ok(Err(_)) => front = true,
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

    #[tokio::test]
    async fn takes_the_first_account_with_room() {
        let q = Admission::new();
        let (a, b) = (Arc::new(AccountState::new("a")), Arc::new(AccountState::new("b")));
        let slots = [(&a, Some(1)), (&b, Some(1))];
        let l1 = q.acquire(&slots, 10, Duration::from_secs(1)).await.unwrap();
        let l2 = q.acquire(&slots, 10, Duration::from_secs(1)).await.unwrap();
        assert_eq!((l1.account().id.as_str(), l2.account().id.as_str()), ("a", "b"));
        drop(l1);
        assert_eq!(a.in_flight(), 0);
    }

    #[tokio::test]
    async fn waits_in_fifo_order_and_times_out() {
        let q = Admission::new();
        let a = Arc::new(AccountState::new("a"));
        let held = q.acquire(&[(&a, Some(1))], 10, Duration::from_secs(1)).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for n in 0..3 {
            let (q, a, order) = (q.clone(), a.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let lease = q.acquire(&[(&a, Some(1))], 10, Duration::from_secs(5)).await.unwrap();
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
        let _held = q.acquire(&[(&a, Some(1))], 10, Duration::from_secs(1)).await.unwrap();
        let r = q.acquire(&[(&a, Some(1))], 10, Duration::from_millis(30)).await;
        assert_eq!(r.unwrap_err(), Refused::Timeout);
        assert_eq!(q.depth(), 0);
    }

    #[tokio::test]
    async fn a_full_queue_refuses_at_once() {
        let q = Admission::new();
        let a = Arc::new(AccountState::new("a"));
        let _held = q.acquire(&[(&a, Some(1))], 1, Duration::from_secs(1)).await.unwrap();
        let q2 = q.clone();
        let a2 = a.clone();
        let waiting =
            tokio::spawn(async move { q2.acquire(&[(&a2, Some(1))], 1, Duration::from_millis(500)).await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(q.acquire(&[(&a, Some(1))], 1, Duration::from_secs(1)).await.unwrap_err(), Refused::QueueFull);
        waiting.abort();
    }

    #[tokio::test]
    async fn a_wake_up_for_an_account_a_waiter_cannot_use_is_passed_on() {
        let q = Admission::new();
        let (a, b) = (Arc::new(AccountState::new("a")), Arc::new(AccountState::new("b")));
        let hold_a = q.acquire(&[(&a, Some(1))], 10, Duration::from_secs(1)).await.unwrap();
        let hold_b = q.acquire(&[(&b, Some(1))], 10, Duration::from_secs(1)).await.unwrap();
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
