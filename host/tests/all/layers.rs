//! The gateway crate's architecture, held: its top-level modules form layers
//! that only ever import downwards, and no two source files import each
//! other through a chain (no import circle), so a lower layer never reaches up
//! into a higher one and every module can be read, and tested, below what
//! uses it. Read from the source (`use crate::…`, `super::…`, `self::…`
//! paths); a unit test module (`#[cfg(test)] mod tests`) may use its parent
//! and is left out. And no hand-written source file in the workspace grows
//! past 600 lines (the generated WIT glue is the one named exception).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first. A module may use its own layer's and lower
/// layers' modules only.
const LAYERS: &[&[&str]] = &[
    // Leaves: the time, outbound HTTPS, ids, the account model, the embedded plugins.
    &["clock", "https", "random", "account", "artifacts"],
    // The plugin runtime.
    &["policy"],
    &["case", "metrics"],
    // The usage ledger: entries, prices, stores; plain values in.
    &["ledger"],
    // Traces: spans from plain records, a bounded queue, the OTLP exporter.
    &["telemetry"],
    &["fixtures"],
    // Subscription seats: plain values in, no gateway.
    &["oauth"],
    &["config"],
    &["logs"],
    // What the gateway knows about accounts.
    &["learned"],
    // Replicas sharing it.
    &["shared"],
    // Routing and serving.
    &["gateway"],
    // The demo's simulated upstream, built from the gateway's parts.
    &["sim"],
    // The policy simulator: real gateways over the simulated accounts.
    &["simulate"],
    // The fuzzing entry points: they drive parts of every layer; nothing uses them.
    &["fuzzing"],
    // The command line.
    &["cli", "lib", "main"],
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every source file by module path (`gateway::request`; `lib` for lib.rs).
fn modules() -> BTreeMap<Vec<String>, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<Vec<String>, String>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(root).unwrap().with_extension("");
                let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
                if parts.len() > 1 && parts.last().is_some_and(|l| l == "mod") {
                    parts.pop();
                }
                out.insert(parts, code_of(&std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&src(), &src(), &mut out);
    out
}

/// The code of a file without comments, string literals and its unit tests.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if escaped {
                        escaped = false;
                    } else if c == '\\' {
                        escaped = true;
                    } else if c == '"' {
                        break;
                    }
                }
                out.push_str("\"\"");
            }
            c => out.push(c),
        }
    }
    out
}

/// Every path a use tree names: `a::{b, c::{d, e}}` → `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    // `x as y` names x; whitespace means nothing in a path.
    let mut words = tree.split_whitespace();
    let mut tree = String::new();
    while let Some(w) = words.next() {
        if w == "as" {
            let alias = words.next().unwrap_or("");
            // `a as b,` or `a as b}`: keep the punctuation after the alias.
            tree.extend(alias.chars().filter(|c| matches!(c, ',' | '}')));
        } else {
            tree.push_str(w);
        }
    }
    let Some(open) = tree.find('{') else { return vec![tree] };
    let (head, rest) = (&tree[..open], &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())]);
    let (mut items, mut depth, mut from) = (Vec::new(), 0, 0);
    for (i, c) in rest.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&rest[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    items.push(&rest[from..]);
    items.into_iter().filter(|i| !i.is_empty()).flat_map(|i| expand(&format!("{head}{i}"))).collect()
}

/// The `crate::`, `super::` and `self::` paths of `code`: its use trees,
/// expanded, and the paths written inline.
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut rest = String::with_capacity(code.len());
    let mut out = Vec::new();
    let mut text = code;
    while let Some(at) = text.find("use ") {
        let starts_word =
            at == 0 || !text.as_bytes()[at - 1].is_ascii_alphanumeric() && text.as_bytes()[at - 1] != b'_';
        rest.push_str(&text[..at]);
        let Some(end) = text[at..].find(';').map(|e| at + e) else { break };
        if starts_word {
            out.extend(expand(&text[at + 4..end]).into_iter().map(|p| p.split("::").map(str::to_string).collect()));
            text = &text[end + 1..];
        } else {
            rest.push_str(&text[at..at + 4]);
            text = &text[at + 4..];
        }
    }
    rest.push_str(text);
    let bytes = rest.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        if !ident(bytes[i]) || (i > 0 && (ident(bytes[i - 1]) || bytes[i - 1] == b':')) {
            i += 1;
            continue;
        }
        let mut path = Vec::new();
        let mut j = i;
        loop {
            let s = j;
            while j < bytes.len() && ident(bytes[j]) {
                j += 1;
            }
            path.push(rest[s..j].to_string());
            if rest[j..].starts_with("::") && j + 2 < bytes.len() && ident(bytes[j + 2]) {
                j += 2;
            } else {
                break;
            }
        }
        i = j;
        // A bare `super` or `self` is a visibility (`pub(super)`) or a receiver.
        if path.len() > 1 {
            out.push(path);
        }
    }
    out
}

/// The module files `code` (the file of `module`) names by path.
fn imports(module: &[String], code: &str, files: &BTreeMap<Vec<String>, String>) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    for path in paths(code) {
        let base: Vec<String> = match path[0].as_str() {
            "crate" => Vec::new(),
            // A mod.rs is its directory's module, so for every file `super`
            // is the module one up.
            "super" => module[..module.len().saturating_sub(1)].to_vec(),
            "self" => module.to_vec(),
            _ => continue,
        };
        let mut full = base;
        full.extend(path[1..].iter().filter(|p| *p != "self" && *p != "*").cloned());
        // The longest prefix that is a module file.
        if let Some(n) = (1..=full.len()).rev().find(|&n| files.contains_key(&full[..n])) {
            let target = full[..n].to_vec();
            if target != module {
                out.insert(target);
            }
        }
    }
    out
}

fn layer_of(module: &[String]) -> usize {
    let top = module.first().map_or("lib", String::as_str);
    LAYERS.iter().position(|l| l.contains(&top)).unwrap_or_else(|| panic!("`{top}` is in no layer of {LAYERS:?}"))
}

#[test]
fn every_module_imports_only_its_own_layer_and_below() {
    let files = modules();
    let mut upward = Vec::new();
    for (module, code) in &files {
        for target in imports(module, code, &files) {
            if layer_of(&target) > layer_of(module) {
                upward.push(format!("{} -> {}", module.join("::"), target.join("::")));
            }
        }
    }
    assert!(upward.is_empty(), "imports that reach up a layer:\n{}", upward.join("\n"));
}

#[test]
fn no_source_files_import_each_other_in_a_circle() {
    let files = modules();
    let graph: BTreeMap<&Vec<String>, BTreeSet<Vec<String>>> =
        files.iter().map(|(m, code)| (m, imports(m, code, &files))).collect();
    // A file in a circle reaches itself.
    let mut circles = BTreeSet::new();
    for start in graph.keys() {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<&Vec<String>> = graph[start].iter().collect();
        while let Some(m) = stack.pop() {
            if m == *start {
                circles.insert(start.join("::"));
                break;
            }
            if seen.insert(m.clone()) {
                stack.extend(graph.get(m).into_iter().flatten());
            }
        }
    }
    assert!(circles.is_empty(), "files in import circles: {circles:?}");
}

/// Inside the gateway, the HTTP surface (`gateway::http`: the listener, the
/// connection guard, the routes) is the top: the request's phases, the
/// generations and reloads below it never reach up into it.
#[test]
fn nothing_in_the_gateway_reaches_up_into_its_http_surface() {
    let files = modules();
    let http = ["gateway".to_string(), "http".to_string()];
    let mut upward = Vec::new();
    for (module, code) in files.iter().filter(|(m, _)| m.first().is_some_and(|t| t == "gateway")) {
        if module.starts_with(&http) {
            continue;
        }
        for target in imports(module, code, &files).into_iter().filter(|t| t.starts_with(&http)) {
            upward.push(format!("{} -> {}", module.join("::"), target.join("::")));
        }
    }
    assert!(upward.is_empty(), "imports that reach up into gateway::http:\n{}", upward.join("\n"));
}

#[test]
fn the_reader_sees_its_own_mistakes() {
    // The reader itself: a path in a comment or a string is no import; an
    // import through `super` from a mod.rs is its parent's.
    let mut files = BTreeMap::new();
    for m in [vec!["gateway".to_string()], vec!["gateway".into(), "proxy".into()], vec!["learned".into()]] {
        files.insert(m, String::new());
    }
    let code = code_of(
        "// crate::gateway\nlet s = \"crate::gateway\";\nuse super::{proxy::{A, B}, self as g};\nlet x = crate::learned::X;\n",
    );
    let got = imports(&["gateway".into(), "attempt".into()], &code, &files);
    let want: BTreeSet<Vec<String>> =
        [vec!["gateway".to_string()], vec!["gateway".into(), "proxy".into()], vec!["learned".into()]]
            .into_iter()
            .collect();
    assert_eq!(got, want);
}

/// The one source file allowed past [`LONGEST_FILE`] lines: the SDK's WIT
/// glue, generated ahead of time (and checked current by `tools/witgen`'s
/// test) because the SDK has no dependencies and no build script — a plugin
/// that carries a copy of it builds offline against an empty registry.
const GENERATED: &[&str] = &["sdk/src/bindings.rs"];

/// A module past this many lines is doing more than one thing: split it by
/// concern (the style the project holds itself to).
const LONGEST_FILE: usize = 600;

#[test]
fn no_hand_written_source_file_is_longer_than_the_limit() {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(String, usize)>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if !matches!(name.as_str(), "target" | "node_modules" | ".git") && !name.starts_with('.') {
                    walk(&path, root, out);
                }
            } else if name.ends_with(".rs") {
                let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                let lines = std::fs::read_to_string(&path).map_or(0, |t| t.lines().count());
                if lines > LONGEST_FILE && !GENERATED.contains(&rel.as_str()) {
                    out.push((rel, lines));
                }
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut long = Vec::new();
    for top in ["host", "sdk", "wire", "plugins", "tests", "bench", "tools", "examples"] {
        if root.join(top).is_dir() {
            walk(&root.join(top), root, &mut long);
        }
    }
    assert!(long.is_empty(), "over {LONGEST_FILE} lines, split by concern: {long:?}");
    for g in GENERATED {
        assert!(root.join(g).is_file(), "{g} is named as generated but is not there");
    }
}
