//! The upstream side of a request: one HTTP client shared by every account,
//! each account's target (base URL and credential header, prepared at load),
//! and how a client request becomes the request an account receives.
//!
//! The client is hyper's pooled client with rustls and the platform's trust
//! store, not a higher-level HTTP library: the gateway never follows redirects,
//! never retries inside the client (failover is its own, across accounts) and
//! already holds the path it forwards, so URL parsing, redirect and retry layers
//! would be work done on every request for nothing (docs/benchmarks.md,
//! "Gateway overhead").

use std::time::Duration;

use anyhow::Result;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, header};
use http_body_util::{BodyDataStream, BodyExt, Full};

use std::sync::Arc;

use crate::config::headers::ForwardPolicy;
use crate::config::{AccountKind, Secret};

/// The OAuth beta flag subscription tokens need.
const OAUTH_BETA: &str = "oauth-2025-04-20";

/// Response headers that describe one connection, not the message (RFC 9110
/// §7.6.1), plus those the HTTP layer sets itself. (Request headers go by the
/// allow-list of [`ForwardPolicy`].)
const NOT_FORWARDED: [&str; 11] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "proxy-connection",
];

fn forwardable(name: &HeaderName) -> bool {
    !NOT_FORWARDED.contains(&name.as_str())
}

/// An error while reading an upstream body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// An upstream answer's body, as it streams.
pub type UpstreamBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;
/// An upstream answer, at its headers; the body streams.
pub type UpstreamResponse = http::Response<UpstreamBody>;

/// What sends a request to an account and waits for its response headers: the
/// pooled HTTP client in production ([`Upstream`]), a scripted one in the
/// request path's own tests.
#[async_trait::async_trait]
pub trait Transport: Send + Sync + 'static {
    /// Sends the client's request (method, path and query, headers, body) to
    /// `target`, resolving at the response headers or after `timeout`. The
    /// error says what failed (never the credential).
    async fn send(
        &self,
        target: &Target,
        method: &Method,
        uri: &Uri,
        client_headers: &HeaderMap,
        body: &Bytes,
        timeout: Duration,
    ) -> Result<UpstreamResponse, String>;
}

/// The rest of an upstream body, after its first chunk.
pub type Rest = std::pin::Pin<Box<dyn Stream<Item = Result<Bytes, BoxError>> + Send>>;

/// The HTTP client every account's requests go through.
#[derive(Clone)]
pub struct Upstream {
    client: crate::https::HttpsClient,
}

impl Upstream {
    /// A pooled client: TCP_NODELAY, `connect_timeout` per connection attempt,
    /// HTTP/2 where TLS negotiates it, idle connections kept 90 s.
    pub fn new(connect_timeout: Duration) -> Result<Upstream> {
        Ok(Upstream { client: crate::https::client(connect_timeout)? })
    }
}

#[async_trait::async_trait]
impl Transport for Upstream {
    async fn send(
        &self,
        target: &Target,
        method: &Method,
        uri: &Uri,
        client_headers: &HeaderMap,
        body: &Bytes,
        timeout: Duration,
    ) -> Result<UpstreamResponse, String> {
        let path = uri.path_and_query().map_or("/", |p| p.as_str());
        let uri: Uri = format!("{}{path}", target.prefix).parse().map_err(|e| format!("request error: {e}"))?;
        let mut request = Request::new(Full::new(body.clone()));
        *request.method_mut() = method.clone();
        *request.uri_mut() = uri;
        *request.headers_mut() = target.headers(client_headers);
        match tokio::time::timeout(timeout, self.client.request(request)).await {
            Ok(Ok(r)) => Ok(r.map(|body| body.map_err(BoxError::from).boxed_unsync())),
            Ok(Err(e)) => Err(describe(&e)),
            Err(_) => Err(format!("no response headers within {} ms", timeout.as_millis())),
        }
    }
}

/// Where an account's requests go and how they authenticate, prepared once
/// per generation so a request only joins strings.
pub struct Target {
    /// Scheme, authority and base path, without a trailing slash.
    prefix: String,
    kind: AccountKind,
    /// `x-api-key` or `authorization`, marked sensitive.
    credential: Auth,
    /// Which client headers go along.
    forward: Arc<ForwardPolicy>,
}

/// How a target authenticates.
enum Auth {
    /// A header that never changes (an API key, a static token).
    Fixed(HeaderName, HeaderValue),
    /// An OAuth seat's bearer token, which refreshes.
    Seat(std::sync::Arc<crate::oauth::Seat>),
    /// None: a fallback backend that takes no key.
    Nothing,
}

impl Target {
    /// Scheme, authority and base path every request path is appended to.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The target for an account whose base URL the config resolved to
    /// `prefix` (see [`crate::config::base_prefix`]), with `credential`,
    /// forwarding the client headers `forward` allows.
    pub fn new(prefix: &str, kind: AccountKind, credential: &Secret, forward: Arc<ForwardPolicy>) -> Result<Target> {
        let prefix = prefix.to_string();
        let (name, value) = match kind {
            AccountKind::ApiKey => (HeaderName::from_static("x-api-key"), credential.expose().to_string()),
            AccountKind::Oauth => (header::AUTHORIZATION, format!("Bearer {}", credential.expose())),
        };
        let mut value = HeaderValue::from_str(&value)
            .map_err(|_| anyhow::anyhow!("the credential holds characters a header cannot carry"))?;
        value.set_sensitive(true);
        Ok(Target { prefix, kind, credential: Auth::Fixed(name, value), forward })
    }

    /// The target of an OAuth seat: its bearer token is whatever the seat
    /// holds when a request is sent.
    pub fn seat(prefix: &str, seat: std::sync::Arc<crate::oauth::Seat>, forward: Arc<ForwardPolicy>) -> Target {
        Target { prefix: prefix.to_string(), kind: AccountKind::Oauth, credential: Auth::Seat(seat), forward }
    }

    /// The target of a fallback backend (an OpenAI-compatible API) at
    /// `prefix`: `key`, if any, as a bearer token; of the request's headers
    /// only those every target forwards (the gateway writes them itself).
    pub fn backend(prefix: &str, key: Option<&Secret>) -> Result<Target> {
        let credential = match key {
            Some(k) => {
                let mut v = HeaderValue::from_str(&format!("Bearer {}", k.expose()))
                    .map_err(|_| anyhow::anyhow!("the key holds characters a header cannot carry"))?;
                v.set_sensitive(true);
                Auth::Fixed(header::AUTHORIZATION, v)
            }
            None => Auth::Nothing,
        };
        let forward = Arc::new(ForwardPolicy::default());
        Ok(Target { prefix: prefix.to_string(), kind: AccountKind::ApiKey, credential, forward })
    }

    /// The seat, for an OAuth seat's target.
    pub fn oauth_seat(&self) -> Option<&std::sync::Arc<crate::oauth::Seat>> {
        match &self.credential {
            Auth::Seat(s) => Some(s),
            Auth::Fixed(..) | Auth::Nothing => None,
        }
    }

    /// The headers to send: the client's that the allow-list forwards (never
    /// its credential, cookies, `x-forwarded-*`, connection headers or
    /// `x-poolgate-*`, nor a header its `connection` names); the
    /// `anthropic-beta` list fitted to the account kind; the account's
    /// credential.
    fn headers(&self, client: &HeaderMap) -> HeaderMap {
        let nominated: Vec<String> = client
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|n| n.trim().to_ascii_lowercase())
            .collect();
        let mut headers = HeaderMap::with_capacity(client.len() + 2);
        let mut oauth_flag = false;
        for (name, value) in client {
            let n = name.as_str();
            if !self.forward.forwards(n) || nominated.iter().any(|c| c == n) {
                continue;
            }
            if n == "anthropic-beta" {
                oauth_flag |= has_oauth_flag(value);
                if let Some(v) = beta_line(value, self.kind) {
                    headers.append(name.clone(), v);
                }
                continue;
            }
            headers.append(name.clone(), value.clone());
        }
        if self.kind == AccountKind::Oauth && !oauth_flag {
            add_oauth_flag(&mut headers);
        }
        match &self.credential {
            Auth::Fixed(name, value) => {
                headers.insert(name.clone(), value.clone());
            }
            Auth::Seat(seat) => {
                headers.insert(header::AUTHORIZATION, seat.header());
            }
            Auth::Nothing => {}
        }
        headers
    }
}

/// What failed, from the error's chain of causes.
fn describe(e: &hyper_util::client::legacy::Error) -> String {
    let mut msg = String::from(if e.is_connect() { "connect error" } else { "transport error" });
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    msg
}

/// Adds the OAuth flag to a seat's request: appended to the last
/// `anthropic-beta` line (`,oauth-2025-04-20`), so the client's bytes stay the
/// line's prefix and the header stays one line where it was one — a server
/// that reads a single value of a header would otherwise lose either the
/// client's flags or the seat's — or as the only line when there is none.
fn add_oauth_flag(headers: &mut HeaderMap) {
    match headers.entry("anthropic-beta") {
        http::header::Entry::Vacant(e) => {
            e.insert(HeaderValue::from_static(OAUTH_BETA));
        }
        http::header::Entry::Occupied(mut e) => {
            let Some(last) = e.iter_mut().last() else { return };
            let trimmed = last.as_bytes().trim_ascii_end();
            let sep: &[u8] = if trimmed.is_empty() || trimmed.ends_with(b",") { b"" } else { b"," };
            if let Ok(v) = HeaderValue::from_bytes(&[trimmed, sep, OAUTH_BETA.as_bytes()].concat()) {
                *last = v;
            }
        }
    }
}

/// Whether one `anthropic-beta` line names the OAuth flag.
fn has_oauth_flag(line: &HeaderValue) -> bool {
    line.as_bytes().split(|b| *b == b',').any(|f| f.trim_ascii() == OAUTH_BETA.as_bytes())
}

/// One client `anthropic-beta` line as it goes upstream: byte for byte
/// (Claude Code's gateway contract: the flags, their order, separators and
/// spacing, and repeated lines as lines), except that an API key's request
/// loses the OAuth flag — an API key sent with it is refused upstream — taking
/// only that flag and its separator out of the line (`None`: nothing was left).
/// A seat's request gains the flag at the end of the last line when no client
/// line carries it ([`add_oauth_flag`]).
fn beta_line(line: &HeaderValue, kind: AccountKind) -> Option<HeaderValue> {
    if kind == AccountKind::Oauth || !has_oauth_flag(line) {
        return Some(line.clone());
    }
    let kept: Vec<&[u8]> =
        line.as_bytes().split(|b| *b == b',').filter(|f| f.trim_ascii() != OAUTH_BETA.as_bytes()).collect();
    let joined = kept.join(&b","[..]);
    let rest = joined.trim_ascii();
    if rest.is_empty() {
        return None;
    }
    HeaderValue::from_bytes(rest).ok()
}

/// The body of an upstream response as a stream of data chunks.
pub fn body_stream(response: UpstreamResponse) -> impl Stream<Item = Result<Bytes, BoxError>> + Send {
    BodyDataStream::new(response.into_body())
}

/// Whether the response is an event stream the relay can read: SSE sent
/// without a content coding. Clients such as Claude Code send `accept-encoding:
/// gzip, br, …`, which is passed upstream; a compressed stream is relayed byte
/// for byte without looking for event boundaries (they are not visible in
/// compressed bytes, and an error event appended in plain text would corrupt it).
pub fn is_plain_sse(headers: &HeaderMap) -> bool {
    let sse = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
    let coded = headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .any(|v| v.to_str().map_or(true, |v| v.split(',').any(|c| !c.trim().eq_ignore_ascii_case("identity"))));
    sse && !coded
}

/// A body read whole: `first`, then the rest of `rest`; an error if it breaks
/// or grows past `limit` bytes.
pub async fn collect(
    first: Bytes,
    rest: impl Stream<Item = Result<Bytes, BoxError>> + Send,
    limit: usize,
) -> Result<Bytes, String> {
    let mut rest = std::pin::pin!(rest);
    let mut out = bytes::BytesMut::from(&first[..]);
    while let Some(chunk) = rest.next().await {
        let chunk = chunk.map_err(|e| format!("the body broke: {e}"))?;
        if out.len() + chunk.len() > limit {
            return Err(format!("the body is larger than {} MiB", limit >> 20));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out.freeze())
}

/// [`collect`] of a whole response's body.
pub async fn read_whole(response: UpstreamResponse, limit: usize) -> Result<Bytes, String> {
    collect(Bytes::new(), body_stream(response), limit).await
}

/// Reads an error body, at most 64 KiB, waiting at most a few seconds.
pub async fn read_small(response: UpstreamResponse) -> Bytes {
    let read = async {
        let mut out = Vec::new();
        let mut stream = std::pin::pin!(body_stream(response));
        while let Some(Ok(chunk)) = stream.next().await {
            let room = (64 * 1024usize).saturating_sub(out.len());
            out.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if room <= chunk.len() {
                break;
            }
        }
        Bytes::from(out)
    };
    tokio::time::timeout(Duration::from_secs(5), read).await.unwrap_or_default()
}

/// Removes the headers that must not travel from an upstream response to the
/// client (hop-by-hop ones; `content-length` stays, the relay needs it).
pub fn retain_forwardable(headers: &mut HeaderMap) {
    let drop: Vec<HeaderName> =
        headers.keys().filter(|n| !forwardable(n) && n.as_str() != "content-length").cloned().collect();
    for n in drop {
        headers.remove(n);
    }
}

/// Makes a relayed `retry-after` whole seconds, as Claude Code's gateway
/// contract asks (it reads integer seconds; an HTTP date or a fraction it
/// cannot honour): a date becomes the seconds until it, a fraction is rounded
/// up. An integer — what Anthropic sends — is left byte for byte.
pub fn integer_retry_after(headers: &mut HeaderMap, now_ms: u64) {
    let Some(v) = headers.get(header::RETRY_AFTER) else { return };
    if !v.is_empty() && v.as_bytes().iter().all(u8::is_ascii_digit) {
        return;
    }
    match v.to_str().ok().and_then(|v| crate::learned::quota::parse_retry_after(v, now_ms)) {
        Some(ms) => headers.insert(header::RETRY_AFTER, HeaderValue::from(ms.div_ceil(1000))),
        None => headers.remove(header::RETRY_AFTER),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(s: &str) -> Secret {
        Secret::new(s.into()).unwrap()
    }

    fn policy() -> Arc<ForwardPolicy> {
        Arc::new(ForwardPolicy::new(&["x-team-*".into()]))
    }

    #[test]
    fn beta_lines_go_byte_for_byte_but_for_the_oauth_flag() {
        let mut h = HeaderMap::new();
        h.append("anthropic-beta", "claude-code-20250219, oauth-2025-04-20,  x-b".parse().unwrap());
        h.append("anthropic-beta", "interleaved-thinking-2025-05-14 ,zz-probe".parse().unwrap());
        let sent = |kind| {
            let t = Target::new("http://h", kind, &secret("k"), policy()).unwrap();
            t.headers(&h).get_all("anthropic-beta").iter().map(|v| v.to_str().unwrap().to_string()).collect::<Vec<_>>()
        };
        // A seat's request: every line as it came; the flag is already there.
        assert_eq!(
            sent(AccountKind::Oauth),
            ["claude-code-20250219, oauth-2025-04-20,  x-b", "interleaved-thinking-2025-05-14 ,zz-probe"]
        );
        // An API key's: the OAuth flag and its separator out, nothing else.
        assert_eq!(
            sent(AccountKind::ApiKey),
            ["claude-code-20250219,  x-b", "interleaved-thinking-2025-05-14 ,zz-probe"]
        );
        // No client flag: a seat's request gains it at the end of the last line.
        let bare = Target::new("http://h", AccountKind::Oauth, &secret("k"), policy()).unwrap();
        assert_eq!(bare.headers(&HeaderMap::new()).get("anthropic-beta").unwrap(), OAUTH_BETA);
        let mut cc = HeaderMap::new();
        cc.append("anthropic-beta", "a, b".parse().unwrap());
        cc.append("anthropic-beta", "c,".parse().unwrap());
        let lines = |h: HeaderMap| {
            h.get_all("anthropic-beta").iter().map(|v| v.to_str().unwrap().to_string()).collect::<Vec<_>>()
        };
        assert_eq!(lines(bare.headers(&cc)), ["a, b", "c,oauth-2025-04-20"]);
        cc.remove("anthropic-beta");
        cc.append("anthropic-beta", "a".parse().unwrap());
        assert_eq!(lines(bare.headers(&cc)), ["a,oauth-2025-04-20"]);
        let key = Target::new("http://h", AccountKind::ApiKey, &secret("k"), policy()).unwrap();
        assert!(key.headers(&HeaderMap::new()).get("anthropic-beta").is_none());
        // A line that held only the flag is dropped for an API key.
        assert_eq!(beta_line(&HeaderValue::from_static(" oauth-2025-04-20 "), AccountKind::ApiKey), None);
        assert!(has_oauth_flag(&HeaderValue::from_static("a,oauth-2025-04-20")));
        assert!(!has_oauth_flag(&HeaderValue::from_static("a,oauth-2025-04-20x")));
    }

    #[test]
    fn retry_after_goes_out_in_whole_seconds() {
        let after = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::RETRY_AFTER, v.parse().unwrap());
            integer_retry_after(&mut h, 1_000_000_000_000);
            h.get(header::RETRY_AFTER).map(|v| v.to_str().unwrap().to_string())
        };
        assert_eq!(after("7").as_deref(), Some("7"));
        assert_eq!(after("1.2").as_deref(), Some("2"));
        // 2001-09-09T01:46:40Z is 1e12 ms; ten seconds later:
        assert_eq!(after("Sun, 09 Sep 2001 01:46:50 GMT").as_deref(), Some("10"));
        assert_eq!(after("soon"), None);
    }

    #[test]
    fn hop_by_hop_headers_are_not_forwarded() {
        let mut h = HeaderMap::new();
        h.insert("connection", "keep-alive".parse().unwrap());
        h.insert("transfer-encoding", "chunked".parse().unwrap());
        h.insert("anthropic-version", "2023-06-01".parse().unwrap());
        retain_forwardable(&mut h);
        assert!(h.get("connection").is_none() && h.get("transfer-encoding").is_none());
        assert!(h.get("anthropic-version").is_some());
    }

    #[test]
    fn a_header_the_connection_header_names_stays() {
        let t = Target::new("http://h", AccountKind::ApiKey, &secret("k"), policy()).unwrap();
        let mut client = HeaderMap::new();
        client.insert("connection", "X-Team-Hop".parse().unwrap());
        client.insert("x-team-hop", "1".parse().unwrap());
        client.insert("x-team-id", "7".parse().unwrap());
        let h = t.headers(&client);
        assert!(h.get("x-team-hop").is_none() && h.get("x-team-id").is_some());
    }

    #[test]
    fn only_an_uncompressed_event_stream_is_framed() {
        let h = |pairs: &[(&str, &str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
            }
            m
        };
        assert!(is_plain_sse(&h(&[("content-type", "text/event-stream; charset=utf-8")])));
        assert!(is_plain_sse(&h(&[("content-type", "text/event-stream"), ("content-encoding", "identity")])));
        assert!(!is_plain_sse(&h(&[("content-type", "text/event-stream"), ("content-encoding", "gzip")])));
        assert!(!is_plain_sse(&h(&[("content-type", "text/event-stream"), ("content-encoding", "br")])));
        assert!(!is_plain_sse(&h(&[("content-type", "application/json")])));
    }

    #[test]
    fn the_account_credential_replaces_the_clients() {
        let base = crate::config::base_prefix("https://api.example.test/base/").unwrap();
        let t = Target::new(&base, AccountKind::Oauth, &secret("tok"), policy()).unwrap();
        assert_eq!(t.prefix, "https://api.example.test/base");
        let mut client = HeaderMap::new();
        client.insert("x-api-key", "gateway-key".parse().unwrap());
        client.insert("authorization", "Bearer gateway-key".parse().unwrap());
        client.insert("x-poolgate-debug", "1".parse().unwrap());
        client.insert("connection", "close".parse().unwrap());
        client.insert("anthropic-version", "2023-06-01".parse().unwrap());
        client.insert("cookie", "session=1".parse().unwrap());
        client.insert("x-forwarded-for", "10.0.0.1".parse().unwrap());
        client.insert("x-foo", "1".parse().unwrap());
        client.insert("x-team-id", "7".parse().unwrap());
        let h = t.headers(&client);
        assert!(h.get("cookie").is_none() && h.get("x-forwarded-for").is_none() && h.get("x-foo").is_none());
        assert_eq!(h.get("x-team-id").unwrap(), "7");
        assert_eq!(h.get("authorization").unwrap(), "Bearer tok");
        assert!(h.get("authorization").unwrap().is_sensitive());
        assert!(h.get("x-api-key").is_none() && h.get("x-poolgate-debug").is_none() && h.get("connection").is_none());
        assert_eq!(h.get("anthropic-version").unwrap(), "2023-06-01");
        assert_eq!(h.get("anthropic-beta").unwrap(), OAUTH_BETA);

        let k = Target::new("http://127.0.0.1:9", AccountKind::ApiKey, &secret("sk-1"), policy()).unwrap();
        assert_eq!(k.prefix, "http://127.0.0.1:9");
        let h = k.headers(&client);
        assert_eq!(h.get("x-api-key").unwrap(), "sk-1");
        assert!(h.get("authorization").is_none());
    }

    #[test]
    fn a_credential_a_header_cannot_carry_is_refused_without_showing_it() {
        let e = Target::new("http://h", AccountKind::ApiKey, &secret("bad\nkey"), policy()).err().unwrap();
        assert!(e.to_string().contains("header"), "{e}");
        assert!(!e.to_string().contains("bad\nkey"), "the credential is never in an error");
    }
}
