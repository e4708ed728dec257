//! The engine's layers (docs/DESIGN.md 5.1) import downwards only.
//!
//! Each layer is a folder of `src/`; a file in one may name (`crate::<module>`) a layer below
//! it, a module shared by all (errors, ids, counters), or itself, never a layer above. The
//! order, bottom to top: `vdev` (devices, allocation, raidz), `zio` (the pipeline), `spa` (the
//! pool: txgs, space, import, the sync driver), `dmu` (objects and their block trees), `dsl`
//! (datasets and the scan), `zil` (the intent log), `zvol` (volumes), then `pool.rs` (the
//! facade that wires the layers together). A test that fails here names the file and the
//! import that points up.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The layers from the bottom up; a layer may import those before it.
const LAYERS: &[&str] = &["vdev", "zio", "spa", "dmu", "dsl", "zil", "zvol", "pool"];

/// Modules at the root of `src/` that any layer may use, with the lowest layer each one
/// itself imports (a shared module must not pull a layer up into one below it).
const SHARED: &[(&str, Option<&str>)] = &[
    ("error", None),
    ("idhash", None),
    ("iostats", None),
    ("cachefile", None),
    // Properties name the vdev queue's scheduler and the pipeline's completion policy, so
    // only layers from zio up may use them.
    ("props", Some("zio")),
    ("sector_mask", Some("zio")),
];

fn rank(layer: &str) -> Option<usize> {
    LAYERS.iter().position(|l| *l == layer)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The first path segment after every `crate::` in `text`, including each member of a
/// `crate::{a, b::c}` group.
fn crate_heads(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for member in group[..end].split(',') {
                let head = member.trim().split("::").next().unwrap_or("").trim();
                if !head.is_empty() {
                    found.insert(head.to_string());
                }
            }
        } else {
            let head: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            found.insert(head);
        }
    }
    found
}

/// Root re-exports that come from upper layers must not be used below them: a lower layer
/// naming `crate::Volume` would hide an upward import behind the root.
const UPPER_ROOT_NAMES: &[(&str, &str)] = &[("Pool", "pool"), ("Volume", "zvol")];

/// The module `head` stands for: a root re-export (an upper-case name) of an upper layer is
/// that layer; any other root re-export is the crate's public face (`lib`), allowed
/// everywhere; a lower-case name is the module itself.
fn classify(head: &str) -> String {
    if let Some((_, layer)) = UPPER_ROOT_NAMES.iter().find(|(name, _)| *name == head) {
        return layer.to_string();
    }
    if head.chars().next().is_some_and(|c| c.is_ascii_uppercase()) {
        "lib".to_string()
    } else {
        head.to_string()
    }
}

fn crate_modules(text: &str) -> BTreeSet<String> {
    crate_heads(text).iter().map(|h| classify(h)).collect()
}

/// Drops line comments and doc comments, whose intra-doc links may name any layer.
fn code_only(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(at) => &l[..at],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn engine_layers_import_downwards_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut violations = Vec::new();
    let mut layered = 0;
    for file in &files {
        let rel = file.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap();
        let layer = first.strip_suffix(".rs").unwrap_or(first);
        let text = code_only(&fs::read_to_string(file).unwrap());
        let own = match (rank(layer), SHARED.iter().find(|(m, _)| *m == layer)) {
            (Some(r), _) => r,
            // A shared module may import only up to its stated floor.
            (None, Some((_, floor))) => match floor {
                Some(f) => rank(f).unwrap(),
                None => 0,
            },
            (None, None) => {
                assert_eq!(layer, "lib", "{}: a root module in no layer", rel.display());
                continue;
            }
        };
        layered += 1;
        for module in crate_modules(&text) {
            if module == "lib" || module == layer {
                continue;
            }
            let allowed = match (rank(&module), SHARED.iter().find(|(m, _)| *m == module)) {
                (Some(r), _) => r <= own,
                (None, Some((_, floor))) => floor.is_none_or(|f| rank(f).unwrap() <= own),
                (None, None) => false,
            };
            if !allowed {
                violations.push(format!("{}: crate::{module}", rel.display()));
            }
        }
    }
    // The walk found the layers at all (a moved `src/` would make this test pass vacuously).
    assert!(
        layered > 30,
        "only {layered} layered files found under {}",
        src.display()
    );
    assert!(
        violations.is_empty(),
        "imports pointing up a layer (order {LAYERS:?}):\n  {}",
        violations.join("\n  ")
    );
}

#[test]
fn the_scanner_sees_grouped_and_single_imports() {
    let text = "use crate::spa::Spa;\nuse crate::{dmu::tree, EngineError, zil::Zil};\n";
    let found: Vec<String> = crate_modules(text).into_iter().collect();
    assert_eq!(found, ["dmu", "lib", "spa", "zil"]);
    let found: Vec<String> = crate_modules("use crate::{EngineError, Volume};")
        .into_iter()
        .collect();
    assert_eq!(found, ["lib", "zvol"]);
    let found: Vec<String> = crate_modules("use crate::VolumeStats;")
        .into_iter()
        .collect();
    assert_eq!(found, ["lib"]);
}
