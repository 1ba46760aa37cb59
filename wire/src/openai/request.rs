//! An OpenAI Chat Completions request as an Anthropic Messages request.
//!
//! What maps is translated; what Anthropic cannot do (several choices, log
//! probabilities, JSON mode, audio, the deprecated `functions`) is refused with
//! a 400 that names the field, because answering without it would be a quiet
//! lie the client cannot detect. Sampling hints with no Anthropic counterpart
//! (`seed`, `presence_penalty`, `frequency_penalty`, `logit_bias`, `store`,
//! `service_tier`, …) are ignored: an answer without them is still a correct
//! answer. See `docs/openai.md` for the whole table.

use serde_json::{Map, Value, json};

use super::OpenAiError;
use super::messages::convert_messages;

/// `max_tokens` when the client gives neither `max_completion_tokens` nor
/// `max_tokens`: Anthropic requires one and OpenAI does not. 4096 is enough for
/// a long chat answer and within every current Claude model's output limit.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// A Chat Completions request, translated.
#[derive(Clone, Debug, PartialEq)]
pub struct Translated {
    /// The Anthropic Messages request body, its `model` resolved.
    pub body: Value,
    /// `stream: true`: answer with `chat.completion.chunk` events.
    pub stream: bool,
    /// `stream_options.include_usage`: end the stream with a usage chunk.
    pub include_usage: bool,
    /// The model as the client sent it, to echo back in the answer.
    pub model: String,
    /// `user`, if given: a stable name for the end user (also sent upstream as
    /// `metadata.user_id`), for the gateway to keep a session on one account.
    pub session: Option<String>,
}

/// Translates a Chat Completions request `body` into a Messages request.
///
/// A model named `claude-*` passes as it is; any other name is looked up with
/// `aliases` (say `gpt-4o` → `claude-sonnet-4-5`), and one it does not know is a
/// 400 naming the model. Every refusal is a 400 `invalid_request_error` whose
/// `param` names the field.
pub fn chat_to_messages(body: &Value, aliases: &dyn Fn(&str) -> Option<String>) -> Result<Translated, OpenAiError> {
    let req = body.as_object().ok_or_else(|| OpenAiError::invalid("the request body must be a JSON object", None))?;
    refuse_unsupported(req)?;
    let model = match req.get("model") {
        Some(Value::String(m)) => m.clone(),
        Some(_) => return Err(OpenAiError::invalid("model must be a string", Some("model"))),
        None => return Err(OpenAiError::invalid("you must provide a model parameter", Some("model"))),
    };
    let upstream = resolve_model(&model, aliases)?;
    let messages = match req.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        Some(Value::Array(_)) => return Err(OpenAiError::invalid("messages must not be empty", Some("messages"))),
        Some(_) => return Err(OpenAiError::invalid("messages must be an array", Some("messages"))),
        None => return Err(OpenAiError::invalid("missing required parameter: 'messages'", Some("messages"))),
    };
    let (system, turns) = convert_messages(messages)?;

    let mut out = Map::new();
    out.insert("model".into(), Value::String(upstream));
    out.insert("max_tokens".into(), max_tokens(req)?.into());
    out.insert("messages".into(), Value::Array(turns));
    if let Some(system) = system {
        out.insert("system".into(), Value::String(system));
    }
    tools(req, &mut out)?;
    sampling(req, &mut out)?;
    let session = match req.get("user") {
        None | Some(Value::Null) => None,
        Some(Value::String(u)) => Some(u.clone()),
        Some(_) => return Err(OpenAiError::invalid("user must be a string", Some("user"))),
    };
    if let Some(user) = &session {
        out.insert("metadata".into(), json!({ "user_id": user }));
    }
    let stream = flag(req, "stream")?;
    if stream {
        out.insert("stream".into(), Value::Bool(true));
    }
    let include_usage = stream && req.get("stream_options").and_then(|o| o.get("include_usage")) == Some(&json!(true));
    Ok(Translated { body: Value::Object(out), stream, include_usage, model, session })
}

/// The Anthropic model for the client's name (see [`chat_to_messages`]).
fn resolve_model(model: &str, aliases: &dyn Fn(&str) -> Option<String>) -> Result<String, OpenAiError> {
    if model.starts_with("claude-") {
        return Ok(model.to_owned());
    }
    aliases(model).ok_or_else(|| {
        OpenAiError::invalid(
            format!("The model `{model}` is not served here: name a claude-* model or a configured alias"),
            Some("model"),
        )
        .with_code("model_not_found")
    })
}

/// The fields whose meaning Anthropic has no way to honour.
fn refuse_unsupported(req: &Map<String, Value>) -> Result<(), OpenAiError> {
    let present = |k: &str| req.get(k).is_some_and(|v| !v.is_null());
    let refuse = |param: &str, why: &str| Err(OpenAiError::invalid(why.to_owned(), Some(param)));
    if present("n") && req["n"] != json!(1) {
        return refuse("n", "n > 1 is not supported: Anthropic returns one choice per request");
    }
    if req.get("logprobs") == Some(&json!(true)) || present("top_logprobs") {
        return refuse("logprobs", "logprobs are not supported: Anthropic does not return token probabilities");
    }
    if present("response_format") && req["response_format"].get("type") != Some(&json!("text")) {
        return refuse("response_format", "response_format other than text is not supported");
    }
    let audio_modality = req.get("modalities").and_then(Value::as_array).is_some_and(|m| m.contains(&json!("audio")));
    if present("audio") || audio_modality {
        return refuse("audio", "audio output is not supported");
    }
    for old in ["functions", "function_call"] {
        if present(old) {
            return refuse(old, "functions and function_call are deprecated: use tools and tool_choice");
        }
    }
    Ok(())
}

/// `max_completion_tokens`, else `max_tokens`, else [`DEFAULT_MAX_TOKENS`].
fn max_tokens(req: &Map<String, Value>) -> Result<u64, OpenAiError> {
    for key in ["max_completion_tokens", "max_tokens"] {
        match req.get(key) {
            None | Some(Value::Null) => continue,
            Some(v) => {
                return v
                    .as_u64()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| OpenAiError::invalid(format!("{key} must be a positive integer"), Some(key)));
            }
        }
    }
    Ok(DEFAULT_MAX_TOKENS)
}

fn flag(req: &Map<String, Value>, key: &str) -> Result<bool, OpenAiError> {
    match req.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(OpenAiError::invalid(format!("{key} must be a boolean"), Some(key))),
    }
}

/// `temperature`, `top_p` (passed as they are: Anthropic's own 400 for a value
/// out of its range is clearer than a silent clamp) and `stop`.
fn sampling(req: &Map<String, Value>, out: &mut Map<String, Value>) -> Result<(), OpenAiError> {
    for key in ["temperature", "top_p"] {
        match req.get(key) {
            None | Some(Value::Null) => {}
            Some(v @ Value::Number(_)) => {
                out.insert(key.into(), v.clone());
            }
            Some(_) => return Err(OpenAiError::invalid(format!("{key} must be a number"), Some(key))),
        }
    }
    let stops = match req.get("stop") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::String(s)) => vec![Value::String(s.clone())],
        Some(Value::Array(list)) if list.iter().all(Value::is_string) => list.clone(),
        Some(_) => return Err(OpenAiError::invalid("stop must be a string or an array of strings", Some("stop"))),
    };
    if !stops.is_empty() {
        out.insert("stop_sequences".into(), Value::Array(stops));
    }
    Ok(())
}

/// `tools`, `tool_choice` and `parallel_tool_calls`.
fn tools(req: &Map<String, Value>, out: &mut Map<String, Value>) -> Result<(), OpenAiError> {
    let list = match req.get("tools") {
        None | Some(Value::Null) => &Vec::new(),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(OpenAiError::invalid("tools must be an array", Some("tools"))),
    };
    let tools = list.iter().enumerate().map(|(i, t)| tool(i, t)).collect::<Result<Vec<_>, _>>()?;
    let mut choice = match req.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(c) => Some(tool_choice(c)?),
    };
    if tools.is_empty() {
        // Anthropic refuses a tool_choice without tools; OpenAI lets `auto` and
        // `none` pass, and they mean nothing without tools.
        return match choice {
            Some(c) if c["type"] == "any" || c["type"] == "tool" => {
                Err(OpenAiError::invalid("tool_choice is only allowed when tools are specified", Some("tool_choice")))
            }
            _ => Ok(()),
        };
    }
    if req.get("parallel_tool_calls") == Some(&json!(false)) {
        let c = choice.get_or_insert_with(|| json!({"type": "auto"}));
        if c["type"] != "none" {
            c["disable_parallel_tool_use"] = Value::Bool(true);
        }
    }
    out.insert("tools".into(), Value::Array(tools));
    if let Some(c) = choice {
        out.insert("tool_choice".into(), c);
    }
    Ok(())
}

/// `{type:function, function:{name, description, parameters}}` →
/// `{name, description, input_schema}`.
fn tool(i: usize, t: &Value) -> Result<Value, OpenAiError> {
    let param = format!("tools[{i}]");
    if t.get("type").and_then(Value::as_str) != Some("function") {
        return Err(OpenAiError::invalid("only function tools are supported", Some(&param)));
    }
    let f = t.get("function").unwrap_or(&Value::Null);
    let Some(name) = f.get("name").and_then(Value::as_str) else {
        return Err(OpenAiError::invalid("a function tool needs a name", Some(&format!("{param}.function.name"))));
    };
    // OpenAI lets a function without parameters take none; Anthropic needs a schema.
    let schema = match f.get("parameters") {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(p) => p.clone(),
    };
    let mut out = json!({"name": name, "input_schema": schema});
    if let Some(d) = f.get("description").and_then(Value::as_str) {
        out["description"] = Value::String(d.to_owned());
    }
    Ok(out)
}

/// `auto` → `auto`, `none` → `none` (the tools stay declared, as a conversation
/// that used them needs), `required` → `any`, a named function → `tool`.
fn tool_choice(c: &Value) -> Result<Value, OpenAiError> {
    let named = || c.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
    match (c.as_str(), c.get("type").and_then(Value::as_str)) {
        (Some("auto"), _) => Ok(json!({"type": "auto"})),
        (Some("none"), _) => Ok(json!({"type": "none"})),
        (Some("required"), _) => Ok(json!({"type": "any"})),
        (None, Some("function")) if named().is_some() => Ok(json!({"type": "tool", "name": named()})),
        _ => Err(OpenAiError::invalid(
            "tool_choice must be auto, none, required or {\"type\":\"function\",\"function\":{\"name\":…}}",
            Some("tool_choice"),
        )),
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
