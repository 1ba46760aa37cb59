//! Server-sent events, in the order and shape Anthropic streams a message, and the body
//! that sends them one chunk at a time.
//!
//! A gateway that relays SSE has to cope with events arriving one by one, slowly, or not
//! at all past some point. [`Chunks`] therefore hands each event to hyper separately and
//! yields (or sleeps) in between, which makes hyper flush every event in its own write,
//! and it can cut the connection after any event.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use futures_core::Stream;
use tokio::time::Sleep;

use crate::conn::ConnControl;
use crate::wire::{Message, Reply, Usage};

/// At most this many `text_delta` events per text block, so long scripted texts stay fast.
const MAX_TEXT_DELTAS: usize = 8;
/// `input_json_delta` pieces per tool call (after the leading empty piece Anthropic sends).
const JSON_PIECES: usize = 4;

/// The full event sequence of a streamed `reply`, each event a separate chunk.
pub(crate) fn events(reply: &Reply) -> Vec<Bytes> {
    let mut out = Vec::with_capacity(16);
    let start = Message {
        id: &reply.id,
        kind: "message",
        role: "assistant",
        model: &reply.model,
        content: Vec::new(),
        stop_reason: None,
        stop_sequence: None,
        usage: Usage::full(reply.input_tokens, 1),
    };
    let start = serde_json::to_string(&start).expect("message serializes");
    out.push(event("message_start", &format!(r#"{{"type":"message_start","message":{start}}}"#)));
    out.push(event(
        "content_block_start",
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
    ));
    out.push(event("ping", r#"{"type": "ping"}"#));
    for piece in split_text(&reply.text) {
        out.push(event(
            "content_block_delta",
            &format!(
                r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":{}}}}}"#,
                json_str(piece)
            ),
        ));
    }
    out.push(event("content_block_stop", r#"{"type":"content_block_stop","index":0}"#));
    if let Some(tool) = &reply.tool {
        out.push(event(
            "content_block_start",
            &format!(
                r#"{{"type":"content_block_start","index":1,"content_block":{{"type":"tool_use","id":{},"name":{},"input":{{}}}}}}"#,
                json_str(&tool.id),
                json_str(&tool.name)
            ),
        ));
        for piece in std::iter::once("").chain(split_json(&tool.json)) {
            out.push(event(
                "content_block_delta",
                &format!(
                    r#"{{"type":"content_block_delta","index":1,"delta":{{"type":"input_json_delta","partial_json":{}}}}}"#,
                    json_str(piece)
                ),
            ));
        }
        out.push(event("content_block_stop", r#"{"type":"content_block_stop","index":1}"#));
    }
    out.push(event(
        "message_delta",
        &format!(
            r#"{{"type":"message_delta","delta":{{"stop_reason":"{}","stop_sequence":null}},"usage":{{"output_tokens":{}}}}}"#,
            reply.stop_reason(),
            reply.output_tokens
        ),
    ));
    out.push(event("message_stop", r#"{"type":"message_stop"}"#));
    out
}

fn event(name: &str, data: &str) -> Bytes {
    format!("event: {name}\ndata: {data}\n\n").into()
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// Splits text into at most [`MAX_TEXT_DELTAS`] pieces at word boundaries (spaces stay
/// with the word before them), as a model streams words.
fn split_text(text: &str) -> Vec<&str> {
    let words = text.split_inclusive(' ').count();
    if words == 0 {
        return vec![""];
    }
    let per = words.div_ceil(MAX_TEXT_DELTAS);
    let mut out = Vec::with_capacity(MAX_TEXT_DELTAS);
    let (mut start, mut end, mut n) = (0, 0, 0);
    for word in text.split_inclusive(' ') {
        end += word.len();
        n += 1;
        if n == per {
            out.push(&text[start..end]);
            (start, n) = (end, 0);
        }
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

/// Splits JSON into [`JSON_PIECES`] pieces that are not valid JSON on their own, at char
/// boundaries, so only a client that concatenates them gets the input back.
fn split_json(json: &str) -> Vec<&str> {
    let size = json.len().div_ceil(JSON_PIECES).max(1);
    let mut out = Vec::with_capacity(JSON_PIECES);
    let mut start = 0;
    while start < json.len() {
        let mut end = (start + size).min(json.len());
        while !json.is_char_boundary(end) {
            end += 1;
        }
        out.push(&json[start..end]);
        start = end;
    }
    out
}

/// A response body that sends its chunks one at a time, flushing each, with an optional
/// gap between chunks and an optional connection cut after some number of chunks.
pub(crate) struct Chunks {
    chunks: std::vec::IntoIter<Bytes>,
    sent: usize,
    gap: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    /// Whether the pause since the last chunk is over.
    paused: bool,
    yielded: bool,
    cut: Option<(usize, Arc<ConnControl>)>,
}

impl Chunks {
    /// Sends `chunks` with `gap` between them; with `cut`, resets the connection after
    /// that many chunks (at most all of them) instead of finishing the body.
    pub fn new(chunks: Vec<Bytes>, gap: Duration, cut: Option<(usize, Arc<ConnControl>)>) -> Chunks {
        let cut = cut.map(|(after, control)| (after.min(chunks.len()), control));
        Chunks { chunks: chunks.into_iter(), sent: 0, gap, sleep: None, paused: true, yielded: false, cut }
    }

    fn cut_due(&self) -> bool {
        self.cut.as_ref().is_some_and(|(after, _)| *after == self.sent)
    }

    /// The pause between two chunks. Returning `Pending` is what makes hyper flush the
    /// chunk before: with no gap we still yield once, so every event is its own write.
    fn poll_pause(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.paused {
            return Poll::Ready(());
        }
        if self.gap.is_zero() {
            if !self.yielded {
                self.yielded = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            self.yielded = false;
        } else {
            let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(self.gap)));
            ready!(sleep.as_mut().poll(cx));
            self.sleep = None;
        }
        self.paused = true;
        Poll::Ready(())
    }
}

impl Stream for Chunks {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.chunks.len() == 0 && !this.cut_due() {
            return Poll::Ready(None);
        }
        ready!(this.poll_pause(cx));
        if let Some((after, control)) = &this.cut
            && *after == this.sent
        {
            // Everything sent so far was flushed during the pause; hyper flushes again
            // after this `Pending`, and then the connection task drops the socket.
            control.abort();
            return Poll::Pending;
        }
        match this.chunks.next() {
            Some(chunk) => {
                this.sent += 1;
                this.paused = false;
                Poll::Ready(Some(Ok(chunk)))
            }
            None => Poll::Ready(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_text_keeps_every_byte_in_at_most_the_cap() {
        let text = "one two three four five six seven eight nine ten eleven twelve";
        let pieces = split_text(text);
        assert!(pieces.len() <= MAX_TEXT_DELTAS && pieces.len() > 1);
        assert_eq!(pieces.concat(), text);
        assert_eq!(split_text("hi"), vec!["hi"]);
        assert_eq!(split_text(""), vec![""]);
    }

    #[test]
    fn split_json_pieces_concatenate_back_and_respect_char_boundaries() {
        let json = r#"{"city":"Zürich","n":1}"#;
        let pieces = split_json(json);
        assert!(pieces.len() > 1);
        assert_eq!(pieces.concat(), json);
        assert!(serde_json::from_str::<serde_json::Value>(pieces[0]).is_err());
    }
}
