//! The OAuth token endpoint: the refresh grant every seat needs, and the
//! authorization-code grant `poolgate login` ends with.
//!
//! Requests are `application/x-www-form-urlencoded` (RFC 6749 §4.1.3, §6; what
//! dario and neurolink send), bounded by a timeout, and their answers are read
//! into a [`Grant`]. A refused refresh token (`invalid_grant`) is told apart
//! from everything else: it means the seat needs a new login, while an outage
//! is only a reason to try again later.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http::{Method, Request, Response, header};
use http_body_util::{BodyExt, Full};
use serde::Deserialize;

use super::OAuthConfig;
#[cfg(test)]
use super::store::Identity;
use super::store::StoredCredential;

/// What the endpoint granted.
#[derive(Clone, PartialEq, Eq)]
pub struct Grant {
    /// The new tokens (the refresh token is the old one if none was returned).
    pub credential: StoredCredential,
}

/// Why a grant failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenError {
    /// The grant was refused for good (`invalid_grant`: the refresh token was
    /// used, revoked or expired): the seat needs a new login.
    InvalidGrant(String),
    /// Anything else — no answer, a timeout, a 5xx, a 429, a body that is not
    /// a token: try again later.
    Unavailable(String),
}

impl std::fmt::Display for TokenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenError::InvalidGrant(m) => write!(f, "the token endpoint refused the grant (invalid_grant): {m}"),
            TokenError::Unavailable(m) => write!(f, "the token endpoint could not be used: {m}"),
        }
    }
}

/// What carries a request to the token endpoint and brings its whole answer
/// back. While a gateway serves, its one `Transport` does (the same client and
/// timeouts as every account's requests, and, in the request path's tests, the
/// same scripted answers on the same manual clock); `poolgate login` uses a
/// client of its own ([`Https`]).
#[async_trait::async_trait]
pub trait Carrier: Send + Sync + 'static {
    /// Sends `request`, waiting at most `timeout` for the answer's headers and
    /// again for its body. The error says what failed (never a token).
    async fn send(&self, request: Request<Bytes>, timeout: Duration) -> Result<Response<Bytes>, String>;
}

/// The most of a token answer that is read: a token answer is a few hundred
/// bytes; anything this large is not one.
pub const MAX_ANSWER: usize = 64 * 1024;

/// A [`Carrier`] of its own: a pooled HTTPS client.
pub struct Https(crate::https::HttpsClient);

impl Https {
    /// A client that waits at most `connect_timeout` for each connection.
    pub fn new(connect_timeout: Duration) -> Result<Https> {
        Ok(Https(crate::https::client(connect_timeout)?))
    }
}

#[async_trait::async_trait]
impl Carrier for Https {
    async fn send(&self, request: Request<Bytes>, timeout: Duration) -> Result<Response<Bytes>, String> {
        let response = match tokio::time::timeout(timeout, self.0.request(request.map(Full::new))).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Err(format!("{e}")),
            Err(_) => return Err(format!("no answer within {} ms", timeout.as_millis())),
        };
        let (parts, body) = response.into_parts();
        match tokio::time::timeout(timeout, http_body_util::Limited::new(body, MAX_ANSWER).collect()).await {
            Ok(Ok(b)) => Ok(Response::from_parts(parts, b.to_bytes())),
            _ => Err(format!("status {}, body unreadable", parts.status)),
        }
    }
}

/// Sends token requests.
#[derive(Clone)]
pub struct TokenClient {
    carrier: Arc<dyn Carrier>,
    config: OAuthConfig,
}

impl TokenClient {
    /// A client for the endpoints in `config`, with an HTTPS client of its own.
    pub fn new(config: OAuthConfig) -> Result<TokenClient> {
        Ok(TokenClient::with_carrier(config, Arc::new(Https::new(Duration::from_secs(10))?)))
    }

    /// A client for the endpoints in `config` whose requests `carrier` sends.
    pub fn with_carrier(config: OAuthConfig, carrier: Arc<dyn Carrier>) -> TokenClient {
        TokenClient { carrier, config }
    }

    /// The endpoints and client id it uses.
    pub fn config(&self) -> &OAuthConfig {
        &self.config
    }

    /// Trades `refresh_token` for a new pair (`previous` fills in what the
    /// answer leaves out: a refresh token that did not rotate, the identity).
    pub async fn refresh(&self, previous: &StoredCredential, now_ms: u64) -> Result<Grant, TokenError> {
        let form = [
            ("grant_type", "refresh_token"),
            ("refresh_token", previous.refresh_token.as_str()),
            ("client_id", self.config.client_id.as_str()),
        ];
        let body = self.post(&form).await?;
        parse(&body, Some(previous), now_ms)
    }

    /// Trades an authorization `code` (and the PKCE `verifier` whose challenge
    /// the authorize URL carried) for a first pair.
    pub async fn exchange(&self, code: &str, state: &str, verifier: &str, now_ms: u64) -> Result<Grant, TokenError> {
        let form = [
            ("grant_type", "authorization_code"),
            ("code", code),
            ("state", state),
            ("redirect_uri", self.config.redirect_uri.as_str()),
            ("client_id", self.config.client_id.as_str()),
            ("code_verifier", verifier),
        ];
        let body = self.post(&form).await?;
        parse(&body, None, now_ms)
    }

    async fn post(&self, form: &[(&str, &str)]) -> Result<Bytes, TokenError> {
        let unavailable = |m: String| TokenError::Unavailable(m);
        let encoded = form.iter().map(|(k, v)| format!("{}={}", encode(k), encode(v))).collect::<Vec<_>>().join("&");
        let request = Request::builder()
            .method(Method::POST)
            .uri(self.config.token_url.as_str())
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::ACCEPT, "application/json")
            .header(header::USER_AGENT, concat!("poolgate/", env!("CARGO_PKG_VERSION")))
            .body(Bytes::from(encoded))
            .map_err(|e| unavailable(format!("bad token URL `{}`: {e}", self.config.token_url)))?;
        let timeout = Duration::from_millis(self.config.timeout_ms);
        let (parts, body) = self.carrier.send(request, timeout).await.map_err(unavailable)?.into_parts();
        let status = parts.status;
        if status.is_success() {
            return Ok(body);
        }
        #[derive(Deserialize)]
        struct OauthError {
            error: String,
            #[serde(default)]
            error_description: String,
        }
        match serde_json::from_slice::<OauthError>(&body) {
            Ok(e) if e.error == "invalid_grant" => Err(TokenError::InvalidGrant(e.error_description)),
            Ok(e) => Err(unavailable(format!("status {status}: {} {}", e.error, e.error_description))),
            Err(_) => Err(unavailable(format!("status {status}"))),
        }
    }
}

/// A token answer as a stored credential.
fn parse(body: &[u8], previous: Option<&StoredCredential>, now_ms: u64) -> Result<Grant, TokenError> {
    #[derive(Deserialize)]
    struct Named {
        uuid: Option<String>,
        email_address: Option<String>,
    }
    #[derive(Deserialize)]
    struct Answer {
        access_token: String,
        refresh_token: Option<String>,
        expires_in: Option<u64>,
        scope: Option<String>,
        organization: Option<Named>,
        account: Option<Named>,
    }
    let a: Answer = serde_json::from_slice(body)
        .map_err(|_| TokenError::Unavailable("the answer is not a token (no access_token)".into()))?;
    let refresh_token = a
        .refresh_token
        .filter(|t| !t.is_empty())
        .or_else(|| previous.map(|p| p.refresh_token.clone()))
        .ok_or_else(|| TokenError::Unavailable("the answer holds no refresh token".into()))?;
    // neurolink: an answer without `expires_in` lives 55 minutes.
    let expires_in_ms = a.expires_in.unwrap_or(55 * 60).saturating_mul(1000);
    let mut identity = previous.map(|p| p.identity.clone()).unwrap_or_default();
    if let Some(org) = a.organization.and_then(|o| o.uuid) {
        identity.organization = Some(org);
    }
    if let Some(acct) = a.account {
        identity.account = acct.uuid.or(identity.account);
        identity.email = acct.email_address.or(identity.email);
    }
    let scopes = match a.scope {
        Some(s) => s.split_whitespace().map(str::to_string).collect(),
        None => previous.map(|p| p.scopes.clone()).unwrap_or_default(),
    };
    Ok(Grant {
        credential: StoredCredential {
            access_token: a.access_token,
            refresh_token,
            expires_at_ms: now_ms.saturating_add(expires_in_ms),
            scopes,
            identity,
            obtained_at_ms: now_ms,
        },
    })
}

/// Percent-encodes a form value (RFC 3986 unreserved characters pass).
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Checks the endpoints parse as URLs, naming the one that does not.
pub fn check_urls(config: &OAuthConfig) -> Result<()> {
    for (key, url) in [("oauth.token_url", &config.token_url), ("oauth.authorize_url", &config.authorize_url)] {
        crate::https::base_prefix(url).with_context(|| key.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_becomes_a_credential_keeping_what_it_leaves_out() {
        let previous = StoredCredential {
            access_token: "old".into(),
            refresh_token: "old-r".into(),
            expires_at_ms: 0,
            scopes: vec!["user:inference".into()],
            identity: Identity { organization: Some("org-1".into()), ..Default::default() },
            obtained_at_ms: 0,
        };
        let g = parse(br#"{"access_token":"new","expires_in":3600}"#, Some(&previous), 1_000).unwrap();
        let c = g.credential;
        assert_eq!((c.access_token.as_str(), c.refresh_token.as_str()), ("new", "old-r"));
        assert_eq!(c.expires_at_ms, 1_000 + 3_600_000);
        assert_eq!(c.identity.organization.as_deref(), Some("org-1"));
        let g = parse(
            br#"{"access_token":"a","refresh_token":"r2","scope":"user:inference user:profile","organization":{"uuid":"org-2"},"account":{"uuid":"acc","email_address":"x@y"}}"#,
            Some(&previous),
            0,
        )
        .unwrap();
        assert_eq!(g.credential.refresh_token, "r2");
        assert_eq!(g.credential.expires_at_ms, 55 * 60 * 1000, "no expires_in: 55 minutes");
        assert_eq!(g.credential.identity.organization.as_deref(), Some("org-2"));
        assert_eq!(g.credential.scopes.len(), 2);
        assert!(matches!(parse(b"<html>", None, 0), Err(TokenError::Unavailable(_))));
    }

    #[test]
    fn form_values_are_percent_encoded() {
        assert_eq!(encode("a b/c+d=é"), "a%20b%2Fc%2Bd%3D%C3%A9");
        assert_eq!(encode("Az09-._~"), "Az09-._~");
    }
}
