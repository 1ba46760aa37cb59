//! A seat's token expiring, refreshed and refused — in-process, on the
//! gateway's manual clock, with no socket and no sleep: the request path and
//! the seat keeper's step run against a scripted [`Transport`] that is both
//! the API (which refuses a token past its expiry, by the same clock) and the
//! token endpoint (whose answers each test sets). The seats' promises a user
//! sees through `poolgate serve` — rotation under load, login, replicas —
//! are the other `oauth` tests'.

use crate::common;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::{HeaderMap, Method, StatusCode, Uri};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use parking_lot::Mutex;
use serde_json::{Value, json};

use poolgate::clock::Clock;
use poolgate::config::Config;
use poolgate::gateway::Gateway;
use poolgate::gateway::request::upstream::{Target, Transport, UpstreamResponse};
use poolgate::gateway::request::{Api, Incoming, forward};
use poolgate::gateway::seat_keeper;
use poolgate::policy::MemoryState;

const T0: u64 = 1_760_000_000_000;
const TOKEN_BASE: &str = "http://auth.upstream.test";
const MINUTE: Duration = Duration::from_secs(60);

/// The API of accounts `a` (a seat) and `b` (a static token), and the token
/// endpoint, on one clock.
struct Provider {
    clock: Clock,
    /// Access tokens the API takes, with when each expires.
    valid: Mutex<HashMap<String, u64>>,
    /// What the token endpoint answers next: status and body.
    grants: Mutex<VecDeque<(u16, Value)>>,
    /// The forms the token endpoint was sent.
    forms: Mutex<Vec<String>>,
    /// Each API request: the account's host and the `authorization` it carried.
    calls: Mutex<Vec<(String, String)>>,
    /// How many 401s the API answered; the token endpoint answers only once
    /// it reaches [`Provider::hold`], so requests meet the 401 together.
    refused: tokio::sync::watch::Sender<usize>,
    hold: std::sync::atomic::AtomicUsize,
}

impl Provider {
    fn new(clock: &Clock) -> Arc<Provider> {
        let valid = HashMap::from([("a1".to_string(), T0 + 2 * 3_600_000), ("token-b".to_string(), u64::MAX)]);
        Arc::new(Provider {
            clock: clock.clone(),
            valid: Mutex::new(valid),
            grants: Default::default(),
            forms: Default::default(),
            calls: Default::default(),
            refused: tokio::sync::watch::Sender::new(0),
            hold: Default::default(),
        })
    }

    /// The token endpoint's next answer.
    fn grant(&self, status: u16, body: Value) {
        self.grants.lock().push_back((status, body));
    }

    fn forms(&self) -> Vec<String> {
        self.forms.lock().clone()
    }

    /// The bearer tokens account `a`'s requests carried, in order.
    fn bearers_of_a(&self) -> Vec<String> {
        let calls = self.calls.lock();
        calls.iter().filter(|(h, _)| h == "a").map(|(_, t)| t.trim_start_matches("Bearer ").to_string()).collect()
    }

    async fn token_endpoint(&self, body: &Bytes) -> (u16, Value) {
        self.forms.lock().push(String::from_utf8_lossy(body).into_owned());
        let hold = self.hold.load(std::sync::atomic::Ordering::Relaxed);
        let _ = self.refused.subscribe().wait_for(|n| *n >= hold).await;
        let (status, answer) = self.grants.lock().pop_front().expect("a token endpoint answer set by the test");
        if let (200, Some(token), Some(life)) = (status, answer["access_token"].as_str(), answer["expires_in"].as_u64())
        {
            self.valid.lock().insert(token.to_string(), self.clock.now_ms() + life * 1000);
        }
        (status, answer)
    }

    fn api(&self, host: &str, authorization: &str) -> (u16, Value) {
        self.calls.lock().push((host.to_string(), authorization.to_string()));
        let token = authorization.trim_start_matches("Bearer ");
        match self.valid.lock().get(token) {
            Some(&until) if until > self.clock.now_ms() => (200, json!({"type": "message", "content": []})),
            _ => {
                self.refused.send_modify(|n| *n += 1);
                (401, json!({"type": "error", "error": {"type": "authentication_error", "message": "expired"}}))
            }
        }
    }
}

#[async_trait::async_trait]
impl Transport for Provider {
    async fn send(
        &self,
        target: &Target,
        _method: &Method,
        _uri: &Uri,
        client_headers: &HeaderMap,
        body: &Bytes,
        _timeout: Duration,
    ) -> Result<UpstreamResponse, String> {
        let (status, answer) = if target.prefix() == TOKEN_BASE {
            self.token_endpoint(body).await
        } else {
            let headers = target.headers(client_headers);
            let authorization = headers.get("authorization").map_or("", |v| v.to_str().unwrap());
            let host = target.prefix().trim_start_matches("http://").split('.').next().unwrap();
            self.api(host, authorization)
        };
        let chunk: Result<_, poolgate::gateway::request::upstream::BoxError> =
            Ok(Frame::data(Bytes::from(answer.to_string())));
        let mut r = http::Response::new(StreamBody::new(stream::iter([chunk])).boxed_unsync());
        *r.status_mut() = StatusCode::from_u16(status).unwrap();
        r.headers_mut().insert("content-type", "application/json".parse().unwrap());
        Ok(r)
    }
}

/// A gateway over seat `a` (token `a1`, refresh token `r1`, expiring two
/// hours after [`T0`]) and static account `b`, ranked `a` first.
async fn gateway(provider: &Arc<Provider>, clock: &Clock) -> (Arc<Gateway>, PathBuf) {
    let dir = std::env::temp_dir().join(format!("poolgate-seat-expiry-{}-{}", std::process::id(), next()));
    std::fs::create_dir_all(&dir).unwrap();
    let seat = dir.join("a.json");
    let stored = json!({"access_token": "a1", "refresh_token": "r1", "expires_at_ms": T0 + 2 * 3_600_000, "scopes": ["user:inference"]});
    std::fs::write(&seat, stored.to_string()).unwrap();
    std::fs::write(dir.join("b.token"), "token-b").unwrap();
    let text = format!(
        "[oauth]\ntoken_url = \"{TOKEN_BASE}/v1/oauth/token\"\nusage_poll_ms = 0\n\n\
         [[policy.chain]]\nplugin = \"builtin:fill-first\"\n\n\
         [[accounts]]\nid = \"a\"\nkind = \"oauth\"\ncredentials = {seat:?}\nbase_url = \"http://a.upstream.test\"\n\n\
         [[accounts]]\nid = \"b\"\nkind = \"oauth\"\ntoken_file = {b:?}\nbase_url = \"http://b.upstream.test\"\n",
        seat = seat.display().to_string(),
        b = dir.join("b.token").display().to_string(),
    );
    let (config, _) = Config::load_text(&dir.join("poolgate.toml"), &text).expect("config loads");
    let state = Arc::new(MemoryState::default());
    let gw = Gateway::with_transport_and_clock(config, common::ENGINE.clone(), state, provider.clone(), clock.clone())
        .await
        .expect("gateway");
    (gw, seat)
}

fn next() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// One Messages request through the request path: its status and the
/// account that served it.
async fn send(gw: &Arc<Gateway>) -> (u16, String) {
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
    let account = r.headers().get("x-poolgate-account").map_or("", |v| v.to_str().unwrap()).to_string();
    let status = r.status().as_u16();
    // Reading the body to its end is what finishes a relayed request.
    let _ = r.into_body().collect().await;
    (status, account)
}

/// One step of the seat keeper, with the configured lead time.
async fn keeper_step(gw: &Gateway) {
    let before = gw.generation().config.oauth.refresh_before_ms;
    seat_keeper::refresh_due(gw, before).await;
}

fn on_disk(path: &Path) -> (String, String, u64) {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let s = |k: &str| v[k].as_str().unwrap().to_string();
    (s("access_token"), s("refresh_token"), v["expires_at_ms"].as_u64().unwrap())
}

fn renewed(token: &str, refresh: &str) -> Value {
    json!({"access_token": token, "refresh_token": refresh, "expires_in": 8 * 3600})
}

/// The keeper refreshes a seat when less than `refresh_before_ms` (45
/// minutes) of its token is left by the gateway's clock — not a minute
/// before — and requests carry the new token at once.
#[tokio::test]
async fn a_seat_is_refreshed_ahead_of_its_expiry_by_the_gateways_clock() {
    let clock = Clock::manual(T0);
    let provider = Provider::new(&clock);
    let (gw, seat) = gateway(&provider, &clock).await;
    assert_eq!(send(&gw).await, (200, "a".into()));

    clock.advance(74 * MINUTE);
    keeper_step(&gw).await;
    assert!(provider.forms().is_empty(), "46 minutes left: nothing is refreshed yet");

    clock.advance(2 * MINUTE);
    provider.grant(200, renewed("a2", "r2"));
    keeper_step(&gw).await;
    let forms = provider.forms();
    assert_eq!(forms.len(), 1, "44 minutes left: one refresh");
    assert!(forms[0].starts_with("grant_type=refresh_token&refresh_token=r1&client_id="), "{}", forms[0]);
    assert_eq!(on_disk(&seat), ("a2".into(), "r2".into(), clock.now_ms() + 8 * 3_600_000), "kept on disk first");

    assert_eq!(send(&gw).await, (200, "a".into()));
    assert_eq!(provider.bearers_of_a(), ["a1", "a2"]);
    keeper_step(&gw).await;
    assert_eq!(provider.forms().len(), 1, "a fresh token is not refreshed again");
}

/// A token that expired with no keeper step in between (a suspended laptop,
/// a stopped keeper) is met by a request as a 401: the seat refreshes once
/// for every request that met it, and each is sent again on the same seat.
#[tokio::test]
async fn requests_that_meet_an_expired_token_refresh_it_once_and_are_served_by_the_seat() {
    let clock = Clock::manual(T0);
    let provider = Provider::new(&clock);
    let (gw, _seat) = gateway(&provider, &clock).await;
    clock.advance(3 * 60 * MINUTE);
    provider.grant(200, renewed("a2", "r2"));
    // The refresh is answered only once all four met the 401.
    provider.hold.store(4, std::sync::atomic::Ordering::Relaxed);

    let answers = futures_util::future::join_all((0..4).map(|_| send(&gw))).await;
    assert!(answers.iter().all(|a| *a == (200, "a".into())), "{answers:?}");
    assert_eq!(provider.forms().len(), 1, "one refresh for all four requests");
    let bearers = provider.bearers_of_a();
    assert_eq!(bearers.iter().filter(|b| *b == "a2").count(), 4, "each request served with the new token: {bearers:?}");
    assert_eq!(bearers.iter().filter(|b| *b == "a1").count(), 4, "all four met the expired token: {bearers:?}");
}

/// A refresh token the endpoint refuses (`invalid_grant`) takes the seat out
/// until a new login: the request that met it is served by the next account,
/// and the spent refresh token is never sent again.
#[tokio::test]
async fn a_refused_refresh_takes_the_seat_out_and_the_pool_serves_without_it() {
    let clock = Clock::manual(T0);
    let provider = Provider::new(&clock);
    let (gw, _seat) = gateway(&provider, &clock).await;
    clock.advance(3 * 60 * MINUTE);
    provider.grant(400, json!({"error": "invalid_grant", "error_description": "refresh token revoked"}));

    assert_eq!(send(&gw).await, (200, "b".into()));
    assert_eq!(provider.forms().len(), 1);
    let g = gw.generation();
    let seat = g.accounts.iter().find(|a| a.config.id == "a").unwrap().target.oauth_seat().unwrap().clone();
    assert!(seat.needs_login());

    for _ in 0..3 {
        assert_eq!(send(&gw).await, (200, "b".into()));
        keeper_step(&gw).await;
        clock.advance(10 * MINUTE);
    }
    assert_eq!(provider.forms().len(), 1, "the refused refresh token is never sent again");
}

/// A token endpoint that does not answer is tried again after a pause that
/// doubles (5 s, then 10 s) — measured on the gateway's clock, so a keeper
/// step inside the pause sends nothing — and the seat keeps serving with its
/// unexpired token meanwhile.
#[tokio::test]
async fn a_token_endpoint_outage_is_retried_after_a_doubling_pause_on_the_gateways_clock() {
    let clock = Clock::manual(T0);
    let provider = Provider::new(&clock);
    let (gw, _seat) = gateway(&provider, &clock).await;
    clock.advance(80 * MINUTE);
    let outage = json!({"error": "temporarily_unavailable"});
    provider.grant(503, outage.clone());
    provider.grant(503, outage);
    provider.grant(200, renewed("a2", "r2"));

    let steps: [(Duration, usize); 5] = [
        (Duration::ZERO, 1),         // fails: next try in 5 s
        (Duration::from_secs(4), 1), // inside the pause: nothing sent
        (Duration::from_secs(2), 2), // fails again: next try in 10 s
        (Duration::from_secs(9), 2), // inside the doubled pause
        (Duration::from_secs(2), 3), // renewed
    ];
    for (i, (wait, forms)) in steps.into_iter().enumerate() {
        clock.advance(wait);
        keeper_step(&gw).await;
        assert_eq!(provider.forms().len(), forms, "step {i}");
        assert_eq!(send(&gw).await, (200, "a".into()), "step {i}: the seat serves meanwhile");
    }
    assert_eq!(provider.bearers_of_a().last().map(String::as_str), Some("a2"));
}
