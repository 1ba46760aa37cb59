//! Log lines on stderr, for people (`text`) and for machines (`json`).
//!
//! A log collector splits stderr on line breaks and, in JSON mode, parses each
//! line; so the rules here hold for every line `poolgate serve` writes, not
//! only for the `tracing` events:
//!
//! - **One line per event.** In text mode every message and field value is
//!   written with its line breaks and other control characters escaped (`\n`,
//!   `\u{2028}`), so a config error listing three problems, an `anyhow` chain
//!   or a plugin's words stay on their line; in JSON mode they are escaped in
//!   JSON strings.
//! - **Every line in the chosen format.** The lines written outside `tracing`
//!   — the startup banner, a warning about the log filter itself, the error a
//!   start fails with, a panic — go through [`line()`], which writes them in the
//!   same shape as the events (and past the filter: an operator who asked for
//!   `warn` still sees where the gateway listens and why it stopped).
//! - **Records as objects.** The decision record (target [`DECISION_TARGET`],
//!   field [`RECORD_FIELD`]) is serialized JSON; the JSON formatter embeds it
//!   as an object instead of a string holding JSON, so `jq '.fields.record.
//!   attempts'` works. It is serialized only when the target is enabled.
//!
//! The JSON shape is tracing-subscriber's: `{"timestamp", "level", "fields":
//! {"message", …}, "target"}`, plus `"spans"` when the event is inside spans.

use std::fmt::{self, Write as _};
use std::io::Write as _;
use std::sync::atomic::{AtomicU8, Ordering};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::time::FormatTime as _;
use tracing_subscriber::fmt::{FmtContext, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use crate::config::LogFormat;
use crate::policy::fault::{escape_controls, is_unsafe_in_log};

/// The target of the full decision record of each request (at `debug`).
pub const DECISION_TARGET: &str = "poolgate::decision";
/// The field of a [`DECISION_TARGET`] event that holds the record, as JSON.
pub const RECORD_FIELD: &str = "record";

/// The format of this process's stderr lines: 0 text, 1 JSON.
static FORMAT: AtomicU8 = AtomicU8::new(0);

/// Sets the format of the lines written from now on (by [`line()`] and by the
/// subscriber [`init`] installs). Known before the config is read when it comes
/// from `--log-format` or `POOLGATE_LOG_FORMAT`, so that even an error reading
/// the config is written in it.
pub fn set_format(format: LogFormat) {
    FORMAT.store(matches!(format, LogFormat::Json) as u8, Ordering::Relaxed);
}

/// The format lines are written in.
pub fn format() -> LogFormat {
    if FORMAT.load(Ordering::Relaxed) == 1 { LogFormat::Json } else { LogFormat::Text }
}

/// Installs the subscriber: stderr, in `format`, filtered by `POOLGATE_LOG`,
/// else `RUST_LOG`, else `default_filter`. Colour only in text mode on a
/// terminal without `NO_COLOR`. A second call changes nothing.
pub fn init(format: LogFormat, default_filter: &str) {
    use std::io::IsTerminal as _;
    use tracing_subscriber::EnvFilter;
    set_format(format);
    let filter = ["POOLGATE_LOG", "RUST_LOG"]
        .into_iter()
        .find_map(|var| {
            let value = std::env::var(var).ok().filter(|v| !v.trim().is_empty())?;
            EnvFilter::try_new(&value)
                .inspect_err(|e| {
                    let message = format!("ignoring {var}={value:?}: {e}");
                    line(Level::WARN, "poolgate", &message, &[]);
                })
                .ok()
        })
        .unwrap_or_else(|| EnvFilter::new(default_filter));
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder
            .with_ansi(false)
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(JsonLines)
            .try_init(),
        LogFormat::Text => builder.with_ansi(ansi).fmt_fields(TextFields).try_init(),
    };
}

/// Writes one line at `level` for `target` in the current [`format()`], past
/// the filter: for what must reach stderr whatever the filter says, and for
/// what is said before the subscriber exists or after it can no longer help.
/// `fields` follow the message (`key=value` in text, members of `fields` in
/// JSON).
pub fn line(level: Level, target: &str, message: &str, fields: &[(&str, serde_json::Value)]) {
    let text = render(format(), &timestamp(), level, target, message, fields);
    // One write of the whole line: it never interleaves with an event's.
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// The line [`line()`] writes, newline included: a pure function of its parts.
pub fn render(
    format: LogFormat,
    timestamp: &str,
    level: Level,
    target: &str,
    message: &str,
    fields: &[(&str, serde_json::Value)],
) -> String {
    let mut out = String::with_capacity(128 + message.len());
    match format {
        LogFormat::Json => {
            out.push_str("{\"timestamp\":");
            json_str(&mut out, timestamp);
            out.push_str(",\"level\":");
            json_str(&mut out, level.as_str());
            out.push_str(",\"fields\":{\"message\":");
            json_str(&mut out, message);
            for (name, value) in fields {
                out.push(',');
                json_str(&mut out, name);
                out.push(':');
                match value {
                    serde_json::Value::String(s) => json_str(&mut out, s),
                    v => out.push_str(&v.to_string()),
                }
            }
            out.push_str("},\"target\":");
            json_str(&mut out, target);
            out.push('}');
        }
        LogFormat::Text => {
            // The shape of tracing-subscriber's text lines.
            let _ = write!(out, "{timestamp} {:>5} {target}: {}", level.as_str(), escape_controls(message));
            for (name, value) in fields {
                match value {
                    serde_json::Value::String(s) => write!(out, " {name}={s:?}"),
                    v => write!(out, " {name}={}", escape_controls(&v.to_string())),
                }
                .unwrap_or(());
            }
        }
    }
    out.push('\n');
    out
}

/// Logs the error a command ends with: one line, whatever its message holds.
pub fn fatal(error: &anyhow::Error) {
    line(Level::ERROR, "poolgate", &format!("{error:#}"), &[]);
}

/// Makes a panic one line in the current format (message, thread, location,
/// and the backtrace as a field when `RUST_BACKTRACE` asks for one) instead
/// of the default hook's several plain-text lines.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let payload = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into());
        let mut fields = vec![("thread", std::thread::current().name().unwrap_or("<unnamed>").into())];
        if let Some(at) = info.location() {
            fields.push(("location", format!("{}:{}:{}", at.file(), at.line(), at.column()).into()));
        }
        let backtrace = std::backtrace::Backtrace::capture();
        if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
            fields.push(("backtrace", backtrace.to_string().into()));
        }
        line(Level::ERROR, "poolgate::panic", &format!("panicked: {payload}"), &fields);
    }));
}

/// A value of the operator's or a client's text (an account id, a client key
/// name, a model) in a `key=value` line: as is when it is one plain word,
/// quoted and escaped otherwise — so a model named `x status=200` cannot pass
/// for another field.
pub struct Token<'a>(pub &'a str);

impl fmt::Display for Token<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A JSON log escapes every value itself; quoting here would leak into it.
        if format() == LogFormat::Json {
            return f.write_str(self.0);
        }
        let plain = !self.0.is_empty()
            && self.0.chars().all(|c| !c.is_whitespace() && !matches!(c, '"' | '=' | '\\') && !is_unsafe_in_log(c));
        if plain { f.write_str(self.0) } else { write!(f, "{:?}", self.0) }
    }
}

/// Now, as tracing-subscriber writes it (RFC 3339, microseconds, UTC).
fn timestamp() -> String {
    let mut s = String::with_capacity(32);
    let _ = tracing_subscriber::fmt::time::SystemTime.format_time(&mut Writer::new(&mut s));
    s
}

/// Appends `s` as a JSON string. Beyond what JSON requires, every character
/// [`is_unsafe_in_log`] (line separators, bidi overrides, C1 controls) is
/// written as `\uXXXX`, so a viewer shows the line as one line, in order.
pub fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if is_unsafe_in_log(c) => push_u_escape(out, c),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Appends `json` (serialized by serde_json, so every control character is
/// already escaped) with each character [`is_unsafe_in_log`] written as
/// `\uXXXX`: those only occur inside strings, where the escape means the same.
fn embed_json(out: &mut String, json: &str) {
    for c in json.chars() {
        if is_unsafe_in_log(c) {
            push_u_escape(out, c);
        } else {
            out.push(c);
        }
    }
}

/// Appends `c` as JSON's `\uXXXX` (two of them past the BMP).
fn push_u_escape(out: &mut String, c: char) {
    let mut units = [0u16; 2];
    for u in c.encode_utf16(&mut units) {
        let _ = write!(out, "\\u{u:04x}");
    }
}

/// Whether `s` is one whole JSON value (checked without building it).
fn is_json(s: &str) -> bool {
    serde_json::from_str::<serde::de::IgnoredAny>(s).is_ok()
}

/// The JSON event format: one object per line (see the module docs).
pub struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let meta = event.metadata();
        let mut out = String::with_capacity(256);
        out.push_str("{\"timestamp\":");
        json_str(&mut out, &timestamp());
        out.push_str(",\"level\":");
        json_str(&mut out, meta.level().as_str());
        out.push_str(",\"fields\":{");
        let mut fields =
            JsonVisitor { out: &mut out, first: true, embed: meta.target() == DECISION_TARGET, log_target: None };
        event.record(&mut fields);
        // An event from the `log` crate names its real target in a field.
        let target = fields.log_target.take().unwrap_or_else(|| meta.target().to_string());
        out.push_str("},\"target\":");
        json_str(&mut out, &target);
        if let Some(scope) = ctx.event_scope() {
            out.push_str(",\"spans\":[");
            for (i, span) in scope.from_root().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str("{\"name\":");
                json_str(&mut out, span.name());
                let ext = span.extensions();
                if let Some(f) = ext.get::<FormattedFields<N>>() {
                    let inner = f.fields.trim();
                    if inner.len() > 2 && inner.starts_with('{') && is_json(inner) {
                        out.push(',');
                        out.push_str(&inner[1..inner.len() - 1]);
                    }
                }
                out.push('}');
            }
            out.push(']');
        }
        out.push_str("}\n");
        writer.write_str(&out)
    }
}

/// Writes an event's fields as the members of a JSON object.
struct JsonVisitor<'a> {
    out: &'a mut String,
    first: bool,
    /// Whether a [`RECORD_FIELD`] holding JSON is embedded as a value.
    embed: bool,
    /// `log.target`, for an event from the `log` crate.
    log_target: Option<String>,
}

impl JsonVisitor<'_> {
    /// Starts member `field`; false for the `log.*` metadata of a `log` event.
    fn key(&mut self, field: &Field) -> bool {
        if field.name().starts_with("log.") {
            return false;
        }
        if !std::mem::take(&mut self.first) {
            self.out.push(',');
        }
        json_str(self.out, field.name().trim_start_matches("r#"));
        self.out.push(':');
        true
    }

    fn text(&mut self, field: &Field, value: &str) {
        if field.name() == "log.target" {
            self.log_target = Some(value.to_string());
        }
        if !self.key(field) {
            return;
        }
        if self.embed && field.name() == RECORD_FIELD && value.starts_with('{') {
            // The decision record is serde_json's own output (never parsed
            // again per request): embedded as is, except the characters JSON
            // allows raw in a string but a log viewer would break a line on.
            embed_json(self.out, value);
        } else {
            json_str(self.out, value);
        }
    }

    fn number(&mut self, field: &Field, value: impl fmt::Display) {
        if self.key(field) {
            let _ = write!(self.out, "{value}");
        }
    }
}

impl Visit for JsonVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.text(field, value);
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.text(field, &format!("{value:?}"));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.text(field, &error_chain(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.number(field, value);
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.number(field, value);
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.number(field, value);
    }
    fn record_i128(&mut self, field: &Field, value: i128) {
        self.number(field, value);
    }
    fn record_u128(&mut self, field: &Field, value: u128) {
        self.number(field, value);
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        if value.is_finite() {
            self.number(field, value);
        } else {
            self.text(field, &value.to_string());
        }
    }
}

/// An error and its sources, `: `-separated (as `anyhow`'s `{:#}`).
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let _ = write!(s, ": {cause}");
        source = cause.source();
    }
    s
}

/// The text field format: tracing-subscriber's (`message key=value …`, string
/// values quoted), with every message and value escaped onto one line.
pub struct TextFields;

impl<'w> FormatFields<'w> for TextFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
        let ansi = writer.has_ansi_escapes();
        let mut v = TextVisitor { writer, ansi, empty: true, result: Ok(()) };
        fields.record(&mut v);
        v.result
    }
}

struct TextVisitor<'w> {
    writer: Writer<'w>,
    ansi: bool,
    empty: bool,
    result: fmt::Result,
}

impl TextVisitor<'_> {
    /// Writes `name=value` (or the message alone), `value` escaped.
    fn write(&mut self, field: &Field, value: &str) {
        let name = field.name();
        if self.result.is_err() || name.starts_with("log.") {
            return;
        }
        let sep = if std::mem::take(&mut self.empty) { "" } else { " " };
        let value = escape_controls(value);
        let name = name.trim_start_matches("r#");
        self.result = match (name, self.ansi) {
            ("message", _) => write!(self.writer, "{sep}{value}"),
            (name, true) => write!(self.writer, "{sep}\x1b[3m{name}\x1b[0m\x1b[2m=\x1b[0m{value}"),
            (name, false) => write!(self.writer, "{sep}{name}={value}"),
        };
    }
}

impl Visit for TextVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.write(field, value);
        } else {
            self.write(field, &format!("{value:?}"));
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.write(field, &format!("{value:?}"));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.write(field, &error_chain(value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const TS: &str = "2026-01-01T00:00:00.000000Z";

    #[test]
    fn a_line_outside_tracing_has_the_shape_of_an_event() {
        let fields = [("addr", json!("127.0.0.1:1")), ("accounts", json!(2))];
        let j = render(LogFormat::Json, TS, Level::INFO, "poolgate", "listening\non", &fields);
        assert_eq!(j.matches('\n').count(), 1, "{j}");
        let v: Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v["fields"], json!({"message": "listening\non", "addr": "127.0.0.1:1", "accounts": 2}));
        assert_eq!((v["level"].as_str(), v["target"].as_str()), (Some("INFO"), Some("poolgate")));
        let t = render(LogFormat::Text, TS, Level::WARN, "poolgate", "a\nb", &fields);
        assert_eq!(t, format!("{TS}  WARN poolgate: a\\nb addr=\"127.0.0.1:1\" accounts=2\n"));
    }

    #[test]
    fn json_strings_escape_every_line_break_and_bidi_control() {
        let mut out = String::new();
        json_str(&mut out, "a\"b\\c\nd\re\u{2028}f\u{202e}g\u{85}h\u{1b}");
        assert_eq!(out, r#""a\"b\\c\nd\re\u2028f\u202eg\u0085h\u001b""#);
        assert_eq!(serde_json::from_str::<String>(&out).unwrap(), "a\"b\\c\nd\re\u{2028}f\u{202e}g\u{85}h\u{1b}");
        let mut astral = String::new();
        json_str(&mut astral, "\u{e0001}");
        assert_eq!(serde_json::from_str::<String>(&astral).unwrap(), "\u{e0001}");
    }

    #[test]
    fn a_token_is_bare_only_when_it_is_one_plain_word() {
        assert_eq!(Token("claude-sonnet-4-5").to_string(), "claude-sonnet-4-5");
        assert_eq!(Token("x status=200").to_string(), r#""x status=200""#);
        assert_eq!(Token("a\nb").to_string(), r#""a\nb""#);
        assert_eq!(Token("").to_string(), r#""""#);
        // A JSON log escapes values itself: no quotes of the text format's.
        set_format(LogFormat::Json);
        let in_json = Token("a b").to_string();
        set_format(LogFormat::Text);
        assert_eq!(in_json, "a b");
    }

    /// Events through the real formatters, captured.
    fn capture(format: LogFormat, emit: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Sink(std::sync::Arc<parking_lot::Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let s2 = sink.clone();
        let builder =
            tracing_subscriber::fmt().with_max_level(Level::DEBUG).with_ansi(false).with_writer(move || s2.clone());
        let dispatch = match format {
            LogFormat::Json => tracing::Dispatch::new(
                builder.fmt_fields(tracing_subscriber::fmt::format::JsonFields::new()).event_format(JsonLines).finish(),
            ),
            LogFormat::Text => tracing::Dispatch::new(builder.fmt_fields(TextFields).finish()),
        };
        tracing::dispatcher::with_default(&dispatch, emit);
        String::from_utf8(sink.0.lock().clone()).unwrap()
    }

    #[test]
    fn a_multi_line_error_is_one_line_in_both_formats() {
        let emit = || {
            let error = anyhow::anyhow!("2 problems:\n  - a\n  - b").context("reload refused");
            tracing::error!(trigger = "sighup", error = %format!("{error:#}"), "reload\rrefused");
        };
        let text = capture(LogFormat::Text, emit);
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains("reload\\rrefused trigger=\"sighup\" error=reload refused: 2 problems:\\n  - a\\n  - b"));
        let json = capture(LogFormat::Json, emit);
        assert_eq!(json.lines().count(), 1, "{json}");
        let v: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["fields"]["error"], "reload refused: 2 problems:\n  - a\n  - b");
        assert_eq!(v["fields"]["trigger"], "sighup");
    }

    #[test]
    fn the_decision_record_is_an_object_and_numbers_stay_numbers() {
        let json = capture(LogFormat::Json, || {
            let record = json!({"id": 7, "attempts": [{"account": "a"}], "model": "m\u{2028}n"}).to_string();
            tracing::debug!(target: "poolgate::decision", request = 7u64, ok = true, record = %record, "record");
            // Only the decision record is embedded; elsewhere JSON text stays a string.
            tracing::info!(record = %record, "other");
            let _span = tracing::info_span!("conn", peer = "x").entered();
            tracing::info!("inside");
        });
        assert!(!json.contains('\u{2028}'), "a line separator in the record is escaped: {json}");
        let lines: Vec<Value> = json.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines[0]["fields"]["record"]["attempts"][0]["account"], "a");
        assert_eq!(lines[0]["fields"]["record"]["model"], "m\u{2028}n");
        assert_eq!((lines[0]["fields"]["request"].as_u64(), lines[0]["fields"]["ok"].as_bool()), (Some(7), Some(true)));
        assert_eq!(lines[0]["target"], "poolgate::decision");
        assert!(lines[1]["fields"]["record"].is_string());
        assert_eq!(lines[2]["spans"], json!([{"name": "conn", "peer": "x"}]));
    }
}
