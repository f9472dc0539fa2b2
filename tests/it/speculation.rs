//! Speculation at work: what it starts, what it never starts, its caps, and what happens to the
//! reads nobody needed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolscript::bench::observable;
use toolscript::{Effect, Limits, Mode, Registry, Runtime, SpeculationLimits, Tool};

use crate::support::{fixture_tools, run_in, value_of, Probe};

/// Finishes `builder` with a body that takes `ms`, echoes its arguments and counts its calls.
fn counted(builder: toolscript::ToolBuilder, ms: u64) -> (Tool, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let tool = builder.handler(move |args| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(json!({"echo": args, "active": args["id"].as_i64().unwrap_or(0) % 2 == 0}))
        }
    });
    (tool, calls)
}

fn runtime_with(extra: Vec<Tool>) -> Runtime {
    let tools = fixture_tools(&Probe::default()).into_iter().chain(extra);
    Runtime::new(Registry::builder().tools(tools).build().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn independent_reads_are_started_early_and_claimed() {
    let runtime = runtime_with(Vec::new());
    let outcome = run_in(
        &runtime,
        "let out = [];\nfor id in 1..=20 { out.push(lookup(#{id: id}).id); }\nout.len()",
        Mode::Speculative,
    )
    .await;
    assert_eq!(value_of(&outcome), &json!(20));
    let s = &outcome.stats;
    assert!(s.speculative_launched >= 1, "{s:?}");
    assert_eq!(s.speculative_claimed, s.speculative_launched, "{s:?}");
    assert_eq!(s.speculative_wasted, 0);
    assert!(s.scout_passes >= 1);
    assert_eq!(s.tool_calls, 20);
    assert!(outcome
        .receipts
        .iter()
        .filter(|r| r.speculative)
        .all(|r| r.effect == Effect::Read));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opted_out_and_polling_reads_are_never_speculated() {
    let (private, private_calls) =
        counted(Tool::builder("costly", Effect::Read).speculate(false), 30);
    let (poll, _) = counted(Tool::builder("status", Effect::Read).allow_repeat(true), 30);
    let runtime = runtime_with(vec![private, poll]);
    let script = "let out = [];\nfor id in 1..=5 { out.push(costly(#{id: id}).echo.id); out.push(status(#{id: id}).echo.id); }\nout";
    let outcome = run_in(&runtime, script, Mode::Speculative).await;
    assert_eq!(value_of(&outcome), &json!([1, 1, 2, 2, 3, 3, 4, 4, 5, 5]));
    assert_eq!(private_calls.load(Ordering::SeqCst), 5);
    assert!(
        outcome.receipts.iter().all(|r| !r.speculative),
        "nothing was started by the scout"
    );
}

/// A read composite that nests a read which opts out of speculation is not speculated either:
/// the opted-out read runs exactly as often as the script asks, never ahead of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_composite_over_an_opted_out_read_is_never_speculated() {
    let (private, private_calls) =
        counted(Tool::builder("costly", Effect::Read).speculate(false), 30);
    let wrapper = Tool::builder("wrapper", Effect::Read)
        .nested(["costly"])
        .composite(|args, ctx| async move { ctx.call("costly", args).await });
    let runtime = runtime_with(vec![private, wrapper]);
    let script = "let out = [];\nfor id in 1..=10 { out.push(wrapper(#{id: id}).echo.id); }\nout";
    let outcome = run_in(&runtime, script, Mode::Speculative).await;
    assert_eq!(value_of(&outcome), &json!((1..=10).collect::<Vec<_>>()));
    assert_eq!(
        private_calls.load(Ordering::SeqCst),
        10,
        "once per call, never ahead"
    );
    assert!(outcome.receipts.iter().all(|r| !r.speculative));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_after_a_write_start_only_once_it_completed() {
    let (write, _) = counted(Tool::builder("save", Effect::Write), 60);
    let runtime = runtime_with(vec![write]);
    let script = "let a = lookup(#{id: 1});\nsave(#{id: a.id});\nlet out = [];\nfor id in 2..=6 { out.push(lookup(#{id: id}).id); }\nout";
    let outcome = run_in(&runtime, script, Mode::Speculative).await;
    assert_eq!(value_of(&outcome), &json!([2, 3, 4, 5, 6]));
    let save = outcome.receipts.iter().find(|r| r.tool == "save").unwrap();
    let save_end = save.started_ms + save.duration_ms;
    let first = toolscript::receipts::canonical_sha256(&json!({"id": 1}));
    let after: Vec<_> = outcome
        .receipts
        .iter()
        .filter(|r| r.tool == "lookup" && r.args_sha256 != first)
        .collect();
    assert_eq!(after.len(), 5);
    for r in after {
        assert!(
            r.started_ms >= save_end - 0.001,
            "a read started at {} ms, before the write ended at {save_end} ms",
            r.started_ms
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_nobody_needed_are_cancelled_when_the_run_ends() {
    let (slow, _) = counted(Tool::builder("archive", Effect::Read), 5_000);
    let (gate, _) = counted(Tool::builder("gate", Effect::Read), 200);
    let runtime = runtime_with(vec![slow, gate]);
    // Id 1 is not active, so the executor never reads the archive; while it waits 200 ms for
    // the gate, the scout guesses the condition true and starts the read.
    let script = "let u = gate(#{id: 1});\nif u.active { archive(#{id: 99}).echo.id } else { 0 }";
    let outcome = run_in(&runtime, script, Mode::Speculative).await;
    assert_eq!(value_of(&outcome), &json!(0));
    let archive: Vec<_> = outcome
        .receipts
        .iter()
        .filter(|r| r.tool == "archive")
        .collect();
    assert_eq!(archive.len(), 1, "the scout started the guessed read");
    assert!(archive[0].speculative && !archive[0].claimed);
    assert_eq!(archive[0].error_kind.as_deref(), Some("cancelled"));
    assert_eq!(outcome.stats.speculative_wasted, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_bound_speculation_without_changing_results() {
    let script = "let out = [];\nfor id in 1..=12 { let u = lookup(#{id: id}); if u.active { out.push(orders_of(#{id: u.id})); } }\nout";
    let capped = {
        let mut budget = Limits::default();
        budget.max_speculative_calls = 3;
        let mut limits = SpeculationLimits::default();
        limits.max_passes = 1;
        limits.max_in_flight = 2;
        Runtime::builder(
            Registry::builder()
                .tools(fixture_tools(&Probe::default()))
                .build()
                .unwrap(),
        )
        .limits(budget)
        .speculation(limits)
        .build()
    };
    let outcome = run_in(&capped, script, Mode::Speculative).await;
    assert!(
        outcome.stats.speculative_launched <= 3,
        "{:?}",
        outcome.stats
    );
    assert!(outcome.stats.scout_passes <= 1);
    let sequential = run_in(&capped, script, Mode::Sequential).await;
    assert_eq!(observable(&outcome), observable(&sequential));
    assert_eq!(value_of(&outcome).as_array().unwrap().len(), 6);
}

/// A read that fails with `unavailable` when asked to, after 20 ms; its input needs an
/// integer `n`.
fn fragile() -> Tool {
    Tool::builder("fragile", Effect::Read)
        .input_schema(json!({"type": "object", "properties": {"n": {"type": "integer"}, "fail": {"type": "boolean"}}, "required": ["n"]}))
        .handler(|args| async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if args["fail"] == json!(true) {
                Err(toolscript::ToolError::unavailable("down"))
            } else {
                Ok(args["n"].clone())
            }
        })
}

/// Runs `script` on a fresh runtime of `tools` (breakers open after 3 failures) in both modes;
/// returns the sequential outcome's value, checking the speculative one is the same.
async fn same_in_both_modes(
    tools: &dyn Fn() -> Vec<Tool>,
    budget: Limits,
    script: &str,
) -> serde_json::Value {
    let make = || {
        let mut breaker = toolscript::BreakerConfig::default();
        breaker.failure_threshold = 3;
        Runtime::builder(Registry::builder().tools(tools()).build().unwrap())
            .limits(budget.clone())
            .breaker(breaker)
            .build()
    };
    let sequential = run_in(&make(), script, Mode::Sequential).await;
    let speculative = run_in(&make(), script, Mode::Speculative).await;
    assert_eq!(
        observable(&sequential),
        observable(&speculative),
        "{script}"
    );
    assert!(
        speculative.stats.speculative_launched > 0,
        "the scout took part"
    );
    observable(&sequential)
}

const EACH_KIND: &str = "let out = [];\nfor a in ARGS {\n  try { out.push(CALL(a)); } catch (e) { out.push(e.kind); }\n}\nout";

/// A claimed `invalid_input` tells the breaker nothing, as in a sequential run: the breaker
/// opens at the same call in both modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_refusal_leaves_the_breaker_as_a_sequential_run_does() {
    let script = EACH_KIND
        .replace("ARGS", r#"[#{n: 1, fail: true}, #{n: 2, fail: true}, #{n: "x"}, #{n: 3, fail: true}, #{n: 4}]"#)
        .replace("CALL", "fragile");
    let observed = same_in_both_modes(&|| vec![fragile()], Limits::default(), &script).await;
    assert_eq!(
        observed["result"]["value"],
        json!([
            "unavailable",
            "unavailable",
            "invalid_input",
            "unavailable",
            "circuit_open"
        ])
    );
}

/// The nested calls of a claimed composite count in their own tool's breaker, as they do
/// when the composite runs sequentially.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_calls_of_a_claimed_composite_count_in_their_breakers() {
    let wrap = || {
        Tool::builder("wrap", Effect::Read)
            .nested(["fragile"])
            .composite(|args, ctx| async move { ctx.call("fragile", args).await })
    };
    let script = "let out = [];\nfor i in 1..=3 { try { wrap(#{n: i, fail: true}); } catch (e) { out.push(e.kind); } }\ntry { out.push(fragile(#{n: 9})); } catch (e) { out.push(e.kind); }\nout";
    let observed = same_in_both_modes(&|| vec![fragile(), wrap()], Limits::default(), script).await;
    assert_eq!(
        observed["result"]["value"],
        json!(["unavailable", "unavailable", "unavailable", "circuit_open"])
    );
}

/// A composite that catches its nested calls' errors, near the end of the budget: its claim
/// does not fit what is left, so the executor runs it and it sees the budget end inside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_composite_near_the_budget_end_sees_what_a_sequential_run_sees() {
    let pair = || {
        Tool::builder("pair", Effect::Read)
            .nested(["fragile"])
            .composite(|args, ctx| async move {
                let a = ctx.call("fragile", json!({"n": args["n"]})).await;
                let b = ctx.call("fragile", json!({"n": 100})).await;
                Ok(json!([a.is_ok(), b.map_err(|e| e.kind.to_string()).err()]))
            })
    };
    let mut budget = Limits::default();
    budget.max_calls = 5;
    let observed = same_in_both_modes(
        &|| vec![fragile(), pair()],
        budget,
        "[pair(#{n: 1}), pair(#{n: 2})]",
    )
    .await;
    assert_eq!(
        observed["result"]["value"],
        json!([[true, null], [true, "budget_exceeded"]])
    );
}

/// A CPU-heavy script tool with a tight timeout, called 32 times at once: the calls wait for a
/// script thread outside their timeout, so none times out under speculation (as none does
/// sequentially), and the breaker never opens. (A call takes about 0.14 s in a debug build on
/// an idle machine: the last of 32 queued on two threads would wait over 2 s if the wait
/// counted, while the timeout leaves a call ten times its own time on a busy machine.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queueing_for_a_slot_never_turns_into_timeouts() {
    let manifest = r#"
[[tool]]
name = "crunch"
effect = "read"
timeout_ms = 1500
input = { type = "object", properties = { n = { type = "integer" } }, required = ["n"] }
script = '''
let s = 0;
for i in 0..args.n { s += i; }
s
'''
"#;
    let make = || {
        let mut manifests = toolscript::Manifests::new();
        manifests
            .load_str(std::path::Path::new("crunch.toml"), manifest)
            .unwrap();
        Runtime::new(manifests.into_registry().unwrap())
    };
    let script = "let out = [];\nfor i in 0..32 {\n  try { out.push(crunch(#{n: 300000 + i}) > 0); } catch (e) { out.push(e.kind); }\n}\nout";
    let sequential = run_in(&make(), script, Mode::Sequential).await;
    let speculative = run_in(&make(), script, Mode::Speculative).await;
    assert_eq!(value_of(&sequential), &json!(vec![true; 32]));
    assert_eq!(observable(&sequential), observable(&speculative));
    assert!(speculative.stats.speculative_claimed > 0);
}

/// A read inside a script function, behind a branch on an earlier read, is started early: the
/// scout runs the function's body rewritten, guesses the branch, and starts the reads of all 20
/// calls while the executor waits for the first, so the executor claims them instead of making
/// 40 reads of 20 ms one after another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_inside_a_script_function_are_started_early() {
    let (user, _) = counted(Tool::builder("user", Effect::Read), 20);
    let (orders, _) = counted(Tool::builder("orders", Effect::Read), 20);
    let runtime = runtime_with(vec![user, orders]);
    let script = "fn orders_of(id) {\n  let u = user(#{id: id});\n  if !u.active { return 0; }\n  if u.echo.id > 0 { orders(#{id: u.echo.id}).echo.id } else { -1 }\n}\nlet total = 0;\nfor id in 1..=20 { total += orders_of(id); }\ntotal";
    let outcome = run_in(&runtime, script, Mode::Speculative).await;
    // The even ids are active: 2 + 4 + ... + 20.
    assert_eq!(value_of(&outcome), &json!(110));
    let s = &outcome.stats;
    assert_eq!(s.tool_calls, 30, "{s:?}");
    // All but the first read can be started early (the second level once its user arrived);
    // without the rewritten body the scout stops at the first `if` and claims none.
    assert!(s.speculative_claimed >= 20, "{s:?}");
    let sequential = run_in(&runtime, script, Mode::Sequential).await;
    assert_eq!(observable(&outcome), observable(&sequential));
}

/// A read of 30 ms that answers `{id, name: "u<id>"}` for an `id`, or `{name, n}` for a `name`.
fn person() -> Tool {
    Tool::builder("person", Effect::Read).handler(|args| async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        Ok(match args["id"].as_i64() {
            Some(id) => json!({"id": id, "name": format!("u{id}")}),
            None => json!({"name": args["name"], "n": args["name"].as_str().map_or(0, str::len)}),
        })
    })
}

/// A read whose argument is interpolated from an earlier read's field, and a map keyed by an
/// earlier read's field (valued by a read of its own), are deferred in the scout's first pass
/// rather than stopping it: every iteration's reads start as soon as the first level lands,
/// and the executor claims them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interpolated_arguments_and_maps_keyed_by_read_fields_are_speculated() {
    let runtime = runtime_with(vec![person()]);
    let script = r#"
let names = [];
let by_name = #{};
for id in 1..=8 {
    let u = person(#{id: id});
    names.push(person(#{name: `user-${u.id}`}).n);
    by_name[u.name] = person(#{name: "x" + u.name}).n;
}
[names, by_name, by_name.len()]
"#;
    let outcome = run_in(&runtime, script, Mode::Speculative).await;
    let sequential = run_in(&runtime_with(vec![person()]), script, Mode::Sequential).await;
    assert_eq!(observable(&outcome), observable(&sequential));
    assert_eq!(value_of(&outcome)[2], json!(8));
    assert_eq!(value_of(&outcome)[1]["u3"], json!(3));
    let s = &outcome.stats;
    assert_eq!(s.tool_calls, 24, "{s:?}");
    // The first iteration's second-level reads may race the executor; the rest cannot.
    assert!(s.speculative_claimed >= 20, "{s:?}");
    assert_eq!(s.speculative_wasted, 0, "{s:?}");
    // A pass that stopped at each unknown key would need a pass per iteration.
    assert!(s.scout_passes <= 3, "{s:?}");
}

/// A ticket (with the id of its order, and whether it is late) and an order, 30 ms each, and
/// a write that notes a ticket.
fn ticket_tools() -> Vec<Tool> {
    let ticket = Tool::builder("ticket", Effect::Read).handler(|args| async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        let id = args["id"].as_i64().unwrap_or(0);
        Ok(json!({"id": id, "order": id * 10, "late": id == 3 || id == 7}))
    });
    let order = Tool::builder("order", Effect::Read).handler(|args| async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        Ok(json!({"id": args["id"], "total": 5}))
    });
    let note = Tool::builder("note", Effect::Write).handler(|_| async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        Ok(json!(null))
    });
    vec![ticket, order, note]
}

/// After a write, the reads of the next iterations are started again (a read of the epoch
/// before is never claimed), and the scout takes each to return what it returned before the
/// write: the conditions decide at once, and a read whose argument comes from another starts
/// with it instead of a round trip later. Only the first epoch, which had nothing to guess
/// from, wastes reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_write_the_scout_guesses_from_the_reads_before_it() {
    let script = r#"
let noted = [];
for id in 1..=10 {
    let t = ticket(#{id: id});
    let o = order(#{id: t.order});
    if t.late && o.total > 0 { note(#{id: id}); noted.push(id); }
}
noted
"#;
    let runtime = || Runtime::new(Registry::builder().tools(ticket_tools()).build().unwrap());
    let outcome = run_in(&runtime(), script, Mode::Speculative).await;
    let sequential = run_in(&runtime(), script, Mode::Sequential).await;
    assert_eq!(observable(&outcome), observable(&sequential));
    assert_eq!(value_of(&outcome), &json!([3, 7]));

    let notes: Vec<_> = outcome
        .receipts
        .iter()
        .filter(|r| r.tool == "note")
        .collect();
    assert_eq!(notes.len(), 2);
    let first_write_end = notes[0].started_ms + notes[0].duration_ms;
    let last_write_end = notes[1].started_ms + notes[1].duration_ms;
    for r in outcome
        .receipts
        .iter()
        .filter(|r| r.speculative && !r.claimed)
    {
        assert!(
            r.started_ms < first_write_end,
            "a read wasted after the first epoch: {} started at {} ms",
            r.tool,
            r.started_ms
        );
    }
    // Ticket 8, read after the last write, and its order: the order's argument was guessed
    // from ticket 8's read before the write, so both started together.
    let used_after = |tool: &str, args: serde_json::Value| {
        let hash = toolscript::receipts::canonical_sha256(&args);
        outcome
            .receipts
            .iter()
            .find(|r| {
                r.tool == tool
                    && r.args_sha256 == hash
                    && r.started_ms >= last_write_end - 0.001
                    && (r.claimed || !r.speculative)
            })
            .unwrap_or_else(|| panic!("no {tool} read after the last write"))
    };
    let ticket = used_after("ticket", json!({"id": 8}));
    let order = used_after("order", json!({"id": 80}));
    assert!(
        order.started_ms < ticket.started_ms + ticket.duration_ms,
        "the order read waited for the ticket read: started at {} ms, ticket {} + {} ms",
        order.started_ms,
        ticket.started_ms,
        ticket.duration_ms
    );
    assert!(order.speculative && order.claimed, "{order:?}");
}

/// A read whose value changes at every write is guessed wrong: the wrong guesses cost reads,
/// never the result, and the tool soon stops being guessed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_changes_at_every_write_is_guessed_wrong_without_changing_anything() {
    let tools = || {
        let writes = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&writes);
        let level = Tool::builder("level", Effect::Read).handler(move |_| {
            let n = seen.load(Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(json!({"n": n}))
            }
        });
        let detail = Tool::builder("detail", Effect::Read).handler(|args| async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(json!({"n": args["n"], "even": args["n"].as_i64().unwrap_or(0) % 2 == 0}))
        });
        let bump = Tool::builder("bump", Effect::Write).handler(move |_| {
            writes.fetch_add(1, Ordering::SeqCst);
            async move { Ok(json!(null)) }
        });
        Registry::builder()
            .tools([level, detail, bump])
            .build()
            .unwrap()
    };
    let script = "let out = [];\nfor i in 0..8 {\n  let d = detail(#{n: level().n});\n  out.push(d.n);\n  if d.even || i < 8 { bump(#{i: i}); }\n}\nout";
    let outcome = run_in(&Runtime::new(tools()), script, Mode::Speculative).await;
    let sequential = run_in(&Runtime::new(tools()), script, Mode::Sequential).await;
    assert_eq!(observable(&outcome), observable(&sequential));
    assert_eq!(value_of(&outcome), &json!([0, 1, 2, 3, 4, 5, 6, 7]));
    // Two wrong guesses of `level` end its guessing: at most a wasted `detail` each.
    let s = &outcome.stats;
    assert!(s.speculative_wasted <= 4, "{s:?}");
}

/// A read down a branch guessed on a read in flight is deferred, and carries the guess: once
/// the user lands, the inactive users' orders are not started (the condition proved the guess
/// wrong) and the active users' start at once. Without the guess carried, the scout started
/// all 40 and wasted 20.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_read_down_a_branch_guessed_wrong_is_not_started() {
    let (user, _) = counted(Tool::builder("user", Effect::Read), 20);
    let (orders, order_calls) = counted(Tool::builder("orders", Effect::Read), 20);
    let runtime = runtime_with(vec![user, orders]);
    let script = "fn orders_of(id) {\n  let u = user(#{id: id});\n  if u.active { orders(#{id: u.echo.id}).echo.id } else { 0 }\n}\nlet total = 0;\nfor id in 1..=40 { total += orders_of(id); }\ntotal";
    let outcome = run_in(&runtime, script, Mode::Speculative).await;
    // The even ids are active: 2 + 4 + ... + 40.
    assert_eq!(value_of(&outcome), &json!(420));
    let s = &outcome.stats;
    assert_eq!(s.tool_calls, 60, "{s:?}");
    assert!(s.speculative_wasted <= 2, "{s:?}");
    assert!(order_calls.load(Ordering::SeqCst) <= 22, "{s:?}");
    // The guesses that were right still started their reads early.
    assert!(s.speculative_claimed >= 50, "{s:?}");
    // The same with the guard the other way round: an early return guessed not taken.
    let script = "fn orders_of(id) {\n  let u = user(#{id: id});\n  if !u.active { return 0; }\n  orders(#{id: u.echo.id}).echo.id\n}\nlet total = 0;\nfor id in 1..=40 { total += orders_of(id); }\ntotal";
    let outcome = run_in(&runtime, script, Mode::Speculative).await;
    assert_eq!(value_of(&outcome), &json!(420));
    let s = &outcome.stats;
    assert!(s.speculative_wasted <= 2, "{s:?}");
    assert!(s.speculative_claimed >= 50, "{s:?}");
    let sequential = run_in(&runtime, script, Mode::Sequential).await;
    assert_eq!(observable(&outcome), observable(&sequential));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retries_of_a_fan_out_are_started_early_each_after_its_failure() {
    // The first call with each id fails; each retry succeeds.
    let (flaky, calls) = crate::support::by_occurrence(
        "flaky",
        |_| Duration::from_millis(30),
        |_, n| (n == 0).then(|| toolscript::ToolError::unavailable("warming up")),
    );
    let script = "let out = [];\nfor id in 0..8 {\n  let r = (); let tries = 0;\n  while r == () && tries < 3 { tries += 1; try { r = flaky(#{id: id}); } catch (e) { } }\n  out.push(r.n);\n}\nout";
    let runtime = Runtime::new(Registry::builder().tools([flaky]).build().unwrap());
    let outcome = run_in(&runtime, script, Mode::Speculative).await;
    assert_eq!(value_of(&outcome), &json!(vec![1; 8]));
    // Never a retry before its failure, and never a third call: the tool saw two calls an id.
    let counts = calls.lock().unwrap().clone();
    assert_eq!(counts.len(), 8);
    assert!(counts.values().all(|&n| n == 2), "{counts:?}");
    let claimed_retries = outcome
        .receipts
        .iter()
        .filter(|r| r.speculative && r.claimed && r.error_kind.is_none())
        .count();
    assert!(
        claimed_retries > 0,
        "no retry was started by the scout: {:?}",
        outcome.stats
    );
    assert_eq!(outcome.stats.speculative_wasted, 0, "{:?}", outcome.stats);
}

/// Read composites whose nested calls share one slot of their tool: sequentially each fits in
/// its timeout; speculatively they start together, and a composite whose nested calls waited
/// for the slot runs out of time. A speculative call that timed out is never claimed (the
/// executor makes it itself): both modes give every value, and the breaker stays closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_speculative_call_that_timed_out_is_never_claimed() {
    let tools = || {
        let step = Tool::builder("step", Effect::Read)
            .max_concurrency(1)
            .handler(|args: serde_json::Value| async move {
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok(args["n"].clone())
            });
        let three = Tool::builder("three", Effect::Read)
            .nested(["step"])
            .timeout(Duration::from_millis(80))
            .composite(|args, ctx| async move {
                let mut sum = 0;
                for i in 0..3 {
                    let n = ctx
                        .call(
                            "step",
                            json!({"n": args["n"].as_i64().unwrap_or(0) * 10 + i}),
                        )
                        .await?;
                    sum += n.as_i64().unwrap_or(0);
                }
                Ok(json!(sum))
            });
        vec![step, three]
    };
    for composites in [6, 16] {
        let script = format!(
            "let out = [];\nfor i in 0..{composites} {{ try {{ out.push(three(#{{n: i}})); }} catch (e) {{ out.push(e.kind); }} }}\nout"
        );
        let observed = same_in_both_modes(&tools, Limits::default(), &script).await;
        let expected: Vec<i64> = (0..composites).map(|i| 30 * i + 3).collect();
        assert_eq!(observed["result"]["value"], json!(expected), "{composites}");
    }
}

/// `max_in_flight` holds for every call the same way in both modes: with 1, a composite's
/// nested call is refused sequentially (the composite holds the one call in flight), and the
/// scout's composite, which ran its nested calls outside the cap, is not claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_in_flight_holds_for_speculative_composites_as_for_the_executor_s() {
    let tools = || {
        let step =
            Tool::builder("step", Effect::Read).handler(|args: serde_json::Value| async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok(args["n"].clone())
            });
        let wrap = Tool::builder("wrap", Effect::Read)
            .nested(["step"])
            .composite(|args, ctx| async move { ctx.call("step", args).await });
        // A slow read first: the scout starts the composites while the executor waits.
        let first = Tool::builder("first", Effect::Read).handler(|_| async move {
            tokio::time::sleep(Duration::from_millis(60)).await;
            Ok(json!(0))
        });
        vec![step, wrap, first]
    };
    for cap in [1, 2] {
        let mut limits = Limits::default();
        limits.max_in_flight = cap;
        let script = "let z = first(#{});\nlet out = [];\nfor i in 0..4 { try { out.push(wrap(#{n: i})); } catch (e) { out.push(e.kind); } }\nout";
        let observed = same_in_both_modes(&tools, limits, script).await;
        let expected = if cap == 1 {
            json!([
                "budget_exceeded",
                "budget_exceeded",
                "budget_exceeded",
                "budget_exceeded"
            ])
        } else {
            json!([0, 1, 2, 3])
        };
        assert_eq!(observed["result"]["value"], expected, "max_in_flight {cap}");
    }
}

/// Reads inside the predicate of `all` are started early, as inside `some`, `filter` and
/// `find`: the scout's `all` does not stop at a predicate it does not know yet. Both modes
/// give the same answer, with an item's predicate failing early or not at all, and with a
/// predicate that takes the index too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_inside_all_are_started_early() {
    let tools = || {
        vec![
            Tool::builder("check", Effect::Read).handler(|args: serde_json::Value| async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                let id = args["id"].as_i64().unwrap_or(0);
                Ok(json!({ "ok": id != 17 }))
            }),
        ]
    };
    for (script, expected) in [
        ("let ids = [];\nfor i in 1..=24 { ids.push(i * 2); }\nids.all(|id| check(#{ id: id }).ok)", json!(true)),
        ("let ids = [];\nfor i in 10..=30 { ids.push(i); }\nids.all(|id| check(#{ id: id }).ok)", json!(false)),
        ("let ids = [];\nfor i in 1..=24 { ids.push(i * 2); }\nids.all(|id, i| check(#{ id: id + i * 0 }).ok)", json!(true)),
    ] {
        let observed = same_in_both_modes(&tools, Limits::default(), script).await;
        assert_eq!(observed["result"]["value"], expected, "{script}");
    }
    // Each read answers only once 20 are under way (or after 20 s): the executor, waiting for
    // the first, cannot have started the others itself, so the scout must have, however busy
    // the machine is.
    let started = Arc::new(tokio::sync::watch::channel(0usize).0);
    let gate = Arc::clone(&started);
    let gated = Tool::builder("check", Effect::Read).handler(move |_args: serde_json::Value| {
        let gate = Arc::clone(&gate);
        async move {
            gate.send_modify(|n| *n += 1);
            let mut seen = gate.subscribe();
            let twenty = async { seen.wait_for(|n| *n >= 20).await.is_ok() };
            let _ = tokio::time::timeout(Duration::from_secs(20), twenty).await;
            Ok(json!({ "ok": true }))
        }
    });
    let runtime = Runtime::new(Registry::builder().tool(gated).build().unwrap());
    let script =
        "let ids = [];\nfor i in 1..=24 { ids.push(i * 2); }\nids.all(|id| check(#{ id: id }).ok)";
    let outcome = run_in(&runtime, script, Mode::Speculative).await;
    assert_eq!(value_of(&outcome), &json!(true));
    // Twenty were under way at once, and at most one of them was the executor's (its call
    // blocks until the twenty are): the scout started the other nineteen at least. (The last
    // reads, answered at once, may be the executor's own when it gets to them first.)
    assert!(
        outcome.stats.speculative_claimed >= 19,
        "the reads inside `all` were not started early: {:?}",
        outcome.stats
    );
}

/// A script that calls no read the scout could start has no scout: a CPU-bound script with
/// no tools would otherwise be run twice at once, and could miss the deadline speculatively
/// where it meets it sequentially. A read named only in a string (`Fn("get")`) still counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_that_calls_no_read_has_no_scout() {
    let tools = || {
        vec![
            Tool::builder("get", Effect::Read).handler(|args: serde_json::Value| async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok(args["id"].clone())
            }),
            Tool::builder("save", Effect::Write).handler(|args| async move { Ok(args) }),
        ]
    };
    let runtime = Runtime::new(Registry::builder().tools(tools()).build().unwrap());
    for (script, scouted) in [
        ("let s = 0;\nfor i in 0..20000 { s += i % 7; }\ns", false),
        (
            "let s = 0;\nfor i in 0..100 { s += i; }\nsave(#{id: s})",
            false,
        ),
        (
            "let a = [];\nfor i in 0..8 { a.push(get(#{id: i})); }\na",
            true,
        ),
        (
            "let f = Fn(\"get\");\nlet a = [];\nfor i in 0..8 { a.push(f.call(#{id: i})); }\na",
            true,
        ),
    ] {
        let outcome = run_in(&runtime, script, Mode::Speculative).await;
        assert!(outcome.result.is_ok(), "{script}: {:?}", outcome.result);
        assert_eq!(
            outcome.stats.scout_passes > 0,
            scouted,
            "{script}: {:?}",
            outcome.stats
        );
    }
}

/// A scout that learned little during a dependency chain sleeps until the executor misses
/// more reads; a write made meanwhile wakes it, so that the fan-out after the write is
/// speculated. Each read of the fan-out here answers only once all twenty are in flight: a
/// scout that slept through the write would leave the executor alone with the first of them
/// until the gate gives up. Chains of several lengths put the write at several points of the
/// scout's sleeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_wakes_a_scout_that_sleeps_through_a_chain() {
    const FAN_OUT: usize = 20;
    // How many reads of the fan-out are in flight; `usize::MAX` once one gave up.
    let in_flight = Arc::new(tokio::sync::watch::channel(0usize).0);
    let gate = Arc::clone(&in_flight);
    let get = Tool::builder("get_user", Effect::Read).handler(move |args: serde_json::Value| {
        let gate = Arc::clone(&gate);
        async move {
            let id = args["id"].as_i64().unwrap_or(0);
            if id < 1000 {
                tokio::time::sleep(Duration::from_millis(10)).await;
                return Ok(json!({"id": id}));
            }
            through_gate(&gate, FAN_OUT, json!({"id": id})).await
        }
    });
    let order =
        Tool::builder("create_order", Effect::Write).handler(|args| async move { Ok(args) });
    let runtime = Runtime::new(Registry::builder().tools([get, order]).build().unwrap());
    for chain in [4, 6, 9, 13, 20, 30] {
        in_flight.send_replace(0);
        let script = format!(
            "let u = get_user(#{{id: 1}});\n\
             for i in 1..{chain} {{ u = get_user(#{{id: u.id + 1}}); }}\n\
             create_order(#{{user: u.id}});\n\
             let ids = [];\n\
             for i in 0..{FAN_OUT} {{ ids.push(get_user(#{{id: 1000 + i}}).id); }}\n\
             ids.len()"
        );
        let outcome = run_in(&runtime, &script, Mode::Speculative).await;
        assert_eq!(
            outcome.result.as_ref().ok(),
            Some(&json!(FAN_OUT)),
            "a chain of {chain}: {:?} after {} passes",
            outcome.result,
            outcome.stats.scout_passes
        );
        assert_eq!(
            *in_flight.borrow(),
            FAN_OUT,
            "each read of the fan-out made once"
        );
    }
}

/// A read tool that answers at once, counting its calls.
fn quick(name: &str) -> (Tool, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let tool = Tool::builder(name, Effect::Read).handler(move |args: serde_json::Value| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move { Ok(json!({"i": args["i"], "base": 1000})) }
    });
    (tool, calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_a_quick_tool_are_left_to_the_executor_and_made_once() {
    const N: usize = 200;
    let (echo, calls) = quick("echo");
    let (slow, _) = counted(Tool::builder("slow", Effect::Read), 5);
    let runtime = Runtime::new(Registry::builder().tools([echo, slow]).build().unwrap());
    let loop_of =
        |tail: &str| format!("let s = 0; for i in 0..{N} {{ s += echo(#{{i: i}}).i }} s{tail}");
    // The tool's first calls show it answers at once.
    let only_quick = loop_of("");
    let sequential = run_in(&runtime, &only_quick, Mode::Sequential).await;
    // A script whose reads are all quick has no scout: it would hold every one.
    let speculative = run_in(&runtime, &only_quick, Mode::Speculative).await;
    assert_eq!(speculative.result, sequential.result);
    assert_eq!(speculative.stats.scout_passes, 0, "{:?}", speculative.stats);
    // One read that is not quick brings the scout back, and it holds the quick ones.
    let script = loop_of(" + slow(#{id: 1}).echo.id");
    let sequential = run_in(&runtime, &script, Mode::Sequential).await;
    let mut held = 0;
    for _ in 0..5 {
        calls.store(0, Ordering::SeqCst);
        let outcome = run_in(&runtime, &script, Mode::Speculative).await;
        assert_eq!(outcome.result, sequential.result);
        assert_eq!(calls.load(Ordering::SeqCst), N, "every read made once");
        let s = &outcome.stats;
        assert!(s.scout_passes > 0, "{s:?}");
        assert_eq!(s.dispatched, N as u64 + 1, "{s:?}");
        assert_eq!(s.speculative_wasted, 0, "{s:?}");
        assert!(
            s.speculative_held + s.speculative_claimed <= N as u64 + 1,
            "{s:?}"
        );
        assert_eq!(outcome.receipts.len(), N + 1);
        // A held read is the executor's own call: its receipt is not speculative.
        let speculative = outcome.receipts.iter().filter(|r| r.speculative).count();
        assert_eq!(speculative as u64, s.speculative_launched, "{s:?}");
        held += s.speculative_held;
        if held > 0 {
            break;
        }
    }
    assert!(
        held > 0,
        "the scout held none of a quick tool's reads in five runs"
    );
}

/// One read of a fan-out counted in by `gate`: `answer` once `n` reads are in flight at once,
/// an error if they are not within 10 s (and `usize::MAX` in `gate` from then on).
async fn through_gate(
    gate: &tokio::sync::watch::Sender<usize>,
    n: usize,
    answer: serde_json::Value,
) -> Result<serde_json::Value, toolscript::ToolError> {
    gate.send_modify(|k| *k = k.saturating_add(1));
    let mut seen = gate.subscribe();
    let all = async { seen.wait_for(|k| *k >= n).await.is_ok() };
    match tokio::time::timeout(Duration::from_secs(10), all).await {
        Ok(_) if *gate.borrow() != usize::MAX => Ok(answer),
        _ => {
            gate.send_replace(usize::MAX);
            Err(toolscript::ToolError::unavailable(
                "the fan-out's reads were not all in flight at once",
            ))
        }
    }
}

/// A read tool that answers only once `n` of its reads are in flight at once (or fails after
/// 10 s), and the count of its reads in flight (`usize::MAX` once one gave up).
fn gated(n: usize) -> (Tool, Arc<tokio::sync::watch::Sender<usize>>) {
    let in_flight = Arc::new(tokio::sync::watch::channel(0usize).0);
    let gate = Arc::clone(&in_flight);
    let tool = Tool::builder("gated", Effect::Read).handler(move |args: serde_json::Value| {
        let gate = Arc::clone(&gate);
        async move { through_gate(&gate, n, json!({"id": args["id"]})).await }
    });
    (tool, in_flight)
}

/// Calls the read `tool` eight times, sequentially: the runtime then knows that it answers at
/// once (a tool is quick after four such calls).
async fn warm(runtime: &Runtime, tool: &str) {
    let script = format!("for i in 0..8 {{ {tool}(#{{i: i}}); }}");
    let warm = run_in(runtime, &script, Mode::Sequential).await;
    assert!(warm.result.is_ok(), "{:?}", warm.result);
}

/// A run whose value is the length of a fan-out of `n` reads through [`gated`] gave it, each
/// read made once.
fn assert_fanned_out(
    outcome: &toolscript::RunOutcome,
    in_flight: &tokio::sync::watch::Sender<usize>,
    n: usize,
    round: usize,
) {
    assert_eq!(
        outcome.result.as_ref().ok(),
        Some(&json!(n)),
        "round {round}: {:?}, {:?}",
        outcome.result,
        outcome.stats
    );
    assert_eq!(*in_flight.borrow(), n, "each read of the fan-out made once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_read_starts_when_the_executor_waits_so_the_reads_after_it_start_early() {
    const FAN_OUT: usize = 12;
    let (config, config_calls) = quick("config");
    let (slow, _) = counted(Tool::builder("slow", Effect::Read), 50);
    // Each read of the fan-out answers only once all of them are in flight at once: they
    // must have started while the executor waited for `slow`, from the value of `config`.
    let (gated, in_flight) = gated(FAN_OUT);
    let runtime = Runtime::new(
        Registry::builder()
            .tools([config, slow, gated])
            .build()
            .unwrap(),
    );
    // `config` answers at once, and its first calls show it.
    warm(&runtime, "config").await;
    for round in 0..3 {
        in_flight.send_replace(0);
        config_calls.store(0, Ordering::SeqCst);
        let script = format!(
            "let first = slow(#{{id: {round}}});\n\
             let cfg = config(#{{i: {round}}});\n\
             let ids = [];\n\
             for i in 0..{FAN_OUT} {{ ids.push(gated(#{{id: cfg.base + i}}).id); }}\n\
             ids.len()"
        );
        let outcome = run_in(&runtime, &script, Mode::Speculative).await;
        assert_fanned_out(&outcome, &in_flight, FAN_OUT, round);
        assert_eq!(config_calls.load(Ordering::SeqCst), 1, "`config` made once");
        assert_eq!(outcome.stats.speculative_held, 0, "{:?}", outcome.stats);
    }
}

/// The script's `sleep` is a wait like a call's: the reads the scout held are started while
/// the executor sleeps, and the reads that depend on them with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_reads_start_while_the_script_sleeps() {
    const FAN_OUT: usize = 8;
    let (config, config_calls) = quick("config");
    let (gated, in_flight) = gated(FAN_OUT);
    let runtime = Runtime::new(Registry::builder().tools([config, gated]).build().unwrap());
    warm(&runtime, "config").await;
    for (round, sleep) in ["sleep(0.5)", "sleep(1)", "for i in 0..2 { sleep(0.25) }"]
        .into_iter()
        .enumerate()
    {
        in_flight.send_replace(0);
        config_calls.store(0, Ordering::SeqCst);
        // `gated` is not quick: the run has a scout. It holds `config`'s read while the
        // executor runs, and must start it while the executor sleeps.
        let script = format!(
            "{sleep};\n\
             let cfg = config(#{{i: {round}}});\n\
             let ids = [];\n\
             for i in 0..{FAN_OUT} {{ ids.push(gated(#{{id: cfg.base + i}}).id); }}\n\
             ids.len()"
        );
        let outcome = run_in(&runtime, &script, Mode::Speculative).await;
        let s = &outcome.stats;
        assert_fanned_out(&outcome, &in_flight, FAN_OUT, round);
        assert_eq!(config_calls.load(Ordering::SeqCst), 1, "`config` made once");
        // Nothing was left for the executor after the sleep: `config` and the whole fan-out
        // were started while it slept, and claimed.
        assert_eq!(s.speculative_held, 0, "round {round}: {s:?}");
        assert_eq!(s.speculative_claimed, s.dispatched, "round {round}: {s:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scout_behind_a_loop_of_quick_reads_wakes_when_the_executor_waits() {
    const FAN_OUT: usize = 12;
    let (config, _) = quick("config");
    let (gated, in_flight) = gated(FAN_OUT);
    let runtime = Runtime::new(Registry::builder().tools([config, gated]).build().unwrap());
    warm(&runtime, "config").await;
    // A pass holds the loop's reads until it gives up on them; the fan-out, over their sum,
    // is all in flight at once only if a pass starts it while the executor waits for its
    // first read.
    let script = format!(
        "let s = 0;\n\
         for i in 0..300 {{ s += config(#{{i: i}}).base; }}\n\
         let ids = [];\n\
         for i in 0..{FAN_OUT} {{ ids.push(gated(#{{id: s + i}}).id); }}\n\
         ids.len()"
    );
    for round in 0..3 {
        in_flight.send_replace(0);
        let outcome = run_in(&runtime, &script, Mode::Speculative).await;
        assert_fanned_out(&outcome, &in_flight, FAN_OUT, round);
    }
}
