//! OpenAI's Chat Completions API, translated to and from Anthropic's Messages
//! API: plain data in, plain data out, no I/O.
//!
//! Why it exists: clients written for OpenAI (`/v1/chat/completions`) are to
//! reach the pool of Anthropic accounts through poolgate. The gateway reads the
//! request, calls [`chat_to_messages`], sends the Anthropic request through its
//! usual path, and turns the answer back: [`messages_to_chat`] for a JSON
//! answer, a [`ChatStream`] fed with the upstream's events for a stream, and
//! [`anthropic_error_to_openai`] for an error. The other way, for a fallback
//! to an OpenAI backend: [`messages_to_chat_request`],
//! [`chat_to_messages_answer`], [`MessagesStream`], [`openai_error_to_anthropic`].
//! What is translated and what is refused (and why) is tabled in
//! `docs/openai.md`.
//!
//! ```
//! use poolgate_wire::openai::chat_to_messages;
//! use serde_json::json;
//!
//! let req = json!({"model": "gpt-4o", "messages": [
//!     {"role": "system", "content": "Be brief."},
//!     {"role": "user", "content": "Hi"},
//! ]});
//! let alias = |m: &str| (m == "gpt-4o").then(|| "claude-sonnet-4-5".to_owned());
//! let t = chat_to_messages(&req, &alias).unwrap();
//! assert_eq!(t.body["model"], "claude-sonnet-4-5");
//! assert_eq!(t.body["system"], "Be brief.");
//! assert_eq!(t.body["max_tokens"], 4096);
//! assert_eq!(t.model, "gpt-4o");
//! ```

mod error;
mod messages;
mod request;
mod response;
mod reverse;
mod reverse_stream;
mod stream;

pub use error::{OpenAiError, anthropic_error_to_openai, from_anthropic};
pub use request::{DEFAULT_MAX_TOKENS, Translated, chat_to_messages};
pub use response::{messages_to_chat, models_to_openai};
pub use reverse::{chat_to_messages_answer, messages_to_chat_request, openai_error_to_anthropic};
pub use reverse_stream::MessagesStream;
pub use stream::{ChatStream, DONE};

/// A stream translated event by event: [`ChatStream`] one way,
/// [`MessagesStream`] the other. Output is appended to a buffer the caller
/// keeps, so a gateway relaying many streams allocates nothing per event.
pub trait Translation: Send {
    /// Reads raw bytes of the source stream (cut anywhere) and appends the
    /// translated events that are complete.
    fn feed_into(&mut self, bytes: &[u8], out: &mut Vec<u8>);
    /// The source ended: appends the closing events (an error event if it
    /// ended before the answer did). Nothing twice.
    fn finish_into(&mut self, out: &mut Vec<u8>);
}

/// Framed events (each ending `\n\n`) as one string each.
fn frames(bytes: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    text.split_inclusive("\n\n").map(str::to_owned).collect()
}

#[cfg(test)]
mod roundtrip_tests;
