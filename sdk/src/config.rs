//! A stage's options, as the operator wrote them in TOML (handed over as JSON),
//! and the reader that checks them.

use std::collections::HashMap;
use std::fmt::Display;

use crate::json::Value;

/// The `config` table of a chain stage. Read it with [`Config::options`].
#[derive(Debug, Clone)]
pub struct Config {
    value: Value,
}

impl Config {
    /// Parses the JSON the host hands `configure`: a table (a JSON object);
    /// empty text counts as `{}`. Plugins get a parsed `Config`; this is for
    /// building one in a test.
    pub fn parse(json: &str) -> Result<Self, String> {
        let value = if json.trim().is_empty() {
            Value::Object(Vec::new())
        } else {
            Value::parse(json).map_err(|e| format!("config is not valid JSON: {e}"))?
        };
        if value.as_object().is_none() {
            return Err(format!("config must be a table, not {}", value.kind()));
        }
        Ok(Config { value })
    }

    /// A reader for the options, which refuses every problem by the option's
    /// name: a value of the wrong type, an integer that does not fit, and — in
    /// [`Options::done`] — any option that was not read.
    #[must_use = "read the options from it, then call `done`"]
    pub fn options(&self) -> Options<'_> {
        Options { table: self.value.as_object().unwrap_or_default(), known: Vec::new() }
    }

    /// The table as a JSON value (always a [`Value::Object`]).
    pub fn raw(&self) -> &Value {
        &self.value
    }
}

/// Reads a stage's options one by one, then refuses the ones it did not read.
///
/// Each reader takes the option's name and returns `Ok(None)` when the option is
/// absent, `Ok(Some(value))` when it holds a value of the asked type, and an
/// `Err` naming the option (``option `floor`: expected a number, found the
/// string "low"``) otherwise. Defaults are the caller's: `.unwrap_or(…)`.
/// Finish with [`done`](Options::done), which refuses every option no reader
/// asked for, so that a misspelt option is an error, not silently ignored.
///
/// ```
/// # use poolgate_sdk::Config;
/// # fn main() -> Result<(), String> {
/// let config = Config::parse(r#"{ "floor": 0.1, "buckets": { "xy": "opus" } }"#)?;
/// let mut o = config.options();
/// let floor = o.f64("floor")?.unwrap_or(0.02);
/// let ttl_ms = o.u64("idle_ttl_ms")?.unwrap_or(3_600_000);
/// let buckets = o.string_map("buckets")?.unwrap_or_default();
/// o.done()?;
/// assert_eq!((floor, ttl_ms, buckets["xy"].as_str()), (0.1, 3_600_000, "opus"));
///
/// let config = Config::parse(r#"{ "flor": 0.1 }"#)?;
/// let mut o = config.options();
/// o.f64("floor")?;
/// o.string_map("buckets")?;
/// assert_eq!(o.done().unwrap_err(), "unknown option `flor` (expected one of floor, buckets)");
/// # Ok(())
/// # }
/// ```
///
/// `null` counts as a value of the wrong type, not as absent: TOML has no null,
/// so one only arrives for a float TOML allows and JSON does not (`nan`, `inf`).
#[derive(Debug)]
pub struct Options<'c> {
    table: &'c [(String, Value)],
    /// Every name a reader asked for, in order: read or absent, it is known.
    known: Vec<String>,
}

impl<'c> Options<'c> {
    /// The raw value of option `name`, if present; marks it as read.
    pub fn value(&mut self, name: &str) -> Option<&'c Value> {
        if !self.known.iter().any(|k| k == name) {
            self.known.push(name.to_string());
        }
        self.table.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// A boolean option.
    pub fn bool(&mut self, name: &str) -> Result<Option<bool>, String> {
        self.read(name, "a boolean (true or false)", Value::as_bool)
    }

    /// A number option; integers are accepted too (`1` reads as `1.0`).
    pub fn f64(&mut self, name: &str) -> Result<Option<f64>, String> {
        self.read(name, "a number", Value::as_f64)
    }

    /// A `u64` option: a whole number from 0 to 2⁶⁴ − 1, written without a
    /// fraction or exponent (`5`, not `5.0`).
    pub fn u64(&mut self, name: &str) -> Result<Option<u64>, String> {
        self.integer(name)
    }

    /// A `u32` option: a whole number from 0 to 2³² − 1.
    pub fn u32(&mut self, name: &str) -> Result<Option<u32>, String> {
        self.integer(name)
    }

    /// A `usize` option: a whole number from 0 to `usize::MAX`.
    pub fn usize(&mut self, name: &str) -> Result<Option<usize>, String> {
        self.integer(name)
    }

    /// An `i64` option: a whole number from −2⁶³ to 2⁶³ − 1.
    pub fn i64(&mut self, name: &str) -> Result<Option<i64>, String> {
        self.integer(name)
    }

    /// A string option.
    pub fn string(&mut self, name: &str) -> Result<Option<String>, String> {
        self.read(name, "a string", |v| v.as_str().map(str::to_string))
    }

    /// An array of strings (`["a", "b"]`).
    pub fn strings(&mut self, name: &str) -> Result<Option<Vec<String>>, String> {
        let Some(value) = self.value(name) else {
            return Ok(None);
        };
        let items = value.as_array().ok_or_else(|| wrong_type(name, "an array of strings", value))?;
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                item.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| wrong_part(name, &format!("element {i}"), "a string", item))
            })
            .collect::<Result<_, _>>()
            .map(Some)
    }

    /// A table of strings (`{ oi = "fable" }`), as a map.
    pub fn string_map(&mut self, name: &str) -> Result<Option<HashMap<String, String>>, String> {
        let Some(value) = self.value(name) else {
            return Ok(None);
        };
        let entries = value.as_object().ok_or_else(|| wrong_type(name, "a table of strings", value))?;
        entries
            .iter()
            .map(|(key, item)| match item.as_str() {
                Some(s) => Ok((key.clone(), s.to_string())),
                None => Err(wrong_part(name, &format!("entry `{key}`"), "a string", item)),
            })
            .collect::<Result<_, _>>()
            .map(Some)
    }

    /// An option that must be present: `read` is one of the readers above
    /// (`Options::string`, `Options::u64`, …).
    ///
    /// ```
    /// # use poolgate_sdk::{Config, Options};
    /// let config = Config::parse("{}").unwrap();
    /// let mut o = config.options();
    /// let err = o.required("mode", Options::string).unwrap_err();
    /// assert_eq!(err, "missing option `mode`");
    /// ```
    pub fn required<T>(
        &mut self,
        name: &str,
        read: impl FnOnce(&mut Self, &str) -> Result<Option<T>, String>,
    ) -> Result<T, String> {
        read(self, name)?.ok_or_else(|| format!("missing option `{name}`"))
    }

    /// Refuses every option that no reader asked for, naming each one and the
    /// options this stage takes:
    /// ``unknown option `flor` (expected one of floor, buckets)``.
    pub fn done(self) -> Result<(), String> {
        let unknown: Vec<String> = self
            .table
            .iter()
            .filter(|(k, _)| !self.known.iter().any(|n| n == k))
            .map(|(k, _)| format!("`{k}`"))
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        let noun = if unknown.len() == 1 { "option" } else { "options" };
        let expected = if self.known.is_empty() {
            "this stage takes no options".to_string()
        } else {
            format!("expected one of {}", self.known.join(", "))
        };
        Err(format!("unknown {noun} {} ({expected})", unknown.join(", ")))
    }

    fn read<T>(
        &mut self,
        name: &str,
        expected: &str,
        get: impl FnOnce(&Value) -> Option<T>,
    ) -> Result<Option<T>, String> {
        match self.value(name) {
            None => Ok(None),
            Some(value) => get(value).map(Some).ok_or_else(|| wrong_type(name, expected, value)),
        }
    }

    fn integer<T: TryFrom<i128> + Bounded>(&mut self, name: &str) -> Result<Option<T>, String> {
        let Some(value) = self.value(name) else {
            return Ok(None);
        };
        let expected = || format!("a whole number from {} to {}", T::MIN, T::MAX);
        let Some(number) = value.as_number() else {
            return Err(wrong_type(name, &expected(), value));
        };
        number.as_integer().and_then(|i| T::try_from(i).ok()).map(Some).ok_or_else(|| {
            let float = number.as_f64();
            let hint = match number.as_integer() {
                None if float.fract() != 0.0 => " (it has a fraction)",
                None if (T::MIN as f64..=T::MAX as f64).contains(&float) => {
                    " (write it without a fraction or exponent)"
                }
                _ => "", // out of range, however it is written
            };
            format!("option `{name}`: expected {}, found {number}{hint}", expected())
        })
    }
}

fn wrong_type(name: &str, expected: &str, found: &Value) -> String {
    format!("option `{name}`: expected {expected}, found {}", found.describe())
}

/// As [`wrong_type`], for one element or entry of the option.
fn wrong_part(name: &str, part: &str, expected: &str, found: &Value) -> String {
    format!("option `{name}`: {part}: expected {expected}, found {}", found.describe())
}

/// The integer types [`Options`] reads, with their bounds for messages.
trait Bounded {
    const MIN: i128;
    const MAX: i128;
}

macro_rules! bounded {
    ($($t:ty),*) => {$(
        impl Bounded for $t {
            const MIN: i128 = <$t>::MIN as i128;
            const MAX: i128 = <$t>::MAX as i128;
        }
    )*};
}
bounded!(u32, u64, usize, i64);

/// Checks that `value` of option `name` lies in `min..=max`, with an error naming it.
pub fn check_range<T: PartialOrd + Display>(name: &str, value: T, min: T, max: T) -> Result<T, String> {
    if value < min || value > max {
        Err(format!("option `{name}` = {value} is out of range ({min} to {max})"))
    } else {
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: &str) -> Config {
        Config::parse(json).unwrap()
    }

    #[test]
    fn absent_options_read_as_none_and_present_ones_as_values() {
        let c = config(
            r#"{"b": true, "f": 0.25, "i": 7, "u": 18446744073709551615, "s": "x", "l": ["a", "b"], "m": {"k": "v"}}"#,
        );
        let mut o = c.options();
        assert_eq!(o.bool("b"), Ok(Some(true)));
        assert_eq!(o.f64("f"), Ok(Some(0.25)));
        assert_eq!(o.f64("i"), Ok(Some(7.0)), "an integer is a number");
        assert_eq!(o.u32("i"), Ok(Some(7)));
        assert_eq!(o.u64("u"), Ok(Some(u64::MAX)));
        assert_eq!(o.string("s").unwrap().as_deref(), Some("x"));
        assert_eq!(o.strings("l"), Ok(Some(vec!["a".to_string(), "b".to_string()])));
        assert_eq!(o.string_map("m").unwrap().unwrap()["k"], "v");
        assert_eq!(o.f64("absent"), Ok(None));
        assert_eq!(o.value("absent"), None);
        assert_eq!(o.done(), Ok(()));
        assert_eq!(config("").options().done(), Ok(()), "no config is an empty table");
    }

    #[test]
    fn a_wrong_type_is_refused_by_name() {
        let c = config(r#"{"floor": "low", "on": 1, "buckets": ["oi"], "m": {"xy": 3}, "l": ["a", 2], "z": null}"#);
        let mut o = c.options();
        assert_eq!(o.f64("floor").unwrap_err(), r#"option `floor`: expected a number, found the string "low""#);
        assert_eq!(o.bool("on").unwrap_err(), "option `on`: expected a boolean (true or false), found the number 1");
        assert_eq!(
            o.string_map("buckets").unwrap_err(),
            r#"option `buckets`: expected a table of strings, found the array ["oi"]"#
        );
        assert_eq!(o.string_map("m").unwrap_err(), "option `m`: entry `xy`: expected a string, found the number 3");
        assert_eq!(o.strings("l").unwrap_err(), "option `l`: element 1: expected a string, found the number 2");
        assert_eq!(o.string("z").unwrap_err(), "option `z`: expected a string, found null");
    }

    #[test]
    fn integers_refuse_fractions_negatives_and_overflow() {
        let c = config(r#"{"half": 1.5, "whole": 5.0, "exp": 1e3, "neg": -1, "big": 4294967296, "huge": 1e30}"#);
        let mut o = c.options();
        let e = o.u64("half").unwrap_err();
        assert_eq!(
            e,
            "option `half`: expected a whole number from 0 to 18446744073709551615, found 1.5 (it has a fraction)"
        );
        assert!(o.u64("whole").unwrap_err().contains("found 5.0 (write it without a fraction or exponent)"));
        assert!(o.u64("exp").unwrap_err().contains("found 1000.0 (write it without"));
        assert_eq!(o.u32("neg").unwrap_err(), "option `neg`: expected a whole number from 0 to 4294967295, found -1");
        assert!(
            o.u32("big").unwrap_err().contains("`big`: expected a whole number from 0 to 4294967295, found 4294967296")
        );
        assert_eq!(o.u64("big"), Ok(Some(4_294_967_296)));
        assert_eq!(o.i64("neg"), Ok(Some(-1)));
        assert!(o.u64("huge").unwrap_err().ends_with("found 1e30"), "out of range, not a matter of writing");
        assert!(c.options().usize("neg").unwrap_err().contains("`neg`"));
        let beyond_i128 = config(r#"{"n": 123456789012345678901234567890123456789012}"#);
        assert!(beyond_i128.options().u64("n").unwrap_err().ends_with("found 1.2345678901234568e41"));
    }

    #[test]
    fn done_names_every_option_not_read() {
        let c = config(r#"{"flor": 0.1, "buckets": {}, "extra": 1}"#);
        let mut o = c.options();
        o.f64("floor").unwrap();
        o.string_map("buckets").unwrap();
        assert_eq!(o.done().unwrap_err(), "unknown options `flor`, `extra` (expected one of floor, buckets)");
        let c = config(r#"{"x": 1}"#);
        assert_eq!(c.options().done().unwrap_err(), "unknown option `x` (this stage takes no options)");
        // A reader that refused the value still marks the option known.
        let c = config(r#"{"floor": "low"}"#);
        let mut o = c.options();
        assert!(o.f64("floor").is_err());
        assert_eq!(o.done(), Ok(()));
    }

    #[test]
    fn required_options_are_named_when_missing() {
        let c = config(r#"{"mode": "fast", "n": "x"}"#);
        let mut o = c.options();
        assert_eq!(o.required("mode", Options::string).as_deref(), Ok("fast"));
        assert_eq!(o.required("other", Options::string), Err("missing option `other`".to_string()));
        assert!(o.required("n", Options::u64).unwrap_err().contains("option `n`: expected a whole number"));
    }

    #[test]
    fn the_config_must_be_a_json_table() {
        assert_eq!(Config::parse("[1]").unwrap_err(), "config must be a table, not an array");
        assert!(Config::parse("{").unwrap_err().starts_with("config is not valid JSON: expected a key"));
        assert_eq!(config(r#"{"a": 1}"#).raw().get("a").and_then(Value::as_u64), Some(1));
    }

    #[test]
    fn ranges_are_checked_by_name() {
        assert_eq!(check_range("floor", 0.5, 0.0, 1.0), Ok(0.5));
        assert_eq!(check_range("floor", 2.0, 0.0, 1.0).unwrap_err(), "option `floor` = 2 is out of range (0 to 1)");
    }
}
