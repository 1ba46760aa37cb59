//! `[server]` and `[gateway]`: where poolgate listens, who may call it, and how it
//! treats requests (body limit, failover bound, admission queue, timeouts).

use serde::{Deserialize, Serialize};

/// `[server]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address to listen on.
    pub listen: String,
    /// Largest request body accepted, MiB (Claude Code sends ~90 KB per turn and
    /// several MB with images); larger bodies get 413.
    pub max_body_mb: usize,
    /// Largest request head accepted, bytes: every header's name and value plus
    /// the 4 bytes of `: ` and CRLF, as on the wire. Larger heads get 431.
    pub max_header_bytes: usize,
    /// How long a shutdown waits for in-flight requests and streams, ms,
    /// counted from the signal; a stream still open then is ended with an
    /// SSE `error` event.
    pub shutdown_grace_ms: u64,
    /// After SIGTERM, how long the listener keeps accepting connections, ms,
    /// while `/readyz` answers 503, so a load balancer can move traffic away.
    /// Part of the grace period, so smaller than `shutdown_grace_ms`.
    pub drain_ms: u64,
    /// How long a client may take to send a request head, ms: from its first
    /// byte (on a new connection, from the connect). Past it: 408.
    pub header_timeout_ms: u64,
    /// How long a client may take to send a request body, ms, from the end of
    /// its head. Past it: 408.
    pub body_timeout_ms: u64,
    /// How long a keep-alive connection may stay idle between requests, ms.
    pub idle_timeout_ms: u64,
    /// How long the gateway may wait for a client to accept a byte of its
    /// answer, ms: past it (the client reads nothing, its window full) the
    /// connection is closed and the upstream request cancelled. Counted only
    /// while something waits to be written: a quiet stream never trips it.
    pub send_timeout_ms: u64,
    /// The most client connections open at once; 0 derives it from the
    /// open-file limit. Past it a connection gets a 503 and is closed.
    pub max_connections: usize,
    /// Decision records kept for `GET /admin/decisions`.
    pub decisions_kept: usize,
    /// `text` or `json` log lines.
    pub log_format: LogFormat,
    /// Environment variable holding the admin token (for `/status`, `/admin/*`).
    pub admin_token_env: Option<String>,
    /// SHA-256 (hex) of the admin token, as an alternative to the env variable.
    pub admin_token_sha256: Option<String>,
    /// Keys clients present (`x-api-key` or `Authorization: Bearer`).
    pub client_keys: Vec<ClientKey>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:8787".into(),
            max_body_mb: 32,
            max_header_bytes: 32 << 10,
            shutdown_grace_ms: 30_000,
            drain_ms: 5_000,
            header_timeout_ms: 10_000,
            body_timeout_ms: 60_000,
            idle_timeout_ms: 75_000,
            // nginx's `send_timeout` default; a client that takes nothing for
            // a minute while bytes wait is stuck, not slow (a model's own
            // silences do not count: nothing waits then).
            send_timeout_ms: 60_000,
            max_connections: 0,
            decisions_kept: 200,
            log_format: LogFormat::Text,
            admin_token_env: None,
            admin_token_sha256: None,
            client_keys: Vec::new(),
        }
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// One `[[server.client_keys]]` entry. The key itself is never in the file: give
/// its SHA-256, or the environment variable that holds it. Its limits are
/// written beside its name (`budget_usd_day = 20`), as a run-time key's are.
///
/// Unknown keys are refused by the shape pass (`validate::shape`, against
/// `schema::CLIENT_KEY`) before serde reads the entry: serde's own
/// `deny_unknown_fields` does not combine with the flattened limits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClientKey {
    /// A name for logs and metrics (never the key).
    pub name: String,
    /// SHA-256 of the key, hex.
    #[serde(default)]
    pub sha256: Option<String>,
    /// Environment variable holding the key.
    #[serde(default)]
    pub key_env: Option<String>,
    /// A team tag: the usage ledger's reports group keys by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// What the key may do: models, rates, budgets (every one optional).
    #[serde(flatten)]
    pub limits: crate::ledger::keys::KeyLimits,
}

impl ClientKey {
    /// What the key may do.
    pub fn policy(&self) -> crate::ledger::limits::KeyPolicy {
        self.limits.policy()
    }

    /// Whether the key has a budget (which needs the usage ledger, to
    /// survive a restart).
    pub fn has_budget(&self) -> bool {
        !self.policy().budgets.is_empty()
    }
}

/// `[gateway]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// Most accounts one request may try (0 = every account in the pool).
    pub max_attempts: usize,
    /// Requests allowed to wait for an in-flight slot.
    pub queue_max: usize,
    /// How long a request waits for a slot before 429 `queue_timeout`, ms.
    pub queue_timeout_ms: u64,
    /// Upstream connect timeout, ms.
    pub connect_timeout_ms: u64,
    /// Time allowed until the upstream's response headers, ms.
    pub response_timeout_ms: u64,
    /// Client headers forwarded upstream beyond the built-in allow-list:
    /// lowercase names (`x-team`) or prefixes (`x-team-*`).
    pub forward_headers: Vec<String>,
    /// In a stream poolgate writes itself (an OpenAI-shaped client's
    /// translation, a fallback backend's answer), a keep-alive after this long
    /// without a byte, ms (0: none): Claude Code gives up on a gateway stream
    /// after 300 s of silence, other clients and proxies sooner.
    pub stream_keepalive_ms: u64,
    /// What an account's answer tells the client in its
    /// `anthropic-ratelimit-unified-*` headers: the pool's quota (`pool`,
    /// `learned::pooled`) or the serving account's own, as sent (`account`).
    pub unified_headers: UnifiedHeaders,
}

/// `[gateway] unified_headers`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnifiedHeaders {
    /// The pool's windows, pooled over its seats (docs/keys.md).
    #[default]
    Pool,
    /// The serving account's headers, relayed as sent.
    Account,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            max_attempts: 0,
            queue_max: 256,
            queue_timeout_ms: 60_000,
            connect_timeout_ms: 10_000,
            response_timeout_ms: 600_000,
            forward_headers: Vec::new(),
            stream_keepalive_ms: 15_000,
            unified_headers: UnifiedHeaders::Pool,
        }
    }
}

/// The meaning checks of `[server]` beyond its shape: the drain window fits
/// inside the grace period.
pub fn check(s: &ServerConfig, add: &mut impl FnMut(String, String)) {
    if s.drain_ms > 0 && s.drain_ms >= s.shutdown_grace_ms {
        add(
            "server.drain_ms".into(),
            format!(
                "{} is not below shutdown_grace_ms ({}): the grace period counts from the signal and the drain \
                 window is part of it, so open streams would get no time after the listener closes",
                s.drain_ms, s.shutdown_grace_ms
            ),
        );
    }
}
