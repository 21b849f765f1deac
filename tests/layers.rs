//! The layering of `src/` (docs/architecture.md): imports point down only. Each file's
//! `crate::…` paths, outside its test module and its comments, are read and resolved to the top module they name
//! (through the crate root's `pub use` re-exports); a path into a higher layer fails this test
//! with the file and the item. A child module using its own parent's items is not an import
//! across layers (`super::` is not read).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

/// Top modules of `src/`, highest first; the leaves share the lowest rank.
const LAYERS: &[(&str, u8)] = &[
    ("web", 5),
    ("cached", 5),
    ("cache", 5),
    ("lock", 4),
    ("wait", 3),
    ("store", 2),
    ("wire", 1),
    ("error", 0),
    ("sqlx_source", 0),
    ("time", 0),
    ("sync", 0),
    ("join", 0),
    ("options", 0),
    ("stats", 0),
    ("log", 0),
    ("random", 0),
    ("signal", 0),
    ("planted", 0),
];

fn rank(module: &str) -> Option<u8> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, r)| *r)
}

/// Every `.rs` file under `dir`, except the files that hold only tests.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name != "tests.rs" && !name.ends_with("_tests.rs") {
                out.push(path);
            }
        }
    }
}

/// The crate root's re-exports: a public name (`Cache`, `leader`) → the top module it lives in.
fn root_exports(lib: &str) -> HashMap<String, String> {
    let mut names = HashMap::new();
    for line in lib.lines().filter_map(|l| l.strip_prefix("pub use ")) {
        let line = line.trim_end_matches(';');
        let top = line.split("::").next().unwrap_or("").to_string();
        let items = match (line.find('{'), line.rfind('}')) {
            (Some(open), Some(close)) => line[open + 1..close].to_string(),
            _ => line.rsplit("::").next().unwrap_or("").to_string(),
        };
        for item in items.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            names.insert(item.to_string(), top.clone());
        }
    }
    names
}

/// The names a file reaches with `crate::`: the first segment after each `crate::`, and each
/// item of a `crate::{…}` group.
fn crate_paths(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for item in group.split(',') {
                let first = item.trim().split("::").next().unwrap_or("").trim();
                if !first.is_empty() {
                    found.push(first.to_string());
                }
            }
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            found.push(rest[..end].to_string());
        }
    }
    found
}

/// The file's code before its test module (tests may build on anything), without comments:
/// a doc link to a higher layer's item (`[`Cache`](crate::Cache)`) is no import.
fn code_only(code: &str) -> String {
    let code = match code.find("#[cfg(test)]") {
        Some(at) => &code[..at],
        None => code,
    };
    code.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn imports_point_down_the_layers_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs");
    let exports = root_exports(&lib);
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut upward = Vec::new();
    let mut checked = 0;
    for file in files {
        let relative = file.strip_prefix(&src).expect("under src/");
        let top = relative
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .unwrap_or("")
            .trim_end_matches(".rs")
            .to_string();
        if top == "lib" {
            continue;
        }
        let own = rank(&top).unwrap_or_else(|| {
            panic!("src/{top} is in no layer: add it to LAYERS here and to docs/architecture.md")
        });
        let code = fs::read_to_string(&file).expect("a source file");
        for name in crate_paths(&code_only(&code)) {
            let target = exports.get(&name).cloned().unwrap_or_else(|| name.clone());
            let Some(their) = rank(&target) else {
                continue; // a macro or an item of the root itself
            };
            checked += 1;
            if their > own {
                upward.push(format!(
                    "src/{} ({top}) uses crate::{name} ({target})",
                    relative.display()
                ));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} crate paths read: is the parser still right?"
    );
    assert!(
        upward.is_empty(),
        "imports that point up the layers (docs/architecture.md):\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_parser_finds_groups_and_paths() {
    let code = "use crate::{Cache, Error};\nlet x = crate::store::wakeup::lock(&m);";
    assert_eq!(crate_paths(code), ["Cache", "Error", "store"]);
    let exports = root_exports("pub use cache::Cache;\npub use error::{ComputeError, Error};");
    assert_eq!(exports["Cache"], "cache");
    assert_eq!(exports["Error"], "error");
}
