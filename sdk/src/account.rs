//! Reads every ranker needs from an [`Account`]: windows by kind or name, headroom,
//! usability, and the model family of a request.

use crate::{Account, QuotaWindow, WindowKind, WindowStatus};

/// Model families the Anthropic quota headers distinguish, as lowercase names.
pub type ModelFamily = &'static str;

/// The family of a model id by substring, as dario's `modelFamily()`: `opus`,
/// `sonnet`, `haiku` or `fable`; anything else has none.
pub fn model_family(model: &str) -> Option<ModelFamily> {
    let m = model.to_ascii_lowercase();
    ["opus", "sonnet", "haiku", "fable"]
        .into_iter()
        .find(|f| m.contains(f))
}

/// Convenience reads on an [`Account`].
pub trait AccountExt {
    /// The first window of `kind`, if the account reported one.
    fn window(&self, kind: WindowKind) -> Option<&QuotaWindow>;
    /// The utilization of the first window of `kind` (fraction, may exceed 1.0).
    fn utilization(&self, kind: WindowKind) -> Option<f64>;
    /// Five-hour (session) utilization, if known.
    fn session_used(&self) -> Option<f64> {
        self.utilization(WindowKind::FiveHour)
    }
    /// Seven-day (weekly) utilization, if known.
    fn weekly_used(&self) -> Option<f64> {
        self.utilization(WindowKind::SevenDay)
    }
    /// `1 − max(5h, 7d)` utilization; an unreported window counts as unused, so an
    /// account that never reported quota has headroom 1.0.
    fn headroom(&self) -> f64;
    /// The per-model (`7d_<bucket>`) windows with their bucket names (`"oi"`,
    /// `"opus"`, ...).
    fn model_windows(&self) -> Vec<(String, &QuotaWindow)>;
    /// Whether the host would send the request to this account now.
    fn is_usable(&self) -> bool;
    /// Whether the account or one of its 5h/7d windows is `rejected`, or a window
    /// is used up (utilization ≥ 1.0).
    fn is_exhausted(&self) -> bool;
}

impl AccountExt for Account {
    fn window(&self, kind: WindowKind) -> Option<&QuotaWindow> {
        self.windows.iter().find(|w| w.kind == kind)
    }

    fn utilization(&self, kind: WindowKind) -> Option<f64> {
        self.window(kind).map(|w| w.utilization)
    }

    fn headroom(&self) -> f64 {
        let used = self
            .session_used()
            .unwrap_or(0.0)
            .max(self.weekly_used().unwrap_or(0.0));
        1.0 - used
    }

    fn model_windows(&self) -> Vec<(String, &QuotaWindow)> {
        self.windows
            .iter()
            .filter(|w| w.kind == WindowKind::SevenDayModel)
            .map(|w| {
                let name = crate::host::window_name(w.name);
                let bucket = name.strip_prefix("7d_").unwrap_or(&name).to_string();
                (bucket, w)
            })
            .collect()
    }

    fn is_usable(&self) -> bool {
        self.usable
    }

    fn is_exhausted(&self) -> bool {
        self.status == WindowStatus::Rejected
            || self.windows.iter().any(|w| {
                matches!(w.kind, WindowKind::FiveHour | WindowKind::SevenDay)
                    && (w.status == WindowStatus::Rejected || w.utilization >= 1.0)
            })
    }
}
