//! What an upstream answers: its quota headers and its event stream.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

use super::{NOW_MS, chunks};
use crate::config::CooldownConfig;
use crate::gateway::request::relay::SseFramer;
use crate::learned::accounts::AccountState;
use crate::learned::cooldown::Answer;
use crate::learned::quota;
use poolgate_wire::sse::Parser;
use poolgate_wire::usage::Scanner;

/// Headers from `name: value` lines; a line that is not a valid header is
/// skipped, as hyper would never hand the gateway one.
fn headers(data: &[u8]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for line in data.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
        let value = line[colon + 1..].trim_ascii();
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(line[..colon].trim_ascii()), HeaderValue::from_bytes(value)) {
            map.append(n, v);
        }
    }
    map
}

/// The quota headers (`anthropic-ratelimit-unified-*`, the API-key families,
/// `retry-after`) of one answer, read and learned as `attempt::learn` does:
/// the reading, then an account's state recording it under each kind of
/// answer that carries one.
pub fn quota_headers(data: &[u8]) {
    let headers = headers(data);
    let reading = quota::parse(&headers, NOW_MS);
    for w in &reading.windows {
        assert!(w.utilization.is_finite() && w.utilization >= 0.0, "window {} reads {}", w.name, w.utilization);
    }
    assert!(reading.fallback_percentage.is_none_or(f64::is_finite));
    if let Some(reset) = reading.subscription_reset_ms(NOW_MS) {
        assert!(reset > NOW_MS, "a reset in the past is no reset");
    }
    let _ = reading.billed_as_overage(NOW_MS);
    let _ = (reading.has_unified(), reading.is_empty());
    let cfg = CooldownConfig::default();
    for answer in [Answer::Status(200), Answer::Status(429), Answer::Status(529), Answer::Status(401)] {
        let state = AccountState::new("fuzz");
        state.record(answer, &reading, Some("opus"), &cfg, NOW_MS);
        state.take_reading(&reading, NOW_MS);
        if let Some(c) = state.cooldown(NOW_MS) {
            assert!(c.until_ms > NOW_MS, "a cooldown in force ends in the future");
        }
    }
}

/// An upstream's event stream, cut into chunks at [`super::CUT`], through
/// what the relay does to it: the framer that holds a torn event back (its
/// output is the input, byte for byte, in pieces that each end an event),
/// the usage meter, and the event reader (whose events do not depend on
/// where the chunks were cut).
pub fn sse_relay(data: &[u8]) {
    let chunks = chunks(data);
    let whole = chunks.concat();

    let mut framer = SseFramer::default();
    let mut relayed = Vec::with_capacity(whole.len());
    for c in &chunks {
        if let Some(out) = framer.push(Bytes::copy_from_slice(c)) {
            assert!(out.ends_with(b"\n\n"), "a relayed piece ends an event");
            relayed.extend_from_slice(&out);
        }
    }
    if let Some(rest) = framer.rest() {
        assert!(!rest.windows(2).any(|w| w == b"\n\n"), "the held tail holds no whole event");
        relayed.extend_from_slice(&rest);
    }
    assert!(relayed == whole, "the relay changed the stream's bytes");

    let mut meter = Scanner::default();
    for c in &chunks {
        meter.push(c);
    }
    if meter.finished() {
        assert!(meter.usage().is_some(), "a finished stream has its usage");
    }
    let _ = meter.charge();

    let mut parser = Parser::new();
    let cut: Vec<_> = chunks.iter().flat_map(|c| parser.feed(c)).collect();
    assert_eq!(cut, Parser::new().feed(&whole), "events depend on where the stream was cut");
}
