//! `poolgate-witgen`: the two WebAssembly build steps a C (or any non-Rust, non-
//! componentize) plugin needs, as one small binary built from crates.io:
//!
//! - `c`: C bindings for a world of a WIT package (what `wit-bindgen c` does);
//! - `component`: wraps a core module into a component (what `wasm-tools
//!   component new` does), adding the `wasi_snapshot_preview1` adapter only when
//!   the module imports WASI preview 1;
//! - `wit`: prints the WIT world a component was built for (what `wasm-tools
//!   component wit` does);
//! - `rust`: the Rust SDK's committed bindings (`sdk/src/bindings.rs`), what
//!   `wit_bindgen::generate!` would expand to (module `rust`).
//!
//! It exists so that CI and plugin authors need neither `cargo install
//! wit-bindgen-cli` (5–8 minutes on 2 cores) nor a wasm-tools binary.
//!
//! ```text
//! poolgate-witgen c --wit wit --world policy --out build/gen
//! poolgate-witgen component build/core.wasm -o build/ranker.wasm
//! poolgate-witgen wit build/ranker.wasm
//! poolgate-witgen rust --wit wit --world policy --out sdk/src/bindings.rs
//! ```

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use poolgate_witgen::{c_bindings, component, rust, wit_of, write_atomically};

const USAGE: &str = "\
usage:
  poolgate-witgen c --wit <dir|file> --world <world> --out <dir>
      Writes C bindings for <world>: <world>.h, <world>.c and
      <world>_component_type.o (link the .o: it carries the component type).
  poolgate-witgen component <core.wasm> -o <component.wasm>
      Wraps a core module built with those bindings into a component. The
      wasi_snapshot_preview1 adapter is added only if the module imports it.
  poolgate-witgen wit <component.wasm>
      Prints the WIT world the component targets.
  poolgate-witgen rust --wit <dir|file> --world <world> --out <file.rs>
      Writes the Rust bindings of <world> as the SDK commits them
      (sdk/src/bindings.rs), using the SDK's own runtime module.

example (a C plugin for poolgate):
  poolgate-witgen c --wit wit --world policy --out gen
  python -m ziglang cc --target=wasm32-wasi -mexec-model=reactor -O2 -s \\
      -Igen -o core.wasm ranker.c gen/policy.c gen/policy_component_type.o
  poolgate-witgen component core.wasm -o ranker.wasm";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("poolgate-witgen: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<()> {
    let Some((cmd, rest)) = args.split_first() else {
        println!("{USAGE}");
        return Ok(());
    };
    match cmd.as_str() {
        "c" => {
            let wit = flag(rest, "--wit")?;
            let world = flag(rest, "--world")?;
            let out = flag(rest, "--out")?;
            for name in c_bindings(Path::new(&wit), &world, Path::new(&out))? {
                println!("{}", Path::new(&out).join(name).display());
            }
            Ok(())
        }
        "component" => {
            let input = rest.first().filter(|a| !a.starts_with('-')).context("component: which core module?")?;
            let out = flag(rest, "-o")?;
            let adapted = component(Path::new(input), Path::new(&out))?;
            let size = std::fs::metadata(&out)?.len();
            let note = if adapted { " (with the wasi_snapshot_preview1 adapter)" } else { "" };
            println!("{out}: {size} bytes{note}");
            Ok(())
        }
        "wit" => {
            let input = rest.first().context("wit: which component?")?;
            print!("{}", wit_of(Path::new(input))?);
            Ok(())
        }
        "rust" => {
            let wit = flag(rest, "--wit")?;
            let world = flag(rest, "--world")?;
            let out = flag(rest, "--out")?;
            let code = rust::rust_bindings(Path::new(&wit), &world)?;
            write_atomically(Path::new(&out), code.as_bytes())?;
            println!("{out}");
            Ok(())
        }
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => bail!("unknown command `{other}`\n{USAGE}"),
    }
}

/// The value after `name` in `args`.
fn flag(args: &[String], name: &str) -> Result<String> {
    let i = args.iter().position(|a| a == name).with_context(|| format!("missing {name} <value>\n{USAGE}"))?;
    args.get(i + 1).cloned().with_context(|| format!("{name} needs a value"))
}
