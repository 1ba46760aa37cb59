//! The parser behind [`Value::parse`]: one pass over the bytes, errors that
//! name the line and column, nesting bounded (a deep document is refused, not
//! a stack overflow) and duplicate keys found in `n log n`.

use std::collections::BTreeSet;

use super::{Number, Value};

/// Parses one JSON document (surrounding whitespace allowed).
pub(super) fn document(text: &str) -> Result<Value, String> {
    let mut p = Parser { text, bytes: text.as_bytes(), at: 0 };
    p.whitespace();
    let value = p.value(0)?;
    p.whitespace();
    if p.at < p.bytes.len() {
        return Err(p.error("trailing characters after the JSON value"));
    }
    Ok(value)
}

/// Nesting deeper than this is refused rather than risking the stack.
const MAX_DEPTH: usize = 128;
/// Objects up to this many keys check for a duplicate by scanning; larger ones
/// keep their keys in a set, so reading `n` keys costs `n log n`, not `n²`.
const LINEAR_KEYS: usize = 16;

struct Parser<'t> {
    text: &'t str,
    bytes: &'t [u8],
    at: usize,
}

impl Parser<'_> {
    fn error(&self, what: &str) -> String {
        let before = &self.text[..self.at.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        format!("{what} at line {line}, column {column}")
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// Consumes `byte` (after whitespace) or fails naming what was `expected`.
    fn expect(&mut self, byte: u8, expected: &str) -> Result<(), String> {
        self.whitespace();
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(self.unexpected(expected))
        }
    }

    fn unexpected(&self, expected: &str) -> String {
        match self.text[self.at..].chars().next() {
            None => self.error(&format!("expected {expected}, found the end of the text")),
            Some(c) => self.error(&format!("expected {expected}, found `{c}`")),
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err(self.error(&format!("nesting deeper than {MAX_DEPTH} levels")));
        }
        self.whitespace();
        match self.peek() {
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b'-' | b'0'..=b'9') => Ok(Value::Number(self.number()?)),
            Some(b't') => self.literal("true", Value::Bool(true)),
            Some(b'f') => self.literal("false", Value::Bool(false)),
            Some(b'n') => self.literal("null", Value::Null),
            _ => Err(self.unexpected("a value")),
        }
    }

    fn literal(&mut self, word: &str, value: Value) -> Result<Value, String> {
        if self.text[self.at..].starts_with(word) {
            self.at += word.len();
            Ok(value)
        } else {
            Err(self.unexpected("a value"))
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, String> {
        self.at += 1; // `{`
        let mut entries: Vec<(String, Value)> = Vec::new();
        // The keys seen, once there are more than a handful: a linear scan per
        // key would make a table of 30,000 keys take seconds to read.
        let mut seen: Option<BTreeSet<String>> = None;
        self.whitespace();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(Value::Object(entries));
        }
        loop {
            self.whitespace();
            if self.peek() != Some(b'"') {
                return Err(self.unexpected("a key (a string)"));
            }
            let key_at = self.at;
            let key = self.string()?;
            let duplicate = match &mut seen {
                Some(seen) => !seen.insert(key.clone()),
                None if entries.len() < LINEAR_KEYS => entries.iter().any(|(k, _)| *k == key),
                None => {
                    let mut keys: BTreeSet<String> = entries.iter().map(|(k, _)| k.clone()).collect();
                    let fresh = keys.insert(key.clone());
                    seen = Some(keys);
                    !fresh
                }
            };
            if duplicate {
                self.at = key_at;
                return Err(self.error(&format!("duplicate key `{key}`")));
            }
            self.expect(b':', "`:`")?;
            let value = self.value(depth + 1)?;
            entries.push((key, value));
            self.whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(Value::Object(entries));
                }
                _ => return Err(self.unexpected("`,` or `}`")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, String> {
        self.at += 1; // `[`
        let mut items = Vec::new();
        self.whitespace();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(Value::Array(items));
        }
        loop {
            items.push(self.value(depth + 1)?);
            self.whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(Value::Array(items));
                }
                _ => return Err(self.unexpected("`,` or `]`")),
            }
        }
    }

    fn string(&mut self) -> Result<String, String> {
        self.at += 1; // `"`
        let mut out = String::new();
        loop {
            // Copy the run up to the next quote, backslash or control character.
            let start = self.at;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.at += 1;
            }
            // The input is a `str` and the run stops at ASCII, so it is whole UTF-8.
            out.push_str(&self.text[start..self.at]);
            match self.peek() {
                Some(b'"') => {
                    self.at += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.at += 1;
                    out.push(self.escape()?);
                }
                Some(_) => return Err(self.error("a control character in a string (escape it)")),
                None => return Err(self.error("a string without its closing quote")),
            }
        }
    }

    /// One escape, after its backslash.
    fn escape(&mut self) -> Result<char, String> {
        let c = match self.peek() {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                self.at += 1;
                return self.unicode_escape();
            }
            _ => return Err(self.unexpected("an escape (one of \" \\ / b f n r t u)")),
        };
        self.at += 1;
        Ok(c)
    }

    /// `XXXX` after `\u`, and the low half after it when this is a high surrogate.
    fn unicode_escape(&mut self) -> Result<char, String> {
        let first = self.hex4()?;
        let code = match first {
            0xD800..=0xDBFF => {
                if !self.text[self.at..].starts_with("\\u") {
                    return Err(self.error("a high surrogate escape not followed by a low one"));
                }
                self.at += 2;
                let second = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&second) {
                    return Err(self.error("a high surrogate escape not followed by a low one"));
                }
                0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
            }
            0xDC00..=0xDFFF => return Err(self.error("a low surrogate escape without a high one before it")),
            code => code,
        };
        char::from_u32(code).ok_or_else(|| self.error("an escape that is not a character"))
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self.bytes.get(self.at..self.at + 4).filter(|d| d.iter().all(u8::is_ascii_hexdigit));
        let Some(digits) = digits else {
            return Err(self.error("expected four hex digits after `\\u`"));
        };
        // Four ASCII hex digits: valid UTF-8 and a valid u32.
        let code = u32::from_str_radix(std::str::from_utf8(digits).unwrap_or("0"), 16).unwrap_or(0);
        self.at += 4;
        Ok(code)
    }

    fn number(&mut self) -> Result<Number, String> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.unexpected("a digit")),
        }
        let mut integer = true;
        if self.peek() == Some(b'.') {
            integer = false;
            self.at += 1;
            if !self.peek().is_some_and(|b| b.is_ascii_digit()) {
                return Err(self.unexpected("a digit after `.`"));
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            integer = false;
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if !self.peek().is_some_and(|b| b.is_ascii_digit()) {
                return Err(self.unexpected("a digit in the exponent"));
            }
            self.digits();
        }
        let text = &self.text[start..self.at];
        let float: f64 = text.parse().map_err(|_| self.error("a number Rust cannot read"))?;
        if !float.is_finite() {
            self.at = start;
            return Err(self.error(&format!("the number {text} is too large")));
        }
        let integer = if integer { text.parse::<i128>().ok() } else { None };
        Ok(Number { integer, float })
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
    }
}
