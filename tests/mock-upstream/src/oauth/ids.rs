//! Fake but well-formed identifiers: tokens, codes, uuids, and PKCE challenges.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

/// The PKCE S256 challenge of a verifier (RFC 7636): `base64url_nopad(sha256(verifier))`,
/// for a test that plays the client of [`crate::Seat::code_for`].
pub fn pkce_challenge(verifier: &str) -> String {
    base64url(&Sha256::digest(verifier.as_bytes()))
}

/// A token no other mock, in this process or another, mints too: a process-wide counter,
/// the clock and the pid, hashed (opaque, as real tokens are to a client).
pub(super) fn random_token(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let digest = Sha256::new()
        .chain_update(n.to_le_bytes())
        .chain_update(nanos.to_le_bytes())
        .chain_update(std::process::id().to_le_bytes())
        .finalize();
    format!("{prefix}{}", base64url(&digest))
}

/// A uuid-shaped id (version 4, RFC 4122 variant) that depends only on `kind` and `name`.
pub(super) fn fake_uuid(kind: &str, name: &str) -> String {
    let digest = Sha256::new().chain_update(kind).chain_update([0]).chain_update(name).finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// Unpadded base64url (RFC 4648 §5), the encoding of PKCE challenges; hand-rolled because
/// it is a dozen lines and the only encoding the mock needs.
fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        // 3 bytes make 4 characters, 2 make 3, 1 makes 2: no padding.
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkce_matches_rfc_7636_appendix_b() {
        assert_eq!(
            pkce_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }

    #[test]
    fn base64url_has_no_padding() {
        let encoded: Vec<String> = ["", "f", "fo", "foo", "foob", "fooba", "foobar", "\u{fb}\u{ff}"]
            .iter()
            .map(|s| base64url(s.as_bytes()))
            .collect();
        assert_eq!(encoded, ["", "Zg", "Zm8", "Zm9v", "Zm9vYg", "Zm9vYmE", "Zm9vYmFy", "w7vDvw"]);
    }
}
