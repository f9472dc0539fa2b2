//! The mistakes models make when they write scripts (JavaScript and Python habits, Rhai's own
//! traps, calls that do not fit a tool), each with the error it gets: the kind, the line and
//! column, and a next action that says what to write instead. `run` and `check` agree on every
//! static one; a caught error has the same fields as the run's error.

use serde_json::{json, Value};
use toolscript::{Effect, Registry, RunError, Runtime, Severity, Tool};

/// A catalog of the shape models meet: a read with two required strings, and one whose
/// arguments hold an optional enum (as schemars writes `Option<State>`: `anyOf` of a `$ref`
/// and null) and a nested object with an enum and no other fields.
fn runtime() -> Runtime {
    let get_repo = Tool::builder("get_repo", Effect::Read)
        .input_schema(json!({
            "type": "object",
            "properties": {"owner": {"type": "string"}, "repo": {"type": "string"}},
            "required": ["owner", "repo"],
            "additionalProperties": false
        }))
        .handler(|args| async move {
            Ok(json!({"owner": args["owner"], "repo": args["repo"], "stars": 3}))
        });
    let list_issues = Tool::builder("list_issues", Effect::Read)
        .input_schema(json!({
            "type": "object",
            "properties": {
                "repo": {"type": "string"},
                "state": {"anyOf": [{"$ref": "#/$defs/State"}, {"type": "null"}]},
                "filter": {
                    "type": "object",
                    "properties": {
                        "state": {"enum": ["open", "closed"]},
                        "limit": {"type": "integer"}
                    },
                    "additionalProperties": false
                }
            },
            "required": ["repo"],
            "additionalProperties": false,
            "$defs": {"State": {"type": "string", "enum": ["open", "closed", "all"]}}
        }))
        .handler(|_| async { Ok(json!([{"id": 1, "title": "a"}])) });
    let registry = Registry::builder()
        .tool(get_repo)
        .tool(list_issues)
        .build()
        .expect("the catalog is valid");
    Runtime::new(registry)
}

/// One mistake: the script, the error it gets, and whether `check` finds it without running.
struct Mistake {
    script: &'static str,
    kind: &'static str,
    line: usize,
    column: usize,
    /// A piece of the next action: what to write instead.
    action_has: &'static str,
    /// `check` reports it (a parse error, or a problem its static checks find); otherwise only
    /// the run finds it, and `check` reports no error.
    found_by_check: bool,
}

const fn m(
    script: &'static str,
    kind: &'static str,
    (line, column): (usize, usize),
    action_has: &'static str,
    found_by_check: bool,
) -> Mistake {
    Mistake {
        script,
        kind,
        line,
        column,
        action_has,
        found_by_check,
    }
}

const STATIC: bool = true;
const RUNTIME: bool = false;

const MISTAKES: &[Mistake] = &[
    // JavaScript habits.
    m(
        "get_repo({ owner: \"acme\", repo: \"api\" })",
        "invalid_script",
        (1, 17),
        "write #{ owner: \"acme\", repo: \"api\" }",
        STATIC,
    ),
    m(
        "let m = { a: 1 };\nm",
        "invalid_script",
        (1, 12),
        "write #{ a: 1 }",
        STATIC,
    ),
    m(
        "let x = 1;\nif x == null { 1 } else { 2 }",
        "invalid_script",
        (2, 9),
        "use () instead of null",
        STATIC,
    ),
    m(
        "let x = undefined;\nx",
        "script_error",
        (1, 9),
        "use () instead of undefined",
        STATIC,
    ),
    m(
        "let x = 1;\nif x === 1 { 2 } else { 3 }",
        "invalid_script",
        (2, 6),
        "write == instead of ===",
        STATIC,
    ),
    m(
        "let a = [1, 2];\na.length",
        "script_error",
        (2, 3),
        "x.len()",
        RUNTIME,
    ),
    m(
        "let s = \"abc\";\ns.length",
        "script_error",
        (2, 3),
        "x.len()",
        RUNTIME,
    ),
    m(
        "console.log(\"hi\")",
        "script_error",
        (1, 1),
        "print(x)",
        STATIC,
    ),
    m(
        "for (let i = 0; i < 3; i++) { print(i) }",
        "invalid_script",
        (1, 6),
        "for i in 0..n",
        STATIC,
    ),
    m(
        "let f = (x) => x * 2;\nf(1)",
        "invalid_script",
        (1, 13),
        "|x| x * 2",
        STATIC,
    ),
    m(
        "Object.keys(#{ a: 1 })",
        "script_error",
        (1, 1),
        "m.keys()",
        STATIC,
    ),
    m(
        "JSON.stringify(#{ a: 1 })",
        "script_error",
        (1, 1),
        "to_json()",
        STATIC,
    ),
    m(
        "let r = await get_repo(#{ owner: \"acme\", repo: \"api\" });\nr",
        "invalid_script",
        (1, 9),
        "remove `await`",
        STATIC,
    ),
    m(
        "let x = 1;\nlet y = x ? 1 : 2;\ny",
        "invalid_script",
        (2, 11),
        "if c { a } else { b }",
        STATIC,
    ),
    m(
        "let x = 1;\nx++;\nx",
        "invalid_script",
        (2, 2),
        "x += 1",
        STATIC,
    ),
    m(
        "let a = [1];\na.forEach(|x| print(x))",
        "script_error",
        (2, 3),
        "for x in items",
        STATIC,
    ),
    m(
        "let n = parseInt(\"5\");\nn",
        "script_error",
        (1, 9),
        "parse_int(s)",
        STATIC,
    ),
    m(
        "var x = 1;\nx",
        "invalid_script",
        (1, 1),
        "write `let`",
        STATIC,
    ),
    // Python habits.
    m(
        "let x = None;\nx",
        "script_error",
        (1, 9),
        "use () instead of None",
        STATIC,
    ),
    m(
        "let x = True;\nx",
        "script_error",
        (1, 9),
        "write `true`",
        STATIC,
    ),
    m(
        "let n = 1;\nf\"n={n}\"",
        "invalid_script",
        (2, 2),
        "use backticks: `n=${n}`",
        STATIC,
    ),
    m(
        "def f(x):\n  return x",
        "invalid_script",
        (1, 5),
        "fn name(x) { ... }",
        STATIC,
    ),
    m(
        "let x = 1;\nif x == 1 { 1 } elif x == 2 { 2 } else { 3 }",
        "invalid_script",
        (2, 22),
        "write `else if`",
        STATIC,
    ),
    m(
        "let a = true;\nif a and a { 1 } else { 2 }",
        "invalid_script",
        (2, 6),
        "&&",
        STATIC,
    ),
    m(
        "let x = nil;\nx",
        "invalid_script",
        (1, 9),
        "use () instead of nil",
        STATIC,
    ),
    // Rhai's own traps.
    m(
        "let r = get_repo(#{ owner: \"acme\", repo: \"api\" });\nr.count + 1",
        "script_error",
        (2, 9),
        "(x.count ?? 0) + 1",
        RUNTIME,
    ),
    m(
        "let r = ();\nr.field",
        "script_error",
        (2, 3),
        "x?.field",
        RUNTIME,
    ),
    m(
        "let m = #{ a: 1 };\nm.a.b",
        "script_error",
        (2, 5),
        "type_of(x)",
        RUNTIME,
    ),
    m(
        "let x = 7;\nsqrt(x)",
        "script_error",
        (2, 1),
        "sqrt(x.to_float())",
        RUNTIME,
    ),
    m(
        "let a = [1, 2];\na[5]",
        "script_error",
        (2, 3),
        "a.get(i)",
        RUNTIME,
    ),
    m(
        "let a = 10;\nlet b = 0;\na / b",
        "script_error",
        (3, 3),
        "divisor",
        RUNTIME,
    ),
    m(
        "let x = 1;\nif x { 1 } else { 2 }",
        "script_error",
        (2, 4),
        "compare explicitly",
        RUNTIME,
    ),
    m(
        "let s = \"a\";\nlet n = s - 1;\nn",
        "script_error",
        (2, 11),
        "parse_int(s)",
        RUNTIME,
    ),
    m(
        "let r = try { 1 } catch (e) { e };\nr",
        "invalid_script",
        (1, 9),
        "assign inside",
        STATIC,
    ),
    m(
        "fn f(m) { m.x.y }\nf(())",
        "script_error",
        (1, 13),
        "x?.x",
        RUNTIME,
    ),
    // Calls that do not fit a tool.
    m(
        "get_repo(\"acme\", \"api\")",
        "invalid_input",
        (1, 1),
        "write get_repo(#{ owner: .., repo: .. })",
        STATIC,
    ),
    m(
        "get_repo(\"acme\")",
        "invalid_input",
        (1, 1),
        "write get_repo(#{ owner: .., repo: .. })",
        STATIC,
    ),
    m(
        "get_rep(#{ owner: \"acme\", repo: \"api\" })",
        "unknown_tool",
        (1, 1),
        "call `get_repo` instead",
        STATIC,
    ),
    m(
        "list_issues(#{ repo: \"a\", state: \"opn\" })",
        "invalid_input",
        (1, 1),
        "write `state: \"open\"`",
        STATIC,
    ),
    m(
        "list_issues(#{ repo: \"a\", filter: #{ state: \"opn\" } })",
        "invalid_input",
        (1, 1),
        "write `state: \"open\"`",
        STATIC,
    ),
    m(
        "list_issues(#{ repo: \"a\", filter: #{ stat: \"open\" } })",
        "invalid_input",
        (1, 1),
        "write `state` instead of `stat`",
        STATIC,
    ),
    m(
        "list_issues(#{ repo: 5 })",
        "invalid_input",
        (1, 1),
        "give `args.repo` a string",
        STATIC,
    ),
    m(
        "list_issues(#{})",
        "invalid_input",
        (1, 1),
        "add `repo: ..`",
        STATIC,
    ),
];

/// The fields of an error that `run` and `check` must agree on.
fn fields(
    kind: &str,
    message: &str,
    line: Option<usize>,
    column: Option<usize>,
    action: Option<&str>,
) -> Value {
    json!({"kind": kind, "message": message, "line": line, "column": column, "suggested_next_action": action})
}

fn run_fields(e: &RunError) -> Value {
    fields(
        e.kind_name(),
        &e.message,
        e.line,
        e.column,
        e.suggested_next_action.as_deref(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_mistake_gets_its_kind_place_and_next_action_and_run_and_check_agree() {
    assert!(MISTAKES.len() >= 25);
    let runtime = runtime();
    for mistake in MISTAKES {
        let script = mistake.script;
        let outcome = runtime.run(script).await;
        let e = match &outcome.result {
            Err(e) => e,
            Ok(v) => panic!("{script:?}: expected an error, the run returned {v}"),
        };
        assert_eq!(e.kind_name(), mistake.kind, "{script:?}: {e}");
        assert_eq!(
            (e.line, e.column),
            (Some(mistake.line), Some(mistake.column)),
            "{script:?}: {e}"
        );
        let action = e.suggested_next_action.as_deref().unwrap_or_default();
        assert!(
            action.contains(mistake.action_has),
            "{script:?}: the next action {action:?} does not say {:?}",
            mistake.action_has
        );
        // The JSON form carries the same fields.
        let json = e.to_json();
        assert_eq!(json["kind"], mistake.kind, "{script:?}");
        assert_eq!(json["line"], mistake.line, "{script:?}");
        assert_eq!(json["column"], mistake.column, "{script:?}");

        let checked = runtime.check(script);
        match (&checked, mistake.found_by_check) {
            (Err(compile), true) => assert_eq!(run_fields(compile), run_fields(e), "{script:?}"),
            (Ok(problems), true) => {
                let first = problems
                    .iter()
                    .find(|p| p.severity == Severity::Error)
                    .unwrap_or_else(|| panic!("{script:?}: check found nothing: {problems:?}"));
                assert_eq!(
                    fields(
                        &first.kind,
                        &first.message,
                        first.line,
                        first.column,
                        first.suggested_next_action.as_deref()
                    ),
                    run_fields(e),
                    "{script:?}: check and run disagree"
                );
            }
            (Ok(problems), false) => assert!(
                problems.iter().all(|p| p.severity != Severity::Error),
                "{script:?}: check reports what the run does not: {problems:?}"
            ),
            (Err(compile), false) => panic!("{script:?}: does not compile: {compile}"),
        }
    }
}

/// What `catch (e)` sees has the run's error's fields, whatever failed: a tool, Rhai itself
/// (a property of `()`, an index out of range, a function that exists nowhere), or the
/// script's own `throw` of a string.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caught_error_has_one_shape() {
    let runtime = runtime();
    let keys = [
        "kind",
        "message",
        "line",
        "column",
        "tool",
        "recoverable",
        "suggested_next_action",
    ];
    for failing in [
        "get_repo(#{ owner: \"acme\" })",
        "get_repo(\"acme\", \"api\")",
        "get_rep(#{ owner: \"acme\", repo: \"api\" })",
        "let r = (); r.x",
        "let a = [1]; a[3]",
        "let x = undefined; x",
        "let n = (); n + 1",
        "throw \"out of luck\"",
    ] {
        let uncaught = format!("\n\n{failing}");
        let caught = format!("let r = ();\ntry {{\n{failing}\n}} catch (e) {{ r = e; }}\nr");
        let outcome = runtime.run(&uncaught).await;
        let error = match &outcome.result {
            Err(e) => e.to_json(),
            Ok(v) => panic!("{failing}: expected an error, got {v}"),
        };
        let outcome = runtime.run(&caught).await;
        let seen = match &outcome.result {
            Ok(v) => v.clone(),
            Err(e) => panic!("{failing}: the error was not caught: {e}"),
        };
        let map = seen.as_object().expect("a caught error is a map");
        for key in keys {
            assert!(map.contains_key(key), "{failing}: no `{key}` in {seen}");
        }
        for key in keys {
            // `to_json` leaves out absent fields; the caught map has them as ().
            let expected = error.get(key).cloned().unwrap_or(Value::Null);
            assert_eq!(
                map[key], expected,
                "{failing}: `{key}` differs: caught {seen}, uncaught {error}"
            );
        }
    }
}

/// A script's own thrown map is caught as thrown; a thrown string keeps its value too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thrown_maps_stay_as_thrown_and_thrown_values_are_kept() {
    let runtime = runtime();
    let outcome = runtime
        .run("let r = ();\ntry { throw #{ code: 7 }; } catch (e) { r = e; }\nr")
        .await;
    assert_eq!(outcome.result.unwrap(), json!({"code": 7}));
    let outcome = runtime
        .run("let r = ();\ntry { throw 42; } catch (e) { r = e; }\nr")
        .await;
    let seen = outcome.result.unwrap();
    assert_eq!(seen["kind"], "script_error");
    assert_eq!(seen["message"], "42");
    assert_eq!(seen["value"], 42);
    assert_eq!(
        (seen["line"].clone(), seen["column"].clone()),
        (json!(2), json!(7))
    );
    // Caught and thrown again, an error is reported where it first happened.
    let outcome = runtime
        .run("let r = ();\ntry {\n  r.x\n} catch (e) { throw e; }")
        .await;
    let e = outcome.result.unwrap_err();
    assert_eq!((e.line, e.column), (Some(3), Some(5)), "{e}");
}

#[test]
fn check_warns_where_a_script_runs_but_not_as_meant() {
    let runtime = runtime();
    for (script, line, message_has, action_has) in [
        (
            "let r = ();\ntry { r = 1; } catch (e) { r = e; }",
            2,
            "a `try` is a statement",
            "let result = ();",
        ),
        (
            "let s = 0;\nfor x in [1, 2] { s += x; }",
            2,
            "`for` loop",
            "end the script with that variable",
        ),
        (
            "let x = 1;\nlet y = x + 1;",
            2,
            "a `let` is a statement",
            "write `y` as its last line",
        ),
        (
            "let x = 1;\nif x > 0 { x }",
            2,
            "without `else`",
            "add an `else`",
        ),
        (
            "let n = 3;\nprint(\"repo ${n}\");\nn",
            2,
            "not interpolated",
            "use backticks: `repo ${n}`",
        ),
    ] {
        let problems = runtime.check(script).expect("it compiles");
        let warning = problems
            .iter()
            .find(|p| p.severity == Severity::Warning)
            .unwrap_or_else(|| panic!("{script:?}: no warning in {problems:?}"));
        assert_eq!(warning.line, Some(line), "{script:?}: {warning:?}");
        assert!(
            warning.message.contains(message_has),
            "{script:?}: {warning:?}"
        );
        let action = warning.suggested_next_action.as_deref().unwrap_or_default();
        assert!(action.contains(action_has), "{script:?}: {warning:?}");
        assert!(
            problems.iter().all(|p| p.severity != Severity::Error),
            "{problems:?}"
        );
    }
    let problems = runtime.check("let n = 3;\nprint(`repo ${n}`);\nn").unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}
