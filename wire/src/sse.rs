//! The framing of a server-sent event, as Anthropic streams them: an `event:`
//! line naming the event, one `data:` line with its JSON (whose `type` is the
//! same name), and a blank line; and the reading of a stream of them, as bytes
//! arrive ([`Parser`]).

use crate::error::{Envelope, ErrorType};

/// The data of a `ping`, byte for byte as Anthropic sends it (with the space).
pub const PING: &str = r#"{"type": "ping"}"#;

/// One event: `event: {name}\ndata: {data}\n\n`.
pub fn frame(name: &str, data: &str) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// The `error` event that ends a stream which failed after it started.
pub fn error_event(kind: ErrorType, message: &str) -> String {
    let data = serde_json::to_string(&Envelope::new(kind, message, None)).expect("an error serializes");
    frame("error", &data)
}

/// One event read from a stream: its name (`message` when it has no `event:`
/// line, as OpenAI's streams have none) and its data (the `data:` lines, joined
/// by newlines).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The `event:` field, or `message`.
    pub name: String,
    /// The `data:` field.
    pub data: String,
}

/// Reads server-sent events from bytes as they arrive: a body comes in chunks
/// that cut events, lines and even UTF-8 characters anywhere, so what does not
/// yet end a line is kept for the next [`Parser::feed`].
///
/// It follows the WHATWG rules a browser does: lines end with `\n`, `\r\n` or
/// `\r`; a line starting with `:` is a comment; one space after the colon is
/// dropped; a blank line ends an event, and an event without data is none.
/// Fields other than `event` and `data` (`id`, `retry`) are not needed here and
/// are skipped.
#[derive(Debug, Default)]
pub struct Parser {
    /// Bytes of a line not yet ended.
    line: Vec<u8>,
    /// The last chunk ended with `\r`: a `\n` opening the next one ends nothing.
    after_cr: bool,
    name: String,
    data: String,
    has_data: bool,
}

impl Parser {
    /// A parser at the start of a stream.
    pub fn new() -> Parser {
        Parser::default()
    }

    /// The events that `bytes` completes, in order.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Event> {
        let mut out = Vec::new();
        for &b in bytes {
            let after_cr = std::mem::replace(&mut self.after_cr, b == b'\r');
            match b {
                b'\n' if after_cr => {}
                b'\n' | b'\r' => {
                    let line = std::mem::take(&mut self.line);
                    if let Some(event) = self.line_ended(&String::from_utf8_lossy(&line)) {
                        out.push(event);
                    }
                }
                _ => self.line.push(b),
            }
        }
        out
    }

    fn line_ended(&mut self, line: &str) -> Option<Event> {
        if line.is_empty() {
            let name = std::mem::take(&mut self.name);
            let data = std::mem::take(&mut self.data);
            let has_data = std::mem::replace(&mut self.has_data, false);
            let name = if name.is_empty() { "message".to_owned() } else { name };
            return has_data.then_some(Event { name, data });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => self.name = value.to_owned(),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_two_lines_and_a_blank_one() {
        assert_eq!(frame("ping", PING), "event: ping\ndata: {\"type\": \"ping\"}\n\n");
    }

    #[test]
    fn an_error_event_carries_the_envelope_without_a_request_id() {
        // The bytes the gateway's relay ends an interrupted stream with.
        assert_eq!(
            error_event(ErrorType::Api, "upstream stream interrupted (poolgate)"),
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"upstream stream interrupted (poolgate)\"}}\n\n"
        );
    }

    fn ev(name: &str, data: &str) -> Event {
        Event { name: name.into(), data: data.into() }
    }

    #[test]
    fn events_are_read_whatever_the_chunks_cut() {
        let stream = "event: ping\ndata: {\"type\": \"ping\"}\n\n: comment\r\ndata:é\r\ndata:  two\r\rdata: [DONE]\n\n";
        let want = vec![ev("ping", r#"{"type": "ping"}"#), ev("message", "é\n two"), ev("message", "[DONE]")];
        let bytes = stream.as_bytes();
        assert_eq!(Parser::new().feed(bytes), want);
        for cut in 0..=bytes.len() {
            let mut p = Parser::new();
            let mut got = p.feed(&bytes[..cut]);
            got.extend(p.feed(&bytes[cut..]));
            assert_eq!(got, want, "cut at {cut}");
        }
        let mut p = Parser::new();
        let got: Vec<Event> = bytes.iter().flat_map(|b| p.feed(std::slice::from_ref(b))).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn an_event_without_data_or_without_its_blank_line_is_none() {
        let mut p = Parser::new();
        assert_eq!(p.feed(b"event: ping\n\nid: 3\nretry: 10\n\ndata: x"), vec![]);
        assert_eq!(p.feed(b"\n"), vec![]);
        assert_eq!(p.feed(b"\n"), vec![ev("message", "x")]);
    }
}
