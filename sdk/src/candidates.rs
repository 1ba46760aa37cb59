//! The pool table (strings handed over once) and the per-request candidate list.

use std::cmp::Ordering;
use std::collections::HashMap;

use crate::{Account, AccountInfo, Ranking};

/// Every configured account, indexed by [`Account::id`].
#[derive(Debug, Clone, Default)]
pub struct Pool {
    accounts: Vec<AccountInfo>,
    by_id: HashMap<String, u32>,
}

impl Pool {
    pub(crate) fn new(accounts: Vec<AccountInfo>) -> Self {
        let by_id = accounts
            .iter()
            .enumerate()
            .map(|(i, a)| (a.id.clone(), i as u32))
            .collect();
        Pool { accounts, by_id }
    }

    /// The account at pool index `index`.
    pub fn get(&self, index: u32) -> Option<&AccountInfo> {
        self.accounts.get(index as usize)
    }

    /// The pool index of the account with string id `id`.
    pub fn index_of(&self, id: &str) -> Option<u32> {
        self.by_id.get(id).copied()
    }

    /// Every account, in configuration order.
    pub fn iter(&self) -> impl Iterator<Item = &AccountInfo> {
        self.accounts.iter()
    }

    /// How many accounts the pool has.
    pub fn len(&self) -> usize {
        self.accounts.len()
    }

    /// Whether the pool is empty.
    pub fn is_empty(&self) -> bool {
        self.accounts.is_empty()
    }
}

/// The candidates of one `rank` call, in the order the previous stage left them.
pub struct Candidates<'a> {
    accounts: Vec<Account>,
    pool: &'a Pool,
}

static MISSING: std::sync::LazyLock<AccountInfo> = std::sync::LazyLock::new(|| AccountInfo {
    id: String::new(),
    alias: String::new(),
    primary: false,
});

impl<'a> Candidates<'a> {
    pub(crate) fn new(accounts: Vec<Account>, pool: &'a Pool) -> Self {
        Candidates { accounts, pool }
    }

    /// The candidates in input order.
    pub fn accounts(&self) -> &[Account] {
        &self.accounts
    }

    /// `(position, account)` pairs in input order; the position is what a
    /// [`Ranking`] refers to.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Account)> {
        self.accounts.iter().enumerate().map(|(i, a)| (i as u32, a))
    }

    /// How many candidates there are.
    pub fn len(&self) -> usize {
        self.accounts.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.accounts.is_empty()
    }

    /// The pool entry (string id, alias) of a candidate.
    pub fn info(&self, account: &Account) -> &AccountInfo {
        self.pool.get(account.id).unwrap_or(&MISSING)
    }

    /// The pool table.
    pub fn pool(&self) -> &Pool {
        self.pool
    }

    /// The positions in input order.
    pub fn input_order(&self) -> Vec<u32> {
        (0..self.accounts.len() as u32).collect()
    }

    /// Keeps the input order; an empty `reason` leaves the earlier reason standing.
    pub fn unchanged(&self, reason: &str) -> Ranking {
        Ranking::new(self.input_order(), reason)
    }

    /// Sorts by `cmp` (stable: ties keep input order) and claims the head.
    pub fn sorted_by(
        &self,
        reason: &str,
        mut cmp: impl FnMut(&Account, &Account) -> Ordering,
    ) -> Ranking {
        let mut order = self.input_order();
        order.sort_by(|&a, &b| cmp(&self.accounts[a as usize], &self.accounts[b as usize]));
        Ranking::new(order, reason)
    }

    /// Sorts by a key, smallest first (stable).
    pub fn sorted_by_key<K: Ord>(&self, reason: &str, mut key: impl FnMut(&Account) -> K) -> Ranking {
        self.sorted_by(reason, |a, b| key(a).cmp(&key(b)))
    }

    /// The input order with the candidate at `position` moved to the front.
    pub fn with_front(&self, position: u32, reason: &str) -> Ranking {
        let mut order = vec![position];
        order.extend(self.input_order().into_iter().filter(|&i| i != position));
        Ranking::new(order, reason)
    }
}
