//! What one client key may do — the models it may ask for, how many requests
//! it may have in flight, requests and tokens per minute, and budgets in
//! tokens or USD per UTC day, week and month — and the meter that holds each
//! key to it.
//!
//! Plain data and pure functions of the time passed in: a request is
//! admitted (or refused, saying which limit and when it frees) when it
//! starts, and settled with what its answer used when it ends.
//!
//! **The overspend bound.** A budget is checked when a request starts,
//! against what the key's *finished* requests used; what its requests in
//! flight will use is not known until they end. So a key can pass its budget
//! by at most what the requests it has in flight at the moment the budget is
//! reached use: with `max_in_flight = n`, at most `n` requests' worth (and
//! never by a request that started after the budget was spent). Per-minute
//! token limits behave the same way.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;

use poolgate_wire::usage::Usage;

use super::SpendRow;
use super::calendar::{PERIODS, Period};

/// A budget: at most this much per calendar period (UTC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Budget {
    /// The period it resets with.
    pub period: Period,
    /// What it holds.
    pub amount: Amount,
}

/// What a budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Amount {
    /// Tokens of every kind (input, output, cache reads and writes).
    Tokens(u64),
    /// Cost, nano-USD.
    NanoUsd(u64),
}

/// One key's limits (every one optional).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyPolicy {
    /// The models it may ask for: names or `prefix*`; empty: any.
    pub models: Vec<String>,
    /// Most requests in flight at once.
    pub max_in_flight: Option<u32>,
    /// Most requests started in any 60 s.
    pub requests_per_minute: Option<u32>,
    /// Most tokens (every kind) answered in any 60 s.
    pub tokens_per_minute: Option<u64>,
    /// Budgets per calendar period.
    pub budgets: Vec<Budget>,
}

impl KeyPolicy {
    /// Whether the policy limits anything (a key without limits is not
    /// metered on the request path).
    pub fn is_open(&self) -> bool {
        *self == KeyPolicy::default()
    }

    /// Whether `model` is one the key may ask for.
    pub fn allows(&self, model: &str) -> bool {
        self.models.is_empty()
            || self.models.iter().any(|p| match p.strip_suffix('*') {
                Some(prefix) => model.starts_with(prefix),
                None => p == model,
            })
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// 403 (a model not allowed) or 429 (a limit reached).
    pub status: u16,
    /// Which limit: `model_not_allowed`, `max_in_flight`,
    /// `requests_per_minute`, `tokens_per_minute`, `budget_<period>_<tokens|usd>`.
    pub limit: String,
    /// The sentence for the client.
    pub message: String,
    /// When it frees (ms since the epoch), when known.
    pub frees_at_ms: Option<u64>,
}

/// One second's requests and tokens.
#[derive(Debug, Clone, Copy, Default)]
struct Second {
    at_s: u64,
    requests: u32,
    tokens: u64,
}

/// What a key spent in one calendar period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Spent {
    /// Its start (ms since the epoch); a spend of an earlier period reads 0.
    pub from_ms: u64,
    /// Requests answered.
    pub requests: u64,
    /// Tokens by kind.
    pub usage: Usage,
    /// Cost, nano-USD.
    pub nano_usd: u64,
}

impl Spent {
    /// Tokens of every kind.
    pub fn tokens(&self) -> u64 {
        self.usage.total()
    }

    /// Counts one more request, which used `usage` costing `nano_usd`.
    pub fn add(&mut self, usage: &Usage, nano_usd: u64) {
        self.requests += 1;
        self.usage.input_tokens += usage.input_tokens;
        self.usage.output_tokens += usage.output_tokens;
        self.usage.cache_read_input_tokens += usage.cache_read_input_tokens;
        self.usage.cache_creation_input_tokens += usage.cache_creation_input_tokens;
        self.nano_usd += nano_usd;
    }

    /// `self` and `other` together (same period).
    fn plus(mut self, other: &Spent) -> Spent {
        self.combine(other, u64::saturating_add);
        self
    }

    /// Takes `other` away (never below 0).
    fn minus(&mut self, other: &Spent) {
        self.combine(other, u64::saturating_sub);
    }

    fn combine(&mut self, o: &Spent, f: fn(u64, u64) -> u64) {
        self.requests = f(self.requests, o.requests);
        self.usage.input_tokens = f(self.usage.input_tokens, o.usage.input_tokens);
        self.usage.output_tokens = f(self.usage.output_tokens, o.usage.output_tokens);
        self.usage.cache_read_input_tokens = f(self.usage.cache_read_input_tokens, o.usage.cache_read_input_tokens);
        self.usage.cache_creation_input_tokens =
            f(self.usage.cache_creation_input_tokens, o.usage.cache_creation_input_tokens);
        self.nano_usd = f(self.nano_usd, o.nano_usd);
    }
}

/// One key's meter.
#[derive(Debug, Clone, Default)]
pub struct KeyMeter {
    in_flight: u32,
    /// The last 60 seconds, by second (a ring indexed by `second % 60`).
    seconds: Vec<Second>,
    /// Day, week, month: what the ledger's store held for the key when it
    /// was last read — every replica's written entries.
    written: [Spent; 3],
    /// Day, week, month: what this replica's requests spent since their
    /// entries were written (or that has no store to go to).
    pending: [Spent; 3],
}

impl KeyMeter {
    /// The seconds of the last 60 s, oldest first.
    fn window(&self, now_ms: u64) -> Vec<Second> {
        let now_s = now_ms / 1000;
        let mut window: Vec<Second> =
            self.seconds.iter().filter(|s| s.at_s + 60 > now_s && (s.requests > 0 || s.tokens > 0)).copied().collect();
        window.sort_by_key(|s| s.at_s);
        window
    }

    /// When what the last 60 s hold drops below `max` (by `count`, of each
    /// second): as the oldest seconds leave the window.
    fn frees_at(window: &[Second], max: u64, count: impl Fn(&Second) -> u64) -> u64 {
        let mut held: u64 = window.iter().map(&count).sum();
        for s in window {
            held -= count(s);
            if held < max {
                return (s.at_s + 60) * 1000;
            }
        }
        window.last().map_or(0, |s| (s.at_s + 60) * 1000)
    }

    fn second(&mut self, now_ms: u64) -> &mut Second {
        if self.seconds.is_empty() {
            self.seconds = vec![Second::default(); 60];
        }
        let at_s = now_ms / 1000;
        let slot = &mut self.seconds[(at_s % 60) as usize];
        if slot.at_s != at_s {
            *slot = Second { at_s, ..Second::default() };
        }
        slot
    }

    /// What was spent in `period` as of `now_ms` (0 once it reset): what
    /// the store held when last read, and what this replica spent since.
    pub fn spent(&self, period: Period, now_ms: u64) -> Spent {
        let (from_ms, _) = period.around(now_ms);
        let i = PERIODS.iter().position(|p| *p == period).unwrap_or(0);
        let of = |s: &Spent| if s.from_ms == from_ms { *s } else { Spent { from_ms, ..Spent::default() } };
        of(&self.written[i]).plus(&of(&self.pending[i]))
    }

    /// Adds what a request that arrived at `at_ms` spent, to the periods it
    /// falls in (one that arrived before a period's start leaves it alone).
    fn add(&mut self, usage: &Usage, nano_usd: u64, at_ms: u64) {
        // Within the day of the last request, its week and month too: no
        // calendar arithmetic on the request path.
        let day = Period::Day.around(at_ms).0;
        let starts = match self.pending[0].from_ms == day && day > 0 {
            true => [day, self.pending[1].from_ms, self.pending[2].from_ms],
            false => PERIODS.map(|p| p.around(at_ms).0),
        };
        for (i, from_ms) in starts.into_iter().enumerate() {
            let current = &mut self.pending[i];
            if current.from_ms < from_ms {
                *current = Spent { from_ms, ..Spent::default() };
            }
            if current.from_ms == from_ms {
                current.add(usage, nano_usd);
            }
        }
    }

    /// Admits a request for `model` under `policy` at `now_ms`, or says why
    /// not. Admitted, it is in flight until [`KeyMeter::settle`] or
    /// [`KeyMeter::release`].
    pub fn admit(&mut self, policy: &KeyPolicy, model: &str, now_ms: u64) -> Result<(), Refusal> {
        let refuse = |limit: &str, message: String, frees_at_ms| {
            Err(Refusal { status: 429, limit: limit.to_string(), message, frees_at_ms })
        };
        if !policy.allows(model) {
            return Err(Refusal {
                status: 403,
                limit: "model_not_allowed".into(),
                message: format!("this key may not use `{model}` (allowed: {})", policy.models.join(", ")),
                frees_at_ms: None,
            });
        }
        if let Some(max) = policy.max_in_flight
            && self.in_flight >= max
        {
            return refuse("max_in_flight", format!("this key has {max} requests in flight, its limit"), None);
        }
        let window = self.window(now_ms);
        let (requests, tokens) = window.iter().fold((0, 0), |(r, t), s| (r + u64::from(s.requests), t + s.tokens));
        if let Some(max) = policy.requests_per_minute
            && requests >= u64::from(max)
        {
            let frees = Self::frees_at(&window, u64::from(max), |s| u64::from(s.requests));
            let msg = format!("this key sent {max} requests in the last minute, its limit");
            return refuse("requests_per_minute", msg, Some(frees));
        }
        if let Some(max) = policy.tokens_per_minute
            && tokens >= max
        {
            let frees = Self::frees_at(&window, max, |s| s.tokens);
            let msg = format!("this key used {tokens} tokens in the last minute; its limit is {max}");
            return refuse("tokens_per_minute", msg, Some(frees));
        }
        for b in &policy.budgets {
            let spent = self.spent(b.period, now_ms);
            let (over, limit, what) = match b.amount {
                Amount::Tokens(max) => (spent.tokens() >= max, "tokens", format!("{} of {max} tokens", spent.tokens())),
                Amount::NanoUsd(max) => (
                    spent.nano_usd >= max,
                    "usd",
                    format!("${:.4} of ${:.4}", spent.nano_usd as f64 / 1e9, max as f64 / 1e9),
                ),
            };
            if over {
                let resets = b.period.around(now_ms).1;
                let msg = format!(
                    "this key's {} budget is spent ({what}); it resets at {}",
                    b.period.name(),
                    super::calendar::rfc3339(resets)
                );
                return refuse(&format!("budget_{}_{limit}", b.period.name()), msg, Some(resets));
            }
        }
        self.in_flight += 1;
        self.second(now_ms).requests += 1;
        Ok(())
    }

    /// An admitted request ended at `now_ms`, having used `usage` costing
    /// `nano_usd`; its spend counts in the periods of when it arrived
    /// (`arrived_ms`), as the ledger files it.
    pub fn settle(&mut self, usage: &Usage, nano_usd: u64, arrived_ms: u64, now_ms: u64) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.spend(usage, nano_usd, arrived_ms, now_ms);
    }

    /// A finished request's spend, without an in-flight place to free.
    pub fn spend(&mut self, usage: &Usage, nano_usd: u64, arrived_ms: u64, now_ms: u64) {
        self.second(now_ms).tokens += usage.total();
        self.add(usage, nano_usd, arrived_ms);
    }

    /// An admitted request ended before it could be settled (its task was
    /// dropped): no longer in flight.
    pub fn release(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Requests in flight.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }
}

/// Every key's meter, shared by the gateway's requests (and kept across
/// reloads: a reload does not reset what a key spent).
#[derive(Debug, Default)]
pub struct Meters {
    keys: Mutex<HashMap<String, KeyMeter>>,
}

impl Meters {
    /// Admits a request of `key` (see [`KeyMeter::admit`]); the lease ends
    /// it.
    pub fn admit(
        self: &Arc<Self>,
        key: &str,
        policy: &KeyPolicy,
        model: &str,
        now_ms: u64,
    ) -> Result<KeyLease, Refusal> {
        self.keys.lock().entry(key.to_string()).or_default().admit(policy, model, now_ms)?;
        Ok(KeyLease { meters: self.clone(), key: key.to_string(), open: true })
    }

    /// The store was read: `totals` is what it holds for the periods in
    /// force at `now_ms` (every replica's entries), and `written` what this
    /// replica wrote to it since it was last read — spend no longer pending
    /// here, since the totals count it.
    pub fn written(&self, written: &[SpendRow], totals: &[SpendRow], now_ms: u64) {
        let slot = |p: Period| PERIODS.iter().position(|q| *q == p).unwrap_or(0);
        let mut keys = self.keys.lock();
        for row in written {
            if let Some(m) = keys.get_mut(&row.key) {
                let pending = &mut m.pending[slot(row.period)];
                if pending.from_ms == row.from_ms {
                    pending.minus(&row.spent);
                }
            }
        }
        let starts = PERIODS.map(|p| p.around(now_ms).0);
        for m in keys.values_mut() {
            m.written = starts.map(|from_ms| Spent { from_ms, ..Spent::default() });
        }
        for row in totals.iter().filter(|r| starts[slot(r.period)] == r.from_ms) {
            let m = match keys.get_mut(&row.key) {
                Some(m) => m,
                None => keys.entry(row.key.clone()).or_default(),
            };
            m.written[slot(row.period)] = Spent { from_ms: row.from_ms, ..row.spent };
        }
    }

    /// What a finished request of `key` (one with no limits, so no lease)
    /// spent: kept, so a budget a reload gives the key counts it, and
    /// `/v1/usage` reads it.
    pub fn spend(&self, key: &str, usage: &Usage, nano_usd: u64, arrived_ms: u64) {
        let mut keys = self.keys.lock();
        let meter = match keys.get_mut(key) {
            Some(m) => m,
            None => keys.entry(key.to_string()).or_default(),
        };
        meter.spend(usage, nano_usd, arrived_ms, arrived_ms);
    }

    /// The keys metered so far (every key that made a request, and every
    /// key the store's totals name), in name order.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.keys.lock().keys().cloned().collect();
        keys.sort_unstable();
        keys
    }

    /// A copy of `key`'s meter.
    pub fn meter(&self, key: &str) -> KeyMeter {
        self.keys.lock().get(key).cloned().unwrap_or_default()
    }
}

/// An admitted request's place on its key's meter: settled with what it used
/// when it ends, released if it is dropped first.
#[derive(Debug)]
pub struct KeyLease {
    meters: Arc<Meters>,
    key: String,
    open: bool,
}

impl KeyLease {
    /// The request (arrived at `arrived_ms`) ended at `now_ms` having used
    /// `usage` costing `nano_usd`.
    pub fn settle(mut self, usage: &Usage, nano_usd: u64, arrived_ms: u64, now_ms: u64) {
        self.open = false;
        if let Some(m) = self.meters.keys.lock().get_mut(&self.key) {
            m.settle(usage, nano_usd, arrived_ms, now_ms);
        }
    }
}

impl Drop for KeyLease {
    fn drop(&mut self) {
        if self.open
            && let Some(m) = self.meters.keys.lock().get_mut(&self.key)
        {
            m.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::calendar::parse_time;

    fn at(s: &str) -> u64 {
        parse_time(s).unwrap()
    }

    fn tok(output_tokens: u64) -> Usage {
        Usage { output_tokens, ..Usage::default() }
    }

    #[test]
    fn a_model_outside_the_list_is_forbidden_and_a_pattern_allows_a_family() {
        let policy =
            KeyPolicy { models: vec!["claude-haiku-*".into(), "claude-sonnet-4-5".into()], ..KeyPolicy::default() };
        let mut m = KeyMeter::default();
        assert!(m.admit(&policy, "claude-haiku-4-5-20251001", 0).is_ok());
        assert!(m.admit(&policy, "claude-sonnet-4-5", 0).is_ok());
        let refused = m.admit(&policy, "claude-opus-4-1", 0).unwrap_err();
        assert_eq!((refused.status, refused.limit.as_str()), (403, "model_not_allowed"));
    }

    #[test]
    fn in_flight_and_per_minute_limits_free_as_requests_end_and_time_passes() {
        let policy = KeyPolicy { max_in_flight: Some(2), requests_per_minute: Some(3), ..KeyPolicy::default() };
        let meters = Arc::new(Meters::default());
        let t = at("2026-12-07T10:00:00Z");
        let a = meters.admit("k", &policy, "m", t).unwrap();
        let b = meters.admit("k", &policy, "m", t).unwrap();
        assert_eq!(meters.admit("k", &policy, "m", t).unwrap_err().limit, "max_in_flight");
        a.settle(&tok(10), 0, t, t);
        drop(b); // its task went away: released, not settled
        assert_eq!(meters.meter("k").in_flight(), 0);
        let c = meters.admit("k", &policy, "m", t + 1_000).unwrap();
        let refused = meters.admit("k", &policy, "m", t + 2_000).unwrap_err();
        // Two requests at t, one at t+1 s: under the limit once t's leave.
        assert_eq!((refused.limit.as_str(), refused.frees_at_ms), ("requests_per_minute", Some(t + 60_000)));
        drop(c);
        assert!(meters.admit("k", &policy, "m", t + 59_999).is_err());
        assert!(meters.admit("k", &policy, "m", t + 60_000).is_ok(), "the first second left the minute");
    }

    #[test]
    fn a_budget_refuses_once_spent_and_resets_with_its_period() {
        let policy = KeyPolicy {
            budgets: vec![Budget { period: Period::Day, amount: Amount::NanoUsd(1_000_000_000) }],
            ..KeyPolicy::default()
        };
        let meters = Arc::new(Meters::default());
        let t = at("2026-12-07T23:00:00Z");
        let day = Spent { from_ms: at("2026-12-07"), nano_usd: 600_000_000, ..Spent::default() };
        meters.written(&[], &[SpendRow { key: "k".into(), period: Period::Day, from_ms: day.from_ms, spent: day }], t);
        let lease = meters.admit("k", &policy, "m", t).unwrap();
        // In flight when the budget is reached: it ends, and overspends.
        let other = meters.admit("k", &policy, "m", t).unwrap();
        lease.settle(&tok(5), 500_000_000, t, t);
        let refused = meters.admit("k", &policy, "m", t).unwrap_err();
        assert_eq!(refused.limit, "budget_day_usd");
        assert_eq!(refused.frees_at_ms, Some(at("2026-12-08")));
        assert!(refused.message.contains("$1.1000 of $1.0000"), "{}", refused.message);
        other.settle(&tok(5), 300_000_000, t, t);
        assert_eq!(meters.meter("k").spent(Period::Day, t).nano_usd, 1_400_000_000, "overspent by what was in flight");
        assert!(meters.admit("k", &policy, "m", at("2026-12-08T00:00:01Z")).is_ok(), "a new day");
        assert_eq!(meters.meter("k").spent(Period::Month, at("2026-12-08")).nano_usd, 800_000_000, "settled ones only");
    }

    #[test]
    fn tokens_per_minute_count_what_finished_requests_used() {
        let policy = KeyPolicy { tokens_per_minute: Some(100), ..KeyPolicy::default() };
        let mut m = KeyMeter::default();
        m.admit(&policy, "m", 0).unwrap();
        m.settle(&tok(120), 0, 500, 500);
        let refused = m.admit(&policy, "m", 30_000).unwrap_err();
        assert_eq!((refused.limit.as_str(), refused.frees_at_ms), ("tokens_per_minute", Some(60_000)));
        assert!(m.admit(&policy, "m", 61_000).is_ok());
    }
}
