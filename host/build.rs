//! Builds the built-in policy plugins (`plugins/*`) and the test guests
//! (`tests/guests/*`) for `wasm32-wasip2`, the way wasmtime builds its test
//! programs: a nested `cargo build` into a target directory of its own (so it never
//! waits on the outer build's lock), then a generated `guests.rs` that embeds the
//! built-ins with `include_bytes!` and names the test guests by path.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

const TARGET: &str = "wasm32-wasip2";
const PROFILE: &str = "wasm";

fn main() -> Result<()> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let root = manifest_dir.parent().context("host/ has a parent")?.to_path_buf();
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    let plugins = crates_under(&root.join("plugins"))?;
    let guests = crates_under(&root.join("tests/guests"))?;
    for dir in ["plugins", "tests/guests", "sdk", "wit"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }

    let wasm_target_dir = wasm_target_dir(&out_dir);
    let packages: Vec<&Crate> = plugins.iter().chain(guests.iter()).collect();
    build(&root, &wasm_target_dir, &packages)?;

    let artifacts = wasm_target_dir.join(TARGET).join(PROFILE);
    let mut code = String::new();
    writeln!(code, "/// Built-in plugins: (name, component bytes).")?;
    writeln!(code, "pub static BUILTINS: &[(&str, &[u8])] = &[")?;
    for p in &plugins {
        let path = artifacts.join(p.artifact());
        writeln!(code, "    ({:?}, include_bytes!({:?})),", p.dir_name, path)?;
    }
    writeln!(code, "];")?;
    writeln!(code, "/// Test guests: (name, path to the component).")?;
    writeln!(code, "pub static TEST_GUESTS: &[(&str, &str)] = &[")?;
    for g in &guests {
        writeln!(code, "    ({:?}, {:?}),", g.dir_name, artifacts.join(g.artifact()))?;
    }
    writeln!(code, "];")?;
    sdk_sources(&root, &mut code)?;
    fs::write(out_dir.join("guests.rs"), code)?;
    Ok(())
}

/// The SDK's sources, embedded so that `poolgate plugin new --lang rust` can
/// write them next to a skeleton: the SDK depends on no crate, so the skeleton
/// builds offline with nothing but the binary and a Rust toolchain.
fn sdk_sources(root: &Path, code: &mut String) -> Result<()> {
    let mut files = Vec::new();
    let mut stack = vec![root.join("sdk/src")];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    writeln!(code, "/// The Rust SDK's sources: (path under `sdk/`, contents).")?;
    writeln!(code, "pub static SDK_SOURCES: &[(&str, &str)] = &[")?;
    for f in &files {
        let rel = f.strip_prefix(root.join("sdk"))?.to_string_lossy().replace('\\', "/");
        writeln!(code, "    ({rel:?}, include_str!({:?})),", f)?;
    }
    writeln!(code, "];")?;
    let version = fs::read_to_string(root.join("Cargo.toml"))?
        .lines()
        .find_map(|l| l.trim().strip_prefix("version = ").map(|v| v.trim_matches('"').to_string()))
        .context("no workspace version")?;
    writeln!(code, "/// The workspace version, which the SDK carries.")?;
    writeln!(code, "pub const SDK_VERSION: &str = {version:?};")?;
    Ok(())
}

struct Crate {
    dir_name: String,
    package: String,
}

impl Crate {
    fn artifact(&self) -> String {
        format!("{}.wasm", self.package.replace('-', "_"))
    }
}

/// Every crate directly under `dir`, with its package name read from Cargo.toml.
fn crates_under(dir: &Path) -> Result<Vec<Crate>> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(found);
    };
    for entry in entries {
        let path = entry?.path();
        let manifest = path.join("Cargo.toml");
        if !manifest.is_file() {
            continue;
        }
        let text = fs::read_to_string(&manifest)?;
        let package = text
            .lines()
            .find_map(|l| {
                let l = l.trim();
                l.strip_prefix("name")
                    .and_then(|r| r.trim_start().strip_prefix('='))
                    .map(|v| v.trim().trim_matches('"').to_string())
            })
            .with_context(|| format!("no package name in {}", manifest.display()))?;
        found.push(Crate { dir_name: path.file_name().unwrap().to_string_lossy().into_owned(), package });
    }
    found.sort_by(|a, b| a.dir_name.cmp(&b.dir_name));
    Ok(found)
}

/// `<target>/wasm-guests`, next to the outer build's profile directories, so the
/// dev, test and release builds of the host share one guest build.
fn wasm_target_dir(out_dir: &Path) -> PathBuf {
    // OUT_DIR is <target>/[<triple>/]<profile>/build/<pkg>-<hash>/out.
    let build = out_dir
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "build"))
        .expect("OUT_DIR lies under a build/ directory");
    let mut target = build.parent().unwrap().parent().unwrap().to_path_buf();
    if target.file_name().is_some_and(|n| n == env::var("TARGET").unwrap_or_default().as_str()) {
        target.pop();
    }
    target.join("wasm-guests")
}

fn build(root: &Path, target_dir: &Path, packages: &[&Crate]) -> Result<()> {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .arg("build")
        .arg("--target")
        .arg(TARGET)
        .arg("--profile")
        .arg(PROFILE)
        .env("CARGO_TARGET_DIR", target_dir)
        // The outer build's flags (coverage, sanitizers, clippy's wrapper) are for
        // the host, not for the guests.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_BUILD_TARGET");
    for p in packages {
        cmd.arg("-p").arg(&p.package);
    }
    let output = cmd.output().context("running the nested cargo build for wasm guests")?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        if stderr.contains("target may not be installed") || stderr.contains("can't find crate for `std`") {
            bail!(
                "the {TARGET} target is not installed; run `rustup target add {TARGET}` \
                 (poolgate's built-in plugins are WebAssembly components)\n{stderr}"
            );
        }
        bail!("building the wasm guests failed:\n{stderr}");
    }
    Ok(())
}
