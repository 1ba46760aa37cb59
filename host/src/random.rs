//! Random values: secrets and unique names from the operating system's random
//! source, and a cheap reproducible pseudo-random step for what only has to vary
//! (delays, reply lengths, the demo's traffic).

use anyhow::Result;

/// `bytes` random bytes, hex-encoded, from the operating system's CSPRNG (by
/// way of the TLS stack's provider, already linked for upstream HTTPS).
pub fn random_hex(bytes: usize) -> Result<String> {
    let mut buf = vec![0u8; bytes];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut buf)
        .map_err(|_| anyhow::anyhow!("the operating system's random source failed"))?;
    Ok(hex::encode(buf))
}

/// SplitMix64: a tiny, well-mixed pseudo-random step. Jitter, reply lengths
/// and the demo's traffic vary with it; nothing secret is derived from it.
pub fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A UUID-shaped string from two 64-bit values.
pub fn uuid_like(a: u64, b: u64) -> String {
    let h = format!("{a:016x}{b:016x}");
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_hex_is_fresh_and_of_the_asked_length() {
        let (a, b) = (random_hex(16).unwrap(), random_hex(16).unwrap());
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn splitmix_is_the_reference_sequence() {
        // SplitMix64 from seed 0: the first outputs of the reference implementation.
        assert_eq!(splitmix(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(splitmix(0x9E37_79B9_7F4A_7C15), 0x6e78_9e6a_a1b9_65f4);
    }

    #[test]
    fn uuid_like_has_the_uuid_shape() {
        assert_eq!(uuid_like(0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210), "01234567-89ab-cdef-fedc-ba9876543210");
    }
}
