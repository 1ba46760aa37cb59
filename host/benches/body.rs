//! What reading a request body costs the gateway: `body_facts` — the UTF-8
//! check of the whole body and the JSON parse that reads `model`, `stream` and
//! the session — on bodies the size Claude Code sends (a first turn ~10 KB, a
//! working session ~90 KB, a turn with images ~2 MB), against the UTF-8 scan
//! alone, measured in the same run. It runs once per request, before any
//! attempt; nothing of it runs per streamed chunk.
//!
//! `cargo bench -p poolgate --bench body` prints criterion's groups, then one
//! line per size: µs per body, MB/s, and the share of the UTF-8 scan (the
//! figures in docs/benchmarks.md, "Reading a request body").

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use poolgate::gateway::request::read::body_facts;

/// A Messages body of about `bytes`, shaped like Claude Code's: a system
/// array, tools, and a conversation of text turns with some non-ASCII text.
fn body(bytes: usize) -> Vec<u8> {
    let turn = |i: usize| {
        serde_json::json!({"role": if i.is_multiple_of(2) { "user" } else { "assistant" }, "content": [
            {"type": "text", "text": format!("turn {i}: fn main() {{ println!(\"héllo wörld {i}\"); }} <system-reminder>keep going</system-reminder> {}", "lorem ipsum dolor sit amet ".repeat(8))}
        ]})
    };
    let mut messages = Vec::new();
    let mut v = serde_json::json!({});
    while serde_json::to_vec(&v).unwrap().len() < bytes {
        messages.push(turn(messages.len()));
        v = serde_json::json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 32000,
            "stream": true,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332"}, {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "Bash", "description": "Run a command", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}],
            "metadata": {"user_id": "{\"device_id\":\"d\",\"account_uuid\":\"\",\"session_id\":\"s-1\"}"},
            "messages": messages,
        });
    }
    serde_json::to_vec(&v).unwrap()
}

const SIZES: [(&str, usize); 3] = [("10KB", 10 << 10), ("90KB", 90 << 10), ("2MB", 2 << 20)];

fn per_call(f: impl Fn()) -> Duration {
    let runs = 200;
    let started = poolgate::clock::machine_instant();
    for _ in 0..runs {
        f();
    }
    started.elapsed() / runs
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("body");
    for (name, size) in SIZES {
        let b = body(size);
        group.throughput(Throughput::Bytes(b.len() as u64));
        group.bench_with_input(BenchmarkId::new("body_facts", name), &b, |bench, b| {
            bench.iter(|| body_facts(black_box(b)).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("utf8_scan", name), &b, |bench, b| {
            bench.iter(|| std::str::from_utf8(black_box(b)).unwrap().len())
        });
    }
    group.finish();
    println!("\nsize   bytes     body_facts µs  MB/s   utf8 scan µs  share");
    for (name, size) in SIZES {
        let b = body(size);
        let facts = per_call(|| {
            body_facts(black_box(&b)).unwrap();
        });
        let utf8 = per_call(|| {
            black_box(std::str::from_utf8(black_box(&b)).unwrap());
        });
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "{name:<6} {:<9} {:>13.1}  {:>5.0}  {:>12.2}  {:>4.1}%",
            b.len(),
            us(facts),
            b.len() as f64 / us(facts),
            us(utf8),
            100.0 * us(utf8) / us(facts)
        );
    }
}
