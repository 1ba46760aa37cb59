//! Builds the example rankers under `examples/plugins/<lang>/` from source and
//! hands out their `.wasm` paths — for the language tests, the language bench,
//! and (later) the gateway's end-to-end test:
//!
//! ```ignore
//! #[path = "example_plugins/mod.rs"]
//! mod example_plugins;
//! let built = example_plugins::build_all_examples(); // panics, naming the fix
//! ```
//!
//! Each example is built by its own `build.sh` (the commands its README
//! documents) into `target/examples/<lang>/`. Python and JavaScript components
//! are 12–18 MB and take 20–40 s to build, so a build is skipped when a hash of
//! its inputs (the example's sources, the WIT, and the SDK or tool it builds
//! with) matches the last build's. A file lock per language makes concurrent
//! test processes build each example once.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use poolgate::policy::PolicyEngine;

use crate::bounded::OutputWithin as _;
use sha2::{Digest, Sha256};

/// The languages with an example ranker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lang {
    /// `examples/plugins/rust` (poolgate-sdk): the reference.
    Rust,
    /// `examples/plugins/python` (componentize-py).
    Python,
    /// `examples/plugins/js` (componentize-js).
    Js,
    /// `examples/plugins/c` (wit-bindgen's C generator + zig).
    C,
}

impl Lang {
    /// Every language, the reference first.
    pub const ALL: [Lang; 4] = [Lang::Rust, Lang::Python, Lang::Js, Lang::C];

    /// The example's directory name under `examples/plugins/`.
    pub fn dir_name(self) -> &'static str {
        match self {
            Lang::Rust => "rust",
            Lang::Python => "python",
            Lang::Js => "js",
            Lang::C => "c",
        }
    }

    /// The example's directory.
    pub fn dir(self) -> PathBuf {
        repo_root().join("examples/plugins").join(self.dir_name())
    }

    /// Inputs outside the example's directory that its component depends on.
    fn extra_inputs(self) -> Vec<PathBuf> {
        let root = repo_root();
        let mut v = vec![root.join("wit")];
        match self {
            Lang::Rust => v.push(root.join("sdk")),
            Lang::C => v.push(root.join("tools/witgen")),
            Lang::Js => v.push(root.join("host/src/cli/templates/js/entry.mjs")),
            Lang::Python => {}
        }
        v
    }
}

/// The language's name, for reports.
impl std::fmt::Display for Lang {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Lang::Rust => "Rust",
            Lang::Python => "Python",
            Lang::Js => "JavaScript",
            Lang::C => "C",
        })
    }
}

/// One built example.
#[derive(Debug, Clone)]
pub struct Built {
    /// Its language.
    pub lang: Lang,
    /// The component.
    pub wasm: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// How long the last build from source took (recorded with the build, so it
    /// is known even when this run reused it).
    pub build_time: Duration,
    /// Whether this call built it (false: the sources had not changed).
    pub rebuilt: bool,
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// `target/examples`, where the examples are built.
pub fn examples_target() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
        .join("examples")
}

/// The shared fixtures every example passes.
pub fn fixtures_dir() -> PathBuf {
    repo_root().join("examples/plugins/fixtures")
}

/// The compiled-component cache the tests and the bench share, so a 15–30 s
/// compile of the Python or JavaScript example happens once per change.
pub fn compile_cache_dir() -> PathBuf {
    examples_target().join("compiled")
}

/// An engine with that disk cache.
pub fn engine() -> std::sync::Arc<PolicyEngine> {
    PolicyEngine::new(Some(compile_cache_dir())).expect("engine")
}

/// Builds every example (or reuses an unchanged build) and returns them in
/// [`Lang::ALL`] order. Panics with each failure's message — which names the
/// command that installs a missing toolchain.
pub fn build_all_examples() -> Vec<Built> {
    let mut built = Vec::new();
    let mut failures = Vec::new();
    for lang in Lang::ALL {
        match build_example(lang) {
            Ok(b) => built.push(b),
            Err(e) => failures.push(e),
        }
    }
    assert!(failures.is_empty(), "building the example plugins failed:\n\n{}", failures.join("\n\n"));
    built
}

/// Builds one example, or panics naming what is missing.
pub fn built(lang: Lang) -> Built {
    build_example(lang).unwrap_or_else(|e| panic!("{e}"))
}

/// Builds one example unless its inputs are unchanged since the last build.
pub fn build_example(lang: Lang) -> Result<Built, String> {
    let out = examples_target().join(lang.dir_name());
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let lock = std::fs::File::create(out.with_extension("lock")).map_err(|e| e.to_string())?;
    lock.lock().map_err(|e| format!("cannot lock the {} build: {e}", lang.dir_name()))?;

    let hash = inputs_hash(lang);
    let stamp = out.join(".inputs");
    let wasm = out.join(format!("reset-soonest-{}.wasm", lang.dir_name()));
    if let Ok(text) = std::fs::read_to_string(&stamp) {
        let mut lines = text.lines();
        if lines.next() == Some(hash.as_str()) && wasm.is_file() {
            let ms: u64 = lines.next().and_then(|l| l.parse().ok()).unwrap_or(0);
            return Ok(describe(lang, wasm, Duration::from_millis(ms), false));
        }
    }

    let script = lang.dir().join("build.sh");
    let started = poolgate::clock::machine_instant();
    let output = Command::new("bash")
        .arg(&script)
        .arg(&out)
        .current_dir(repo_root())
        // The outer test build's flags are for the host, not for wasm guests.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_BUILD_TARGET")
        // A first build downloads nothing (the toolchains are installed) but
        // compiles a guest: minutes on two busy cores, never ten.
        .output_within(Duration::from_secs(600));
    let elapsed = started.elapsed();
    if !output.status.success() {
        return Err(format!(
            "the {lang:?} example did not build ({}):\n{}{}",
            script.display(),
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout),
        ));
    }
    if !wasm.is_file() {
        return Err(format!("{} succeeded but wrote no {}", script.display(), wasm.display()));
    }
    std::fs::write(&stamp, format!("{hash}\n{}\n", elapsed.as_millis())).map_err(|e| e.to_string())?;
    Ok(describe(lang, wasm, elapsed, true))
}

fn describe(lang: Lang, wasm: PathBuf, build_time: Duration, rebuilt: bool) -> Built {
    let size = std::fs::metadata(&wasm).map(|m| m.len()).unwrap_or(0);
    Built { lang, wasm, size, build_time, rebuilt }
}

/// Compiles `wasm` into the engine and the shared disk cache (the compiler
/// makes concurrent test processes compile a large component once, not once
/// each: the others wait for it). Returns how long this call took.
pub fn warm(engine: &PolicyEngine, wasm: &Path) -> Duration {
    let bytes = std::fs::read(wasm).unwrap_or_else(|e| panic!("cannot read {}: {e}", wasm.display()));
    let started = poolgate::clock::machine_instant();
    engine.compile(&bytes, &wasm.display().to_string()).expect("the component compiles");
    started.elapsed()
}

/// A hash of everything the example's component is built from.
fn inputs_hash(lang: Lang) -> String {
    let mut files = Vec::new();
    collect(&lang.dir(), &mut files);
    for extra in lang.extra_inputs() {
        collect(&extra, &mut files);
    }
    files.sort();
    let mut h = Sha256::new();
    for f in files {
        h.update(f.to_string_lossy().as_bytes());
        h.update(std::fs::read(&f).unwrap_or_default());
    }
    hex::encode(h.finalize())
}

/// Source files under `path`, leaving out build outputs and installed packages.
fn collect(path: &Path, out: &mut Vec<PathBuf>) {
    const SKIP: [&str; 5] = ["node_modules", "target", "build", "__pycache__", ".git"];
    if path.is_file() {
        out.push(path.to_path_buf());
        return;
    }
    let Ok(entries) = std::fs::read_dir(path) else { return };
    for entry in entries.flatten() {
        let p = entry.path();
        if p.file_name().is_some_and(|n| SKIP.iter().any(|s| n == *s)) {
            continue;
        }
        collect(&p, out);
    }
}
