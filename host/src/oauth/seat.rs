//! One OAuth seat at run time: the bearer token requests carry now, and the
//! one way it changes — [`Seat::refresh`], single-flight.
//!
//! The order of a refresh is what keeps a seat alive:
//! 1. one refresh at a time per seat; a caller that waited finds the token
//!    already changed and adopts it instead of refreshing again;
//! 2. the stored credential is re-read first, so a newer `poolgate login` (or
//!    another process that refreshed) wins over the copy in memory;
//! 3. the rotated pair is written to disk *before* the new access token is
//!    used, so a crash between the two keeps a refresh token that works;
//! 4. `invalid_grant` marks the seat `needs_login` (no retry loop, the account
//!    is disabled until the operator logs in again); any other failure backs
//!    off, doubling from 5 s, and never blocks the other accounts;
//! 5. a seat that needs a login comes back from a new pair on disk (`poolgate
//!    login`, or `poolgate accounts import` of a Claude Code file whose access
//!    token expired overnight): a pair whose access token still lives is
//!    adopted as it is; one whose access token expired is refreshed — once,
//!    here, under the same single flight — unless its refresh token is the one
//!    the endpoint refused.
//!
//! A seat whose access token has expired and whose last refresh failed cannot
//! serve until a refresh succeeds: [`Seat::unusable_until`] says so, and the account
//! is routed to only once the keeper's retries get a new token.

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use http::HeaderValue;
use parking_lot::Mutex;
use serde::Serialize;

use super::share::{CredentialShare, SharedLock};
use super::store::{Identity, StoredCredential};
use super::token::{TokenClient, TokenError};

/// Why a refresh is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The token expires soon (the background check, or startup).
    Expiring,
    /// The upstream answered 401 to the token the caller sent.
    Unauthorized,
}

/// What a refresh did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refreshed {
    /// A new pair was obtained and stored.
    Renewed {
        /// The identity changed (a login to another subscription under the
        /// same account id): what was learned about the old one is not its.
        identity_changed: bool,
    },
    /// Another refresh (or a newer login on disk) already replaced the token.
    Adopted,
    /// Nothing was needed: the token is not close to expiring.
    NotNeeded,
}

/// Why a refresh did not happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeatError {
    /// The token endpoint refused the refresh token just now
    /// (`invalid_grant`): the seat needs `poolgate login`. Said once per
    /// refusal; the checks after it say [`SeatError::NeedsLogin`].
    Refused,
    /// The seat still needs `poolgate login` (its refresh token was refused
    /// earlier, and no new pair is on disk): nothing was sent.
    NeedsLogin,
    /// A recent attempt failed; the next one waits until this time.
    BackingOff(u64),
    /// The token endpoint failed now.
    Failed(String),
}

impl std::fmt::Display for SeatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SeatError::Refused => f.write_str("the refresh token was refused: the seat needs a new login"),
            SeatError::NeedsLogin => f.write_str("the seat needs a new login"),
            SeatError::BackingOff(until) => write!(f, "refresh backing off until {until}"),
            SeatError::Failed(m) => f.write_str(m),
        }
    }
}

struct Current {
    header: HeaderValue,
    expires_at_ms: u64,
    identity: Identity,
}

#[derive(Default)]
struct Health {
    needs_login: bool,
    /// The SHA-256 of the refresh token the endpoint refused: a pair on disk
    /// that still holds it is not sent again (a seat that needs a login tries
    /// each new refresh token once).
    refused: Option<[u8; 32]>,
    backoff_until_ms: u64,
    failures: u32,
    refreshes: u64,
    last_refresh_ms: Option<u64>,
    last_error: Option<String>,
}

/// A seat's state, for `/status`.
#[derive(Debug, Clone, Serialize)]
pub struct SeatStatus {
    /// When the access token in use expires, ms since the epoch.
    pub token_expires_at_ms: u64,
    /// Successful refreshes since start.
    pub refreshes: u64,
    /// When the last one succeeded.
    pub last_refresh_ms: Option<u64>,
    /// The refresh token was refused: the account is disabled until a new login.
    pub needs_login: bool,
    /// What to run to fix it, when it needs fixing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// The last refresh failure, if the last attempt failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// While refreshes fail for want of an answer: when the next may run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff_until_ms: Option<u64>,
    /// Why the seat takes no requests now, when it takes none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked: Option<String>,
    /// Who the tokens belong to.
    pub identity: Identity,
}

/// One OAuth seat.
pub struct Seat {
    id: String,
    path: PathBuf,
    client: TokenClient,
    current: ArcSwap<Current>,
    flight: tokio::sync::Mutex<()>,
    health: Mutex<Health>,
    /// When the usage endpoint was last asked about this seat.
    usage_polled_ms: std::sync::atomic::AtomicU64,
    /// How replicas share this seat's refreshes, when they do.
    share: std::sync::OnceLock<Arc<dyn CredentialShare>>,
}

/// Where a replica stands before refreshing a shared seat.
enum Turn {
    /// Another replica's new pair was adopted: nothing to refresh.
    Adopted,
    /// This replica holds the lock (its token), and refreshes from this pair.
    Mine(String, StoredCredential),
    /// The backend did not answer, or the holder never shared a pair.
    Alone,
}

/// How often a replica waiting for another's refresh looks for its pair.
const SHARED_WAIT_MS: u64 = 100;

impl std::fmt::Debug for Seat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seat")
            .field("id", &self.id)
            .field("expires_at_ms", &self.expires_at_ms())
            .finish_non_exhaustive()
    }
}

/// The first pause after a failed refresh; it doubles per failure.
const FIRST_BACKOFF_MS: u64 = 5_000;

fn bearer(token: &str) -> Option<HeaderValue> {
    let mut v = HeaderValue::from_str(&format!("Bearer {token}")).ok()?;
    v.set_sensitive(true);
    Some(v)
}

impl Seat {
    /// The seat of account `id`, whose credentials file `path` held `stored`.
    pub fn new(id: &str, path: PathBuf, stored: &StoredCredential, client: TokenClient) -> anyhow::Result<Arc<Seat>> {
        let header = bearer(&stored.access_token)
            .ok_or_else(|| anyhow::anyhow!("the access token holds characters a header cannot carry"))?;
        let current = Current { header, expires_at_ms: stored.expires_at_ms, identity: stored.identity.clone() };
        Ok(Arc::new(Seat {
            id: id.to_string(),
            path,
            client,
            current: ArcSwap::from_pointee(current),
            flight: tokio::sync::Mutex::new(()),
            health: Mutex::new(Health::default()),
            usage_polled_ms: std::sync::atomic::AtomicU64::new(0),
            share: std::sync::OnceLock::new(),
        }))
    }

    /// Shares this seat's refreshes with other replicas through `share`
    /// (once; the backend is fixed for the life of the process).
    pub fn share_with(&self, share: Arc<dyn CredentialShare>) {
        let _ = self.share.set(share);
    }

    /// The credentials file.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The `[oauth]` settings its refreshes use.
    pub fn config(&self) -> &super::OAuthConfig {
        self.client.config()
    }

    /// The `authorization` header requests carry now.
    pub fn header(&self) -> HeaderValue {
        self.current.load().header.clone()
    }

    /// When the token in use expires.
    pub fn expires_at_ms(&self) -> u64 {
        self.current.load().expires_at_ms
    }

    /// The organization the tokens in use belong to, when known.
    pub fn organization(&self) -> Option<String> {
        self.current.load().identity.organization.clone()
    }

    /// Whether the seat needs a new login.
    pub fn needs_login(&self) -> bool {
        self.health.lock().needs_login
    }

    /// Whether the usage endpoint may be asked about this seat at `now` (not
    /// within `every` of the last time); claims the turn if so.
    pub fn take_usage_turn(&self, now_ms: u64, every_ms: u64) -> bool {
        use std::sync::atomic::Ordering;
        let last = self.usage_polled_ms.load(Ordering::Acquire);
        (last == 0 || now_ms.saturating_sub(last) >= every_ms)
            && self.usage_polled_ms.compare_exchange(last, now_ms, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Whether the token needs refreshing at `now` (less than `before` left).
    pub fn due(&self, now_ms: u64, before_ms: u64) -> bool {
        self.expires_at_ms() <= now_ms.saturating_add(before_ms)
    }

    /// The seat's state, for `/status`.
    pub fn status(&self, now_ms: u64) -> SeatStatus {
        let blocked = self.blocked_because(now_ms);
        let h = self.health.lock();
        let c = self.current.load();
        SeatStatus {
            token_expires_at_ms: c.expires_at_ms,
            refreshes: h.refreshes,
            last_refresh_ms: h.last_refresh_ms,
            needs_login: h.needs_login,
            fix: h.needs_login.then(|| format!("poolgate login {} --config <your poolgate.toml>", self.id)),
            last_error: h.last_error.clone(),
            backoff_until_ms: Some(h.backoff_until_ms).filter(|&t| t > now_ms),
            blocked,
            identity: c.identity.clone(),
        }
    }

    /// Until when the seat certainly cannot serve, at `now`: its access
    /// token has expired and the last refresh failed, so a request sent to it
    /// would only meet a 401. The time is a bound on when the keeper tries
    /// again (the end of the backoff, or its next check); the seat serves as
    /// soon as a refresh succeeds. `None` while it can serve — or while it
    /// needs a login, which disables the account instead.
    pub fn unusable_until(&self, now_ms: u64) -> Option<u64> {
        let h = self.health.lock();
        if h.needs_login || h.failures == 0 || self.expires_at_ms() > now_ms {
            return None;
        }
        Some(h.backoff_until_ms.max(now_ms.saturating_add(self.config().check_interval_ms)))
    }

    /// Why the seat takes no requests at `now`, in words, if it takes none.
    fn blocked_because(&self, now_ms: u64) -> Option<String> {
        if self.needs_login() {
            return Some("needs a new login: the token endpoint refused its refresh token".into());
        }
        self.unusable_until(now_ms)?;
        let ago_s = now_ms.saturating_sub(self.expires_at_ms()) / 1000;
        let error = self.health.lock().last_error.clone().unwrap_or_default();
        Some(format!(
            "the access token expired {ago_s} s ago and no refresh has succeeded since ({error}); not routed to \
             until one does"
        ))
    }

    /// Refreshes the token, once for every caller that asks at the same time.
    /// `seen` is the header the caller sent (on a 401): if the token changed
    /// since, the caller adopts the new one. With [`Why::Expiring`], nothing
    /// happens unless less than `before_ms` is left.
    pub async fn refresh(
        &self,
        why: Why,
        seen: Option<&HeaderValue>,
        now: impl Fn() -> u64,
        before_ms: u64,
        max_backoff_ms: u64,
    ) -> Result<Refreshed, SeatError> {
        let _flight = self.flight.lock().await;
        if seen.is_some_and(|s| *s != self.current.load().header) {
            return Ok(Refreshed::Adopted);
        }
        // A newer login (or another process's refresh) on disk wins — and
        // is how a seat that needs a login comes back.
        let stored = StoredCredential::read(&self.path).ok();
        if let Some(s) = &stored
            && bearer(&s.access_token).is_some_and(|h| h != self.current.load().header)
            && s.expires_at_ms > now().saturating_add(60_000)
        {
            self.adopt(s);
            tracing::info!(account = %self.id, "adopted the OAuth credentials found on disk");
            return Ok(Refreshed::Adopted);
        }
        let reviving = self.needs_login();
        if reviving {
            if let Some(done) = self.come_back(stored.as_ref()).await {
                return done;
            }
        } else if why == Why::Expiring && !self.due(now(), before_ms) {
            return Ok(Refreshed::NotNeeded);
        }
        let backoff = self.health.lock().backoff_until_ms;
        if backoff > now() {
            return Err(SeatError::BackingOff(backoff));
        }
        if reviving {
            tracing::info!(account = %self.id, "a new OAuth pair is on disk for a seat that needs a login; refreshing with it");
        }
        let Some(mut previous) = stored else {
            return Err(self.failed(format!("cannot read {}", self.path.display()), now(), max_backoff_ms));
        };
        let share = self.share.get().cloned();
        let mut held = None;
        if let Some(share) = &share {
            match self.shared_turn(share.as_ref(), &previous, &now, before_ms).await {
                Turn::Adopted => return Ok(Refreshed::Adopted),
                Turn::Mine(token, newest) => (held, previous) = (Some(token), newest),
                Turn::Alone => {}
            }
        }
        let result = self.client.refresh(&previous, now()).await;
        match result {
            Ok(grant) => {
                // On disk and in use first (no await between the answer and
                // the file: a request that goes away cannot lose the pair),
                // then shared. A pair that could not be shared keeps the lock
                // until its lease lapses, so no replica refreshes from the
                // spent token meanwhile.
                let renewed = self.renew(grant.credential.clone(), now());
                if let (Some(share), Some(token)) = (&share, &held) {
                    if share.store(&self.id, &grant.credential).await {
                        share.unlock(&self.id, token).await;
                    } else {
                        tracing::warn!(account = %self.id, "could not share the new OAuth pair; other replicas adopt it once the lock lapses, from a shared credentials file if there is one");
                    }
                }
                renewed
            }
            Err(e) if held.is_some() => {
                // Let the lock go: another replica may hold a pair that works.
                if let (Some(share), Some(token)) = (&share, &held) {
                    share.unlock(&self.id, token).await;
                }
                self.refresh_failed(e, &previous.refresh_token, now(), max_backoff_ms)
            }
            Err(e) => self.refresh_failed(e, &previous.refresh_token, now(), max_backoff_ms),
        }
    }

    /// For a seat that needs a login: another replica's new pair, adopted;
    /// or `None` when `stored` (the pair on disk) holds a refresh token that
    /// was not refused — a login imported after its access token expired (a
    /// Claude Code file the morning after), to refresh once; or else
    /// [`SeatError::NeedsLogin`], sending nothing.
    async fn come_back(&self, stored: Option<&StoredCredential>) -> Option<Result<Refreshed, SeatError>> {
        if let (Some(share), Some(s)) = (self.share.get(), stored)
            && let Some(c) = share.load(&self.id).await.filter(|c| is_newer(c, s))
        {
            self.adopt_shared(&c);
            return Some(Ok(Refreshed::Adopted));
        }
        if stored.is_none_or(|s| self.was_refused(&s.refresh_token)) {
            return Some(Err(SeatError::NeedsLogin));
        }
        None
    }

    /// Records why a refresh with `refresh_token` failed.
    fn refresh_failed(
        &self,
        e: TokenError,
        refresh_token: &str,
        now_ms: u64,
        max_backoff_ms: u64,
    ) -> Result<Refreshed, SeatError> {
        match e {
            TokenError::InvalidGrant(m) => {
                let mut h = self.health.lock();
                h.needs_login = true;
                h.refused = Some(digest(refresh_token));
                h.last_error = Some(format!("refresh token refused (invalid_grant): {m}"));
                tracing::error!(account = %self.id, "OAuth refresh token refused: the account needs `poolgate login {}`", self.id);
                Err(SeatError::Refused)
            }
            e => Err(self.failed(e.to_string(), now_ms, max_backoff_ms)),
        }
    }

    /// Takes this replica's turn at refreshing a seat other replicas share:
    /// the lock, or the pair the replica holding it shares (waiting for it
    /// up to the lock's lease).
    async fn shared_turn(
        &self,
        share: &dyn CredentialShare,
        ours: &StoredCredential,
        now: &impl Fn() -> u64,
        before_ms: u64,
    ) -> Turn {
        let deadline = now().saturating_add(share.lock_ms());
        loop {
            let lock = share.lock(&self.id).await;
            // The other replica's pair, through the backend or through a
            // credentials file the replicas share.
            let newer = match share.load(&self.id).await {
                Some(c) if is_newer(&c, ours) => Some(c),
                _ => StoredCredential::read(&self.path).ok().filter(|c| is_newer(c, ours)),
            };
            match lock {
                SharedLock::Unavailable => return Turn::Alone,
                SharedLock::Acquired(token) => {
                    let Some(c) = newer else { return Turn::Mine(token, ours.clone()) };
                    // Another replica refreshed since this one last looked:
                    // adopt its pair, or refresh from it if it is due too.
                    if c.expires_at_ms > now().saturating_add(before_ms) {
                        share.unlock(&self.id, &token).await;
                        self.adopt_shared(&c);
                        return Turn::Adopted;
                    }
                    return Turn::Mine(token, c);
                }
                SharedLock::Held => {
                    if let Some(c) = newer {
                        self.adopt_shared(&c);
                        return Turn::Adopted;
                    }
                    if now() >= deadline {
                        tracing::warn!(account = %self.id, "the replica holding this seat's refresh lock shared no new pair; refreshing here");
                        return Turn::Alone;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(SHARED_WAIT_MS)).await;
                }
            }
        }
    }

    /// Adopts a pair another replica obtained, and keeps it on disk like one
    /// of this replica's own.
    fn adopt_shared(&self, c: &StoredCredential) {
        if let Err(e) = c.write(&self.path) {
            tracing::error!(account = %self.id, error = %format!("{e:#}"), "could not store the OAuth credentials another replica obtained");
        }
        self.adopt(c);
        tracing::info!(account = %self.id, "adopted the OAuth credentials another replica obtained");
    }

    /// Stores the new pair, then uses it.
    fn renew(&self, credential: StoredCredential, now_ms: u64) -> Result<Refreshed, SeatError> {
        // Persist before use: if this fails, the new refresh token would be
        // lost with the process, so say so loudly (and in `/status`) — but
        // keep serving on it.
        let unstored = credential.write(&self.path).err().map(|e| {
            tracing::error!(account = %self.id, error = %format!("{e:#}"), "could not store the rotated OAuth credentials");
            format!("could not store the rotated credentials: {e:#}")
        });
        let identity_changed = {
            let old = &self.current.load().identity;
            old.organization.is_some()
                && credential.identity.organization.is_some()
                && old.organization != credential.identity.organization
        };
        self.adopt(&credential);
        let mut h = self.health.lock();
        (h.failures, h.backoff_until_ms, h.refreshes, h.last_refresh_ms) = (0, 0, h.refreshes + 1, Some(now_ms));
        h.last_error = unstored;
        tracing::info!(account = %self.id, expires_in_s = credential.expires_at_ms.saturating_sub(now_ms) / 1000, "OAuth token refreshed");
        Ok(Refreshed::Renewed { identity_changed })
    }

    /// Whether `refresh_token` is the one the endpoint refused.
    fn was_refused(&self, refresh_token: &str) -> bool {
        self.health.lock().refused == Some(digest(refresh_token))
    }

    fn adopt(&self, c: &StoredCredential) {
        if let Some(header) = bearer(&c.access_token) {
            self.current.store(Arc::new(Current {
                header,
                expires_at_ms: c.expires_at_ms,
                identity: c.identity.clone(),
            }));
        }
        let mut h = self.health.lock();
        h.needs_login = false;
    }

    fn failed(&self, message: String, now_ms: u64, max_backoff_ms: u64) -> SeatError {
        let mut h = self.health.lock();
        h.failures = h.failures.saturating_add(1);
        let pause = FIRST_BACKOFF_MS.saturating_mul(1 << (h.failures - 1).min(20)).min(max_backoff_ms);
        h.backoff_until_ms = now_ms + pause;
        h.last_error = Some(message.clone());
        tracing::warn!(account = %self.id, error = %message, retry_in_ms = pause, "OAuth refresh failed");
        SeatError::Failed(message)
    }
}

/// Whether `c` (shared by another replica) replaces `ours`: a different pair
/// that lives longer, for an identity that does not contradict ours (a pair
/// imported without one learns it at its first refresh).
fn is_newer(c: &StoredCredential, ours: &StoredCredential) -> bool {
    let agree = |a: &Option<String>, b: &Option<String>| a.is_none() || b.is_none() || a == b;
    c.access_token != ours.access_token
        && c.expires_at_ms > ours.expires_at_ms
        && agree(&c.identity.organization, &ours.identity.organization)
        && agree(&c.identity.account, &ours.identity.account)
}

/// SHA-256 of a refresh token: what a refused one is remembered by (the
/// token itself is never kept once it is spent).
fn digest(token: &str) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(token.as_bytes()).into()
}
