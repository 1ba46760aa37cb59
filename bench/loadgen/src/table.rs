//! The run's table: one row per figure, one column per hop, and under each
//! figure where a ratio means something, every hop's figure divided by
//! HAProxy's and by the pass-through's (absolute CPU figures move 4x between
//! VMs and days; a ratio to a hop measured in the same run does not).

use std::collections::BTreeMap;

use crate::hops::NAMES;

struct Row {
    label: String,
    values: [Option<f64>; 4],
    ratios: bool,
    digits: usize,
}

#[derive(Default)]
pub struct Table {
    rows: Vec<Row>,
}

impl Table {
    /// A figure per hop (by name), printed with `digits` decimals; `ratios`:
    /// print its ratios to HAProxy and to the pass-through.
    pub fn add(&mut self, label: impl Into<String>, by_hop: &[(&str, f64)], digits: usize, ratios: bool) {
        let mut values = [None; 4];
        for (name, v) in by_hop {
            if let Some(i) = NAMES.iter().position(|n| n == name) {
                values[i] = Some(*v);
            }
        }
        self.rows.push(Row { label: label.into(), values, ratios, digits });
    }

    /// A section heading.
    pub fn section(&mut self, title: impl Into<String>) {
        self.rows.push(Row { label: title.into(), values: [None; 4], ratios: false, digits: 0 });
    }

    pub fn print(&self) {
        let cell = |v: Option<f64>, d: usize| v.map_or("—".to_string(), |v| format!("{v:.d$}"));
        println!("\n| figure | {} |", NAMES.join(" | "));
        println!("|---|{}", "---:|".repeat(NAMES.len()));
        for r in &self.rows {
            if r.values.iter().all(Option::is_none) {
                println!("| **{}** | {}", r.label, "| ".repeat(NAMES.len()));
                continue;
            }
            let cells: Vec<String> = r.values.iter().map(|v| cell(*v, r.digits)).collect();
            println!("| {} | {} |", r.label, cells.join(" | "));
            if !r.ratios {
                continue;
            }
            for (i, name) in [(2, "÷ HAProxy"), (3, "÷ pass-through")] {
                let Some(base) = r.values[i].filter(|b| *b != 0.0) else { continue };
                let cells: Vec<String> = r.values.iter().map(|v| cell(v.map(|v| v / base), 2)).collect();
                println!("| {name} | {} |", cells.join(" | "));
            }
        }
    }

    /// Every figure as JSON: `{ label: { hop: value } }`.
    pub fn json(&self) -> serde_json::Value {
        let mut out = BTreeMap::new();
        for r in self.rows.iter().filter(|r| r.values.iter().any(Option::is_some)) {
            let by: BTreeMap<&str, f64> = NAMES.iter().zip(&r.values).filter_map(|(n, v)| v.map(|v| (*n, v))).collect();
            out.insert(r.label.clone(), by);
        }
        serde_json::json!(out)
    }
}
