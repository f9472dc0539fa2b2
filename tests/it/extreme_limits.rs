//! Limits at and past their maximums, through the command line (a child process, so that a
//! stack overflow is a failed exit status, not the end of the test binary), a manifest's
//! `[limits]` and the library: every one runs or is refused with a clear error.

use std::path::Path;
use std::time::Duration;

use toolscript::{ErrorKind, Limits, Manifests, Mode, Registry, Runtime};

use crate::cli::toolscript;

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

/// A function whose body nests `levels` loops and conditions around its recursive call: the
/// most stack a call level can take under a given `max_expr_depth`.
fn deep_recursion(levels: usize, depth: usize) -> String {
    deep_recursion_to(levels, depth, "0")
}

/// [`deep_recursion`] whose deepest level's value is `bottom`'s.
fn deep_recursion_to(levels: usize, depth: usize, bottom: &str) -> String {
    let mut body = "return 1 + f(n - 1);".to_string();
    for i in 0..levels {
        body = if i % 2 == 1 {
            format!("if n > {} {{ {body} }}", -1 - i as i64)
        } else {
            format!("while true {{ {body} }}")
        };
    }
    format!("fn f(n) {{ if n == 0 {{ return {bottom}; }} {body} 0 }}\nf({depth})\n")
}

/// Runs `script` with the call and expression depths at their maximums, and `more` flags.
fn at_the_maximum_depths(script: &str, more: &[&str]) -> crate::cli::Output {
    let max_call = Limits::MAX_CALL_DEPTH.to_string();
    let max_expr = Limits::MAX_EXPR_DEPTH.to_string();
    let mut args = vec![
        "run",
        script,
        "--no-store",
        "--max-call-depth",
        &max_call,
        "--max-expr-depth",
        &max_expr,
        "--max-operations",
        "1e12",
    ];
    args.extend(more);
    toolscript(&args)
}

/// A script tool's body runs on the thread of the script that calls it when its last body
/// was quick: at the deepest a script can recurse, a body that recurses as deep as a script
/// tool's may still run (in place or on the pool), in both modes, in a debug build.
#[test]
fn a_script_tool_called_at_the_maximum_call_depth_recursing_to_its_own_runs() {
    let dir = tempfile::tempdir().unwrap();
    let depth = Limits::default().max_call_depth - 2;
    let tool = deep_recursion(6, depth).replace('\n', " ");
    let tools = write(
        &dir,
        "deep.toml",
        &format!("[[tool]]\nname = \"deep\"\neffect = \"read\"\nscript = \"{tool}\"\n"),
    );
    // Twice at the bottom: a tool's first body runs in place (it is taken to be quick, and the
    // script, 255 levels deep, leaves about 38 MiB of stack in a debug build); this one is slow
    // there, so the second runs on the pool.
    let script = write(
        &dir,
        "at.rhai",
        &deep_recursion_to(60, Limits::MAX_CALL_DEPTH - 1, "deep(#{}) + deep(#{n: 1})"),
    );
    for mode in [None, Some("--sequential")] {
        let mut args = vec!["--tools", &tools];
        args.extend(mode);
        let out = at_the_maximum_depths(&script, &args);
        assert_eq!(out.code, 0, "{mode:?}: {out:?}");
        let expected = Limits::MAX_CALL_DEPTH - 1 + 2 * depth;
        assert_eq!(
            out.stdout.lines().next(),
            Some(&*expected.to_string()),
            "{mode:?}: {out:?}"
        );
    }
}

#[test]
fn recursion_to_the_maximum_call_depth_runs_and_past_it_is_a_limit_error() {
    let dir = tempfile::tempdir().unwrap();
    // 60 levels is about the deepest body `max_expr_depth = 512` lets a function have (half).
    let flags = |script: &str| at_the_maximum_depths(script, &[]);
    let at = write(
        &dir,
        "at.rhai",
        &deep_recursion(60, Limits::MAX_CALL_DEPTH - 1),
    );
    let out = flags(&at);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        out.stdout.lines().next(),
        Some(&*(Limits::MAX_CALL_DEPTH - 1).to_string()),
        "{out:?}"
    );
    let past = write(&dir, "past.rhai", &deep_recursion(60, 100_000));
    let out = flags(&past);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.contains("limit_exceeded") && out.stderr.contains("max_call_depth"),
        "{out:?}"
    );
}

#[test]
fn nesting_to_the_maximum_expression_depth_runs_and_past_it_is_a_limit_error() {
    let dir = tempfile::tempdir().unwrap();
    let max_expr = Limits::MAX_EXPR_DEPTH.to_string();
    // A parenthesis or a block is two levels of Rhai's count.
    for (nesting, fits) in [
        (Limits::MAX_EXPR_DEPTH / 2 - 2, true),
        (Limits::MAX_EXPR_DEPTH * 4, false),
    ] {
        for (open, close) in [("(", ")"), ("{ ", " }"), ("[", "]")] {
            if fits && open == "[" {
                continue;
            }
            let text = format!("{}1{}", open.repeat(nesting), close.repeat(nesting));
            let script = write(&dir, "nest.rhai", &text);
            let args = ["run", &script, "--no-store", "--max-expr-depth", &max_expr];
            let out = toolscript(&args);
            if fits {
                assert_eq!(
                    (out.code, out.stdout.lines().next()),
                    (0, Some("1")),
                    "{nesting} {open}: {out:?}"
                );
            } else {
                assert_eq!(out.code, 1, "{nesting} {open}: {out:?}");
                assert!(
                    out.stderr.contains("limit_exceeded") && out.stderr.contains("max_expr_depth"),
                    "{out:?}"
                );
            }
        }
    }
}

#[test]
fn extreme_values_of_the_command_line_s_flags_are_refused_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let script = write(&dir, "one.rhai", "1 + 1");
    let cases = [
        ("--timeout-s", "1e19", "at most 31536000"),
        ("--timeout-s", "1.7976931348623157e308", "at most 31536000"),
        ("--timeout-s", "inf", "at least"),
        ("--timeout-s", "NaN", "at least"),
        ("--max-call-depth", "8000", "at most 256"),
        ("--max-expr-depth", "1200", "at most 512"),
        ("--max-calls", "1e19", "at most 9007199254740992"),
        ("--max-operations", "-1", "at least 1"),
    ];
    for (flag, value, says) in cases {
        let out = toolscript(&["run", &script, "--no-store", flag, value]);
        assert_eq!(out.code, 2, "{flag} {value}: {out:?}");
        assert!(
            out.stderr.contains(flag) && out.stderr.contains(says),
            "{flag} {value}: {out:?}"
        );
    }
    let out = toolscript(&["run", &script, "--no-store", "--timeout-s", "31536000"]);
    assert_eq!(
        (out.code, out.stdout.lines().next()),
        (0, Some("2")),
        "{out:?}"
    );
}

#[test]
fn extreme_values_in_a_manifest_s_limits_are_refused_naming_the_key() {
    for value in [
        "1e19",
        "1.7976931348623157e308",
        "inf",
        "nan",
        "-inf",
        "9007199254740993e3",
    ] {
        let mut manifests = Manifests::new();
        let e = manifests
            .load_str(
                Path::new("m.toml"),
                &format!("[limits]\ntimeout_s = {value}\n"),
            )
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[limits]") && e.contains("timeout_s"),
            "{value}: {e}"
        );
    }
    let mut manifests = Manifests::new();
    manifests
        .load_str(
            Path::new("m.toml"),
            "[limits]\ntimeout_s = 31536000\nmax_call_depth = 256\n",
        )
        .unwrap();
    assert_eq!(manifests.limits().max_call_depth, 256);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_set_past_their_maximums_through_the_fields_are_held_to_them() {
    // The fields are public: values `Limits::set` refuses still run, held to the maximums.
    let mut limits = Limits::default();
    limits.timeout = Duration::MAX;
    limits.max_call_depth = usize::MAX;
    limits.max_expr_depth = usize::MAX;
    limits.max_operations = u64::MAX;
    let runtime = Runtime::builder(Registry::default()).limits(limits).build();
    for mode in [Mode::Sequential, Mode::Speculative] {
        let out = crate::support::run_in(
            &runtime,
            "fn f(n) { if n == 0 { 0 } else { 1 + f(n - 1) } } f(100000)",
            mode,
        )
        .await;
        let e = out.result.expect_err("the recursion stops");
        assert_eq!(e.kind, ErrorKind::LimitExceeded, "{e:?}");
        let nested = format!("{}1{}", "(".repeat(5_000), ")".repeat(5_000));
        let e = runtime.compile(&nested).unwrap_err();
        assert_eq!(e.kind, ErrorKind::LimitExceeded, "{e:?}");
        let out = crate::support::run_in(&runtime, "40 + 2", mode).await;
        assert_eq!(out.result.unwrap(), serde_json::json!(42));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_s_huge_timeout_and_latency_are_no_panic() {
    // The largest integers TOML holds: a timeout that never comes, a latency that outlasts the
    // run, which its deadline ends.
    let manifest = r##"
[[tool]]
name = "patient"
effect = "read"
timeout_ms = 9223372036854775807
script = "#{ ok: true }"

[[tool]]
name = "forever"
effect = "read"
latency_ms = 9223372036854775807
timeout_ms = 9223372036854775807
script = "#{ ok: true }"

[limits]
timeout_s = 1
"##;
    let mut manifests = Manifests::new();
    manifests
        .load_str(Path::new("huge.toml"), manifest)
        .unwrap();
    let limits = manifests.limits().clone();
    let runtime = Runtime::builder(manifests.into_registry().unwrap())
        .limits(limits)
        .build();
    for mode in [Mode::Sequential, Mode::Speculative] {
        let out = crate::support::run_in(&runtime, "patient(#{}).ok", mode).await;
        assert_eq!(out.result.unwrap(), serde_json::json!(true), "{mode:?}");
        let out = crate::support::run_in(&runtime, "forever(#{}).ok", mode).await;
        let e = out.result.expect_err("the run's deadline ends the call");
        assert_eq!(e.kind, ErrorKind::LimitExceeded, "{mode:?}: {e:?}");
        assert_eq!(e.limit.as_ref().map(|l| l.key), Some("timeout_s"), "{e:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_at_its_maximum_depths_answers_every_request() {
    use crate::mcp_server::{arguments, outcome_of, serve_session, wire};
    use rmcp::model::CallToolRequestParams;
    use serde_json::json;

    let (call, expr) = (
        Limits::MAX_CALL_DEPTH.to_string(),
        Limits::MAX_EXPR_DEPTH.to_string(),
    );
    let flags = [
        "--max-call-depth",
        &call,
        "--max-expr-depth",
        &expr,
        "--timeout-s",
        "31536000",
        "--max-operations",
        "1e12",
    ];
    let flags: Vec<&std::ffi::OsStr> = flags.iter().map(std::ffi::OsStr::new).collect();
    let client = serve_session(&flags, &crate::support::test_store()).await;
    let nested = |n: usize| format!("{}1{}", "{ ".repeat(n), " }".repeat(n));
    let cases = [
        (deep_recursion(60, Limits::MAX_CALL_DEPTH - 1), None),
        (deep_recursion(60, 100_000), Some("max_call_depth")),
        (nested(Limits::MAX_EXPR_DEPTH / 2 - 2), None),
        (nested(Limits::MAX_EXPR_DEPTH * 4), Some("max_expr_depth")),
    ];
    for (script, limit) in cases {
        let result = client
            .call_tool(
                CallToolRequestParams::new("run_script")
                    .with_arguments(arguments(json!({ "script": script }))),
            )
            .await
            .expect("the server answers");
        let outcome = outcome_of(&wire(&result));
        match limit {
            None => assert_eq!(outcome["ok"], true, "{outcome}"),
            Some(key) => {
                assert_eq!(outcome["ok"], false, "{outcome}");
                assert!(outcome.to_string().contains(key), "{outcome}");
            }
        }
    }
    let _ = client.cancel().await;
}

#[test]
fn the_server_refuses_an_extreme_limit_naming_the_flag() {
    let out = toolscript(&["serve", "--timeout-s", "1e19"]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(
        out.stderr.contains("--timeout-s") && out.stderr.contains("at most"),
        "{out:?}"
    );
}

/// The memory budget is the process's, so the scout's copies of what a script builds count
/// against it: near the budget, a script that fits sequentially must fit speculatively too
/// (the scout's passes stop at half the budget, and over it the scout stands down before the
/// script is ended). At the smallest budget (of a few) the script fits sequentially, the
/// speculative run fits every time.
#[test]
fn a_script_that_fits_the_memory_budget_sequentially_fits_it_speculatively() {
    let dir = tempfile::TempDir::new().unwrap();
    let script = write(
        &dir,
        "grow.rhai",
        "let a = [];\nfor i in 0..200000 { a.push(#{ id: i, name: `item ${i}` }); }\na.len()",
    );
    let run = |mb: u32, sequential: bool| {
        let mb = mb.to_string();
        let mut args = vec!["run", &script, "--no-store", "--max-memory-mb", &mb];
        if sequential {
            args.push("--sequential");
        }
        toolscript(&args)
    };
    let fits = (40..=400)
        .step_by(10)
        .find(|mb| run(*mb, true).code == 0)
        .expect("the script fits some budget sequentially");
    for _ in 0..5 {
        let speculative = run(fits, false);
        assert_eq!(speculative.code, 0, "at {fits} MiB: {speculative:?}");
        assert!(speculative.stdout.contains("200000"), "{speculative:?}");
    }
}
