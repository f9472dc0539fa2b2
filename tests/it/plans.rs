//! Plan, then apply: a plan makes no non-read call and lists each, in order, with its
//! arguments (values from an earlier planned call as markers); apply on an unchanged world
//! makes exactly the planned calls, in order, without asking for the approvals the plan gives;
//! a world changed between plan and apply pauses the run at the first call the plan did not
//! plan, and nothing unplanned is made without a person; a plan is applied once, and not after
//! it expired or its catalog changed; both modes give the same plan and the same effects.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tempfile::TempDir;
use toolscript::guard::{Guard, Rule, Ruling};
use toolscript::plan::{CallStatus, PlanStatus};
use toolscript::receipts::Status;
use toolscript::{
    Approval, Awaiting, Decision, Effect, Error, ErrorKind, Limits, Mode, Registry, RunOptions,
    RunStatus, Runtime, SqliteStore, Tool, ToolError,
};

/// The world the tools act on: orders (id → amount in cents, status) and, in order, every
/// non-read call that reached a tool.
#[derive(Default)]
struct World {
    orders: BTreeMap<i64, (i64, &'static str)>,
    made: Vec<(String, Value)>,
    /// When set, a write tells it when its body starts, then takes 100 ms.
    started: Option<Arc<tokio::sync::Notify>>,
}

type Shared = Arc<Mutex<World>>;

fn world() -> Shared {
    let mut w = World::default();
    w.orders.insert(1, (719, "delivered"));
    w.orders.insert(2, (300, "delivered"));
    w.orders.insert(3, (2_500, "delivered"));
    w.orders.insert(4, (900, "lost"));
    Arc::new(Mutex::new(w))
}

fn made(world: &Shared) -> Vec<(String, Value)> {
    world.lock().unwrap().made.clone()
}

fn tools(world: &Shared) -> Vec<Tool> {
    let list = {
        let world = Arc::clone(world);
        move |_: Value| {
            let ids: Vec<Value> = world
                .lock()
                .unwrap()
                .orders
                .keys()
                .map(|id| json!({ "id": id }))
                .collect();
            async move { Ok(Value::Array(ids)) }
        }
    };
    let get = {
        let world = Arc::clone(world);
        move |args: Value| {
            let id = args["id"].as_i64().unwrap_or_default();
            let found = world.lock().unwrap().orders.get(&id).copied();
            async move {
                match found {
                    Some((amount, status)) => {
                        Ok(json!({ "id": id, "amount_cents": amount, "status": status }))
                    }
                    None => Err(ToolError::not_found(format!("no order {id}"))),
                }
            }
        }
    };
    let write = |name: &'static str, answer: fn(usize, &Value) -> Value| {
        let world = Arc::clone(world);
        move |args: Value| {
            let started = world.lock().unwrap().started.clone();
            let world = Arc::clone(&world);
            async move {
                if let Some(started) = started {
                    started.notify_one();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                let mut w = world.lock().unwrap();
                w.made.push((name.to_string(), args.clone()));
                let n = w.made.len();
                Ok(answer(n, &args))
            }
        }
    };
    vec![
        Tool::builder("list_orders", Effect::Read).handler(list),
        Tool::builder("get_order", Effect::Read).handler(get),
        Tool::builder("issue_refund", Effect::Write)
            .plan_result(r#"#{ refund_id: "planned", amount_cents: args.amount_cents }"#)
            .unwrap()
            .handler(write("issue_refund", |n, args| {
                json!({ "refund_id": format!("rf_{n}"), "amount_cents": args["amount_cents"] })
            })),
        Tool::builder("notify", Effect::External)
            .approval(Approval::Always)
            .handler(write("notify", |_, _| json!({ "sent": true }))),
        Tool::builder("close_books", Effect::Write)
            .plan_stop()
            .handler(write("close_books", |_, _| json!("closed"))),
        Tool::builder("flag", Effect::Write).handler(write("flag", |_, _| json!("flagged"))),
    ]
}

/// The calls the triage makes on the world as `world` sets it up, in order.
fn triage_applied() -> Vec<(String, Value)> {
    vec![
        (
            "issue_refund".into(),
            json!({"order_id": 1, "amount_cents": 719}),
        ),
        (
            "notify".into(),
            json!({"text": "refunded rf_1 for order 1", "refund": "rf_1"}),
        ),
        (
            "issue_refund".into(),
            json!({"order_id": 3, "amount_cents": 2500}),
        ),
        (
            "notify".into(),
            json!({"text": "refunded rf_3 for order 3", "refund": "rf_3"}),
        ),
    ]
}

/// Refunds every delivered order over $5, each with a note naming its refund.
const TRIAGE: &str = r#"
let total = 0;
for o in list_orders(#{}) {
    let d = get_order(#{ id: o.id });
    if d.amount_cents > 500 && d.status == "delivered" {
        let r = issue_refund(#{ order_id: d.id, amount_cents: d.amount_cents });
        notify(#{ text: `refunded ${r.refund_id} for order ${d.id}`, refund: r.refund_id });
        total += d.amount_cents;
    }
}
total
"#;

struct Setup {
    _dir: TempDir,
    world: Shared,
    runtime: Runtime,
}

fn setup_with(limits: Limits, guard: Option<Guard>) -> Setup {
    let dir = TempDir::new().unwrap();
    let world = world();
    let mut registry = Registry::builder().tools(tools(&world));
    if let Some(guard) = guard {
        registry = registry.guard(guard);
    }
    let store = SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap();
    let runtime = Runtime::builder(registry.build().unwrap())
        .store(Arc::new(store))
        .limits(limits)
        .build();
    Setup {
        _dir: dir,
        world,
        runtime,
    }
}

fn setup() -> Setup {
    setup_with(Limits::default(), None)
}

/// The triage planned in `mode` on `s`'s world.
async fn plan_triage(s: &Setup, mode: Mode) -> toolscript::plan::Plan {
    s.runtime
        .plan(TRIAGE, mode_options(mode))
        .await
        .unwrap()
        .plan
}

/// The world changes: order `id` now has `cents` and `status`.
fn set_order(s: &Setup, id: i64, cents: i64, status: &'static str) {
    s.world.lock().unwrap().orders.insert(id, (cents, status));
}

fn mode_options(mode: Mode) -> RunOptions {
    RunOptions::with_mode(mode)
}

fn planned_tools(plan: &toolscript::plan::Plan) -> Vec<(String, Value)> {
    plan.calls
        .iter()
        .map(|c| (c.tool.clone(), c.args.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_makes_no_write_and_lists_every_call_in_order_the_same_in_both_modes() {
    let mut plans = Vec::new();
    for mode in [Mode::Sequential, Mode::Speculative] {
        let s = setup();
        let planned = s.runtime.plan(TRIAGE, mode_options(mode)).await.unwrap();
        assert!(
            made(&s.world).is_empty(),
            "a plan made a call: {:?}",
            made(&s.world)
        );
        let plan = planned.plan;
        assert_eq!(plan.status, PlanStatus::Complete);
        assert!(
            !plan.plan_id.is_empty(),
            "a runtime with a store keeps the plan"
        );
        assert_eq!(
            planned_tools(&plan),
            vec![
                (
                    "issue_refund".into(),
                    json!({"order_id": 1, "amount_cents": 719})
                ),
                (
                    "notify".into(),
                    json!({"text": "refunded <from planned #0 .refund_id> for order 1", "refund": "<from planned #0 .refund_id>"})
                ),
                (
                    "issue_refund".into(),
                    json!({"order_id": 3, "amount_cents": 2500})
                ),
                (
                    "notify".into(),
                    json!({"text": "refunded <from planned #2 .refund_id> for order 3", "refund": "<from planned #2 .refund_id>"})
                ),
            ]
        );
        assert!(plan.calls.iter().all(|c| c.status == CallStatus::Planned));
        assert_eq!(
            plan.calls[0].result,
            json!({"refund_id": "<from planned #0 .refund_id>", "amount_cents": 719})
        );
        // The approval `notify` needs is what applying the plan gives.
        assert!(plan.calls[1].asks.as_deref().unwrap().contains("approval"));
        assert!(plan.calls[0].asks.is_none());
        assert_eq!(plan.value, Some(json!(3219)));
        // Every read it used, with its result's hash: 1 list, 4 orders.
        assert_eq!(plan.reads.len(), 5);
        // Each planned call has a receipt saying it was planned, not made.
        let statuses: Vec<Status> = planned
            .run
            .receipts
            .iter()
            .filter(|r| r.effect != Effect::Read)
            .map(|r| r.status)
            .collect();
        assert_eq!(statuses, vec![Status::Planned; 4]);
        // A person reads it one call a line.
        let text = plan.render();
        assert!(
            text.contains("+ issue_refund #{ amount_cents: 719, order_id: 1 }"),
            "{text}"
        );
        assert!(text.contains("reads after a planned call see the world without it"));
        plans.push((planned_tools(&plan), plan.value.clone()));
    }
    assert_eq!(plans[0], plans[1], "both modes plan the same");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_on_an_unchanged_world_makes_exactly_the_planned_calls_without_asking() {
    for mode in [Mode::Sequential, Mode::Speculative] {
        let s = setup();
        let plan = plan_triage(&s, mode).await;
        let outcome = s
            .runtime
            .apply(&plan.plan_id, mode_options(mode))
            .await
            .unwrap();
        assert_eq!(
            outcome.status(),
            RunStatus::Completed,
            "{:?}",
            outcome.result
        );
        assert_eq!(outcome.result.as_ref().unwrap(), &json!(3219));
        assert!(outcome.unapplied.is_empty());
        // Exactly the planned calls, in order, markers standing for what was returned.
        assert_eq!(made(&s.world), triage_applied(), "{mode:?}");
        // A plan is applied once.
        let again = s.runtime.apply(&plan.plan_id, RunOptions::default()).await;
        match again {
            Err(Error::Plan { message, .. }) => {
                assert!(message.contains("applied already"), "{message}");
                assert!(message.contains(&outcome.run_id), "{message}");
            }
            other => panic!("a second apply was not refused: {other:?}"),
        }
        assert_eq!(made(&s.world).len(), 4);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_world_pauses_at_the_first_divergent_call_and_makes_nothing_unplanned() {
    for mode in [Mode::Sequential, Mode::Speculative] {
        let s = setup();
        let plan = plan_triage(&s, mode).await;
        // Order 3's amount changes: its refund is another call.
        set_order(&s, 3, 2_400, "delivered");
        let outcome = s
            .runtime
            .apply(&plan.plan_id, mode_options(mode))
            .await
            .unwrap();
        assert_eq!(outcome.status(), RunStatus::Paused, "{:?}", outcome.result);
        let pending = outcome.pending.clone().unwrap();
        assert_eq!(pending.awaiting, Awaiting::PlanDivergence);
        assert_eq!(pending.tool, "issue_refund");
        assert_eq!(pending.args, json!({"order_id": 3, "amount_cents": 2400}));
        let planned = pending.planned.clone().unwrap();
        assert_eq!(
            planned["args"],
            json!({"order_id": 3, "amount_cents": 2500})
        );
        let why = pending.why.clone().unwrap();
        assert!(why.contains("`get_order` {\"id\":3}"), "{why}");
        assert_eq!(
            outcome.report().to_json()["pending"]["awaiting"],
            json!("plan_divergence")
        );
        // The planned calls before it were made; the divergent one was not.
        assert_eq!(made(&s.world).len(), 2, "{mode:?}");
        // A person rejects it: the script's call throws, and nothing more is made.
        let rejected = s
            .runtime
            .resume(
                &outcome.run_id,
                Some(Decision::Reject {
                    reason: Some("the amount changed".into()),
                }),
                RunOptions::default(),
            )
            .await
            .unwrap();
        let e = rejected.result.as_ref().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Rejected, "{e:?}");
        assert_eq!(made(&s.world).len(), 2);
        // The calls the run never reached are listed; the run ended.
        assert_eq!(rejected.status(), RunStatus::Failed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_divergence_is_made_and_the_plan_goes_on_where_it_was() {
    let s = setup();
    let plan = plan_triage(&s, Mode::Speculative).await;
    // A new order: an extra refund and note before the planned ones of order 3.
    set_order(&s, 2, 650, "delivered");
    let outcome = s
        .runtime
        .apply(&plan.plan_id, RunOptions::default())
        .await
        .unwrap();
    let pending = outcome.pending.clone().unwrap();
    assert_eq!(pending.awaiting, Awaiting::PlanDivergence);
    assert_eq!(pending.args, json!({"order_id": 2, "amount_cents": 650}));
    // Approved: made; its note is not planned either, and asks again.
    let next = s
        .runtime
        .resume(
            &outcome.run_id,
            Some(Decision::Approve),
            RunOptions::default(),
        )
        .await
        .unwrap();
    let pending = next.pending.clone().unwrap();
    assert_eq!(pending.awaiting, Awaiting::PlanDivergence);
    assert_eq!(pending.tool, "notify");
    let done = s
        .runtime
        .resume(&next.run_id, Some(Decision::Approve), RunOptions::default())
        .await
        .unwrap();
    assert_eq!(done.status(), RunStatus::Completed, "{:?}", done.result);
    // Then order 3's planned calls matched the plan again, without a question.
    let tools: Vec<(String, i64)> = made(&s.world)
        .into_iter()
        .map(|(tool, args)| {
            let order = args["order_id"].as_i64().unwrap_or(-1);
            (tool, order)
        })
        .collect();
    assert_eq!(
        tools,
        vec![
            ("issue_refund".into(), 1),
            ("notify".into(), -1),
            ("issue_refund".into(), 2),
            ("notify".into(), -1),
            ("issue_refund".into(), 3),
            ("notify".into(), -1),
        ]
    );
    assert!(done.unapplied.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planned_calls_the_run_never_reached_are_listed_as_unapplied() {
    let s = setup();
    let plan = plan_triage(&s, Mode::Speculative).await;
    // Order 3 was refunded elsewhere in the meantime: the script does less.
    set_order(&s, 3, 2_500, "refunded");
    let outcome = s
        .runtime
        .apply(&plan.plan_id, RunOptions::default())
        .await
        .unwrap();
    assert_eq!(
        outcome.status(),
        RunStatus::Completed,
        "{:?}",
        outcome.result
    );
    assert_eq!(made(&s.world).len(), 2);
    let unapplied: Vec<&str> = outcome.unapplied.iter().map(|c| c.tool.as_str()).collect();
    assert_eq!(unapplied, ["issue_refund", "notify"]);
    assert_eq!(outcome.unapplied[0].args["order_id"], json!(3));
    let json = outcome.to_json();
    assert_eq!(json["unapplied"].as_array().unwrap().len(), 2, "{json}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_plan_and_a_plan_of_another_catalog_are_refused_with_why() {
    let mut limits = Limits::default();
    limits.set("plan_ttl_s", 0.05).unwrap();
    let s = setup_with(limits, None);
    let plan = plan_triage(&s, Mode::Speculative).await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    match s.runtime.apply(&plan.plan_id, RunOptions::default()).await {
        Err(Error::Plan { message, .. }) => assert!(message.contains("expired"), "{message}"),
        other => panic!("an expired plan was applied: {other:?}"),
    }
    // Another catalog over the same store: one tool fewer.
    let s = setup();
    let plan = plan_triage(&s, Mode::Speculative).await;
    let fewer: Vec<Tool> = tools(&s.world)
        .into_iter()
        .filter(|t| t.spec().name != "flag")
        .collect();
    let other = Runtime::builder(Registry::builder().tools(fewer).build().unwrap())
        .store(Arc::clone(s.runtime.store().unwrap()))
        .build();
    match other.apply(&plan.plan_id, RunOptions::default()).await {
        Err(Error::Plan { message, .. }) => {
            assert!(message.contains("catalog changed"), "{message}");
            assert!(message.contains("flag"), "{message}");
        }
        other => panic!("a plan of another catalog was applied: {other:?}"),
    }
    match s.runtime.apply("pnosuchplan", RunOptions::default()).await {
        Err(Error::Plan { message, .. }) => assert!(message.contains("no such plan"), "{message}"),
        other => panic!("an unknown plan was applied: {other:?}"),
    }
    assert!(made(&s.world).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_tool_ends_the_plan_incomplete_with_what_was_planned() {
    let s = setup();
    let script = r#"
        let r = issue_refund(#{ order_id: 1, amount_cents: 719 });
        let c = close_books(#{ after: r.refund_id });
        try { flag(#{ id: 1 }); } catch (e) { print(e); }
        c
    "#;
    let planned = s.runtime.plan(script, RunOptions::default()).await.unwrap();
    let plan = &planned.plan;
    assert_eq!(plan.status, PlanStatus::Incomplete);
    let tools: Vec<&str> = plan.calls.iter().map(|c| c.tool.as_str()).collect();
    assert_eq!(
        tools,
        ["issue_refund", "close_books"],
        "nothing after the stop"
    );
    assert!(plan.calls[1].stop);
    assert_eq!(
        plan.calls[1].args,
        json!({"after": "<from planned #0 .refund_id>"})
    );
    let e = planned.run.result.as_ref().unwrap_err();
    assert_eq!(e.kind, ErrorKind::PlanIncomplete, "{e:?}");
    assert!(planned.run.logs.is_empty(), "the stop is not catchable");
    assert_eq!(
        plan.error.as_ref().unwrap()["kind"],
        json!("plan_incomplete")
    );
    assert!(made(&s.world).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_refuses_and_asks_in_a_plan_as_in_a_run_and_apply_gives_what_it_asks() {
    let dir = TempDir::new().unwrap();
    let guard = Guard::builder(dir.path())
        .rule(
            Rule::new(
                ["issue_refund"],
                Ruling::Ask,
                "refunds over $20 need a person",
            )
            .unwrap()
            .when("args.amount_cents > 2000")
            .unwrap(),
        )
        .rule(Rule::new(["flag"], Ruling::Deny, "flags are off").unwrap())
        .build()
        .unwrap();
    let s = setup_with(Limits::default(), Some(guard));
    let script = format!(
        "{TRIAGE}; let f = (); try {{ flag(#{{ id: 1 }}); }} catch (e) {{ f = e.kind; }} f"
    );
    let plan = s
        .runtime
        .plan(&script, RunOptions::default())
        .await
        .unwrap()
        .plan;
    let refused: Vec<&str> = plan
        .calls
        .iter()
        .filter(|c| c.status == CallStatus::Refused)
        .map(|c| c.tool.as_str())
        .collect();
    assert_eq!(refused, ["flag"]);
    assert_eq!(
        plan.calls.last().unwrap().error.as_ref().unwrap().kind,
        "permission_denied"
    );
    assert_eq!(plan.value, Some(json!("permission_denied")));
    let asked = plan
        .calls
        .iter()
        .find(|c| c.args["amount_cents"] == json!(2500))
        .unwrap();
    assert!(
        asked.asks.as_deref().unwrap().contains("refunds over $20"),
        "{asked:?}"
    );
    let outcome = s
        .runtime
        .apply(&plan.plan_id, RunOptions::default())
        .await
        .unwrap();
    assert_eq!(
        outcome.status(),
        RunStatus::Completed,
        "{:?}",
        outcome.result
    );
    assert_eq!(
        outcome.result.as_ref().unwrap(),
        &json!("permission_denied")
    );
    let tools: Vec<String> = made(&s.world).into_iter().map(|(t, _)| t).collect();
    assert_eq!(tools, ["issue_refund", "notify", "issue_refund", "notify"]);
}

/// Apply is a durable run: its future dropped while a planned write runs (its caller went
/// away), the run is interrupted; a resume goes on applying the plan, the journal answering
/// the write already made, so that every planned call is made once and later markers stand
/// for what it really returned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_apply_resumes_and_makes_each_planned_call_once() {
    let s = setup();
    let plan = plan_triage(&s, Mode::Speculative).await;
    let started = Arc::new(tokio::sync::Notify::new());
    s.world.lock().unwrap().started = Some(Arc::clone(&started));
    {
        let apply = s.runtime.apply(&plan.plan_id, RunOptions::default());
        tokio::pin!(apply);
        tokio::select! {
            outcome = &mut apply => panic!("the apply ended before its first write began: {outcome:?}"),
            () = started.notified() => {}
        }
        // The apply's future is dropped here, mid-call.
    }
    let store = s.runtime.store().unwrap();
    let (id, status) = crate::support::the_run_once_ended(store.as_ref()).await;
    assert_eq!(status, RunStatus::Interrupted);
    s.world.lock().unwrap().started = None;
    let done = s
        .runtime
        .resume(&id, None, RunOptions::default())
        .await
        .unwrap();
    assert_eq!(done.status(), RunStatus::Completed, "{:?}", done.result);
    assert_eq!(made(&s.world), triage_applied());
    assert!(done.unapplied.is_empty());
}

/// A planned call whose arguments hold a value a tool redacts is shown and kept masked (the
/// store's files never hold it), and apply matches it by its keyed digest: the same value is
/// the planned call, another one diverges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redacted_arguments_are_kept_masked_and_matched_by_digest() {
    const CARD: &str = "4111-SENTINEL-2222-9c1d";
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("store.sqlite3");
    let card = Arc::new(Mutex::new(CARD.to_string()));
    let charged: Arc<Mutex<Vec<Value>>> = Arc::default();
    let get_card = {
        let card = Arc::clone(&card);
        Tool::builder("get_card", Effect::Read)
            .redact(["result.number"])
            .handler(move |_: Value| {
                let number = card.lock().unwrap().clone();
                async move { Ok(json!({ "number": number })) }
            })
    };
    let charge = {
        let charged = Arc::clone(&charged);
        Tool::builder("charge", Effect::Write)
            .redact(["args.card"])
            .plan_result(r#"#{ charge_id: "planned" }"#)
            .unwrap()
            .handler(move |args: Value| {
                charged.lock().unwrap().push(args);
                async move { Ok(json!({"charge_id": "ch_1"})) }
            })
    };
    let registry = Registry::builder()
        .tool(get_card)
        .tool(charge)
        .build()
        .unwrap();
    let runtime = Runtime::builder(registry)
        .store(Arc::new(SqliteStore::open(&path).unwrap()))
        .build();
    let script = "let c = get_card(#{}); charge(#{ card: c.number, cents: 500 }).charge_id";
    let plan = runtime
        .plan(script, RunOptions::default())
        .await
        .unwrap()
        .plan;
    assert_eq!(
        plan.calls[0].args,
        json!({"card": "[redacted]", "cents": 500})
    );
    assert!(plan.calls[0]
        .digest
        .as_deref()
        .unwrap()
        .starts_with("hmac:"));
    assert!(!plan.to_json().to_string().contains(CARD));
    let holds_card = || {
        std::fs::read_dir(dir.path()).unwrap().any(|entry| {
            let bytes = std::fs::read(entry.unwrap().path()).unwrap();
            bytes.windows(CARD.len()).any(|w| w == CARD.as_bytes())
        })
    };
    assert!(!holds_card(), "the store's files hold the redacted value");
    let outcome = runtime
        .apply(&plan.plan_id, RunOptions::default())
        .await
        .unwrap();
    assert_eq!(outcome.result.as_ref().unwrap(), &json!("ch_1"));
    assert_eq!(
        charged.lock().unwrap().clone(),
        [json!({"card": CARD, "cents": 500})]
    );
    assert!(!holds_card(), "the store's files hold the redacted value");
    // The card changed between plan and apply: the charge diverges.
    let plan = runtime
        .plan(script, RunOptions::default())
        .await
        .unwrap()
        .plan;
    *card.lock().unwrap() = "5500-OTHER-CARD-0000".into();
    let outcome = runtime
        .apply(&plan.plan_id, RunOptions::default())
        .await
        .unwrap();
    let pending = outcome.pending.expect("the run diverged");
    assert_eq!(pending.awaiting, Awaiting::PlanDivergence);
    assert_eq!(pending.args["card"], json!("[redacted]"));
    assert_eq!(
        charged.lock().unwrap().len(),
        1,
        "nothing unplanned was made"
    );
}

/// The top-level non-read calls of a run's receipts that `keep` keeps: tool and the hash of
/// the arguments.
fn top_calls(
    outcome: &toolscript::RunOutcome,
    keep: impl Fn(&toolscript::receipts::Receipt) -> bool,
) -> Vec<(String, String)> {
    outcome
        .receipts
        .iter()
        .filter(|r| r.parent.is_none() && r.effect != Effect::Read && keep(r))
        .map(|r| (r.tool.clone(), r.args_sha256.to_string()))
        .collect()
}

/// Random scripts (reads, writes, composites, failures, branches on what writes changed):
/// planned sequentially and speculatively, each on a fresh world, give the same plan; applied,
/// each mode makes the same calls; and an apply never makes a call the plan did not plan: what
/// it makes is the start of the planned calls, in order, and the rest is `unapplied` or waits
/// at a divergence.
#[test]
fn random_scripts_plan_and_apply_the_same_in_both_modes_and_never_beyond_the_plan() {
    use proptest::prelude::*;
    let (rt, mut runner) = crate::equivalence::property_runner();
    let result = runner.run(&crate::equivalence::script_strategy(), |script| {
        let mut seen = Vec::new();
        for mode in [Mode::Sequential, Mode::Speculative] {
            let dir = TempDir::new().unwrap();
            let runtime = Runtime::builder(
                Registry::builder()
                    .tools(crate::equivalence::random_tools())
                    .build()
                    .unwrap(),
            )
            .store(Arc::new(
                SqliteStore::open(&dir.path().join("s.sqlite3")).unwrap(),
            ))
            .build();
            let (planned, applied) = rt.block_on(async {
                let planned = runtime.plan(&script, mode_options(mode)).await.unwrap();
                let applied = runtime
                    .apply(&planned.plan.plan_id, mode_options(mode))
                    .await
                    .unwrap();
                (planned, applied)
            });
            let plan_calls = top_calls(&planned.run, |r| r.status == Status::Planned);
            // The calls apply dispatched (each matched the plan's next planned call; one may
            // still fail or be refused there, as any call may) are the start of the plan's.
            let dispatched = top_calls(&applied, |_| true);
            prop_assert!(
                dispatched.len() <= plan_calls.len()
                    && dispatched[..] == plan_calls[..dispatched.len()],
                "{mode:?}: the apply dispatched {dispatched:?}, beyond the plan {plan_calls:?}\n{script}"
            );
            let made = top_calls(&applied, |r| r.attempt > 0);
            match &applied.pending {
                None => {
                    prop_assert_eq!(
                        dispatched.len() + applied.unapplied.len(),
                        plan_calls.len()
                    );
                }
                Some(pending) => {
                    prop_assert_eq!(pending.awaiting, Awaiting::PlanDivergence, "{}", script);
                }
            }
            let plan = &planned.plan;
            let calls: Vec<(String, Value, CallStatus)> = plan
                .calls
                .iter()
                .map(|c| (c.tool.clone(), c.args.clone(), c.status))
                .collect();
            seen.push((
                calls,
                plan.value.clone(),
                plan.error.as_ref().map(|e| e["kind"].clone()),
                made,
                applied.pending.map(|p| (p.tool, p.args)),
                applied.unapplied.len(),
            ));
        }
        prop_assert_eq!(&seen[0], &seen[1], "{}", script);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// The command line: `plan` prints one planned call a line and keeps the plan; `apply` makes
/// exactly those calls (exit 0); a second `apply` is refused (exit 2, naming the run);
/// `plan --no-store` says its plan cannot be applied.
#[cfg(feature = "cli")]
#[test]
fn plan_then_apply_on_the_command_line() {
    use crate::cli::toolscript;
    let dir = TempDir::new().unwrap();
    let store = dir.path().join("store.sqlite3");
    let store = store.to_str().unwrap();
    let planned = toolscript(&["plan", "scripts/demo.rhai", "--store", store]);
    assert_eq!(planned.code, 0, "{planned:?}");
    assert!(
        planned
            .stdout
            .contains("+ issue_refund #{ amount_cents: 719, order_id: 1701"),
        "{planned:?}"
    );
    assert!(
        planned.stdout.contains("<from planned #1 .refund_id>"),
        "{planned:?}"
    );
    let json = toolscript(&["plan", "scripts/demo.rhai", "--store", store, "--json"]);
    let plan: Value = serde_json::from_str(&json.stdout).unwrap();
    let planned_tools: Vec<&str> = plan["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["tool"].as_str().unwrap())
        .collect();
    let id = plan["plan_id"].as_str().unwrap();
    let applied = toolscript(&["apply", id, "--store", store, "--json"]);
    assert_eq!(applied.code, 0, "{applied:?}");
    let outcome: Value = serde_json::from_str(&applied.stdout).unwrap();
    let made: Vec<&str> = outcome["effects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["tool"].as_str().unwrap())
        .collect();
    assert_eq!(made, planned_tools);
    let again = toolscript(&["apply", id, "--store", store]);
    assert_eq!(again.code, 2, "{again:?}");
    assert!(again.stderr.contains("applied already"), "{again:?}");
    let throwaway = toolscript(&["plan", "scripts/demo.rhai", "--no-store"]);
    assert_eq!(throwaway.code, 0, "{throwaway:?}");
    assert!(
        throwaway.stderr.contains("cannot be applied"),
        "{throwaway:?}"
    );
    let unknown = toolscript(&["apply", "pnope", "--store", store]);
    assert_eq!(unknown.code, 2, "{unknown:?}");
    assert!(unknown.stderr.contains("no such plan"), "{unknown:?}");
}
