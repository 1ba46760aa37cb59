//! Signing in to the web page without typing the admin token: a one-time
//! ticket, exchanged for a session.
//!
//! `poolgate demo` prints a link to its page, `…/ui#ticket=<t>`. Why a
//! ticket and not the token: a URL is kept in history, copied into chats
//! and shown on screens; a ticket works **once**, for [`TICKET_MS`], and
//! then the link holds nothing that signs anyone in. It sits in the URL's
//! fragment, which a browser never sends to a server, so no access log
//! sees it either. The page trades it (`POST /ui/sign-in`) for a session
//! token — random, kept here only as its SHA-256, good for
//! [`SESSION_MS`] and for this process only — which the admin routes accept
//! like the admin token.

use std::collections::HashMap;

use http::HeaderMap;
use parking_lot::Mutex;

use super::auth::presented;
use crate::config::digest;

/// How long a ticket may wait to be used.
pub const TICKET_MS: u64 = 10 * 60 * 1000;
/// How long a session lasts.
pub const SESSION_MS: u64 = 12 * 3600 * 1000;
/// Most tickets and sessions held at once (the oldest go first).
const HELD_MAX: usize = 64;

/// Tickets not yet used and sessions open, each by its SHA-256, with when
/// it lapses.
#[derive(Default)]
pub struct Sessions {
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    tickets: HashMap<[u8; 32], u64>,
    sessions: HashMap<[u8; 32], u64>,
}

/// Keeps what has not lapsed at `now_ms`, and at most [`HELD_MAX`].
fn prune(map: &mut HashMap<[u8; 32], u64>, now_ms: u64) {
    map.retain(|_, until| *until > now_ms);
    while map.len() >= HELD_MAX {
        let Some(oldest) = map.iter().min_by_key(|(_, until)| **until).map(|(k, _)| *k) else { break };
        map.remove(&oldest);
    }
}

impl Sessions {
    /// A new one-time ticket, good for [`TICKET_MS`] from `now_ms`.
    pub fn ticket(&self, now_ms: u64) -> anyhow::Result<String> {
        let ticket = crate::random::random_hex(24)?;
        let mut h = self.held.lock();
        prune(&mut h.tickets, now_ms);
        h.tickets.insert(digest(&ticket), now_ms + TICKET_MS);
        Ok(ticket)
    }

    /// Uses `ticket` up: a session token if it was good, `None` if it was
    /// unknown, used or lapsed.
    pub fn redeem(&self, ticket: &str, now_ms: u64) -> Option<String> {
        let mut h = self.held.lock();
        let until = h.tickets.remove(&digest(ticket))?;
        if until <= now_ms {
            return None;
        }
        let token = crate::random::random_hex(32).ok()?;
        prune(&mut h.sessions, now_ms);
        h.sessions.insert(digest(&token), now_ms + SESSION_MS);
        Some(token)
    }

    /// Whether the request carries an open session's token.
    pub fn check(&self, headers: &HeaderMap, now_ms: u64) -> bool {
        let Some(token) = presented(headers) else { return false };
        let h = self.held.lock();
        h.sessions.get(&digest(token)).is_some_and(|until| *until > now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("authorization", format!("Bearer {token}").parse().unwrap());
        h
    }

    #[test]
    fn a_ticket_works_once_and_not_after_it_lapsed_and_a_session_lapses_too() {
        let s = Sessions::default();
        let t = s.ticket(0).unwrap();
        assert!(s.redeem("not-a-ticket", 1).is_none());
        let token = s.redeem(&t, 1).unwrap();
        assert!(s.redeem(&t, 2).is_none(), "used once");
        assert!(s.check(&bearer(&token), SESSION_MS));
        assert!(!s.check(&bearer(&token), SESSION_MS + 1), "lapsed");
        assert!(!s.check(&bearer(&t), 3), "a ticket is no session");
        let late = s.ticket(0).unwrap();
        assert!(s.redeem(&late, TICKET_MS).is_none(), "lapsed before use");
    }
}
