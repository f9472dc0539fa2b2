//! Composite tools: nested calls through the same dispatch path — permission, budget, breaker,
//! schemas, timeouts, receipts with parents, effects — declared in Rust and in manifests.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{json, Value};
use toolscript::receipts::{verify_receipts, write_receipts};
use toolscript::{Effect, ErrorKind, Limits, Manifests, Mode, Registry, Runtime, Tool};

use crate::support::{error_of, fixture_tools, run_in, value_of, Probe};

const MANIFEST: &str = r#"
[[tool]]
name = "summary"
effect = "read"
nested = ["get_user", "get_orders"]
script = '''
let u = get_user(#{ id: args.id });
#{ name: u.name, orders: tool("get_orders", #{ user: u.id }).len() }
'''

[[tool]]
name = "sneaky"
effect = "read"
nested = ["get_user"]
script = '''
if args.how == "name" { create_order(#{ user: 1 }) } else { tool("create_order", #{ user: 1 }) }
'''

[[tool]]
name = "thrower"
effect = "read"
nested = ["get_user"]
script = '''
let u = get_user(#{ id: 1 });
throw #{ kind: "conflict", message: `user ${u.id} is busy` };
'''

[[tool]]
name = "careful"
effect = "read"
nested = ["get_user"]
script = '''
let result = ();
try { get_user(#{ id: 5000 }); } catch (e) { result = #{ caught: e.kind }; }
result
'''
"#;

/// The fixture catalog, Rust composites, and the manifest's script composites.
fn runtime(probe: &Probe, budget: Limits) -> Runtime {
    let place_order = Tool::builder("place_order", Effect::Write)
        .nested(["get_user", "create_order"])
        .composite(|args, ctx| async move {
            let user = ctx.call("get_user", json!({"id": args["user"]})).await?;
            let order = ctx
                .call("create_order", json!({"user": user["id"]}))
                .await?;
            Ok(json!({"user": user["name"], "order": order["order"]}))
        });
    let both_users = Tool::builder("both_users", Effect::Read)
        .nested(["get_user"])
        .composite(|args, ctx| async move {
            // Independent nested reads, awaited together.
            let (a, b) = futures::join!(
                ctx.call("get_user", json!({"id": args["a"]})),
                ctx.call("get_user", json!({"id": args["b"]}))
            );
            Ok(json!([a?["name"], b?["name"]]))
        });
    let wrap_flaky = Tool::builder("wrap_flaky", Effect::Read)
        .nested(["flaky"])
        .composite(|args, ctx| async move { ctx.call("flaky", args).await });
    let wrap_bad = Tool::builder("wrap_bad", Effect::Read)
        .nested(["bad_output"])
        .composite(|_, ctx| async move { ctx.call("bad_output", json!({})).await });
    let slow_wrap = Tool::builder("slow_wrap", Effect::Read)
        .nested(["hang"])
        .timeout(Duration::from_millis(20))
        .composite(|_, ctx| async move { ctx.call("hang", json!({})).await });
    let mut manifests = Manifests::new();
    manifests
        .load_str(Path::new("composites.toml"), MANIFEST)
        .unwrap();
    let registry = Registry::builder()
        .tools(fixture_tools(probe))
        .tools([place_order, both_users, wrap_flaky, wrap_bad, slow_wrap])
        .tools(manifests.into_tools())
        .build()
        .unwrap();
    Runtime::builder(registry).limits(budget).build()
}

async fn run(script: &str) -> toolscript::RunOutcome {
    run_in(
        &runtime(&Probe::default(), Limits::default()),
        script,
        Mode::Sequential,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn composites_call_their_nested_tools() {
    let outcome =
        run("[summary(#{id: 4}), both_users(#{a: 1, b: 2}), place_order(#{user: 7})]").await;
    assert_eq!(
        value_of(&outcome),
        &json!([
            {"name": "user4", "orders": 1},
            ["user1", "user2"],
            {"user": "user7", "order": 1}
        ])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undeclared_tools_are_permission_denied() {
    for how in ["name", "generic"] {
        let outcome = run(&format!("sneaky(#{{how: \"{how}\"}})")).await;
        let e = error_of(&outcome);
        assert_eq!(e.kind, ErrorKind::PermissionDenied, "{how}: {e}");
        assert!(e.message.contains("create_order"), "{}", e.message);
        assert_eq!(e.tool.as_deref(), Some("sneaky"));
        assert!(outcome.effects.is_empty(), "the write never ran");
    }
    // A tool that is not a composite may call nothing.
    let plain = Tool::builder("plain", Effect::Read)
        .composite(|_, ctx| async move { ctx.call("get_user", json!({"id": 1})).await });
    let runtime = Runtime::new(
        Registry::builder()
            .tools(fixture_tools(&Probe::default()))
            .tool(plain)
            .build()
            .unwrap(),
    );
    let outcome = runtime.run("plain()").await;
    assert_eq!(error_of(&outcome).kind, ErrorKind::PermissionDenied);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_calls_spend_the_run_budget() {
    let mut budget = Limits::default();
    budget.max_calls = 5;
    let runtime = runtime(&Probe::default(), budget);
    // Each summary is three calls: itself and two nested ones.
    let script = "let out = [];\nfor id in 1..=3 {\n  out.push(summary(#{id: id}).name);\n}\nout";
    let outcome = run_in(&runtime, script, Mode::Sequential).await;
    let e = error_of(&outcome);
    assert_eq!(e.kind, ErrorKind::BudgetExceeded, "{e}");
    assert_eq!(e.line, Some(3));
    assert_eq!(e.tool.as_deref(), Some("summary"));
    let speculative = run_in(&runtime, script, Mode::Speculative).await;
    assert_eq!(error_of(&speculative).kind, ErrorKind::BudgetExceeded);
    assert_eq!(error_of(&speculative).line, Some(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_tool_failing_opens_its_breaker_for_everyone() {
    let probe = Probe::default();
    probe.failing.store(true, Ordering::SeqCst);
    let runtime = runtime(&probe, Limits::default());
    let script = "let kinds = [];\nfor i in 0..5 { try { wrap_flaky(#{i: i}); } catch (e) { kinds.push(e.kind); } }\ntry { flaky(#{i: 99}); } catch (e) { kinds.push(e.kind); }\nkinds";
    let outcome = run_in(&runtime, script, Mode::Sequential).await;
    assert_eq!(
        value_of(&outcome),
        &json!([
            "unavailable",
            "unavailable",
            "unavailable",
            "unavailable",
            "unavailable",
            "circuit_open"
        ])
    );
    assert_eq!(Probe::count(&probe.flaky_calls), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_receipts_name_their_parent_and_verify() {
    let outcome = run("summary(#{id: 4}); place_order(#{user: 2})").await;
    value_of(&outcome);
    let receipts = &outcome.receipts;
    let summary = receipts.iter().find(|r| r.tool == "summary").unwrap();
    let place = receipts.iter().find(|r| r.tool == "place_order").unwrap();
    let children = |parent: u64| -> Vec<&str> {
        receipts
            .iter()
            .filter(|r| r.parent == Some(parent))
            .map(|r| r.tool.as_str())
            .collect()
    };
    assert_eq!(children(summary.call_id), ["get_user", "get_orders"]);
    assert_eq!(children(place.call_id), ["get_user", "create_order"]);
    assert_eq!(summary.parent, None);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.jsonl");
    write_receipts(&path, receipts).unwrap();
    assert_eq!(verify_receipts(&path).unwrap(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_errors_keep_their_kind() {
    let outcome = run("wrap_bad()").await;
    let e = error_of(&outcome);
    assert_eq!(e.kind, ErrorKind::InvalidOutput);
    assert!(e.message.contains("bad_output"), "{}", e.message);
    assert!(!e.message.contains("secret-value-42"));

    let outcome = run("let x = 1;\nthrower()").await;
    let e = error_of(&outcome);
    assert_eq!(e.kind, ErrorKind::Conflict);
    assert_eq!(e.message, "user 1 is busy");
    assert_eq!((e.line, e.tool.as_deref()), (Some(2), Some("thrower")));

    let outcome = run("careful()").await;
    assert_eq!(value_of(&outcome), &json!({"caught": "not_found"}));
}

#[tokio::test(start_paused = true)]
async fn the_composite_timeout_bounds_its_body() {
    let outcome = run_in(
        &runtime(&Probe::default(), Limits::default()),
        "slow_wrap()",
        Mode::Sequential,
    )
    .await;
    let e = error_of(&outcome);
    assert_eq!(e.kind, ErrorKind::Timeout);
    assert!(e.message.contains("20 ms"), "{}", e.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_writes_follow_their_composite_in_the_effect_log() {
    let outcome = run("place_order(#{user: 3}); try { place_order(#{user: 0}); } catch {}").await;
    value_of(&outcome);
    let effects: Vec<(&str, Value, Option<bool>)> = outcome
        .effects
        .iter()
        .map(|e| (e.tool.as_str(), e.args.clone(), e.ok))
        .collect();
    assert_eq!(
        effects,
        [
            ("place_order", json!({"user": 3}), Some(true)),
            ("create_order", json!({"user": 3}), Some(true)),
            ("place_order", json!({"user": 0}), Some(false)),
            ("create_order", json!({"user": 0}), Some(false)),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_composites_are_speculated_and_change_nothing() {
    let runtime = || runtime(&Probe::default(), Limits::default());
    let script = "let out = [];\nfor id in 1..=6 { out.push(summary(#{id: id})); }\nplace_order(#{user: 2});\nout.push(summary(#{id: 2}));\nout";
    let sequential = run_in(&runtime(), script, Mode::Sequential).await;
    let speculative = run_in(&runtime(), script, Mode::Speculative).await;
    assert_eq!(
        toolscript::bench::observable(&sequential),
        toolscript::bench::observable(&speculative)
    );
    assert!(speculative
        .receipts
        .iter()
        .filter(|r| r.speculative)
        .all(|r| r.effect == Effect::Read));
    // A claimed composite's nested calls are claimed with it.
    for r in speculative
        .receipts
        .iter()
        .filter(|r| r.speculative && r.parent.is_some())
    {
        let parent = speculative
            .receipts
            .iter()
            .find(|p| Some(p.call_id) == r.parent)
            .unwrap();
        assert_eq!(r.claimed, parent.claimed);
    }
}

#[test]
fn the_catalog_shows_composites_with_their_nested_tools() {
    let runtime = runtime(&Probe::default(), Limits::default());
    let text = runtime.describe(toolscript::Format::Text);
    assert!(
        text.contains("composite of: get_user, get_orders"),
        "{text}"
    );
    let rhai = runtime.describe(toolscript::Format::Rhai);
    assert!(
        rhai.contains("/// composite: calls get_user, create_order\nfn place_order("),
        "{rhai}"
    );
    let json: Value = serde_json::from_str(&runtime.describe(toolscript::Format::Json)).unwrap();
    let summary = json
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "summary")
        .unwrap();
    assert_eq!(summary["nested"], json!(["get_user", "get_orders"]));
}

/// A composite whose timeout drops its nested call's future: both calls still get their one
/// receipt (the nested read `cancelled`), the chain verifies, and nothing stays in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_composite_timeout_leaves_every_nested_call_a_receipt() {
    let manifest = r##"
[[tool]]
name = "slow_read"
effect = "read"
latency_ms = 5000
script = "#{ ok: true }"

[[tool]]
name = "impatient"
effect = "read"
timeout_ms = 200
nested = ["slow_read"]
script = "slow_read(#{})"
"##;
    let mut manifests = Manifests::new();
    manifests
        .load_str(Path::new("timeout.toml"), manifest)
        .unwrap();
    let runtime = Runtime::new(manifests.into_registry().unwrap());
    for mode in [Mode::Sequential, Mode::Speculative] {
        let progress = std::sync::Arc::new(toolscript::Progress::default());
        let options = toolscript::RunOptions::with_mode(mode).progress(progress.clone());
        let outcome = runtime
            .run_with(
                "let k = (); try { impatient(#{}) } catch (e) { k = e.kind } k",
                options,
            )
            .await;
        assert_eq!(value_of(&outcome), &json!("timeout"), "{mode:?}");
        // Receipts come in the order calls finish: either may be first.
        let mut executor: Vec<_> = outcome
            .receipts
            .iter()
            .filter(|r| !r.speculative || r.claimed)
            .map(|r| (r.tool.as_str(), r.error_kind.as_deref(), r.parent.is_some()))
            .collect();
        executor.sort();
        assert_eq!(
            executor,
            [
                ("impatient", Some("timeout"), false),
                ("slow_read", Some("cancelled"), true),
            ],
            "{mode:?}: both calls have a receipt"
        );
        let composites = outcome.receipts.iter().filter(|r| r.tool == "impatient");
        assert_eq!(
            composites.count(),
            1,
            "{mode:?}: a speculated composite is claimed, not redone"
        );
        assert_eq!(outcome.stats.dispatched as usize, outcome.receipts.len());
        assert_eq!(progress.in_flight(), 0, "{mode:?}: nothing stays in flight");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("receipts.jsonl");
        write_receipts(&file, &outcome.receipts).unwrap();
        assert_eq!(verify_receipts(&file).unwrap(), outcome.receipts.len());
    }
}
