//! The workload a simulation replays: one JSON object per line, one line per
//! request, in time order.
//!
//! ```text
//! {"t_ms":0,"session":"ana-1","client":"ana","model":"claude-sonnet-4-5","input_tokens":180,"output_tokens":900,"cache_read_tokens":24000,"cache_creation_tokens":3100,"stream":true}
//! ```
//!
//! - `t_ms`: when the request is sent, ms from the workload's start (the
//!   simulation starts on a Monday, 00:00 UTC);
//! - `session`: the conversation it belongs to (sent as
//!   `x-claude-code-session-id`, what affinity keys on);
//! - `client`: the client key's name (optional);
//! - `model`; the token counts the answer reports: `input_tokens` (not
//!   cached), `output_tokens`, `cache_read_tokens` (the prompt prefix read
//!   from the cache when it is warm on the serving account) and
//!   `cache_creation_tokens` (written to it); `stream`.
//!
//! The cache counts are what the request costs on an account whose cache is
//! warm for its session; the simulated upstream turns the cache reads into
//! cache writes on an account where it is cold (a switch, or five idle
//! minutes), as the real API does.

use std::io::{BufRead, Write};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// One request of a workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// When it is sent, ms from the workload's start.
    pub t_ms: u64,
    /// The conversation it belongs to.
    pub session: String,
    /// The client key's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// The model asked for.
    pub model: String,
    /// Input tokens not read from or written to the cache.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Prompt tokens read from a warm cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the cache.
    #[serde(default)]
    pub cache_creation_tokens: u64,
    /// Whether the client streams the answer.
    #[serde(default)]
    pub stream: bool,
}

/// Reads a workload, naming the line of the first problem. Entries must be
/// in time order (a recorded log is; a hand-written one is told where not).
pub fn read(input: impl BufRead, name: &str) -> Result<Vec<Entry>> {
    let mut out: Vec<Entry> = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let line = line.with_context(|| format!("reading {name}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let entry: Entry =
            serde_json::from_str(&line).with_context(|| format!("{name}:{}: not a workload entry", i + 1))?;
        if let Some(last) = out.last()
            && entry.t_ms < last.t_ms
        {
            bail!(
                "{name}:{}: t_ms {} is before the line above ({}); entries go in time order",
                i + 1,
                entry.t_ms,
                last.t_ms
            );
        }
        out.push(entry);
    }
    if out.is_empty() {
        bail!("{name}: no requests");
    }
    Ok(out)
}

/// Writes a workload, one entry a line.
pub fn write(entries: &[Entry], mut out: impl Write) -> Result<()> {
    for e in entries {
        serde_json::to_writer(&mut out, e)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workload_reads_back_what_was_written_and_names_a_bad_line() {
        let e = Entry {
            t_ms: 5,
            session: "s".into(),
            client: None,
            model: "claude-sonnet-4-5".into(),
            input_tokens: 1,
            output_tokens: 2,
            cache_read_tokens: 3,
            cache_creation_tokens: 4,
            stream: true,
        };
        let mut text = Vec::new();
        write(std::slice::from_ref(&e), &mut text).unwrap();
        assert_eq!(read(&text[..], "w").unwrap(), [e]);
        let err = read(&b"{\"t_ms\":1}\n"[..], "w.jsonl").unwrap_err();
        assert!(format!("{err:#}").starts_with("w.jsonl:1: not a workload entry"), "{err:#}");
        let order = "{\"t_ms\":9,\"session\":\"s\",\"model\":\"m\",\"input_tokens\":1,\"output_tokens\":1}\n\
                     {\"t_ms\":3,\"session\":\"s\",\"model\":\"m\",\"input_tokens\":1,\"output_tokens\":1}\n";
        assert!(format!("{:#}", read(order.as_bytes(), "w").unwrap_err()).contains("w:2: t_ms 3 is before"));
    }
}
