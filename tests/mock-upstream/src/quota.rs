//! Scripted quota headers: what the mock does with a [`Quota`] beyond writing it.
//!
//! A test states an account's quota once as a [`Quota`] (`poolgate_wire`'s, which knows
//! the header names and formats); the server sends it on every response of that account.
//! Rendering happens when the quota is set, not per request, so the hot path only clones
//! reference-counted header values.

use axum::http::{HeaderName, HeaderValue};
use poolgate_wire::ratelimit::{Quota, Window, claim, now_s};

/// The reading a unified 429 carries: `quota` with unified status `rejected`, plus the
/// reset, claim and binding window a real rejection always names when the script left
/// them out (so a gateway under test can always park the account until a reset).
pub(crate) fn rejected(quota: &Quota) -> Quota {
    let mut q = quota.clone();
    let reset = *q.reset_s.get_or_insert(now_s() + 3600);
    q.status = Some("rejected".to_owned());
    q.representative_claim.get_or_insert_with(|| claim("5h"));
    if q.five_hour.is_none() && q.seven_day.is_none() {
        q.five_hour = Some(Window::new(1.0, "rejected", reset));
    }
    q
}

/// Renders the headers into typed name/value pairs, once, for the hot path.
///
/// # Panics
/// If a header name or value is not valid in HTTP: a bug in the test script, named.
pub(crate) fn render(quota: &Quota) -> Vec<(HeaderName, HeaderValue)> {
    quota
        .headers()
        .into_iter()
        .map(|(name, value)| {
            let n = HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
                .unwrap_or_else(|e| panic!("invalid quota header name `{name}`: {e}"));
            let v = HeaderValue::try_from(value.as_str())
                .unwrap_or_else(|e| panic!("invalid value for quota header `{name}`: {e}"));
            (n, v)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejected_fills_in_what_a_real_rejection_names() {
        let q = rejected(&Quota::default());
        assert_eq!(q.status.as_deref(), Some("rejected"));
        assert_eq!(q.representative_claim.as_deref(), Some("five_hour"));
        assert!(q.reset_s.is_some());
        assert_eq!(q.five_hour.unwrap().status, "rejected");
        let kept = rejected(&Quota::unified_at(0.5, 0.2, 1_000));
        assert_eq!((kept.reset_s, kept.five_hour.unwrap().status.as_str()), (Some(19_000), "allowed"));
    }

    #[test]
    fn every_header_renders() {
        let q = Quota::unified_at(0.5, 0.2, 1_000).with_api_limit("requests", 10, 9, 0);
        assert_eq!(render(&q).len(), q.headers().len());
    }
}
