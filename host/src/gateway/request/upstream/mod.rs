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
use http::uri::{Authority, PathAndQuery, Scheme};
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
        let uri = target.uri(uri).map_err(|e| format!("request error: {e}"))?;
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
    /// The prefix's scheme and authority when it is only those (no base
    /// path): a request's URI is then built from them and the client's path
    /// as it is, with no string joined and parsed per request.
    origin: Option<(Scheme, Authority)>,
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
        Ok(Target { origin: origin(&prefix), prefix, kind, credential: Auth::Fixed(name, value), forward })
    }

    /// The target of an OAuth seat: its bearer token is whatever the seat
    /// holds when a request is sent.
    pub fn seat(prefix: &str, seat: std::sync::Arc<crate::oauth::Seat>, forward: Arc<ForwardPolicy>) -> Target {
        let (origin, prefix) = (origin(prefix), prefix.to_string());
        Target { prefix, origin, kind: AccountKind::Oauth, credential: Auth::Seat(seat), forward }
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
        Ok(Target {
            prefix: prefix.to_string(),
            origin: origin(prefix),
            kind: AccountKind::ApiKey,
            credential,
            forward,
        })
    }

    /// The URI a client request for `client`'s path and query goes to: the
    /// prefix joined with them.
    pub fn uri(&self, client: &Uri) -> Result<Uri, http::Error> {
        let path = client.path_and_query();
        match &self.origin {
            Some((scheme, authority)) => Ok(Uri::builder()
                .scheme(scheme.clone())
                .authority(authority.clone())
                .path_and_query(path.cloned().unwrap_or_else(|| PathAndQuery::from_static("/")))
                .build()?),
            None => Ok(format!("{}{}", self.prefix, path.map_or("/", |p| p.as_str())).parse::<Uri>()?),
        }
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
    /// credential — what every [`Transport`] sends, read when it sends (a
    /// seat's token is the one it holds then).
    pub fn headers(&self, client: &HeaderMap) -> HeaderMap {
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

/// The scheme and authority of `prefix` when that is all it holds, written
/// as they are written back (see [`Target::uri`]).
fn origin(prefix: &str) -> Option<(Scheme, Authority)> {
    let uri: Uri = prefix.parse().ok()?;
    let (scheme, authority) = (uri.scheme()?.clone(), uri.authority()?.clone());
    (format!("{scheme}://{authority}") == prefix).then_some((scheme, authority))
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
mod tests;
