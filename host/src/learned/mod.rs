//! What the gateway knows about each account, below everything that routes.
//!
//! Every answer teaches the gateway something: quota readings from the
//! `anthropic-ratelimit-unified-*` headers ([`quota`]) or a seat's usage
//! endpoint ([`usage`]), a cooldown planned by cause ([`cooldown`]), a streak
//! of failures, a seat's health. That knowledge lives per account in an
//! [`accounts::AccountState`], all of them in the [`AccountBook`], which
//! outlives configuration generations (a reload keeps what was learned) and
//! is what replicas exchange ([`facts`]: an account's record and the merge by
//! observed time).
//!
//! This layer imports nothing that routes or serves: the request path
//! (`gateway`), replica sync (`shared`) and the state file read and write
//! the book; the book reads none of them.

pub mod accounts;
pub mod cooldown;
pub mod facts;
pub mod pooled;
pub mod quota;
pub mod usage;

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use accounts::AccountState;

/// Every account's learned state, by account id.
#[derive(Default)]
pub struct AccountBook {
    states: Mutex<HashMap<String, Arc<AccountState>>>,
}

impl AccountBook {
    /// The state of account `id`, created empty the first time it is named.
    pub fn entry(&self, id: &str) -> Arc<AccountState> {
        self.states.lock().entry(id.to_string()).or_insert_with(|| Arc::new(AccountState::new(id))).clone()
    }

    /// The state of account `id`, if one was ever created.
    pub fn get(&self, id: &str) -> Option<Arc<AccountState>> {
        self.states.lock().get(id).cloned()
    }

    /// The ids of every account with learned state.
    pub fn ids(&self) -> Vec<String> {
        self.states.lock().keys().cloned().collect()
    }

    /// Every account's learned state.
    pub fn all(&self) -> Vec<Arc<AccountState>> {
        self.states.lock().values().cloned().collect()
    }
}
