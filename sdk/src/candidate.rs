//! One candidate as a ranker reads it: the account record, its quota windows, and
//! its pool entry — plus the reads every ranker needs.

use std::ops::Deref;

use crate::{Account, AccountInfo, QuotaWindow, WindowKind, WindowStatus};

/// Model families the Anthropic quota headers distinguish, as lowercase names.
pub type ModelFamily = &'static str;

/// The family of a model id by substring, as dario's `modelFamily()`: `opus`,
/// `sonnet`, `haiku` or `fable`; anything else has none.
pub fn model_family(model: &str) -> Option<ModelFamily> {
    let m = model.as_bytes();
    ["opus", "sonnet", "haiku", "fable"]
        .into_iter()
        .find(|f| m.windows(f.len()).any(|w| w.eq_ignore_ascii_case(f.as_bytes())))
}

/// A candidate account with its windows. Dereferences to the [`Account`] record.
#[derive(Clone, Copy)]
pub struct Candidate<'c> {
    /// Its position in the list this stage received (what a ranking refers to).
    pub position: u32,
    /// The account record.
    pub account: &'c Account,
    /// Its quota windows.
    pub windows: &'c [QuotaWindow],
    /// Its pool entry (string id, alias).
    pub info: &'c AccountInfo,
}

impl Deref for Candidate<'_> {
    type Target = Account;
    fn deref(&self) -> &Account {
        self.account
    }
}

impl<'c> Candidate<'c> {
    /// The first window of `kind`, if the account reported one.
    pub fn window(&self, kind: WindowKind) -> Option<&'c QuotaWindow> {
        self.windows.iter().find(|w| w.kind == kind)
    }

    /// The window with the full name `name` ("5h", "7d_oi", ...).
    pub fn window_named(&self, name: &str) -> Option<&'c QuotaWindow> {
        self.windows.iter().find(|w| crate::host::window_name(w.name) == name)
    }

    /// The utilization of the first window of `kind` (fraction, may exceed 1.0).
    pub fn utilization(&self, kind: WindowKind) -> Option<f64> {
        self.window(kind).map(|w| w.utilization)
    }

    /// Five-hour (session) utilization, if known.
    pub fn session_used(&self) -> Option<f64> {
        self.utilization(WindowKind::FiveHour)
    }

    /// Seven-day (weekly) utilization, if known.
    pub fn weekly_used(&self) -> Option<f64> {
        self.utilization(WindowKind::SevenDay)
    }

    /// `1 − max(5h, 7d)` utilization; an unreported window counts as unused, so an
    /// account that never reported quota has headroom 1.0.
    pub fn headroom(&self) -> f64 {
        1.0 - self.session_used().unwrap_or(0.0).max(self.weekly_used().unwrap_or(0.0))
    }

    /// The per-model (`7d_<bucket>`) windows with their bucket names (`"oi"`,
    /// `"opus"`, ...).
    pub fn model_windows(&self) -> impl Iterator<Item = (&'static str, &'c QuotaWindow)> {
        self.windows.iter().filter(|w| w.kind == WindowKind::SevenDayModel).map(|w| {
            let name = crate::host::window_name(w.name);
            (name.strip_prefix("7d_").unwrap_or(name), w)
        })
    }

    /// Whether the host would send the request to this account now.
    pub fn is_usable(&self) -> bool {
        self.account.usable
    }

    /// Whether the account or one of its 5h/7d windows is `rejected`, or one of
    /// those windows is used up (utilization ≥ 1.0).
    pub fn is_exhausted(&self) -> bool {
        self.account.status == WindowStatus::Rejected
            || self.windows.iter().any(|w| {
                matches!(w.kind, WindowKind::FiveHour | WindowKind::SevenDay)
                    && (w.status == WindowStatus::Rejected || w.utilization >= 1.0)
            })
    }

    /// The cooldown's end, if cooling.
    pub fn cooling_until(&self) -> Option<u64> {
        self.account.cooldown.map(|c| c.until_ms)
    }
}
