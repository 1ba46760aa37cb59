//! The request every path is sent: what Claude Code sends (its ~20 headers,
//! `anthropic-beta`, `x-stainless-*`, `x-claude-code-session-id`, …, and a
//! `metadata.user_id` naming the session), or with `--bare-request` the three
//! headers and bare body of the first version of this tool.

/// The session id of every Claude Code-shaped request (one session, as a user's).
const SESSION: &str = "7f9c1a52-3b1e-4c1a-9d3e-5a8b2c7d9e01";

/// A Messages request as a client sends it: body and headers.
pub struct Request {
    pub body: String,
    pub headers: Vec<(&'static str, &'static str)>,
}

pub fn body(stream: bool) -> String {
    serde_json::json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "stream": stream,
        "messages": [{ "role": "user", "content": "hello" }],
    })
    .to_string()
}

impl Request {
    pub fn new(bare: bool, stream: bool) -> Request {
        if bare { Request::bare(stream) } else { Request::claude_code(stream) }
    }

    /// What the first version of this tool sent: three headers, no session.
    fn bare(stream: bool) -> Request {
        Request {
            body: body(stream),
            headers: vec![
                ("x-api-key", "loadgen-key-0"),
                ("anthropic-version", "2023-06-01"),
                ("content-type", "application/json"),
            ],
        }
    }

    /// What Claude Code sends (shared/references/claude-code-wire.md): its
    /// headers, and the session in `metadata.user_id` as a JSON-encoded string.
    fn claude_code(stream: bool) -> Request {
        let user_id = serde_json::json!({
            "device_id": "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "account_uuid": "",
            "session_id": SESSION,
        })
        .to_string();
        let body = serde_json::json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 64,
            "stream": stream,
            "metadata": { "user_id": user_id },
            "messages": [{ "role": "user", "content": "hello" }],
        })
        .to_string();
        Request {
            body,
            headers: vec![
                ("x-api-key", "loadgen-key-0"),
                ("anthropic-version", "2023-06-01"),
                ("content-type", "application/json"),
                ("accept", if stream { "text/event-stream" } else { "application/json" }),
                (
                    "anthropic-beta",
                    "claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14",
                ),
                ("anthropic-dangerous-direct-browser-access", "true"),
                ("x-app", "cli"),
                ("user-agent", "claude-cli/2.0.14 (external, sdk-cli)"),
                ("x-claude-code-session-id", SESSION),
                ("x-stainless-arch", "x64"),
                ("x-stainless-lang", "js"),
                ("x-stainless-os", "Linux"),
                ("x-stainless-package-version", "0.60.0"),
                ("x-stainless-retry-count", "0"),
                ("x-stainless-runtime", "node"),
                ("x-stainless-runtime-version", "v22.19.0"),
                ("x-stainless-timeout", "600"),
                ("accept-encoding", "gzip, deflate, br, zstd"),
                ("accept-language", "*"),
                ("sec-fetch-mode", "cors"),
            ],
        }
    }

    /// The request as a reqwest builder for `url`.
    pub fn to(&self, client: &reqwest::Client, url: &str) -> reqwest::RequestBuilder {
        let mut b = client.post(format!("{url}/v1/messages"));
        for (name, value) in &self.headers {
            b = b.header(*name, *value);
        }
        b.body(self.body.clone())
    }
}
