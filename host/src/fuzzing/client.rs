//! What a client sends (a Messages body) and what a plugin answers (a
//! ranking): the two inputs that decide where a request goes.

use arbitrary::Unstructured;
use http::HeaderValue;

use crate::gateway::request::read;
use crate::policy::chain::{MAX_DETAIL_BYTES, MAX_REASON_BYTES, RESERVED_REASONS, validate_answer};
use crate::policy::fault::{MAX_MESSAGE_BYTES, is_unsafe_in_log};
use crate::policy::types::Ranking;
use crate::policy::{Cause, Fault};
use poolgate_wire::request::{MessagesRequest, check_count_tokens, estimate_input_tokens};

/// A Messages request body, read for routing (model, stream, session) as
/// phase `read` does, and as the wire crate's request reading does: a body
/// accepted is one JSON object whose facts are the object's fields.
pub fn body_facts(data: &[u8]) {
    match read::body_facts(data) {
        Ok(facts) => {
            serde_json::from_slice::<serde::de::IgnoredAny>(data).expect("an accepted body is JSON");
            // JSON's grammar has numbers beyond f64 (`1e999`) and unpaired
            // surrogate escapes (`"\ud800"`), which serde's `Value` refuses
            // (its syntax was checked just above): such a body is JSON,
            // forwarded as sent; only the fallback's translation, which parses
            // it whole, passes it over (`fallback.rs`, `Fallbacks::serve`).
            let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else { return };
            assert!(value.is_object(), "an accepted body is an object");
            assert_eq!(facts.model.as_deref(), value["model"].as_str(), "the model read is the body's");
            assert_eq!(facts.stream, value["stream"].as_bool().unwrap_or(false));
            assert!(facts.session.as_ref().is_none_or(|s| !s.is_empty()), "an empty session is none");
        }
        Err(read::BadBody(why)) => assert!(!why.is_empty(), "a refusal says why"),
    }
    if let Ok(text) = std::str::from_utf8(data)
        && let Some(s) = read::session_from_user_id(text)
    {
        assert!(!s.is_empty(), "an empty session is none");
    }
    if let Ok(request) = MessagesRequest::parse(data) {
        let _ = request.forced_tool();
    }
    let _ = check_count_tokens(data);
    let _ = estimate_input_tokens(data);
}

/// An answer as a plugin's guest could build it: any order (indices near
/// the candidates' count, so that duplicates and out-of-range ones are
/// common), any reason and detail.
fn ranking(u: &mut Unstructured<'_>) -> arbitrary::Result<(Ranking, usize)> {
    let n = u.int_in_range(0..=12usize)?;
    let len = u.int_in_range(0..=14usize)?;
    let mut order = Vec::with_capacity(len);
    for _ in 0..len {
        order.push(if u.ratio(1, 16)? { u.arbitrary()? } else { u.int_in_range(0..=13u32)? });
    }
    let reason: String = u.arbitrary()?;
    let detail: Option<String> = u.arbitrary()?;
    Ok((Ranking { order, reason, detail }, n))
}

/// The decision-output validator over a plugin's answer: it accepts exactly
/// a non-empty permutation of a subset of the candidates, with a reason that
/// can travel in a header and is not the host's, and a bounded detail — the
/// check below is written from the contract (`wit/policy.wit`), not from the
/// code. And the guest's error text, made a fault message, is one safe line.
pub fn decision(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok((r, n)) = ranking(&mut u) else { return };
    let verdict = validate_answer(&r, n);
    let mut seen = std::collections::BTreeSet::new();
    let order_ok = !r.order.is_empty() && r.order.iter().all(|&i| (i as usize) < n && seen.insert(i));
    let reason_ok = r.reason.len() <= MAX_REASON_BYTES
        && r.reason.bytes().all(|b| (b' '..=b'~').contains(&b))
        && !RESERVED_REASONS.contains(&r.reason.as_str());
    let detail_ok = r.detail.as_ref().is_none_or(|d| d.len() <= MAX_DETAIL_BYTES);
    match &verdict {
        Ok(()) => {
            assert!(order_ok && reason_ok && detail_ok, "accepted an invalid answer: {r:?} for {n}");
            assert!(HeaderValue::from_str(&r.reason).is_ok(), "an accepted reason is a header value");
        }
        Err(fault) => {
            assert!(!(order_ok && reason_ok && detail_ok), "refused a valid answer: {r:?} for {n}: {fault:?}");
            assert_eq!(fault.cause, Cause::InvalidOutput);
            safe_line(&fault.message);
        }
    }
    let said: String = u.arbitrary().unwrap_or_default();
    safe_line(&Fault::new(Cause::Trap, said).message);
}

/// A fault message as the operator's log gets it: one line, bounded.
fn safe_line(message: &str) {
    assert!(message.len() <= MAX_MESSAGE_BYTES, "a fault message of {} bytes", message.len());
    assert!(!message.chars().any(is_unsafe_in_log), "a fault message holds a control character: {message:?}");
}
