//! `poolgate plugin inspect`: what a component is, what it imports, and whether
//! this host would load it — with every reason it would not, not just the first.
//!
//! Types are read from the compiled component (wasmtime knows them structurally)
//! and named after the records, enums and variants of the host's own WIT when
//! their fields match, so a compatible plugin reads like `wit/policy.wit`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::LazyLock;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use wasmtime::component::types::{self, ComponentItem, Type};

use crate::policy::PolicyEngine;
use crate::policy::engine::{WIT_PACKAGE, WIT_TRACK, WIT_VERSION, import_granted, version_accepted};

/// What `inspect` found.
pub struct Report {
    /// The text to print.
    pub text: String,
    /// Whether poolgate would load the component.
    pub compatible: bool,
}

/// Inspects the component at `path`. `full` also lists the functions of WASI
/// imports (a Rust guest's std imports a dozen interfaces).
pub fn inspect(engine: &PolicyEngine, path: &Path, full: bool) -> Result<Report> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    inspect_bytes(engine, path, &bytes, full)
}

/// [`inspect`] of bytes already read from `path` (`plugin build` judges and
/// deploys the very bytes it read once).
pub fn inspect_bytes(engine: &PolicyEngine, path: &Path, bytes: &[u8], full: bool) -> Result<Report> {
    let mut out = String::new();
    writeln!(out, "component  {}", path.display())?;
    writeln!(out, "size       {} ({} bytes)", human_size(bytes.len() as u64), bytes.len())?;
    writeln!(out, "sha256     {}", hex::encode(Sha256::digest(bytes)))?;

    if let Some(problem) = not_a_component(bytes) {
        writeln!(out, "\nverdict    INCOMPATIBLE: {problem}")?;
        return Ok(Report { text: out, compatible: false });
    }
    let (component, _) = engine.compile(bytes, &path.display().to_string())?;
    let ty = component.component_type();
    let wasm = engine.engine();

    let mut problems = Vec::new();
    world(&mut out, &ty, wasm, &mut problems)?;

    writeln!(out, "\nexports")?;
    for (name, item) in ty.exports(wasm) {
        // A language runtime may export its own plumbing (componentize-py's
        // `exports.init`, a 900-character signature): named, not spelt out.
        let ours = name.starts_with("poolgate:policy/");
        let note = if ours || full { "" } else { "  # the language runtime's own; --full shows it" };
        write_item(&mut out, engine, "export", name, &item.ty, ours || full, note)?;
    }
    write_imports(&mut out, engine, &ty, full, &mut problems)?;

    // Names are not enough: a 0.1.x component may call a host function this
    // host does not have, or expect another type. Link it against exactly what
    // the host provides.
    if problems.is_empty()
        && let Err(e) = engine.linker().instantiate_pre(&component)
    {
        let why = format!("{:#}", anyhow::Error::from(e));
        problems.push(format!("an import this host does not provide: {why}"));
    }

    let compatible = write_verdict(&mut out, &problems)?;
    Ok(Report { text: out, compatible })
}

/// The world line: the `ranker` the component exports and whether this host
/// accepts its version; a missing or unaccepted one is a problem.
fn world(out: &mut String, ty: &types::Component, wasm: &wasmtime::Engine, problems: &mut Vec<String>) -> Result<()> {
    let ranker = ty.exports(wasm).map(|(n, _)| n.to_string()).find(|n| n.starts_with("poolgate:policy/ranker"));
    match ranker.as_deref().map(|r| r.split_once('@').map_or("", |(_, v)| v)) {
        None => problems.push(format!(
            "wrong world: it does not export `{WIT_PACKAGE}/ranker` (a poolgate plugin targets the `policy` world of \
             {WIT_PACKAGE}@{WIT_VERSION})"
        )),
        Some(v) if !version_accepted(v) => {
            writeln!(out, "world      {WIT_PACKAGE}@{v} (NOT accepted: this host speaks {WIT_PACKAGE}@{WIT_VERSION})")?;
            problems.push(format!(
                "wrong version: it targets {WIT_PACKAGE}@{v}, but this host speaks {WIT_PACKAGE}@{WIT_VERSION} and \
                 accepts only {}.{}.x",
                WIT_TRACK.0, WIT_TRACK.1
            ))
        }
        Some(v) => writeln!(
            out,
            "world      {WIT_PACKAGE}@{v} (this host speaks {WIT_PACKAGE}@{WIT_VERSION}, accepts {}.{}.x)",
            WIT_TRACK.0, WIT_TRACK.1
        )?,
    }
    Ok(())
}

/// The imports, each with whether this host links it; a forbidden one is a
/// problem.
fn write_imports(
    out: &mut String,
    engine: &PolicyEngine,
    ty: &types::Component,
    full: bool,
    problems: &mut Vec<String>,
) -> Result<()> {
    let wasm = engine.engine();
    writeln!(out, "\nimports")?;
    if ty.imports(wasm).len() == 0 {
        writeln!(out, "  (none: a pure component)")?;
    }
    for (name, item) in ty.imports(wasm) {
        let verdict = import_verdict(name);
        if let Err(why) = &verdict {
            problems.push(format!("forbidden import: `{name}` — {why}"));
        }
        let ours = name.starts_with("poolgate:policy/");
        let note = match &verdict {
            Ok(note) => format!("  # ok: {note}"),
            Err(why) => format!("  # FORBIDDEN: {why}"),
        };
        write_item(out, engine, "import", name, &item.ty, ours || full, &note)?;
    }
    Ok(())
}

/// The verdict and every problem behind it; whether the component is
/// compatible.
fn write_verdict(out: &mut String, problems: &[String]) -> Result<bool> {
    let compatible = problems.is_empty();
    if compatible {
        writeln!(out, "\nverdict    compatible: poolgate can load it")?;
    } else {
        writeln!(out, "\nverdict    INCOMPATIBLE")?;
        for p in problems {
            writeln!(out, "  - {p}")?;
        }
    }
    Ok(compatible)
}

/// Why `name` is (not) linked for plugins.
fn import_verdict(name: &str) -> Result<&'static str, String> {
    if import_granted(name) {
        return Ok(if name.starts_with("poolgate:policy/") {
            "poolgate's host interface"
        } else {
            "WASI 0.2: linked, grants nothing"
        });
    }
    if let Some(rest) = name.strip_prefix("poolgate:policy/") {
        let v = rest.split_once('@').map_or("", |(_, v)| v);
        return Err(format!(
            "version {v} of poolgate's host interface; this host provides {WIT_PACKAGE}@{WIT_VERSION} ({}.{}.x)",
            WIT_TRACK.0, WIT_TRACK.1
        ));
    }
    Err("poolgate does not provide it to plugins (plugins get poolgate:policy/host and inert WASI 0.2 only)".into())
}

/// A reason the bytes are not a component at all, if they are not.
fn not_a_component(bytes: &[u8]) -> Option<String> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Some("not a WebAssembly file".into());
    }
    // Bytes 4..8: version and layer; a core module is version 1, layer 0.
    if bytes[4..8] == [1, 0, 0, 0] {
        return Some(
            "a core WebAssembly module, not a component: wrap it with \
             `poolgate-witgen component core.wasm -o plugin.wasm` (or `wasm-tools component new`)"
                .into(),
        );
    }
    None
}

/// Writes one import or export; `note` ends its first line.
fn write_item(
    out: &mut String,
    engine: &PolicyEngine,
    dir: &str,
    name: &str,
    item: &ComponentItem,
    body: bool,
    note: &str,
) -> Result<()> {
    match item {
        ComponentItem::ComponentInstance(inst) => {
            let funcs: Vec<(String, String)> = inst
                .exports(engine.engine())
                .filter_map(|(n, e)| match e.ty {
                    ComponentItem::ComponentFunc(f) => Some((n.to_string(), func_sig(&f))),
                    _ => None,
                })
                .collect();
            if !body || funcs.is_empty() {
                let what = match funcs.len() {
                    0 => "types only".to_string(),
                    1 => "1 function".to_string(),
                    n => format!("{n} functions"),
                };
                writeln!(out, "  {dir} {name}  ({what}){note}")?;
            } else {
                writeln!(out, "  {dir} {name} {{{note}")?;
                for (n, sig) in funcs {
                    writeln!(out, "    {n}: {sig};")?;
                }
                writeln!(out, "  }}")?;
            }
        }
        ComponentItem::ComponentFunc(f) => writeln!(out, "  {dir} {name}: {};{note}", func_sig(f))?,
        ComponentItem::Type(_) => writeln!(out, "  {dir} type {name};{note}")?,
        ComponentItem::Resource(_) => writeln!(out, "  {dir} resource {name};{note}")?,
        _ => writeln!(out, "  {dir} {name}{note}")?,
    }
    Ok(())
}

fn func_sig(f: &wasmtime::component::types::ComponentFunc) -> String {
    let params: Vec<String> = f.params().map(|(n, t)| format!("{n}: {}", type_name(&t))).collect();
    let results: Vec<String> = f.results().map(|t| type_name(&t)).collect();
    match results.len() {
        0 => format!("func({})", params.join(", ")),
        _ => format!("func({}) -> {}", params.join(", "), results.join(", ")),
    }
}

/// Record, enum and variant names of the host's WIT, keyed by their field or
/// case names (`record:id,now-ms,...`).
static NAMES: LazyLock<HashMap<String, String>> =
    LazyLock::new(|| wit_names(include_str!("../../../../wit/policy.wit")));

fn wit_names(wit: &str) -> HashMap<String, String> {
    let mut names = HashMap::new();
    let mut current: Option<(String, String, Vec<String>)> = None;
    for line in wit.lines().map(str::trim) {
        if line.starts_with("//") || line.is_empty() {
            continue;
        }
        if let Some((kind, name, members)) = &mut current {
            if line.starts_with('}') {
                names.insert(format!("{kind}:{}", members.join(",")), name.clone());
                current = None;
            } else {
                let member = line.split([':', ',', '(']).next().unwrap_or("").trim();
                members.push(member.to_string());
            }
            continue;
        }
        for kind in ["record", "enum", "variant"] {
            let Some(rest) = line.strip_prefix(kind).and_then(|r| r.strip_prefix(' ')) else { continue };
            let (name, body) = rest.split_once('{').unwrap_or((rest, ""));
            let name = name.trim().to_string();
            match body.split_once('}') {
                // One line: `enum level { trace, debug, info, warn, error }`.
                Some((inline, _)) => {
                    let members: Vec<&str> = inline.split(',').map(str::trim).filter(|m| !m.is_empty()).collect();
                    names.insert(format!("{kind}:{}", members.join(",")), name);
                }
                None => current = Some((kind.to_string(), name, Vec::new())),
            }
        }
    }
    names
}

fn named(kind: &str, members: Vec<&str>) -> Option<String> {
    NAMES.get(&format!("{kind}:{}", members.join(","))).cloned()
}

/// A WIT spelling of `t`, by name when the host's WIT has a type of that shape.
fn type_name(t: &Type) -> String {
    match t {
        Type::Bool => "bool".into(),
        Type::S8 => "s8".into(),
        Type::U8 => "u8".into(),
        Type::S16 => "s16".into(),
        Type::U16 => "u16".into(),
        Type::S32 => "s32".into(),
        Type::U32 => "u32".into(),
        Type::S64 => "s64".into(),
        Type::U64 => "u64".into(),
        Type::Float32 => "f32".into(),
        Type::Float64 => "f64".into(),
        Type::Char => "char".into(),
        Type::String => "string".into(),
        Type::List(l) => format!("list<{}>", type_name(&l.ty())),
        Type::Option(o) => format!("option<{}>", type_name(&o.ty())),
        Type::Result(r) => format!(
            "result<{}, {}>",
            r.ok().map_or_else(|| "_".to_string(), |t| type_name(&t)),
            r.err().map_or_else(|| "_".to_string(), |t| type_name(&t))
        ),
        Type::Tuple(t) => format!("tuple<{}>", t.types().map(|t| type_name(&t)).collect::<Vec<_>>().join(", ")),
        Type::Record(r) => {
            let fields: Vec<(&str, Type)> = r.fields().map(|f| (f.name, f.ty)).collect();
            named("record", fields.iter().map(|(n, _)| *n).collect()).unwrap_or_else(|| {
                let inner: Vec<String> = fields.iter().map(|(n, t)| format!("{n}: {}", type_name(t))).collect();
                format!("record {{ {} }}", inner.join(", "))
            })
        }
        Type::Enum(e) => {
            let cases: Vec<&str> = e.names().collect();
            named("enum", cases.clone()).unwrap_or_else(|| format!("enum {{ {} }}", cases.join(", ")))
        }
        Type::Variant(v) => {
            let cases: Vec<(String, Option<Type>)> = v.cases().map(|c| (c.name.to_string(), c.ty)).collect();
            named("variant", cases.iter().map(|(n, _)| n.as_str()).collect()).unwrap_or_else(|| {
                let inner: Vec<String> = cases
                    .iter()
                    .map(|(n, t)| t.as_ref().map_or_else(|| n.clone(), |t| format!("{n}({})", type_name(t))))
                    .collect();
                format!("variant {{ {} }}", inner.join(", "))
            })
        }
        Type::Flags(f) => format!("flags {{ {} }}", f.names().collect::<Vec<_>>().join(", ")),
        Type::Own(_) => "own<resource>".into(),
        Type::Borrow(_) => "borrow<resource>".into(),
        other => format!("{other:?}").to_lowercase(),
    }
}

fn human_size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_wit_types_are_named_by_their_fields() {
        let n = &*NAMES;
        assert_eq!(n.get("record:id,alias,primary").map(String::as_str), Some("account-info"));
        assert_eq!(n.get("enum:trace,debug,info,warn,error").map(String::as_str), Some("level"));
        assert!(n.values().any(|v| v == "outcome"), "variants are named too: {n:?}");
    }

    #[test]
    fn core_modules_and_other_files_are_told_apart() {
        assert!(not_a_component(b"hello world").unwrap().contains("not a WebAssembly file"));
        assert!(not_a_component(b"\0asm\x01\0\0\0").unwrap().contains("core WebAssembly module"));
        assert!(not_a_component(b"\0asm\x0d\0\x01\0").is_none());
    }
}
