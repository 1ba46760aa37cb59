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
//! unchanged: every file of the plugin directory (symbolic links followed, by
//! content) but the build outputs, the fixtures and installed packages, and
//! this binary's version (the C build uses its bindings). Files outside the
//! directory that a build reads — a path dependency, an SDK checkout, the
//! shared `wit/` or `entry.mjs` of `examples/plugins` — are not seen: after
//! changing one, pass `--rebuild`. The record of the last build lives in
//! `build/.poolgate-build`; `--rebuild` ignores it (a new toolchain, say).
//!
//! The component is read once: the bytes inspected, compiled and tested are
//! the bytes placed, whatever `build.sh` or another build writes to
//! `build/` meanwhile.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

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

/// What a build records about itself, under the build folder.
const RECORD: &str = ".poolgate-build";

/// Runs `poolgate plugin build`.
pub fn run(args: Args) -> Result<ExitCode> {
    let started = crate::clock::machine_instant();
    let script = args.dir.join("build.sh");
    if !script.is_file() {
        bail!(
            "{} has no build.sh; `poolgate plugin new <name> --lang rust|python|js|c` writes one \
             (docs/writing-plugins.md lists the per-language commands)",
            args.dir.display()
        );
    }
    let fixtures = args.fixtures.clone().unwrap_or_else(|| args.dir.join("fixtures"));
    if !fixtures.exists() {
        bail!(
            "no fixtures to test the build with at {}: `plugin build` deploys a component only once its \
             fixtures pass; add a case (plugin new writes two) or name them with --fixtures",
            fixtures.display()
        );
    }
    let cases = load_cases(&fixtures)
        .with_context(|| format!("cannot use the fixtures at {}, so nothing is deployed", fixtures.display()))?;
    if cases.is_empty() {
        bail!("{} holds no cases: `plugin build` deploys a component only once its fixtures pass", fixtures.display());
    }
    // A fixtures folder or destination inside the plugin directory judges or
    // receives the component; neither makes it.
    let mut not_inputs = vec![fixtures.as_path()];
    not_inputs.extend(args.out.as_deref());
    let (wasm, bytes) = built(&args, &script, &not_inputs)?;
    let out = match &args.out {
        Some(out) => out.clone(),
        None => args.dir.join("dist").join(wasm.file_name().context("the component has no file name")?),
    };
    let engine = args.cache.engine()?;
    let compiled = crate::clock::machine_instant();
    let inspected = inspect::inspect_bytes(&engine, &wasm, &bytes, false)?;
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

    // The fixtures run the bytes read above, from a private copy: a build
    // writing `build/` again meanwhile changes neither what is tested nor
    // what is placed.
    let staged = Staged::new(&bytes, &wasm)?;
    let results =
        run_all(&engine, &PluginRef::Path(staged.path.clone()), &cases, Duration::from_millis(args.timeout_ms));
    drop(staged);
    let failed = report(&results, false)?;
    if failed > 0 {
        println!("\nnot deployed: {failed} of {} fixture cases failed; {} is unchanged", results.len(), out.display());
        return Ok(ExitCode::FAILURE);
    }
    println!("\n{} fixture cases passed", results.len());
    if std::fs::read(&out).is_ok_and(|there| there == bytes) {
        println!("already deployed: {} holds these bytes ({:.1} s)", out.display(), started.elapsed().as_secs_f64());
    } else {
        place(&bytes, &out)?;
        println!("deployed {} ({:.1} s)", out.display(), started.elapsed().as_secs_f64());
    }
    Ok(ExitCode::SUCCESS)
}

/// A private copy of the component's bytes for the fixture runs, removed on drop.
struct Staged {
    dir: PathBuf,
    path: PathBuf,
}

impl Staged {
    fn new(bytes: &[u8], wasm: &Path) -> Result<Self> {
        let nanos = crate::clock::system_time().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!("poolgate-build-{}-{nanos}", std::process::id()));
        let mut builder = std::fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let path = dir.join(wasm.file_name().unwrap_or(std::ffi::OsStr::new("component.wasm")));
        let staged = Staged { dir, path };
        std::fs::write(&staged.path, bytes).with_context(|| format!("cannot write {}", staged.path.display()))?;
        Ok(staged)
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The component and its bytes, read once: built now, or the last build's
/// when nothing changed.
fn built(args: &Args, script: &Path, not_inputs: &[&Path]) -> Result<(PathBuf, Vec<u8>)> {
    let inputs = Inputs::new(&args.dir, not_inputs);
    let before = inputs.read()?;
    let record = args.dir.join("build").join(RECORD);
    if !args.rebuild
        && let Some(last) = last_build(&record, &fingerprint(&before))
    {
        println!("{} unchanged since its last build: not rebuilt (--rebuild forces it)\n", last.0.display());
        return Ok(last);
    }
    let started = crate::clock::machine_instant();
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
    // The last line names the component; a relative path is the plugin
    // directory's (the skeletons `cd` there), not this process's.
    let wasm = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| args.dir.join(l.trim()))
        .filter(|p| p.is_file())
        .with_context(|| format!("{} did not print the path of the component it built", script.display()))?;
    let bytes = std::fs::read(&wasm).with_context(|| format!("cannot read {}", wasm.display()))?;
    println!("built {} in {:.1} s\n", wasm.display(), started.elapsed().as_secs_f64());
    // A build may add inputs of its own (cargo writes Cargo.lock): those are
    // part of what the next build reads. An input edited while it ran is not:
    // then nothing is recorded, and the next build runs.
    let after = inputs.read()?;
    let changed = before.iter().find(|b| after.binary_search(b).is_err());
    let recorded = match changed {
        None => {
            let sha = hex::encode(Sha256::digest(&bytes));
            let line = serde_json::json!({ "inputs": fingerprint(&after), "component": wasm, "sha256": sha });
            std::fs::create_dir_all(args.dir.join("build")).and_then(|()| std::fs::write(&record, line.to_string()))
        }
        Some((rel, _)) => {
            println!("{rel} changed while the build ran: this build is not recorded, and the next one runs\n");
            std::fs::remove_file(&record).or(Ok(()))
        }
    };
    if let Err(e) = recorded {
        eprintln!("warning: cannot record the build in {} ({e}); the next one rebuilds", record.display());
    }
    Ok((wasm, bytes))
}

/// The component the last build made and its bytes, if its inputs were
/// `inputs` and the file still holds what it built.
fn last_build(record: &Path, inputs: &str) -> Option<(PathBuf, Vec<u8>)> {
    let text = std::fs::read_to_string(record).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    if v["inputs"].as_str()? != inputs {
        return None;
    }
    let wasm = PathBuf::from(v["component"].as_str()?);
    let bytes = std::fs::read(&wasm).ok()?;
    (v["sha256"].as_str()? == hex::encode(Sha256::digest(&bytes))).then_some((wasm, bytes))
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

/// Folders at the top of a plugin directory that a build writes or that judge
/// its result: outputs and the fixtures (a fixture edited after a rejected
/// build deploys that build's component).
const OUTPUTS: [&str; 4] = ["build", "dist", "target", "fixtures"];
/// Folders, at any depth, of installed packages, caches and version control:
/// a build may read them, but they change without the plugin changing
/// (a cache written by the build itself, a `git fetch`).
const NOISE: [&str; 9] =
    [".git", "node_modules", "__pycache__", ".venv", "venv", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".tox"];

/// What a build of one plugin directory reads.
struct Inputs<'a> {
    root: &'a Path,
    /// Paths inside `root` that are not inputs, as `root`-relative paths.
    skip: Vec<PathBuf>,
}

impl<'a> Inputs<'a> {
    fn new(root: &'a Path, not_inputs: &[&Path]) -> Self {
        let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let base = absolute(root);
        let skip =
            not_inputs.iter().filter_map(|p| absolute(p).strip_prefix(&base).ok().map(Path::to_path_buf)).collect();
        Inputs { root, skip }
    }

    /// Every input file by `root`-relative path and content hash, sorted.
    /// Symbolic links are followed: a linked file counts by what it holds.
    fn read(&self) -> Result<Vec<(String, [u8; 32])>> {
        let mut files = Vec::new();
        let mut seen = std::collections::HashSet::new();
        self.walk(self.root, Path::new(""), &mut seen, &mut files)?;
        files.sort();
        Ok(files)
    }

    fn walk(
        &self,
        dir: &Path,
        rel_dir: &Path,
        seen: &mut std::collections::HashSet<PathBuf>,
        out: &mut Vec<(String, [u8; 32])>,
    ) -> Result<()> {
        // A linked folder reached twice (or a link to a parent) is read once.
        if !seen.insert(std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf())) {
            return Ok(());
        }
        for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
            let entry = entry?;
            let (path, name) = (entry.path(), entry.file_name());
            let rel = rel_dir.join(&name);
            let top = rel_dir.as_os_str().is_empty();
            if (top && OUTPUTS.iter().any(|o| name == *o))
                || NOISE.iter().any(|o| name == *o)
                || self.skip.contains(&rel)
            {
                continue;
            }
            // Follows links; a dangling one is a file that is not there.
            let Ok(meta) = std::fs::metadata(&path) else { continue };
            if meta.is_dir() {
                self.walk(&path, &rel, seen, out)?;
            } else if meta.is_file() {
                let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
                out.push((rel.display().to_string(), Sha256::digest(&bytes).into()));
            }
        }
        Ok(())
    }
}

/// Writes `bytes` to `out` the way a watcher should see it: all at once. The
/// copy is written and synced beside `out`, with the mode of the file it
/// replaces, then renamed over it, and the rename synced. A symbolic link at
/// `out` stays: the file it points to is replaced.
fn place(bytes: &[u8], out: &Path) -> Result<()> {
    let out = match std::fs::symlink_metadata(out) {
        Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(out)
            .with_context(|| format!("{} is a symbolic link to nothing; deploy to its target", out.display()))?,
        _ => out.to_path_buf(),
    };
    let dir = out.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let name = out.file_name().context("--out names no file")?.to_string_lossy();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let mode = std::fs::metadata(&out).ok().map(|m| m.permissions());
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        if let Some(mode) = mode {
            f.set_permissions(mode)?;
        }
        f.sync_all()?;
        std::fs::rename(&tmp, &out)?;
        // The rename is durable once the directory is.
        std::fs::File::open(dir)?.sync_all()
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

    fn fp(dir: &Path) -> String {
        fingerprint(&Inputs::new(dir, &[&dir.join("deploy/x.wasm")]).read().unwrap())
    }

    #[test]
    fn the_fingerprint_follows_sources_and_ignores_outputs() {
        let dir = std::env::temp_dir().join(format!("poolgate-fingerprint-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("build")).unwrap();
        std::fs::create_dir_all(dir.join("dist")).unwrap();
        std::fs::create_dir_all(dir.join("fixtures")).unwrap();
        std::fs::write(dir.join("app.py"), "a = 1\n").unwrap();
        let first = fp(&dir);
        std::fs::write(dir.join("build/x.wasm"), "output").unwrap();
        std::fs::write(dir.join("dist/x.wasm"), "output").unwrap();
        std::fs::write(dir.join("fixtures/basic.json"), "{}").unwrap();
        assert_eq!(fp(&dir), first, "outputs and fixtures are not inputs");
        std::fs::write(dir.join("app.py"), "a = 2\n").unwrap();
        let edited = fp(&dir);
        assert_ne!(edited, first, "an edit is a change");
        std::fs::create_dir_all(dir.join("lib")).unwrap();
        std::fs::write(dir.join("lib/helper.py"), "").unwrap();
        let added = fp(&dir);
        assert_ne!(added, edited, "a new file is a change");
        std::fs::create_dir_all(dir.join("lib/build")).unwrap();
        std::fs::write(dir.join("lib/build/gen.py"), "").unwrap();
        assert_ne!(fp(&dir), added, "only the top's build/ is output; lib/build/ is source");
        let nested = fp(&dir);
        std::fs::create_dir_all(dir.join("lib/node_modules")).unwrap();
        std::fs::write(dir.join("lib/node_modules/x.js"), "").unwrap();
        std::fs::create_dir_all(dir.join("deploy")).unwrap();
        std::fs::write(dir.join("deploy/x.wasm"), "output").unwrap();
        assert_eq!(fp(&dir), nested, "installed packages at any depth and --out are not inputs");
        #[cfg(unix)]
        {
            std::fs::write(dir.join("shared.py"), "s = 1\n").unwrap();
            std::os::unix::fs::symlink(dir.join("shared.py"), dir.join("lib/link.py")).unwrap();
            let linked = fp(&dir);
            std::fs::write(dir.join("shared.py"), "s = 2\n").unwrap();
            let after = Inputs::new(&dir, &[]).read().unwrap();
            assert_ne!(fp(&dir), linked, "a linked file counts by content");
            assert!(after.iter().any(|(p, _)| p == "lib/link.py"), "{after:?}");
        }
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
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o640)).unwrap();
            let link = dir.join("current.wasm");
            std::os::unix::fs::symlink(&out, &link).unwrap();
            place(b"three", &link).unwrap();
            assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link stays a link");
            assert_eq!(std::fs::read(&out).unwrap(), b"three", "its target is replaced");
            assert_eq!(std::fs::metadata(&out).unwrap().permissions().mode() & 0o777, 0o640, "the mode is kept");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
