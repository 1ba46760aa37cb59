//! The quota arithmetic of one simulated account: windows that fill as tokens
//! are served and empty when they reset, the admission check, and the
//! `anthropic-ratelimit-unified-*` headers that report them.
//!
//! Everything here is a pure function of the ledger and a clock reading
//! (`now_ms`), so tests can step time instead of waiting for it. The rules
//! follow what Anthropic's answers show (`shared/references/seed-systems.md` §0):
//! - utilizations are fractions of the window's budget and may pass 1.0, since
//!   the request that crosses the limit is still served;
//! - a request is refused when a window it spends is already exhausted: the
//!   weekly window, the session window, or the per-model bucket of its family;
//! - a per-model bucket (`7d_oi`) is reported only on answers for its family;
//! - resets are epoch seconds, rounded up so that a client waiting for the
//!   reported reset never arrives before the window has actually rolled over;
//! - utilizations are reported to at most 4 decimals.
//!
//! How the headers are written is `poolgate_wire::ratelimit`'s.

use poolgate_wire::ratelimit::{self, Quota};

use crate::sim::scenario::{AccountSpec, Timescale, WindowSpec};

/// One window of a simulated account.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// Its name on the wire: `5h`, `7d` or `7d_<bucket>`.
    pub name: String,
    /// Tokens it admits per period.
    pub budget: u64,
    /// Tokens spent in the current period.
    pub used: u64,
    /// The length of a period, ms.
    pub period_ms: u64,
    /// When the current period ends (ms since the epoch).
    pub resets_at_ms: u64,
}

impl Window {
    /// The window `spec` describes, as of `now_ms`.
    pub fn new(name: &str, spec: &WindowSpec, period_ms: u64, now_ms: u64) -> Window {
        let budget = spec.budget_tokens.max(1);
        let first = spec.resets_in.map_or(period_ms, |d| d.as_millis() as u64);
        Window {
            name: name.to_string(),
            budget,
            used: (spec.used.max(0.0) * budget as f64).round() as u64,
            period_ms: period_ms.max(1),
            resets_at_ms: now_ms + first,
        }
    }

    /// Starts a new period if the current one is over. Periods stay on their
    /// schedule however long nothing happened, as real windows do.
    pub fn roll(&mut self, now_ms: u64) {
        if now_ms >= self.resets_at_ms {
            let periods = (now_ms - self.resets_at_ms) / self.period_ms + 1;
            self.resets_at_ms += periods * self.period_ms;
            self.used = 0;
        }
    }

    /// The fraction of the budget used.
    pub fn utilization(&self) -> f64 {
        self.used as f64 / self.budget as f64
    }

    /// Whether the budget is spent.
    pub fn exhausted(&self) -> bool {
        self.used >= self.budget
    }

    /// The reset in epoch seconds, rounded up.
    pub fn reset_s(&self) -> u64 {
        self.resets_at_ms.div_ceil(1000)
    }

    /// The window as an answer reports it: utilization to 4 decimals, status
    /// `rejected` once spent.
    fn reported(&self) -> ratelimit::Window {
        let utilization = (self.utilization() * 10_000.0).round() / 10_000.0;
        ratelimit::Window::new(utilization, if self.exhausted() { "rejected" } else { "allowed" }, self.reset_s())
    }
}

/// A per-model bucket and the family that spends it.
#[derive(Debug, Clone, PartialEq)]
pub struct Bucket {
    /// The family (`fable`).
    pub family: String,
    /// Its window (named `7d_<bucket>`).
    pub window: Window,
}

/// Why a request was refused: the window that is exhausted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Its wire name (`5h`, `7d`, `7d_oi`).
    pub window: String,
}

/// The quota state of one simulated account.
#[derive(Debug, Clone, PartialEq)]
pub struct Ledger {
    /// The session window.
    pub five_hour: Window,
    /// The weekly window.
    pub seven_day: Window,
    /// Per-model buckets.
    pub buckets: Vec<Bucket>,
}

/// Usage at or above this fraction makes the top-level status `allowed_warning`.
const WARNING: f64 = 0.8;

impl Ledger {
    /// The ledger `spec` starts with at `now_ms`.
    pub fn new(spec: &AccountSpec, timescale: &Timescale, now_ms: u64) -> Ledger {
        let five = timescale.five_hour.as_millis() as u64;
        let seven = timescale.seven_day.as_millis() as u64;
        Ledger {
            five_hour: Window::new("5h", &spec.five_hour, five, now_ms),
            seven_day: Window::new("7d", &spec.seven_day, seven, now_ms),
            buckets: spec
                .buckets
                .iter()
                .map(|b| Bucket {
                    family: b.family.clone(),
                    window: Window::new(&format!("7d_{}", b.name), &b.window, seven, now_ms),
                })
                .collect(),
        }
    }

    /// Starts a new period in every window that is due at `now_ms`.
    pub fn roll(&mut self, now_ms: u64) {
        self.five_hour.roll(now_ms);
        self.seven_day.roll(now_ms);
        for b in &mut self.buckets {
            b.window.roll(now_ms);
        }
    }

    fn bucket_for(&self, family: Option<&str>) -> Option<&Window> {
        let family = family?;
        self.buckets.iter().find(|b| b.family == family).map(|b| &b.window)
    }

    /// Whether a request of model `family` is admitted at `now_ms`. The weekly
    /// window is checked first: when both are spent, it is the longer wait.
    pub fn admit(&mut self, family: Option<&str>, now_ms: u64) -> Result<(), Refusal> {
        self.roll(now_ms);
        let spent = [Some(&self.seven_day), Some(&self.five_hour), self.bucket_for(family)];
        match spent.into_iter().flatten().find(|w| w.exhausted()) {
            Some(w) => Err(Refusal { window: w.name.clone() }),
            None => Ok(()),
        }
    }

    /// Spends `tokens` of a request of model `family` at `now_ms`: the session
    /// and weekly windows, and the family's bucket if it has one.
    pub fn charge(&mut self, family: Option<&str>, tokens: u64, now_ms: u64) {
        self.roll(now_ms);
        self.five_hour.used += tokens;
        self.seven_day.used += tokens;
        if let Some(f) = family {
            for b in self.buckets.iter_mut().filter(|b| b.family == f) {
                b.window.used += tokens;
            }
        }
    }

    /// The windows an answer for `family` reports: 5h, 7d, and the family's
    /// bucket — other buckets stay invisible, as on the real wire.
    pub fn reported(&self, family: Option<&str>) -> Vec<&Window> {
        let mut out = vec![&self.five_hour, &self.seven_day];
        out.extend(self.bucket_for(family));
        out
    }

    /// Every window, buckets included (for observers, not the wire).
    pub fn windows(&self) -> Vec<&Window> {
        let mut out = vec![&self.five_hour, &self.seven_day];
        out.extend(self.buckets.iter().map(|b| &b.window));
        out
    }

    /// The unified headers of an answer for `family`: a refusal (`refused`
    /// names the exhausted window) or a served request. The top-level status is
    /// the admit decision for this request: a served request that crossed a
    /// limit still reads `allowed_warning`, while its window reads `rejected`.
    pub fn headers(&self, family: Option<&str>, refused: Option<&Refusal>) -> Vec<(String, String)> {
        let reported = self.reported(family);
        let claim_window = match refused {
            Some(r) => reported.iter().find(|w| w.name == r.window).copied(),
            None => None,
        }
        .unwrap_or_else(|| {
            // The binding window of an admitted request: the fuller of 5h and 7d.
            if self.seven_day.utilization() > self.five_hour.utilization() { &self.seven_day } else { &self.five_hour }
        });
        let status = match refused {
            Some(_) => "rejected",
            None if reported.iter().any(|w| w.utilization() >= WARNING) => "allowed_warning",
            None => "allowed",
        };
        let bucket = self.bucket_for(family).map(|w| {
            let name = w.name.strip_prefix("7d_").unwrap_or(&w.name);
            (name.to_string(), w.reported())
        });
        Quota {
            status: Some(status.to_string()),
            reset_s: Some(claim_window.reset_s()),
            representative_claim: Some(ratelimit::claim(&claim_window.name)),
            five_hour: Some(self.five_hour.reported()),
            seven_day: Some(self.seven_day.reported()),
            buckets: bucket.into_iter().collect(),
            ..Quota::default()
        }
        .headers()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::account::Status;
    use crate::learned::quota;

    const NOW: u64 = 1_760_000_000_000;

    fn ledger(spec: AccountSpec) -> Ledger {
        Ledger::new(&spec, &Timescale::default(), NOW)
    }

    fn parsed(l: &Ledger, family: Option<&str>, refused: Option<&Refusal>, now: u64) -> quota::QuotaReading {
        let mut h = http::HeaderMap::new();
        for (k, v) in l.headers(family, refused) {
            h.insert(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        quota::parse(&h, now)
    }

    #[test]
    fn utilization_rises_with_the_tokens_served() {
        let mut l = ledger(AccountSpec::new("a", 10_000, 100_000));
        assert_eq!(l.five_hour.utilization(), 0.0);
        l.charge(Some("sonnet"), 2_500, NOW);
        assert_eq!(l.five_hour.utilization(), 0.25);
        assert_eq!(l.seven_day.utilization(), 0.025);
        let r = parsed(&l, Some("sonnet"), None, NOW);
        assert_eq!(r.window("5h").unwrap().utilization, 0.25);
        assert_eq!(r.window("7d").unwrap().utilization, 0.025);
        assert_eq!(r.status, Some(Status::Allowed));
        assert_eq!(r.representative_claim.as_deref(), Some("five_hour"));
    }

    #[test]
    fn windows_reset_on_the_compressed_clock_and_keep_their_schedule() {
        let mut l = ledger(AccountSpec::new("a", 10_000, 100_000));
        l.charge(None, 5_000, NOW);
        assert_eq!(l.five_hour.resets_at_ms, NOW + 60_000, "a 5h window lasts 60 s by default");
        assert_eq!(l.seven_day.resets_at_ms, NOW + 600_000, "a 7d window lasts 10 min by default");
        l.admit(None, NOW + 59_999).unwrap();
        assert_eq!(l.five_hour.used, 5_000);
        l.admit(None, NOW + 60_000).unwrap();
        assert_eq!(l.five_hour.used, 0, "rolled over at the reset");
        assert_eq!(l.five_hour.resets_at_ms, NOW + 120_000);
        assert_eq!(l.seven_day.used, 5_000, "the weekly window is not due yet");
        // Idle for several periods: the next reset is still on the 60 s grid.
        l.charge(None, 1, NOW + 250_000);
        assert_eq!(l.five_hour.resets_at_ms, NOW + 300_000);
    }

    #[test]
    fn an_exhausted_session_window_refuses_until_its_reset_with_the_headers_that_say_so() {
        let spec = AccountSpec::new("a", 10_000, 100_000).five_hour(1.0, Duration::from_millis(20_500));
        let mut l = ledger(spec);
        let refusal = l.admit(Some("sonnet"), NOW).unwrap_err();
        assert_eq!(refusal.window, "5h");
        let h = l.headers(Some("sonnet"), Some(&refusal));
        let get =
            |n: &str| h.iter().find(|(k, _)| k == &format!("anthropic-ratelimit-unified-{n}")).map(|(_, v)| v.as_str());
        assert_eq!(get("status"), Some("rejected"));
        assert_eq!(get("representative-claim"), Some("five_hour"));
        assert_eq!(get("5h-status"), Some("rejected"));
        assert_eq!(get("5h-utilization"), Some("1.0"));
        // 20.5 s is rounded up to the next whole second, never down.
        assert_eq!(get("5h-reset"), Some(((NOW + 21_000) / 1000).to_string().as_str()));
        assert_eq!(get("reset"), get("5h-reset"));
        assert_eq!(get("7d-status"), Some("allowed"));

        // What the gateway makes of it: cool the account until the reset.
        let r = parsed(&l, Some("sonnet"), Some(&refusal), NOW);
        use crate::learned::cooldown::{Answer, CooldownConfig, Plan, Streaks, plan};
        let p = plan(Answer::Status(429), &r, Some("sonnet"), Streaks::default(), &CooldownConfig::default(), NOW);
        assert_eq!(p, Plan::Cool { until_ms: NOW + 21_000, reason: crate::account::CooldownReason::SessionExhausted });

        assert!(l.admit(Some("sonnet"), NOW + 20_499).is_err());
        assert!(l.admit(Some("sonnet"), NOW + 20_500).is_ok(), "served again once the window rolled over");
    }

    #[test]
    fn a_spent_bucket_refuses_only_its_family_and_shows_only_on_its_answers() {
        let mut l = ledger(AccountSpec::new("a", 1_000_000, 10_000_000).bucket("oi", "fable", 10_000, 0.95));
        assert!(parsed(&l, Some("sonnet"), None, NOW).window("7d_oi").is_none(), "invisible to other families");
        let r = parsed(&l, Some("fable"), None, NOW);
        assert_eq!(r.window("7d_oi").unwrap().utilization, 0.95);
        assert_eq!(r.status, Some(Status::AllowedWarning));

        // The request that crosses the limit is served; the next one is not.
        l.admit(Some("fable"), NOW).unwrap();
        l.charge(Some("fable"), 600, NOW);
        assert_eq!(parsed(&l, Some("fable"), None, NOW).window("7d_oi").unwrap().status, Status::Rejected);
        let refusal = l.admit(Some("fable"), NOW).unwrap_err();
        assert_eq!(refusal.window, "7d_oi");
        l.admit(Some("sonnet"), NOW).unwrap();
        l.admit(Some("opus"), NOW).unwrap();

        let r = parsed(&l, Some("fable"), Some(&refusal), NOW);
        assert_eq!(r.representative_claim.as_deref(), Some("seven_day_overage_included"));
        assert_eq!(r.window("5h").unwrap().status, Status::Allowed);
        use crate::learned::cooldown::{Answer, CooldownConfig, Plan, Streaks, plan};
        let p = plan(Answer::Status(429), &r, Some("fable"), Streaks::default(), &CooldownConfig::default(), NOW);
        assert_eq!(
            p,
            Plan::GateModel { family: "fable".into(), until_ms: NOW + 600_000 },
            "gates fable only, until the bucket resets"
        );
    }

    #[test]
    fn the_weekly_window_binds_when_it_is_the_fuller_one() {
        let mut l = ledger(AccountSpec::new("a", 100_000, 100_000).seven_day_used(0.5));
        l.charge(None, 10_000, NOW);
        let r = parsed(&l, None, None, NOW);
        assert_eq!(r.representative_claim.as_deref(), Some("seven_day"));
        assert_eq!(r.reset_ms, Some(NOW + 600_000));
        l.charge(None, 50_000, NOW);
        assert_eq!(l.admit(None, NOW).unwrap_err().window, "7d", "both spent: the weekly window is the longer wait");
    }
}
