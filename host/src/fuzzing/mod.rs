//! The fuzzing entry points: one function per fuzz target, each taking the
//! fuzzer's bytes and driving the code that reads untrusted input — what an
//! upstream, a client, a plugin, an operator's file or another replica hands
//! the gateway.
//!
//! They live here, in the crate that owns the code, so that the one body of
//! each target serves twice: the cargo-fuzz binaries (`fuzz/fuzz_targets/`,
//! coverage-guided, nightly-free with `--sanitizer none`) call it, and the
//! stable corpus test (`host/tests/all/fuzz_corpus.rs`) runs it over every
//! corpus file and a fixed number of seeded mutations on every CI run. A body
//! panics when the code under it panics *or* when one of its invariants
//! breaks (a translation that writes something that is not JSON, a validator
//! that accepts what it must refuse); either is a finding. Layer: above
//! everything it drives, below nothing (nothing in the gateway imports it).
//!
//! Hidden from the docs: these are not an API, only a harness that must be
//! compiled with the crate to reach its `pub(crate)` parts (the replica
//! merge).

mod client;
mod openai;
mod state;
mod upstream;

/// The byte that cuts a stream target's input into the chunks it arrives in:
/// never part of UTF-8, so a corpus file stays readable text and the fuzzer
/// moves a cut by inserting or deleting one byte.
pub const CUT: u8 = 0xFF;

/// The clock every target reads: a fixed instant (2025-10-09), so that a
/// corpus file means the same on every run.
pub const NOW_MS: u64 = 1_760_000_000_000;

/// A fuzz target: its name (its cargo-fuzz binary and its corpus directory,
/// `fuzz/corpus/<name>/`) and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, in the order the corpus test runs them.
pub const TARGETS: &[Target] = &[
    ("quota_headers", upstream::quota_headers),
    ("sse_relay", upstream::sse_relay),
    ("body_facts", client::body_facts),
    ("config", state::config),
    ("decision", client::decision),
    ("openai_request", openai::request),
    ("openai_answer", openai::answer),
    ("openai_stream", openai::stream),
    ("credentials", state::credentials),
    ("replica_merge", state::replica_merge),
];

/// The body of target `name`.
pub fn target(name: &str) -> Option<fn(&[u8])> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

/// `data` as the chunks a stream arrives in (cut at every [`CUT`]).
pub fn chunks(data: &[u8]) -> Vec<&[u8]> {
    data.split(|&b| b == CUT).collect()
}
