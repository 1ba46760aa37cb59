//! The framing of a server-sent event, as Anthropic streams them: an `event:`
//! line naming the event, one `data:` line with its JSON (whose `type` is the
//! same name), and a blank line.

use crate::error::{Envelope, ErrorType};

/// The data of a `ping`, byte for byte as Anthropic sends it (with the space).
pub const PING: &str = r#"{"type": "ping"}"#;

/// One event: `event: {name}\ndata: {data}\n\n`.
pub fn frame(name: &str, data: &str) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// The `error` event that ends a stream which failed after it started.
pub fn error_event(kind: ErrorType, message: &str) -> String {
    let data = serde_json::to_string(&Envelope::new(kind, message, None)).expect("an error serializes");
    frame("error", &data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_two_lines_and_a_blank_one() {
        assert_eq!(frame("ping", PING), "event: ping\ndata: {\"type\": \"ping\"}\n\n");
    }

    #[test]
    fn an_error_event_carries_the_envelope_without_a_request_id() {
        // The bytes the gateway's relay ends an interrupted stream with.
        assert_eq!(
            error_event(ErrorType::Api, "upstream stream interrupted (poolgate)"),
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"upstream stream interrupted (poolgate)\"}}\n\n"
        );
    }
}
