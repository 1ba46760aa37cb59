//! An Anthropic answer as OpenAI's: a `message` as a `chat.completion`, and the
//! models page as OpenAI's list. The pieces a stream needs too (the finish
//! reason, the usage) are here once.

use serde_json::{Value, json};

/// A `chat.completion` for an Anthropic `message`, `model` being the client's
/// name for it (echoed back as OpenAI does) and `created_s` the Unix time.
///
/// Text blocks are joined with nothing between them (Anthropic cuts one text
/// into several blocks around citations); `content` is `null` when the answer
/// is only tool calls, as OpenAI's is. Thinking blocks are not passed: Chat
/// Completions has no field for them.
pub fn messages_to_chat(answer: &Value, model: &str, created_s: u64) -> Value {
    let blocks = answer.get("content").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let mut text = String::new();
    let mut calls = Vec::new();
    for b in blocks {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => calls.push(json!({
                "id": b.get("id").cloned().unwrap_or(Value::Null),
                "type": "function",
                "function": {
                    "name": b.get("name").cloned().unwrap_or(Value::Null),
                    "arguments": b.get("input").unwrap_or(&json!({})).to_string(),
                },
            })),
            _ => {}
        }
    }
    let content = if text.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(text) };
    let mut message = json!({"role": "assistant", "content": content, "refusal": null});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    json!({
        "id": chat_id(answer.get("id").and_then(Value::as_str).unwrap_or("")),
        "object": "chat.completion",
        "created": created_s,
        "model": model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish_reason(answer.get("stop_reason").and_then(Value::as_str)),
        }],
        "usage": usage(answer.get("usage").unwrap_or(&Value::Null)),
    })
}

/// `chatcmpl-{anthropic id}`: the client's id says which upstream message it was.
pub(crate) fn chat_id(anthropic_id: &str) -> String {
    format!("chatcmpl-{anthropic_id}")
}

/// Anthropic's `stop_reason` as a `finish_reason`. `pause_turn` (a server tool
/// paused) has no counterpart and is a plain stop, as is an unknown reason.
pub(crate) fn finish_reason(stop_reason: Option<&str>) -> &'static str {
    match stop_reason {
        Some("max_tokens" | "model_context_window_exceeded") => "length",
        Some("tool_use") => "tool_calls",
        Some("refusal") => "content_filter",
        _ => "stop",
    }
}

/// Anthropic's `usage` as OpenAI's. OpenAI's prompt tokens include the cached
/// ones, Anthropic's `input_tokens` do not: the three are added back together.
pub(crate) fn usage(u: &Value) -> Value {
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    let cached = n("cache_read_input_tokens");
    let prompt = n("input_tokens") + cached + n("cache_creation_input_tokens");
    let completion = n("output_tokens");
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// Anthropic's `GET /v1/models` page as OpenAI's list:
/// `{"object":"list","data":[{"id","object":"model","created","owned_by":"anthropic"}]}`,
/// `created` being `created_at` in Unix seconds (0 if it cannot be read).
pub fn models_to_openai(anthropic_page: &Value) -> Value {
    let models = anthropic_page.get("data").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let data: Vec<Value> = models
        .iter()
        .filter_map(|m| {
            let id = m.get("id")?.as_str()?;
            let created = m.get("created_at").and_then(Value::as_str).and_then(unix_seconds).unwrap_or(0);
            Some(json!({"id": id, "object": "model", "created": created, "owned_by": "anthropic"}))
        })
        .collect();
    json!({"object": "list", "data": data})
}

/// An RFC 3339 time (`2025-08-05T00:00:00Z`, `…T12:30:00.5+02:00`) in Unix
/// seconds; `None` for anything else or a time before 1970.
fn unix_seconds(t: &str) -> Option<u64> {
    // RFC 3339's fields are four digits (the year) or two: no more, so that
    // no field can overflow the arithmetic below (an offset of 7e18 hours did).
    let digits = |s: &str, most: usize| -> Option<i64> {
        (!s.is_empty() && s.len() <= most && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok())?
    };
    let num = |s: &str| digits(s, 2);
    let (date, time) = t.split_once(['T', 't', ' '])?;
    let mut d = date.splitn(3, '-');
    let (y, mo, day) = (digits(d.next()?, 4)?, num(d.next()?)?, num(d.next()?)?);
    // The offset: `Z`, or `±hh:mm` after the seconds (and their fraction).
    let (clock, offset) = match time.find(['Z', 'z', '+', '-']) {
        Some(i) if time[i..].eq_ignore_ascii_case("z") => (&time[..i], 0),
        Some(i) => {
            let (h, m) = time[i + 1..].split_once(':')?;
            let sign = if time.as_bytes()[i] == b'-' { -1 } else { 1 };
            let (h, m) = (num(h)?, num(m)?);
            if h > 23 || m > 59 {
                return None;
            }
            (&time[..i], sign * (h * 3600 + m * 60))
        }
        None => return None,
    };
    let clock = clock.split('.').next()?;
    let mut c = clock.splitn(3, ':').map(num);
    let (h, mi, s) = (c.next()??, c.next()??, c.next()??);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&day) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let secs = days_from_civil(y, mo, day) * 86_400 + h * 3600 + mi * 60 + s - offset;
    u64::try_from(secs).ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(content: Value, stop: &str) -> Value {
        json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x", "content": content,
            "stop_reason": stop, "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 20}})
    }

    #[test]
    fn a_text_answer_is_a_chat_completion() {
        let content = json!([{"type": "thinking", "thinking": "hm", "signature": "s"},
            {"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]);
        assert_eq!(
            messages_to_chat(&answer(content, "end_turn"), "gpt-4o", 1700000000),
            json!({
                "id": "chatcmpl-msg_1", "object": "chat.completion", "created": 1700000000, "model": "gpt-4o",
                "choices": [{"index": 0, "logprobs": null, "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "Hello", "refusal": null}}],
                "usage": {"prompt_tokens": 130, "completion_tokens": 5, "total_tokens": 135,
                    "prompt_tokens_details": {"cached_tokens": 100}},
            })
        );
    }

    #[test]
    fn tool_calls_have_their_arguments_as_a_json_string_and_no_content() {
        let content = json!([{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": [1, "x"]}}]);
        let chat = messages_to_chat(&answer(content, "tool_use"), "m", 0);
        let choice = &chat["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(choice["message"]["content"], Value::Null);
        assert_eq!(
            choice["message"]["tool_calls"],
            json!([{"id": "toolu_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":[1,\"x\"]}"}}])
        );
        let chat = messages_to_chat(&answer(json!([]), "end_turn"), "m", 0);
        assert_eq!(chat["choices"][0]["message"]["content"], "");
    }

    #[test]
    fn every_stop_reason_has_a_finish_reason() {
        let cases = [
            ("end_turn", "stop"),
            ("stop_sequence", "stop"),
            ("max_tokens", "length"),
            ("tool_use", "tool_calls"),
            ("refusal", "content_filter"),
            ("pause_turn", "stop"),
            ("model_context_window_exceeded", "length"),
        ];
        for (stop, finish) in cases {
            let chat = messages_to_chat(&answer(json!([]), stop), "m", 0);
            assert_eq!(chat["choices"][0]["finish_reason"], finish, "{stop}");
        }
    }

    #[test]
    fn the_models_page_is_openais_list() {
        let page = json!({"data": [
            {"type": "model", "id": "claude-opus-4-1-20250805", "display_name": "Claude Opus 4.1", "created_at": "2025-08-05T00:00:00Z"},
            {"type": "model", "id": "claude-odd", "created_at": "yesterday"},
        ], "has_more": false, "first_id": "claude-opus-4-1-20250805", "last_id": "claude-odd"});
        assert_eq!(
            models_to_openai(&page),
            json!({"object": "list", "data": [
                {"id": "claude-opus-4-1-20250805", "object": "model", "created": 1754352000, "owned_by": "anthropic"},
                {"id": "claude-odd", "object": "model", "created": 0, "owned_by": "anthropic"},
            ]})
        );
        assert_eq!(models_to_openai(&json!({})), json!({"object": "list", "data": []}));
    }

    #[test]
    fn rfc3339_times_are_read_with_fractions_and_offsets() {
        assert_eq!(unix_seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(unix_seconds("2000-03-01T00:00:00Z"), Some(951868800));
        assert_eq!(unix_seconds("2024-02-29T23:59:59.999Z"), Some(1709251199));
        assert_eq!(unix_seconds("2024-03-01T01:30:00+01:30"), Some(1709251200));
        assert_eq!(unix_seconds("2024-02-29T22:00:00-02:00"), Some(1709251200));
        for bad in ["2024-02-29", "2024-13-01T00:00:00Z", "1969-12-31T23:59:59Z", "2024-02-29T00:00:00", "x-y-zT"] {
            assert_eq!(unix_seconds(bad), None, "{bad}");
        }
    }

    /// Found by fuzzing (`fuzz/corpus/openai_answer/regress-offset-overflow`):
    /// a model's `created_at` with an offset of 7,173,733,806,442,603,406
    /// hours overflowed the multiplication (a panic in a debug build, a
    /// wrapped number in a release one); so could a year of 19 digits.
    #[test]
    fn a_time_whose_fields_are_too_long_to_be_rfc3339_is_none() {
        for bad in [
            "4050-00-01T04:00:00+07173733806442603406:00",
            "2024-01-01T00:00:00+24:00",
            "2024-01-01T00:00:00+01:60",
            "9223372036854775807-01-01T00:00:00Z",
            "02024-01-01T00:00:00Z",
            "2024-001-01T00:00:00Z",
            "2024-01-01T000:00:00Z",
        ] {
            assert_eq!(unix_seconds(bad), None, "{bad}");
        }
        assert_eq!(unix_seconds("9999-12-31T23:59:59+23:59"), Some(253_402_214_459));
    }
}
