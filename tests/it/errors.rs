//! Every error kind, each produced by a real script (or manifest), with the position it reports.

use std::path::Path;
use std::time::Duration;

use toolscript::{ErrorKind, Limits, Manifests, Mode, Runtime};

use crate::support::{error_of, fixture_registry, run, run_in, Probe};

struct Case {
    script: &'static str,
    kind: &'static str,
    line: Option<usize>,
    column: Option<usize>,
    message_has: &'static str,
}

const CASES: &[Case] = &[
    Case {
        script: "let x = 1;\nget_usr(#{id: 1})",
        kind: "unknown_tool",
        line: Some(2),
        column: Some(1),
        message_has: "did you mean `get_user`",
    },
    Case {
        script: "tool(\"get_usr\", #{id: 1})",
        kind: "unknown_tool",
        line: Some(1),
        column: Some(1),
        message_has: "did you mean `get_user`",
    },
    Case {
        script: "create_order(#{user: 1});\n  create_order(#{user: 1})",
        kind: "repeated_call",
        line: Some(2),
        column: Some(3),
        message_has: "already called",
    },
    Case {
        script: "get_user(#{id: \"seven\"})",
        kind: "invalid_input",
        line: Some(1),
        column: Some(1),
        message_has: "args.id",
    },
    Case {
        script: "get_user(42)",
        kind: "invalid_input",
        line: Some(1),
        column: Some(1),
        message_has: "one object map",
    },
    Case {
        script: "let u = get_user(#{id: 1});\nlet v = bad_output();",
        kind: "invalid_output",
        line: Some(2),
        column: Some(9),
        message_has: "/n",
    },
    Case {
        script: "\n\n    hang()",
        kind: "timeout",
        line: Some(3),
        column: Some(5),
        message_has: "50 ms",
    },
    Case {
        script: "boom()",
        kind: "internal",
        line: Some(1),
        column: Some(1),
        message_has: "the tool body exploded",
    },
    Case {
        script: "get_user(#{id: 1000})",
        kind: "not_found",
        line: Some(1),
        column: Some(1),
        message_has: "no user 1000",
    },
    Case {
        script: "create_order(#{user: 0})",
        kind: "conflict",
        line: Some(1),
        column: Some(1),
        message_has: "cannot order",
    },
    Case {
        script: "let x = ;",
        kind: "invalid_script",
        line: Some(1),
        column: Some(9),
        message_has: "",
    },
    Case {
        script: "let s = 0;\nloop { s += 1; }",
        kind: "limit_exceeded",
        line: Some(2),
        column: None,
        message_has: "operations",
    },
    Case {
        script: "let a = 1;\na + missing",
        kind: "script_error",
        line: Some(2),
        column: Some(5),
        message_has: "missing",
    },
    Case {
        script: "throw \"plain\"",
        kind: "script_error",
        line: Some(1),
        column: Some(1),
        message_has: "plain",
    },
    Case {
        script: "throw #{kind: \"rate_limited\", message: \"slow down\"}",
        kind: "rate_limited",
        line: Some(1),
        column: Some(1),
        message_has: "slow down",
    },
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_reports_its_call_site() {
    for case in CASES {
        let outcome = run(case.script).await;
        let e = error_of(&outcome);
        assert_eq!(e.kind_name(), case.kind, "{}: {e}", case.script);
        assert_eq!(e.line, case.line, "{}: {e}", case.script);
        if case.column.is_some() {
            assert_eq!(e.column, case.column, "{}: {e}", case.script);
        }
        assert!(
            e.message.contains(case.message_has),
            "{}: {}",
            case.script,
            e.message
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_errors_name_the_tool_and_carry_a_hint() {
    let outcome = run("get_user(#{id: 1000})").await;
    let e = error_of(&outcome);
    assert_eq!(e.tool.as_deref(), Some("get_user"));
    assert!(!e.recoverable);
    assert!(e.suggested_next_action.is_some());
    let outcome = run("hang()").await;
    assert!(error_of(&outcome).recoverable, "a timeout may pass");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_exceeded_after_the_allowed_calls() {
    let mut budget = Limits::default();
    budget.max_calls = 3;
    let runtime = Runtime::builder(fixture_registry(&Probe::default()))
        .limits(budget)
        .build();
    let script = "let n = 0;\nfor i in 1..10 {\n  n += lookup(#{id: i}).id;\n}\nn";
    let outcome = run_in(&runtime, script, Mode::Sequential).await;
    let e = error_of(&outcome);
    assert_eq!(e.kind, ErrorKind::BudgetExceeded);
    assert_eq!((e.line, e.column), (Some(3), Some(8)));
    assert_eq!(e.tool.as_deref(), Some("lookup"));
    assert!(e.message.contains("at most 3 tool calls"), "{}", e.message);
    assert_eq!(
        outcome.stats.dispatched, 4,
        "the refused call is still dispatched"
    );
    // Speculation spends its own budget: the run fails at the same call.
    let speculative = run_in(&runtime, script, Mode::Speculative).await;
    assert_eq!(error_of(&speculative), e);
    assert!(speculative.stats.speculative_launched > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_wall_clock_ends_a_long_call() {
    let mut budget = Limits::default();
    budget.timeout = Duration::from_millis(100);
    let mut manifests = Manifests::new();
    manifests
        .load_str(
            Path::new("slow.toml"),
            "[[tool]]\nname = \"slow\"\neffect = \"read\"\nlatency_ms = 5000\nscript = \"1\"\n",
        )
        .unwrap();
    let runtime = Runtime::builder(manifests.into_registry().unwrap())
        .limits(budget)
        .build();
    let started = std::time::Instant::now();
    let outcome = runtime.run("slow()").await;
    let e = error_of(&outcome);
    // The run has one deadline, whatever sets it, and meeting it is `limit_exceeded`.
    assert_eq!(e.kind, ErrorKind::LimitExceeded);
    assert!(e.message.contains("deadline of"), "{}", e.message);
    // Not a timing assertion on speed: only that the 5 s latency was cut short at all.
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn circuit_open_after_five_failures() {
    let script = "let kinds = [];\nfor i in 0..7 {\n  try { flaky(#{i: i}); } catch (e) { kinds.push(e.kind); }\n}\nkinds";
    let expected = serde_json::json!([
        "unavailable",
        "unavailable",
        "unavailable",
        "unavailable",
        "unavailable",
        "circuit_open",
        "circuit_open"
    ]);
    for mode in [Mode::Sequential, Mode::Speculative] {
        let probe = Probe::default();
        probe
            .failing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let runtime = Runtime::new(fixture_registry(&probe));
        let outcome = run_in(&runtime, script, mode).await;
        assert_eq!(crate::support::value_of(&outcome), &expected, "{mode:?}");
        if mode == Mode::Sequential {
            // The scout may also have tried the tool before the breaker opened; sequentially,
            // an open breaker fails fast without calling it.
            assert_eq!(Probe::count(&probe.flaky_calls), 5);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_and_custom_kinds_from_script_tools() {
    let manifest = r#"
[[tool]]
name = "strict"
effect = "read"
script = '''
if args.mode == "custom" { throw #{ kind: "rate_limited", message: "too many requests" } }
if args.mode == "plain" { throw "it broke" }
if args.mode == "bug" { let x = undefined_variable; }
1
'''
"#;
    let mut manifests = Manifests::new();
    manifests
        .load_str(Path::new("strict.toml"), manifest)
        .unwrap();
    let runtime = Runtime::new(manifests.into_registry().unwrap());
    for (mode, kind, text) in [
        ("custom", "rate_limited", "too many requests"),
        ("plain", "failed", "it broke"),
        ("bug", "internal", "undefined_variable"),
    ] {
        let outcome = runtime.run(&format!("strict(#{{mode: \"{mode}\"}})")).await;
        let e = error_of(&outcome);
        assert_eq!(e.kind_name(), kind);
        assert!(e.message.contains(text), "{mode}: {}", e.message);
    }
}

#[test]
fn check_finds_bad_calls_without_running_them() {
    let runtime = crate::support::fixture_runtime(&Probe::default());
    let problems = runtime
        .check(
            "let a = get_user(#{id: \"seven\"});\nlet b = tool(\"get_orders\", #{});\nlet c = get_user(#{id: a.id});\nget_usr(#{id: 1});\ntool(\"nope\");\nget_user(#{id: 3}, 4)",
        )
        .unwrap();
    let found: Vec<(Option<usize>, &str)> = problems
        .iter()
        .map(|p| (p.line, p.message.as_str()))
        .collect();
    assert_eq!(found.len(), 5, "{found:?}");
    assert!(
        found[0].0 == Some(1) && found[0].1.contains("args.id"),
        "{found:?}"
    );
    assert!(
        found[1].0 == Some(2) && found[1].1.contains("required"),
        "{found:?}"
    );
    assert!(
        found[2].0 == Some(4) && found[2].1.contains("did you mean `get_user`"),
        "{found:?}"
    );
    assert!(
        found[3].0 == Some(5) && found[3].1.contains("no tool named `nope`"),
        "{found:?}"
    );
    assert!(
        found[4].0 == Some(6) && found[4].1.contains("2 arguments"),
        "{found:?}"
    );
    let e = runtime.check("let x = ;").unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidScript);
}
