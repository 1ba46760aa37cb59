//! The verdict: every outcome read against the injector's timeline, and the
//! one table a chaos run prints.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::faults::Timeline;
use crate::workload::{Class, Kind, Outcome};

/// What one replica looked like over the run.
#[derive(Clone, Debug, Default)]
pub struct Replica {
    /// Its peak resident memory (`VmHWM`), MiB.
    pub peak_rss_mib: f64,
    /// Resident memory at the end, MiB.
    pub rss_end_mib: f64,
    /// Open file descriptors after the warm-up and at the end.
    pub fds: (usize, usize),
    /// Panics its log reported.
    pub panics: u64,
    /// Whether it still ran at the end.
    pub alive: bool,
    /// Reloads it applied and refused (`poolgate_reloads_total`).
    pub reloads: (u64, u64),
    /// Reloads signalled to it: valid, and to be refused.
    pub signalled: (u64, u64),
}

/// The figures of a chaos run.
#[derive(Debug, Default)]
pub struct Report {
    /// How long the workload ran.
    pub duration: Duration,
    /// Requests sent, by kind: (sent, served).
    pub by_kind: BTreeMap<Kind, (u64, u64)>,
    /// Requests sent.
    pub sent: u64,
    /// Whole, well-formed answers.
    pub served: u64,
    /// Of them, answered by the fallback.
    pub by_fallback: u64,
    /// Streams ended by a clean error event after a cut upstream.
    pub clean_cuts: u64,
    /// JSON answers broken off after their head.
    pub json_cuts: u64,
    /// 429s answered while every account was parked.
    pub parked_429s: u64,
    /// Other failures while nothing could serve (the pool parked and the
    /// fallback down, or a request the fallback cannot take).
    pub failed_none_could: u64,
    /// Failures while an account or the fallback could serve: must be 0.
    pub failed_could: Vec<String>,
    /// Answers whose shape broke: must be 0.
    pub broken: Vec<String>,
    /// Answers from the fallback while an account could serve: must be 0.
    pub fallback_while_could: u64,
    /// Served requests' time to the last byte, ms: p50, p99, max.
    pub latency_ms: (f64, f64, f64),
    /// The slowest served request: what it asked and which account answered.
    pub slowest: String,
    /// Each replica.
    pub replicas: Vec<Replica>,
    /// Reloads that did not do what they must: must be none.
    pub reload_mismatches: Vec<String>,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
}

impl Report {
    /// Reads `outcomes` against `timeline`.
    pub fn new(outcomes: &[Outcome], timeline: &Timeline, duration: Duration) -> Report {
        let mut r = Report {
            duration,
            faults: timeline.faults.clone(),
            reload_mismatches: timeline.reload_mismatches.clone(),
            ..Report::default()
        };
        let mut served_ms = Vec::new();
        let mut slowest = (0.0, String::new());
        for o in outcomes {
            r.sent += 1;
            let entry = r.by_kind.entry(o.kind).or_default();
            entry.0 += 1;
            let parked = timeline.parked(o.start, o.end);
            // The fallback takes what it can translate: not a token count.
            let fallback_could = !timeline.fallback_failed(o.start, o.end) && o.kind != Kind::CountTokens;
            match &o.class {
                Class::Served { fallback } => {
                    entry.1 += 1;
                    r.served += 1;
                    r.by_fallback += u64::from(*fallback);
                    r.fallback_while_could += u64::from(*fallback && !parked);
                    let ms = (o.end - o.start).as_secs_f64() * 1e3;
                    if ms > slowest.0 {
                        slowest = (ms, format!("{:?} answered by `{}` in {ms:.0} ms", o.kind, o.account));
                    }
                    served_ms.push(ms);
                }
                Class::CleanCut => r.clean_cuts += 1,
                Class::JsonCut => r.json_cuts += 1,
                Class::Broken(why) => r.broken.push(format!("{:?}: {why}", o.kind)),
                Class::TooMany if parked => r.parked_429s += 1,
                Class::Failed(_) if parked && !fallback_could => r.failed_none_could += 1,
                Class::TooMany => r.failed_could.push(format!("{:?}: 429", o.kind)),
                Class::Failed(why) => r.failed_could.push(format!("{:?}: {why}", o.kind)),
            }
        }
        served_ms.sort_by(f64::total_cmp);
        let at = |q: f64| served_ms.get(((served_ms.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
        r.latency_ms = (at(0.5), at(0.99), served_ms.last().copied().unwrap_or(0.0));
        r.slowest = slowest.1;
        r
    }

    /// What the run must show; each broken promise, named.
    pub fn verdict(&self) -> Vec<String> {
        let mut bad = Vec::new();
        if self.served == 0 {
            bad.push("nothing was served".to_string());
        }
        if !self.failed_could.is_empty() {
            bad.push(format!("{} failed while an account or the fallback could serve", self.failed_could.len()));
        }
        if !self.broken.is_empty() {
            bad.push(format!("{} answers broke their grammar", self.broken.len()));
        }
        if !self.reload_mismatches.is_empty() {
            bad.push(format!("{} reloads did not do what they must", self.reload_mismatches.len()));
        }
        if self.fallback_while_could > 0 {
            bad.push(format!("{} answered by the fallback while an account could serve", self.fallback_while_could));
        }
        for (i, rep) in self.replicas.iter().enumerate() {
            if rep.panics > 0 {
                bad.push(format!("replica {i} panicked {} times", rep.panics));
            }
            if !rep.alive {
                bad.push(format!("replica {i} died"));
            }
        }
        bad
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let row = |f: &mut fmt::Formatter<'_>, name: &str, value: String| writeln!(f, "  {name:<58} {value:>14}");
        writeln!(f, "chaos run: {:.0} s of mixed load", self.duration.as_secs_f64())?;
        row(f, "requests sent", self.sent.to_string())?;
        row(f, "served whole", self.served.to_string())?;
        row(f, "  of them by the fallback", self.by_fallback.to_string())?;
        row(f, "FAILED while an account or the fallback could serve", self.failed_could.len().to_string())?;
        row(f, "local 429s while every account was parked", self.parked_429s.to_string())?;
        row(f, "other failures while nothing could serve", self.failed_none_could.to_string())?;
        row(f, "clean error events after a mid-stream cut", self.clean_cuts.to_string())?;
        row(f, "JSON answers cut after their first byte", self.json_cuts.to_string())?;
        row(f, "BROKEN streams or answers (grammar)", self.broken.len().to_string())?;
        row(f, "fallback answers while an account could serve", self.fallback_while_could.to_string())?;
        let (p50, p99, max) = self.latency_ms;
        row(f, "served latency p50 / p99 / max, ms", format!("{p50:.0} / {p99:.0} / {max:.0}"))?;
        writeln!(f, "    the slowest: {}", self.slowest)?;
        for (i, r) in self.replicas.iter().enumerate() {
            row(
                f,
                &format!("replica {i}: peak RSS / at the end, MiB"),
                format!("{:.1} / {:.1}", r.peak_rss_mib, r.rss_end_mib),
            )?;
            row(f, &format!("replica {i}: open fds after warm-up / at the end"), format!("{} / {}", r.fds.0, r.fds.1))?;
            let (ok, refused, valid, invalid) = (r.reloads.0, r.reloads.1, r.signalled.0, r.signalled.1);
            row(
                f,
                &format!("replica {i}: reloads applied / refused (written valid / invalid)"),
                format!("{ok} / {refused} ({valid} / {invalid})"),
            )?;
            row(f, &format!("replica {i}: PANICS / alive at the end"), format!("{} / {}", r.panics, r.alive))?;
        }
        writeln!(f, "  requests by kind (sent / served whole):")?;
        for (k, (sent, served)) in &self.by_kind {
            row(f, &format!("    {k:?}"), format!("{sent} / {served}"))?;
        }
        writeln!(f, "  faults injected:")?;
        for (k, n) in &self.faults {
            row(f, &format!("    {k}"), n.to_string())?;
        }
        row(
            f,
            "reloads that did not apply a valid chain or keep the last good",
            self.reload_mismatches.len().to_string(),
        )?;
        let lists = [
            ("failed while one could serve", &self.failed_could),
            ("broken", &self.broken),
            ("reload", &self.reload_mismatches),
        ];
        for (what, list) in lists {
            for line in list.iter().take(10) {
                writeln!(f, "  {what}: {line}")?;
            }
        }
        let verdict = self.verdict();
        match verdict.is_empty() {
            true => writeln!(f, "verdict: held"),
            false => writeln!(f, "verdict: BROKEN — {}", verdict.join("; ")),
        }
    }
}
