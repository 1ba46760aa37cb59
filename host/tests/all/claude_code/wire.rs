//! Raw HTTP on a socket, so that no client library normalises what the tests
//! compare: one exchange, the request Claude Code sends as bytes, and the
//! requests read back out of recorded bytes.

use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::Gateway;

/// One raw HTTP/1.1 exchange on a new connection: the status, the response
/// head's header lines (name lowercased, value as sent) and the body.
pub(super) async fn raw(gw: &Gateway, request: &[u8]) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let addr = gw.url.trim_start_matches("http://");
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), tcp.read_to_end(&mut out)).await.unwrap().unwrap();
    let split = out.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head");
    let head = String::from_utf8_lossy(&out[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.trim_start().to_string()))
        .collect();
    (status, headers, out[split + 4..].to_vec())
}

/// The values of header `name` in `headers`, in order.
pub(super) fn all<'a>(headers: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    headers.iter().filter(|(n, _)| n == name).map(|(_, v)| v.as_str()).collect()
}

/// A request as Claude Code sends one, with what a conformance harness adds:
/// `anthropic-beta` over two lines with uneven spacing and a flag no list
/// knows, an unknown `anthropic-*` header, a future `anthropic-version`; a
/// body with a field no schema knows, odd whitespace, escapes, a signed
/// thinking block, `cache_control` with a TTL and the attribution block first.
pub(super) const CC_HEADERS: &[(&str, &str)] = &[
    ("Accept", "application/json"),
    ("Content-Type", "application/json"),
    ("User-Agent", "claude-cli/2.1.332 (external, sdk-cli)"),
    ("X-Claude-Code-Session-Id", "e7402e6e-96ed-42e8-af22-768ebd2b1947"),
    ("X-Stainless-Lang", "js"),
    ("X-Stainless-Retry-Count", "0"),
    ("X-Stainless-Timeout", "600"),
    ("anthropic-beta", "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,"),
    ("anthropic-beta", " extended-cache-ttl-2025-04-11 ,  zz-conformance-probe-2099-01-01"),
    ("anthropic-dangerous-direct-browser-access", "true"),
    ("anthropic-version", "2099-01-01"),
    ("anthropic-zz-probe", "1"),
    ("x-app", "cli"),
    ("Accept-Encoding", "identity"),
];

pub(super) const CC_BODY: &str = r#"{"model":"claude-sonnet-4-5","max_tokens":32000,   "stream":false,
 "system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.332; cc_entrypoint=sdk-cli"},{"type":"text","text":"You are Claude Code, caf\u00e9 \ud83d\ude00 é","cache_control":{"type":"ephemeral","ttl":"1h"}}],
 "messages":[{"role":"user","content":[{"type":"text","text":"<system-reminder>hi</system-reminder>","cache_control":{"type":"ephemeral"}}]},
  {"role":"assistant","content":[{"type":"thinking","thinking":"Let me think.","signature":"EqQBCkYIBxgCKkBsig=="},{"type":"text","text":"ok"}]},
  {"role":"user","content":"say hi"}],
 "context_management":{"edits":[{"type":"clear_thinking_20251015","keep":"all"}]},
 "thinking":{"type":"adaptive"},
 "metadata":{"user_id":"{\"device_id\":\"d1\",\"account_uuid\":\"\",\"session_id\":\"e7402e6e-96ed-42e8-af22-768ebd2b1947\"}"},
 "zz_probe":{"a":1,"nested":[1.50,2e3,null]}}"#;

pub(super) fn cc_request(path: &str, client_key: &str, body: &str) -> Vec<u8> {
    let mut r = format!("POST {path} HTTP/1.1\r\nHost: gateway\r\n");
    for (k, v) in CC_HEADERS {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str(&format!("x-api-key: {client_key}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n", body.len()));
    let mut bytes = r.into_bytes();
    bytes.extend_from_slice(body.as_bytes());
    bytes
}

pub(super) fn sha(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The `anthropic-*` lines of a header list, in order (names lowercased).
pub(super) fn anthropic_lines(headers: &[(String, String)]) -> Vec<(String, String)> {
    headers.iter().filter(|(n, _)| n.starts_with("anthropic-")).cloned().collect()
}

/// One raw HTTP request: its request line, header lines (names lowercased)
/// and body.
pub(super) type RawRequest = (String, Vec<(String, String)>, Vec<u8>);

/// The requests in `bytes` (HTTP/1.1, `content-length` bodies).
pub(super) fn requests_in(mut bytes: &[u8]) -> Vec<RawRequest> {
    let mut out = Vec::new();
    while let Some(split) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&bytes[..split]).into_owned();
        let mut lines = head.split("\r\n");
        let line = lines.next().unwrap().to_string();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.to_ascii_lowercase(), v.trim_start().to_string()))
            .collect();
        let len: usize = all(&headers, "content-length").first().map_or(0, |v| v.parse().unwrap());
        let body = bytes[split + 4..split + 4 + len].to_vec();
        bytes = &bytes[split + 4 + len..];
        out.push((line, headers, body));
    }
    out
}
