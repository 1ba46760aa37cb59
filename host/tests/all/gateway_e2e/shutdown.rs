//! Stopping: an open stream finishes, SIGTERM drains then cuts what is still
//! open, Ctrl-C skips the drain, a request waiting at the grace end gets a
//! 503, and systemd hears ready, reloading and stopping.

use super::*;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_an_open_stream_finish() {
    let mock = MockUpstream::start().await;
    mock.account("key-a").push(Step::SlowStream { chunk_delay_ms: 150 });
    let cfg = config(&mock.base_url(), &[("a", "KEY_A")], "").replace("[server]\n", "[server]\ndrain_ms = 200\n");
    let mut gw = Gateway::start(&cfg, &env3());
    let url = gw.url.clone();
    let stream = tokio::spawn(async move {
        let r = Gateway::client().post(format!("{url}/v1/messages")).json(&message("m", true)).send().await.unwrap();
        r.text().await.unwrap()
    });
    support::eventually("the stream is open", Duration::from_secs(10), async || {
        status(&gw).await["accounts"][0]["in_flight"] == 1
    })
    .await;
    gw.terminate();
    let text = stream.await.unwrap();
    assert!(text.trim_end().ends_with("data: {\"type\":\"message_stop\"}"), "{text}");
    let exit = tokio::task::spawn_blocking(move || gw.wait(Duration::from_secs(10))).await.unwrap();
    assert!(exit.is_some_and(|s| s.success()), "exited cleanly after the stream");
}

/// Whether a new connection to the gateway is accepted at all.
async fn accepting(gw: &Gateway) -> bool {
    tokio::net::TcpStream::connect(gw.url.trim_start_matches("http://")).await.is_ok()
}

async fn get_status(gw: &Gateway, path: &str) -> u16 {
    Gateway::client().get(format!("{}{path}", gw.url)).send().await.map_or(0, |r| r.status().as_u16())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_then_cuts_what_is_still_open_as_shutdown() {
    const DRAIN_MS: u64 = 3000;
    const GRACE_MS: u64 = 6000;
    let mock = MockUpstream::start().await;
    let a = mock.account("key-a");
    // A second between events: both streams outlast the grace period.
    a.push(Step::SlowStream { chunk_delay_ms: 1000 });
    a.push(Step::SlowStream { chunk_delay_ms: 1000 });
    let cfg = config(&mock.base_url(), &[("a", "KEY_A")], "")
        .replace("[server]\n", &format!("[server]\ndrain_ms = {DRAIN_MS}\nshutdown_grace_ms = {GRACE_MS}\n"));
    let mut gw = Gateway::start(&cfg, &env3());
    let messages = stream(&gw.url, "/v1/messages", message("claude-sonnet-4-5", true));
    let chat = stream(
        &gw.url,
        "/v1/chat/completions",
        json!({"model": "claude-sonnet-4-5", "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
    );
    support::eventually("both streams are open", Duration::from_secs(10), async || {
        status(&gw).await["accounts"][0]["in_flight"] == 2
    })
    .await;
    assert_eq!(get_status(&gw, "/readyz").await, 200);
    // A kept-alive connection, as a load balancer pools them, idle at the signal.
    let mut pooled = tokio::net::TcpStream::connect(gw.url.trim_start_matches("http://")).await.unwrap();
    let body = serde_json::to_string(&message("claude-sonnet-4-5", false)).unwrap();
    let raw = format!(
        "POST /v1/messages HTTP/1.1\r\nHost: g\r\ncontent-type: application/json\r\nanthropic-version: \
         2023-06-01\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    pooled.write_all(raw.as_bytes()).await.unwrap();
    let head = read_head(&mut pooled).await;
    assert!(head.starts_with("http/1.1 200") && !head.contains("connection: close"), "{head}");
    skip_body(&mut pooled, &head).await;

    let signalled = poolgate::clock::machine_instant();
    gw.terminate();
    // At once: not ready, so a load balancer stops sending…
    support::eventually("/readyz answers 503", Duration::from_secs(2), async || {
        get_status(&gw, "/readyz").await == 503
    })
    .await;
    // …but what it still sends during drain_ms is served, on connections that
    // then close (the client reconnects elsewhere).
    let r = post(&gw, &message("claude-sonnet-4-5", false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "connection"), "close");
    // The pooled connection was not closed under a request on its way: it
    // serves one more, and says it closes.
    pooled.write_all(raw.as_bytes()).await.unwrap();
    let head = read_head(&mut pooled).await;
    assert!(head.starts_with("http/1.1 200") && head.contains("connection: close"), "{head}");
    assert_eq!(get_status(&gw, "/healthz").await, 200);
    // All of that happened within the drain window: a new connection is
    // served only while the listener accepts (no clock bound needed, which a
    // busy machine could break).
    // Then the listener closes.
    support::eventually("the listener closes", Duration::from_secs(10), async || !accepting(&gw).await).await;
    assert!(signalled.elapsed() >= Duration::from_millis(DRAIN_MS), "not before drain_ms: {:?}", signalled.elapsed());

    // The streams go on until the grace period ends, then end with an error
    // event — Anthropic's, and on the OpenAI route OpenAI's error chunk.
    let (text, ended) = messages.await.unwrap();
    assert!(ended - signalled >= Duration::from_millis(GRACE_MS), "cut at the grace's end: {:?}", ended - signalled);
    assert!(text.contains("event: content_block_delta"), "it streamed until then: {text}");
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    assert!(last.starts_with("event: error\ndata: "), "{text}");
    let event: Value = serde_json::from_str(last.split_once("data: ").unwrap().1).unwrap();
    assert_eq!(event["error"]["type"], "api_error");
    assert!(event["error"]["message"].as_str().unwrap().contains("shutting down"), "{event}");
    let (text, _) = chat.await.unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with("data: ")).collect();
    assert_eq!(lines.last(), Some(&"data: [DONE]"), "{text}");
    let chunk: Value = serde_json::from_str(lines[lines.len() - 2].trim_start_matches("data: ")).unwrap();
    assert_eq!(chunk["error"]["type"], "server_error", "{text}");
    assert!(chunk["error"]["message"].as_str().unwrap().contains("shutting down"), "{chunk}");

    let exit = tokio::task::spawn_blocking(move || {
        let exit = gw.wait(Duration::from_secs(15));
        (exit, gw)
    });
    let (exit, gw) = exit.await.unwrap();
    assert!(exit.is_some_and(|s| s.success()), "exited cleanly");
    // Recorded as cut by the shutdown, not as clients that went away.
    let log = gw.log();
    assert_eq!(log.matches("\"outcome\":\"shutdown\"").count(), 2, "{log}");
    assert!(!log.contains("\"outcome\":\"client_gone\""), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_skips_the_drain_and_a_second_one_stops_at_once() {
    let mock = MockUpstream::start().await;
    mock.account("key-a").push(Step::SlowStream { chunk_delay_ms: 1000 });
    // The default grace (30 s) would let the stream finish.
    let mut gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], ""), &env3());
    let messages = stream(&gw.url, "/v1/messages", message("claude-sonnet-4-5", true));
    support::eventually("the stream is open", Duration::from_secs(10), async || {
        status(&gw).await["accounts"][0]["in_flight"] == 1
    })
    .await;
    gw.signal("INT");
    // No load balancer at a terminal: the listener closes at once.
    support::eventually("the listener closes", Duration::from_secs(3), async || !accepting(&gw).await).await;
    assert!(!messages.is_finished(), "the open stream goes on");
    let second = poolgate::clock::machine_instant();
    gw.signal("INT");
    let (text, ended) = messages.await.unwrap();
    assert!(text.trim_end().ends_with("shutdown grace period\"}}"), "{text}");
    // Far sooner than the grace period: at once, given a busy machine.
    assert!(ended - second < Duration::from_secs(10), "{:?}", ended - second);
    let exit = tokio::task::spawn_blocking(move || gw.wait(Duration::from_secs(15))).await.unwrap();
    assert!(exit.is_some_and(|s| s.success()));
}

/// A request still waiting for its upstream's head when the grace period
/// ends is answered — a 503 in Anthropic's shape, which an SDK retries — not
/// dropped with its connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_for_its_upstream_at_the_grace_end_gets_a_503() {
    const GRACE_MS: u64 = 1000;
    let mock = MockUpstream::start().await;
    mock.account("key-a").push(Step::Hang);
    let cfg = config(&mock.base_url(), &[("a", "KEY_A")], "")
        .replace("[server]\n", &format!("[server]\ndrain_ms = 0\nshutdown_grace_ms = {GRACE_MS}\n"));
    let mut gw = Gateway::start(&cfg, &env3());
    let url = gw.url.clone();
    let waiting = tokio::spawn(async move {
        let r = Gateway::client()
            .post(format!("{url}/v1/messages"))
            .header("anthropic-version", "2023-06-01")
            .json(&message("claude-sonnet-4-5", false))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    });
    support::eventually("the request waits upstream", Duration::from_secs(10), async || {
        status(&gw).await["accounts"][0]["in_flight"] == 1
    })
    .await;
    gw.terminate();
    let (code, body) = tokio::time::timeout(Duration::from_secs(10), waiting).await.unwrap().unwrap();
    assert_eq!(code, 503, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["type"], "api_error", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("shutting down"), "{body}");
    let exit = tokio::task::spawn_blocking(move || {
        let exit = gw.wait(Duration::from_secs(15));
        (exit, gw)
    });
    let (exit, gw) = exit.await.unwrap();
    assert!(exit.is_some_and(|s| s.success()), "exited cleanly");
    let log = gw.log();
    assert!(log.contains("\"account\":\"a\",\"outcome\":\"shutdown\""), "the attempt names its account: {log}");
    assert!(log.contains("\"status\":503,\"outcome\":\"shutdown\""), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systemd_hears_ready_reloading_and_stopping() {
    let dir = support::tempdir::Dir::new("notify");
    let path = dir.0.join("notify.sock");
    let socket = tokio::net::UnixDatagram::bind(&path).unwrap();
    let next = async || {
        let mut buf = [0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(30), socket.recv(&mut buf))
            .await
            .expect("a notification")
            .unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let cfg = config(&mock.base_url(), &[("a", "KEY_A")], "").replace("[server]\n", "[server]\ndrain_ms = 0\n");
    let socket_path = path.to_str().unwrap().to_string();
    let mut env: Vec<(&str, &str)> = env3();
    env.push(("NOTIFY_SOCKET", &socket_path));
    let mut gw = Gateway::start(&cfg, &env);
    let ready = next().await;
    assert!(ready.starts_with("READY=1\nSTATUS=poolgate listening on 127.0.0.1:"), "{ready}");
    assert!(ready.ends_with(gw.url.trim_start_matches("http://")), "{ready} names {}", gw.url);
    gw.signal("HUP");
    let reloading = next().await;
    assert!(reloading.starts_with("RELOADING=1\nMONOTONIC_USEC="), "{reloading}");
    let ready = next().await;
    assert!(ready.starts_with("READY=1\nSTATUS=serving configuration generation "), "{ready}");
    gw.terminate();
    assert!(next().await.starts_with("STOPPING=1\n"));
    let exit = tokio::task::spawn_blocking(move || gw.wait(Duration::from_secs(15))).await.unwrap();
    assert!(exit.is_some_and(|s| s.success()));
}

#[test]
fn the_example_systemd_unit_verifies() {
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/poolgate.service")).unwrap();
    let value = |key: &str| {
        unit.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix('=')).unwrap_or_else(|| panic!("no {key}"))
    };
    assert_eq!(value("Type"), "notify");
    assert_eq!(value("KillSignal"), "SIGTERM");
    // systemd must wait past the grace period, or it kills streams poolgate would end cleanly.
    let stop_s: u64 = value("TimeoutStopSec").parse().unwrap();
    let grace_ms = poolgate::config::Config::default().server.shutdown_grace_ms;
    assert!(stop_s * 1000 > grace_ms + 5_000, "TimeoutStopSec={stop_s} vs shutdown_grace_ms={grace_ms}");
    let Ok(version) = std::process::Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("skipped: systemd-analyze is not installed, so the unit is not verified");
        return;
    };
    assert!(version.status.success());
    // As installed, with the binary where the unit expects it.
    let dir = support::tempdir::Dir::new("unit");
    let path = dir.0.join("poolgate.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/poolgate", env!("CARGO_BIN_EXE_poolgate"))).unwrap();
    let out = std::process::Command::new("systemd-analyze").arg("verify").arg(&path).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // verify exits 0 on some problems (an unknown value is "ignored"): any
    // line about the unit fails.
    assert!(out.status.success(), "{said}");
    assert!(!said.lines().any(|l| l.contains("poolgate.service")), "{said}");
}

/// Reads a response head (lowercased) from `socket`.
async fn read_head(socket: &mut tokio::net::TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(socket.read(&mut byte).await.unwrap(), 1, "closed mid-head");
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).to_ascii_lowercase()
}

/// Reads the `content-length` body the head announced.
async fn skip_body(socket: &mut tokio::net::TcpStream, head: &str) {
    let len: usize =
        head.lines().find_map(|l| l.strip_prefix("content-length: ")).map(|v| v.trim().parse().unwrap()).unwrap();
    let mut body = vec![0u8; len];
    socket.read_exact(&mut body).await.unwrap();
}
