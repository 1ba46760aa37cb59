//! The pool table (strings handed over once) and the per-request candidate list.

use std::cmp::Ordering;
use std::collections::HashMap;

use crate::candidate::Candidate;
use crate::{Account, AccountInfo, QuotaWindow, Ranking};

/// Every configured account, indexed by [`Account::id`], and how old a quota
/// reading may be and still count as fresh.
#[derive(Debug, Clone)]
pub struct Pool {
    accounts: Vec<AccountInfo>,
    by_id: HashMap<String, u32>,
    freshness_ms: u64,
}

impl Default for Pool {
    fn default() -> Self {
        Pool::new(Vec::new())
    }
}

impl Pool {
    pub(crate) fn new(accounts: Vec<AccountInfo>) -> Self {
        let by_id = accounts.iter().enumerate().map(|(i, a)| (a.id.clone(), i as u32)).collect();
        Pool { accounts, by_id, freshness_ms: crate::quota::DEFAULT_FRESHNESS_MS }
    }

    /// The same pool, with readings fresh for `ms` (what the host says, see
    /// [`crate::host::freshness_ms`]).
    pub fn with_freshness_ms(mut self, ms: u64) -> Self {
        self.freshness_ms = ms;
        self
    }

    /// How old a quota reading may be and still count as fresh, ms: the
    /// operator's setting for this stage ([`crate::quota::DEFAULT_FRESHNESS_MS`]
    /// where no host said).
    pub fn freshness_ms(&self) -> u64 {
        self.freshness_ms
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

static MISSING: AccountInfo = AccountInfo { id: String::new(), alias: String::new(), primary: false };

/// The candidates of one `rank` call, in the order the previous stage left them.
pub struct Candidates<'a> {
    accounts: Vec<Account>,
    windows: Vec<QuotaWindow>,
    /// For each candidate position: its range in `windows`.
    spans: Vec<(usize, usize)>,
    pool: &'a Pool,
}

impl<'a> Candidates<'a> {
    pub(crate) fn new(accounts: Vec<Account>, mut windows: Vec<QuotaWindow>, pool: &'a Pool) -> Self {
        // The host sends windows grouped by account; sort anyway (stable, and
        // free when already grouped) so a hand-built input works too.
        if !windows.is_sorted_by_key(|w| w.account) {
            windows.sort_by_key(|w| w.account);
        }
        let spans = accounts
            .iter()
            .map(|a| {
                let start = windows.partition_point(|w| w.account < a.id);
                let end = windows.partition_point(|w| w.account <= a.id);
                (start, end)
            })
            .collect();
        Candidates { accounts, windows, spans, pool }
    }

    /// The candidate at `position`.
    pub fn get(&self, position: u32) -> Candidate<'_> {
        let i = position as usize;
        let (start, end) = self.spans[i];
        let account = &self.accounts[i];
        Candidate {
            position,
            account,
            windows: &self.windows[start..end],
            info: self.pool.get(account.id).unwrap_or(&MISSING),
            freshness_ms: self.pool.freshness_ms,
        }
    }

    /// The candidates in input order.
    pub fn iter(&self) -> impl Iterator<Item = Candidate<'_>> {
        (0..self.accounts.len() as u32).map(|i| self.get(i))
    }

    /// How many candidates there are.
    pub fn len(&self) -> usize {
        self.accounts.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.accounts.is_empty()
    }

    /// The position of the candidate at pool index `id`, if it is among them.
    pub fn position_of(&self, id: u32) -> Option<u32> {
        self.accounts.iter().position(|a| a.id == id).map(|p| p as u32)
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
    pub fn sorted_by(&self, reason: &str, mut cmp: impl FnMut(&Candidate<'_>, &Candidate<'_>) -> Ordering) -> Ranking {
        let all: Vec<Candidate<'_>> = self.iter().collect();
        let mut order = self.input_order();
        order.sort_by(|&a, &b| cmp(&all[a as usize], &all[b as usize]));
        Ranking::new(order, reason)
    }

    /// Sorts by a key computed once per candidate, smallest first (stable).
    pub fn sorted_by_key<K: Ord>(&self, reason: &str, mut key: impl FnMut(&Candidate<'_>) -> K) -> Ranking {
        let keys: Vec<K> = self.iter().map(|c| key(&c)).collect();
        let mut order = self.input_order();
        order.sort_by(|&a, &b| keys[a as usize].cmp(&keys[b as usize]));
        Ranking::new(order, reason)
    }

    /// The input order with the candidate at `position` moved to the front.
    pub fn with_front(&self, position: u32, reason: &str) -> Ranking {
        let mut order = Vec::with_capacity(self.accounts.len());
        order.push(position);
        order.extend((0..self.accounts.len() as u32).filter(|&i| i != position));
        Ranking::new(order, reason)
    }
}
