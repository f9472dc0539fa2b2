//! Every error is placed: a sweep of model mistakes and hostile scripts, each in several
//! places of a script (the top level, a function, a closure, a loop, a branch, a `try` that
//! throws again, after a tool call), asserts that the run's error has a kind, a line and
//! column inside the script, and a next action.

use toolscript::Mode;

use crate::support::{fixture_runtime, run_in, Probe};

/// Statements that fail when they run.
const MISTAKES: &[&str] = &[
    "let y = undefined_name + 1;",
    "let y = null;",
    "let y = no_such_function(1);",
    "let y = 1; let z = y.foo;",
    "let y = [1, 2]; let z = y[5];",
    "let y = \"abc\"; let z = y[10];",
    "let y = 1 / 0;",
    "let y = #{}; let z = y.a.b;",
    "let y = \"a\" * 2;",
    "let m = #{a: 1, b: 2}; let z = m.keys().filter(|k| m[k] > 1);",
    "let a = [1, 2]; let z = a.map(|x| a.len() + x);",
    "let z = get_user(1);",
    "let z = get_user(#{id: \"one\"});",
    "let z = get_user(#{id: 101});",
    "throw \"boom\";",
    "throw #{code: 7};",
    "const c = 1; c = 2;",
    "for x in 5 { }",
    "let z = console.log(1);",
    "let z = JSON.parse(\"1\");",
    "let y = [1, 2]; let z = y.length;",
    "let y = 9223372036854775807; let z = y + 1;",
    "let z = [1, \"two\"].sum();",
    "let z = [#{v: 1}, #{v: []}].sort_by(|p| p.v);",
    "let z = get_users(#{id: 1});",
    "let z = tool(\"nope\", #{});",
    "let y = (); let z = y[0];",
    "let y = #{a: 1}; let z = y[0];",
    "let s = `${no_var}`;",
    "let z = create_order(#{user: 1}); let w = create_order(#{user: 1});",
    "fn r(n) { r(n + 1) } let z = r(0);",
    "let z = \"x\".parse_json();",
];

/// Places for a statement: `{}` is where it goes. A preamble line comes first everywhere, so
/// that no error is on the first line by chance.
const PLACES: &[&str] = &[
    "{}",
    "fn f() { {} } f();",
    "[1].map(|_i| { {} });",
    "for i in 0..2 { {} }",
    "if 1 < 2 { {} }",
    "try { {} } catch (e) { throw e; }",
    "fn g() { {} } fn f() { g() } f();",
    "let u = get_user(#{id: 1});\n{}",
    "let n = 2;\nswitch n { 2 => { {} }, _ => {} }",
    "while true { {} break; }",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_has_a_kind_a_place_and_a_next_action() {
    let probe = Probe::default();
    let runtime = fixture_runtime(&probe);
    let mut failures = Vec::new();
    let mut errors = 0;
    for mistake in MISTAKES {
        for place in PLACES {
            let script = format!(
                "let preamble = 0;\n{}\nlet after = 1;",
                place.replace("{}", mistake)
            );
            let lines = script.lines().count();
            for mode in [Mode::Sequential, Mode::Speculative] {
                let outcome = run_in(&runtime, &script, mode).await;
                let Err(e) = &outcome.result else {
                    failures.push(format!("{mode:?}: no error\n{script}"));
                    continue;
                };
                errors += 1;
                let placed = matches!((e.line, e.column), (Some(l), Some(c)) if l >= 2 && l <= lines && c >= 1);
                if e.kind_name().is_empty() || !placed || e.suggested_next_action.is_none() {
                    failures.push(format!(
                        "{mode:?}: {} at {:?}:{:?}, next: {:?}: {}\n{script}",
                        e.kind_name(),
                        e.line,
                        e.column,
                        e.suggested_next_action,
                        e.message
                    ));
                }
            }
        }
    }
    eprintln!(
        "{errors} errors from {} scripts",
        MISTAKES.len() * PLACES.len()
    );
    assert!(MISTAKES.len() * PLACES.len() >= 300);
    assert!(
        failures.is_empty(),
        "{} of {errors}:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
