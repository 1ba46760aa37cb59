//! The demo's own clients: concurrent sessions that talk to the gateway over
//! real HTTP as Claude Code does — a stable session id in
//! `x-claude-code-session-id` and `metadata.user_id`, a large system prompt and
//! tool definitions on every turn, a conversation that grows, a tool round trip
//! now and then, mostly streamed replies — so what the table shows is the
//! gateway's ordinary request path, not a shortcut into it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::account::model_family;
use crate::random::{splitmix, uuid_like};

/// The models sessions use, one per session in turn.
const MODELS: &[&str] = &["claude-sonnet-4-5", "claude-opus-4-1", "claude-fable-5"];

/// What users ask, in turn.
const PROMPTS: &[&str] = &[
    "The reset test fails on CI but not locally. Can you find out why?",
    "Add a test for an empty pool.",
    "Make the error message name the config key that is wrong.",
    "Refactor the window arithmetic into its own module.",
    "Why is the p99 latency higher after the last change?",
    "Document the new option in the configuration guide.",
];

/// What the traffic did, as the clients saw it.
#[derive(Debug, Clone, Default)]
pub struct Counts {
    /// Requests answered (any status).
    pub requests: u64,
    /// Answers by status.
    pub by_status: BTreeMap<u16, u64>,
    /// Successful answers by the account that served them (`x-poolgate-account`).
    pub served: BTreeMap<String, u64>,
    /// Successful answers by model family, then account.
    pub by_family: BTreeMap<String, BTreeMap<String, u64>>,
    /// Sessions started.
    pub sessions: u64,
    /// Replies that called a tool.
    pub tool_calls: u64,
    /// Requests that failed without an HTTP answer, or whose stream broke.
    pub transport_errors: u64,
    /// For each session that was served, the accounts that served it: with
    /// the default chain's affinity, one while that account stays usable.
    pub accounts_by_session: BTreeMap<String, std::collections::BTreeSet<String>>,
}

impl Counts {
    /// (sessions served, of those served by one account only).
    pub fn sessions_staying_put(&self) -> (usize, usize) {
        let served = self.accounts_by_session.len();
        (served, self.accounts_by_session.values().filter(|a| a.len() == 1).count())
    }
}

/// Running sessions.
pub struct Traffic {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    counts: Arc<Mutex<Counts>>,
}

impl Traffic {
    /// Starts `sessions` concurrent sessions against the gateway at `base`,
    /// authenticating with `key`.
    pub fn start(base: &str, key: &str, sessions: u32) -> Result<Traffic> {
        crate::https::install_crypto();
        let client = reqwest::Client::builder().tcp_nodelay(true).timeout(Duration::from_secs(120)).build()?;
        let (stop, stopped) = watch::channel(false);
        let counts = Arc::new(Mutex::new(Counts::default()));
        let seed = crate::clock::now_ms();
        let tasks = (0..sessions)
            .map(|n| {
                let client = Client { http: client.clone(), url: format!("{base}/v1/messages"), key: key.to_string() };
                tokio::spawn(session_loop(n, seed, client, counts.clone(), stopped.clone()))
            })
            .collect();
        Ok(Traffic { stop, tasks, counts })
    }

    /// The counts so far.
    pub fn counts(&self) -> Counts {
        self.counts.lock().clone()
    }

    /// Stops the sessions: each finishes the request it is in, for up to 3 s.
    pub async fn stop(mut self) -> Counts {
        let _ = self.stop.send(true);
        let all = futures_util::future::join_all(self.tasks.iter_mut());
        if tokio::time::timeout(Duration::from_secs(3), all).await.is_err() {
            for t in &self.tasks {
                t.abort();
            }
        }
        self.counts.lock().clone()
    }
}

struct Client {
    http: reqwest::Client,
    url: String,
    key: String,
}

/// One answer, as far as a session cares.
struct Answer {
    status: u16,
    account: Option<String>,
    retry_after: Option<Duration>,
    /// The assistant message's content blocks (text, tool_use).
    content: Vec<Value>,
    /// The tool call to answer next turn: (id, name).
    tool: Option<(String, String)>,
}

async fn session_loop(n: u32, seed: u64, client: Client, counts: Arc<Mutex<Counts>>, mut stop: watch::Receiver<bool>) {
    let model = MODELS[n as usize % MODELS.len()];
    let family = model_family(model).unwrap_or("other").to_string();
    let mut rng = seed ^ (u64::from(n) << 32);
    let mut next = move || {
        rng = splitmix(rng);
        rng
    };
    let system = system_prompt();
    loop {
        let session = uuid_like(next(), next());
        let user_id = json!({ "device_id": format!("{:016x}{:016x}", next(), next()), "account_uuid": "", "session_id": session }).to_string();
        counts.lock().sessions += 1;
        let mut history: Vec<Value> = Vec::new();
        let mut tool: Option<(String, String)> = None;
        let turns = 4 + next() % 6;
        let mut turn = 0;
        while turn < turns {
            if *stop.borrow() {
                return;
            }
            let user = next_user(tool.take(), &mut next);
            let mut messages = history.clone();
            messages.push(user.clone());
            // Every third turn that is not answering a tool asks for one, so
            // tool round trips show up in the traffic.
            let force_tool = !matches!(user["content"], Value::Array(_)) && turn % 3 == 1;
            let stream = (u64::from(n) + turn) % 4 != 3;
            let body = request_body(model, stream, &system, messages, &user_id, force_tool);
            let wait = match send(&client, &session, &body).await {
                Ok(a) => {
                    count(&counts, &a, &family, &session);
                    if a.status == 200 {
                        history.push(user);
                        history.push(json!({ "role": "assistant", "content": a.content }));
                        tool = a.tool;
                        turn += 1;
                        // A user reads the answer and types the next prompt.
                        Duration::from_millis(200 + next() % 700)
                    } else {
                        // Claude Code waits as told (capped here to keep the demo lively).
                        a.retry_after.unwrap_or(Duration::from_secs(1)).min(Duration::from_secs(3))
                    }
                }
                Err(()) => {
                    counts.lock().transport_errors += 1;
                    Duration::from_secs(1)
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => return,
            }
        }
    }
}

/// The user's next message: the result of the tool the last answer called,
/// else the next prompt.
fn next_user(tool: Option<(String, String)>, next: &mut impl FnMut() -> u64) -> Value {
    match tool {
        Some((id, name)) => {
            json!({ "role": "user", "content": [{ "type": "tool_result", "tool_use_id": id, "content": format!("(simulated output of {name})") }] })
        }
        None => {
            json!({ "role": "user", "content": PROMPTS[(next() % PROMPTS.len() as u64) as usize] })
        }
    }
}

/// A request as Claude Code builds one: the whole system prompt and tool list
/// on every turn, the session in `metadata.user_id`.
fn request_body(
    model: &str,
    stream: bool,
    system: &str,
    messages: Vec<Value>,
    user_id: &str,
    force_tool: bool,
) -> Value {
    let mut body = json!({
        "model": model,
        "max_tokens": 1024,
        "stream": stream,
        "system": [{ "type": "text", "text": system }],
        "messages": messages,
        "tools": tools(),
        "metadata": { "user_id": user_id },
    });
    if force_tool {
        body["tool_choice"] = json!({ "type": "any" });
    }
    body
}

/// Counts one answer by status; a served one also by account, per model
/// family and per session.
fn count(counts: &Mutex<Counts>, a: &Answer, family: &str, session: &str) {
    let mut c = counts.lock();
    c.requests += 1;
    *c.by_status.entry(a.status).or_default() += 1;
    if a.status == 200 {
        let account = a.account.clone().unwrap_or_else(|| "?".into());
        *c.served.entry(account.clone()).or_default() += 1;
        *c.by_family.entry(family.to_string()).or_default().entry(account.clone()).or_default() += 1;
        c.accounts_by_session.entry(session.to_string()).or_default().insert(account);
        c.tool_calls += u64::from(a.tool.is_some());
    }
}

async fn send(client: &Client, session: &str, body: &Value) -> Result<Answer, ()> {
    let r = client
        .http
        .post(&client.url)
        .header("x-api-key", &client.key)
        .header("anthropic-version", "2023-06-01")
        .header("content-type", "application/json")
        .header("x-claude-code-session-id", session)
        .header("x-app", "cli")
        .body(body.to_string())
        .send()
        .await
        .map_err(drop)?;
    let status = r.status().as_u16();
    let header = |n: &str| r.headers().get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
    let account = header("x-poolgate-account");
    let retry_after = header("retry-after").and_then(|v| v.parse::<u64>().ok()).map(Duration::from_secs);
    let sse = header("content-type").is_some_and(|t| t.starts_with("text/event-stream"));
    let bytes = r.bytes().await.map_err(drop)?;
    let mut answer = Answer { status, account, retry_after, content: Vec::new(), tool: None };
    if status != 200 {
        return Ok(answer);
    }
    let message =
        if sse { assemble(&bytes).ok_or(())? } else { serde_json::from_slice::<Value>(&bytes).map_err(drop)? };
    answer.content = message["content"].as_array().cloned().unwrap_or_default();
    answer.tool = answer.content.iter().find(|b| b["type"] == "tool_use").map(|b| {
        (b["id"].as_str().unwrap_or_default().to_string(), b["name"].as_str().unwrap_or_default().to_string())
    });
    Ok(answer)
}

/// Rebuilds the message a stream carried, as an SDK does; `None` if the stream
/// ended before `message_stop`.
fn assemble(sse: &[u8]) -> Option<Value> {
    let text = std::str::from_utf8(sse).ok()?;
    let mut message = Value::Null;
    let mut partial: BTreeMap<u64, String> = BTreeMap::new();
    let mut stopped = false;
    for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let event: Value = serde_json::from_str(data).ok()?;
        let index = event["index"].as_u64().unwrap_or(0);
        match event["type"].as_str()? {
            "message_start" => message = event["message"].clone(),
            "content_block_start" => message["content"].as_array_mut()?.push(event["content_block"].clone()),
            "content_block_delta" => {
                let block = message["content"].get_mut(index as usize)?;
                if let Some(t) = event["delta"]["text"].as_str() {
                    let joined = format!("{}{t}", block["text"].as_str().unwrap_or_default());
                    block["text"] = Value::from(joined);
                }
                if let Some(p) = event["delta"]["partial_json"].as_str() {
                    partial.entry(index).or_default().push_str(p);
                }
            }
            "message_stop" => stopped = true,
            _ => {}
        }
    }
    for (index, json) in partial {
        message["content"][index as usize]["input"] = serde_json::from_str(&json).ok()?;
    }
    stopped.then_some(message)
}

/// A system prompt of Claude Code's order of size (a few KB), so input tokens
/// — and with them the quota each request spends — are realistic.
fn system_prompt() -> String {
    let paragraph = "You are an interactive CLI tool that helps users with software engineering tasks. \
        Use the instructions below and the tools available to you to assist the user. \
        Keep answers short, cite file paths with line numbers, and run the tests before you say a change is done. ";
    paragraph.repeat(24)
}

/// Read-only tools, like the ones Claude Code declares.
fn tools() -> Value {
    json!([
        { "name": "Read", "description": "Reads a file from the local filesystem.",
          "input_schema": { "type": "object", "properties": { "file_path": { "type": "string" } }, "required": ["file_path"] } },
        { "name": "Grep", "description": "Searches file contents with a regular expression.",
          "input_schema": { "type": "object", "properties": { "pattern": { "type": "string" }, "path": { "type": "string" } }, "required": ["pattern"] } },
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_reassembled_into_its_message() {
        let sse = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[]}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi \"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"there\"}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"Read\",\"input\":{}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"file_\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"path\\\":\\\"x\\\"}\"}}\n\n",
        );
        assert!(assemble(sse.as_bytes()).is_none(), "no message_stop: incomplete");
        let done = format!("{sse}event: message_stop\ndata: {{\"type\":\"message_stop\"}}\n\n");
        let m = assemble(done.as_bytes()).unwrap();
        assert_eq!(m["content"][0]["text"], "Hi there");
        assert_eq!(m["content"][1]["input"], json!({ "file_path": "x" }));
    }
}
