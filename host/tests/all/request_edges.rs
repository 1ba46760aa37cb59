//! The edges of a client request, through the real binary against the mock
//! upstream: which client headers reach an account (an allow-list), how large a
//! head may be (431, however large), what a POST body must be (415), how long a
//! head or a body may take (408) and how many connections one client may hold
//! (503; HTTP/2 gets GOAWAY) — each refusal in Anthropic's error shape, with a
//! request id, and counted.

use crate::support;

use std::time::{Duration, Instant};

use futures_util::FutureExt as _;
use poolgate_mock_upstream::MockUpstream;
use serde_json::Value;
use support::{Gateway, config, message};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

fn env() -> Vec<(&'static str, &'static str)> {
    vec![("KEY_A", "key-a"), ("PG_ADMIN", "admin")]
}

async fn metrics(gw: &Gateway) -> String {
    Gateway::client().get(format!("{}/metrics", gw.url)).send().await.unwrap().text().await.unwrap()
}

/// Asserts `r` is a refusal with `status` in Anthropic's shape and a request id.
async fn refused(r: reqwest::Response, status: u16) -> String {
    assert_eq!(r.status().as_u16(), status);
    assert!(r.headers().get("x-poolgate-request-id").is_some(), "{status} carries the request id");
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("application/json"));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    body["error"]["message"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_allowed_client_headers_reach_the_account() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let extra = "[gateway]\nforward_headers = [\"x-team-*\", \"x-trace\"]\n";
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], extra), &env());
    let sent = [
        ("anthropic-version", "2023-06-01"),
        ("anthropic-beta", "interleaved-thinking-2025-05-14"),
        ("anthropic-dangerous-direct-browser-access", "true"),
        ("x-stainless-os", "Linux"),
        ("x-app", "cli"),
        ("user-agent", "claude-cli/2.0.0 (external, cli)"),
        ("x-claude-code-session-id", "sess-1"),
        ("x-team-id", "7"),
        ("x-trace", "t-1"),
        ("cookie", "session=secret-cookie"),
        ("x-forwarded-for", "10.1.2.3"),
        ("x-forwarded-proto", "https"),
        ("forwarded", "for=10.1.2.3"),
        ("x-real-ip", "10.1.2.3"),
        ("via", "1.1 corp-proxy"),
        ("x-foo", "random"),
        ("x-poolgate-debug", "1"),
        ("authorization", "Bearer client-key"),
    ];
    let mut rq = Gateway::client().post(format!("{}/v1/messages", gw.url)).json(&message("claude-sonnet-4-5", false));
    for (k, v) in sent {
        rq = rq.header(k, v);
    }
    assert_eq!(rq.send().await.unwrap().status(), 200);
    let rec = mock.requests().pop().unwrap();
    for kept in [
        "anthropic-version",
        "anthropic-beta",
        "anthropic-dangerous-direct-browser-access",
        "x-stainless-os",
        "x-app",
        "user-agent",
        "x-claude-code-session-id",
        "x-team-id",
        "x-trace",
    ] {
        let want = sent.iter().find(|(k, _)| *k == kept).unwrap().1;
        assert_eq!(rec.header(kept), Some(want), "{kept} is forwarded: {:?}", rec.headers);
    }
    for gone in ["cookie", "x-forwarded-for", "x-forwarded-proto", "forwarded", "x-real-ip", "via", "x-foo"] {
        assert_eq!(rec.header(gone), None, "{gone} is stripped: {:?}", rec.headers);
    }
    assert_eq!(rec.header("x-poolgate-debug"), None);
    assert_eq!(rec.header("x-api-key"), Some("key-a"), "the account's credential, not the client's");
    assert_eq!(rec.header("authorization"), None);

    // An addition as wide as `x-*` forwards x-foo, but what is never
    // forwarded still stays.
    let extra = "[gateway]\nforward_headers = [\"x-*\"]\n";
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], extra), &env());
    let mut rq = Gateway::client().post(format!("{}/v1/messages", gw.url)).json(&message("claude-sonnet-4-5", false));
    for (k, v) in sent {
        rq = rq.header(k, v);
    }
    assert_eq!(rq.send().await.unwrap().status(), 200);
    let rec = mock.requests().pop().unwrap();
    assert_eq!(rec.header("x-foo"), Some("random"));
    for gone in ["x-forwarded-for", "x-forwarded-proto", "x-real-ip", "x-poolgate-debug", "cookie"] {
        assert_eq!(rec.header(gone), None, "{gone} is never forwarded: {:?}", rec.headers);
    }
    assert_eq!(rec.header("x-api-key"), Some("key-a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_over_the_limit_is_a_431_in_anthropics_shape() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], ""), &env());
    let send = |bytes: usize| {
        Gateway::client()
            .post(format!("{}/v1/messages", gw.url))
            .header("x-big", "v".repeat(bytes))
            .json(&message("m", false))
            .send()
    };
    // 32 KiB by default: 40 KB is over it, and so are 512 KB and 4 MiB (past
    // what the HTTP server buffers) — all get poolgate's own answer, not the
    // HTTP server's empty one.
    for size in [40_000, 512 << 10, 4 << 20] {
        let why = refused(send(size).await.unwrap(), 431).await;
        assert!(why.contains("32768 bytes: server.max_header_bytes"), "{why}");
    }
    // So do 1,500 headers (the HTTP server's own limit is 1,000).
    let mut many = Gateway::client().post(format!("{}/v1/messages", gw.url)).json(&message("m", false));
    for i in 0..1500 {
        many = many.header(format!("x-h-{i}"), "v");
    }
    let why = refused(many.send().await.unwrap(), 431).await;
    assert!(why.contains("more than 100 headers"), "{why}");
    assert_eq!(send(20_000).await.unwrap().status(), 200, "under the limit");
    let m = metrics(&gw).await;
    assert!(m.contains("poolgate_refused_total{reason=\"headers_too_large\"} 3"), "{m}");
    assert!(m.contains("poolgate_refused_total{reason=\"too_many_headers\"} 1"), "{m}");
    assert_eq!(mock.requests().len(), 1);

    // The limit is the configured one.
    let cfg =
        config(&mock.base_url(), &[("a", "KEY_A")], "").replace("[server]\n", "[server]\nmax_header_bytes = 65536\n");
    let gw = Gateway::start(&cfg, &env());
    let r = Gateway::client()
        .post(format!("{}/v1/messages", gw.url))
        .header("x-big", "v".repeat(40_000))
        .json(&message("m", false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = Gateway::client()
        .post(format!("{}/v1/messages", gw.url))
        .header("x-big", "v".repeat(70_000))
        .json(&message("m", false))
        .send()
        .await
        .unwrap();
    refused(r, 431).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_body_must_be_declared_json() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], ""), &env());
    let body = message("m", false).to_string();
    let post = |content_type: Option<&str>| {
        let rq = Gateway::client().post(format!("{}/v1/messages", gw.url)).body(body.clone());
        match content_type {
            Some(t) => rq.header("content-type", t),
            None => rq,
        }
        .send()
    };
    let message = refused(post(Some("text/plain")).await.unwrap(), 415).await;
    assert!(message.contains("application/json") && message.contains("text/plain"), "{message}");
    refused(post(Some("application/x-www-form-urlencoded")).await.unwrap(), 415).await;
    refused(post(None).await.unwrap(), 415).await;
    assert!(mock.requests().is_empty(), "none reached an account");
    for accepted in ["application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8"] {
        assert_eq!(post(Some(accepted)).await.unwrap().status(), 200, "{accepted}");
    }
    // A GET has no body to judge.
    assert_eq!(Gateway::client().get(format!("{}/v1/models", gw.url)).send().await.unwrap().status(), 200);
    assert!(metrics(&gw).await.contains("poolgate_refused_total{reason=\"unsupported_media_type\"} 3"));
}

/// A body that is not one valid UTF-8 JSON object — empty, not UTF-8, not an
/// object — is refused with a 400 in the API's own shape and never reaches
/// an account (docs/errors.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_is_not_a_json_object_is_refused_and_never_forwarded() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let gw = Gateway::start(&config(&mock.base_url(), &[("a", "KEY_A")], ""), &env());
    let post = |path: &'static str, body: Vec<u8>| {
        Gateway::client()
            .post(format!("{}{path}", gw.url))
            .header("content-type", "application/json")
            .header("anthropic-version", "2023-06-01")
            .body(body)
            .send()
    };
    let not_utf8 =
        b"{\"model\":\"claude-sonnet-4-5\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}";
    for (path, body, says) in [
        ("/v1/messages", Vec::new(), "body is empty"),
        ("/v1/messages", b"  \n".to_vec(), "body is empty"),
        ("/v1/messages", not_utf8.to_vec(), "body is not valid UTF-8"),
        ("/v1/messages", b"[1]".to_vec(), "body: Input should be a valid dictionary"),
        ("/v1/messages", br#"["claude-sonnet-4-5",true,null]"#.to_vec(), "body: Input should be a valid dictionary"),
        ("/v1/messages/count_tokens", Vec::new(), "body is empty"),
    ] {
        let message = refused(post(path, body).await.unwrap(), 400).await;
        assert!(message.starts_with(says), "{path}: {message}");
    }
    // The OpenAI route refuses in OpenAI's shape.
    let r = post("/v1/chat/completions", Vec::new()).await.unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert!(mock.requests().is_empty(), "nothing was forwarded");
    assert!(metrics(&gw).await.contains("poolgate_refused_total{reason=\"invalid_body\"} 6"), "{}", metrics(&gw).await);
}

/// What the gateway writes on a raw socket until it closes it, and when the
/// first byte came (`None`: it closed without a byte, or not within `limit`).
async fn answer_on(mut socket: TcpStream, limit: Duration) -> (Vec<u8>, Option<Instant>) {
    let mut out = Vec::new();
    let mut first = None;
    let mut buf = [0u8; 4096];
    let _ = tokio::time::timeout(limit, async {
        while let Ok(n) = socket.read(&mut buf).await {
            if n == 0 {
                break;
            }
            first.get_or_insert_with(poolgate::clock::machine_instant);
            out.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    (out, first)
}

/// The status, the head (lowercase) and the JSON body of one HTTP/1.1 answer.
fn parse_answer(bytes: &[u8]) -> (u16, String, Value) {
    let text = String::from_utf8_lossy(bytes);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no whole answer: {text:?}"));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, head.to_ascii_lowercase(), serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Median time of `n` fresh-connection requests made by `send`.
async fn median<F: Future<Output = reqwest::Response>>(n: usize, mut send: impl FnMut() -> F) -> Duration {
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let started = poolgate::clock::machine_instant();
        let r = send().await;
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        times.push(started.elapsed());
    }
    times.sort();
    times[n / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_sockets_neither_delay_other_clients_nor_outlive_their_timeouts() {
    const HEADS: usize = 300;
    const BODIES: usize = 50;
    const SILENT: usize = 10;
    const TIMEOUT_MS: u64 = 5000;
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let cfg = config(&mock.base_url(), &[("a", "KEY_A")], "").replace(
        "[server]\n",
        &format!("[server]\nheader_timeout_ms = {TIMEOUT_MS}\nbody_timeout_ms = {TIMEOUT_MS}\n"),
    );
    // 1024 descriptors, as a default shell gives: the 350 held sockets and the
    // valid requests must all fit, and the gateway says what it derived.
    let gw = Gateway::start_with_open_files(&cfg, &env(), 1024);
    assert!(gw.log().contains("client connections: at most 448 open; open-file limit 1024"), "{}", gw.log());
    let addr = gw.url.trim_start_matches("http://").to_string();
    // A new connection for each request: each goes through the listener.
    poolgate::https::install_crypto();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).pool_max_idle_per_host(0).build().unwrap();
    let messages = || {
        client
            .post(format!("{}/v1/messages", gw.url))
            .header("anthropic-version", "2023-06-01")
            .json(&message("claude-sonnet-4-5", false))
            .send()
            .map(Result::unwrap)
    };
    let healthz = || client.get(format!("{}/healthz", gw.url)).send().map(Result::unwrap);
    let quiet = (median(9, messages).await, median(9, healthz).await);

    let held = poolgate::clock::machine_instant();
    let mut sockets = Vec::new();
    for _ in 0..HEADS {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-slow: ")
            .await
            .unwrap();
        sockets.push(("head", poolgate::clock::machine_instant(), s));
    }
    for _ in 0..BODIES {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        let head = "POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
                    anthropic-version: 2023-06-01\r\ncontent-length: 1000\r\n\r\n{\"model\": \"claude";
        s.write_all(head.as_bytes()).await.unwrap();
        sockets.push(("body", poolgate::clock::machine_instant(), s));
    }
    // Connections that send nothing at all: closed without an answer.
    let mut silent = Vec::new();
    for _ in 0..SILENT {
        silent.push((poolgate::clock::machine_instant(), TcpStream::connect(&addr).await.unwrap()));
    }
    let busy = (median(9, messages).await, median(9, healthz).await);
    assert!(held.elapsed() < Duration::from_millis(TIMEOUT_MS), "measured while every socket was held");
    eprintln!("median request / healthz: {quiet:?} quiet, {busy:?} with {HEADS} heads and {BODIES} bodies held");
    // 100 ms is the bound asked for; a median of nine keeps one slow request
    // on a busy machine from deciding it.
    let bound = Duration::from_millis(100);
    assert!(busy.0 <= quiet.0 + bound, "a request took {:?} with the sockets held, {:?} without", busy.0, quiet.0);
    assert!(busy.1 <= quiet.1 + bound, "/healthz took {:?} with the sockets held, {:?} without", busy.1, quiet.1);

    // Every held socket is answered 408 when its timeout runs out — not
    // before — and closed.
    let answers = futures_util::future::join_all(sockets.into_iter().map(|(what, since, s)| async move {
        let (bytes, first) = answer_on(s, Duration::from_secs(30)).await;
        (what, first.map(|f| f - since), bytes)
    }))
    .await;
    for (what, after, bytes) in answers {
        let after = after.unwrap_or_else(|| panic!("a held {what} got no answer"));
        assert!(after >= Duration::from_millis(TIMEOUT_MS - 50), "a held {what} was answered after {after:?}");
        let (status, head, body) = parse_answer(&bytes);
        assert_eq!(status, 408, "{head}");
        assert!(head.contains("\r\nconnection: close") && head.contains("x-poolgate-request-id: "), "{head}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        let key = if what == "head" { "server.header_timeout_ms" } else { "server.body_timeout_ms" };
        assert!(body["error"]["message"].as_str().unwrap().contains(key), "{body}");
    }
    for (since, s) in silent {
        let (bytes, _) = answer_on(s, Duration::from_secs(30)).await;
        assert!(bytes.is_empty(), "a silent connection is closed without an answer: {bytes:?}");
        assert!(since.elapsed() >= Duration::from_millis(TIMEOUT_MS - 50), "closed after {:?}", since.elapsed());
    }
    let m = metrics(&gw).await;
    assert!(m.contains(&format!("poolgate_refused_total{{reason=\"head_timeout\"}} {HEADS}")), "{m}");
    assert!(m.contains(&format!("poolgate_idle_connections_closed_total {SILENT}\n")), "{m}");
    assert!(m.contains(&format!("poolgate_refused_total{{reason=\"body_timeout\"}} {BODIES}")), "{m}");
    assert!(m.contains("poolgate_client_connections_limit{} 448"), "{m}");
    assert_eq!(mock.requests().len(), 18, "only the valid requests reached the account");
}

/// The frames of an HTTP/2 connection as (type, payload), answering its
/// pings, until it closes or `limit` passes.
async fn h2_frames(mut socket: TcpStream, limit: Duration) -> Vec<(u8, Vec<u8>)> {
    let mut frames = Vec::new();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let _ = tokio::time::timeout(limit, async {
        while let Ok(n) = socket.read(&mut chunk).await {
            if n == 0 {
                return;
            }
            buf.extend_from_slice(&chunk[..n]);
            while buf.len() >= 9 {
                let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]) as usize;
                if buf.len() < 9 + len {
                    break;
                }
                let (kind, flags) = (buf[3], buf[4]);
                let payload = buf[9..9 + len].to_vec();
                buf.drain(..9 + len);
                if kind == 6 && flags & 1 == 0 {
                    let mut ack = vec![0, 0, 8, 6, 1, 0, 0, 0, 0];
                    ack.extend_from_slice(&payload);
                    let _ = socket.write_all(&ack).await;
                }
                frames.push((kind, payload));
            }
        }
    })
    .await;
    frames
}

const H2_START: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_are_refused_each_in_its_own_protocol() {
    const LIMIT: usize = 4;
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let cfg = config(&mock.base_url(), &[("a", "KEY_A")], "").replace(
        "[server]\n",
        &format!("[server]\nmax_connections = {LIMIT}\nheader_timeout_ms = 5000\nidle_timeout_ms = 1000\n"),
    );
    let gw = Gateway::start(&cfg, &env());
    let addr = gw.url.trim_start_matches("http://").to_string();
    // HTTP/2 with prior knowledge is served through the guard like HTTP/1.
    poolgate::https::install_crypto();
    let h2 = reqwest::Client::builder().timeout(Duration::from_secs(10)).http2_prior_knowledge().build().unwrap();
    let r = h2.post(format!("{}/v1/messages", gw.url)).json(&message("claude-sonnet-4-5", false)).send().await.unwrap();
    assert_eq!((r.version(), r.status().as_u16()), (reqwest::Version::HTTP_2, 200));
    drop(h2);

    // An idle HTTP/2 connection is closed after idle_timeout_ms with GOAWAY.
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    idle.write_all(H2_START).await.unwrap();
    let started = poolgate::clock::machine_instant();
    let frames = h2_frames(idle, Duration::from_secs(10)).await;
    assert!(frames.iter().any(|(kind, _)| *kind == 7), "GOAWAY: {frames:?}");
    assert!(started.elapsed() >= Duration::from_millis(950), "after the idle timeout: {:?}", started.elapsed());

    // The limit is held by partial heads… — and by nothing else: the gateway
    // may not have seen the clients above close yet (a busy machine runs the
    // two ends late), and a connection still counted would leave a head over
    // the limit and the probes below served. Wait until the asking connection
    // is the only one counted.
    support::eventually("the earlier connections are closed", Duration::from_secs(60), async || {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.unwrap();
        let (bytes, _) = answer_on(s, Duration::from_secs(30)).await;
        let text = String::from_utf8_lossy(&bytes).to_string();
        gauge(&text, "poolgate_client_connections{}") == Some(1.0)
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..LIMIT {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n").await.unwrap();
        held.push(s);
    }
    // The gateway accepts in order, so the first probe is refused once it is
    // accepted; the bound is a liveness guard. (The heads are held for
    // header_timeout_ms: the probe and the two clients below come within it.)
    support::eventually("the held connections are counted", Duration::from_secs(60), async || {
        let (bytes, _) = {
            let mut s = TcpStream::connect(&addr).await.unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.unwrap();
            answer_on(s, Duration::from_secs(5)).await
        };
        parse_answer(&bytes).0 == 503
    })
    .await;
    // …so an HTTP/1 client gets a 503 in Anthropic's shape and a close…
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}").await.unwrap();
    let (bytes, _) = answer_on(s, Duration::from_secs(10)).await;
    let (status, head, body) = parse_answer(&bytes);
    assert_eq!(status, 503, "{head}");
    for h in ["connection: close", "retry-after: 1", "x-poolgate-request-id: ", "content-type: application/json"] {
        assert!(head.contains(h), "{h}: {head}");
    }
    assert_eq!(body["error"]["type"], "overloaded_error", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("server.max_connections"), "{body}");
    // …and an HTTP/2 one its own refusal, never an HTTP/1 byte.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(H2_START).await.unwrap();
    let (bytes, _) = answer_on(s, Duration::from_secs(10)).await;
    assert!(!bytes.starts_with(b"HTTP/"), "{:?}", String::from_utf8_lossy(&bytes));
    assert_eq!(&bytes[..9], &[0, 0, 0, 4, 0, 0, 0, 0, 0], "SETTINGS first");
    assert_eq!(bytes[9 + 3], 7, "then GOAWAY");
    assert_eq!(&bytes[9 + 13..9 + 17], &[0, 0, 0, 0xb], "ENHANCE_YOUR_CALM");

    // Once the held heads time out (408), clients get in again.
    for s in held {
        assert_eq!(parse_answer(&answer_on(s, Duration::from_secs(30)).await.0).0, 408);
    }
    support::eventually("a client gets in again", Duration::from_secs(10), async || {
        Gateway::client().get(format!("{}/healthz", gw.url)).send().await.is_ok_and(|r| r.status() == 200)
    })
    .await;
    let m = metrics(&gw).await;
    assert!(m.contains("poolgate_client_connections_limit{} 4"), "{m}");
    let refused = counter(&m, "poolgate_refused_total{reason=\"too_many_connections\"}");
    assert!(refused >= 3, "the probe, the HTTP/1 and the HTTP/2 client: {m}");
    assert!(counter(&m, "poolgate_idle_connections_closed_total") >= 1, "the idle HTTP/2 connection: {m}");
}

/// The value of the gauge `name` (with its labels) in a metrics text.
fn gauge(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

/// The value of the counter `name` (with its labels) in a metrics text; 0 if absent.
fn counter(metrics: &str, name: &str) -> u64 {
    metrics.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok()).unwrap_or(0)
}

/// A connection stays alive across answered requests; an answer given before
/// the request's body was read closes it (`connection: close`): the next head
/// would sit behind unread bytes, outside the guard's watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_before_the_body_was_read_closes_the_connection() {
    let mock = MockUpstream::start().await;
    mock.account("key-a");
    let mut cfg = config(&mock.base_url(), &[("a", "KEY_A")], "");
    cfg.push_str("[[server.client_keys]]\nname = \"dev\"\nkey_env = \"DEV_KEY\"\n");
    let mut env = env();
    env.push(("DEV_KEY", "dev-key"));
    let gw = Gateway::start(&cfg, &env);
    let addr = gw.url.trim_start_matches("http://").to_string();
    let body = serde_json::to_string(&message("claude-sonnet-4-5", false)).unwrap();
    let request = |key: &str| {
        format!(
            "POST /v1/messages HTTP/1.1\r\nHost: g\r\ncontent-type: application/json\r\nx-api-key: {key}\r\n\
             anthropic-version: 2023-06-01\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let mut socket = TcpStream::connect(&addr).await.unwrap();
    // Two answered requests on one connection: kept alive.
    for _ in 0..2 {
        socket.write_all(request("dev-key").as_bytes()).await.unwrap();
        let head = read_head(&mut socket).await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(!head.contains("connection: close"), "{head}");
        skip_body(&mut socket, &head).await;
    }
    // A wrong key: refused before its body was read, and the connection closes.
    socket.write_all(request("wrong").as_bytes()).await.unwrap();
    let (answer, _) = answer_on(socket, Duration::from_secs(10)).await;
    let text = String::from_utf8_lossy(&answer).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 401"), "{text}");
    assert!(text.contains("connection: close"), "{text}");
}

/// Reads a response head (lowercased) from `socket`.
async fn read_head(socket: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(socket.read(&mut byte).await.unwrap(), 1, "closed mid-head");
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).to_ascii_lowercase()
}

/// Reads the `content-length` body the head announced.
async fn skip_body(socket: &mut TcpStream, head: &str) {
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map(|v| v.trim().parse().unwrap())
        .expect("a content-length");
    let mut body = vec![0u8; len];
    socket.read_exact(&mut body).await.unwrap();
}
