//! Anthropic's Messages API wire format, as poolgate's two fake upstreams write it.
//!
//! Why it exists: poolgate has two stand-ins for Anthropic — the simulated
//! upstream behind `poolgate demo` (`host/src/sim`, whose answers follow from
//! quota budgets that move) and the scripted mock of the end-to-end tests
//! (`tests/mock-upstream`, whose answers follow a per-account script). What they
//! *answer* differs; how an answer is *written* must not: clients, the official
//! SDKs among them, parse every byte, and a fix to the shape of an event made in
//! one fake but not in the other is a test that passes against a lie. So the
//! shape lives here once, and each fake keeps only what it decides.
//!
//! What is here is plain data and pure functions — no I/O, no HTTP types:
//!
//! - [`request`]: reading a Messages (or `count_tokens`) request, only as far as
//!   a reply needs, and Anthropic's words for what is wrong with one.
//! - [`message`]: an assistant reply, as a JSON `message` and as the server-sent
//!   events of a stream; how finely a stream is cut is the caller's choice.
//! - [`sse`]: the framing of one event.
//! - [`error`]: the error envelope and the error types.
//! - [`models`]: the `GET /v1/models` page and a model object.
//! - [`ratelimit`]: a quota reading rendered as the `anthropic-ratelimit-*`
//!   headers.
//! - [`header`]: the names and content types both fakes send.
//! - [`ids`]: ids in Anthropic's shapes and a stable hash for per-name ones.
//! - [`openai`]: OpenAI's Chat Completions API translated to and from this one.
//! - [`usage`]: what an answer says it used, read from a JSON body or a stream
//!   as it passes (the gateway's usage ledger reads it).
//!
//! What stays with each fake is its behaviour: the simulator's ledger, clock,
//! prose and forced tool calls; the mock's scripts, canned text and connection
//! cuts.
//!
//! ```
//! use poolgate_wire::message::{Chunking, Reply, StopReason, TextPieces};
//!
//! let reply = Reply {
//!     id: "msg_1".into(),
//!     model: "claude-sonnet-4-5".into(),
//!     thinking: None,
//!     text: "Hello there".into(),
//!     tool: None,
//!     stop_reason: StopReason::EndTurn,
//!     input_tokens: 10,
//!     output_tokens: 2,
//!     cache_read_input_tokens: 0,
//!     cache_creation_input_tokens: 0,
//! };
//! let events = reply.events(&Chunking { text: TextPieces::Words(4), json_parts: 3 });
//! assert!(events[0].starts_with("event: message_start\ndata: {\"type\":\"message_start\""));
//! assert_eq!(events.last().unwrap(), "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
//! ```
#![deny(missing_docs)]

pub mod error;
pub mod header;
pub mod ids;
pub mod message;
pub mod models;
pub mod openai;
pub mod ratelimit;
pub mod request;
pub mod sse;
pub mod usage;
