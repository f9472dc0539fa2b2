//! The meaning of a run: epochs, read de-duplication within an epoch, non-read calls exactly once
//! in program order, the effect log, logs, values and catchable errors.

use serde_json::json;
use toolscript::{Effect, Registry, Runtime, Tool};

use crate::support::{error_of, fixture_runtime, run, value_of, Probe};

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
