//! The seat keeper: refreshes every seat of the running generation before its
//! token expires (checked every `check_interval_ms`, refreshed when less than
//! `refresh_before_ms` is left), and at start heals the seats whose token has
//! already expired, before the gateway serves. Never on a request's path: a
//! request only waits for a refresh when its own account answered 401.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::seat::{Refreshed, Seat, SeatError, Why};
use crate::gateway::{Gateway, now_ms};

/// The seats of the running generation, with their account ids.
fn seats(gw: &Gateway) -> Vec<(String, Arc<Seat>, Arc<crate::gateway::accounts::AccountState>)> {
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
        let metrics = gw.metrics.clone();
        async move {
            let r = seat.refresh(Why::Expiring, None, now_ms, before_ms, oauth.max_backoff_ms).await;
            note(&metrics, &id, &state, &r);
        }
    });
    futures_util::future::join_all(runs).await;
}

/// Counts a refresh's result and forgets what was learned about an identity
/// the seat no longer has.
pub fn note(
    metrics: &crate::gateway::metrics::Metrics,
    id: &str,
    state: &crate::gateway::accounts::AccountState,
    r: &Result<Refreshed, SeatError>,
) {
    let result = match r {
        Ok(Refreshed::Renewed { identity_changed }) => {
            if *identity_changed {
                tracing::warn!(account = id, "the seat now belongs to another identity; its old readings are dropped");
                state.forget_learned();
            }
            "renewed"
        }
        Ok(Refreshed::Adopted) => "adopted",
        Ok(Refreshed::NotNeeded) => return,
        Err(SeatError::NeedsLogin) => "needs_login",
        Err(SeatError::BackingOff(_)) => return,
        Err(SeatError::Failed(_)) => "failed",
    };
    metrics.oauth_refresh(id, result);
}

/// At start: refreshes the seats whose token expired (or expires within a
/// minute), before the gateway serves — so a restart after a long stop does
/// not begin by answering 401s. Bounded by the token endpoint's timeout.
pub async fn heal(gw: &Gateway) {
    refresh_due(gw, 60_000).await;
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
        }
    })
}
