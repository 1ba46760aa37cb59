//! A batch of entries as one compact record: how the embedded store keeps
//! them (`sqlite`).
//!
//! Why not a row per entry: a SQLite row insert (binding sixteen values,
//! stepping the statement, a B-tree insert per index) cost some 11,000
//! instructions per request, on the writer thread — more than the 5 % of a
//! request's cost the ledger may take. Encoded here, an entry costs a few
//! hundred, and a batch is one row. Reports read the batches that overlap
//! their range and sum in Rust ([`super::report::summarize`]): a month of a
//! busy team's requests decodes in well under a second.
//!
//! The format, version 1: the byte `1`, then per entry its fields in
//! [`Entry`]'s order — integers as LEB128 varints, strings as a varint
//! length and UTF-8 bytes, then a flags byte (bit 0: the usage is known;
//! bit 1: a cost follows) and the cost. Plain data, pure functions.

use anyhow::{Result, bail};
use poolgate_wire::usage::Usage;

use super::Entry;

const VERSION: u8 = 1;

/// An entry as read back from a segment (its strings owned).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filed {
    /// When the request arrived, ms since the epoch.
    pub at_ms: u64,
    /// The gateway's request id.
    pub request: u64,
    /// The replica that answered.
    pub replica: String,
    /// The client key's name.
    pub key: String,
    /// The key's team tag.
    pub team: String,
    /// The route (`messages`, …).
    pub api: String,
    /// The model asked for.
    pub model: String,
    /// The account that served (or the fallback).
    pub account: String,
    /// The status the client got.
    pub status: u16,
    /// How the request ended.
    pub outcome: String,
    /// The tokens the answer reported.
    pub usage: Usage,
    /// Whether the answer reported its usage.
    pub usage_known: bool,
    /// What it cost, nano-USD; `None` for a model with no price.
    pub cost_nano: Option<u64>,
}

/// `entries` as one segment.
pub fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + entries.len() * 96);
    out.push(VERSION);
    for e in entries {
        let u = &e.usage;
        varint(&mut out, e.at_ms);
        varint(&mut out, e.request);
        for s in [&*e.replica, &e.key, &e.team, e.api, &e.model, &e.account] {
            string(&mut out, s);
        }
        varint(&mut out, u64::from(e.status));
        string(&mut out, e.outcome);
        for n in [u.input_tokens, u.output_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens] {
            varint(&mut out, n);
        }
        out.push(u8::from(e.usage_known) | (u8::from(e.cost_nano.is_some()) << 1));
        if let Some(c) = e.cost_nano {
            varint(&mut out, c);
        }
    }
    out
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn string(out: &mut Vec<u8>, s: &str) {
    varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// A segment's bytes, read in order.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8> {
        let Some(&b) = self.bytes.get(self.at) else { bail!("a segment ends inside an entry") };
        self.at += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        bail!("a segment holds a number longer than 64 bits")
    }

    fn string(&mut self) -> Result<String> {
        let len = usize::try_from(self.varint()?)?;
        let end = self.at.checked_add(len).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else { bail!("a segment ends inside a string") };
        let s = std::str::from_utf8(&self.bytes[self.at..end])?.to_string();
        self.at = end;
        Ok(s)
    }
}

/// The entries of a segment, in the order they were written.
pub fn decode(bytes: &[u8]) -> Result<Vec<Filed>> {
    let mut r = Reader { bytes, at: 0 };
    if bytes.is_empty() || r.byte()? != VERSION {
        bail!("a segment of an unknown version ({:?})", bytes.first());
    }
    let mut out = Vec::new();
    while r.at < bytes.len() {
        let (at_ms, request) = (r.varint()?, r.varint()?);
        let (replica, key, team, api, model, account) =
            (r.string()?, r.string()?, r.string()?, r.string()?, r.string()?, r.string()?);
        let status = u16::try_from(r.varint()?)?;
        let outcome = r.string()?;
        let usage = Usage {
            input_tokens: r.varint()?,
            output_tokens: r.varint()?,
            cache_read_input_tokens: r.varint()?,
            cache_creation_input_tokens: r.varint()?,
        };
        let flags = r.byte()?;
        let cost_nano = if flags & 2 != 0 { Some(r.varint()?) } else { None };
        out.push(Filed {
            at_ms,
            request,
            replica,
            key,
            team,
            api,
            model,
            account,
            status,
            outcome,
            usage,
            usage_known: flags & 1 != 0,
            cost_nano,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_reads_back_every_field_of_every_entry() {
        let entries = [
            Entry {
                at_ms: 1_764_547_200_123,
                request: u64::MAX,
                replica: "r-1".into(),
                key: "alice".into(),
                team: "core".into(),
                api: "messages",
                model: "claude-sonnet-4-5\t\"odd\"\n名".into(),
                account: "fallback:local/qwen".into(),
                status: 200,
                outcome: "complete",
                usage: Usage {
                    input_tokens: 1,
                    output_tokens: 300,
                    cache_read_input_tokens: 1 << 40,
                    cache_creation_input_tokens: 0,
                },
                usage_known: true,
                cost_nano: Some(12_345),
            },
            Entry { status: 429, outcome: "parked", api: "count_tokens", ..Entry::default() },
        ];
        let bytes = encode(&entries);
        let back = decode(&bytes).unwrap();
        assert_eq!(back.len(), 2);
        let (e, f) = (&entries[0], &back[0]);
        assert_eq!((f.at_ms, f.request, f.replica.as_str(), f.key.as_str()), (e.at_ms, e.request, "r-1", "alice"));
        assert_eq!((f.team.as_str(), f.api.as_str(), f.model.as_str()), ("core", "messages", &*e.model));
        assert_eq!((f.account.as_str(), f.status, f.outcome.as_str()), ("fallback:local/qwen", 200, "complete"));
        assert_eq!((f.usage, f.usage_known, f.cost_nano), (e.usage, true, Some(12_345)));
        assert_eq!((back[1].status, back[1].usage_known, back[1].cost_nano), (429, false, None));
        assert!(bytes.len() < 160, "compact: {} bytes", bytes.len());
        // Cut anywhere but between entries, a segment is refused.
        let between = [1, bytes.len() - back_len(&entries[1])];
        for cut in 1..bytes.len() {
            assert_eq!(decode(&bytes[..cut]).is_ok(), between.contains(&cut), "cut at {cut}");
        }
        assert!(decode(&[2]).is_err(), "an unknown version");
    }

    /// The bytes the last entry takes.
    fn back_len(last: &Entry) -> usize {
        encode(std::slice::from_ref(last)).len() - 1
    }
}
