//! The failover decisions, without a socket: the request path runs against a
//! scripted [`Transport`] that answers for each account by its base URL, so
//! every way an attempt can go — a status, no connection, a body that breaks
//! before its first byte — is set up exactly, and what the gateway did with it
//! is read from the response and the decision record.

use crate::common;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use bytes::Bytes;
use futures_util::stream;
use http::{HeaderMap, Method, StatusCode, Uri};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use parking_lot::Mutex;

use poolgate::clock::Clock;
use poolgate::config::Config;
use poolgate::gateway::Gateway;
use poolgate::gateway::request::record::{AttemptOutcome, Ending, RequestRecord};
use poolgate::gateway::request::unserved::Cause;
use poolgate::gateway::request::upstream::{BoxError, Target, Transport, UpstreamResponse};
use poolgate::gateway::request::{Api, Incoming, forward};
use poolgate::policy::MemoryState;

/// What an account answers to one request.
#[derive(Clone)]
enum Reply {
    /// A whole answer: status, headers, body.
    Status(u16, &'static [(&'static str, &'static str)], &'static str),
    /// No connection.
    Unreachable,
    /// Status 200, then the body breaks before its first chunk.
    BreaksAtOnce,
}

/// Answers for each account in turn, from its script (an account without one
/// answers 200); keeps the order accounts were asked in.
#[derive(Default)]
struct Scripted {
    scripts: Mutex<HashMap<String, VecDeque<Reply>>>,
    asked: Mutex<Vec<String>>,
}

impl Scripted {
    fn new(scripts: &[(&str, &[Reply])]) -> Arc<Scripted> {
        let s = Scripted::default();
        for (account, replies) in scripts {
            s.scripts.lock().insert(base(account), replies.iter().cloned().collect());
        }
        Arc::new(s)
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().clone()
    }
}

fn base(account: &str) -> String {
    format!("http://{account}.upstream.test")
}

#[async_trait::async_trait]
impl Transport for Scripted {
    async fn send(
        &self,
        target: &Target,
        _method: &Method,
        _uri: &Uri,
        _headers: &HeaderMap,
        _body: &Bytes,
        _timeout: Duration,
    ) -> Result<UpstreamResponse, String> {
        let account = target.prefix().trim_start_matches("http://").split('.').next().unwrap().to_string();
        self.asked.lock().push(account);
        let reply = self.scripts.lock().get_mut(target.prefix()).and_then(VecDeque::pop_front);
        let (status, headers, chunks): (u16, &[(&str, &str)], Vec<Result<Bytes, BoxError>>) = match reply {
            None => (200, &[("content-type", "application/json")], vec![Ok(Bytes::from_static(b"{\"ok\":true}"))]),
            Some(Reply::Status(s, h, b)) => (s, h, vec![Ok(Bytes::from_static(b.as_bytes()))]),
            Some(Reply::Unreachable) => return Err("connect error: connection refused".into()),
            Some(Reply::BreaksAtOnce) => (200, &[], vec![Err("connection reset".into())]),
        };
        let body = StreamBody::new(stream::iter(chunks.into_iter().map(|c| c.map(Frame::data)))).boxed_unsync();
        let mut r = http::Response::new(body);
        *r.status_mut() = StatusCode::from_u16(status).unwrap();
        for (k, v) in headers {
            r.headers_mut().insert(*k, v.parse().unwrap());
        }
        Ok(r)
    }
}

/// A gateway over accounts `a`, `b`, `c` (ranked in that order by
/// fill-first), sending through `transport`.
async fn gateway(transport: Arc<Scripted>, extra: &str) -> Arc<Gateway> {
    gateway_on(transport, extra, Clock::system()).await
}

/// [`gateway`] reading the time from `clock`.
async fn gateway_on(transport: Arc<Scripted>, extra: &str, clock: Clock) -> Arc<Gateway> {
    let dir = std::env::temp_dir().join(format!("poolgate-failover-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut text =
        format!("[gateway]\nqueue_timeout_ms = 200\n{extra}\n[[policy.chain]]\nplugin = \"builtin:fill-first\"\n\n");
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        let token = dir.join(format!("{id}.token"));
        std::fs::write(&token, format!("token-{id}")).unwrap();
        text.push_str(&format!(
            "[[accounts]]\nid = \"{id}\"\nalias = \"{i}-{id}\"\nkind = \"oauth\"\ntoken_file = {:?}\nbase_url = \"{}\"\n\n",
            token.display().to_string(),
            base(id)
        ));
    }
    let (config, _) = Config::load_text(&dir.join("poolgate.toml"), &text).expect("config loads");
    let state = Arc::new(MemoryState::default());
    Gateway::with_transport_and_clock(config, common::ENGINE.clone(), state, transport, clock).await.expect("gateway")
}

async fn send(gw: &Arc<Gateway>) -> (Response, RequestRecord) {
    let body = r#"{"model":"claude-sonnet-4-5","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}"#;
    let incoming = Incoming {
        id: gw.next_request_id(),
        method: Method::POST,
        uri: Uri::from_static("/v1/messages"),
        headers: HeaderMap::new(),
        body: Bytes::from_static(body.as_bytes()),
        client: None,
        dialect: Default::default(),
        connection: None,
    };
    let r = forward(gw.clone(), Api::Messages, incoming).await;
    let (parts, body) = r.into_parts();
    // Reading the body to its end is what finishes a relayed request.
    let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let record = gw.decisions.latest(1)[0].as_ref().clone();
    (Response::from_parts(parts, axum::body::Body::from(bytes)), record)
}

fn header<'a>(r: &'a Response, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

fn outcomes(record: &RequestRecord) -> Vec<(Option<&str>, AttemptOutcome)> {
    record.attempts.iter().map(|a| (a.account.as_deref(), a.outcome)).collect()
}

/// Cooldowns run on the gateway's clock: on a manual one, an account
/// rate-limited for 30 s stays out until the clock is moved past that, and
/// is back at once when it is — no sleep, no wall-clock bound.
#[tokio::test]
async fn a_cooldown_ends_when_the_gateways_clock_passes_it() {
    let t = Scripted::new(&[("a", &[Reply::Status(429, &[("retry-after", "30")], "{}")])]);
    let clock = Clock::manual(1_760_000_000_000);
    let gw = gateway_on(t.clone(), "", clock.clone()).await;
    let (r, record) = send(&gw).await;
    assert_eq!((r.status(), record.account.as_deref()), (StatusCode::OK, Some("b")));
    clock.advance(Duration::from_secs(29));
    let (_, record) = send(&gw).await;
    assert_eq!(record.account.as_deref(), Some("b"), "a is still cooling 29 s later");
    clock.advance(Duration::from_secs(2));
    let (_, record) = send(&gw).await;
    assert_eq!(record.account.as_deref(), Some("a"), "a is back once the clock passed its cooldown");
    assert_eq!(t.asked(), ["a", "b", "b", "a"]);
}

#[tokio::test]
async fn every_failover_status_moves_the_request_to_the_next_account() {
    for status in [429, 529, 500, 502, 503, 401, 403] {
        let fake = Scripted::new(&[("a", &[Reply::Status(status, &[], "{}")])]);
        let gw = gateway(fake.clone(), "").await;
        let (r, record) = send(&gw).await;
        assert_eq!(r.status(), 200, "after {status}");
        assert_eq!(fake.asked(), ["a", "b"], "after {status}");
        assert_eq!(header(&r, "x-poolgate-account"), Some("b"));
        assert_eq!(header(&r, "x-poolgate-attempts"), Some("2"));
        assert_eq!(outcomes(&record), [(Some("a"), AttemptOutcome::Failover), (Some("b"), AttemptOutcome::Served)]);
        assert_eq!(record.attempts[0].status, Some(status));
        assert_eq!((record.outcome, record.status, record.account.as_deref()), (Ending::Complete, 200, Some("b")));
    }
}

#[tokio::test]
async fn a_client_error_is_the_answer_and_does_not_move() {
    for status in [400, 404, 413] {
        let fake = Scripted::new(&[("a", &[Reply::Status(status, &[], r#"{"type":"error"}"#)])]);
        let gw = gateway(fake.clone(), "").await;
        let (r, record) = send(&gw).await;
        assert_eq!(r.status().as_u16(), status);
        assert_eq!(fake.asked(), ["a"]);
        assert_eq!(header(&r, "x-poolgate-account"), Some("a"), "it is a's answer");
        assert_eq!(outcomes(&record), [(Some("a"), AttemptOutcome::Served)]);
        assert_eq!(record.outcome, Ending::Complete);
    }
}

#[tokio::test]
async fn no_connection_or_a_body_broken_before_its_first_byte_moves_on() {
    let fake = Scripted::new(&[("a", &[Reply::Unreachable]), ("b", &[Reply::BreaksAtOnce])]);
    let gw = gateway(fake.clone(), "").await;
    let (r, record) = send(&gw).await;
    assert_eq!(r.status(), 200);
    assert_eq!(fake.asked(), ["a", "b", "c"]);
    assert_eq!(
        outcomes(&record),
        [
            (Some("a"), AttemptOutcome::ConnectError),
            (Some("b"), AttemptOutcome::Failover),
            (Some("c"), AttemptOutcome::Served)
        ]
    );
    // Both are cooling now: the next request goes straight to c.
    let (_, record) = send(&gw).await;
    assert_eq!(outcomes(&record), [(Some("c"), AttemptOutcome::Served)]);
}

#[tokio::test]
async fn a_pool_that_is_all_rate_limited_is_parked_without_naming_an_account() {
    let limited = [Reply::Status(429, &[("retry-after", "30")], r#"{"type":"error"}"#)];
    let fake = Scripted::new(&[("a", &limited), ("b", &limited), ("c", &limited)]);
    let gw = gateway(fake.clone(), "").await;
    let (r, record) = send(&gw).await;
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "x-poolgate-pool"), Some("parked"));
    assert_eq!(header(&r, "x-poolgate-account"), None, "no account's answer");
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    assert!((29..=30).contains(&retry), "the earliest recovery: {retry}");
    assert!(header(&r, "x-poolgate-reason").is_some(), "the chain decided: it says why");
    assert_eq!(record.outcome, Ending::Parked);
    // Parked: the next request is answered without asking anyone.
    let (r, _) = send(&gw).await;
    assert_eq!(r.status(), 429);
    assert_eq!(fake.asked().len(), 3, "a cooling account is never probed");
}

#[tokio::test]
async fn with_nothing_reachable_the_answer_is_a_local_502() {
    let fake =
        Scripted::new(&[("a", &[Reply::Unreachable]), ("b", &[Reply::Unreachable]), ("c", &[Reply::Unreachable])]);
    let gw = gateway(fake.clone(), "").await;
    let (r, record) = send(&gw).await;
    assert_eq!(r.status(), 502);
    assert_eq!(header(&r, "x-poolgate-account"), None);
    assert_eq!(header(&r, "x-poolgate-attempts"), Some("3"));
    assert_eq!(header(&r, "x-poolgate-pool"), Some("upstream_failed"));
    assert_eq!(record.outcome, Ending::UpstreamFailed);
}

#[tokio::test]
async fn when_the_attempts_run_out_on_upstream_errors_the_answer_is_a_local_502() {
    let fake = Scripted::new(&[
        ("a", &[Reply::Status(500, &[], r#"{"from":"a"}"#)]),
        ("b", &[Reply::Status(503, &[], r#"{"from":"b"}"#)]),
    ]);
    let gw = gateway(fake.clone(), "max_attempts = 2").await;
    let (r, record) = send(&gw).await;
    assert_eq!(r.status(), 502);
    assert_eq!(fake.asked(), ["a", "b"], "max_attempts bounds the tries");
    assert_eq!(header(&r, "x-poolgate-account"), None, "the answer is the gateway's, not b's");
    let body: serde_json::Value = serde_json::from_slice(&r.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["error"]["type"], "api_error");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("`a` (HTTP 500") && message.contains("`b` (HTTP 503"), "{message}");
    assert_eq!(record.outcome, Ending::UpstreamFailed);
}

#[tokio::test]
async fn a_refused_credential_is_never_passed_on_as_the_clients() {
    let refused = [Reply::Status(401, &[], r#"{"type":"error","error":{"type":"authentication_error"}}"#)];
    let forbidden = [Reply::Status(403, &[], r#"{"type":"error","error":{"type":"permission_error"}}"#)];
    let fake = Scripted::new(&[("a", &refused), ("b", &forbidden), ("c", &[Reply::Status(500, &[], "{}")])]);
    let gw = gateway(fake.clone(), "").await;
    let (r, record) = send(&gw).await;
    assert_eq!(r.status(), 503);
    assert_eq!(header(&r, "x-poolgate-pool"), Some("auth_refused"));
    assert_eq!(header(&r, "x-should-retry"), None);
    assert_eq!(record.outcome, Ending::AuthRefused);
    let blocked: Vec<(&str, Cause)> = record.blocked.iter().map(|b| (b.account.as_str(), b.cause)).collect();
    assert_eq!(blocked, [("a", Cause::Auth), ("b", Cause::Auth), ("c", Cause::Upstream)]);
}
