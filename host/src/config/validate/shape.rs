//! The shape pass: every key against [`schema`](crate::config::schema), with
//! a suggestion for an unknown one, and the line of every key recorded on the
//! way for the later passes' messages.

use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::{LineIndex, Problem};
use crate::config::schema::{Field, Kind};

/// Byte offset → line, for one file.
pub(super) struct Lines(Vec<usize>);

impl Lines {
    pub(super) fn new(text: &str) -> Self {
        Lines(text.match_indices('\n').map(|(i, _)| i).collect())
    }
    pub(super) fn line(&self, offset: usize) -> usize {
        self.0.partition_point(|&nl| nl < offset) + 1
    }
}

/// Walks a parsed table against the schema, collecting problems and key lines.
pub(super) struct Walker<'a> {
    pub(super) lines: &'a Lines,
    pub(super) problems: Vec<Problem>,
    pub(super) index: LineIndex,
}

impl Walker<'_> {
    fn push(&mut self, path: &str, span: Range<usize>, message: String) {
        let line = self.lines.line(span.start);
        self.problems.push(Problem { path: path.to_string(), line: Some(line), message });
    }

    pub(super) fn table(&mut self, path: &str, table: &DeTable<'_>, fields: &'static [Field]) {
        for (key, value) in table.iter() {
            let name = key.get_ref().as_ref();
            let here = if path.is_empty() { name.to_string() } else { format!("{path}.{name}") };
            self.index.insert(here.clone(), self.lines.line(key.span().start));
            match fields.iter().find(|f| f.name == name) {
                Some(field) => self.value(&here, value, field.kind),
                None => {
                    let hint = suggest(name, fields).map_or(String::new(), |s| format!(" (did you mean `{s}`?)"));
                    let allowed: Vec<&str> = fields.iter().map(|f| f.name).collect();
                    self.push(&here, key.span(), format!("unknown key{hint}; allowed here: {}", allowed.join(", ")));
                }
            }
        }
    }

    fn value(&mut self, path: &str, value: &Spanned<DeValue<'_>>, kind: Kind) {
        let span = value.span();
        let v = value.get_ref();
        match kind {
            Kind::Str => {
                if !v.is_str() {
                    self.push(path, span, format!("expected a string, found {}", v.type_str()));
                }
            }
            Kind::Bool => {
                if !v.is_bool() {
                    self.push(path, span, format!("expected true or false, found {}", v.type_str()));
                }
            }
            Kind::OneOf(options) => self.one_of(path, span, v, options),
            Kind::Int(min, max) => self.int(path, span, v, min, max),
            Kind::Float(min, max) => self.float(path, span, v, min, max),
            Kind::Strs => self.strs(path, span, v),
            Kind::AnyTable => {
                if !v.is_table() {
                    self.push(path, span, format!("expected a table, found {}", v.type_str()));
                }
            }
            Kind::Table(fields) => match v.as_table() {
                Some(t) => self.table(path, t, fields),
                None => self.push(path, span, format!("expected a table ([{path}]), found {}", v.type_str())),
            },
            Kind::Tables(fields, required) => self.tables(path, span, v, fields, required),
            Kind::Named(fields, required) => self.named(path, span, v, fields, required),
        }
    }

    fn one_of(&mut self, path: &str, span: Range<usize>, v: &DeValue<'_>, options: &[&str]) {
        match v.as_str() {
            Some(s) if options.contains(&s) => {}
            Some(s) => self.push(path, span, format!("`{s}` is not allowed; use one of: {}", options.join(", "))),
            None => self.push(path, span, format!("expected one of {}, found {}", options.join(", "), v.type_str())),
        }
    }

    fn int(&mut self, path: &str, span: Range<usize>, v: &DeValue<'_>, min: i64, max: i64) {
        match v.as_integer().and_then(|i| i64::from_str_radix(&i.as_str().replace('_', ""), i.radix()).ok()) {
            Some(n) if (min..=max).contains(&n) => {}
            Some(n) => self.push(path, span, format!("{n} is out of range; allowed: {min} to {max}")),
            None => self.push(path, span, format!("expected an integer from {min} to {max}, found {}", v.type_str())),
        }
    }

    fn float(&mut self, path: &str, span: Range<usize>, v: &DeValue<'_>, min: f64, max: f64) {
        let n = v
            .as_float()
            .and_then(|x| x.as_str().replace('_', "").parse::<f64>().ok())
            .or_else(|| v.as_integer().and_then(|i| i.as_str().replace('_', "").parse::<f64>().ok()));
        match n {
            Some(n) if (min..=max).contains(&n) => {}
            Some(n) => self.push(path, span, format!("{n} is out of range; allowed: {min} to {max}")),
            None => self.push(path, span, format!("expected a number from {min} to {max}, found {}", v.type_str())),
        }
    }

    fn strs(&mut self, path: &str, span: Range<usize>, v: &DeValue<'_>) {
        match v.as_array() {
            Some(items) => {
                for item in items.iter().filter(|i| !i.get_ref().is_str()) {
                    self.push(path, item.span(), format!("expected strings, found {}", item.get_ref().type_str()));
                }
            }
            None => self.push(path, span, format!("expected an array of strings, found {}", v.type_str())),
        }
    }

    /// An array of tables (`[[path]]`): each entry is located, checked for the
    /// `required` keys and walked.
    fn tables(&mut self, path: &str, span: Range<usize>, v: &DeValue<'_>, fields: &'static [Field], required: &[&str]) {
        let Some(items) = v.as_array() else {
            self.push(path, span, format!("expected an array of tables ([[{path}]]), found {}", v.type_str()));
            return;
        };
        for (i, item) in items.iter().enumerate() {
            self.entry(&format!("{path}[{i}]"), item, fields, required, &format!("a table ([[{path}]])"));
        }
    }

    /// A table of the operator's names (`[path."name"]`): each entry is
    /// located, checked for the `required` keys and walked.
    fn named(&mut self, path: &str, span: Range<usize>, v: &DeValue<'_>, fields: &'static [Field], required: &[&str]) {
        let Some(entries) = v.as_table() else {
            self.push(path, span, format!("expected a table ([{path}.\"name\"]), found {}", v.type_str()));
            return;
        };
        for (name, item) in entries {
            self.entry(&format!("{path}.\"{}\"", name.get_ref()), item, fields, required, "a table");
        }
    }

    /// One entry of [`Walker::tables`] or [`Walker::named`] at `here`.
    fn entry(
        &mut self,
        here: &str,
        item: &Spanned<DeValue<'_>>,
        fields: &'static [Field],
        required: &[&str],
        what: &str,
    ) {
        self.index.insert(here.to_string(), self.lines.line(item.span().start));
        let Some(t) = item.get_ref().as_table() else {
            self.push(here, item.span(), format!("expected {what}, found {}", item.get_ref().type_str()));
            return;
        };
        for key in required.iter().filter(|k| t.get(**k).is_none()) {
            self.push(here, item.span(), format!("missing `{key}`"));
        }
        self.table(here, t, fields);
    }
}

/// The closest allowed key within two edits.
pub(super) fn suggest(name: &str, fields: &[Field]) -> Option<&'static str> {
    fields
        .iter()
        .map(|f| (distance(name, f.name), f.name))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, n)| n)
}

fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push((prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}
