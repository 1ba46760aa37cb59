//! The other way, for the fallback: an Anthropic client served by an OpenAI
//! (or OpenAI-compatible) backend. A Messages request becomes a Chat
//! Completions request, and the backend's answer and errors become Anthropic's.
//!
//! What Anthropic has and Chat Completions has not — server tools, documents
//! other than PDFs, images inside tool results — is refused with the message of
//! a 400 `invalid_request_error`; what only tunes the answer (`top_k`,
//! `thinking`) is dropped.

use serde_json::{Map, Value, json};

use crate::error::ErrorType;

/// Translates a Messages request into a Chat Completions request for
/// `backend_model`. A refusal is the message of a 400 `invalid_request_error`
/// (see [`crate::error::body`]).
///
/// `max_tokens` is sent as `max_completion_tokens` (OpenAI's current name, the
/// only one its reasoning models accept); a stream asks for
/// `stream_options.include_usage`, which the Anthropic `message_delta` needs.
pub fn messages_to_chat_request(messages_body: &Value, backend_model: &str) -> Result<Value, String> {
    let req = messages_body.as_object().ok_or("the request body must be a JSON object")?;
    let turns = req.get("messages").and_then(Value::as_array).ok_or("messages: Field required")?;
    let mut messages = Vec::new();
    if let Some(system) = req.get("system").filter(|s| !s.is_null()) {
        messages.push(json!({"role": "system", "content": joined_text(system, "system")?}));
    }
    for (i, turn) in turns.iter().enumerate() {
        match turn.get("role").and_then(Value::as_str) {
            Some("user") => user(turn.get("content"), i, &mut messages)?,
            Some("assistant") => messages.push(assistant(turn.get("content"), i)?),
            _ => return Err(format!("messages.{i}.role: Input should be 'user' or 'assistant'")),
        }
    }
    let mut out = Map::new();
    out.insert("model".into(), json!(backend_model));
    out.insert("messages".into(), Value::Array(messages));
    if let Some(n) = req.get("max_tokens").and_then(Value::as_u64) {
        out.insert("max_completion_tokens".into(), json!(n));
    }
    for key in ["temperature", "top_p"] {
        if let Some(v) = req.get(key).filter(|v| v.is_number()) {
            out.insert(key.into(), v.clone());
        }
    }
    if let Some(stops) = req.get("stop_sequences").and_then(Value::as_array).filter(|s| !s.is_empty()) {
        out.insert("stop".into(), Value::Array(stops.clone()));
    }
    if let Some(user) = req.get("metadata").and_then(|m| m.get("user_id")).and_then(Value::as_str) {
        out.insert("user".into(), json!(user));
    }
    tools(req, &mut out)?;
    if req.get("stream") == Some(&json!(true)) {
        out.insert("stream".into(), json!(true));
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Ok(Value::Object(out))
}

/// A system prompt or a tool result: a string, or text blocks joined.
fn joined_text(v: &Value, at: &str) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => blocks
            .iter()
            .map(|b| match (b["type"].as_str(), b["text"].as_str()) {
                (Some("text"), Some(t)) => Ok(t),
                _ => Err(format!("{at}: only text blocks can be sent to this backend")),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|t| t.concat()),
        _ => Err(format!("{at}: Input should be a valid string or list")),
    }
}

fn blocks_of(content: Option<&Value>) -> Vec<Value> {
    match content {
        Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
        Some(Value::Array(blocks)) => blocks.clone(),
        _ => Vec::new(),
    }
}

/// A user turn: its tool results first, as `tool` messages (they answer the
/// assistant message just before), then the rest as one user message.
fn user(content: Option<&Value>, i: usize, out: &mut Vec<Value>) -> Result<(), String> {
    let mut parts = Vec::new();
    for (j, b) in blocks_of(content).iter().enumerate() {
        let at = format!("messages.{i}.content.{j}");
        match b["type"].as_str() {
            Some("tool_result") => {
                let text = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => joined_text(c, &at)?,
                };
                out.push(json!({"role": "tool", "tool_call_id": b["tool_use_id"], "content": text}));
            }
            Some("text") => parts.push(json!({"type": "text", "text": b["text"]})),
            Some("image") => parts.push(image_part(&b["source"], &at)?),
            Some("document") if b["source"]["media_type"] == "application/pdf" && b["source"]["type"] == "base64" => {
                let data = format!("data:application/pdf;base64,{}", b["source"]["data"].as_str().unwrap_or(""));
                parts.push(json!({"type": "file", "file": {"file_data": data}}));
            }
            other => return Err(format!("{at}: blocks of type {other:?} cannot be sent to this backend")),
        }
    }
    match parts.as_slice() {
        [] => {}
        [only] if only["type"] == "text" => out.push(json!({"role": "user", "content": only["text"]})),
        _ => out.push(json!({"role": "user", "content": parts})),
    }
    Ok(())
}

fn image_part(source: &Value, at: &str) -> Result<Value, String> {
    let url = match source["type"].as_str() {
        Some("base64") => format!(
            "data:{};base64,{}",
            source["media_type"].as_str().unwrap_or("image/png"),
            source["data"].as_str().unwrap_or("")
        ),
        Some("url") => source["url"].as_str().unwrap_or("").to_owned(),
        _ => return Err(format!("{at}: only base64 and url images can be sent to this backend")),
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

/// An assistant turn: its texts as `content`, its tool calls as `tool_calls`;
/// thinking is dropped (the backend has no field for it).
fn assistant(content: Option<&Value>, i: usize) -> Result<Value, String> {
    let mut text = String::new();
    let mut calls = Vec::new();
    for (j, b) in blocks_of(content).iter().enumerate() {
        match b["type"].as_str() {
            Some("text") => text.push_str(b["text"].as_str().unwrap_or("")),
            Some("tool_use") => calls.push(json!({"id": b["id"], "type": "function",
                "function": {"name": b["name"], "arguments": b.get("input").unwrap_or(&json!({})).to_string()}})),
            Some("thinking" | "redacted_thinking") => {}
            other => {
                return Err(format!(
                    "messages.{i}.content.{j}: blocks of type {other:?} cannot be sent to this backend"
                ));
            }
        }
    }
    let content = if text.is_empty() && !calls.is_empty() { Value::Null } else { json!(text) };
    let mut m = json!({"role": "assistant", "content": content});
    if !calls.is_empty() {
        m["tool_calls"] = Value::Array(calls);
    }
    Ok(m)
}

/// `tools` (client tools only: a server tool runs at Anthropic) and `tool_choice`.
fn tools(req: &Map<String, Value>, out: &mut Map<String, Value>) -> Result<(), String> {
    let Some(list) = req.get("tools").and_then(Value::as_array).filter(|l| !l.is_empty()) else { return Ok(()) };
    let mut tools = Vec::new();
    for (i, t) in list.iter().enumerate() {
        if t.get("type").is_some_and(|k| k != "custom") {
            return Err(format!("tools.{i}: server tools ({}) cannot be sent to this backend", t["type"]));
        }
        let mut f =
            json!({"name": t["name"], "parameters": t.get("input_schema").unwrap_or(&json!({"type": "object"}))});
        if let Some(d) = t.get("description").filter(|d| d.is_string()) {
            f["description"] = d.clone();
        }
        tools.push(json!({"type": "function", "function": f}));
    }
    out.insert("tools".into(), Value::Array(tools));
    let Some(choice) = req.get("tool_choice").filter(|c| c.is_object()) else { return Ok(()) };
    let mapped = match choice["type"].as_str() {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => json!({"type": "function", "function": {"name": choice["name"]}}),
        _ => return Err("tool_choice: Input tag should be 'auto', 'any', 'tool' or 'none'".into()),
    };
    out.insert("tool_choice".into(), mapped);
    if choice.get("disable_parallel_tool_use") == Some(&json!(true)) {
        out.insert("parallel_tool_calls".into(), json!(false));
    }
    Ok(())
}

/// A `chat.completion` as an Anthropic `message` named `client_model`.
/// Tool-call arguments that are not a JSON object become `{}` (Anthropic's
/// `input` must be one); a refusal becomes the text with `stop_reason: refusal`.
pub fn chat_to_messages_answer(chat_answer: &Value, client_model: &str) -> Value {
    let choice = &chat_answer["choices"][0];
    let message = &choice["message"];
    let mut content = Vec::new();
    let text = message["content"].as_str().or(message["refusal"].as_str()).unwrap_or("");
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    for c in message["tool_calls"].as_array().into_iter().flatten() {
        let input = serde_json::from_str::<Value>(c["function"]["arguments"].as_str().unwrap_or(""))
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        content.push(json!({"type": "tool_use", "id": c["id"], "name": c["function"]["name"], "input": input}));
    }
    let refused = message["content"].is_null() && message["refusal"].is_string();
    let stop = if refused { "refusal" } else { stop_reason(choice["finish_reason"].as_str()) };
    json!({
        "id": message_id(chat_answer["id"].as_str().unwrap_or("")),
        "type": "message",
        "role": "assistant",
        "model": client_model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": anthropic_usage(&chat_answer["usage"]),
    })
}

/// `msg_{chat id}`, the `chatcmpl-` prefix dropped.
pub(crate) fn message_id(chat_id: &str) -> String {
    format!("msg_{}", chat_id.strip_prefix("chatcmpl-").unwrap_or(chat_id))
}

/// A `finish_reason` as Anthropic's `stop_reason`.
pub(crate) fn stop_reason(finish_reason: Option<&str>) -> &'static str {
    match finish_reason {
        Some("length") => "max_tokens",
        Some("tool_calls" | "function_call") => "tool_use",
        Some("content_filter") => "refusal",
        _ => "end_turn",
    }
}

/// OpenAI's usage as Anthropic's: cached prompt tokens are taken out of the
/// input tokens into `cache_read_input_tokens`.
pub(crate) fn anthropic_usage(u: &Value) -> Value {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let cached = n(&u["prompt_tokens_details"]["cached_tokens"]);
    json!({
        "input_tokens": n(&u["prompt_tokens"]).saturating_sub(cached),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": n(&u["completion_tokens"]),
    })
}

/// An OpenAI error answer (status and body) as Anthropic's: the status and the
/// envelope's text. The type follows the status, as OpenAI's clients read it.
pub fn openai_error_to_anthropic(status: u16, openai_body: &Value) -> (u16, String) {
    let kind = match status {
        401 => ErrorType::Authentication,
        403 => ErrorType::Permission,
        404 => ErrorType::NotFound,
        413 => ErrorType::RequestTooLarge,
        429 => ErrorType::RateLimit,
        503 | 529 => ErrorType::Overloaded,
        400..500 => ErrorType::InvalidRequest,
        _ => ErrorType::Api,
    };
    let message = match openai_body["error"]["message"].as_str() {
        Some(m) => m.to_owned(),
        None => format!("backend error (HTTP {status})"),
    };
    let status = if kind == ErrorType::InvalidRequest || status >= 500 { status } else { kind.status() };
    (status, crate::error::body(kind, &message, None))
}

#[cfg(test)]
#[path = "reverse_tests.rs"]
mod tests;
