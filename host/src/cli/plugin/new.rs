//! `poolgate plugin new`: writes a ready-to-build ranker skeleton.
//!
//! The templates live in `host/src/cli/templates/` and are compiled in, so the
//! binary alone can scaffold a plugin anywhere, and what it writes builds
//! offline: Python, JavaScript and C skeletons get a copy of the WIT contract;
//! a Rust skeleton gets a copy of poolgate-sdk's sources in `vendor/` (the SDK
//! depends on no crate), unless `--sdk` names an SDK to depend on instead.
//!
//! Every file written is listed, with its hash, in `.poolgate-skeleton`, so that
//! `--force` can tell an untouched skeleton (rewritten) from one the author
//! has edited (refused, naming the edited files).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};

use crate::policy::engine::WIT_VERSION;

/// The languages a skeleton can be written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// Rust, on poolgate-sdk (cargo, wasm32-wasip2).
    Rust,
    /// Python, built with componentize-py.
    Python,
    /// JavaScript, built with componentize-js.
    Js,
    /// C, built with zig and poolgate-witgen.
    C,
}

/// Arguments of `poolgate plugin new`.
#[derive(clap::Args)]
pub struct Args {
    /// The plugin's name: lowercase letters, digits and `-` (e.g. `least-busy`).
    name: String,
    /// The language of the skeleton.
    #[arg(long, value_enum)]
    lang: Lang,
    /// Where to create the `<name>/` directory.
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Rust only: a poolgate-sdk directory to depend on by path, instead of the
    /// copy of the SDK written to `vendor/poolgate-sdk`.
    #[arg(long)]
    sdk: Option<PathBuf>,
    /// Rewrite the skeleton if `<dir>/<name>` is one `plugin new` wrote and
    /// nobody has edited since (to switch `--sdk`, or pick up a newer template).
    #[arg(long)]
    force: bool,
}

/// The file listing what `plugin new` wrote: `<sha256>  <path>` per line.
pub const MANIFEST: &str = ".poolgate-skeleton";

const WIT: &str = include_str!("../../../../wit/policy.wit");
const README: &str = include_str!("../templates/README.md");
const FIXTURES: &str = include_str!("../templates/fixtures.json");

/// (path in the skeleton, template, executable) for each language.
fn files(lang: Lang) -> Vec<(&'static str, &'static str, bool)> {
    match lang {
        Lang::Rust => vec![
            ("Cargo.toml", include_str!("../templates/rust/Cargo.toml"), false),
            ("src/lib.rs", include_str!("../templates/rust/lib.rs"), false),
            ("build.sh", include_str!("../templates/rust/build.sh"), true),
        ],
        Lang::Python => vec![
            ("app.py", include_str!("../templates/python/app.py"), false),
            ("build.sh", include_str!("../templates/python/build.sh"), true),
            ("wit/policy.wit", WIT, false),
        ],
        Lang::Js => vec![
            ("ranker.js", include_str!("../templates/js/ranker.js"), false),
            ("build.mjs", include_str!("../templates/js/build.mjs"), false),
            ("entry.mjs", include_str!("../templates/js/entry.mjs"), false),
            ("package.json", include_str!("../templates/js/package.json"), false),
            ("build.sh", include_str!("../templates/js/build.sh"), true),
            ("wit/policy.wit", WIT, false),
        ],
        Lang::C => vec![
            ("ranker.c", include_str!("../templates/c/ranker.c"), false),
            ("build.sh", include_str!("../templates/c/build.sh"), true),
            ("wit/policy.wit", WIT, false),
        ],
    }
}

/// Runs `poolgate plugin new`.
pub fn run(args: Args) -> Result<ExitCode> {
    let dir = create(&args.name, args.lang, &args.dir, args.sdk.as_deref(), args.force)?;
    let shown = dir.display();
    println!("created {shown}/ ({:?})", args.lang);
    if args.lang == Lang::Js {
        println!("  # componentize-js: `npm install` in {shown} once, or one global install (see build.sh)");
    }
    println!("  poolgate plugin build {shown}    # build/, then the fixtures, then {shown}/dist/{}.wasm", args.name);
    Ok(ExitCode::SUCCESS)
}

/// Writes the skeleton of `name` in `lang` under `parent`; returns its directory.
/// With `force`, an untouched skeleton already there is rewritten.
pub fn create(name: &str, lang: Lang, parent: &Path, sdk: Option<&Path>, force: bool) -> Result<PathBuf> {
    check_name(name)?;
    let dir = parent.join(name);
    if dir.exists() {
        if !force {
            bail!(
                "{} already exists; pick another name or directory (or --force, to rewrite a skeleton nobody edited)",
                dir.display()
            );
        }
        clear_untouched(&dir)?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;

    let sdk_dep = match sdk {
        Some(p) => format!("poolgate-sdk = {{ path = {:?} }}", p.display().to_string()),
        None => "poolgate-sdk = { path = \"vendor/poolgate-sdk\" }".to_string(),
    };
    let (language, source, setup, note, timeout) = match lang {
        Lang::Rust => ("Rust", "src/lib.rs", "", "through poolgate-sdk, a copy of which is in vendor/", 25),
        Lang::Python => ("Python", "app.py", "", "a copy is in wit/policy.wit", 50),
        Lang::Js => ("JavaScript", "ranker.js", "", "a copy is in wit/policy.wit", 50),
        Lang::C => ("C", "ranker.c", "", "a copy is in wit/policy.wit", 25),
    };
    let vars = [
        ("{{name}}", name.to_string()),
        ("{{crate}}", name.replace('-', "_")),
        ("{{reason}}", name.replace('-', "_")),
        ("{{sdk_dep}}", sdk_dep),
        ("{{language}}", language.to_string()),
        ("{{source}}", source.to_string()),
        ("{{setup}}", setup.to_string()),
        ("{{wit_version}}", WIT_VERSION.to_string()),
        ("{{wit_note}}", note.to_string()),
        ("{{timeout_ms}}", timeout.to_string()),
    ];
    let fill = |t: &str| vars.iter().fold(t.to_string(), |acc, (k, v)| acc.replace(k, v));

    let mut all: Vec<(String, String, bool)> =
        files(lang).into_iter().map(|(path, template, x)| (path.to_string(), fill(template), x)).collect();
    all.push(("README.md".into(), fill(README), false));
    all.push(("fixtures/basic.json".into(), fill(FIXTURES), false));
    if lang == Lang::Rust && sdk.is_none() {
        all.extend(vendored_sdk());
    }
    let mut manifest = String::new();
    for (path, text, executable) in &all {
        let target = dir.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&target, text).with_context(|| format!("cannot write {}", target.display()))?;
        if *executable {
            make_executable(&target)?;
        }
        manifest.push_str(&format!("{}  {path}\n", digest(text.as_bytes())));
    }
    std::fs::write(dir.join(MANIFEST), manifest)?;
    Ok(dir)
}

/// The SDK's sources as a crate of its own under `vendor/poolgate-sdk`.
fn vendored_sdk() -> Vec<(String, String, bool)> {
    let manifest = format!(
        "# A copy of poolgate-sdk {version}, written by `poolgate plugin new`: it depends on\n\
         # no crate, so this plugin builds offline. `poolgate plugin new --force` (on an\n\
         # untouched skeleton) or copying a newer poolgate's sdk/ over it updates it.\n\
         [package]\nname = \"poolgate-sdk\"\nversion = \"{version}\"\nedition = \"2024\"\n\
         license = \"Apache-2.0\"\npublish = false\n",
        version = crate::artifacts::SDK_VERSION
    );
    let mut out = vec![("vendor/poolgate-sdk/Cargo.toml".to_string(), manifest, false)];
    for (path, text) in crate::artifacts::SDK_SOURCES {
        out.push((format!("vendor/poolgate-sdk/{path}"), text.to_string(), false));
    }
    out
}

fn digest(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

/// Removes the files of a skeleton `plugin new` wrote, if none was edited;
/// refuses otherwise, naming the edited ones. Files the author added stay.
fn clear_untouched(dir: &Path) -> Result<()> {
    let listing = std::fs::read_to_string(dir.join(MANIFEST)).map_err(|_| {
        anyhow::anyhow!(
            "{} exists and is not a skeleton `plugin new` wrote (no {MANIFEST}); --force leaves it alone",
            dir.display()
        )
    })?;
    let entries: Vec<(&str, &str)> = listing.lines().filter_map(|l| l.split_once("  ")).collect();
    let edited: Vec<&str> = entries
        .iter()
        .filter(|(sum, path)| std::fs::read(dir.join(path)).is_ok_and(|b| digest(&b) != *sum))
        .map(|(_, path)| *path)
        .collect();
    if !edited.is_empty() {
        bail!(
            "{} was edited since `plugin new` wrote it ({}); --force only rewrites an untouched skeleton",
            dir.display(),
            edited.join(", ")
        );
    }
    for (_, path) in &entries {
        let _ = std::fs::remove_file(dir.join(path));
    }
    let _ = std::fs::remove_dir_all(dir.join("vendor/poolgate-sdk"));
    Ok(())
}

fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !ok {
        bail!("`{name}` is not a plugin name: use lowercase letters, digits and `-`, starting with a letter");
    }
    Ok(())
}

#[cfg(unix)]
fn make_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut perms = std::fs::metadata(path)?.permissions();
    perms.set_mode(0o755);
    std::fs::set_permissions(path, perms)?;
    Ok(())
}

#[cfg(not(unix))]
fn make_executable(_path: &Path) -> Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name("least-busy").is_ok());
        assert!(check_name("r2").is_ok());
        for bad in ["", "Least", "1st", "a_b", "a b", "../x"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
