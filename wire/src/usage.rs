//! What an answer says it used: the `usage` of a Messages answer, read from a
//! JSON body or from a stream's events as they pass.
//!
//! Anthropic reports usage in two places of a stream: `message_start` carries
//! the input side (`input_tokens`, `cache_read_input_tokens`,
//! `cache_creation_input_tokens`) and an early `output_tokens`;
//! `message_delta` carries the **cumulative** `output_tokens` (and, on newer
//! API versions, the input side again, also cumulative). So the last value
//! seen of each field is the answer's — `Usage::merge` keeps it.
//!
//! The [`Scanner`] is on the hot path of every streamed answer, so it does not
//! parse events: it looks for the bytes `"usage":` (a key; inside any JSON
//! string a quote is escaped, so text or a tool's partial input never
//! matches) and parses only from there to the end of that object.

use serde::{Deserialize, Serialize};

/// Tokens an answer reports, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Input tokens not read from or written to the prompt cache.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read_input_tokens: u64,
    /// Input tokens written to the prompt cache.
    pub cache_creation_input_tokens: u64,
}

/// A `usage` object as written: every field optional (a `message_delta` may
/// carry only `output_tokens`).
#[derive(Debug, Default, Deserialize)]
struct Fields {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
}

impl Usage {
    /// Every kind together.
    pub fn total(&self) -> u64 {
        self.input_tokens + self.output_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens
    }

    /// Takes each field `f` states (a later report of a field replaces an
    /// earlier one: Anthropic's counts are cumulative).
    fn merge(&mut self, f: &Fields) {
        let take = |into: &mut u64, v: Option<u64>| {
            if let Some(v) = v {
                *into = v;
            }
        };
        take(&mut self.input_tokens, f.input_tokens);
        take(&mut self.output_tokens, f.output_tokens);
        take(&mut self.cache_read_input_tokens, f.cache_read_input_tokens);
        take(&mut self.cache_creation_input_tokens, f.cache_creation_input_tokens);
    }
}

/// The top-level `usage` of a JSON Messages answer; `None` when the body is
/// not one (an error, a `count_tokens` answer, not JSON).
///
/// Anthropic writes `usage` last, after the content: the last `"usage":` of
/// the body is read first, without parsing (or UTF-8-checking) the content
/// before it. Only when that is not a usage object is the whole body parsed.
pub fn of_message(body: &[u8]) -> Option<Usage> {
    #[derive(Deserialize)]
    struct Answer {
        usage: Option<Fields>,
    }
    let last = rfind_key(body).and_then(|at| {
        let object = &body[at + KEY.len()..];
        let mut values = serde_json::Deserializer::from_slice(object).into_iter::<Fields>();
        let fields = values.next()?.ok()?;
        // The last member of the top-level object: only its `}` follows.
        (object[values.byte_offset()..].trim_ascii() == b"}").then_some(fields)
    });
    let fields = match last {
        Some(f) => f,
        None => serde_json::from_slice::<Answer>(body).ok()?.usage?,
    };
    let mut usage = Usage::default();
    usage.merge(&fields);
    Some(usage)
}

/// Where the last `"usage":` of `body` starts. From the end, colon by colon:
/// the usage object is a body's last few dozen bytes, so this looks at a
/// handful of colons — where a substring searcher would first be built for
/// the key (a thousand instructions and more, on every answer).
fn rfind_key(body: &[u8]) -> Option<usize> {
    memchr::memrchr_iter(b':', body).find_map(|colon| {
        let at = (colon + 1).checked_sub(KEY.len())?;
        (body[at..=colon] == *KEY).then_some(at)
    })
}

/// The longest line kept across chunks: an event line cut by a chunk
/// boundary is held until its end arrives; beyond this the line is given up
/// (and the usage is known to be incomplete).
const LINE_MAX: usize = 1 << 20;

/// Reads `usage` from a stream's bytes as they pass, cut anywhere.
#[derive(Debug, Default)]
pub struct Scanner {
    usage: Usage,
    /// Whether any `usage` was read.
    seen: bool,
    /// The stream's unfinished last line (empty when chunks end on a line
    /// end, as event-framed chunks do).
    carry: Vec<u8>,
    /// A line was longer than [`LINE_MAX`] and skipped.
    lost: bool,
    /// The stream's closing `message_delta` (the final output count) was read.
    finished: bool,
    /// Bytes read.
    bytes: u64,
}

const KEY: &[u8] = b"\"usage\":";

impl Scanner {
    /// Reads one chunk of the stream.
    pub fn push(&mut self, chunk: &[u8]) {
        self.bytes += chunk.len() as u64;
        if self.carry.is_empty() {
            let whole = match memchr::memrchr(b'\n', chunk) {
                Some(end) => end + 1,
                None => 0,
            };
            self.lines(&chunk[..whole]);
            self.keep(&chunk[whole..]);
            return;
        }
        match memchr::memchr(b'\n', chunk) {
            Some(end) => {
                let mut line = std::mem::take(&mut self.carry);
                line.extend_from_slice(&chunk[..=end]);
                self.lines(&line);
                let rest = &chunk[end + 1..];
                let whole = memchr::memrchr(b'\n', rest).map_or(0, |e| e + 1);
                self.lines(&rest[..whole]);
                self.keep(&rest[whole..]);
            }
            None => self.keep(chunk),
        }
    }

    fn keep(&mut self, tail: &[u8]) {
        if self.carry.len() + tail.len() > LINE_MAX {
            self.carry.clear();
            self.lost = true;
            return;
        }
        self.carry.extend_from_slice(tail);
    }

    /// Whole lines: each `"usage":` in them parsed from its object on.
    fn lines(&mut self, bytes: &[u8]) {
        static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
            std::sync::LazyLock::new(|| memchr::memmem::Finder::new(KEY));
        for at in FINDER.find_iter(bytes) {
            let object = &bytes[at + KEY.len()..];
            let mut values = serde_json::Deserializer::from_slice(object).into_iter::<Fields>();
            if let Some(Ok(fields)) = values.next() {
                self.usage.merge(&fields);
                self.seen = true;
                let line = memchr::memrchr(b'\n', &bytes[..at]).map_or(0, |i| i + 1);
                if memchr::memmem::find(&bytes[line..at], b"\"message_delta\"").is_some() {
                    self.finished = true;
                }
            }
        }
    }

    /// Whether the stream's closing `message_delta` was read: only then is
    /// its output count final (`message_start` says 1).
    pub fn finished(&self) -> bool {
        self.finished && !self.lost
    }

    /// What to charge for a stream that ended before its closing count (a
    /// client that left, a cut): what it reported, with the output taken as
    /// one token per 4 bytes streamed — every byte of the events' framing
    /// counted as text, so in practice more than was generated, not less.
    /// The usage itself once the stream [`Scanner::finished`].
    pub fn charge(&self) -> Usage {
        let mut u = self.usage;
        if !self.finished() {
            u.output_tokens = u.output_tokens.max(self.bytes / 4);
        }
        u
    }

    /// The usage read so far (the stream's, once it ended); `None` if none
    /// was reported, or a part of the stream could not be read.
    pub fn usage(&self) -> Option<Usage> {
        (self.seen && !self.lost).then_some(self.usage)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Chunking, Reply, StopReason, TextPieces};

    fn reply() -> Reply {
        Reply {
            id: "msg_1".into(),
            model: "claude-sonnet-4-5".into(),
            thinking: None,
            text: "the \"usage\": {\"input_tokens\": 999} of a quote".into(),
            tool: None,
            stop_reason: StopReason::EndTurn,
            input_tokens: 31,
            output_tokens: 17,
            cache_read_input_tokens: 2_000,
            cache_creation_input_tokens: 300,
        }
    }

    #[test]
    fn the_last_key_is_found_from_the_end_as_a_substring_search_finds_it() {
        for body in [
            &b"\"usage\":{}"[..],
            b"{\"a\":\"usage\":\",\"usage\":{\"x\":1},\"b\":{\"usage\":{}}}",
            b"{\"text\":\"no key: here\"}",
            b":",
            b"",
        ] {
            assert_eq!(rfind_key(body), memchr::memmem::rfind(body, KEY), "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn a_stream_cut_anywhere_reports_the_last_value_of_each_field() {
        let stream: String = reply().events(&Chunking { text: TextPieces::Words(1), json_parts: 2 }).concat();
        let want = Usage {
            input_tokens: 31,
            output_tokens: 17,
            cache_read_input_tokens: 2_000,
            cache_creation_input_tokens: 300,
        };
        for cut in 1..stream.len() {
            let mut s = Scanner::default();
            for piece in stream.as_bytes().chunks(cut) {
                s.push(piece);
            }
            assert_eq!(s.usage(), Some(want), "cut every {cut}");
        }
    }

    #[test]
    fn cache_fields_and_a_newer_cumulative_delta_are_read() {
        let stream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"cache_creation_input_tokens\":1200,\"cache_read_input_tokens\":30000,\"cache_creation\":{\"ephemeral_5m_input_tokens\":1200},\"output_tokens\":1}}}\n\n\
                      event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"input_tokens\":5,\"cache_creation_input_tokens\":1200,\"cache_read_input_tokens\":30000,\"output_tokens\":412}}\n\n";
        let mut s = Scanner::default();
        s.push(stream.as_bytes());
        let want = Usage {
            input_tokens: 5,
            output_tokens: 412,
            cache_read_input_tokens: 30_000,
            cache_creation_input_tokens: 1_200,
        };
        assert_eq!(s.usage(), Some(want));
        assert_eq!(want.total(), 31_617);
    }

    #[test]
    fn a_json_answer_gives_its_top_level_usage_only() {
        let body = reply().to_json();
        let want = Usage {
            input_tokens: 31,
            output_tokens: 17,
            cache_read_input_tokens: 2_000,
            cache_creation_input_tokens: 300,
        };
        assert_eq!(of_message(body.as_bytes()), Some(want));
        let tool = br#"{"content":[{"type":"tool_use","input":{"usage":{"input_tokens":7}}}],"usage":{"input_tokens":3,"output_tokens":4}}"#;
        assert_eq!(of_message(tool).map(|u| u.input_tokens), Some(3));
        // Not in Anthropic's order, a tool's "usage" last: the whole body is read.
        let first = br#"{"usage":{"input_tokens":3,"output_tokens":4},"content":[{"type":"tool_use","input":{"usage":{"input_tokens":7,"output_tokens":1}}}]}"#;
        assert_eq!(of_message(first).map(|u| u.input_tokens), Some(3));
        assert_eq!(of_message(br#"{"input_tokens":42}"#), None, "count_tokens is not usage");
        assert_eq!(of_message(br#"{"type":"error","error":{}}"#), None);
    }

    #[test]
    fn a_stream_cut_before_its_closing_count_is_charged_by_its_bytes() {
        let events = reply().events(&Chunking { text: TextPieces::Words(1), json_parts: 2 });
        let mut s = Scanner::default();
        let cut: String = events[..events.len() - 2].concat(); // no message_delta, no message_stop
        s.push(cut.as_bytes());
        assert!(!s.finished());
        assert_eq!(s.usage().unwrap().output_tokens, 1, "message_start's early count");
        assert_eq!(s.charge().output_tokens, cut.len() as u64 / 4);
        assert_eq!(s.charge().input_tokens, 31);
        s.push(events[events.len() - 2].as_bytes());
        assert!(s.finished());
        assert_eq!(s.charge().output_tokens, 17);
    }

    #[test]
    fn a_stream_without_usage_or_with_an_unreadable_line_has_none() {
        let mut s = Scanner::default();
        s.push(b"event: ping\ndata: {}\n\n");
        assert_eq!(s.usage(), None);
        let mut s = Scanner::default();
        s.push(b"data: {\"usage\":{\"output_tokens\":1}}\n");
        s.push(&vec![b'x'; LINE_MAX + 1]);
        s.push(b"\n");
        assert_eq!(s.usage(), None, "a part of the stream was skipped");
    }
}
