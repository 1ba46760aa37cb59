//! One refresh per seat across replicas. Refresh tokens are single-use: two
//! replicas refreshing the same seat at once leave one of them — and, when
//! the provider revokes a reused token's family, both — with a dead seat. So
//! a seat shared by replicas refreshes under a lock with a lease: the replica
//! that holds it re-checks for a newer pair, refreshes, shares the new pair
//! and lets go; the others wait for that pair and adopt it. A lock that is
//! not let go (its replica died) lapses after its lease.
//!
//! The backend decides how the pair travels (`crate::shared::redis` keeps it
//! in Redis, readable by whoever can read Redis; see docs/configuration.md,
//! `[state] share_credentials`, for that trade-off). If the backend cannot
//! answer, a replica refreshes alone: a seat that may be refreshed twice is
//! better than a request that waits on a store that is gone.

use async_trait::async_trait;

use super::store::StoredCredential;

/// What asking for a seat's refresh lock answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedLock {
    /// This replica holds it; the token lets it go.
    Acquired(String),
    /// Another replica holds it: wait for its pair.
    Held,
    /// The backend did not answer: refresh alone.
    Unavailable,
}

/// How seats share refreshes.
#[async_trait]
pub trait CredentialShare: Send + Sync {
    /// Tries to take `account`'s refresh lock.
    async fn lock(&self, account: &str) -> SharedLock;
    /// Lets it go (only if still held with `token`).
    async fn unlock(&self, account: &str, token: &str);
    /// The newest pair another replica shared for `account`.
    async fn load(&self, account: &str) -> Option<StoredCredential>;
    /// Shares a new pair; whether it was stored.
    async fn store(&self, account: &str, credential: &StoredCredential) -> bool;
    /// How long a lock lives unless let go, ms.
    fn lock_ms(&self) -> u64;
}
