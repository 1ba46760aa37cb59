//! Answers written straight to a socket, when the HTTP server cannot write
//! them: a head that took too long or is too large (the server never had it
//! whole), or a connection over the limit (never given to the server). Each is
//! the gateway's own answer — Anthropic's error shape, a request id, counted in
//! `poolgate_refused_total{reason}` and logged like any refusal — followed by
//! a close that does not lose it: the socket is shut for writing and what the
//! client still sends is read and dropped for a moment (closing with unread
//! bytes would send a reset, and many clients then never read the answer).
//!
//! An HTTP/2 connection gets no HTTP/1 byte: over the limit it gets the
//! protocol's own refusal (SETTINGS, then GOAWAY `ENHANCE_YOUR_CALM`).

use std::time::{Duration, Instant};

use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use futures_util::FutureExt as _;
use http::{HeaderValue, Method, StatusCode, header};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use super::head::{H2_PREFACE, HeadLimits, HeadScan, Scan, Sniff, Sniffer};
use crate::gateway::Gateway;
use crate::gateway::request::errors::{ErrorType, error, final_error};
use crate::gateway::request::finish::Early;

/// How long a refused connection is read from (and what it sends dropped)
/// after the answer, so the client can read the answer instead of a reset.
pub const LINGER: Duration = Duration::from_secs(2);

/// The most bytes dropped while lingering.
const LINGER_BYTES: usize = 16 << 20;

/// How long a connection over the limit may take to show its request line
/// (or the HTTP/2 preface) before it is closed without an answer.
pub const OVER_LIMIT_READ: Duration = Duration::from_secs(1);

/// A refusal: what it answers and why.
pub struct Refusal {
    /// The status.
    pub status: StatusCode,
    /// The `error.type`.
    pub kind: ErrorType,
    /// The reason counted in `poolgate_refused_total` and shown nowhere else.
    pub reason: &'static str,
    /// The message.
    pub message: String,
    /// Whether retrying cannot help (`x-should-retry: false`).
    pub is_final: bool,
    /// `retry-after` seconds, if any.
    pub retry_after_s: Option<u64>,
}

/// The bytes of `refusal` as an HTTP/1.1 answer that closes the connection:
/// counted, logged and given a request id as [`Early::refuse`] does for every
/// refusal; `method` and `path` name the request in the log as far as it came.
pub fn answer(gw: &Gateway, refusal: Refusal, method: &str, path: &str, started: Instant) -> Bytes {
    let Refusal { status, kind, reason, message, is_final, retry_after_s } = refusal;
    let mut r = if is_final { final_error(status, kind, &message) } else { error(status, kind, &message) };
    if let Some(s) = retry_after_s {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    let method = Method::from_bytes(method.as_bytes()).unwrap_or_else(|_| Method::from_bytes(b"-").expect("a token"));
    let early = Early { id: gw.next_request_id(), method: &method, path, started };
    wire(early.refuse(gw, reason, r))
}

/// `r` as HTTP/1.1 bytes, with `content-length` and `connection: close`. The
/// body must be whole already (the gateway's own error bodies are).
pub fn wire(r: Response) -> Bytes {
    let (parts, body) = r.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20).now_or_never().and_then(Result::ok).unwrap_or_default();
    let mut out = BytesMut::with_capacity(256 + body.len());
    let reason = parts.status.canonical_reason().unwrap_or("");
    out.put_slice(format!("HTTP/1.1 {} {reason}\r\n", parts.status.as_u16()).as_bytes());
    for (name, value) in &parts.headers {
        if name == header::CONNECTION || name == header::CONTENT_LENGTH {
            continue;
        }
        out.put_slice(name.as_str().as_bytes());
        out.put_slice(b": ");
        out.put_slice(value.as_bytes());
        out.put_slice(b"\r\n");
    }
    out.put_slice(format!("content-length: {}\r\nconnection: close\r\n\r\n", body.len()).as_bytes());
    out.put_slice(&body);
    out.freeze()
}

/// Writes `bytes`, shuts the socket for writing and reads what the client
/// still sends for up to [`LINGER`], then lets it close.
pub async fn send<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, bytes: Bytes) {
    let _ = tokio::time::timeout(LINGER, async {
        stream.write_all(&bytes).await?;
        stream.shutdown().await?;
        let mut sink = vec![0u8; 16 << 10];
        let mut dropped = 0;
        while dropped < LINGER_BYTES {
            match stream.read(&mut sink).await? {
                0 => break,
                n => dropped += n,
            }
        }
        Ok::<(), std::io::Error>(())
    })
    .await;
}

/// An HTTP/2 refusal of a whole connection: the server preface (an empty
/// SETTINGS frame), then GOAWAY with no stream processed, so the client knows
/// nothing it sent was acted on.
pub fn h2_goaway(debug: &str) -> Bytes {
    const ENHANCE_YOUR_CALM: u32 = 0xb;
    let mut out = BytesMut::with_capacity(9 + 9 + 8 + debug.len());
    // SETTINGS: length 0, type 0x4, no flags, stream 0.
    out.put_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
    let len = 8 + debug.len() as u32;
    out.put_slice(&len.to_be_bytes()[1..]);
    out.put_slice(&[0x7, 0]);
    out.put_u32(0); // stream 0
    out.put_u32(0); // last stream id: none processed
    out.put_u32(ENHANCE_YOUR_CALM);
    out.put_slice(debug.as_bytes());
    out.freeze()
}

/// Refuses a connection over the limit: reads its first bytes (briefly) to
/// tell HTTP/2 from HTTP/1, then answers each in its own protocol — a 503 in
/// Anthropic's shape for HTTP/1 — and closes.
pub async fn over_limit<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, gw: &Gateway, limit: usize) {
    let started = gw.clock.instant();
    let mut sniff = Sniffer::default();
    let mut scan = HeadScan::new(HeadLimits { bytes: 4096, headers: 0 });
    let mut buf = [0u8; 1024];
    let _ = tokio::time::timeout(OVER_LIMIT_READ, async {
        loop {
            let n = stream.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                return;
            }
            let verdict = sniff.feed(&buf[..n]);
            let scanned = scan.feed(&buf[..n]);
            // The request line is enough to answer (and log) an HTTP/1 client.
            if verdict == Sniff::Http2
                || (verdict == Sniff::Http1 && (scanned != Scan::Partial || scan.has_request_line()))
            {
                return;
            }
        }
    })
    .await;
    let bytes = match sniff.verdict() {
        Sniff::Http2 => {
            gw.metrics.refused("too_many_connections");
            h2_goaway("poolgate: too many open connections")
        }
        Sniff::Http1 => {
            let (method, path) = scan.method_and_path();
            let refusal = Refusal {
                status: StatusCode::SERVICE_UNAVAILABLE,
                kind: ErrorType::Overloaded,
                reason: "too_many_connections",
                message: format!(
                    "poolgate: too many open connections ({limit}: server.max_connections); retry shortly"
                ),
                is_final: false,
                retry_after_s: Some(1),
            };
            answer(gw, refusal, &method, &path, started)
        }
        // Nothing that says which protocol: nothing to answer.
        Sniff::Undecided => {
            gw.metrics.refused("too_many_connections");
            return;
        }
    };
    send(stream, bytes).await;
}

/// Whether `bytes` could still be the start of the HTTP/2 preface.
pub fn maybe_h2(bytes: &[u8]) -> bool {
    let n = bytes.len().min(H2_PREFACE.len());
    bytes[..n] == H2_PREFACE[..n]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_on_the_wire_is_the_whole_response_and_closes() {
        let mut r = error(StatusCode::REQUEST_TIMEOUT, ErrorType::InvalidRequest, "slow");
        r.headers_mut().insert("x-poolgate-request-id", HeaderValue::from(7));
        r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        let bytes = wire(r);
        let text = std::str::from_utf8(&bytes).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 408 Request Timeout\r\n"), "{head}");
        assert!(head.contains("\r\nx-poolgate-request-id: 7\r\n"), "{head}");
        assert!(head.contains("\r\ncontent-type: application/json\r\n"), "{head}");
        assert!(head.contains(&format!("\r\ncontent-length: {}\r\n", body.len())), "{head}");
        assert_eq!(head.matches("connection:").count(), 1, "{head}");
        assert!(head.ends_with("connection: close"), "{head}");
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["message"], "slow");
    }

    #[test]
    fn the_http2_refusal_is_settings_then_goaway() {
        let b = h2_goaway("why");
        assert_eq!(&b[..9], &[0, 0, 0, 4, 0, 0, 0, 0, 0], "an empty SETTINGS frame first");
        let goaway = &b[9..];
        assert_eq!(&goaway[..3], &[0, 0, 11], "length: last stream, code, debug");
        assert_eq!(goaway[3], 7, "GOAWAY");
        assert_eq!(&goaway[5..9], &[0, 0, 0, 0], "on stream 0");
        assert_eq!(&goaway[9..13], &[0, 0, 0, 0], "no stream processed");
        assert_eq!(&goaway[13..17], &[0, 0, 0, 0xb], "ENHANCE_YOUR_CALM");
        assert_eq!(&goaway[17..], b"why");
        assert!(maybe_h2(b"PRI *") && !maybe_h2(b"POST") && maybe_h2(b""));
    }

    #[tokio::test]
    async fn a_refusal_is_read_whole_even_while_the_client_is_still_sending() {
        let (mut client, server) = tokio::io::duplex(4096);
        let answer = Bytes::from_static(b"HTTP/1.1 431 x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        let sent = tokio::spawn(send(server, answer.clone()));
        // The client keeps writing far more than the pipe holds; the server drops it.
        let writer = tokio::spawn(async move {
            let junk = vec![b'v'; 1 << 20];
            client.write_all(&junk).await.unwrap();
            let mut got = Vec::new();
            client.read_to_end(&mut got).await.unwrap();
            got
        });
        assert_eq!(writer.await.unwrap(), answer);
        sent.await.unwrap();
    }
}
