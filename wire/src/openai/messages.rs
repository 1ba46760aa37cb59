//! A Chat Completions conversation as Anthropic's: the system prompt taken out,
//! contents made blocks, tool calls and their results made `tool_use` and
//! `tool_result` blocks, and turns that follow one another with the same role
//! merged, since Anthropic needs user and assistant to alternate.

use serde_json::{Value, json};

use super::OpenAiError;

/// The `system` text (`system` and `developer` messages' text in order, joined
/// by blank lines) and the alternating turns.
pub(crate) fn convert_messages(messages: &[Value]) -> Result<(Option<String>, Vec<Value>), OpenAiError> {
    let mut system: Vec<String> = Vec::new();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = m.get("role").and_then(Value::as_str);
        let (role, blocks) = match role {
            Some("system" | "developer") => {
                system.push(text_only(m.get("content"), &at)?);
                continue;
            }
            Some("user") => ("user", content_blocks(m.get("content"), &at)?),
            Some("assistant") => ("assistant", assistant_blocks(m, &at)?),
            Some("tool") => ("user", vec![tool_result(m, &at)?]),
            Some("function") => {
                let why = "function messages are deprecated: use tool messages";
                return Err(OpenAiError::invalid(why, Some(&format!("{at}.role"))));
            }
            Some(other) => {
                let why = format!("unknown message role `{other}`");
                return Err(OpenAiError::invalid(why, Some(&format!("{at}.role"))));
            }
            None => return Err(OpenAiError::invalid("a message needs a role", Some(&format!("{at}.role")))),
        };
        match turns.last_mut() {
            Some((last, prior)) if *last == role => prior.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    if turns.is_empty() {
        return Err(OpenAiError::invalid("messages needs at least one user or assistant message", Some("messages")));
    }
    let turns = turns.into_iter().map(|(role, blocks)| finish_turn(role, blocks)).collect::<Result<_, _>>()?;
    let system = (!system.is_empty()).then(|| system.join("\n\n"));
    Ok((system, turns))
}

/// One turn, its tool results first: Anthropic wants them at the head of the
/// user turn that answers the tool calls, and a client that wrote a user text
/// between two tool messages still means them as answers.
fn finish_turn(role: &str, blocks: Vec<Value>) -> Result<Value, OpenAiError> {
    if blocks.is_empty() {
        return Err(OpenAiError::invalid(format!("a {role} message has no content"), Some("messages")));
    }
    let (mut results, rest): (Vec<Value>, Vec<Value>) = blocks.into_iter().partition(|b| b["type"] == "tool_result");
    results.extend(rest);
    Ok(json!({"role": role, "content": results}))
}

/// A system or developer message's text: a string, or text parts joined.
fn text_only(content: Option<&Value>, at: &str) -> Result<String, OpenAiError> {
    match content {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => parts
            .iter()
            .enumerate()
            .map(|(j, p)| match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                (Some("text"), Some(t)) => Ok(t.to_owned()),
                _ => Err(OpenAiError::invalid("only text parts are allowed here", Some(&format!("{at}.content[{j}]")))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|texts| texts.concat()),
        _ => Err(OpenAiError::invalid(
            "content must be a string or an array of text parts",
            Some(&format!("{at}.content")),
        )),
    }
}

/// A user message's (or a tool result's) content as blocks. Empty texts are
/// dropped: Anthropic refuses an empty text block, and it says nothing.
fn content_blocks(content: Option<&Value>, at: &str) -> Result<Vec<Value>, OpenAiError> {
    let parts = match content {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => return Ok(text_block(s).into_iter().collect()),
        Some(Value::Array(parts)) => parts,
        Some(_) => {
            return Err(OpenAiError::invalid("content must be a string or an array", Some(&format!("{at}.content"))));
        }
    };
    let mut out = Vec::new();
    for (j, p) in parts.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        match p.get("type").and_then(Value::as_str) {
            Some("text" | "refusal") => {
                let key = if p["type"] == "text" { "text" } else { "refusal" };
                let text = p.get(key).and_then(Value::as_str);
                let text = text.ok_or_else(|| OpenAiError::invalid(format!("a {key} part needs {key}"), Some(&at)))?;
                out.extend(text_block(text));
            }
            Some("image_url") => out.push(image(p, &at)?),
            Some("file") => out.push(file(p, &at)?),
            Some(other) => {
                return Err(OpenAiError::invalid(
                    format!("content parts of type `{other}` are not supported"),
                    Some(&at),
                ));
            }
            None => return Err(OpenAiError::invalid("a content part needs a type", Some(&at))),
        }
    }
    Ok(out)
}

fn text_block(text: &str) -> Option<Value> {
    (!text.is_empty()).then(|| json!({"type": "text", "text": text}))
}

/// `image_url`: a `data:` URL becomes a base64 source, an http(s) URL a url
/// source (Anthropic fetches it).
fn image(p: &Value, at: &str) -> Result<Value, OpenAiError> {
    let url = p.get("image_url").and_then(|i| i.get("url").or(Some(i))).and_then(Value::as_str);
    let url = url.ok_or_else(|| OpenAiError::invalid("an image_url part needs image_url.url", Some(at)))?;
    if let Some((media_type, data)) = data_url(url) {
        return Ok(json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}));
    }
    if url.starts_with("https://") || url.starts_with("http://") {
        return Ok(json!({"type": "image", "source": {"type": "url", "url": url}}));
    }
    Err(OpenAiError::invalid("an image URL must be a base64 data: URL or an http(s) URL", Some(at)))
}

/// `file` with inline `file_data` (a base64 data URL of a PDF) → a document
/// block. Uploaded `file_id`s live in OpenAI's storage, out of reach.
fn file(p: &Value, at: &str) -> Result<Value, OpenAiError> {
    let data = p.get("file").and_then(|f| f.get("file_data")).and_then(Value::as_str).and_then(data_url);
    match data {
        Some(("application/pdf", data)) => Ok(json!({
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": data},
        })),
        _ => Err(OpenAiError::invalid("only file parts with inline PDF file_data are supported", Some(at))),
    }
}

/// `data:{media_type};base64,{data}` → its two parts.
fn data_url(url: &str) -> Option<(&str, &str)> {
    let (head, data) = url.strip_prefix("data:")?.split_once(',')?;
    let media_type = head.strip_suffix(";base64")?;
    Some((media_type, data))
}

/// An assistant message: its text, then a `tool_use` block per tool call.
fn assistant_blocks(m: &Value, at: &str) -> Result<Vec<Value>, OpenAiError> {
    if m.get("function_call").is_some_and(|f| !f.is_null()) {
        let why = "function_call is deprecated: use tool_calls";
        return Err(OpenAiError::invalid(why, Some(&format!("{at}.function_call"))));
    }
    let mut out = content_blocks(m.get("content"), at)?;
    let calls = match m.get("tool_calls") {
        None | Some(Value::Null) => return Ok(out),
        Some(Value::Array(calls)) => calls,
        Some(_) => return Err(OpenAiError::invalid("tool_calls must be an array", Some(&format!("{at}.tool_calls")))),
    };
    for (j, call) in calls.iter().enumerate() {
        out.push(tool_use(call, &format!("{at}.tool_calls[{j}]"))?);
    }
    Ok(out)
}

/// `{id, type:function, function:{name, arguments}}` → `tool_use` with the
/// arguments parsed: Anthropic's `input` is an object, not a string.
fn tool_use(call: &Value, at: &str) -> Result<Value, OpenAiError> {
    let id = call.get("id").and_then(Value::as_str);
    let id = id.ok_or_else(|| OpenAiError::invalid("a tool call needs an id", Some(&format!("{at}.id"))))?;
    let f = call.get("function").unwrap_or(&Value::Null);
    let name = f.get("name").and_then(Value::as_str);
    let name =
        name.ok_or_else(|| OpenAiError::invalid("a tool call needs a name", Some(&format!("{at}.function.name"))))?;
    let args = f.get("arguments").and_then(Value::as_str).unwrap_or("");
    // Some clients send "" for a call without arguments.
    let input = if args.trim().is_empty() { Ok(json!({})) } else { serde_json::from_str::<Value>(args) };
    let input = match input {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            let why = format!("the arguments of tool call `{id}` are not a JSON object");
            return Err(OpenAiError::invalid(why, Some(&format!("{at}.function.arguments"))));
        }
    };
    Ok(json!({"type": "tool_use", "id": tool_id(id), "name": name, "input": input}))
}

/// A `tool` message → a `tool_result` block answering `tool_call_id`.
fn tool_result(m: &Value, at: &str) -> Result<Value, OpenAiError> {
    let id = m.get("tool_call_id").and_then(Value::as_str);
    let id = id.ok_or_else(|| {
        OpenAiError::invalid("a tool message needs tool_call_id", Some(&format!("{at}.tool_call_id")))
    })?;
    let content = match m.get("content") {
        Some(Value::String(s)) => Value::String(s.clone()),
        other => Value::Array(content_blocks(other, at)?),
    };
    Ok(json!({"type": "tool_result", "tool_use_id": tool_id(id), "content": content}))
}

/// A tool call id as Anthropic accepts one (`[A-Za-z0-9_-]+`): ids OpenAI and
/// Anthropic make pass as they are; another provider's odd characters become
/// `_`, the same way in the call and in its result, so the two still match.
fn tool_id(id: &str) -> String {
    let clean: String = id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    if clean.is_empty() { "_".to_owned() } else { clean }
}
