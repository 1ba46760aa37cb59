//! The OAuth side of Anthropic: subscription seats, their rotating tokens, and the
//! authority that mints and checks them.
//!
//! A Claude subscription login is not an API key: it is a short-lived access token plus a
//! single-use refresh token, renewed at `POST /v1/oauth/token`. A gateway holding such
//! logins must refresh before expiry, store the rotated refresh token, and cope with a
//! token endpoint that is slow, failing or says "log in again". To test that through the
//! real binary, the mock keeps one [`OAuth`] authority per server: each [`Seat`] is one
//! login bound to one scripted [`Account`], so a test scripts the account once and every
//! access token the seat ever gets answers as that account, however often it rotates.
//!
//! All times are wall-clock epoch milliseconds, the unit of `expiresAt` in a Claude Code
//! credentials file, so a test can compare them with what the gateway writes. Lifetimes
//! are short in tests (a compressed clock), so expiry is checked against the clock on
//! every request rather than by a timer.

mod ids;
mod token;
mod usage;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use parking_lot::{Mutex, MutexGuard};
use poolgate_wire::header;

use crate::script::Account;
use ids::{fake_uuid, random_token};

pub use ids::pkce_challenge;
pub(crate) use token::token;
pub(crate) use usage::{profile, usage};

/// The scopes every token of a seat carries (`scope` in the token response, space
/// separated).
pub const SCOPES: &[&str] = &["user:inference", "user:profile"];

/// The `message` of the 401 an expired access token gets on the API routes, verbatim
/// from Anthropic.
pub const EXPIRED: &str = "OAuth token has expired. Please obtain a new token or refresh your existing token.";

/// The `anthropic-beta` flag OAuth-only routes (`/api/oauth/*`) require.
pub const OAUTH_BETA: &str = "oauth-2025-04-20";

/// How long access tokens live unless [`Seat::set_lifetime`] says otherwise; Anthropic's
/// are hours, tests compress this to seconds.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);

/// Who a seat is logged in as, as the token and profile responses report it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The organization's uuid; also sent as `anthropic-organization-id` on every API
    /// response to the seat's tokens.
    pub organization_uuid: String,
    /// The user account's uuid.
    pub account_uuid: String,
    /// The user's email address.
    pub email: String,
}

impl Identity {
    /// A fake identity derived from `name` alone: the same name always gives the same
    /// uuids (version 4 shaped, from SHA-256), and the email `<name>@example.com` (or
    /// `name` itself if it already has an `@`).
    pub fn new(name: &str) -> Identity {
        let email = if name.contains('@') { name.to_owned() } else { format!("{name}@example.com") };
        Identity { organization_uuid: fake_uuid("organization", name), account_uuid: fake_uuid("account", name), email }
    }

    /// The organization's display name, `"<email>'s Organization"`, the name Anthropic
    /// gives a personal subscription's organization.
    pub fn organization_name(&self) -> String {
        format!("{}'s Organization", self.email)
    }
}

/// One access and refresh token pair, as a login or a refresh hands them out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tokens {
    /// `sk-ant-oat01-…`: what goes in `authorization: Bearer` until `expires_at_ms`.
    pub access_token: String,
    /// `sk-ant-ort01-…`: single-use; a refresh returns its successor.
    pub refresh_token: String,
    /// When the access token expires, epoch milliseconds.
    pub expires_at_ms: u64,
    /// The granted scopes ([`SCOPES`]).
    pub scopes: Vec<String>,
}

/// How the token endpoint behaves, for every grant, from now on ([`OAuth::set_mode`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TokenMode {
    /// Answers at once.
    #[default]
    Normal,
    /// Waits this long, then handles the request. A client that gives up before has
    /// changed nothing: its refresh token is still valid.
    Slow(Duration),
    /// Answers with this status (a 5xx; 429 and 529 get their own error types) and
    /// Anthropic's error envelope, changing nothing.
    Failing(u16),
    /// Never answers, changing nothing.
    Hang,
}

/// One request to `POST /v1/oauth/token`, recorded on arrival.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenRequest {
    /// `grant_type` as sent (`"refresh_token"`, `"authorization_code"`, …), `""` if
    /// missing or the body did not parse.
    pub grant_type: String,
    /// `client_id` as sent.
    pub client_id: Option<String>,
    /// The seat the refresh token or code belongs to (used or not), if the mock ever
    /// issued it.
    pub seat: Option<Seat>,
    /// When it arrived, epoch milliseconds.
    pub at_ms: u64,
    /// The status answered, or `None` while it is in flight (or hangs, or the client gave
    /// up during [`TokenMode::Slow`]).
    pub status: Option<u16>,
}

/// A handle to the mock's OAuth authority ([`crate::MockUpstream::oauth`]); clones are
/// cheap and share it.
#[derive(Clone)]
pub struct OAuth {
    pub(crate) inner: Arc<Authority>,
}

/// One subscription login bound to one scripted [`Account`]; clones share it.
///
/// Every access token the seat is ever given answers the API routes as that account (its
/// script, its quota), with `anthropic-organization-id` set to the identity's
/// organization, and is recorded under the account's credential.
#[derive(Clone)]
pub struct Seat {
    authority: Arc<Authority>,
    index: usize,
}

/// The state behind [`OAuth`] and [`Seat`], shared with the server.
#[derive(Default)]
pub(crate) struct Authority {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    seats: Vec<SeatData>,
    access: HashMap<String, AccessToken>,
    /// Every refresh token ever issued, so a reused one is still known to be its seat's.
    refresh: HashMap<String, RefreshToken>,
    codes: HashMap<String, Code>,
    mode: TokenMode,
    requests: Vec<TokenLog>,
    refreshes: usize,
    usage_requests: usize,
    usage_limit: Option<u32>,
    usage_calls: HashMap<String, VecDeque<Instant>>,
}

struct SeatData {
    account: Account,
    identity: Identity,
    org: HeaderValue,
    lifetime: Duration,
}

struct AccessToken {
    seat: usize,
    expires_at_ms: u64,
}

struct RefreshToken {
    seat: usize,
    live: bool,
}

struct Code {
    seat: usize,
    challenge: String,
    used: bool,
}

/// A [`TokenRequest`] as kept: the seat as an index.
struct TokenLog {
    grant_type: String,
    client_id: Option<String>,
    seat: Option<usize>,
    at_ms: u64,
    status: Option<u16>,
}

/// What an access token presented on an API route stands for.
pub(crate) enum Access {
    /// A live token of seat number `seat`: answer as this account, under this
    /// organization id.
    Valid { account: Account, org: HeaderValue, seat: usize },
    /// A token the mock issued whose lifetime is over.
    Expired,
}

/// A successful grant: the new pair and whom it was issued to.
pub(crate) struct Granted {
    pub tokens: Tokens,
    pub lifetime: Duration,
    pub identity: Identity,
}

/// A grant, as the token endpoint parsed it.
pub(crate) enum Grant<'a> {
    Refresh { refresh_token: &'a str },
    Code { code: &'a str, verifier: &'a str },
}

impl OAuth {
    /// Binds a new seat, logged in as `identity`, to `account`. Several seats may share
    /// an account.
    ///
    /// # Panics
    /// If `identity.organization_uuid` is not a valid header value.
    pub fn seat(&self, account: &Account, identity: Identity) -> Seat {
        let org = HeaderValue::try_from(identity.organization_uuid.as_str())
            .unwrap_or_else(|e| panic!("invalid organization uuid `{}`: {e}", identity.organization_uuid));
        let mut state = self.inner.state();
        state.seats.push(SeatData { account: account.clone(), identity, org, lifetime: DEFAULT_LIFETIME });
        Seat { authority: self.inner.clone(), index: state.seats.len() - 1 }
    }

    /// Sets how the token endpoint answers from now on (default [`TokenMode::Normal`]).
    /// A request takes the mode in force when it arrives.
    pub fn set_mode(&self, mode: TokenMode) {
        self.inner.state().mode = mode;
    }

    /// Every request to the token endpoint, in arrival order.
    pub fn token_requests(&self) -> Vec<TokenRequest> {
        let state = self.inner.state();
        let seat = |index: usize| Seat { authority: self.inner.clone(), index };
        let public = |r: &TokenLog| TokenRequest {
            grant_type: r.grant_type.clone(),
            client_id: r.client_id.clone(),
            seat: r.seat.map(seat),
            at_ms: r.at_ms,
            status: r.status,
        };
        state.requests.iter().map(public).collect()
    }

    /// How many `refresh_token` grants succeeded.
    pub fn refreshes(&self) -> usize {
        self.inner.state().refreshes
    }

    /// How many requests reached `GET /api/oauth/usage`, answered or refused.
    pub fn usage_requests(&self) -> usize {
        self.inner.state().usage_requests
    }

    /// Limits `GET /api/oauth/usage` to `per_minute` answers per access token in any 60
    /// seconds; the next gets a 429 with `retry-after`. `None` (the default) is no limit.
    pub fn set_usage_limit(&self, per_minute: Option<u32>) {
        let mut state = self.inner.state();
        state.usage_limit = per_minute;
        state.usage_calls.clear();
    }
}

impl Seat {
    /// Mints a fresh pair, as a login would (for a test that writes a credentials file).
    /// Earlier pairs stay valid: their access tokens until expiry, their refresh tokens
    /// until used.
    pub fn issue(&self) -> Tokens {
        let mut state = self.authority.state();
        state.mint(self.index, now_ms())
    }

    /// Sets how long access tokens minted from now on live (default 1 hour). The token
    /// response's `expires_in` is this in whole seconds, rounded down, so a client that
    /// trusts it never believes a token lives longer than it does.
    pub fn set_lifetime(&self, lifetime: Duration) {
        self.authority.state().seats[self.index].lifetime = lifetime;
    }

    /// Registers a one-time authorization code for this seat, bound to a PKCE S256
    /// `code_challenge` (as read from the authorize URL the gateway prints): exchanging it
    /// needs the `code_verifier` whose `base64url(sha256(verifier))` is the challenge.
    pub fn code_for(&self, code_challenge: &str) -> String {
        let code = random_token("");
        let entry = Code { seat: self.index, challenge: code_challenge.to_owned(), used: false };
        self.authority.state().codes.insert(code.clone(), entry);
        code
    }

    /// Revokes the seat's login: every refresh token it holds answers `invalid_grant`
    /// from now on, so the operator must log in again ([`Seat::issue`] or
    /// [`Seat::code_for`] work as a new login). Access tokens stay valid until expiry.
    pub fn revoke(&self) {
        let mut state = self.authority.state();
        for token in state.refresh.values_mut().filter(|t| t.seat == self.index) {
            token.live = false;
        }
    }

    /// Expires every access token of this seat now, without waiting for the clock.
    pub fn expire_access_tokens(&self) {
        let now = now_ms();
        let mut state = self.authority.state();
        for token in state.access.values_mut().filter(|t| t.seat == self.index) {
            token.expires_at_ms = token.expires_at_ms.min(now);
        }
    }

    /// The account this seat's tokens answer as.
    pub fn account(&self) -> Account {
        self.authority.state().seats[self.index].account.clone()
    }

    /// Whom this seat is logged in as.
    pub fn identity(&self) -> Identity {
        self.authority.state().seats[self.index].identity.clone()
    }
}

impl PartialEq for Seat {
    /// The same seat of the same authority.
    fn eq(&self, other: &Seat) -> bool {
        Arc::ptr_eq(&self.authority, &other.authority) && self.index == other.index
    }
}

impl Eq for Seat {}

impl std::fmt::Debug for Seat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.authority.state();
        let seat = &state.seats[self.index];
        f.debug_struct("Seat")
            .field("index", &self.index)
            .field("email", &seat.identity.email)
            .field("account", &seat.account.credential())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for OAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuth").field("seats", &self.inner.state().seats.len()).finish_non_exhaustive()
    }
}

impl Authority {
    /// What `token` stands for on an API route, or `None` if the mock never issued it.
    pub(crate) fn access(&self, token: &str, now_ms: u64) -> Option<Access> {
        let state = self.state();
        let access = state.access.get(token)?;
        if now_ms >= access.expires_at_ms {
            return Some(Access::Expired);
        }
        let seat = &state.seats[access.seat];
        Some(Access::Valid { account: seat.account.clone(), org: seat.org.clone(), seat: access.seat })
    }

    /// Whom seat number `seat` is logged in as.
    fn identity(&self, seat: usize) -> Identity {
        self.state().seats[seat].identity.clone()
    }

    /// Records a token request on arrival; returns its index for [`Authority::answered`].
    fn record(&self, grant_type: &str, client_id: Option<&str>, grant: Option<&Grant<'_>>) -> usize {
        let mut state = self.state();
        let seat = grant.and_then(|g| match g {
            Grant::Refresh { refresh_token } => state.refresh.get(*refresh_token).map(|t| t.seat),
            Grant::Code { code, .. } => state.codes.get(*code).map(|c| c.seat),
        });
        let at_ms = now_ms();
        let client_id = client_id.map(str::to_owned);
        state.requests.push(TokenLog { grant_type: grant_type.to_owned(), client_id, seat, at_ms, status: None });
        state.requests.len() - 1
    }

    /// Notes the status a recorded token request was answered with.
    fn answered(&self, index: usize, status: u16) {
        self.state().requests[index].status = Some(status);
    }

    fn mode(&self) -> TokenMode {
        self.state().mode
    }

    /// Checks and spends a grant: a refresh token or an authorization code is good once.
    /// The error is the `error_description` of an `invalid_grant`.
    fn grant(&self, grant: &Grant<'_>) -> Result<Granted, &'static str> {
        let mut guard = self.state();
        // Through a plain reference, so that borrows of different fields do not conflict.
        let state = &mut *guard;
        let seat = match *grant {
            Grant::Refresh { refresh_token } => {
                let token = state.refresh.get_mut(refresh_token).filter(|t| t.live);
                let token = token.ok_or("Refresh token not found or invalid")?;
                token.live = false;
                state.refreshes += 1;
                token.seat
            }
            Grant::Code { code, verifier } => {
                let entry = state.codes.get_mut(code).filter(|c| !c.used).ok_or("Invalid 'code' in request.")?;
                if pkce_challenge(verifier) != entry.challenge {
                    return Err("Invalid 'code_verifier' in request.");
                }
                entry.used = true;
                entry.seat
            }
        };
        let tokens = state.mint(seat, now_ms());
        let data = &state.seats[seat];
        Ok(Granted { tokens, lifetime: data.lifetime, identity: data.identity.clone() })
    }

    /// Whether `token` may have one more usage answer under the per-token limit, if one is
    /// set (counting it if so): `Err(seconds until a slot frees)` if not.
    fn usage_slot(&self, token: &str) -> Result<(), u64> {
        const MINUTE: Duration = Duration::from_secs(60);
        let mut state = self.state();
        let Some(limit) = state.usage_limit else { return Ok(()) };
        let now = Instant::now();
        let calls = state.usage_calls.entry(token.to_owned()).or_default();
        while calls.front().is_some_and(|t| now.duration_since(*t) >= MINUTE) {
            calls.pop_front();
        }
        if calls.len() >= limit as usize {
            let oldest = calls.front().copied().unwrap_or(now);
            return Err(MINUTE.saturating_sub(now.duration_since(oldest)).as_secs().max(1));
        }
        calls.push_back(now);
        Ok(())
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }
}

impl State {
    /// A new pair for `seat`, registered as valid.
    fn mint(&mut self, seat: usize, now_ms: u64) -> Tokens {
        let lifetime = self.seats[seat].lifetime;
        let expires_at_ms = now_ms.saturating_add(u64::try_from(lifetime.as_millis()).unwrap_or(u64::MAX));
        let tokens = Tokens {
            access_token: random_token("sk-ant-oat01-"),
            refresh_token: random_token("sk-ant-ort01-"),
            expires_at_ms,
            scopes: SCOPES.iter().map(|s| (*s).to_owned()).collect(),
        };
        self.access.insert(tokens.access_token.clone(), AccessToken { seat, expires_at_ms });
        self.refresh.insert(tokens.refresh_token.clone(), RefreshToken { seat, live: true });
        tokens
    }
}

/// A JSON response with a `request-id`, as every OAuth route answers.
fn json(status: u16, body: String, request_id: &HeaderValue) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or_else(|_| panic!("invalid HTTP status {status}"));
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(header::JSON));
    response.headers_mut().insert(header::REQUEST_ID, request_id.clone());
    response
}

/// Milliseconds since the Unix epoch, by the system clock.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_stable_and_uuid_shaped() {
        let a = Identity::new("alice");
        assert_eq!(a, Identity::new("alice"));
        assert_ne!(a.organization_uuid, Identity::new("bob").organization_uuid);
        assert_ne!(a.organization_uuid, a.account_uuid);
        assert_eq!(a.email, "alice@example.com");
        assert_eq!(Identity::new("x@y.test").email, "x@y.test");
        let parts: Vec<usize> = a.account_uuid.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12]);
        assert_eq!(&a.account_uuid[14..15], "4");
        assert!("89ab".contains(&a.account_uuid[19..20]));
        assert_eq!(a.organization_name(), "alice@example.com's Organization");
    }

    fn seat() -> (OAuth, Seat) {
        let oauth = OAuth { inner: Arc::default() };
        let seat = oauth.seat(&Account::new("acct", None), Identity::new("alice"));
        (oauth, seat)
    }

    #[test]
    fn a_refresh_token_is_good_once_and_rotates() {
        let (oauth, seat) = seat();
        let first = seat.issue();
        let granted = oauth.inner.grant(&Grant::Refresh { refresh_token: &first.refresh_token }).unwrap();
        assert_ne!(granted.tokens.refresh_token, first.refresh_token);
        assert_ne!(granted.tokens.access_token, first.access_token);
        assert_eq!(granted.identity, seat.identity());
        let reused = oauth.inner.grant(&Grant::Refresh { refresh_token: &first.refresh_token });
        assert_eq!(reused.err(), Some("Refresh token not found or invalid"));
        assert!(oauth.inner.grant(&Grant::Refresh { refresh_token: &granted.tokens.refresh_token }).is_ok());
        assert_eq!(oauth.refreshes(), 2);
    }

    #[test]
    fn access_tokens_expire_by_the_clock() {
        let (oauth, seat) = seat();
        seat.set_lifetime(Duration::from_secs(2));
        let t = seat.issue();
        let now = now_ms();
        assert!((now + 1_900..=now + 2_000).contains(&t.expires_at_ms));
        assert!(matches!(oauth.inner.access(&t.access_token, t.expires_at_ms - 1), Some(Access::Valid { .. })));
        assert!(matches!(oauth.inner.access(&t.access_token, t.expires_at_ms), Some(Access::Expired)));
        assert!(oauth.inner.access("sk-ant-oat01-unknown", now).is_none());
        seat.expire_access_tokens();
        assert!(matches!(oauth.inner.access(&t.access_token, now_ms()), Some(Access::Expired)));
    }

    #[test]
    fn a_code_needs_its_verifier_and_is_good_once() {
        let (oauth, seat) = seat();
        let code = seat.code_for(&pkce_challenge("the-verifier"));
        let wrong = oauth.inner.grant(&Grant::Code { code: &code, verifier: "another-verifier" });
        assert_eq!(wrong.err(), Some("Invalid 'code_verifier' in request."));
        assert!(oauth.inner.grant(&Grant::Code { code: &code, verifier: "the-verifier" }).is_ok());
        let again = oauth.inner.grant(&Grant::Code { code: &code, verifier: "the-verifier" });
        assert_eq!(again.err(), Some("Invalid 'code' in request."));
        assert_eq!(oauth.refreshes(), 0, "a code exchange is not a refresh");
    }

    #[test]
    fn revoking_kills_refresh_tokens_not_access_tokens() {
        let (oauth, seat) = seat();
        let t = seat.issue();
        seat.revoke();
        assert!(oauth.inner.grant(&Grant::Refresh { refresh_token: &t.refresh_token }).is_err());
        assert!(matches!(oauth.inner.access(&t.access_token, now_ms()), Some(Access::Valid { .. })));
        let relogin = seat.issue();
        assert!(oauth.inner.grant(&Grant::Refresh { refresh_token: &relogin.refresh_token }).is_ok());
    }

    #[test]
    fn the_usage_limit_is_per_token() {
        let (oauth, _) = seat();
        assert_eq!(oauth.inner.usage_slot("a"), Ok(()), "no limit by default");
        oauth.set_usage_limit(Some(2));
        assert_eq!(oauth.inner.usage_slot("a"), Ok(()));
        assert_eq!(oauth.inner.usage_slot("a"), Ok(()));
        assert!(matches!(oauth.inner.usage_slot("a"), Err(59 | 60)));
        assert_eq!(oauth.inner.usage_slot("b"), Ok(()));
    }
}
