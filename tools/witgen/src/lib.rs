//! The WebAssembly build steps a C (or any non-Rust, non-componentize) plugin
//! needs, as a library: the `poolgate-witgen` binary and `poolgate plugin
//! bindings` / `poolgate plugin wrap` both call it.
//!
//! - [`c_bindings`]: C bindings for a world of a WIT package (what `wit-bindgen
//!   c` does);
//! - [`component`]: wraps a core module into a component (what `wasm-tools
//!   component new` does), adding the `wasi_snapshot_preview1` adapter only when
//!   the module imports WASI preview 1;
//! - [`wit_of`]: the WIT world a component was built for (what `wasm-tools
//!   component wit` does);
//! - [`rust`]: the Rust SDK's committed bindings (`sdk/src/bindings.rs`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

pub mod rust;

/// Generates C bindings for `world` of the WIT at `wit` into `out`; returns the
/// file names written.
pub fn c_bindings(wit: &Path, world: &str, out: &Path) -> Result<Vec<String>> {
    let mut resolve = wit_parser::Resolve::default();
    let (pkg, _) = resolve.push_path(wit).with_context(|| format!("cannot parse WIT at {}", wit.display()))?;
    c_bindings_of(resolve, pkg, world, out)
}

/// As [`c_bindings`], for WIT given as text (one file, named `name` in errors).
pub fn c_bindings_from_text(name: &str, text: &str, world: &str, out: &Path) -> Result<Vec<String>> {
    let mut resolve = wit_parser::Resolve::default();
    let pkg = resolve.push_str(name, text).with_context(|| format!("cannot parse WIT {name}"))?;
    c_bindings_of(resolve, pkg, world, out)
}

fn c_bindings_of(
    mut resolve: wit_parser::Resolve,
    pkg: wit_parser::PackageId,
    world: &str,
    out: &Path,
) -> Result<Vec<String>> {
    let world_id = resolve.select_world(&[pkg], Some(world)).with_context(|| format!("no world `{world}`"))?;
    let mut files = wit_bindgen_core::Files::default();
    wit_bindgen_c::Opts::default().build().generate(&mut resolve, world_id, &mut files)?;
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut written = Vec::new();
    for (name, contents) in files.iter() {
        std::fs::write(out.join(name), contents).with_context(|| format!("cannot write {name}"))?;
        written.push(name.to_string());
    }
    Ok(written)
}

/// Wraps the core module at `input` into a component at `out`. Returns whether the
/// preview-1 adapter was needed.
pub fn component(input: &Path, out: &Path) -> Result<bool> {
    let module = std::fs::read(input).with_context(|| format!("cannot read {}", input.display()))?;
    let needs_adapter =
        imports_module(&module, wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME)?;
    let mut encoder = wit_component::ComponentEncoder::default();
    encoder.module(&module).context(
        "the module carries no component type: link the `<world>_component_type.o` that `poolgate-witgen c` wrote",
    )?;
    encoder.validate(true);
    if needs_adapter {
        encoder.adapter(
            wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME,
            wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
        )?;
    }
    let bytes = encoder.encode().context("encoding the component")?;
    write_atomically(out, &bytes)?;
    Ok(needs_adapter)
}

/// Whether the core module imports anything from module `name`.
fn imports_module(module: &[u8], name: &str) -> Result<bool> {
    for payload in wasmparser::Parser::new(0).parse_all(module) {
        if let wasmparser::Payload::ImportSection(reader) = payload.context("not a WebAssembly module")? {
            for import in reader.into_imports() {
                if import?.module == name {
                    return Ok(true);
                }
            }
        }
    }
    Ok(false)
}

/// The WIT text of the world `component` was built for.
pub fn wit_of(component: &Path) -> Result<String> {
    let bytes = std::fs::read(component).with_context(|| format!("cannot read {}", component.display()))?;
    let decoded = wit_component::decode(&bytes).context("not a WebAssembly component")?;
    let mut printer = wit_component::WitPrinter::default();
    printer.print(decoded.resolve(), decoded.package(), &[])?;
    Ok(printer.output.to_string())
}

/// Writes `bytes` to `path` through a temporary file and a rename.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let tmp: PathBuf = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wit_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../wit")
    }

    #[test]
    fn generates_c_bindings_for_the_policy_world() {
        let out = std::env::temp_dir().join(format!("witgen-test-{}", std::process::id()));
        let files = c_bindings(&wit_dir(), "policy", &out).unwrap();
        for want in ["policy.h", "policy.c", "policy_component_type.o"] {
            assert!(files.iter().any(|f| f == want), "{want} missing from {files:?}");
        }
        let header = std::fs::read_to_string(out.join("policy.h")).unwrap();
        assert!(header.contains("exports_poolgate_policy_ranker_rank"), "the export is declared");
        let _ = std::fs::remove_dir_all(out);
    }

    #[test]
    fn a_non_wasm_file_is_refused_with_a_reason() {
        let err = imports_module(b"not wasm", "x").unwrap_err();
        assert!(format!("{err:#}").contains("not a WebAssembly module"), "{err:#}");
    }
}
