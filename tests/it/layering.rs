//! The module structure, read from the sources: every `crate::` path in `src/` is an arrow from
//! the top-level module whose file holds it to the module it names, and every arrow points down
//! the layers below. A cycle between two modules, or an arrow up, fails with the file and the
//! path that makes it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The library's top-level modules, from the bottom up: a module may use only those before it
/// (modules on one line do not use each other). ARCHITECTURE.md draws the same layers.
const LAYERS: &[&[&str]] = &[
    &["error", "json", "sync", "rhai_ast"],
    &["store"],
    &["policy"],
    &["tool"],
    &["dispatch"],
    &["engine"],
    &["ledger"],
    &["script"],
    &["speculate"],
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

/// Rhai's internal items: the AST it exports behind `internals` and the runtime state a native
/// function can run statements in. They change between Rhai releases, so one module,
/// `src/rhai_ast/`, holds every use of them.
const RHAI_INTERNALS: &[&str] = &[
    "ASTNode",
    "ASTFlags",
    "BinaryExpr",
    "Caches",
    "ConditionalExpr",
    "CustomExpr",
    "Expr",
    "FlowControl",
    "FnCallExpr",
    "FnCallHashes",
    "GlobalRuntimeState",
    "Ident",
    "OpAssignment",
    "ScriptFuncDef",
    "Stmt",
    "StmtBlock",
    "SwitchCasesCollection",
    "TryCatchBlock",
    "eval_statements_raw",
    "global_runtime_state",
    "global_runtime_state_mut",
    "iter_fn_def",
];

/// `file:line: name` for every Rhai internal item named in the code (comments dropped) of a
/// file under `src` outside `src/rhai_ast/`.
fn rhai_internals_outside_rhai_ast(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut found = Vec::new();
    for file in files {
        if module_of(src, &file) == "rhai_ast" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("a readable source file");
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for word in code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if RHAI_INTERNALS.contains(&word) {
                    found.push(format!("{}:{}: {word}", file.display(), number + 1));
                }
            }
        }
    }
    found
}

/// Only `src/rhai_ast/` names Rhai's internal AST types, `eval_statements_raw` or the
/// runtime state; everything else reads and edits scripts through its API.
#[test]
fn rhai_internals_stay_in_rhai_ast() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = rhai_internals_outside_rhai_ast(&src);
    assert!(
        found.is_empty(),
        "Rhai internals outside src/rhai_ast/ (use its API, or extend it):\n{}",
        found.join("\n")
    );
}

/// The check above can fail: a use of an internal item outside the module is found, with its
/// file and line, and one inside it, in a comment or in a longer name is not.
#[test]
fn a_rhai_internal_outside_rhai_ast_is_found() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("rhai_ast")).unwrap();
    std::fs::create_dir_all(dir.path().join("script")).unwrap();
    std::fs::write(
        dir.path().join("rhai_ast/mod.rs"),
        "use rhai::{Expr, Stmt};\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("script/check.rs"),
        "// Stmt in a comment does not count\nuse rhai::{ASTNode, Engine};\nlet e: Expression = x;\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("run.rs"),
        "fn f() { engine.eval_statements_raw(g, c, s, b); }\n",
    )
    .unwrap();
    let found = rhai_internals_outside_rhai_ast(dir.path());
    let found: Vec<String> = found
        .iter()
        .map(|f| {
            f.strip_prefix(&dir.path().display().to_string())
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        found,
        [
            "/run.rs:1: eval_statements_raw",
            "/script/check.rs:2: ASTNode"
        ]
    );
}
