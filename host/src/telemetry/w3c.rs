//! W3C Trace Context (`traceparent`, `tracestate`): read from a client so the
//! gateway's spans join the caller's trace, written upstream when the operator
//! asks for it.
//!
//! A header that does not parse is ignored, as the recommendation says: the
//! request starts a trace of its own rather than failing. Only version `00`'s
//! layout is read (a later version's first four fields, as §3.3 allows).

/// The ids a span carries in a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parent {
    /// 16 bytes, never all zero.
    pub trace_id: [u8; 16],
    /// The caller's span, 8 bytes, never all zero.
    pub span_id: [u8; 8],
    /// Whether the caller records this trace (`sampled`, flag 0x01).
    pub sampled: bool,
}

/// The most of a `tracestate` kept (the recommendation's limit is 512
/// characters; longer is cut at a member boundary).
const TRACESTATE_MAX: usize = 512;

/// Reads a `traceparent` value; `None` when it is not one.
pub fn parse_traceparent(value: &str) -> Option<Parent> {
    let v = value.trim();
    let mut parts = v.split('-');
    let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version.len() != 2 || version == "ff" || !lower_hex(version) {
        return None;
    }
    // Version 00 has exactly four fields; a later one may append more.
    if version == "00" && parts.next().is_some() {
        return None;
    }
    if trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
        return None;
    }
    let trace_id: [u8; 16] = decode(trace)?;
    let span_id: [u8; 8] = decode(span)?;
    let [flags]: [u8; 1] = decode(flags)?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(Parent { trace_id, span_id, sampled: flags & 1 == 1 })
}

/// A `traceparent` value for a span of `trace_id`.
pub fn traceparent(trace_id: &[u8; 16], span_id: &[u8; 8], sampled: bool) -> String {
    format!("00-{}-{}-{}", hex::encode(trace_id), hex::encode(span_id), if sampled { "01" } else { "00" })
}

/// A `tracestate` worth passing on: printable ASCII, at most 512 characters
/// (cut after the last whole member that fits), else none.
pub fn clean_tracestate(value: &str) -> Option<String> {
    let v = value.trim();
    if v.is_empty() || !v.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return None;
    }
    if v.len() <= TRACESTATE_MAX {
        return Some(v.to_string());
    }
    let cut = v[..TRACESTATE_MAX].rfind(',')?;
    Some(v[..cut].trim_end().to_string())
}

fn lower_hex(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn decode<const N: usize>(s: &str) -> Option<[u8; N]> {
    if !lower_hex(s) {
        return None;
    }
    let mut out = [0u8; N];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_from_the_recommendation_reads_and_writes_back() {
        let p = parse_traceparent(GOOD).unwrap();
        assert!(p.sampled);
        assert_eq!(hex::encode(p.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(traceparent(&p.trace_id, &p.span_id, p.sampled), GOOD);
        assert!(!parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap().sampled);
    }

    #[test]
    fn what_is_not_a_traceparent_is_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
        // A later version: its first four fields are read.
        assert!(parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what").is_some());
    }

    #[test]
    fn a_long_tracestate_is_cut_at_a_member() {
        assert_eq!(clean_tracestate(" congo=t61rcWkgMzE "), Some("congo=t61rcWkgMzE".into()));
        assert_eq!(clean_tracestate("a=\u{7f}"), None);
        let long = (0..100).map(|i| format!("k{i}=v{i}")).collect::<Vec<_>>().join(",");
        let cut = clean_tracestate(&long).unwrap();
        assert!(cut.len() <= TRACESTATE_MAX && long.starts_with(&cut) && !cut.ends_with(','), "{cut}");
    }
}
