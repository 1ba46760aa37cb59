//! The gauges an operator alerts on, computed from the live state at each
//! scrape: each account's quota windows (how used, when they reset, how old
//! the reading is), cooldowns in force by cause, and the pool's size against
//! what can serve. Plain values in — the gateway reads its state, this module
//! shapes it — so what is exported is decided here and tested in-process.
//!
//! Window names come from upstream headers (`7d_<bucket>` is discovered, not
//! listed), so the `window` label is bounded here: the fixed windows, and at
//! most [`QUOTA_BUCKETS_MAX`] per-model buckets per account.

use crate::account::{CooldownReason, WindowReading};

use super::{Gauge, Labels, Text, labels};

/// The windows every account may export: the subscription's 5-hour and
/// 7-day windows, extra usage, and an API key's per-minute limits.
pub const FIXED_WINDOWS: [&str; 7] = ["5h", "7d", "overage", "requests", "tokens", "input_tokens", "output_tokens"];

/// The most per-model buckets (`7d_<bucket>`) one account exports, in name
/// order: so an account has at most 7 + 8 = 15 `window` values.
pub const QUOTA_BUCKETS_MAX: usize = 8;

/// What one account has read of its quota.
#[derive(Debug, Clone, Copy)]
pub struct QuotaAccount<'a> {
    /// The account's id.
    pub id: &'a str,
    /// Its windows, as read.
    pub windows: &'a [WindowReading],
    /// When its newest quota reading arrived (ms since the epoch).
    pub last_reading_ms: Option<u64>,
}

/// The windows of `windows` that are exported: the fixed ones, and the
/// first [`QUOTA_BUCKETS_MAX`] buckets by name.
fn exported(windows: &[WindowReading]) -> impl Iterator<Item = &WindowReading> {
    let mut buckets: Vec<&str> = windows.iter().map(|w| w.name.as_str()).filter(|n| n.starts_with("7d_")).collect();
    buckets.sort_unstable();
    buckets.truncate(QUOTA_BUCKETS_MAX);
    windows.iter().filter(move |w| FIXED_WINDOWS.contains(&w.name.as_str()) || buckets.contains(&w.name.as_str()))
}

/// `poolgate_quota_utilization`, `poolgate_quota_reset_seconds` and
/// `poolgate_quota_reading_age_seconds` at `now_ms`. A window whose reset has
/// passed reads 0 (its quota came back; the next answer says how much is
/// used again), and says no reset until then.
pub fn quota_gauges(accounts: &[QuotaAccount<'_>], now_ms: u64) -> Vec<Gauge<'static>> {
    let (mut used, mut reset, mut age) = (Vec::new(), Vec::new(), Vec::new());
    for a in accounts {
        for w in exported(a.windows) {
            let labels = || labels(&[("account", a.id), ("window", &w.name)]);
            let ahead = w.resets_at_ms.map(|r| r.checked_sub(now_ms).filter(|left| *left > 0));
            used.push((labels(), if ahead == Some(None) { 0.0 } else { w.utilization }));
            if let Some(Some(left)) = ahead {
                reset.push((labels(), left as f64 / 1000.0));
            }
        }
        if let Some(at) = a.last_reading_ms {
            age.push((labels(&[("account", a.id)]), now_ms.saturating_sub(at) as f64 / 1000.0));
        }
    }
    vec![
        (
            "poolgate_quota_utilization",
            "Share of a quota window used (1 is used up; the upstream may report a little over), by account and \
             window: 5h, 7d, overage, requests, tokens, input_tokens, output_tokens, and at most 8 7d_<bucket> per \
             account. A window past its reset reads 0.",
            used,
        ),
        (
            "poolgate_quota_reset_seconds",
            "Seconds until a quota window resets, by account and window (the windows of poolgate_quota_utilization \
             whose reset is known and ahead).",
            reset,
        ),
        (
            "poolgate_quota_reading_age_seconds",
            "Seconds since the account's newest quota reading (absent until it has read one).",
            age,
        ),
    ]
}

/// `poolgate_cooldowns_active`: cooldowns in force by cause, every cause
/// present (at 0 when none is in force). `causes` is one per cooldown: an
/// account's account-wide cooldown, and `model_exhausted` for an account
/// with a model family gated.
pub fn cooldowns_active(causes: impl IntoIterator<Item = CooldownReason>) -> Gauge<'static> {
    let mut counts = [0u32; CooldownReason::ALL.len()];
    for cause in causes {
        if let Some(i) = CooldownReason::ALL.iter().position(|c| *c == cause) {
            counts[i] += 1;
        }
    }
    let values = CooldownReason::ALL
        .iter()
        .zip(counts)
        .map(|(c, n)| (vec![("cause", Text::from(c.as_str()))] as Labels, f64::from(n)))
        .collect();
    (
        "poolgate_cooldowns_active",
        "Cooldowns in force, by cause (every cause listed): an account-wide cooldown counts under its cause (a \
         seat that needs a login under disabled), an account with a model family gated once under model_exhausted.",
        values,
    )
}

/// What the pool has to serve with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolCounts {
    /// Accounts in the pool (enabled, with a credential).
    pub accounts: usize,
    /// Of them, those a request could be sent to now: not cooling, not
    /// disabled by an operator, not waiting for a login.
    pub usable: usize,
    /// OAuth seats whose refresh token was refused: they serve nothing until
    /// someone logs in again.
    pub needing_login: usize,
}

/// `poolgate_pool_accounts`, `poolgate_pool_usable_accounts` and
/// `poolgate_seats_needing_login`.
pub fn pool_gauges(counts: PoolCounts) -> Vec<Gauge<'static>> {
    let one = |n: usize| vec![(Vec::new(), n as f64)];
    vec![
        ("poolgate_pool_accounts", "Accounts in the pool (enabled, with a credential).", one(counts.accounts)),
        (
            "poolgate_pool_usable_accounts",
            "Accounts of the pool a request could be sent to now (not cooling, not disabled at run time, not waiting \
             for a login; a model family's gate does not count).",
            one(counts.usable),
        ),
        (
            "poolgate_seats_needing_login",
            "OAuth seats whose refresh token was refused: they serve nothing until `poolgate login`.",
            one(counts.needing_login),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::Status;

    const NOW: u64 = 1_760_000_000_000;

    fn window(name: &str, utilization: f64, resets_at_ms: Option<u64>) -> WindowReading {
        WindowReading { name: name.into(), utilization, resets_at_ms, status: Status::Allowed, observed_at_ms: None }
    }

    fn render(gauges: &[Gauge<'_>]) -> String {
        super::super::Metrics::default().render(gauges)
    }

    #[test]
    fn each_window_says_how_used_and_when_it_resets() {
        let seat = [
            window("5h", 0.42, Some(NOW + 90_000)),
            window("7d", 1.02, Some(NOW - 1)),
            window("7d_opus", 0.5, None),
            window("requests", 0.25, Some(NOW + 1_500)),
        ];
        let accounts = [
            QuotaAccount { id: "seat", windows: &seat, last_reading_ms: Some(NOW - 3_000) },
            QuotaAccount { id: "fresh", windows: &[], last_reading_ms: None },
        ];
        let text = render(&quota_gauges(&accounts, NOW));
        for line in [
            "poolgate_quota_utilization{account=\"seat\",window=\"5h\"} 0.42",
            "poolgate_quota_utilization{account=\"seat\",window=\"7d\"} 0.0",
            "poolgate_quota_utilization{account=\"seat\",window=\"7d_opus\"} 0.5",
            "poolgate_quota_utilization{account=\"seat\",window=\"requests\"} 0.25",
            "poolgate_quota_reset_seconds{account=\"seat\",window=\"5h\"} 90.0",
            "poolgate_quota_reset_seconds{account=\"seat\",window=\"requests\"} 1.5",
            "poolgate_quota_reading_age_seconds{account=\"seat\"} 3.0",
        ] {
            assert!(text.contains(&format!("{line}\n")), "{line} missing:\n{text}");
        }
        assert!(!text.contains("poolgate_quota_reset_seconds{account=\"seat\",window=\"7d\""), "{text}");
        assert!(!text.contains("window=\"7d_opus\"} 0.0\npoolgate_quota_reset"), "{text}");
        assert!(!text.contains("account=\"fresh\""), "nothing read, nothing shown: {text}");
    }

    #[test]
    fn the_window_label_is_bounded_per_account() {
        let mut many: Vec<WindowReading> = (0..20).map(|i| window(&format!("7d_b{i:02}"), 0.1, None)).collect();
        many.push(window("5h", 0.1, None));
        many.push(window("made_up", 0.1, None));
        let accounts = [QuotaAccount { id: "a", windows: &many, last_reading_ms: Some(NOW) }];
        let text = render(&quota_gauges(&accounts, NOW));
        let shown: Vec<&str> = text.lines().filter(|l| l.starts_with("poolgate_quota_utilization{")).collect();
        assert_eq!(shown.len(), 1 + QUOTA_BUCKETS_MAX, "{text}");
        assert!(text.contains("window=\"7d_b07\""), "the first buckets by name: {text}");
        assert!(!text.contains("window=\"7d_b08\"") && !text.contains("made_up"), "{text}");
        let help = format!("and at most {QUOTA_BUCKETS_MAX} 7d_<bucket> per account");
        assert!(text.contains(&help), "the help states the bound: {text}");
    }

    #[test]
    fn every_cooldown_cause_is_shown_even_at_zero() {
        let text =
            render(&[cooldowns_active([CooldownReason::Auth, CooldownReason::Auth, CooldownReason::ModelExhausted])]);
        assert!(text.contains("poolgate_cooldowns_active{cause=\"auth\"} 2.0\n"), "{text}");
        assert!(text.contains("poolgate_cooldowns_active{cause=\"model_exhausted\"} 1.0\n"), "{text}");
        assert!(text.contains("poolgate_cooldowns_active{cause=\"weekly_exhausted\"} 0.0\n"), "{text}");
        let shown = text.lines().filter(|l| l.starts_with("poolgate_cooldowns_active{")).count();
        assert_eq!(shown, CooldownReason::ALL.len());
    }

    #[test]
    fn the_pool_counts_are_plain_gauges() {
        let text = render(&pool_gauges(PoolCounts { accounts: 3, usable: 1, needing_login: 2 }));
        assert!(text.contains("poolgate_pool_accounts{} 3.0\n"), "{text}");
        assert!(text.contains("poolgate_pool_usable_accounts{} 1.0\n"), "{text}");
        assert!(text.contains("poolgate_seats_needing_login{} 2.0\n"), "{text}");
    }
}
