//! What a simulated upstream holds: its accounts, their quota budgets and where
//! each window starts, how fast its clock runs, and how slowly it answers.
//!
//! A scenario is plain data with a few builder methods, so a test, the demo and
//! a later load simulator can each state the situation they need — an account
//! whose session window is spent, a per-model bucket near its limit — without
//! scripting individual answers: the answers follow from the budgets and the
//! traffic.

use std::ops::RangeInclusive;
use std::time::Duration;

/// How long the simulated windows last. Real windows last 5 hours and 7 days;
/// compressing them lets a demo show windows filling and resetting in minutes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timescale {
    /// The length of a "5h" (session) window.
    pub five_hour: Duration,
    /// The length of a "7d" (weekly) window, also that of per-model buckets.
    pub seven_day: Duration,
}

impl Default for Timescale {
    /// A "5h" window of 60 s and a "7d" window of 10 min.
    fn default() -> Self {
        Timescale { five_hour: Duration::from_secs(60), seven_day: Duration::from_secs(600) }
    }
}

impl Timescale {
    /// The real lengths: 5 hours and 7 days.
    pub fn real() -> Self {
        Timescale { five_hour: Duration::from_secs(5 * 3600), seven_day: Duration::from_secs(7 * 86_400) }
    }
}

/// How long the simulated upstream takes to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latency {
    /// The shortest time to the first byte of a reply.
    pub first_byte: Duration,
    /// Up to this much is added to `first_byte`, varying per request.
    pub jitter: Duration,
    /// The gap between two streamed events (and, summed over the events a
    /// stream would have had, the generation time of a JSON reply).
    pub per_event: Duration,
    /// How long a rejection (429) takes: quota refusals come back fast.
    pub rejection: Duration,
}

impl Default for Latency {
    /// Fast enough for a demo to turn over many requests, slow enough that
    /// requests overlap and in-flight counts show.
    fn default() -> Self {
        Latency {
            first_byte: Duration::from_millis(150),
            jitter: Duration::from_millis(250),
            per_event: Duration::from_millis(20),
            rejection: Duration::from_millis(20),
        }
    }
}

impl Latency {
    /// No delays at all (for tests of the wire format).
    pub fn none() -> Self {
        Latency {
            first_byte: Duration::ZERO,
            jitter: Duration::ZERO,
            per_event: Duration::ZERO,
            rejection: Duration::ZERO,
        }
    }
}

/// The starting state of one quota window.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowSpec {
    /// Tokens the window admits before it is exhausted.
    pub budget_tokens: u64,
    /// The fraction already used when the simulation starts.
    pub used: f64,
    /// When the window first resets, from the start; `None` means a full
    /// window length. Later resets follow every window length.
    pub resets_in: Option<Duration>,
}

impl WindowSpec {
    /// An unused window of `budget_tokens` that starts a fresh period.
    pub fn new(budget_tokens: u64) -> Self {
        WindowSpec { budget_tokens, used: 0.0, resets_in: None }
    }
}

/// A per-model weekly bucket (`7d_<name>`): a budget that only requests of one
/// model family spend, reported only on that family's answers.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketSpec {
    /// The bucket's name on the wire (`oi` → `7d_oi-utilization`).
    pub name: String,
    /// The model family that spends it (`fable`).
    pub family: String,
    /// Its window.
    pub window: WindowSpec,
}

/// One simulated account.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountSpec {
    /// Its name: the gateway account id the demo gives it, and its label.
    pub name: String,
    /// What is special about it, in a few words (shown by the demo).
    pub note: String,
    /// The session window.
    pub five_hour: WindowSpec,
    /// The weekly window.
    pub seven_day: WindowSpec,
    /// Per-model buckets.
    pub buckets: Vec<BucketSpec>,
}

impl AccountSpec {
    /// A fresh account with the given session and weekly budgets, in tokens.
    pub fn new(name: &str, five_hour_tokens: u64, seven_day_tokens: u64) -> Self {
        AccountSpec {
            name: name.to_string(),
            note: String::new(),
            five_hour: WindowSpec::new(five_hour_tokens),
            seven_day: WindowSpec::new(seven_day_tokens),
            buckets: Vec::new(),
        }
    }

    /// Describes the account.
    pub fn note(mut self, note: &str) -> Self {
        self.note = note.to_string();
        self
    }

    /// Starts the session window `used` full, resetting after `resets_in`.
    pub fn five_hour(mut self, used: f64, resets_in: Duration) -> Self {
        self.five_hour.used = used;
        self.five_hour.resets_in = Some(resets_in);
        self
    }

    /// Starts the weekly window `used` full.
    pub fn seven_day_used(mut self, used: f64) -> Self {
        self.seven_day.used = used;
        self
    }

    /// Adds a per-model bucket `name` spent by `family`, `used` full.
    pub fn bucket(mut self, name: &str, family: &str, budget_tokens: u64, used: f64) -> Self {
        let window = WindowSpec { used, ..WindowSpec::new(budget_tokens) };
        self.buckets.push(BucketSpec { name: name.to_string(), family: family.to_string(), window });
        self
    }
}

/// Everything a simulated upstream starts from.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// Window lengths.
    pub timescale: Timescale,
    /// Answer timing.
    pub latency: Latency,
    /// How many words a reply has, before `max_tokens` caps it.
    pub reply_words: RangeInclusive<u32>,
    /// The accounts.
    pub accounts: Vec<AccountSpec>,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            timescale: Timescale::default(),
            latency: Latency::default(),
            reply_words: 30..=300,
            accounts: Vec::new(),
        }
    }
}

impl Scenario {
    /// A scenario with default timing and no accounts yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds an account.
    pub fn account(mut self, account: AccountSpec) -> Self {
        self.accounts.push(account);
        self
    }

    /// Sets the window lengths.
    pub fn timescale(mut self, timescale: Timescale) -> Self {
        self.timescale = timescale;
        self
    }

    /// Sets the answer timing.
    pub fn latency(mut self, latency: Latency) -> Self {
        self.latency = latency;
        self
    }

    /// The scenario of `poolgate demo`: four accounts that exercise what the
    /// default chain does.
    ///
    /// - `alpha` starts cooling: its session window is spent for the first 20 s,
    ///   so the first request sent there is refused and fails over, and the
    ///   gateway parks it until the simulated reset.
    /// - `bravo` and `delta` are ordinary, with different budgets and weekly
    ///   usage, so headroom has something to weigh.
    /// - `charlie` has its `7d_oi` bucket — the one Fable requests spend — at
    ///   93%: once the gateway has seen it, Fable requests go elsewhere while
    ///   other models still use charlie.
    ///
    /// Budgets are sized for the demo's own traffic (six sessions make a few
    /// requests a second of ~2k tokens each, about 1% of a session budget):
    /// session windows fill to well over half between resets without running
    /// dry, weekly windows creep up by a few percent a minute, and more
    /// sessions (`--sessions 20`) exhaust them.
    pub fn demo() -> Self {
        let s = Duration::from_secs;
        Scenario::new()
            .account(
                AccountSpec::new("alpha", 200_000, 3_000_000)
                    .note("starts cooling: its 5h window is spent for the first 20s")
                    .five_hour(1.0, s(20))
                    .seven_day_used(0.35),
            )
            .account(
                AccountSpec::new("bravo", 240_000, 3_600_000)
                    .note("ordinary")
                    .five_hour(0.2, s(45))
                    .seven_day_used(0.10),
            )
            .account(
                AccountSpec::new("charlie", 200_000, 3_000_000)
                    .note("its 7d_oi bucket (spent by fable models) is at 93%")
                    .five_hour(0.1, s(30))
                    .seven_day_used(0.20)
                    .bucket("oi", "fable", 150_000, 0.93),
            )
            .account(
                AccountSpec::new("delta", 160_000, 2_400_000)
                    .note("an OAuth subscription seat, smaller budget: its token lives 6s, the gateway refreshes it")
                    .five_hour(0.3, s(55))
                    .seven_day_used(0.55),
            )
    }
}
