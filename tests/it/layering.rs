//! The module structure, read from the sources: every `crate::` path in the library's files of
//! `src/` is an arrow from the top-level module whose file holds it to the module it names, and
//! every arrow points down the layers below. A cycle between two modules, or an arrow up, fails
//! with the file and the path that makes it. The binary's modules (`main.rs` and `cli/`) are
//! apart: they reach the library through its public API alone.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The library's top-level modules, from the bottom up: a module may use only those before it
/// (modules on one line do not use each other). ARCHITECTURE.md draws the same layers.
const LAYERS: &[&[&str]] = &[
    &["error", "effect", "json", "sync", "schema", "rhai_ast"],
    &["children", "secrets"],
    &["store"],
    &["policy", "guard", "plan"],
    &["tool"],
    &["files", "commands"],
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

/// The binary's top-level modules: `main.rs` and the subcommands it declares. They are another
/// crate, so `crate::` in them is the binary's root, never the library.
const BINARY: &[&str] = &["main", "cli"];

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
        if from == "lib" || BINARY.contains(&from.as_str()) {
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
/// called as `tool.body.call(..)`.
#[test]
fn tool_bodies_are_called_only_by_the_dispatch_path() {
    assert_eq!(files_with(".body.call("), ["dispatch/mod.rs"]);
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

/// What a binary module's file breaks of the rule that the binary uses the library's public API
/// alone: a `crate::` path that leaves the binary's modules, or a `#[path]` that compiles a
/// library file into the binary.
fn binary_problems(name: &str, code: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    for (number, line) in code.iter().enumerate() {
        for (i, _) in line.match_indices("crate::") {
            let to: String = line[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if !BINARY.contains(&to.as_str()) {
                problems.push(format!(
                    "{name}:{}: `crate::{to}` is not the binary's; use `toolscript::`",
                    number + 1
                ));
            }
        }
        if line.contains("#[path") {
            problems.push(format!(
                "{name}:{}: `#[path]` compiles another file into the binary",
                number + 1
            ));
        }
    }
    problems
}

/// The binary's modules (`main.rs`, `cli/`) use the library through its public API alone, and
/// the library never declares them: the command line's words stay out of the library.
#[test]
fn binary_modules_use_the_library_s_public_api_only() {
    let sources = sources();
    let binary: Vec<&(String, Vec<String>)> = sources
        .iter()
        .filter(|(name, _)| name == "main.rs" || name.starts_with("cli/"))
        .collect();
    assert!(
        binary.iter().any(|(name, _)| name == "cli/mod.rs"),
        "the subcommands live in src/cli/"
    );
    let problems: Vec<String> = binary
        .iter()
        .flat_map(|(name, code)| binary_problems(name, code))
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let (_, main) = binary.iter().find(|(name, _)| name == "main.rs").unwrap();
    assert!(
        main.iter().any(|l| l.trim() == "mod cli;"),
        "main.rs declares `cli`"
    );
    for (name, code) in &sources {
        if BINARY.iter().any(|m| name.starts_with(m)) {
            continue;
        }
        assert!(
            !code
                .iter()
                .any(|l| l.trim() == "mod cli;" || l.contains("crate::cli::")),
            "{name}: the library names the binary's `cli`"
        );
    }
}

/// The check above can fail: a subcommand reaching into the library is found.
#[test]
fn a_binary_module_reaching_into_the_library_is_found() {
    let code = vec![
        "use crate::cli::report;".to_string(),
        "use crate::dispatch::Budget;".to_string(),
        "#[path = \"../dispatch/mod.rs\"] mod dispatch;".to_string(),
    ];
    let problems = binary_problems("cli/run.rs", &code);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].starts_with("cli/run.rs:2: `crate::dispatch`"),
        "{problems:?}"
    );
    assert!(
        problems[1].starts_with("cli/run.rs:3: `#[path]`"),
        "{problems:?}"
    );
}
