//! Every fuzz target, on every CI run, without nightly or libFuzzer: its
//! body (`poolgate::fuzzing`, the very function the cargo-fuzz binary
//! calls) over every file of its corpus (`fuzz/corpus/<target>/`, kept in the
//! repository and grown by the long runs of `bench/fuzz.sh`), then over
//! [`MUTANTS`] inputs made from that corpus by seeded mutations — byte flips,
//! the stream targets' cut byte, truncations, insertions, deletions and
//! splices of two entries — so that each run is the same run, and a failure
//! names its seed and saves the input to replay. A body fails by panicking:
//! on a crash of the code under it, or on a broken invariant.
//!
//! See docs/fuzzing.md.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use poolgate::fuzzing::{CUT, TARGETS, target};

/// Mutated inputs per target: a few thousand, which all ten targets run in
/// a few seconds in the debug test binary.
const MUTANTS: usize = 5_000;

/// The seed of every target's mutations (each target's own stream of them
/// starts from it and the target's name).
const SEED: u64 = 0x706f_6f6c_6761_7465;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// The corpus of `name`, file name and contents, in file-name order.
fn corpus(name: &str) -> Vec<(String, Vec<u8>)> {
    let dir = fuzz_dir().join("corpus").join(name);
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).unwrap()))
        .collect();
    files.sort();
    files
}

/// splitmix64: a small, well-mixed generator, so the mutations are the same
/// on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let out = poolgate::random::splitmix(self.0);
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        out
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }
}

/// Bytes a mutation likes to write: the stream targets' cut, line and
/// event ends, JSON and TOML punctuation, and the edges of a byte.
const INTERESTING: &[u8] = &[CUT, b'\n', b'\r', b'"', b'{', b'}', b'[', b']', b':', b',', b'=', b'\\', 0, 0x7f, 0x80];

/// One mutation of `input`; `other` is another corpus entry to splice in.
fn mutate(rng: &mut Rng, input: &mut Vec<u8>, other: &[u8]) {
    let at = rng.below(input.len() + 1);
    let last = input.len().saturating_sub(1);
    match rng.below(7) {
        0 if !input.is_empty() => input[at.min(last)] ^= 1 << rng.below(8),
        1 if !input.is_empty() => input[at.min(last)] = INTERESTING[rng.below(INTERESTING.len())],
        2 => input.truncate(at),
        3 => input.insert(at, INTERESTING[rng.below(INTERESTING.len())]),
        4 => {
            let end = (at + 1 + rng.below(16)).min(input.len());
            input.drain(at.min(end)..end);
        }
        5 => {
            let from = rng.below(other.len() + 1);
            let tail = &other[from..(from + rng.below(64)).min(other.len())];
            input.splice(at..at, tail.iter().copied());
        }
        _ => {
            let end = (at + rng.below(32)).min(input.len());
            let copy = input[at.min(end)..end].to_vec();
            input.splice(at..at, copy);
        }
    }
}

/// Runs `body` on `input`; a panic fails the test naming `what` and where
/// the input was saved (`cargo fuzz run <target> <file>` replays it).
fn run(name: &str, body: fn(&[u8]), input: &[u8], what: &str) {
    if catch_unwind(AssertUnwindSafe(|| body(input))).is_err() {
        let saved = std::env::temp_dir().join(format!("poolgate-fuzz-{name}-{}", std::process::id()));
        std::fs::write(&saved, input).unwrap();
        panic!("fuzz target {name} failed on {what}; the input is in {}", saved.display());
    }
}

/// The corpus of `name`, then its mutants.
fn check(name: &str) {
    let body = target(name).unwrap_or_else(|| panic!("no fuzz target {name}"));
    let corpus = corpus(name);
    assert!(!corpus.is_empty(), "fuzz/corpus/{name}/ is empty");
    for (file, input) in &corpus {
        run(name, body, input, &format!("fuzz/corpus/{name}/{file}"));
    }
    let mut rng = Rng(name.bytes().fold(SEED, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)));
    for i in 0..MUTANTS {
        let mut input = corpus[rng.below(corpus.len())].1.clone();
        let other = &corpus[rng.below(corpus.len())].1;
        for _ in 0..1 + rng.below(4) {
            mutate(&mut rng, &mut input, other);
        }
        run(name, body, &input, &format!("mutant {i}"));
    }
}

/// One test per target, so that nextest runs them side by side and names
/// the one that failed.
macro_rules! targets {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                check(stringify!($name));
            }
        )*

        /// The targets tested here are all there are, each with a cargo-fuzz
        /// binary: a target added to `poolgate::fuzzing` and not here (or
        /// not to fuzz/) fails.
        #[test]
        fn every_target_runs_here_and_under_cargo_fuzz() {
            let here: Vec<&str> = vec![$(stringify!($name)),*];
            let all: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
            assert_eq!(here, all);
            for name in all {
                let bin = fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"));
                assert!(bin.is_file(), "no cargo-fuzz binary {}", bin.display());
            }
        }
    };
}

targets!(
    quota_headers,
    sse_relay,
    body_facts,
    config,
    decision,
    openai_request,
    openai_answer,
    openai_stream,
    credentials,
    replica_merge,
);
