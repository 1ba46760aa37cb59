//! Client keys as a request meets them: the config's (`[[server.client_keys]]`,
//! part of the generation) and those managed at run time (`poolgate keys`,
//! `/admin/keys`, kept in the ledger's store — `crate::ledger::keys`).
//!
//! The run-time keys are read from the store at start, again every
//! [`REFRESH`] (so a key created with the CLI, or on another replica sharing
//! the store, works within that), and at once after an admin endpoint
//! changed one. A request presents its key once; [`identify`] says whose it
//! is, or why it is refused — a revoked or expired key is told so.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::response::Response;
use http::{HeaderMap, StatusCode};

use super::Gateway;
use super::generation::Generation;
use super::request::errors::{ErrorType, final_error};
use crate::ledger::KeyRecord;
use crate::ledger::limits::KeyPolicy;

/// How often the run-time keys are read again from the store.
pub const REFRESH: Duration = Duration::from_secs(2);

/// The keys managed at run time, as last read.
#[derive(Default)]
pub struct RuntimeKeys {
    by_digest: HashMap<[u8; 32], Arc<KeyRecord>>,
    by_name: HashMap<String, (Arc<KeyRecord>, KeyPolicy)>,
}

impl RuntimeKeys {
    /// The keys of `records` (a record whose hash is not SHA-256 hex is
    /// left out: the store was edited by hand).
    pub fn new(records: Vec<KeyRecord>) -> RuntimeKeys {
        let mut keys = RuntimeKeys::default();
        for r in records {
            let Some(digest) = hex::decode(&r.sha256).ok().and_then(|d| <[u8; 32]>::try_from(d).ok()) else {
                tracing::warn!(key = %r.name, "a run-time key's hash is not SHA-256 hex; ignored");
                continue;
            };
            let r = Arc::new(r);
            keys.by_name.insert(r.name.clone(), (r.clone(), r.limits.policy()));
            keys.by_digest.insert(digest, r);
        }
        keys
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.by_digest.is_empty()
    }

    /// Every key's name.
    pub fn names(&self) -> impl Iterator<Item = String> + '_ {
        self.by_name.keys().cloned()
    }

    /// The key called `name`.
    pub fn get(&self, name: &str) -> Option<&KeyRecord> {
        self.by_name.get(name).map(|(r, _)| &**r)
    }
}

/// Who presents `headers`' key: `Ok(None)` for a gateway with no keys at all
/// (open), the key's name, or the 401 that refuses it.
pub fn identify(gw: &Gateway, generation: &Generation, headers: &HeaderMap) -> Result<Option<String>, Box<Response>> {
    let runtime = gw.runtime_keys.load();
    if generation.client_keys.is_empty() && runtime.is_empty() {
        return Ok(None);
    }
    if let Some(name) = generation.client_keys.check(headers) {
        return Ok(Some(name.to_string()));
    }
    let refuse = |msg: &str| Err(Box::new(final_error(StatusCode::UNAUTHORIZED, ErrorType::Authentication, msg)));
    let presented = super::auth::presented(headers).map(crate::config::digest);
    match presented.and_then(|d| runtime.by_digest.get(&d)) {
        Some(key) => match key.refused(gw.clock.now_ms()) {
            Some(why) => refuse(&format!("poolgate: {why}")),
            None => Ok(Some(key.name.clone())),
        },
        None => refuse("poolgate: invalid or missing client key (send it as x-api-key or Authorization: Bearer)"),
    }
}

/// The limits of the key called `name`: the config's, else the run-time
/// key's; `None` for a key without any.
pub fn policy(gw: &Gateway, generation: &Generation, name: &str) -> Option<KeyPolicy> {
    if let Some(p) = generation.client_keys.policy(name) {
        return Some(p.clone());
    }
    gw.runtime_keys.load().by_name.get(name).map(|(_, p)| p.clone()).filter(|p| !p.is_open())
}

/// The team tag of the key called `name`.
pub fn team(gw: &Gateway, generation: &Generation, name: &str) -> Option<String> {
    if let Some(t) = generation.client_keys.team(name) {
        return Some(t.to_string());
    }
    gw.runtime_keys.load().get(name).and_then(|k| k.team.clone())
}

/// Reads the run-time keys from the store again.
pub async fn refresh(gw: &Gateway) -> anyhow::Result<()> {
    let Some(ledger) = &gw.ledger else { return Ok(()) };
    let records = ledger.keys().await?;
    gw.runtime_keys.store(Arc::new(RuntimeKeys::new(records)));
    Ok(())
}

/// Reads the run-time keys every [`REFRESH`] while the gateway lives.
pub fn spawn_refresh(gw: Weak<Gateway>) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(REFRESH).await;
            let Some(gw) = gw.upgrade() else { return };
            if let Err(e) = refresh(&gw).await {
                tracing::warn!(error = %format!("{e:#}"), "run-time client keys not re-read; the last ones read stay");
            }
        }
    });
}
