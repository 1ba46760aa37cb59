//! `poolgate plugin new`: writes a ready-to-build ranker skeleton.
//!
//! The templates live in `host/src/cli/templates/` and are compiled in, so the
//! binary alone can scaffold a plugin anywhere. Python, JavaScript and C
//! skeletons get a copy of the WIT contract; a Rust skeleton gets poolgate-sdk
//! (which carries it).

use std::path::{Component, Path, PathBuf};
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
    /// Rust only: the poolgate-sdk directory to depend on by path (default: the
    /// checkout the directory lies in, if any).
    #[arg(long)]
    sdk: Option<PathBuf>,
}

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
    let dir = create(&args.name, args.lang, &args.dir, args.sdk.as_deref())?;
    let shown = dir.display();
    println!("created {shown}/ ({:?})", args.lang);
    if args.lang == Lang::Js {
        println!("  cd {shown} && npm install      # once: componentize-js and friends (pinned)");
    }
    println!("  poolgate plugin build {shown}");
    println!("  poolgate plugin test {shown}/target/{}.wasm {shown}/fixtures", args.name);
    Ok(ExitCode::SUCCESS)
}

/// Writes the skeleton of `name` in `lang` under `parent`; returns its directory.
pub fn create(name: &str, lang: Lang, parent: &Path, sdk: Option<&Path>) -> Result<PathBuf> {
    check_name(name)?;
    let dir = parent.join(name);
    if dir.exists() {
        bail!("{} already exists; pick another name or directory", dir.display());
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let abs = dir.canonicalize()?;
    let checkout = poolgate_checkout(&abs);

    let sdk_dep = match (sdk, &checkout) {
        (Some(p), _) => format!("poolgate-sdk = {{ path = {:?} }}", p.display().to_string()),
        (None, Some(root)) => {
            let rel = relative(&abs, &root.join("sdk"));
            format!("poolgate-sdk = {{ path = {:?} }}", rel.display().to_string())
        }
        (None, None) => "# Outside a poolgate checkout: depend on the SDK from the repository, or on a\n\
             # local checkout with `path = \"/src/poolgate/sdk\"` (or `poolgate plugin new --sdk`).\n\
             poolgate-sdk = { git = \"https://github.com/poolgate/poolgate\" }"
            .to_string(),
    };
    let (language, source, setup, note, timeout) = match lang {
        Lang::Rust => ("Rust", "src/lib.rs", "", "through poolgate-sdk", 25),
        Lang::Python => ("Python", "app.py", "", "a copy is in wit/policy.wit", 50),
        Lang::Js => (
            "JavaScript",
            "ranker.js",
            "npm install                                     # once\n",
            "a copy is in wit/policy.wit",
            50,
        ),
        Lang::C => ("C", "ranker.c", "", "a copy is in wit/policy.wit", 25),
    };
    let vars = [
        ("{{name}}", name.to_string()),
        ("{{crate}}", name.replace('-', "_")),
        ("{{reason}}", name.replace('-', "_")),
        ("{{sdk_dep}}", sdk_dep),
        ("{{poolgate_root}}", checkout.as_ref().map(|r| r.display().to_string()).unwrap_or_default()),
        ("{{language}}", language.to_string()),
        ("{{source}}", source.to_string()),
        ("{{setup}}", setup.to_string()),
        ("{{wit_version}}", WIT_VERSION.to_string()),
        ("{{wit_note}}", note.to_string()),
        ("{{timeout_ms}}", timeout.to_string()),
    ];
    let fill = |t: &str| vars.iter().fold(t.to_string(), |acc, (k, v)| acc.replace(k, v));

    let mut all = files(lang);
    all.push(("README.md", README, false));
    all.push(("fixtures/basic.json", FIXTURES, false));
    for (path, template, executable) in all {
        let target = dir.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        // The WIT copy is verbatim; templates get their placeholders filled.
        let text = if template == WIT { template.to_string() } else { fill(template) };
        std::fs::write(&target, text).with_context(|| format!("cannot write {}", target.display()))?;
        if executable {
            make_executable(&target)?;
        }
    }
    Ok(dir)
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

/// The poolgate checkout `dir` lies in, if any (where `sdk/` and `wit/policy.wit` are).
fn poolgate_checkout(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .find(|d| d.join("wit/policy.wit").is_file() && d.join("sdk/Cargo.toml").is_file())
        .map(Path::to_path_buf)
}

/// `to` relative to `from` (both absolute).
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<Component> = from.components().collect();
    let to: Vec<Component> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut rel = PathBuf::new();
    for _ in common..from.len() {
        rel.push("..");
    }
    for c in &to[common..] {
        rel.push(c);
    }
    rel
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

    #[test]
    fn relative_paths_walk_up_then_down() {
        assert_eq!(relative(Path::new("/r/examples/x"), Path::new("/r/sdk")), PathBuf::from("../../sdk"));
        assert_eq!(relative(Path::new("/r"), Path::new("/r/sdk")), PathBuf::from("sdk"));
    }
}
