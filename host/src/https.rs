//! The one HTTPS client constructor: every outbound connection poolgate makes
//! — to accounts, to the OAuth token endpoint, to a fallback backend — goes
//! through a client built here, so TLS (rustls with the platform's trust
//! store), TCP_NODELAY, the connect timeout and connection pooling are decided
//! once.
//!
//! hyper's pooled client rather than a higher-level HTTP library: the gateway
//! never follows redirects, never retries inside the client (failover is its
//! own, across accounts) and already holds the path it forwards, so URL
//! parsing, redirect and retry layers would be work done on every request for
//! nothing (docs/benchmarks.md, "Gateway overhead"). [`base_prefix`] is
//! how every base URL (an account's, a fallback's, the token endpoint's)
//! is checked and normalised.

use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

/// The part of a base URL every request path is appended to: scheme,
/// authority and path, without a trailing slash. Refuses anything but an
/// http(s) URL with a host.
pub fn base_prefix(base: &str) -> Result<String> {
    let refuse = || anyhow::anyhow!("`{base}` is not an http(s) URL with a host");
    let uri: http::Uri = base.trim().parse().map_err(|_| refuse())?;
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(refuse());
    };
    if !matches!(scheme, "http" | "https") || authority.host().is_empty() {
        return Err(refuse());
    }
    Ok(format!("{scheme}://{authority}{}", uri.path().trim_end_matches('/')))
}

/// The pooled HTTPS client type.
pub type HttpsClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Installs the TLS crypto provider (ring) for the process, once; later calls
/// are no-ops.
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Idle upstream connections kept per host: a pool's steady load, not its
/// bursts. With no bound, 10,000 streams that ended together left 10,000
/// idle connections — and their buffers, ~300 MiB — for the 90 to 180 s the
/// idle timeout takes to reap them (the soak in docs/reliability.md); a burst
/// past this pays a new connection instead.
const IDLE_PER_HOST: usize = 512;

/// A pooled client: TCP_NODELAY, `connect_timeout` per connection attempt,
/// HTTP/2 where TLS negotiates it, idle connections kept 90 s, at most
/// `IDLE_PER_HOST` of them a host.
pub fn client(connect_timeout: Duration) -> Result<HttpsClient> {
    install_crypto();
    let mut tcp = HttpConnector::new();
    tcp.set_nodelay(true);
    tcp.enforce_http(false);
    tcp.set_connect_timeout(Some(connect_timeout));
    let tls = <rustls::ClientConfig as rustls_platform_verifier::ConfigVerifierExt>::with_platform_verifier()
        .context("loading the platform's TLS trust store")?;
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(tcp);
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(IDLE_PER_HOST)
        .pool_timer(TokioTimer::new())
        .build(connector))
}
