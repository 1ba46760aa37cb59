//! Workloads of a typical shape, made from a seed: `--generate team`.
//!
//! A team of `people` working `days` days (day 0 a Monday). On a workday
//! each person starts between 08:30 and 10:00 (so new sessions burst at the
//! start of the day), works three to six Claude Code sessions with breaks
//! between them and a lunch break, and now and then looks at something on
//! a weekend. A session is a series of prompts; each prompt runs an agent
//! loop of 2–20 requests a few seconds apart (the model calling tools), then
//! the person thinks for half a minute to five minutes. The context grows
//! with every request — read from the cache, the new part written to it —
//! and is compacted when it passes 160k tokens. Sessions use Sonnet, one in
//! four Opus; about one request in sixteen starts a subagent (its own session, Haiku
//! or Sonnet) of a few quick requests.
//!
//! The same arguments and seed give the same workload, byte for byte.

use super::trace::Entry;

/// A small deterministic generator (SplitMix64 over a counter).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        crate::random::splitmix(self.0)
    }

    /// A value in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    /// True with probability `p`.
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

const SECOND: u64 = 1000;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;
/// Claude Code's system prompt and tools: where every context starts.
const BASE_CONTEXT: u64 = 18_000;
const COMPACT_AT: u64 = 160_000;
const SONNET: &str = "claude-sonnet-4-5";
const OPUS: &str = "claude-opus-4-1";
const HAIKU: &str = "claude-haiku-4-5";

/// A team's workload: see the module docs.
pub fn team(people: u32, days: u32, seed: u64) -> Vec<Entry> {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut out = Vec::new();
    for person in 0..people {
        let name = format!("dev{:02}", person + 1);
        for day in 0..days {
            let weekend = day % 7 >= 5;
            if weekend && !rng.chance(0.15) {
                continue;
            }
            let mut t = u64::from(day) * DAY + 8 * HOUR + 30 * MINUTE + rng.range(0, 90) * MINUTE;
            let sessions = if weekend { 1 } else { rng.range(3, 6) };
            for s in 0..sessions {
                let id = format!("{name}-d{day}-s{s}");
                let model = if rng.chance(0.25) { OPUS } else { SONNET };
                let prompts = if weekend { rng.range(2, 5) } else { rng.range(5, 20) };
                t = session(&mut rng, &mut out, Person { name: &name, session: &id, model }, t, prompts);
                t += if s == 1 { rng.range(45, 60) * MINUTE } else { rng.range(5, 40) * MINUTE };
            }
        }
    }
    // Stable: entries sent at the same millisecond keep the order they were made in.
    out.sort_by_key(|e| e.t_ms);
    out
}

/// Who sends a session's requests.
#[derive(Clone, Copy)]
struct Person<'a> {
    name: &'a str,
    session: &'a str,
    model: &'a str,
}

/// One session of `prompts` prompts from `t`; returns when it ends.
fn session(rng: &mut Rng, out: &mut Vec<Entry>, who: Person<'_>, mut t: u64, prompts: u64) -> u64 {
    let mut context = BASE_CONTEXT;
    let mut subagents = 0;
    for _ in 0..prompts {
        for _ in 0..rng.range(2, 20) {
            let (entry, grown) = request(rng, who, t, context);
            context = grown;
            t += model_time(entry.output_tokens) + rng.range(1, 10) * SECOND;
            out.push(entry);
            if rng.chance(0.06) {
                subagents += 1;
                let model = if rng.chance(0.5) { HAIKU } else { SONNET };
                let id = format!("{}-sub{subagents}", who.session);
                let sub = Person { session: &id, model, ..who };
                subagent(rng, out, sub, t);
            }
        }
        t += rng.range(30, 300) * SECOND;
    }
    t
}

/// A subagent's few quick requests, from `t`.
fn subagent(rng: &mut Rng, out: &mut Vec<Entry>, who: Person<'_>, mut t: u64) {
    let mut context = BASE_CONTEXT / 2;
    for _ in 0..rng.range(3, 12) {
        let (entry, grown) = request(rng, who, t, context);
        context = grown;
        t += model_time(entry.output_tokens) + rng.range(1, 5) * SECOND;
        out.push(entry);
    }
}

/// One request on a context of `context` tokens, and the context after it.
fn request(rng: &mut Rng, who: Person<'_>, t: u64, context: u64) -> (Entry, u64) {
    let (read, written) = if context > COMPACT_AT {
        // Compaction: a summary replaces the conversation, written anew.
        (BASE_CONTEXT, rng.range(4_000, 12_000))
    } else {
        (context, rng.range(300, 6_000))
    };
    let output = rng.range(50, 1_500);
    let entry = Entry {
        t_ms: t,
        session: who.session.to_string(),
        client: Some(who.name.to_string()),
        model: who.model.to_string(),
        input_tokens: rng.range(1, 60),
        output_tokens: output,
        cache_read_tokens: read,
        cache_creation_tokens: written,
        stream: true,
    };
    (entry, read + written + output)
}

/// How long the model takes to write `output` tokens (~60 a second).
fn model_time(output: u64) -> u64 {
    SECOND + output * SECOND / 60
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_team_week_has_the_shape_the_docs_describe() {
        let w = team(10, 7, 1);
        assert_eq!(w, team(10, 7, 1), "the same seed, the same workload");
        assert_ne!(w, team(10, 7, 2));
        assert!(w.windows(2).all(|p| p[0].t_ms <= p[1].t_ms));
        assert!((20_000..80_000).contains(&w.len()), "{} requests", w.len());
        let clients: std::collections::BTreeSet<_> = w.iter().filter_map(|e| e.client.clone()).collect();
        assert_eq!(clients.len(), 10);
        let starts_at = |e: &Entry| (e.t_ms % DAY) / HOUR;
        assert!(w.iter().all(|e| starts_at(e) >= 8), "nobody starts before 08:30");
        let models: std::collections::BTreeSet<_> = w.iter().map(|e| e.model.as_str()).collect();
        assert_eq!(models, [OPUS, HAIKU, SONNET].into_iter().collect());
        assert!(w.iter().any(|e| e.session.contains("-sub")), "subagents");
    }
}
