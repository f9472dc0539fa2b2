//! `check` has no false positives: every script in the project that runs to its end passes
//! `check` without an error. The corpus is every `.rhai` file under `scripts/` (on the demo
//! catalog and the bench catalog) and every string literal in the integration tests, the
//! benches and the examples that compiles as a script (on the fixture catalog).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use futures::StreamExt;
use toolscript::{Limits, Manifests, Mode, Problem, Runtime, Severity};

use crate::support::{fixture_registry, run_in, Probe};

/// The text of every string literal in Rust source `text`: `"…"` with its escapes, raw
/// `r#"…"#`; comments and character literals skipped.
fn string_literals(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match (chars[i], chars.get(i + 1).copied()) {
            ('/', Some('/')) => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            ('\'', _) => {
                // A character literal ('x', '\n', '"'); a lifetime has no closing quote.
                let close = chars[i + 1..]
                    .iter()
                    .take(12)
                    .position(|&c| c == '\'')
                    .map(|p| i + 1 + p);
                i = match close {
                    Some(c) if chars[i + 1] == '\\' || c == i + 2 => c + 1,
                    _ => i + 1,
                };
            }
            ('r', Some('#' | '"')) if i == 0 || !chars[i - 1].is_alphanumeric() => {
                let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
                let start = i + 1 + hashes;
                if chars.get(start) != Some(&'"') {
                    i += 1;
                    continue;
                }
                let mut j = start + 1;
                while j < chars.len() {
                    if chars[j] == '"'
                        && chars[j + 1..]
                            .iter()
                            .take(hashes)
                            .filter(|&&c| c == '#')
                            .count()
                            == hashes
                    {
                        break;
                    }
                    j += 1;
                }
                out.push(chars[start + 1..j.min(chars.len())].iter().collect());
                i = j + 1 + hashes;
            }
            ('"', _) => {
                let mut s = String::new();
                let mut j = i + 1;
                while j < chars.len() && chars[j] != '"' {
                    if chars[j] == '\\' {
                        j += 1;
                        match chars.get(j) {
                            Some('n') => s.push('\n'),
                            Some('t') => s.push('\t'),
                            Some('r') => s.push('\r'),
                            Some('0') => s.push('\0'),
                            Some('\n') => {
                                while chars.get(j + 1).is_some_and(|c| c.is_whitespace()) {
                                    j += 1;
                                }
                            }
                            Some('u') => {
                                let close = chars[j..].iter().position(|&c| c == '}').unwrap_or(0);
                                let hex: String = chars[j + 2..j + close].iter().collect();
                                if let Some(c) =
                                    u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32)
                                {
                                    s.push(c);
                                }
                                j += close;
                            }
                            Some(&c) => s.push(c),
                            None => {}
                        }
                    } else {
                        s.push(chars[j]);
                    }
                    j += 1;
                }
                out.push(s);
                i = j + 1;
            }
            _ => i += 1,
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn rhai_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rhai_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rhai") {
            out.push(path);
        }
    }
}

/// Short limits: some scripts of the corpus run into a limit on purpose.
fn limits() -> Limits {
    let mut limits = Limits::default();
    limits.set("timeout_s", 1.0).unwrap();
    limits.set("max_operations", 200_000.0).unwrap();
    limits
}

/// What `script` gives on one runtime: `None` when it does not run to its end, else the errors
/// `check` reports for it there (and the missing fields it warns about that the run did not
/// find missing).
async fn verdict(runtime: &Runtime, script: &str) -> Option<Vec<Problem>> {
    runtime.compile(script).ok()?;
    // Speculative, which gives what a sequential run gives, sooner.
    let outcome = run_in(runtime, script, Mode::Speculative).await;
    outcome.result.as_ref().ok()?;
    let problems = runtime.check(script).expect("it compiled");
    // A missing field `check` warns about is real only if the run, which ran to its end, read
    // it missing there too.
    let warned: HashSet<(Option<usize>, Option<usize>)> = outcome
        .warnings
        .iter()
        .map(|w| (w.line, w.column))
        .collect();
    Some(
        problems
            .into_iter()
            .filter(|p| {
                p.severity == Severity::Error
                    || (p.message.contains("has no field") && !warned.contains(&(p.line, p.column)))
            })
            .collect(),
    )
}

/// Whether `script` runs to its end on one of `runtimes`; if it does, `check` must pass it on
/// one of those where it does. (On another catalog it may run to its end only because it
/// catches the error of a tool that catalog does not have, which `check` rightly reports.)
///
/// A script of a test may call a tool of that test's own catalog, or give a tool an argument its
/// schema refuses, and catch the error: `check` is right to report those, and they are left out
/// (`local_tools` are the tools the tests declare).
async fn no_false_positive(
    runtimes: &[&Runtime],
    local_tools: &HashSet<String>,
    script: &str,
    origin: &str,
) -> bool {
    let mut reports = Vec::new();
    for runtime in runtimes {
        if let Some(errors) = verdict(runtime, script).await {
            if errors.is_empty() {
                return true;
            }
            reports.push(errors);
        }
    }
    let caught = |p: &Problem| {
        p.kind == "invalid_input"
            || (p.kind == "unknown_tool"
                && p.message
                    .split('`')
                    .nth(1)
                    .is_some_and(|name| local_tools.contains(name)))
    };
    let wrong: Vec<&Problem> = reports.iter().flatten().filter(|p| !caught(p)).collect();
    assert!(
        reports.is_empty() || reports.iter().any(|r| r.iter().all(caught)),
        "{origin}: `check` reports errors for a script that runs to its end:\n{script}\n{wrong:#?}"
    );
    false
}

/// The tools the tests declare in their own catalogs (`Tool::builder("name"`, `name = "name"`),
/// and the names they call on purpose to see them refused.
fn local_tools(files: &[PathBuf]) -> HashSet<String> {
    let mut names: HashSet<String> = ["nope", "eval_statements_raw"]
        .into_iter()
        .map(String::from)
        .collect();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap();
        for marker in ["builder(\"", "approved(\"", "name = \"", "name = \\\""] {
            for (at, _) in text.match_indices(marker) {
                let rest = &text[at + marker.len()..];
                if let Some(end) = rest.find(['"', '\\']) {
                    names.insert(rest[..end].to_string());
                }
            }
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_passes_every_script_of_the_project_that_runs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let probe = Probe::default();
    let fixture = Runtime::builder(fixture_registry(&probe))
        .limits(limits())
        .build();
    let demo = Runtime::builder(toolscript::demo_catalog().unwrap())
        .limits(limits())
        .build();
    let mut bench = Manifests::new();
    bench
        .load_file(&root.join("scripts/bench/catalog.toml"))
        .unwrap();
    let bench = Runtime::builder(bench.into_registry().unwrap())
        .limits(limits())
        .build();
    let runtimes = [&fixture, &demo, &bench];
    let mut files = Vec::new();
    for dir in ["tests", "benches", "examples"] {
        rust_files(&root.join(dir), &mut files);
    }
    files.sort();
    let local = local_tools(&files);
    // (origin, script, whether it is a file of `scripts/`)
    let mut corpus = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, script) in string_literals(&text).into_iter().enumerate() {
            // A literal that is a word or a sentence is not a script.
            if script.contains(['(', ';', '=']) {
                corpus.push((format!("{} (literal {n})", file.display()), script, false));
            }
        }
    }
    let mut scripts = Vec::new();
    rhai_files(&root.join("scripts"), &mut scripts);
    scripts.sort();
    for path in &scripts {
        let script = std::fs::read_to_string(path).unwrap();
        corpus.push((path.display().to_string(), script, true));
    }
    let literals = corpus.iter().filter(|(_, _, file)| !file).count();
    // Most of the time is spent waiting for tools' latencies and deadlines: several at once.
    let verdicts: Vec<(bool, bool)> = futures::stream::iter(&corpus)
        .map(|(origin, script, file)| {
            let (runtimes, local) = (&runtimes, &local);
            async move {
                (
                    no_false_positive(runtimes, local, script, origin).await,
                    *file,
                )
            }
        })
        .buffered(16)
        .collect()
        .await;
    let counted = verdicts.iter().filter(|&&(ran, file)| ran && !file).count();
    let files_counted = verdicts.iter().filter(|&&(ran, file)| ran && file).count();
    eprintln!(
        "check over the corpus: {counted} of {literals} literals and {files_counted} of {} files ran to their end and passed",
        scripts.len()
    );
    // The corpus is not empty (today 152 literals and 33 files count; a loaded machine ends a
    // few more at their deadline).
    assert!(counted >= 100, "{counted} literals counted");
    assert!(files_counted >= 25, "{files_counted} files counted");
}

/// Rhai's keyword functions and closures that capture variables (a `curry` underneath) are
/// known to `check`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_knows_closures_and_rhai_s_keyword_functions() {
    let script = r#"
        let base = 10;
        let add = |x| x + base;
        let f = Fn("abs");
        let r = [add.call(1), f.call(-3), call(add, 2), type_of(base), is_def_var("base")];
        r.push(Fn("abs").curry(-2).call());
        r.push([1, 2].map(add));
        r.push(is_def_fn("nope", 1));
        r
    "#;
    let probe = Probe::default();
    let runtime = Runtime::new(fixture_registry(&probe));
    let outcome = run_in(&runtime, script, Mode::Sequential).await;
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    let problems = runtime.check(script).unwrap();
    assert!(problems.is_empty(), "{problems:#?}");
}
