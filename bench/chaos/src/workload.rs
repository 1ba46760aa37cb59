//! The mixed workload: what clients send, and what each of them got.
//!
//! Each client task sends one request at a time, each time to a random
//! replica with a random client key, of a random kind — Messages JSON and
//! streams (plain, with extended thinking, with a tool), `count_tokens`, Chat
//! Completions JSON and streams — and classifies the answer by what a client
//! could do with it.

use std::time::{Duration, Instant};

use reqwest::header::CONTENT_TYPE;
use serde_json::{Value, json};

use crate::faults::Rng;
use crate::grammar::{self, Ending};
use crate::world::{CLIENT_KEYS, HOSTILE_MODEL};

/// What a request asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `POST /v1/messages`, JSON.
    MessagesJson,
    /// `POST /v1/messages`, a stream of text.
    MessagesStream,
    /// A stream with a thinking block before the text.
    ThinkingStream,
    /// A stream that ends in a tool call.
    ToolStream,
    /// `POST /v1/messages/count_tokens`.
    CountTokens,
    /// `POST /v1/chat/completions`, JSON.
    ChatJson,
    /// `POST /v1/chat/completions`, a stream.
    ChatStream,
}

impl Kind {
    const ALL: [Kind; 7] = [
        Kind::MessagesJson,
        Kind::MessagesStream,
        Kind::ThinkingStream,
        Kind::ToolStream,
        Kind::CountTokens,
        Kind::ChatJson,
        Kind::ChatStream,
    ];

    fn streams(self) -> bool {
        matches!(self, Kind::MessagesStream | Kind::ThinkingStream | Kind::ToolStream | Kind::ChatStream)
    }

    fn chat(self) -> bool {
        matches!(self, Kind::ChatJson | Kind::ChatStream)
    }
}

/// What the client could make of an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Class {
    /// A whole, well-formed answer (`fallback`: the fallback's).
    Served {
        /// Whether the fallback backend answered.
        fallback: bool,
    },
    /// A stream that ended with an error event after a cut upstream.
    CleanCut,
    /// A JSON answer whose body broke off after its head (no failover is
    /// possible after the first byte; the client sees the connection end).
    JsonCut,
    /// A 429 from the gateway.
    TooMany,
    /// Any other failure: a status, or no answer.
    Failed(String),
    /// An answer whose shape broke: a stream against its grammar, a JSON
    /// answer that ended cleanly yet does not parse.
    Broken(String),
}

/// One request's outcome.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// What it asked.
    pub kind: Kind,
    /// When it was sent.
    pub start: Instant,
    /// When its answer was read whole (or failed).
    pub end: Instant,
    /// What it got.
    pub class: Class,
    /// The account that answered (`x-poolgate-account`), if one did.
    pub account: String,
}

/// Sends requests from one client until `until`; every outcome.
pub async fn client(replicas: Vec<String>, until: Instant, seed: u64) -> Vec<Outcome> {
    let mut rng = Rng::new(seed);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(2)
        .build()
        .expect("a reqwest client");
    let mut out = Vec::new();
    while Instant::now() < until {
        let kind = *rng.pick(&Kind::ALL);
        let base = rng.pick(&replicas).clone();
        let key = *rng.pick(&CLIENT_KEYS);
        let session = format!("chaos-session-{}", rng.range(0, 40));
        let model = *rng.pick(&["claude-sonnet-4-5", HOSTILE_MODEL]);
        let start = Instant::now();
        let (class, account) = send(&http, &base, key, Ask { kind, session: &session, model }).await;
        out.push(Outcome { kind, start, end: Instant::now(), class, account });
    }
    out
}

/// One request's choices.
struct Ask<'a> {
    kind: Kind,
    session: &'a str,
    model: &'a str,
}

async fn send(http: &reqwest::Client, base: &str, key: &str, ask: Ask<'_>) -> (Class, String) {
    let mut account = String::new();
    let class = classify(http, base, key, ask, &mut account).await;
    (class, account)
}

async fn classify(http: &reqwest::Client, base: &str, key: &str, ask: Ask<'_>, account: &mut String) -> Class {
    let kind = ask.kind;
    let (path, body) = request(&ask);
    let mut req = http.post(format!("{base}{path}")).json(&body);
    req = match kind.chat() {
        true => req.bearer_auth(key),
        false => req.header("x-api-key", key).header("anthropic-version", "2023-06-01"),
    };
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => return Class::Failed(format!("no answer: {e}")),
    };
    let status = resp.status().as_u16();
    let fallback = resp.headers().contains_key("x-poolgate-fallback");
    let sse = resp.headers().get(CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let served_by = resp.headers().get("x-poolgate-account").and_then(|v| v.to_str().ok());
    *account = served_by.unwrap_or("").to_string();
    let body = resp.bytes().await;
    if status == 429 {
        return Class::TooMany;
    }
    if !(200..300).contains(&status) {
        let text = body.map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
        return Class::Failed(format!("{status} (account `{account}`): {}", truncate(&text)));
    }
    let text = match body {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) if kind.streams() => return Class::Broken(format!("the stream's connection broke: {e}")),
        Err(_) => return Class::JsonCut,
    };
    if kind.streams() != sse {
        return Class::Broken(format!("asked stream={} and got content-type event-stream={sse}", kind.streams()));
    }
    let ending = match kind {
        Kind::ChatStream => grammar::chat(&text),
        k if k.streams() => grammar::messages(&text),
        _ => return json_answer(kind, &text, fallback),
    };
    match ending {
        Ending::Whole => Class::Served { fallback },
        Ending::CleanError => Class::CleanCut,
        Ending::Broken(why) => Class::Broken(why),
    }
}

fn json_answer(kind: Kind, text: &str, fallback: bool) -> Class {
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        return Class::Broken(format!("a JSON answer that does not parse ({} bytes)", text.len()));
    };
    let whole = match kind {
        Kind::CountTokens => v["input_tokens"].is_u64(),
        Kind::ChatJson => v["choices"][0]["message"].is_object(),
        _ => v["type"] == "message" && v["content"].is_array(),
    };
    match whole {
        true => Class::Served { fallback },
        false => Class::Broken(format!("a JSON answer of the wrong shape: {}", truncate(text))),
    }
}

fn truncate(s: &str) -> &str {
    &s[..s.char_indices().nth(200).map_or(s.len(), |(i, _)| i)]
}

/// The path and body of a request of `kind`.
fn request(ask: &Ask<'_>) -> (&'static str, Value) {
    let (kind, model) = (ask.kind, ask.model);
    let messages = json!([{"role": "user", "content": "What is the weather in Zürich?"}]);
    let metadata = json!({"user_id": format!("user_chaos_account__session_{}", ask.session)});
    let mut body = json!({"model": model, "max_tokens": 256, "messages": messages, "metadata": metadata});
    match kind {
        Kind::MessagesJson => {}
        Kind::MessagesStream => body["stream"] = json!(true),
        Kind::ThinkingStream => {
            body["stream"] = json!(true);
            body["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
        }
        Kind::ToolStream => {
            body["stream"] = json!(true);
            body["tools"] = json!([{"name": "get_weather", "description": "Weather of a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]);
        }
        Kind::CountTokens => {
            return ("/v1/messages/count_tokens", json!({"model": model, "messages": body["messages"]}));
        }
        Kind::ChatJson | Kind::ChatStream => {
            let mut chat = json!({"model": model, "max_tokens": 256, "messages": body["messages"]});
            if kind == Kind::ChatStream {
                chat["stream"] = json!(true);
                chat["stream_options"] = json!({"include_usage": true});
            }
            return ("/v1/chat/completions", chat);
        }
    }
    ("/v1/messages", body)
}
