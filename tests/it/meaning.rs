//! The meaning of a run: epochs, read de-duplication within an epoch (and the retry of a read
//! that failed recoverably), non-read calls exactly once in program order, the effect log, logs,
//! values and catchable errors.

use std::time::Duration;

use serde_json::json;
use toolscript::{Effect, Registry, Runtime, Tool};
use toolscript::{ErrorKind, Limits, Mode, RunOutcome, ToolError};

use crate::support::{
    by_occurrence, calls_of, error_of, fixture_runtime, run, run_in, value_of, Occurrences, Probe,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_reads_in_one_epoch_are_one_call() {
    let probe = Probe::default();
    let outcome = fixture_runtime(&probe)
        .run("let a = get_user(#{id: 1});\nlet b = get_user(#{id: 1});\nlet c = get_user(#{id: 2});\n[a.name, b.name, c.name]")
        .await;
    assert_eq!(value_of(&outcome), &json!(["user1", "user1", "user2"]));
    assert_eq!(Probe::count(&probe.user_calls), 2);
    assert_eq!(outcome.stats.tool_calls, 3);
    assert_eq!(outcome.stats.dispatched, 2);
    assert_eq!(outcome.stats.deduplicated, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argument_order_does_not_make_a_new_call() {
    let probe = Probe::default();
    let outcome = fixture_runtime(&probe)
        .run("get_orders(#{user: 4, x: 1}); get_orders(#{x: 1, user: 4}); 0")
        .await;
    value_of(&outcome);
    assert_eq!(Probe::count(&probe.order_calls), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_read_call_starts_a_new_epoch() {
    let probe = Probe::default();
    let outcome = fixture_runtime(&probe)
        .run("get_user(#{id: 1});\ncreate_order(#{user: 1});\nget_user(#{id: 1});\nnotify(#{});\nget_user(#{id: 1}); get_user(#{id: 1});")
        .await;
    value_of(&outcome);
    assert_eq!(Probe::count(&probe.user_calls), 3, "one read per epoch");
    assert_eq!(outcome.stats.deduplicated, 1);
    assert_eq!(outcome.stats.effectful_calls, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_read_is_answered_from_the_first_failure() {
    let probe = Probe::default();
    let outcome = fixture_runtime(&probe)
        .run("let kinds = [];\nfor i in 0..3 { try { get_user(#{id: 500}); } catch (e) { kinds.push(e.kind); } }\nkinds")
        .await;
    assert_eq!(
        value_of(&outcome),
        &json!(["not_found", "not_found", "not_found"])
    );
    assert_eq!(Probe::count(&probe.user_calls), 1);
}

/// The retry loop a model writes.
const RETRY_LOOP: &str = "let r = (); let tries = 0;\nwhile r == () && tries < 3 {\n    tries += 1;\n    try { r = flaky(#{id: 1}); } catch (e) { print(e.kind); }\n}\n[tries, r.n, flaky(#{id: 1}).n]";

/// A runtime whose `flaky` fails its first `failures` calls with each arguments with `error`,
/// then succeeds, after 5 ms (time for the scout to be first), within `limits`.
fn flaky_runtime(
    failures: u64,
    error: impl Fn() -> ToolError + Send + Sync + 'static,
    limits: Limits,
) -> (Runtime, Occurrences) {
    let (flaky, calls) = by_occurrence(
        "flaky",
        |_| Duration::from_millis(5),
        move |_, n| (n < failures).then(&error),
    );
    let registry = Registry::builder().tools([flaky]).build().unwrap();
    (Runtime::builder(registry).limits(limits).build(), calls)
}

/// The receipts' error kinds (`null` for a success) of `tool`'s calls the run made its own.
fn kinds_of(outcome: &RunOutcome, tool: &str) -> Vec<Option<String>> {
    outcome
        .receipts
        .iter()
        .filter(|r| r.tool == tool && (!r.speculative || r.claimed))
        .map(|r| r.error_kind.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_loop_retries_a_recoverable_failure_and_a_success_is_made_once() {
    for mode in [Mode::Sequential, Mode::Speculative] {
        let (runtime, calls) = flaky_runtime(
            2,
            || ToolError::unavailable("the backend is down"),
            Limits::default(),
        );
        let outcome = run_in(&runtime, RETRY_LOOP, mode).await;
        assert_eq!(
            value_of(&outcome),
            &json!([3, 2, 2]),
            "{mode:?}: the third call succeeded, and a later identical read is answered by it"
        );
        assert_eq!(outcome.logs, ["unavailable", "unavailable"], "{mode:?}");
        assert_eq!(calls_of(&calls), 3, "{mode:?}: one call per attempt");
        assert_eq!(outcome.stats.tool_calls, 4, "{mode:?}");
        assert_eq!(outcome.stats.deduplicated, 1, "{mode:?}");
        let unavailable = Some("unavailable".to_string());
        assert_eq!(
            kinds_of(&outcome, "flaky"),
            [unavailable.clone(), unavailable, None],
            "{mode:?}: one receipt per call"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_failure_whose_error_says_it_may_pass_is_made_again() {
    let always = u64::MAX;
    // (the error, whether the next identical call is a new one)
    let cases: Vec<(fn() -> ToolError, bool)> = vec![
        (|| ToolError::unavailable("down"), true),
        (|| ToolError::new(ErrorKind::Timeout, "slow"), true),
        (
            || {
                ToolError::with_kind_name("rate_limited", "wait a moment")
                    .unwrap()
                    .with_recoverable(true)
            },
            true,
        ),
        (|| ToolError::not_found("no record 1"), false),
        (|| ToolError::invalid_input("bad id"), false),
        (|| ToolError::new(ErrorKind::Conflict, "locked"), false),
        (
            || ToolError::unavailable("retired").with_recoverable(false),
            false,
        ),
        (
            || ToolError::with_kind_name("rate_limited", "come back tomorrow").unwrap(),
            false,
        ),
    ];
    let script = "let kinds = [];\nfor i in 0..3 { try { flaky(#{id: 1}); } catch (e) { kinds.push(e.kind); } }\nkinds";
    for (error, retried) in cases {
        let kind = error().kind_name().to_string();
        for mode in [Mode::Sequential, Mode::Speculative] {
            let (runtime, calls) = flaky_runtime(always, error, Limits::default());
            let outcome = run_in(&runtime, script, mode).await;
            assert_eq!(value_of(&outcome), &json!([kind, kind, kind]));
            let expected = if retried { 3 } else { 1 };
            assert_eq!(calls_of(&calls), expected, "{kind} ({mode:?})");
            assert_eq!(
                outcome.stats.deduplicated,
                3 - expected,
                "{kind} ({mode:?})"
            );
            assert_eq!(
                kinds_of(&outcome, "flaky").len() as u64,
                expected,
                "{kind} ({mode:?})"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_refused_by_an_open_breaker_is_a_call_and_the_next_is_made_again() {
    let script = "let kinds = [];\nfor i in 0..4 { try { flaky(#{id: 1}); } catch (e) { kinds.push(e.kind); } }\nkinds";
    for mode in [Mode::Sequential, Mode::Speculative] {
        let (flaky, calls) = by_occurrence(
            "flaky",
            |_| Duration::from_millis(2),
            |_, _| Some(ToolError::unavailable("down")),
        );
        let mut breaker = toolscript::BreakerConfig::default();
        breaker.failure_threshold = 2;
        let runtime = Runtime::builder(Registry::builder().tools([flaky]).build().unwrap())
            .breaker(breaker)
            .build();
        let outcome = run_in(&runtime, script, mode).await;
        assert_eq!(
            value_of(&outcome),
            &json!(["unavailable", "unavailable", "circuit_open", "circuit_open"]),
            "{mode:?}"
        );
        assert_eq!(outcome.stats.deduplicated, 0, "{mode:?}");
        if mode == Mode::Sequential {
            assert_eq!(calls_of(&calls), 2, "the breaker refused the last two");
            assert_eq!(
                kinds_of(&outcome, "flaky"),
                ["unavailable", "unavailable", "circuit_open", "circuit_open"]
                    .map(|k| Some(k.to_string())),
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_write_is_a_new_epoch_s_first_call() {
    // The first call of each epoch fails: without retries the run would see two failures.
    let (flaky, calls) = by_occurrence(
        "flaky",
        |_| Duration::ZERO,
        |args, n| (args["id"] == json!(1) && n % 2 == 0).then(|| ToolError::unavailable("down")),
    );
    let save = Tool::builder("save", Effect::Write).handler(|args| async move { Ok(args) });
    let runtime = Runtime::new(Registry::builder().tools([flaky, save]).build().unwrap());
    let script = "let seen = [];\nfor round in 0..2 {\n  let r = ();\n  while r == () { try { r = flaky(#{id: 1}); } catch (e) { seen.push(e.kind); } }\n  seen.push(r.n);\n  save(#{round: round});\n}\nseen";
    for mode in [Mode::Sequential, Mode::Speculative] {
        calls.lock().unwrap().clear();
        let outcome = run_in(&runtime, script, mode).await;
        assert_eq!(
            value_of(&outcome),
            &json!(["unavailable", 1, "unavailable", 3]),
            "{mode:?}"
        );
        assert_eq!(calls_of(&calls), 4, "{mode:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_loop_that_runs_into_the_budget_ends_with_the_budget_s_error() {
    let limits = |calls| {
        let mut limits = Limits::default();
        limits.max_calls = calls;
        limits
    };
    let down = || ToolError::unavailable("the backend is down");
    // It retries what may pass and rethrows the rest: the budget's error ends it.
    let rethrowing = "let r = ();\nloop {\n  try { r = flaky(#{id: 1}); break; }\n  catch (e) { if !e.recoverable { throw e; } }\n}\nr";
    for mode in [Mode::Sequential, Mode::Speculative] {
        let (runtime, calls) = flaky_runtime(u64::MAX, down, limits(4));
        let outcome = run_in(&runtime, rethrowing, mode).await;
        let error = error_of(&outcome);
        assert_eq!(error.kind, ErrorKind::BudgetExceeded, "{mode:?}: {error}");
        assert_eq!(error.limit.map(|l| l.key), Some("max_calls"));
        assert_eq!((error.line, error.column), (Some(3), Some(13)), "{mode:?}");
        // The scout may have started one more retry before the fourth call spent the budget
        // (wasted, never claimed); nothing after.
        let made = calls_of(&calls);
        assert!(
            made == 4 || (mode == Mode::Speculative && made == 5),
            "{mode:?}: {made}"
        );
        let mut kinds = kinds_of(&outcome, "flaky");
        assert_eq!(kinds.len(), 5, "{mode:?}: four calls and the refused fifth");
        assert_eq!(kinds.pop().unwrap().as_deref(), Some("budget_exceeded"));
    }
    // One that swallows every error and never gives up ends at its operations limit: the
    // budget's refusal answers each later attempt without a call.
    for mode in [Mode::Sequential, Mode::Speculative] {
        let mut tight = limits(4);
        tight.max_operations = 20_000;
        let (runtime, calls) = flaky_runtime(u64::MAX, down, tight);
        let outcome = run_in(
            &runtime,
            "let r = ();\nwhile r == () { try { r = flaky(#{id: 1}); } catch (e) { } }",
            mode,
        )
        .await;
        let error = error_of(&outcome);
        assert_eq!(error.kind, ErrorKind::LimitExceeded, "{mode:?}: {error}");
        assert_eq!(error.limit.map(|l| l.key), Some("max_operations"));
        let made = calls_of(&calls);
        assert!(
            made == 4 || (mode == Mode::Speculative && made == 5),
            "{mode:?}: {made}"
        );
        // The budget's refusal has a receipt when the script meets it; a refusal the scout
        // meets first writes none of its own (see `equivalence`), so speculatively it may be
        // missing.
        let kinds = kinds_of(&outcome, "flaky").len();
        assert!(
            kinds == 5 || (mode == Mode::Speculative && kinds == 4),
            "{mode:?}: {kinds}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_reads_are_never_deduplicated() {
    let probe = Probe::default();
    let outcome = fixture_runtime(&probe)
        .run("[poll(), poll(), poll()]")
        .await;
    assert_eq!(value_of(&outcome), &json!([1, 2, 3]));
    assert_eq!(outcome.stats.deduplicated, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_effect_log_lists_non_read_calls_in_order() {
    let probe = Probe::default();
    let outcome = fixture_runtime(&probe)
        .run(
            r#"
            create_order(#{user: 3});
            try { create_order(#{user: 0}); } catch {}
            try { create_order(#{user: 3}); } catch {}      // refused: a repeat never reaches the tool
            try { create_order(#{user: "x"}); } catch {}    // refused: invalid input
            notify(#{to: "ops"});
            if false { create_order(#{user: 9}); }          // never reached, never run
            get_user(#{id: 1}).name
            "#,
        )
        .await;
    assert_eq!(value_of(&outcome), &json!("user1"));
    let effects: Vec<_> = outcome
        .effects
        .iter()
        .map(|e| (e.tool.as_str(), e.effect, e.args.clone(), e.ok))
        .collect();
    assert_eq!(
        effects,
        vec![
            (
                "create_order",
                Effect::Write,
                json!({"user": 3}),
                Some(true)
            ),
            (
                "create_order",
                Effect::Write,
                json!({"user": 0}),
                Some(false)
            ),
            ("notify", Effect::External, json!({"to": "ops"}), Some(true)),
        ]
    );
    assert_eq!(Probe::count(&probe.write_calls), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allow_repeat_lets_a_write_run_again() {
    let tool = Tool::builder("bump", Effect::Write)
        .allow_repeat(true)
        .handler(|_| async { Ok(json!(1)) });
    let runtime = Runtime::new(Registry::builder().tool(tool).build().unwrap());
    let outcome = runtime.run("bump(); bump(); bump()").await;
    assert_eq!(value_of(&outcome), &json!(1));
    assert_eq!(outcome.effects.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_captured_in_order() {
    let outcome = run("print(\"one\"); debug(2); print(`three ${1 + 2}`); 0").await;
    assert_eq!(outcome.logs, vec!["one", "2", "three 3"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_map_to_json_naturally() {
    let outcome = run("#{i: 7, f: 1.5, s: \"x\", b: true, u: (), a: [1, #{n: 2}], c: 'c'}").await;
    assert_eq!(
        value_of(&outcome),
        &json!({"i": 7, "f": 1.5, "s": "x", "b": true, "u": null, "a": [1, {"n": 2}], "c": "c"})
    );
    let outcome = run("let x = 5; return x * 2; 99").await;
    assert_eq!(value_of(&outcome), &json!(10));
    let outcome = run("let x = 5;").await;
    assert_eq!(value_of(&outcome), &json!(null));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caught_error_is_a_structured_map() {
    let outcome = run(r#"let caught = ();
           try { get_user(#{id: 1000}); } catch (e) {
               caught = #{kind: e.kind, message: e.message, tool: e.tool,
                          recoverable: e.recoverable, hint: type_of(e.suggested_next_action)};
           }
           caught"#)
    .await;
    assert_eq!(
        value_of(&outcome),
        &json!({"kind": "not_found", "message": "no user 1000", "tool": "get_user",
                "recoverable": false, "hint": "string"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rethrown_error_keeps_its_kind_and_where_it_happened() {
    // The caught map carries the failed call's line and column; thrown again, the run's error
    // says the same (the rethrow is plumbing; the call is what to fix).
    let outcome =
        run("let e = ();\ntry { get_user(#{id: 1000}) } catch (err) { e = err; }\nthrow e;").await;
    let e = error_of(&outcome);
    assert_eq!(e.kind_name(), "not_found");
    assert_eq!(e.tool.as_deref(), Some("get_user"));
    assert_eq!((e.line, e.column), (Some(2), Some(7)));
    // A new map thrown in its place is reported where it is thrown.
    let outcome = run(
        "let e = ();\ntry { get_user(#{id: 1000}) } catch (err) { e = err; }\nthrow #{ kind: e.kind, message: \"again\" };",
    )
    .await;
    let e = error_of(&outcome);
    assert_eq!((e.kind_name(), e.line), ("not_found", Some(3)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_inside_a_function_reports_the_inner_call_site() {
    let outcome =
        run("fn lookup(id) {\n    get_user(#{id: id})\n}\nlet a = lookup(1);\nlookup(1000)").await;
    let e = error_of(&outcome);
    assert_eq!(e.kind_name(), "not_found");
    assert_eq!((e.line, e.column), (Some(2), Some(5)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyphenated_tools_have_an_alias_and_a_generic_call() {
    let tool = Tool::builder("get-user", Effect::Read)
        .handler(|args| async move { Ok(json!({"got": args})) });
    let runtime = Runtime::new(Registry::builder().tool(tool).build().unwrap());
    let outcome = runtime
        .run("[get_user(#{id: 1}).got.id, tool(\"get-user\", #{id: 2}).got.id, tool(\"get-user\").got]")
        .await;
    assert_eq!(value_of(&outcome), &json!([1, 2, {}]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_of_reads_are_ordinary_values() {
    let outcome = run(r#"
        let active = [];
        for id in 1..=6 {
            let u = get_user(#{id: id});
            if u.active { active.push(u.name); }
        }
        let orders = get_orders(#{user: 5});
        #{active: active, orders: orders, count: orders.len()}
        "#)
    .await;
    assert_eq!(
        value_of(&outcome),
        &json!({"active": ["user2", "user4", "user6"], "orders": [50, 51], "count": 2})
    );
}

/// A tool named like one of the engine's own functions (`timestamp()`, which refuses to read
/// the clock) is the tool in a script, in both modes, as are tools named like nothing else:
/// the tools' functions are built once per registry and shared by every engine, and such a
/// tool's are registered on the engine itself too, over the engine's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_named_like_an_engine_function_is_the_tool() {
    let tools = [
        Tool::builder("timestamp", Effect::Read).handler(|_| async { Ok(json!(42)) }),
        Tool::builder("lookup", Effect::Read).handler(|args| async move { Ok(args) }),
    ];
    let runtime = Runtime::new(Registry::builder().tools(tools).build().unwrap());
    let script = "[timestamp(), timestamp(#{}), lookup(#{a: 1}).a, tool(\"lookup\", #{a: 2}).a]";
    for mode in [Mode::Sequential, Mode::Speculative] {
        let outcome = run_in(&runtime, script, mode).await;
        assert_eq!(value_of(&outcome), &json!([42, 42, 1, 2]), "{mode:?}");
        assert_eq!(outcome.stats.tool_calls, 4, "{mode:?}");
    }
}
