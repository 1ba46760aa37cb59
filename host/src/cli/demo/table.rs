//! What the demo shows: the gateway's own view of its accounts — the quota it
//! learned from the upstream's headers, cooldowns, model gates, in-flight
//! counts — and its latest decisions, read in-process from the running gateway
//! (the same data `/status` and `/admin/decisions` serve).
//!
//! On a terminal a live area under the intro is redrawn in place; otherwise (a
//! pipe, a CI log) every decision becomes one appended line and the accounts
//! are listed every few seconds, so the output reads as a log.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;

use super::traffic::Counts;
use crate::clock::now_ms;
use crate::gateway::Gateway;
use crate::gateway::request::record::{Ending, RequestRecord};
use crate::learned::accounts::AccountStatus;

/// Decisions the live table lists.
const RECENT: usize = 8;
/// How often account rows are appended when not on a terminal, ms.
const PLAIN_ACCOUNTS_EVERY_MS: u64 = 2_000;

/// Renders the gateway's state, frame after frame.
pub struct View {
    gateway: Arc<Gateway>,
    start_ms: u64,
    /// The first line of every frame.
    title: String,
    /// Model family of each per-model bucket (`7d_oi` → `fable`), for labels.
    families: BTreeMap<String, String>,
    /// Decision ids already printed as lines.
    printed: BTreeSet<u64>,
    last_accounts_ms: u64,
    decisions_since_accounts: bool,
    /// Cooldown reasons and gates each account showed, for the summary.
    seen: BTreeMap<String, BTreeSet<String>>,
}

impl View {
    /// A view of `gateway`; times are shown relative to `start_ms`, and
    /// `families` labels per-model buckets by window name.
    pub fn new(gateway: Arc<Gateway>, start_ms: u64, title: String, families: BTreeMap<String, String>) -> View {
        View {
            gateway,
            start_ms,
            title,
            families,
            printed: BTreeSet::new(),
            last_accounts_ms: 0,
            decisions_since_accounts: false,
            seen: BTreeMap::new(),
        }
    }

    fn statuses(&mut self, now: u64) -> Vec<AccountStatus> {
        let g = self.gateway.generation();
        let all: Vec<AccountStatus> = g.accounts.iter().map(|a| a.state.status(&a.config, now)).collect();
        for s in &all {
            let seen = self.seen.entry(s.alias.clone()).or_default();
            if let Some(c) = &s.cooldown {
                seen.insert(c.reason.to_string());
            }
            for gate in &s.model_gates {
                seen.insert(format!("{} gated", gate.family));
            }
        }
        all
    }

    fn since(&self, at_ms: u64) -> String {
        format!("+{:.1}s", at_ms.saturating_sub(self.start_ms) as f64 / 1000.0)
    }

    /// The live area: accounts (per-model buckets as sub-rows), recent
    /// decisions, traffic totals. Rows stay within about 80 columns.
    pub fn frame(&mut self, counts: Option<&Counts>) -> Vec<String> {
        let now = now_ms();
        let accounts = self.statuses(now);
        let mut out = vec![format!("{} · {}", self.title, self.since(now)), String::new()];
        out.push(format!("{:<8}{:<18}{:<18}{:<7}{:<7}{}", "ACCOUNT", "5H", "7D", "FLIGHT", "SERVED", "COOLDOWN"));
        for s in &accounts {
            out.push(account_row(s, now));
            out.extend(bucket_rows(s, now, &self.families));
        }
        out.push(String::new());
        out.push(format!(
            "{:<8}{:<10}{:<19}{:<9}{:<17}{:<7}{}",
            "TIME", "SESSION", "MODEL", "ACCOUNT", "REASON", "STATUS", "ATTEMPTS"
        ));
        // Newest first by arrival: records are logged as requests finish, and a
        // long stream finishes after shorter requests that came later.
        let mut recent = self.gateway.decisions.latest(RECENT);
        recent.sort_by(|a, b| b.at_ms.cmp(&a.at_ms).then(b.id.cmp(&a.id)));
        for r in &recent {
            out.push(decision_row(r, &self.since(r.at_ms)));
        }
        out.extend((recent.len()..RECENT).map(|_| String::new()));
        out.push(String::new());
        if let Some(c) = counts {
            out.push(totals(c));
        }
        out.push("Bars: quota the gateway learned from the upstream's headers. Ctrl-C stops.".into());
        out
    }

    /// Appended lines: every decision not printed yet, and the accounts every
    /// few seconds while decisions keep coming.
    pub fn lines(&mut self) -> String {
        let now = now_ms();
        let mut out = String::new();
        let window = self.gateway.decisions.latest(200);
        if let Some(oldest) = window.iter().map(|r| r.id).min() {
            self.printed.retain(|id| *id >= oldest);
        }
        for r in window.iter().rev() {
            if self.printed.insert(r.id) {
                self.decisions_since_accounts = true;
                let _ = writeln!(out, "{} decision {}", self.since(now), decision_fields(r));
            }
        }
        let accounts = self.statuses(now);
        if self.decisions_since_accounts && now.saturating_sub(self.last_accounts_ms) >= PLAIN_ACCOUNTS_EVERY_MS {
            self.last_accounts_ms = now;
            self.decisions_since_accounts = false;
            for s in &accounts {
                let mut row = account_row(s, now);
                for b in buckets(s, now, &self.families) {
                    let _ = write!(row, " · {} {}", b.label, b.bar);
                    if let Some(g) = b.gated {
                        let _ = write!(row, " {g}");
                    }
                }
                let _ = writeln!(out, "{} account  {}", self.since(now), row.trim_end());
            }
        }
        out
    }

    /// The closing lines: what the traffic did and what the accounts went through.
    pub fn summary(&mut self, counts: Option<&Counts>) -> String {
        let now = now_ms();
        let accounts = self.statuses(now);
        let mut out = String::new();
        let _ = writeln!(out, "\ndemo over after {:.1}s", now.saturating_sub(self.start_ms) as f64 / 1000.0);
        if let Some(c) = counts {
            let _ = writeln!(out, "{}", totals(c));
            let per = |m: &BTreeMap<String, u64>| {
                let each = accounts.iter().map(|s| format!("{}={}", s.alias, m.get(&s.alias).copied().unwrap_or(0)));
                each.collect::<Vec<_>>().join(" ")
            };
            let _ = writeln!(out, "served by account: {}", per(&c.served));
            for (family, by) in &c.by_family {
                let _ = writeln!(out, "{family} served by account: {}", per(by));
            }
            let (served, put) = c.sessions_staying_put();
            let _ = writeln!(
                out,
                "sessions that stayed on one account: {put} of {served} (affinity keeps a session's prompt cache warm; \
                 a session moves when its account cools or fills up)"
            );
        }
        let seen: Vec<String> = self
            .seen
            .iter()
            .filter(|(_, r)| !r.is_empty())
            .map(|(a, r)| format!("{a} ({})", r.iter().cloned().collect::<Vec<_>>().join(", ")))
            .collect();
        let _ = writeln!(out, "cooldowns seen: {}", if seen.is_empty() { "none".to_string() } else { seen.join(" ") });
        out
    }
}

/// Redraws a block of lines in place under whatever was printed before it:
/// back up over the previous block, rewrite each line, clear what is left.
/// Auto-wrap is off while it is live, so a line wider than the terminal is cut
/// at the edge instead of wrapping and throwing the count of lines off.
#[derive(Default)]
pub struct Screen {
    height: usize,
}

impl Screen {
    /// The escape sequence that replaces the previous block with `lines`.
    pub fn draw(&mut self, lines: &[String]) -> String {
        let mut out = String::from("\x1b[?7l\x1b[?25l");
        if self.height > 0 {
            let _ = write!(out, "\x1b[{}A\r", self.height);
        }
        for l in lines {
            let _ = writeln!(out, "{l}\x1b[K");
        }
        out.push_str("\x1b[J");
        self.height = lines.len();
        out
    }
}

impl Drop for Screen {
    /// Gives the terminal back as it was: wrapping on, cursor shown.
    fn drop(&mut self) {
        use std::io::Write;
        print!("\x1b[?7h\x1b[?25h");
        let _ = std::io::stdout().flush();
    }
}

fn totals(c: &Counts) -> String {
    let statuses: Vec<String> = c.by_status.iter().map(|(s, n)| format!("{n} × {s}")).collect();
    format!(
        "requests {} ({}) · sessions {} · tool calls {} · transport errors {}",
        c.requests,
        if statuses.is_empty() { "none yet".to_string() } else { statuses.join(", ") },
        c.sessions,
        c.tool_calls,
        c.transport_errors
    )
}

/// `[#####-----]  52%`, or a blank bar when nothing was reported yet.
fn bar(utilization: Option<f64>) -> String {
    match utilization {
        None => format!("[{:10}]    ?", ""),
        Some(u) => {
            let filled = ((u.clamp(0.0, 1.0) * 10.0).round() as usize).min(10);
            format!("[{}{}] {:>3}%", "#".repeat(filled), "-".repeat(10 - filled), (u * 100.0).round() as u64)
        }
    }
}

/// A duration left, short: `8.2s`, `9m58s`.
fn left(ms: u64) -> String {
    if ms < 60_000 { format!("{:.1}s", ms as f64 / 1000.0) } else { format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60) }
}

/// The utilization of window `name`; a window past its reset reads as fresh,
/// as the chain sees it.
fn used(s: &AccountStatus, name: &str, now: u64) -> Option<f64> {
    let w = s.windows.iter().find(|w| w.name == name)?;
    Some(if w.resets_at_ms.is_some_and(|r| r <= now) { 0.0 } else { w.utilization })
}

fn account_row(s: &AccountStatus, now: u64) -> String {
    let cooling = match &s.cooldown {
        Some(c) => format!("{} {}", c.reason, left(c.remaining_ms)),
        None => "-".to_string(),
    };
    let in_flight = match s.max_in_flight {
        Some(m) => format!("{}/{m}", s.in_flight),
        None => s.in_flight.to_string(),
    };
    format!(
        "{:<8}{:<18}{:<18}{:<7}{:<7}{}",
        s.alias,
        bar(used(s, "5h", now)),
        bar(used(s, "7d", now)),
        in_flight,
        s.successes,
        cooling
    )
}

/// A per-model bucket the account reported: its label, bar, and the gate on
/// its family if there is one.
struct BucketView {
    label: String,
    bar: String,
    gated: Option<String>,
}

fn buckets(s: &AccountStatus, now: u64, families: &BTreeMap<String, String>) -> Vec<BucketView> {
    s.windows
        .iter()
        .filter(|w| w.name.starts_with("7d_"))
        .map(|w| {
            let family = families.get(&w.name);
            let gate = s.model_gates.iter().find(|g| Some(&g.family) == family && g.until_ms > now);
            BucketView {
                label: family.map_or(w.name.clone(), |f| format!("{} ({f})", w.name)),
                bar: bar(used(s, &w.name, now)),
                gated: gate.map(|g| format!("{} gated {}", g.family, left(g.until_ms - now))),
            }
        })
        .collect()
}

/// Buckets as sub-rows of the table: the bar under 7D, the gate under COOLDOWN.
fn bucket_rows(s: &AccountStatus, now: u64, families: &BTreeMap<String, String>) -> Vec<String> {
    let rows = buckets(s, now, families).into_iter();
    rows.map(|b| format!("  {:<24}{:<18}{:<14}{}", b.label, b.bar, "", b.gated.unwrap_or_default())).collect()
}

/// The accounts a request went through: `alpha→bravo`.
fn path(r: &RequestRecord) -> String {
    r.attempts.iter().filter_map(|a| a.account.as_deref()).collect::<Vec<_>>().join("→")
}

fn short_session(r: &RequestRecord) -> &str {
    r.session.as_deref().map_or("-", |s| &s[..s.len().min(8)])
}

fn status_text(r: &RequestRecord) -> String {
    if r.outcome == Ending::Complete { r.status.to_string() } else { format!("{} {}", r.status, r.outcome.as_str()) }
}

fn reason(r: &RequestRecord) -> &str {
    if r.reason.is_empty() { "-" } else { &r.reason }
}

fn decision_row(r: &RequestRecord, at: &str) -> String {
    let attempts =
        if r.attempts.len() > 1 { format!("{} ({})", r.attempts.len(), path(r)) } else { r.attempts.len().to_string() };
    format!(
        "{:<8}{:<10}{:<19}{:<9}{:<17}{:<7}{}",
        at,
        short_session(r),
        r.model,
        r.account.as_deref().unwrap_or("-"),
        reason(r),
        status_text(r),
        attempts
    )
}

fn decision_fields(r: &RequestRecord) -> String {
    format!(
        "session={} model={} account={} reason={} status={} attempts={} path={}",
        short_session(r),
        r.model,
        r.account.as_deref().unwrap_or("-"),
        reason(r),
        status_text(r).replace(' ', "/"),
        r.attempts.len(),
        if r.attempts.is_empty() { "-".to_string() } else { path(r) }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_fill_by_tenths_and_show_overflow_as_a_percentage() {
        assert_eq!(bar(Some(0.52)), "[#####-----]  52%");
        assert_eq!(bar(Some(1.02)), "[##########] 102%");
        assert_eq!(bar(Some(0.0)), "[----------]   0%");
        assert_eq!(bar(None), "[          ]    ?");
        assert_eq!(left(8_240), "8.2s");
        assert_eq!(left(598_000), "9m58s");
    }

    #[test]
    fn the_screen_backs_up_over_the_block_it_drew_last() {
        let mut s = Screen::default();
        let first = s.draw(&["a".into(), "b".into()]);
        assert!(!first.contains("\x1b[2A"), "nothing to back up over yet");
        let second = s.draw(&["c".into()]);
        assert!(second.contains("\x1b[2A\rc\x1b[K\n\x1b[J"), "{second:?}");
        // Its drop would write terminal escapes into the test's output.
        std::mem::forget(s);
    }
}
