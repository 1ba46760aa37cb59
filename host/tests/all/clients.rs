//! Clients that do not keep up with their answer, through the real binary
//! against the mock upstream: one that stops reading a stream (its window
//! full) and one that goes away in the middle of it. Either way the gateway
//! holds a bounded amount for the stream, and the upstream request is
//! cancelled — its connection closed, the account's in-flight slot released —
//! and the request recorded as it ended (docs/clients.md).

use crate::support::{self, Gateway, config, message};

use std::time::Duration;

use poolgate_mock_upstream::{MockUpstream, Step};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// `server.send_timeout_ms` in these tests.
const SEND_TIMEOUT_MS: u64 = 2000;

/// What the gateway may grow by, KiB, while one client reads none of a
/// stream the upstream would send 24 MiB of: the bound docs/clients.md states
/// for one stream (about 3 MiB: the client's write queue, the upstream read
/// buffer, one event) with room for the allocator's rounding.
const STALLED_GROWTH_KIB: u64 = 8 << 10;

fn env() -> Vec<(&'static str, &'static str)> {
    vec![("KEY_A", "key-a"), ("PG_ADMIN", "admin")]
}

async fn metrics(gw: &Gateway) -> String {
    Gateway::client().get(format!("{}/metrics", gw.url)).send().await.unwrap().text().await.unwrap()
}

/// The value of the series `name` (with its labels) in a metrics text.
fn value(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

/// The gateway's resident memory, KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap();
    line.trim().trim_end_matches("kB").trim().parse().unwrap()
}

/// A streamed Messages request as HTTP/1.1 bytes.
fn streamed_request() -> Vec<u8> {
    let body = serde_json::to_vec(&message("claude-sonnet-4-5", true)).unwrap();
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nanthropic-version: 2023-06-01\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    [head.into_bytes(), body].concat()
}

/// Reads until `needle` has arrived (within `limit`); what was read.
async fn read_until(socket: &mut TcpStream, needle: &[u8], limit: Duration) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let found = tokio::time::timeout(limit, async {
        while !got.windows(needle.len()).any(|w| w == needle) {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        true
    })
    .await;
    assert!(found == Ok(true), "{:?} not within {limit:?}: {:?}", String::from_utf8_lossy(needle), got.len());
    got
}

/// The gateway's last decision record.
async fn last_record(gw: &Gateway) -> Value {
    gw.admin_json("/admin/decisions?limit=1", "admin").await[0].clone()
}

/// Waits until the mock has no connection open (and had one), and says how
/// long after `since` that was.
async fn upstream_closed(mock: &MockUpstream, since: std::time::Instant, limit: Duration) -> Duration {
    support::eventually("the upstream connection is closed", limit, async || {
        let c = mock.connections();
        c.opened > 0 && c.open == 0
    })
    .await;
    since.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_after_the_send_timeout_and_its_upstream_cancelled() {
    let mock = MockUpstream::start().await;
    // 24 MiB of answer, far more than the sockets on the way hold (about
    // 8 MiB here: the client's small window, the gateway's send buffer, the
    // mock's).
    mock.account("key-a").set_default(Step::LongStream { deltas: 6 << 10, delta_bytes: 4 << 10 });
    let cfg = config(&mock.base_url(), &[("a", "KEY_A")], "")
        .replace("[server]\n", &format!("[server]\nsend_timeout_ms = {SEND_TIMEOUT_MS}\n"));
    let gw = Gateway::start(&cfg, &env());
    let addr = gw.url.trim_start_matches("http://").parse().unwrap();
    // Warmed by a scrape (not by the upstream: its pooled connection would
    // stay open and blur what the mock counts).
    let m = metrics(&gw).await;
    assert_eq!(value(&m, "poolgate_send_timeouts_total"), Some(0.0), "exported at zero from the start: {m}");
    let before = rss_kib(gw.pid());

    // A client with a small receive window that reads the head and the first
    // delta, then nothing.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut socket = socket.connect(addr).await.unwrap();
    socket.write_all(&streamed_request()).await.unwrap();
    let head = read_until(&mut socket, b"event: content_block_delta", Duration::from_secs(10)).await;
    assert!(head.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&head[..head.len().min(200)]));
    // The gateway's last byte taken is about now (the window this read
    // opened fills at once).
    let stopped = poolgate::clock::machine_instant();

    // While it reads nothing the gateway holds a bounded amount…
    let mut peak = before;
    while stopped.elapsed() < Duration::from_millis(SEND_TIMEOUT_MS - 300) {
        peak = peak.max(rss_kib(gw.pid()));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let grew = peak.saturating_sub(before);
    eprintln!("a stalled stream: RSS {before} KiB before, peak {peak} KiB (+{grew} KiB)");
    assert!(grew < STALLED_GROWTH_KIB, "the gateway grew by {grew} KiB for one stalled stream");
    assert_eq!(mock.connections().open, 1, "the upstream is held while the client may still read");
    // …and once the client has taken no byte for send_timeout_ms, the
    // upstream request is cancelled.
    let limit = Duration::from_millis(SEND_TIMEOUT_MS + 8000);
    let closed_after = upstream_closed(&mock, stopped, limit).await;
    eprintln!("upstream closed {closed_after:?} after the client's last read");
    assert!(closed_after >= Duration::from_millis(SEND_TIMEOUT_MS - 100), "cancelled early: {closed_after:?}");
    assert!(closed_after < Duration::from_millis(SEND_TIMEOUT_MS + 3000), "cancelled late: {closed_after:?}");

    // The client, reading at last, finds the answer ended, not hanging.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = vec![0u8; 1 << 16];
        while let Ok(n) = socket.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the client's connection was not closed");

    support::eventually("the account's in-flight count is back to 0", Duration::from_secs(5), async || {
        value(&metrics(&gw).await, "poolgate_in_flight{account=\"a\"}") == Some(0.0)
    })
    .await;
    let m = metrics(&gw).await;
    assert_eq!(value(&m, "poolgate_send_timeouts_total"), Some(1.0), "{m}");
    let record = last_record(&gw).await;
    assert_eq!((record["status"].as_u64(), record["outcome"].as_str()), (Some(200), Some("send_timeout")), "{record}");
    assert!(gw.log().contains("server.send_timeout_ms"), "the log says why: {}", gw.log());
    assert_eq!(mock.requests().len(), 1, "one upstream request, not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_mid_stream_cancels_its_upstream_at_once() {
    // 20 s of stream: an event every 20 ms.
    let mock =
        MockUpstream::start_with(poolgate_mock_upstream::Config { chunk_delay_ms: 20, ..Default::default() }).await;
    mock.account("key-a").set_default(Step::LongStream { deltas: 1000, delta_bytes: 64 });
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], ""), &env());
    let addr = gw.url.trim_start_matches("http://").to_string();

    let mut socket = TcpStream::connect(&addr).await.unwrap();
    socket.write_all(&streamed_request()).await.unwrap();
    let head = read_until(&mut socket, b"event: content_block_delta", Duration::from_secs(10)).await;
    assert!(head.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&head));
    assert_eq!(mock.connections().open, 1, "the stream is on its way");
    let gone = poolgate::clock::machine_instant();
    drop(socket);
    let after = upstream_closed(&mock, gone, Duration::from_secs(5)).await;
    eprintln!("a client gone mid-stream: upstream closed after {after:?}");
    assert!(after < Duration::from_millis(500), "the upstream request outlived its client by {after:?}");

    support::eventually("the account's in-flight count is back to 0", Duration::from_secs(5), async || {
        value(&metrics(&gw).await, "poolgate_in_flight{account=\"a\"}") == Some(0.0)
    })
    .await;
    let record = last_record(&gw).await;
    assert_eq!((record["status"].as_u64(), record["outcome"].as_str()), (Some(200), Some("client_gone")), "{record}");
    assert_eq!(value(&metrics(&gw).await, "poolgate_send_timeouts_total"), Some(0.0));
}

/// Open HTTP/1 streams the memory test holds: a first batch that pays for
/// what the first streams grow once (pools, arenas, tables), then the
/// measured batch, whose growth is what a stream holds.
const FIRST_STREAMS: usize = 300;
const MEASURED_STREAMS: usize = 1500;

/// What one open HTTP/1 stream may hold, KiB of the gateway's resident
/// memory: its client connection (hyper's buffers, the guard), its upstream
/// connection and the relay. In a debug build this test read 44 KiB a stream
/// (three runs) while hyper-util's protocol detection doubled every HTTP/1
/// connection's read buffer to 16 KiB, and 38-39 since the server reads each
/// head whole (2026-12-07, #30).
const STREAM_KIB: u64 = 41;

/// Opens `n` slow streams through `addr`, each read to its first event.
async fn open_streams(addr: &str, n: usize) -> Vec<TcpStream> {
    let mut open = Vec::with_capacity(n);
    for _ in 0..n {
        let addr = addr.to_string();
        open.push(tokio::spawn(async move {
            let mut socket = TcpStream::connect(&addr).await.unwrap();
            socket.write_all(&streamed_request()).await.unwrap();
            let head = read_until(&mut socket, b"event: message_start", Duration::from_secs(20)).await;
            assert!(head.starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&head));
            socket
        }));
    }
    let mut sockets = Vec::with_capacity(n);
    for s in open {
        sockets.push(s.await.unwrap());
    }
    sockets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_stream_holds_a_bounded_amount_of_memory() {
    // ~26 s a stream: all of them open while the memory is read.
    let mock = MockUpstream::start().await;
    mock.account("key-a").set_default(Step::SlowStream { chunk_delay_ms: 2000 });
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], ""), &env());
    let addr = gw.url.trim_start_matches("http://").to_string();
    let first = open_streams(&addr, FIRST_STREAMS).await;
    let before = rss_kib(gw.pid());
    let measured = open_streams(&addr, MEASURED_STREAMS).await;
    let held = rss_kib(gw.pid());
    let per_stream = held.saturating_sub(before) / MEASURED_STREAMS as u64;
    eprintln!("{MEASURED_STREAMS} more open HTTP/1 streams: RSS {before} -> {held} KiB, {per_stream} KiB a stream");
    assert!(per_stream <= STREAM_KIB, "an open stream holds {per_stream} KiB of the gateway's memory");
    drop((first, measured));
}
