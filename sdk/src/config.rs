//! A stage's options, as the operator wrote them in TOML (handed over as JSON).

use serde::de::DeserializeOwned;

/// The `config` table of a chain stage.
#[derive(Debug, Clone)]
pub struct Config {
    value: serde_json::Value,
}

impl Config {
    pub(crate) fn parse(json: &str) -> Result<Self, String> {
        let value = if json.trim().is_empty() {
            serde_json::Value::Object(Default::default())
        } else {
            serde_json::from_str(json).map_err(|e| format!("config is not valid JSON: {e}"))?
        };
        if !value.is_object() {
            return Err("config must be a table".into());
        }
        Ok(Config { value })
    }

    /// Deserializes the options into `T`. With `#[serde(deny_unknown_fields)]` on `T`
    /// a misspelt option is refused with its name; serde's message names the option
    /// and what was expected, e.g. ``unknown field `flor`, expected `floor` ``.
    /// A value of the wrong type (`"floor": "low"`) is named too, as
    /// ``option `floor`: invalid type: string "low", expected f64``.
    pub fn parse_into<T: DeserializeOwned>(&self) -> Result<T, String> {
        serde_json::from_value(self.value.clone()).map_err(|e| {
            let message = e.to_string();
            // serde names unknown and missing fields itself, but not a field
            // whose value has the wrong type. Find it: the one option whose
            // removal makes the rest parse.
            let culprit = self.value.as_object().and_then(|options| {
                options.keys().find(|key| {
                    let mut rest = options.clone();
                    rest.remove(*key);
                    serde_json::from_value::<T>(serde_json::Value::Object(rest)).is_ok()
                })
            });
            match culprit {
                Some(key) if !message.contains(&format!("`{key}`")) => {
                    format!("option `{key}`: {message}")
                }
                _ => message,
            }
        })
    }

    /// The raw JSON value of the table.
    pub fn raw(&self) -> &serde_json::Value {
        &self.value
    }
}

/// Checks that `value` of option `name` lies in `min..=max`, with an error naming it.
pub fn check_range<T: PartialOrd + std::fmt::Display>(name: &str, value: T, min: T, max: T) -> Result<T, String> {
    if value < min || value > max {
        Err(format!("option `{name}` = {value} is out of range ({min} to {max})"))
    } else {
        Ok(value)
    }
}
