//! A small JSON value and parser: what the host hands `configure` (the stage's
//! TOML `config` table, as JSON) needs, and nothing more.
//!
//! It reads RFC 8259 JSON: objects, arrays, strings with every escape (including
//! `\uXXXX` and surrogate pairs), numbers, `true`, `false` and `null`. Numbers
//! written without a fraction or exponent stay exact integers, so a `u64` option
//! never goes through `f64`. Most rankers never touch this module: they read their
//! options with [`Options`](crate::Options).
//!
//! ```
//! use poolgate_sdk::json::Value;
//!
//! let v = Value::parse(r#"{ "floor": 0.1, "buckets": { "oi": "fable" }, "name": "caf\u00e9" }"#).unwrap();
//! assert_eq!(v.get("floor").and_then(Value::as_f64), Some(0.1));
//! assert_eq!(v.get("buckets").and_then(|b| b.get("oi")).and_then(Value::as_str), Some("fable"));
//! assert_eq!(v.get("name").and_then(Value::as_str), Some("café"));
//! assert_eq!(v.to_string(), r#"{"floor":0.1,"buckets":{"oi":"fable"},"name":"café"}"#);
//! ```

use std::fmt;

mod parse;

/// A JSON value. Objects keep their keys in document order.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number.
    Number(Number),
    /// A string, unescaped.
    String(String),
    /// An array.
    Array(Vec<Value>),
    /// An object (a TOML table): its entries in document order, keys unique.
    Object(Vec<(String, Value)>),
}

/// A JSON number: an exact integer when written as one, otherwise an `f64`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Number {
    /// The exact value, when written without fraction or exponent and within
    /// the range of `i128`.
    integer: Option<i128>,
    /// The nearest `f64` (finite: larger magnitudes are refused when parsing).
    float: f64,
}

impl Number {
    /// The value as an `f64` (the nearest one, for a large integer).
    pub fn as_f64(&self) -> f64 {
        self.float
    }

    /// The value as an integer, when it was written as one (`3`, not `3.0` or
    /// `3e0`) and fits `i128`.
    pub fn as_integer(&self) -> Option<i128> {
        self.integer
    }

    /// The value as a `u64`, when it was written as an integer and fits.
    pub fn as_u64(&self) -> Option<u64> {
        self.integer.and_then(|i| u64::try_from(i).ok())
    }

    /// The value as an `i64`, when it was written as an integer and fits.
    pub fn as_i64(&self) -> Option<i64> {
        self.integer.and_then(|i| i64::try_from(i).ok())
    }
}

impl From<f64> for Number {
    fn from(float: f64) -> Self {
        Number { integer: None, float }
    }
}

impl From<i64> for Number {
    fn from(i: i64) -> Self {
        Number { integer: Some(i.into()), float: i as f64 }
    }
}

impl From<u64> for Number {
    fn from(u: u64) -> Self {
        Number { integer: Some(u.into()), float: u as f64 }
    }
}

impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.integer {
            Some(i) => write!(f, "{i}"),
            // `{:?}` keeps the fraction (`1.0`) and uses exponents for extremes.
            None if self.float.is_finite() => write!(f, "{:?}", self.float),
            None => f.write_str("null"),
        }
    }
}

impl Value {
    /// Parses one JSON document (surrounding whitespace allowed). The error names
    /// the line and column of the problem.
    pub fn parse(text: &str) -> Result<Value, String> {
        parse::document(text)
    }

    /// The entry `key` of an object; `None` for other values or a missing key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_object()?.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The boolean, if this is one.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The number, if this is one.
    pub fn as_number(&self) -> Option<Number> {
        match self {
            Value::Number(n) => Some(*n),
            _ => None,
        }
    }

    /// Any number, as an `f64`.
    pub fn as_f64(&self) -> Option<f64> {
        self.as_number().map(|n| n.as_f64())
    }

    /// A number written as an integer that fits a `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_number()?.as_u64()
    }

    /// A number written as an integer that fits an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_number()?.as_i64()
    }

    /// The elements, if this is an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The entries in document order, if this is an object.
    pub fn as_object(&self) -> Option<&[(String, Value)]> {
        match self {
            Value::Object(o) => Some(o),
            _ => None,
        }
    }

    /// Whether this is `null`.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// What kind of value this is, for messages: `"a string"`, `"a table"`, ….
    /// (A JSON object is a TOML table, which is what an operator wrote.)
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
            Value::Object(_) => "a table",
        }
    }

    /// The value as an error message shows it: its kind, then the value as JSON,
    /// shortened past 60 characters (`the string "low"`, `the array ["oi"]`).
    pub fn describe(&self) -> String {
        let kind = match self {
            Value::Null => return "null".into(),
            Value::Bool(b) => return b.to_string(),
            Value::Number(_) => "the number",
            Value::String(_) => "the string",
            Value::Array(_) => "the array",
            Value::Object(_) => "the table",
        };
        let mut json = self.to_string();
        if json.chars().count() > 60 {
            json = json.chars().take(57).collect::<String>() + "…";
        }
        format!("{kind} {json}")
    }
}

impl fmt::Display for Value {
    /// Compact JSON: no whitespace, strings escaped as JSON requires.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => f.write_str("null"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Number(n) => write!(f, "{n}"),
            Value::String(s) => write_string(f, s),
            Value::Array(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
            Value::Object(entries) => {
                f.write_str("{")?;
                for (i, (key, value)) in entries.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write_string(f, key)?;
                    write!(f, ":{value}")?;
                }
                f.write_str("}")
            }
        }
    }
}

fn write_string(f: &mut fmt::Formatter<'_>, s: &str) -> fmt::Result {
    f.write_str("\"")?;
    for c in s.chars() {
        match c {
            '"' => f.write_str("\\\"")?,
            '\\' => f.write_str("\\\\")?,
            '\n' => f.write_str("\\n")?,
            '\r' => f.write_str("\\r")?,
            '\t' => f.write_str("\\t")?,
            c if (c as u32) < 0x20 => write!(f, "\\u{:04x}", c as u32)?,
            c => write!(f, "{c}")?,
        }
    }
    f.write_str("\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Value {
        Value::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn refused(text: &str) -> String {
        match Value::parse(text) {
            Ok(v) => panic!("{text} parsed as {v:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn reads_every_kind_of_value() {
        let v = parse(" {\"a\": [1, -2.5, 3e2, true, false, null, {}, []], \"b\": {\"c\": \"d\"}} ");
        let a = v.get("a").and_then(Value::as_array).unwrap();
        assert_eq!(a[0].as_u64(), Some(1));
        assert_eq!(a[1].as_f64(), Some(-2.5));
        assert_eq!(a[2].as_f64(), Some(300.0));
        assert_eq!(a[2].as_u64(), None, "3e2 is not written as an integer");
        assert_eq!(a[3], Value::Bool(true));
        assert_eq!(a[4].as_bool(), Some(false));
        assert!(a[5].is_null());
        assert_eq!(a[6], Value::Object(vec![]));
        assert_eq!(a[7], Value::Array(vec![]));
        assert_eq!(v.get("b").and_then(|b| b.get("c")).and_then(Value::as_str), Some("d"));
        assert_eq!(v.get("z"), None);
    }

    #[test]
    fn keeps_integers_exact_and_keys_in_order() {
        let v = parse(r#"{"z": 18446744073709551615, "a": -9223372036854775808, "m": 0, "big": 1e308}"#);
        assert_eq!(v.get("z").and_then(Value::as_u64), Some(u64::MAX));
        assert_eq!(v.get("a").and_then(Value::as_i64), Some(i64::MIN));
        assert_eq!(v.get("a").and_then(Value::as_u64), None);
        let keys: Vec<&str> = v.as_object().unwrap().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["z", "a", "m", "big"]);
        assert_eq!(parse("123456789012345678901234567890123456789012").as_u64(), None, "beyond i128");
        assert_eq!(parse("-0").as_f64(), Some(0.0));
    }

    #[test]
    fn unescapes_strings() {
        assert_eq!(parse(r#""a\"b\\c\/d\b\f\n\r\t""#).as_str(), Some("a\"b\\c/d\u{8}\u{c}\n\r\t"));
        assert_eq!(parse(r#""\u00e9\u20AC""#).as_str(), Some("é€"));
        assert_eq!(parse(r#""\ud83d\ude00 smile""#).as_str(), Some("😀 smile"), "a surrogate pair");
        assert_eq!(parse("\"naïve 😀\"").as_str(), Some("naïve 😀"), "raw UTF-8 passes through");
        assert_eq!(parse(r#""\u0000""#).as_str(), Some("\0"));
    }

    #[test]
    fn refuses_what_json_does_not_allow_and_says_where() {
        for (text, want) in [
            ("", "expected a value, found the end of the text at line 1, column 1"),
            ("{\"a\": 1,}", "expected a key (a string), found `}` at line 1, column 9"),
            ("[1 2]", "expected `,` or `]`, found `2`"),
            ("{\"a\" 1}", "expected `:`, found `1`"),
            ("{\n  \"a\": tru\n}", "expected a value, found `t` at line 2, column 8"),
            ("01", "trailing characters"),
            ("1.", "a digit after `.`"),
            ("-", "expected a digit"),
            ("1e", "a digit in the exponent"),
            ("+1", "expected a value, found `+`"),
            ("1e999", "the number 1e999 is too large"),
            ("'a'", "expected a value, found `'`"),
            ("\"abc", "without its closing quote"),
            ("\"a\tb\"", "a control character"),
            (r#""\x""#, "expected an escape"),
            (r#""\u12g4""#, "four hex digits"),
            (r#""\ud83d""#, "a high surrogate escape not followed by a low one"),
            (r#""\ud83d\u0041""#, "a high surrogate escape not followed by a low one"),
            (r#""\ude00""#, "a low surrogate escape without a high one"),
            (r#"{"a": 1, "a": 2}"#, "duplicate key `a` at line 1, column 10"),
            ("{} {}", "trailing characters after the JSON value at line 1, column 4"),
            ("NaN", "expected a value, found `N`"),
        ] {
            let e = refused(text);
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert!(refused(&deep).contains("nesting deeper than 128"));
        assert_eq!(parse(&("[".repeat(100) + &"]".repeat(100))).as_array().map(|a| a.len()), Some(1));
    }

    #[test]
    fn a_table_of_many_keys_is_read_in_n_log_n_and_its_duplicates_found() {
        let n = 30_000;
        let body: Vec<String> = (0..n).map(|i| format!("\"k{i}\": {i}")).collect();
        let text = format!("{{{}}}", body.join(", "));
        // A linear scan per key took 1.6 s for this in a release build (a
        // figure, not an assertion: speed is measured in benchmarks).
        let v = parse(&text);
        assert_eq!(v.as_object().map(<[_]>::len), Some(n));
        assert_eq!(v.get("k29999").and_then(Value::as_u64), Some(29_999));
        // A duplicate past the first few keys, and one among them, are named
        // where they are, as before.
        let late = format!("{{{}, \"k7\": 0}}", body[..40].join(", "));
        let column = late.len() - "\"k7\": 0}".len() + 1;
        assert_eq!(refused(&late), format!("duplicate key `k7` at line 1, column {column}"));
        let early = format!("{{{}, \"k2\": 0}}", body[..5].join(", "));
        assert!(refused(&early).starts_with("duplicate key `k2` at line 1"), "{}", refused(&early));
    }

    #[test]
    fn writes_compact_json_that_reads_back() {
        let text = r#"{"s":"q\"\\\n\u0001é","n":[1,-2,0.5,1.0,1e300],"t":true,"f":false,"z":null,"o":{}}"#;
        let v = parse(text);
        assert_eq!(v.to_string(), text);
        assert_eq!(parse(&v.to_string()), v);
    }

    #[test]
    fn describes_values_for_messages() {
        assert_eq!(parse("\"low\"").describe(), "the string \"low\"");
        assert_eq!(parse("[\"oi\"]").describe(), "the array [\"oi\"]");
        assert_eq!(parse("1.5").describe(), "the number 1.5");
        assert_eq!(parse("null").describe(), "null");
        assert_eq!(parse("true").describe(), "true");
        let long = Value::String("x".repeat(100)).describe();
        assert!(long.ends_with('…') && long.chars().count() == "the string ".len() + 58, "{long}");
    }
}
