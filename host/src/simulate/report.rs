//! What a simulation counts, and how it shows it: the side-by-side table,
//! JSON, and the plots.
//!
//! Every figure here is a function of the workload, the configs and the
//! plans (times are simulated), so the same inputs give the same report byte
//! for byte; the stages' measured time is printed beside it, never in it.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use serde::Serialize;

use super::plans::Plan;
use super::trace::Entry;
use super::upstream::{Answered, Reset};
use crate::gateway::request::record::{Ending, RequestRecord};

/// One configuration's figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Figures {
    /// The configuration's label.
    pub config: String,
    /// Requests replayed.
    pub requests: u64,
    /// Served by an account of the pool.
    pub served: u64,
    /// Answered 429 by the gateway itself (every account parked).
    pub answered_429: u64,
    /// Served by a `[[fallback]]` backend.
    pub fallback: u64,
    /// Anything else the client did not get served.
    pub failed: u64,
    /// When the pool first parked (a local 429), ms from the start.
    pub first_parked_at_ms: Option<u64>,
    /// Requests served by another account than their session's previous one.
    pub switches: u64,
    /// Switches back to the account before the previous one (A→B→A).
    pub ping_pongs: u64,
    /// Cache-creation tokens written in all.
    pub cache_creation_tokens: u64,
    /// Of those, cache reads a switch turned into writes.
    pub extra_cache_creation_from_switches: u64,
    /// Decisions whose head had the most headroom for the model (truth from
    /// the simulated accounts), as a share of decisions.
    pub head_had_most_headroom: f64,
    /// Requests served, by account.
    pub served_by: BTreeMap<String, u64>,
    /// Tokens left unused at the windows' resets, by account and window.
    pub wasted: BTreeMap<String, BTreeMap<String, u64>>,
    /// All of it, per window kind (`5h`, `7d`, `7d_opus` …).
    pub wasted_total: BTreeMap<String, u64>,
    /// The share of every 7-day window's budget that reset unused.
    pub wasted_share_7d: f64,
    /// Stage failures by `stage/cause`.
    pub plugin_errors: BTreeMap<String, u64>,
}

/// The accounts' windows at one time.
#[derive(Debug, Clone)]
pub struct Sample {
    /// ms from the start.
    pub t_ms: u64,
    /// Per account, (window, utilization) pairs.
    pub windows: Vec<Vec<(String, f64)>>,
}

/// Counts as the replay goes.
pub struct Tally {
    /// The figures so far.
    pub figures: Figures,
    ids: Vec<String>,
    /// Per session: the accounts of its last two served requests.
    sessions: HashMap<String, (usize, Option<usize>)>,
    decisions: u64,
    head_best: u64,
    stage_us: BTreeMap<String, (f64, u64)>,
}

impl Tally {
    /// A tally for configuration `label` over accounts `ids`.
    pub fn new(label: &str, ids: &[String]) -> Tally {
        let figures = Figures { config: label.to_string(), ..Default::default() };
        Tally {
            figures,
            ids: ids.to_vec(),
            sessions: HashMap::new(),
            decisions: 0,
            head_best: 0,
            stage_us: BTreeMap::new(),
        }
    }

    /// Counts one replayed request: its record, the status the client got,
    /// what the provider answered, the chain's head and each account's true
    /// headroom when it was decided.
    pub fn count(
        &mut self,
        entry: &Entry,
        record: &RequestRecord,
        status: u16,
        answered: &Answered,
        head: Option<usize>,
        headroom: &[f64],
    ) {
        let f = &mut self.figures;
        f.requests += 1;
        match (record.outcome, answered.account) {
            (Ending::Complete, Some(i)) if status < 400 => {
                f.served += 1;
                *f.served_by.entry(self.ids[i].clone()).or_default() += 1;
                f.cache_creation_tokens += entry.cache_creation_tokens + answered.cold_reads;
                let seen = self.sessions.get(&entry.session).copied();
                if let Some((last, before)) = seen
                    && last != i
                {
                    f.switches += 1;
                    f.extra_cache_creation_from_switches += answered.cold_reads;
                    if before == Some(i) {
                        f.ping_pongs += 1;
                    }
                }
                let before = match seen {
                    Some((last, before)) if last == i => before,
                    Some((last, _)) => Some(last),
                    None => None,
                };
                self.sessions.insert(entry.session.clone(), (i, before));
            }
            (Ending::Fallback, _) => f.fallback += 1,
            (e, _) if super::parked(e) => {
                f.answered_429 += 1;
                f.first_parked_at_ms.get_or_insert(entry.t_ms);
            }
            _ => f.failed += 1,
        }
        if let Some(h) = head {
            self.decisions += 1;
            let best = headroom.iter().copied().fold(f64::MIN, f64::max);
            if headroom[h] >= best - 1e-9 {
                self.head_best += 1;
            }
        }
        for a in &record.attempts {
            for s in &a.decision.stages {
                let e = self.stage_us.entry(s.stage.clone()).or_default();
                (e.0, e.1) = (e.0 + s.duration_us, e.1 + 1);
            }
            for p in &a.decision.policy_errors {
                *f.plugin_errors.entry(format!("{}/{}", p.stage, p.cause.as_str())).or_default() += 1;
            }
        }
    }

    /// Closes the figures with what was left unused at the resets.
    pub fn finish(&mut self, resets: BTreeMap<String, BTreeMap<String, Reset>>, plans: &[Plan]) {
        let f = &mut self.figures;
        f.head_had_most_headroom = ratio(self.head_best, self.decisions);
        let mut offered_7d = 0;
        for (windows, plan) in resets.values().zip(plans) {
            for (w, r) in windows {
                *f.wasted_total.entry(w.clone()).or_default() += r.unused;
            }
            offered_7d += windows.get("7d").map_or(0, |r| r.resets) * plan.seven_day_tokens;
        }
        f.wasted_share_7d = ratio(f.wasted_total.get("7d").copied().unwrap_or(0), offered_7d);
        f.wasted = resets.into_iter().map(|(a, w)| (a, w.into_iter().map(|(n, r)| (n, r.unused)).collect())).collect();
    }

    /// Mean time per decision of each stage, µs.
    pub fn stage_means(&self) -> Vec<(String, f64)> {
        self.stage_us.iter().map(|(s, (sum, n))| (s.clone(), sum / (*n).max(1) as f64)).collect()
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { (a as f64 / b as f64 * 10_000.0).round() / 10_000.0 }
}

/// How a row of the table shows one configuration's figures.
type Show = Box<dyn Fn(&Figures) -> String>;
/// What a bar of the comparison chart measures.
type Measure = Box<dyn Fn(&Figures) -> f64>;

/// The side-by-side table.
pub fn table(figures: &[Figures]) -> String {
    let pct = |a: u64, f: &Figures| format!("{:.1}%", 100.0 * a as f64 / f.requests.max(1) as f64);
    let rows: Vec<(&str, Show)> = vec![
        ("requests", Box::new(|f| f.requests.to_string())),
        ("served by the pool", Box::new(move |f| format!("{} ({})", f.served, pct(f.served, f)))),
        ("answered 429 (pool parked)", Box::new(move |f| format!("{} ({})", f.answered_429, pct(f.answered_429, f)))),
        ("sent to a fallback", Box::new(|f| f.fallback.to_string())),
        ("failed otherwise", Box::new(|f| f.failed.to_string())),
        ("pool first parked at", Box::new(|f| f.first_parked_at_ms.map_or("never".into(), clock_time))),
        ("mid-session switches", Box::new(|f| f.switches.to_string())),
        ("  of them A→B→A", Box::new(|f| f.ping_pongs.to_string())),
        ("cache-creation tokens", Box::new(|f| millions(f.cache_creation_tokens))),
        ("  extra from switches", Box::new(|f| millions(f.extra_cache_creation_from_switches))),
        ("wasted at 5h resets", Box::new(|f| millions(f.wasted_total.get("5h").copied().unwrap_or(0)))),
        ("wasted at 7d resets", Box::new(|f| millions(f.wasted_total.get("7d").copied().unwrap_or(0)))),
        ("  share of 7d budgets", Box::new(|f| format!("{:.1}%", f.wasted_share_7d * 100.0))),
        ("head had most headroom", Box::new(|f| format!("{:.1}%", f.head_had_most_headroom * 100.0))),
        ("plugin errors", Box::new(|f| f.plugin_errors.values().sum::<u64>().to_string())),
    ];
    let width = figures.iter().map(|f| f.config.len()).max().unwrap_or(0).max(14);
    let mut out = format!("{:<28}", "");
    for f in figures {
        let _ = write!(out, "  {:>width$}", f.config);
    }
    out.push('\n');
    for (name, value) in rows {
        let _ = write!(out, "{name:<28}");
        for f in figures {
            let _ = write!(out, "  {:>width$}", value(f));
        }
        out.push('\n');
    }
    let accounts: std::collections::BTreeSet<&String> = figures.iter().flat_map(|f| f.wasted.keys()).collect();
    for a in accounts {
        let _ = write!(out, "{:<28}", format!("  {a}: served / wasted 7d"));
        for f in figures {
            let served = f.served_by.get(a).copied().unwrap_or(0);
            let wasted = f.wasted.get(a).and_then(|w| w.get("7d")).copied().unwrap_or(0);
            let _ = write!(out, "  {:>width$}", format!("{served} / {}", millions(wasted)));
        }
        out.push('\n');
    }
    out
}

fn millions(n: u64) -> String {
    format!("{:.1}M", n as f64 / 1e6)
}

/// `d2 14:05`: day and time from the start (day 0 is a Monday).
pub fn clock_time(ms: u64) -> String {
    let minutes = ms / 60_000;
    format!("d{} {:02}:{:02}", minutes / 1440, minutes / 60 % 24, minutes % 60)
}

/// Colours of the accounts' lines and the configs' bars (Okabe–Ito: told
/// apart by people with any colour vision).
const PALETTE: [&str; 8] = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"];

/// Writes the plots to `dir`, each as SVG and as PNG: per config, each
/// account's 5h and 7d utilization over the run (a drop to zero is a reset);
/// and one chart comparing the configs' key figures. Returns the files
/// written.
pub fn plots(runs: &[super::Run], dir: &std::path::Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut drawings: Vec<(String, String)> = runs
        .iter()
        .map(|run| (format!("utilization-{}", file_safe(&run.figures.config)), utilization_svg(run)))
        .collect();
    let figures: Vec<&Figures> = runs.iter().map(|r| &r.figures).collect();
    drawings.push(("comparison".to_string(), comparison_svg(&figures)));
    let renderer = super::png::Renderer::with_system_fonts();
    if !renderer.has_fonts {
        eprintln!(
            "warning: no font found on this machine: the PNG plots have no labels (the SVGs do); install one, e.g. `apt-get install fonts-dejavu-core`"
        );
    }
    let mut written = Vec::new();
    for (name, svg) in drawings {
        let path = dir.join(format!("{name}.svg"));
        std::fs::write(&path, &svg)?;
        written.push(path);
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, renderer.png(&svg)?)?;
        written.push(path);
    }
    Ok(written)
}

fn file_safe(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Two panels (5h above, 7d below), a line per account.
fn utilization_svg(run: &super::Run) -> String {
    let (w, panel, left, top) = (960.0, 220.0, 60.0, 40.0);
    let end = run.samples.last().map_or(1, |s| s.t_ms.max(1)) as f64;
    let accounts: Vec<&String> = run.figures.wasted.keys().collect();
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"22\" font-size=\"15\">{}: utilization of each account's windows (a drop to 0 is a reset)</text>\n",
        top + 2.0 * (panel + 40.0) + 30.0,
        escape(&run.figures.config)
    );
    for (p, window) in ["5h", "7d"].iter().enumerate() {
        let y0 = top + p as f64 * (panel + 40.0);
        let _ = write!(
            svg,
            "<text x=\"8\" y=\"{}\">{window}</text>\n<rect x=\"{left}\" y=\"{y0}\" width=\"{}\" height=\"{panel}\" fill=\"none\" stroke=\"#999\"/>\n",
            y0 + panel / 2.0,
            w - left - 20.0
        );
        for (tick, label) in [(0.0, "0%"), (0.5, "50%"), (1.0, "100%")] {
            let y = y0 + panel * (1.0 - tick);
            let _ = writeln!(svg, "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{label}</text>", left - 4.0, y + 4.0);
        }
        let mut day = 0u64;
        while (day * 86_400_000) as f64 <= end {
            let x = left + (day * 86_400_000) as f64 / end * (w - left - 20.0);
            let _ = writeln!(
                svg,
                "<line x1=\"{x:.1}\" y1=\"{y0}\" x2=\"{x:.1}\" y2=\"{}\" stroke=\"#eee\"/><text x=\"{:.1}\" y=\"{}\">d{day}</text>",
                y0 + panel,
                x + 2.0,
                y0 + panel + 14.0
            );
            day += 1;
        }
        for (a, _) in accounts.iter().enumerate() {
            let points: Vec<String> = run
                .samples
                .iter()
                .filter_map(|s| {
                    let u = s.windows.get(a)?.iter().find(|(n, _)| n == window)?.1.min(1.2);
                    let x = left + s.t_ms as f64 / end * (w - left - 20.0);
                    Some(format!("{x:.1},{:.1}", y0 + panel * (1.0 - u).clamp(-0.2, 1.0)))
                })
                .collect();
            let _ = writeln!(
                svg,
                "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>",
                PALETTE[a % PALETTE.len()],
                points.join(" ")
            );
        }
    }
    let legend_y = top + 2.0 * (panel + 40.0) + 10.0;
    for (a, id) in accounts.iter().enumerate() {
        let x = left + a as f64 * 140.0;
        let _ = writeln!(
            svg,
            "<rect x=\"{x}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{legend_y}\">{}</text>",
            legend_y - 10.0,
            PALETTE[a % PALETTE.len()],
            x + 16.0,
            escape(id)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// Grouped bars: for each key figure, one bar per config, scaled to the
/// largest of them and labelled with its value.
fn comparison_svg(figures: &[&Figures]) -> String {
    let share = |a: u64, f: &Figures| 100.0 * a as f64 / f.requests.max(1) as f64;
    let metrics: [(&str, Measure, &str); 6] = [
        ("answered 429", Box::new(move |f| share(f.answered_429, f)), "%"),
        ("mid-session switches", Box::new(|f| f.switches as f64), ""),
        ("extra cache writes (M tokens)", Box::new(|f| f.extra_cache_creation_from_switches as f64 / 1e6), ""),
        ("7d quota reset unused", Box::new(|f| f.wasted_share_7d * 100.0), "%"),
        (
            "5h quota reset unused (M tokens)",
            Box::new(|f| f.wasted_total.get("5h").copied().unwrap_or(0) as f64 / 1e6),
            "",
        ),
        ("head had most headroom", Box::new(|f| f.head_had_most_headroom * 100.0), "%"),
    ];
    let bar = 16.0;
    let row = 30.0 + figures.len() as f64 * (bar + 2.0);
    let height = 60.0 + metrics.len() as f64 * row + 20.0 * figures.len() as f64;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"22\" font-size=\"15\">The configurations compared</text>\n"
    );
    for (m, (name, value, unit)) in metrics.iter().enumerate() {
        let y0 = 40.0 + m as f64 * row;
        let values: Vec<f64> = figures.iter().map(|f| value(f)).collect();
        let max = values.iter().copied().fold(0.0, f64::max).max(1e-9);
        let _ = writeln!(svg, "<text x=\"10\" y=\"{}\">{name}</text>", y0 + 12.0);
        for (i, v) in values.iter().enumerate() {
            let y = y0 + 18.0 + i as f64 * (bar + 2.0);
            let width = 560.0 * v / max;
            let _ = writeln!(
                svg,
                "<rect x=\"230\" y=\"{y}\" width=\"{width:.1}\" height=\"{bar}\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{}\">{v:.1}{unit}</text>",
                PALETTE[i % PALETTE.len()],
                236.0 + width,
                y + 12.0
            );
        }
    }
    let legend_y = 40.0 + metrics.len() as f64 * row + 10.0;
    for (i, f) in figures.iter().enumerate() {
        let y = legend_y + i as f64 * 20.0;
        let _ = writeln!(
            svg,
            "<rect x=\"10\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"28\" y=\"{y}\">{}</text>",
            y - 10.0,
            PALETTE[i % PALETTE.len()],
            escape(&f.config)
        );
    }
    svg.push_str("</svg>\n");
    svg
}
