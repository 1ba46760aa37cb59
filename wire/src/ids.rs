//! Ids in Anthropic's shapes, and a stable hash to derive per-name values from.

/// `prefix`, a fake's `tag`, and `n` in 18 digits: `numbered("req_", "sim", 7)`
/// is `req_sim000000000000000007`. Anthropic's prefixes are `req_` (request),
/// `msg_` (message) and `toolu_` (tool call); the tag tells which fake made it.
pub fn numbered(prefix: &str, tag: &str, n: u64) -> String {
    format!("{prefix}{tag}{n:018}")
}

/// FNV-1a (64 bit): a stable, dependency-free hash, so that a value derived
/// from a name (an account's organization id) is the same in every run.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_ids_pad_to_18_digits() {
        assert_eq!(numbered("req_", "sim", 7), "req_sim000000000000000007");
        assert_eq!(numbered("msg_", "01mock", 12), "msg_01mock000000000000000012");
    }

    #[test]
    fn fnv1a_matches_the_reference_values() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x85944171f73967e8);
    }
}
