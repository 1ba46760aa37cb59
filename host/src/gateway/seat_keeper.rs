//! The seat keeper, a background task of the gateway: refreshes every seat of the running generation before its
//! token expires (checked every `check_interval_ms`, refreshed when less than
//! `refresh_before_ms` is left), and at start heals the seats whose token has
//! already expired, before the gateway serves. Never on a request's path: a
//! request only waits for a refresh when its own account answered 401.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;

use super::Gateway;
use super::request::upstream::{Target, Transport};
use crate::oauth::{Refreshed, Seat, SeatError, Why};

/// The gateway's one [`Transport`] as the token endpoint's carrier: a seat's
/// refresh goes out through the same client, connect and header timeouts as
/// the seat's requests — and, in the request path's own tests, through the
/// scripted transport on the manual clock, so a token's expiry and refresh
/// run in-process like every other failure.
pub struct ViaTransport(pub Arc<dyn Transport>);

#[async_trait::async_trait]
impl crate::oauth::Carrier for ViaTransport {
    async fn send(&self, request: Request<Bytes>, timeout: Duration) -> Result<Response<Bytes>, String> {
        let (parts, body) = request.into_parts();
        let (Some(scheme), Some(authority)) = (parts.uri.scheme_str(), parts.uri.authority()) else {
            return Err(format!("`{}` is not an absolute URL", parts.uri));
        };
        // The endpoint takes no key: the refresh token is in the form.
        let target = Target::backend(&format!("{scheme}://{authority}"), None).map_err(|e| format!("{e:#}"))?;
        let answer = self.0.send(&target, &parts.method, &parts.uri, &parts.headers, &body, timeout).await?;
        let (head, mut body) = answer.into_parts();
        let read = async {
            let mut whole = Vec::new();
            while let Some(frame) = body.frame().await {
                if let Ok(data) = frame.map_err(|_| ())?.into_data() {
                    whole.extend_from_slice(&data);
                    if whole.len() > crate::oauth::token::MAX_ANSWER {
                        return Err(());
                    }
                }
            }
            Ok(Bytes::from(whole))
        };
        match tokio::time::timeout(timeout, read).await {
            Ok(Ok(b)) => Ok(Response::from_parts(head, b)),
            _ => Err(format!("status {}, body unreadable", head.status)),
        }
    }
}

/// The seats of the running generation, with their account ids.
fn seats(gw: &Gateway) -> Vec<(String, Arc<Seat>, Arc<crate::learned::accounts::AccountState>)> {
    let g = gw.generation();
    g.accounts
        .iter()
        .filter_map(|a| a.target.oauth_seat().map(|s| (a.config.id.clone(), s.clone(), a.state.clone())))
        .collect()
}

/// Refreshes every seat due within `before_ms`, all at once (one slow token
/// endpoint answer never holds up another seat).
pub async fn refresh_due(gw: &Gateway, before_ms: u64) {
    let oauth = gw.generation().config.oauth.clone();
    let runs = seats(gw).into_iter().map(|(id, seat, state)| {
        let oauth = oauth.clone();
        let (metrics, clock) = (gw.metrics.clone(), gw.clock.clone());
        async move {
            let r = seat.refresh(Why::Expiring, None, || clock.now_ms(), before_ms, oauth.max_backoff_ms).await;
            note(&metrics, &id, &state, &r, clock.now_ms());
        }
    });
    futures_util::future::join_all(runs).await;
}

/// Counts a refresh's result (what the token endpoint answered: a check that
/// sent nothing is not counted), lifts a cooldown the old token earned, and
/// forgets what was learned about an identity the seat no longer has.
pub fn note(
    metrics: &crate::metrics::Metrics,
    id: &str,
    state: &crate::learned::accounts::AccountState,
    r: &Result<Refreshed, SeatError>,
    now_ms: u64,
) {
    if matches!(r, Ok(Refreshed::Renewed { .. } | Refreshed::Adopted)) {
        state.clear_auth_cooldown(now_ms);
    }
    let result = match r {
        Ok(Refreshed::Renewed { identity_changed }) => {
            if *identity_changed {
                tracing::warn!(account = id, "the seat now belongs to another identity; its old readings are dropped");
                state.forget_learned();
            }
            "renewed"
        }
        Ok(Refreshed::Adopted) => "adopted",
        // A refusal is counted once, when the endpoint says it; the checks
        // that find the seat still waiting for a login send nothing.
        Err(SeatError::Refused) => "needs_login",
        Ok(Refreshed::NotNeeded) | Err(SeatError::NeedsLogin | SeatError::BackingOff(_)) => return,
        Err(SeatError::Failed(_)) => "failed",
    };
    metrics.oauth_refresh(id, result);
}

/// Polls `/api/oauth/usage` for every seat whose newest reading is older
/// than `[oauth] usage_poll_ms` (and that was not polled within it), all at
/// once; each result is a reading like a response's headers.
pub async fn poll_usage(gw: &Gateway) {
    let g = gw.generation();
    let every = g.config.oauth.usage_poll_ms;
    if every == 0 {
        return;
    }
    let now = gw.clock.now_ms();
    let timeout = Duration::from_millis(g.config.oauth.timeout_ms);
    let runs = g.accounts.iter().filter_map(|a| {
        let seat = a.target.oauth_seat()?;
        let stale = a.state.last_reading_ms().is_none_or(|t| now.saturating_sub(t) >= every);
        (stale && !seat.needs_login() && seat.take_usage_turn(now, every)).then_some(a)
    });
    let runs = runs.map(|a| async move {
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::ACCEPT, http::HeaderValue::from_static("application/json"));
        let uri = http::Uri::from_static("/api/oauth/usage");
        let sent = gw.http.send(&a.target, &http::Method::GET, &uri, &headers, &bytes::Bytes::new(), timeout).await;
        let body = match sent {
            Ok(r) if r.status().is_success() => crate::gateway::request::upstream::read_small(r).await,
            Ok(r) => return tracing::debug!(account = %a.config.id, status = r.status().as_u16(), "usage poll refused"),
            Err(e) => return tracing::debug!(account = %a.config.id, error = %e, "usage poll failed"),
        };
        let now = gw.clock.now_ms();
        match crate::learned::usage::parse(&body, now) {
            Some(reading) => a.state.take_reading(&reading, now),
            None => tracing::debug!(account = %a.config.id, "usage poll answered something else"),
        }
    });
    futures_util::future::join_all(runs).await;
}

/// At start: refreshes the seats whose token expired (or expires within a
/// minute), before the gateway serves — so a restart after a long stop does
/// not begin by answering 401s. Bounded by the token endpoint's timeout.
pub async fn heal(gw: &Gateway) {
    refresh_due(gw, 60_000).await;
    // A first reading for every seat, if the usage endpoint answers quickly;
    // readiness does not wait longer than this for it (the keeper polls again).
    let _ = tokio::time::timeout(Duration::from_secs(2), poll_usage(gw)).await;
}

/// Checks the seats every `check_interval_ms` for as long as the gateway lives.
pub fn spawn(gw: &Arc<Gateway>) -> tokio::task::JoinHandle<()> {
    let weak: Weak<Gateway> = Arc::downgrade(gw);
    tokio::spawn(async move {
        loop {
            let Some(gw) = weak.upgrade() else { return };
            let oauth = gw.generation().config.oauth.clone();
            drop(gw);
            tokio::time::sleep(Duration::from_millis(oauth.check_interval_ms)).await;
            let Some(gw) = weak.upgrade() else { return };
            refresh_due(&gw, oauth.refresh_before_ms).await;
            poll_usage(&gw).await;
        }
    })
}
