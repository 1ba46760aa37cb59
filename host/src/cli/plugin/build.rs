//! `poolgate plugin build`: build, inspect, test, and only then deploy.
//!
//! A skeleton's `build.sh` writes `build/<name>.wasm`, a path nothing deploys
//! from. This command runs it, inspects the result (compiling it into the
//! gateway's cache with `--config`), runs the plugin's fixtures through it, and
//! only when every case passes copies it next to its destination and renames
//! it into place. A gateway watching that file therefore sees one complete,
//! tested component appear — never a half-written one, never one whose fixtures
//! fail — and, the compile being cached already, loads it without compiling.
//!
//! Python and JavaScript toolchains do not build reproducibly (the same source
//! gives different bytes each time), so every rebuild would miss the compile
//! cache and cost minutes. The build is therefore skipped when its inputs are
//! unchanged: every file of the plugin directory but the build outputs and
//! the fixtures, and this binary's version (the C build uses its bindings). The record of
//! the last build lives in `build/.poolgate-build`; `--rebuild` ignores it (a
//! new toolchain, say).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use super::{CacheArgs, inspect, report};
use crate::case::load_cases;
use crate::fixtures::run_all;
use crate::policy::PluginRef;

/// Arguments of `poolgate plugin build`.
#[derive(clap::Args)]
pub struct Args {
    /// The plugin directory (holding `build.sh` and `fixtures/`).
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// Where the tested component goes (default: `<dir>/dist/<file>`, the
    /// file name `build.sh` gave it). Point it at the path a gateway's chain
    /// names to deploy: the file is replaced by an atomic rename.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The fixtures that must pass before the component is placed (default:
    /// `<dir>/fixtures`).
    #[arg(long)]
    fixtures: Option<PathBuf>,
    /// Run `build.sh` even if nothing changed since the last build.
    #[arg(long)]
    rebuild: bool,
    /// Per-call deadline of the fixture runs, ms.
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
    #[command(flatten)]
    cache: CacheArgs,
}

/// Directories of a plugin that are not inputs of its build: outputs, installed
/// packages, and the fixtures (they judge the component, they do not make it:
/// a fixture edited after a rejected build deploys that build's component).
const NOT_INPUTS: [&str; 8] = ["build", "dist", "target", "node_modules", ".git", "__pycache__", ".venv", "fixtures"];
/// What a build records about itself, under the build folder.
const RECORD: &str = ".poolgate-build";

/// Runs `poolgate plugin build`.
pub fn run(args: Args) -> Result<ExitCode> {
    let started = Instant::now();
    let script = args.dir.join("build.sh");
    if !script.is_file() {
        bail!(
            "{} has no build.sh; `poolgate plugin new <name> --lang rust|python|js|c` writes one \
             (docs/writing-plugins.md lists the per-language commands)",
            args.dir.display()
        );
    }
    let fixtures = args.fixtures.clone().unwrap_or_else(|| args.dir.join("fixtures"));
    let cases = load_cases(&fixtures).with_context(|| {
        format!(
            "no fixtures to test the build with at {}: `plugin build` deploys a component only once its \
             fixtures pass; add a case (plugin new writes two) or name them with --fixtures",
            fixtures.display()
        )
    })?;
    if cases.is_empty() {
        bail!("{} holds no cases: `plugin build` deploys a component only once its fixtures pass", fixtures.display());
    }

    let wasm = built(&args, &script)?;
    let engine = args.cache.engine()?;
    let compiled = Instant::now();
    let inspected = inspect::inspect(&engine, &wasm, false)?;
    print!("{}", inspected.text);
    if !inspected.compatible {
        println!("\nnot deployed: poolgate cannot load this component");
        return Ok(ExitCode::FAILURE);
    }
    let into = match &args.cache.config {
        Some(c) => format!("the cache of {}", c.display()),
        None => "the default cache".to_string(),
    };
    println!("compiled into {into} in {:.1} s\n", compiled.elapsed().as_secs_f64());

    let plugin = PluginRef::parse(&wasm.display().to_string());
    let results = run_all(&engine, &plugin, &cases, Duration::from_millis(args.timeout_ms));
    let failed = report(&results, false)?;
    let out = match &args.out {
        Some(out) => out.clone(),
        None => args.dir.join("dist").join(wasm.file_name().context("the component has no file name")?),
    };
    if failed > 0 {
        println!("\nnot deployed: {failed} of {} fixture cases failed; {} is unchanged", results.len(), out.display());
        return Ok(ExitCode::FAILURE);
    }
    println!("\n{} fixture cases passed", results.len());
    let bytes = std::fs::read(&wasm).with_context(|| format!("cannot read {}", wasm.display()))?;
    if std::fs::read(&out).is_ok_and(|there| there == bytes) {
        println!("already deployed: {} holds these bytes ({:.1} s)", out.display(), started.elapsed().as_secs_f64());
    } else {
        place(&bytes, &out)?;
        println!("deployed {} ({:.1} s)", out.display(), started.elapsed().as_secs_f64());
    }
    Ok(ExitCode::SUCCESS)
}

/// The component: built now, or the last build's when nothing changed.
fn built(args: &Args, script: &Path) -> Result<PathBuf> {
    let before = inputs(&args.dir)?;
    let record = args.dir.join("build").join(RECORD);
    if !args.rebuild
        && let Some(wasm) = last_build(&record, &fingerprint(&before))
    {
        println!("{} unchanged since its last build: not rebuilt (--rebuild forces it)\n", wasm.display());
        return Ok(wasm);
    }
    let started = Instant::now();
    let mut command = std::process::Command::new("bash");
    command.arg(script);
    // build.sh may call this binary (`plugin bindings`, `plugin wrap`).
    if let Ok(exe) = std::env::current_exe() {
        command.env("POOLGATE", exe);
    }
    let output = command
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    print!("{stdout}");
    if !output.status.success() {
        bail!("{} failed ({})", script.display(), output.status);
    }
    let wasm = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| PathBuf::from(l.trim()))
        .filter(|p| p.is_file())
        .with_context(|| format!("{} did not print the path of the component it built", script.display()))?;
    println!("built {} in {:.1} s\n", wasm.display(), started.elapsed().as_secs_f64());
    // A build may add inputs of its own (cargo writes Cargo.lock): those are
    // part of what the next build reads. An input edited while it ran is not:
    // then nothing is recorded, and the next build runs.
    let after = inputs(&args.dir)?;
    let only_added = before.iter().all(|b| after.contains(b));
    let recorded = if only_added {
        let sha = hex::encode(Sha256::digest(std::fs::read(&wasm)?));
        let line = serde_json::json!({ "inputs": fingerprint(&after), "component": wasm, "sha256": sha });
        std::fs::create_dir_all(args.dir.join("build")).and_then(|()| std::fs::write(&record, line.to_string()))
    } else {
        std::fs::remove_file(&record).or(Ok(()))
    };
    if let Err(e) = recorded {
        eprintln!("warning: cannot record the build in {} ({e}); the next one rebuilds", record.display());
    }
    Ok(wasm)
}

/// The component the last build made, if its inputs were `inputs` and the file
/// still holds what it built.
fn last_build(record: &Path, inputs: &str) -> Option<PathBuf> {
    let text = std::fs::read_to_string(record).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    if v["inputs"].as_str()? != inputs {
        return None;
    }
    let wasm = PathBuf::from(v["component"].as_str()?);
    let sha = hex::encode(Sha256::digest(std::fs::read(&wasm).ok()?));
    (v["sha256"].as_str()? == sha).then_some(wasm)
}

/// What a build reads: every file of `dir` outside [`NOT_INPUTS`], by path and
/// content (symbolic links by target), sorted.
fn inputs(dir: &Path) -> Result<Vec<(String, [u8; 32])>> {
    let mut files = Vec::new();
    walk(dir, dir, &mut files)?;
    files.sort();
    Ok(files)
}

/// A hash of a build's inputs and this binary's version (the C build uses its
/// bindings).
fn fingerprint(files: &[(String, [u8; 32])]) -> String {
    let mut h = Sha256::new();
    h.update(env!("CARGO_PKG_VERSION").as_bytes());
    h.update([0]);
    h.update(crate::policy::engine::WIT_VERSION.as_bytes());
    for (rel, what) in files {
        h.update([0]);
        h.update(rel.as_bytes());
        h.update([0]);
        h.update(what);
    }
    hex::encode(h.finalize())
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, [u8; 32])>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name();
        let kind = entry.file_type()?;
        let rel = path.strip_prefix(root).unwrap_or(&path).display().to_string();
        if kind.is_dir() {
            if !NOT_INPUTS.iter().any(|o| name == *o) {
                walk(root, &path, out)?;
            }
        } else if kind.is_symlink() {
            if !NOT_INPUTS.iter().any(|o| name == *o) {
                let target = std::fs::read_link(&path)?;
                out.push((rel, Sha256::digest(target.as_os_str().as_encoded_bytes()).into()));
            }
        } else if kind.is_file() {
            let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
            out.push((rel, Sha256::digest(&bytes).into()));
        }
    }
    Ok(())
}

/// Writes `bytes` to `out` the way a watcher should see it: all at once. The
/// copy is written and synced beside `out`, then renamed over it.
fn place(bytes: &[u8], out: &Path) -> Result<()> {
    let dir = out.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let name = out.file_name().context("--out names no file")?.to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, out)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot deploy to {}", out.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fingerprint_follows_sources_and_ignores_outputs() {
        let dir = std::env::temp_dir().join(format!("poolgate-fingerprint-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("build")).unwrap();
        std::fs::create_dir_all(dir.join("dist")).unwrap();
        std::fs::create_dir_all(dir.join("fixtures")).unwrap();
        std::fs::write(dir.join("app.py"), "a = 1\n").unwrap();
        let first = fingerprint(&inputs(&dir).unwrap());
        std::fs::write(dir.join("build/x.wasm"), "output").unwrap();
        std::fs::write(dir.join("dist/x.wasm"), "output").unwrap();
        std::fs::write(dir.join("fixtures/basic.json"), "{}").unwrap();
        assert_eq!(fingerprint(&inputs(&dir).unwrap()), first, "outputs and fixtures are not inputs");
        std::fs::write(dir.join("app.py"), "a = 2\n").unwrap();
        let edited = fingerprint(&inputs(&dir).unwrap());
        assert_ne!(edited, first, "an edit is a change");
        std::fs::create_dir_all(dir.join("lib")).unwrap();
        std::fs::write(dir.join("lib/helper.py"), "").unwrap();
        assert_ne!(fingerprint(&inputs(&dir).unwrap()), edited, "a new file is a change");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn placing_replaces_the_file_whole() {
        let dir = std::env::temp_dir().join(format!("poolgate-place-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let out = dir.join("plugins/x.wasm");
        place(b"one", &out).unwrap();
        place(b"two", &out).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"two");
        let left: Vec<_> = std::fs::read_dir(dir.join("plugins")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, ["x.wasm"], "no temporary file is left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
