//! Every built-in plugin passes its own fixtures (`plugins/<name>/fixtures`)
//! through the real WASM path, and ships at least a few.

use crate::common;

use std::path::Path;

#[test]
fn every_builtin_passes_its_fixtures() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins");
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for (name, _) in poolgate::artifacts::BUILTINS {
        let dir = root.join(name).join("fixtures");
        match poolgate::fixtures::assert_fixtures(&common::ENGINE, &format!("builtin:{name}"), &dir) {
            Ok(n) if n >= 5 => report.push(format!("{name}: {n} cases")),
            Ok(n) => failures.push(format!("{name}: only {n} fixture cases")),
            Err(e) => failures.push(format!("{name}: {e:#}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    eprintln!("{}", report.join("\n"));
}
