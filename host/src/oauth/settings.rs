//! `[oauth]`: where subscription seats get and refresh their tokens, and when.
//! The defaults are Claude Code's public OAuth client; tests point the URLs at
//! the mock upstream. The refresh itself is `crate::oauth`'s.

use serde::{Deserialize, Serialize};

/// Claude Code's public OAuth client id.
pub const CLAUDE_CODE_CLIENT_ID: &str = "9d1c250a-e61b-44d9-88ed-5944d1962f5e";

/// OAuth endpoints and refresh timing. Durations in ms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OAuthConfig {
    /// The token endpoint (refresh and authorization-code grants).
    pub token_url: String,
    /// Where `poolgate login` sends the operator to approve access.
    pub authorize_url: String,
    /// Where the authorize page sends the code (shown to paste back).
    pub redirect_uri: String,
    /// The OAuth client id.
    pub client_id: String,
    /// Scopes asked for at login, space-separated.
    pub scopes: String,
    /// Refresh a seat once its token has less than this left.
    pub refresh_before_ms: u64,
    /// How often seats are checked for an upcoming expiry.
    pub check_interval_ms: u64,
    /// Longest wait for the token endpoint.
    pub timeout_ms: u64,
    /// How long a request that met a 401 on a seat waits for the seat's
    /// refresh before it fails over to another account; the refresh goes
    /// on (bounded by `timeout_ms`) and the seat serves again once it lands.
    pub request_wait_ms: u64,
    /// Longest pause between refresh attempts of a seat whose refreshes fail
    /// for want of an answer (the pause doubles from 5 s up to this).
    pub max_backoff_ms: u64,
    /// Poll `/api/oauth/usage` for a seat whose newest quota reading is older
    /// than this (an idle seat, or a fresh gateway); 0 never polls.
    pub usage_poll_ms: u64,
    /// What to do when an answer was billed as extra usage (overage).
    pub overage: Overage,
}

/// The overage guard: what an answer billed as extra usage does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Overage {
    /// Nothing but the count in metrics.
    Allow,
    /// A warning in the log too.
    Warn,
    /// Rest the seat until its windows reset and route elsewhere: no
    /// subscription traffic is billed as extra usage unnoticed.
    #[default]
    Avoid,
}

impl Default for OAuthConfig {
    fn default() -> Self {
        OAuthConfig {
            token_url: "https://console.anthropic.com/v1/oauth/token".into(),
            authorize_url: "https://claude.ai/oauth/authorize".into(),
            redirect_uri: "https://console.anthropic.com/oauth/code/callback".into(),
            client_id: CLAUDE_CODE_CLIENT_ID.into(),
            scopes: "org:create_api_key user:profile user:inference".into(),
            refresh_before_ms: 45 * 60 * 1000,
            check_interval_ms: 5 * 60 * 1000,
            timeout_ms: 15_000,
            request_wait_ms: 3_000,
            max_backoff_ms: 5 * 60 * 1000,
            usage_poll_ms: 5 * 60 * 1000,
            overage: Overage::default(),
        }
    }
}
