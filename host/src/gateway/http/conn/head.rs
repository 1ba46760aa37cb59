//! Reading a request head as it arrives, byte by byte, without buffering it:
//! how many bytes and lines it has so far and whether it is complete — enough
//! to refuse a head over the limits before the HTTP server has it whole — and
//! whether a connection opens with the HTTP/2 preface (prior knowledge), into
//! which no HTTP/1 byte may ever be written.

/// The HTTP/2 client connection preface (RFC 9113 §3.4).
pub const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How much of the request line is kept, for the log line of a refusal.
const KEPT_LINE: usize = 512;

/// What a connection's first bytes say about its protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sniff {
    /// Every byte so far is a prefix of the HTTP/2 preface (or none came).
    #[default]
    Undecided,
    /// HTTP/1: a byte differs from the preface.
    Http1,
    /// The whole preface: HTTP/2 with prior knowledge.
    Http2,
}

/// Follows a connection's first bytes against [`H2_PREFACE`].
#[derive(Debug, Default, Clone)]
pub struct Sniffer {
    matched: usize,
    verdict: Sniff,
}

impl Sniffer {
    /// Takes the next bytes; the verdict so far.
    pub fn feed(&mut self, bytes: &[u8]) -> Sniff {
        if self.verdict != Sniff::Undecided {
            return self.verdict;
        }
        let want = &H2_PREFACE[self.matched..];
        let n = want.len().min(bytes.len());
        if bytes[..n] != want[..n] {
            self.verdict = Sniff::Http1;
        } else {
            self.matched += n;
            if self.matched == H2_PREFACE.len() {
                self.verdict = Sniff::Http2;
            }
        }
        self.verdict
    }

    /// The verdict so far.
    pub fn verdict(&self) -> Sniff {
        self.verdict
    }
}

/// The limits a head is read against.
#[derive(Debug, Clone, Copy)]
pub struct HeadLimits {
    /// The most bytes a head may have, request line and final empty line included.
    pub bytes: usize,
    /// The most header lines after the request line.
    pub headers: usize,
}

/// Where a head is after some more bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// Not complete yet, and within the limits.
    Partial,
    /// Complete: its last byte is at this offset of the bytes just fed (what
    /// follows is the body, or the next request).
    Complete(usize),
    /// More header lines than the limit.
    TooManyHeaders,
    /// More bytes than the limit, with the request line complete.
    TooLarge,
    /// More bytes than the limit, all of them the request line.
    LineTooLong,
}

/// A request head being read: counts, not contents (but for the start of the
/// request line, for the log).
#[derive(Debug, Clone)]
pub struct HeadScan {
    limits: HeadLimits,
    bytes: usize,
    /// Lines ended so far, the request line included.
    lines: usize,
    /// Pieces of the current line that held anything but `\r` (0: the line
    /// is empty so far).
    line_len: usize,
    first_line: Vec<u8>,
}

impl HeadScan {
    /// A head not yet begun.
    pub fn new(limits: HeadLimits) -> Self {
        HeadScan { limits, bytes: 0, lines: 0, line_len: 0, first_line: Vec::new() }
    }

    /// Bytes read so far.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether the request line is complete.
    pub fn has_request_line(&self) -> bool {
        self.lines > 0
    }

    /// Whether any byte of the head (other than leading empty lines) came.
    pub fn begun(&self) -> bool {
        self.lines > 0 || self.line_len > 0
    }

    /// Takes the next bytes of the connection.
    ///
    /// A line ends at `\n` (with or without `\r`, as the HTTP server accepts);
    /// an empty line ends the head, except empty lines before the request
    /// line, which RFC 9112 §2.2 lets a server skip.
    pub fn feed(&mut self, chunk: &[u8]) -> Scan {
        // Line ends are found with memchr (vectorised): this runs on every
        // byte of every request head, so it must cost little more than the
        // HTTP server's own parse of the same bytes.
        let mut start = 0;
        let mut ends = memchr::memchr_iter(b'\n', chunk);
        loop {
            let (end, ended) = match ends.next() {
                Some(nl) => (nl + 1, true),
                None if start < chunk.len() => (chunk.len(), false),
                None => return Scan::Partial,
            };
            let piece = &chunk[start..end];
            start = end;
            let body = if ended { &piece[..piece.len() - 1] } else { piece };
            // Only whether the line holds anything but `\r` matters.
            self.line_len += usize::from(body.iter().any(|b| *b != b'\r'));
            if self.lines == 0 && self.first_line.len() < KEPT_LINE {
                // Kept as it came (`\r` included); cleaned when it is logged.
                let room = KEPT_LINE - self.first_line.len();
                self.first_line.extend_from_slice(&body[..room.min(body.len())]);
            }
            self.bytes += piece.len();
            if self.bytes > self.limits.bytes {
                return if self.lines == 0 { Scan::LineTooLong } else { Scan::TooLarge };
            }
            if !ended {
                return Scan::Partial;
            }
            if self.line_len == 0 {
                if self.lines == 0 {
                    continue;
                }
                return Scan::Complete(end - 1);
            }
            self.lines += 1;
            self.line_len = 0;
            if self.lines > self.limits.headers + 1 {
                return Scan::TooManyHeaders;
            }
        }
    }

    /// The method and path of the request line, as far as they came (`-`
    /// for a part that did not), for the log line of a refusal.
    pub fn method_and_path(&self) -> (String, String) {
        let line = String::from_utf8_lossy(&self.first_line);
        let mut words = line.split(' ').filter(|w| !w.is_empty());
        let clean = |w: Option<&str>| {
            w.map(|w| w.chars().filter(|c| c.is_ascii_graphic()).take(200).collect::<String>())
                .filter(|w| !w.is_empty())
                .unwrap_or_else(|| "-".into())
        };
        let method = clean(words.next());
        let path = clean(words.next().map(|p| p.split('?').next().unwrap_or(p)));
        (method, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: HeadLimits = HeadLimits { bytes: 200, headers: 3 };

    fn scan_all(bytes: &[u8], every: usize) -> (Scan, usize) {
        let mut s = HeadScan::new(LIMITS);
        let mut offset = 0;
        for piece in bytes.chunks(every) {
            match s.feed(piece) {
                Scan::Partial => offset += piece.len(),
                Scan::Complete(at) => return (Scan::Complete(offset + at), s.bytes()),
                other => return (other, s.bytes()),
            }
        }
        (Scan::Partial, s.bytes())
    }

    #[test]
    fn a_head_ends_at_its_empty_line_however_it_arrives() {
        let head = b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}";
        let end = head.len() - 3;
        for every in 1..head.len() {
            assert_eq!(scan_all(head, every).0, Scan::Complete(end), "cut every {every}");
        }
        // Bare LF line ends, and empty lines before the request line, as the server accepts them.
        let bare = b"\r\n\nGET / HTTP/1.1\nhost: x\n\n";
        assert_eq!(scan_all(bare, 4).0, Scan::Complete(bare.len() - 1));
    }

    #[test]
    fn a_partial_head_is_partial() {
        let partial = b"POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-a: ";
        let (scan, bytes) = scan_all(partial, 5);
        assert_eq!(scan, Scan::Partial);
        assert_eq!(bytes, partial.len());
        let mut s = HeadScan::new(LIMITS);
        assert!(!s.begun());
        s.feed(b"\r\n");
        assert!(!s.begun(), "a leading empty line is no head yet");
        s.feed(b"G");
        assert!(s.begun());
    }

    #[test]
    fn too_many_header_lines_or_bytes_are_seen_as_they_arrive() {
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..4 {
            many.extend(format!("x-{i}: v\r\n").as_bytes());
        }
        for every in [1, 7, many.len()] {
            assert_eq!(scan_all(&many, every).0, Scan::TooManyHeaders, "{every}");
        }
        // Three headers are allowed.
        let three = b"GET / HTTP/1.1\r\na: 1\r\nb: 2\r\nc: 3\r\n\r\n";
        assert!(matches!(scan_all(three, 3).0, Scan::Complete(_)));

        let big = [b"GET / HTTP/1.1\r\nx-big: ".as_slice(), &[b'v'; 300]].concat();
        let (scan, bytes) = scan_all(&big, 64);
        assert_eq!(scan, Scan::TooLarge);
        assert!(bytes > 200 && bytes <= 200 + 64, "seen within one read of the limit: {bytes}");
        let long = [b"GET /".as_slice(), &[b'a'; 300]].concat();
        assert_eq!(scan_all(&long, 50).0, Scan::LineTooLong);
    }

    #[test]
    fn the_request_line_names_method_and_path_for_the_log() {
        let mut s = HeadScan::new(LIMITS);
        s.feed(b"POST /v1/messages?beta=true HTTP/1.1\r\nhost");
        assert_eq!(s.method_and_path(), ("POST".into(), "/v1/messages".into()));
        let mut s = HeadScan::new(LIMITS);
        s.feed(b"GE");
        assert_eq!(s.method_and_path(), ("GE".into(), "-".into()));
        let mut s = HeadScan::new(LIMITS);
        s.feed(b"GET /a\x1b[31mb HTTP/1.1\r\n");
        assert_eq!(s.method_and_path().1, "/a[31mb", "no control characters reach the log");
    }

    #[test]
    fn the_http2_preface_is_recognised_byte_by_byte() {
        for every in 1..=H2_PREFACE.len() {
            let mut s = Sniffer::default();
            let mut last = Sniff::Undecided;
            for piece in H2_PREFACE.chunks(every) {
                last = s.feed(piece);
            }
            assert_eq!(last, Sniff::Http2, "{every}");
        }
        let mut s = Sniffer::default();
        assert_eq!(s.feed(b"P"), Sniff::Undecided);
        assert_eq!(s.feed(b"OST / HTTP/1.1\r\n"), Sniff::Http1);
        assert_eq!(s.feed(H2_PREFACE), Sniff::Http1, "decided once");
        let mut s = Sniffer::default();
        assert_eq!(s.feed(b"GET"), Sniff::Http1);
        let mut s = Sniffer::default();
        assert_eq!(s.feed(&[H2_PREFACE, b"\x00\x00"].concat()), Sniff::Http2, "frames may follow at once");
    }
}
