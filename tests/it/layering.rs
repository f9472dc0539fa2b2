//! The module structure, read from the sources: every `crate::` path in `src/` is an arrow from
//! the top-level module whose file holds it to the module it names, and every arrow points down
//! the layers below. A cycle between two modules, or an arrow up, fails with the file and the
//! path that makes it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The library's top-level modules, from the bottom up: a module may use only those before it
/// (modules on one line do not use each other). ARCHITECTURE.md draws the same layers.
const LAYERS: &[&[&str]] = &[
    &["error", "json", "sync", "schema"],
    &["store"],
    &["policy"],
    &["tool"],
    &["dispatch"],
    &["engine"],
    &["ledger"],
    &["script"],
    &["speculate"],
    &["report"],
    &["runtime"],
    &["mcp"],
    &["manifest", "bench"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to: `src/dispatch/budget.rs` is in `dispatch`.
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).expect("a file under src/");
    let first = relative.components().next().expect("a path");
    first
        .as_os_str()
        .to_string_lossy()
        .trim_end_matches(".rs")
        .to_string()
}

/// `(from, to) -> where`, for every `crate::to` in a file of `from`, outside comments.
fn arrows(src: &Path) -> BTreeMap<(String, String), String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut arrows = BTreeMap::new();
    for file in files {
        let from = module_of(src, &file);
        if from == "lib" || from == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("a readable source file");
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            assert!(
                !code.contains("crate::{"),
                "{}:{}: name the module of each `crate::` path (`crate::{{..}}` hides the arrows)",
                file.display(),
                number + 1
            );
            for (i, _) in code.match_indices("crate::") {
                let to: String = code[i + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !to.is_empty() && to != from {
                    arrows
                        .entry((from.clone(), to))
                        .or_insert_with(|| format!("{}:{}", file.display(), number + 1));
                }
            }
        }
    }
    arrows
}

#[test]
fn modules_form_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let arrows = arrows(&src);
    assert!(
        arrows.len() > 20,
        "the scan found the modules' arrows: {arrows:?}"
    );
    let mut problems = Vec::new();
    for ((from, to), at) in &arrows {
        match (layer_of(from), layer_of(to)) {
            (Some(a), Some(b)) if b < a => {}
            (Some(_), Some(_)) => problems.push(format!(
                "{at}: `{from}` uses `{to}`, which is not below it in the layers"
            )),
            _ => problems.push(format!(
                "{at}: `{from}` -> `{to}`: a module missing from LAYERS"
            )),
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The check above can fail: an arrow up the layers is found.
#[test]
fn an_arrow_up_the_layers_is_found() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("tool")).unwrap();
    std::fs::write(
        dir.path().join("tool/mod.rs"),
        "// crate::runtime in a comment does not count\nuse crate::dispatch::Call;\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("dispatch.rs"), "use crate::tool::Tool;\n").unwrap();
    let found = arrows(dir.path());
    let keys: Vec<_> = found.keys().cloned().collect();
    assert_eq!(
        keys,
        [
            ("dispatch".to_string(), "tool".to_string()),
            ("tool".to_string(), "dispatch".to_string())
        ]
    );
    assert!(layer_of("tool") < layer_of("dispatch"));
}

/// Every source file of `src/`, with its path relative to `src/` and its code lines (comments
/// dropped).
fn sources() -> Vec<(String, Vec<String>)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .into_iter()
        .map(|file| {
            let text = std::fs::read_to_string(&file).expect("a readable source file");
            let code = text
                .lines()
                .map(|l| l.split("//").next().unwrap_or_default().to_string())
                .collect();
            let name = file
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .to_string();
            (name, code)
        })
        .collect()
}

/// The files of `src/` whose code contains `needle`.
fn files_with(needle: &str) -> Vec<String> {
    let mut found: Vec<String> = sources()
        .into_iter()
        .filter(|(_, code)| code.iter().any(|l| l.contains(needle)))
        .map(|(name, _)| name)
        .collect();
    found.sort();
    found
}

/// Only the dispatch path calls a tool body: a body is a field `body` of a registered tool,
/// called as `(tool.body)(..)`.
#[test]
fn tool_bodies_are_called_only_by_the_dispatch_path() {
    assert_eq!(files_with(".body)("), ["dispatch/mod.rs"]);
}

/// The executor never sees a placeholder: the type lives in `speculate/` and nowhere else
/// names it.
#[test]
fn placeholders_exist_only_in_the_scout() {
    for file in files_with("Placeholder") {
        assert!(file.starts_with("speculate/"), "{file} names placeholders");
    }
}
