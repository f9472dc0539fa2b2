//! The fixture sandbox and recorded fixtures: a sandboxed run's non-read calls never reach
//! their bodies (nor a composite's), fail catchably and not recoverably, and say so in their
//! receipts; a run recorded with `record` and replayed with `fixtures` gives the same outcome
//! without calling a tool, in both modes; a read the fixtures lack is `fixture_missing`;
//! occurrences follow repeats, epochs, retries and polls; secrets are never recorded.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tempfile::TempDir;
use toolscript::receipts::{verify_receipts, Status};
use toolscript::secrets::{SecretSource, Secrets};
use toolscript::{
    Effect, Error, ErrorKind, Mode, Registry, RegistryBuilder, RunOptions, RunOutcome, Runtime,
    Sandbox, Tool, ToolError,
};

use crate::support::{error_of, value_of};

const SENTINEL: &str = "SENTINEL-fixture-9d41-secret";

/// The names of the tools whose bodies were reached, in order.
type Trace = Arc<Mutex<Vec<String>>>;

fn reached(trace: &Trace) -> Vec<String> {
    trace.lock().unwrap().clone()
}

/// The catalog. `live`: the tools answer; otherwise every body fails, so that a run that
/// reaches one shows it. Every body reached is traced either way.
fn registry(trace: &Trace, live: bool) -> Registry {
    catalog(trace, live).build().unwrap()
}

/// The catalog's builder, for a registry with more (a guard).
fn catalog(trace: &Trace, live: bool) -> RegistryBuilder {
    let calls = Arc::new(AtomicU64::new(0));
    let body = |name: &'static str, answer: fn(&Value, u64) -> Result<Value, ToolError>| {
        let (trace, calls) = (Arc::clone(trace), Arc::clone(&calls));
        move |args: Value| {
            trace.lock().unwrap().push(name.to_string());
            let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
            let outcome = if live {
                answer(&args, n)
            } else {
                Err(ToolError::internal(format!("`{name}` was called")))
            };
            async move { outcome }
        }
    };
    let flaky_calls = Arc::new(AtomicU64::new(0));
    let flaky = {
        let trace = Arc::clone(trace);
        move |_args: Value| {
            trace.lock().unwrap().push("flaky".into());
            let n = flaky_calls.fetch_add(1, Ordering::SeqCst);
            let outcome = match (live, n) {
                (false, _) => Err(ToolError::internal("`flaky` was called")),
                (true, 0 | 1) => Err(ToolError::unavailable(format!("down ({n})"))),
                (true, _) => Ok(json!({"up_after": n})),
            };
            async move { outcome }
        }
    };
    let place_trace = Arc::clone(trace);
    let peek_trace = Arc::clone(trace);
    let secrets = Secrets::new(BTreeMap::from([(
        "TOKEN".to_string(),
        SecretSource::Value(SENTINEL.to_string()),
    )]));
    Registry::builder()
        .secrets(secrets)
        .tool(
            Tool::builder("get_item", Effect::Read)
                .output_schema(json!({"type": "object", "required": ["id"]}))
                .handler(body("get_item", |args, n| {
                    match args["id"].as_i64().unwrap_or_default() {
                        id if id > 100 => Err(ToolError::not_found(format!("no item {id}"))),
                        id => Ok(json!({"id": id, "v": id * 10, "n": n})),
                    }
                })),
        )
        .tool(
            Tool::builder("status", Effect::Read)
                .allow_repeat(true)
                .handler(body("status", |_, n| Ok(json!({"n": n})))),
        )
        .tool(Tool::builder("flaky", Effect::Read).handler(flaky))
        .tool(
            Tool::builder("masked", Effect::Read)
                .redact(["result.ssn"])
                .handler(body("masked", |_, _| Ok(json!({"ssn": "078-05-1120"})))),
        )
        .tool(
            Tool::builder("get_token", Effect::Read).handler_with_context(
                |_args, ctx| async move { Ok(json!({"token": &*ctx.secret("TOKEN").await?})) },
            ),
        )
        .tool(
            Tool::builder("lookup", Effect::Read).handler(body("lookup", |args, _| {
                Ok(json!({"len": args["token"].as_str().map(str::len)}))
            })),
        )
        .tool(Tool::builder("save", Effect::Write).handler(body("save", |a, _| Ok(a.clone()))))
        .tool(Tool::builder("bump", Effect::Idempotent).handler(body("bump", |_, _| Ok(json!(1)))))
        .tool(
            Tool::builder("notify", Effect::External).handler(body("notify", |_, _| Ok(json!(1)))),
        )
        .tool(
            Tool::builder("place", Effect::Write)
                .nested(["get_item", "save"])
                .composite(move |args, ctx| {
                    place_trace.lock().unwrap().push("place".into());
                    async move {
                        let item = ctx.call("get_item", args).await?;
                        ctx.call("save", item).await
                    }
                }),
        )
        .tool(
            Tool::builder("peek", Effect::Read)
                .nested(["get_item"])
                .composite(move |args, ctx| {
                    peek_trace.lock().unwrap().push("peek".into());
                    async move { ctx.call("get_item", args).await }
                }),
        )
}

async fn run(registry: Registry, script: &str, mode: Mode, options: RunOptions) -> RunOutcome {
    let runtime = Runtime::new(registry);
    let mut options = options;
    options.mode = mode;
    runtime.run_with(script, options).await
}

fn sandboxed() -> RunOptions {
    RunOptions::default().sandbox(Sandbox::Fixture)
}

const MODES: [Mode; 2] = [Mode::Sequential, Mode::Speculative];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_blocks_every_non_read_call_before_its_body() {
    let script = r#"
        let out = [];
        for name in ["save", "bump", "notify", "place"] {
            try { tool(name, #{ id: 1 }); out.push("made"); }
            catch (e) { out.push([e.kind, e.recoverable, e.tool]); }
        }
        out.push(get_item(#{ id: 2 }).v);
        out
    "#;
    for mode in MODES {
        let trace = Trace::default();
        let dir = TempDir::new().unwrap();
        let receipts = dir.path().join("receipts.jsonl");
        let options = sandboxed().receipts(&receipts).unwrap();
        let outcome = run(registry(&trace, true), script, mode, options).await;
        assert_eq!(
            value_of(&outcome),
            &json!([
                ["side_effect_blocked", false, "save"],
                ["side_effect_blocked", false, "bump"],
                ["side_effect_blocked", false, "notify"],
                ["side_effect_blocked", false, "place"],
                20
            ]),
            "{mode:?}"
        );
        assert_eq!(
            reached(&trace),
            ["get_item"],
            "{mode:?}: no write body, no composite body, no nested call"
        );
        assert!(outcome.effects.is_empty(), "{mode:?}: nothing took effect");
        let blocked: Vec<_> = outcome
            .receipts
            .iter()
            .filter(|r| r.status == Status::Blocked)
            .map(|r| {
                (
                    r.tool.as_str(),
                    r.error_kind.as_deref(),
                    r.attempt,
                    r.result_sha256.is_none(),
                )
            })
            .collect();
        assert_eq!(
            blocked,
            ["save", "bump", "notify", "place"].map(|t| (t, Some("side_effect_blocked"), 0, true)),
            "{mode:?}"
        );
        let read = outcome
            .receipts
            .iter()
            .find(|r| r.tool == "get_item")
            .unwrap();
        assert_eq!(read.status, Status::Ok);
        // The file's chain holds, `blocked` lines included.
        assert_eq!(verify_receipts(&receipts).unwrap(), outcome.receipts.len());
        let text = std::fs::read_to_string(&receipts).unwrap();
        assert_eq!(text.matches(r#""status":"blocked""#).count(), 4);
        assert_eq!(
            outcome.stats.effectful_calls, 4,
            "counted as refused non-read calls"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_call_uncaught_ends_the_run_and_still_ends_the_epoch() {
    let trace = Trace::default();
    let outcome = run(
        registry(&trace, true),
        "save(#{ id: 1 })",
        Mode::Sequential,
        sandboxed(),
    )
    .await;
    let e = error_of(&outcome);
    assert_eq!(e.kind, ErrorKind::SideEffectBlocked);
    assert!(!e.recoverable);
    assert!(e.message.contains("`save`"), "{}", e.message);
    assert!(e
        .suggested_next_action
        .as_deref()
        .unwrap()
        .contains("sandbox"));
    assert!(reached(&trace).is_empty());

    // A blocked call is a non-read call the run made: the read after it is in a new epoch,
    // and made again, as after a refused write.
    let trace = Trace::default();
    let outcome = run(
        registry(&trace, true),
        "let a = get_item(#{ id: 1 }); try { save(#{ id: 1 }); } catch {} let b = get_item(#{ id: 1 }); [a.n, b.n]",
        Mode::Sequential,
        sandboxed(),
    )
    .await;
    assert_eq!(value_of(&outcome), &json!([1, 2]));
    assert_eq!(reached(&trace), ["get_item", "get_item"]);
}

/// Reads of every kind: a repeat, a not_found, a read made again after a non-read call, a
/// polling tool's three calls, a retry loop over a recoverable failure, a read composite.
const READS: &str = r#"
    let a = get_item(#{ id: 1 });
    let b = get_item(#{ id: 1 });
    let missing = "";
    try { get_item(#{ id: 500 }); } catch (e) { missing = e.kind; }
    let blocked = "";
    try { save(#{ id: 1 }); } catch (e) { blocked = e.kind; }
    let c = get_item(#{ id: 1 });
    let polls = [status().n, status().n, status().n];
    let up = ();
    let tries = 0;
    while up == () && tries < 5 {
        tries += 1;
        try { up = flaky(#{ id: 1 }); } catch (e) { }
    }
    [a.n, b.n, missing, blocked, c.n, polls, up, tries, peek(#{ id: 3 }).v]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_then_replay_gives_the_same_outcome_without_calling_a_tool() {
    for mode in MODES {
        let dir = TempDir::new().unwrap();
        let file = dir.path().join("reads.jsonl");
        let trace = Trace::default();
        let recorded = run(
            registry(&trace, true),
            READS,
            mode,
            sandboxed().record(&file).unwrap(),
        )
        .await;
        let value = value_of(&recorded).clone();
        assert_eq!(value[2], "not_found", "{mode:?}: {value}");
        assert_eq!(value[3], "side_effect_blocked");
        assert_eq!(value[7], 3, "two failures, then the third try");
        assert_ne!(
            value[0], value[4],
            "{mode:?}: the read after a non-read call is made again"
        );
        assert!(reached(&trace).contains(&"flaky".to_string()));

        for replay_mode in MODES {
            // The scout's reads are answered from the fixtures too: a speculative replay is
            // made until the executor has claimed one (the scout is not always ahead when
            // every read answers at once).
            let tries = if replay_mode == Mode::Speculative {
                50
            } else {
                1
            };
            let mut claimed = 0;
            for _ in 0..tries {
                let trace = Trace::default();
                let replayed = run(
                    registry(&trace, false),
                    READS,
                    replay_mode,
                    sandboxed().fixtures(&file).unwrap(),
                )
                .await;
                assert_eq!(
                    value_of(&replayed),
                    &value,
                    "recorded {mode:?}, replayed {replay_mode:?}"
                );
                assert!(
                    reached(&trace).is_empty(),
                    "recorded {mode:?}, replayed {replay_mode:?}: {:?}",
                    reached(&trace)
                );
                // Answered reads never ran a body: their receipts say no attempt was made.
                assert!(replayed
                    .receipts
                    .iter()
                    .filter(|r| r.effect == Effect::Read)
                    .all(|r| r.attempt == 0));
                claimed += replayed.stats.speculative_claimed;
                if claimed > 0 {
                    break;
                }
            }
            if replay_mode == Mode::Speculative {
                assert!(
                    claimed > 0,
                    "recorded {mode:?}: no speculative read claimed"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_the_fixtures_lack_is_fixture_missing() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("reads.jsonl");
    let trace = Trace::default();
    let recorded = run(
        registry(&trace, true),
        "get_item(#{ id: 1 }).v",
        Mode::Sequential,
        RunOptions::default().record(&file).unwrap(),
    )
    .await;
    assert_eq!(value_of(&recorded), &json!(10));
    for mode in MODES {
        let trace = Trace::default();
        // Other arguments, another tool, and the same read once more after a non-read call
        // (its next occurrence) are all missing; the recorded one is answered.
        let script = r#"
            let kinds = [get_item(#{ id: 1 }).v];
            for f in [|| get_item(#{ id: 2 }), || status(), || { try { save(#{}); } catch {} get_item(#{ id: 1 }) }] {
                try { f.call(); kinds.push("answered"); }
                catch (e) { kinds.push([e.kind, e.recoverable, e.tool]); }
            }
            kinds
        "#;
        let outcome = run(
            registry(&trace, false),
            script,
            mode,
            sandboxed().fixtures(&file).unwrap(),
        )
        .await;
        assert_eq!(
            value_of(&outcome),
            &json!([
                10,
                ["fixture_missing", false, "get_item"],
                ["fixture_missing", false, "status"],
                ["fixture_missing", false, "get_item"]
            ]),
            "{mode:?}"
        );
        assert!(reached(&trace).is_empty());
        let uncaught = run(
            registry(&trace, false),
            "get_item(#{ id: 9 })",
            mode,
            RunOptions::default().fixtures(&file).unwrap(),
        )
        .await;
        let e = error_of(&uncaught);
        assert_eq!(e.kind, ErrorKind::FixtureMissing);
        assert!(e.message.contains("reads.jsonl"), "{}", e.message);
        assert!(e
            .suggested_next_action
            .as_deref()
            .unwrap()
            .contains("--record"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn occurrences_follow_repeats_epochs_retries_and_polls() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("reads.jsonl");
    let trace = Trace::default();
    run(
        registry(&trace, true),
        READS,
        Mode::Sequential,
        sandboxed().record(&file).unwrap(),
    )
    .await;
    let lines: Vec<Value> = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let keys: Vec<(String, Value, u64)> = lines
        .iter()
        .map(|l| {
            (
                l["tool"].as_str().unwrap().to_string(),
                l["args"].clone(),
                l["occurrence"].as_u64().unwrap(),
            )
        })
        .collect();
    let key = |tool: &str, args: Value, n: u64| (tool.to_string(), args, n);
    assert_eq!(
        keys,
        [
            // The repeat is answered by the first: one line.
            key("get_item", json!({"id": 1}), 0),
            key("get_item", json!({"id": 500}), 0),
            // After the non-read call, the next occurrence in the run.
            key("get_item", json!({"id": 1}), 1),
            key("status", json!({}), 0),
            key("status", json!({}), 1),
            key("status", json!({}), 2),
            key("flaky", json!({"id": 1}), 0),
            key("flaky", json!({"id": 1}), 1),
            key("flaky", json!({"id": 1}), 2),
            // A composite's read is one read: its nested call is not recorded.
            key("peek", json!({"id": 3}), 0),
        ]
    );
    assert_eq!(lines[1]["error"]["kind"], "not_found");
    assert_eq!(lines[6]["error"]["kind"], "unavailable");
    assert_eq!(lines[6]["error"]["recoverable"], true);
    assert_eq!(lines[8]["ok"], json!({"up_after": 2}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_holding_a_secret_or_a_redacted_value_are_not_recorded() {
    for mode in MODES {
        let dir = TempDir::new().unwrap();
        let file = dir.path().join("reads.jsonl");
        let trace = Trace::default();
        let script = "let t = get_token().token; [lookup(#{ token: t }).len, masked().ssn.len(), get_item(#{ id: 4 }).v]";
        let recorded = run(
            registry(&trace, true),
            script,
            mode,
            RunOptions::default().record(&file).unwrap(),
        )
        .await;
        assert_eq!(
            value_of(&recorded),
            &json!([SENTINEL.len(), 11, 40]),
            "{mode:?}"
        );
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            !text.contains(SENTINEL) && !text.contains("078-05-1120"),
            "{text}"
        );
        let tools: Vec<String> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["tool"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(tools, ["get_item"], "{mode:?}");
        // Replayed, those reads are missing: a test of the script calls them or fails.
        let trace = Trace::default();
        let replayed = run(
            registry(&trace, false),
            "masked()",
            mode,
            RunOptions::default().fixtures(&file).unwrap(),
        )
        .await;
        assert_eq!(error_of(&replayed).kind, ErrorKind::FixtureMissing);
    }
}

/// A read answered from the fixtures never meets its breaker, claimed from the scout or made
/// by the executor: an open breaker (its tool failed before in this runtime) changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_does_not_stand_between_a_read_and_its_fixture() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("reads.jsonl");
    let script = "[get_item(#{ id: 1 }).v, get_item(#{ id: 2 }).v, get_item(#{ id: 3 }).v]";
    let trace = Trace::default();
    let recorded = run(
        registry(&trace, true),
        script,
        Mode::Sequential,
        RunOptions::default().record(&file).unwrap(),
    )
    .await;
    assert_eq!(value_of(&recorded), &json!([10, 20, 30]));
    let trace = Trace::default();
    // The reads are the scout's to start, though the tool answers at once: the claim is what
    // shows a speculative read met its fixture past the open breaker.
    let mut speculation = toolscript::SpeculationLimits::default();
    speculation.hold_quick = false;
    let runtime = Runtime::builder(registry(&trace, false))
        .speculation(speculation)
        .build();
    let opened = runtime
        .run("for i in 10..20 { try { get_item(#{ id: i }); } catch {} } get_item(#{ id: 99 })")
        .await;
    assert_eq!(error_of(&opened).kind, ErrorKind::CircuitOpen);
    for mode in MODES {
        let mut claimed = 0;
        for _ in 0..if mode == Mode::Speculative { 50 } else { 1 } {
            let options = RunOptions::with_mode(mode).fixtures(&file).unwrap();
            let replayed = runtime.run_with(script, options).await;
            assert_eq!(value_of(&replayed), &json!([10, 20, 30]), "{mode:?}");
            claimed += replayed.stats.speculative_claimed;
            if claimed > 0 {
                break;
            }
        }
        assert_eq!(claimed > 0, mode == Mode::Speculative, "{mode:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_edited_answer_is_held_to_the_tool_s_output_schema() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("reads.jsonl");
    std::fs::write(
        &file,
        concat!(
            r#"{"tool":"get_item","args":{"id":1},"occurrence":0,"ok":"not an item"}"#,
            "\n",
            r#"{"tool":"get_item","args":{"id":2},"occurrence":0,"ok":{"id":2,"v":"edited"}}"#,
            "\n",
        ),
    )
    .unwrap();
    let trace = Trace::default();
    let outcome = run(
        registry(&trace, false),
        "let k = \"\"; try { get_item(#{ id: 1 }); } catch (e) { k = e.kind; } [k, get_item(#{ id: 2 }).v]",
        Mode::Sequential,
        RunOptions::default().fixtures(&file).unwrap(),
    )
    .await;
    assert_eq!(value_of(&outcome), &json!(["invalid_output", "edited"]));
    assert!(reached(&trace).is_empty());
}

/// A durable run journals a blocked call's outcome, never an intent: a resume knows it was not
/// made.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_run_journals_no_intent_for_a_blocked_call() {
    use toolscript::{SqliteStore, Store as _};
    let dir = TempDir::new().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("s.sqlite3")).unwrap());
    let trace = Trace::default();
    let runtime = Runtime::builder(registry(&trace, true))
        .store(Arc::clone(&store) as Arc<dyn toolscript::Store>)
        .build();
    let outcome = runtime
        .run_with(
            "try { save(#{ id: 1 }); } catch {} get_item(#{ id: 1 }).v",
            sandboxed(),
        )
        .await;
    assert_eq!(value_of(&outcome), &json!(10));
    let journal = store.load_journal(&outcome.run_id).await.unwrap();
    assert_eq!(journal.writes.len(), 1);
    let write = &journal.writes[0];
    assert_eq!(write.tool, "save");
    assert!(!write.state.intent, "its body was never about to run");
    let blocked = write.outcome.clone().unwrap().unwrap_err();
    assert_eq!(blocked.kind, ErrorKind::SideEffectBlocked);
    assert_eq!(reached(&trace), ["get_item"]);
}

/// The guard decides first: a call it denies is `permission_denied`; a call it would ask a
/// person about is blocked, and the run does not pause for a call it will never make.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_decides_first_and_nobody_is_asked_about_a_blocked_call() {
    use toolscript::guard::{Guard, Rule, Ruling};
    use toolscript::SqliteStore;
    let dir = TempDir::new().unwrap();
    let trace = Trace::default();
    let guard = Guard::builder(dir.path())
        .rule(Rule::new(["save"], Ruling::Ask, "saves need a person").unwrap())
        .rule(Rule::new(["bump"], Ruling::Deny, "no bumps").unwrap())
        .build()
        .unwrap();
    let registry = catalog(&trace, true).guard(guard).build().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("s.sqlite3")).unwrap());
    let runtime = Runtime::builder(registry).store(store).build();
    let outcome = runtime
        .run_with(
            r#"
            let kinds = [];
            try { save(#{ id: 1 }); } catch (e) { kinds.push(e.kind); }
            try { bump(#{}); } catch (e) { kinds.push(e.kind); }
            kinds
            "#,
            sandboxed(),
        )
        .await;
    assert_eq!(
        value_of(&outcome),
        &json!(["side_effect_blocked", "permission_denied"]),
        "{:?}",
        outcome.pending
    );
    assert!(outcome.pending.is_none());
    assert!(reached(&trace).is_empty());
}

#[test]
fn a_fixtures_file_that_is_missing_or_malformed_is_a_clear_error() {
    let dir = TempDir::new().unwrap();
    let missing = RunOptions::default()
        .fixtures(&dir.path().join("none.jsonl"))
        .unwrap_err();
    assert!(matches!(missing, Error::Fixture { line: None, .. }));
    assert!(missing.to_string().contains("--record"), "{missing}");
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"tool\":\"t\",\"args\":{},\"occurrence\":0,\"ok\":1}\n\n{\"tool\":\"t\",\"args\":{},\"occurrence\":\"first\",\"ok\":1}\n",
    )
    .unwrap();
    let e = RunOptions::default().fixtures(&bad).unwrap_err();
    assert!(matches!(e, Error::Fixture { line: Some(3), .. }), "{e}");
    assert!(
        e.to_string().contains("bad.jsonl:3") && e.to_string().contains("occurrence"),
        "{e}"
    );
    let unwritable = RunOptions::default().record(Path::new("/nonexistent/dir/reads.jsonl"));
    assert!(matches!(unwritable, Err(Error::Fixture { .. })));
}

/// The command line: a run recorded with `--record`, then replayed with `--fixtures` in the
/// fixture sandbox, on the demo catalog, gives the same value.
#[cfg(feature = "cli")]
#[test]
fn the_command_line_records_and_replays_the_demo_catalog() {
    use crate::cli::toolscript;
    let dir = TempDir::new().unwrap();
    let script = dir.path().join("offline.rhai");
    std::fs::write(
        &script,
        r#"
        let c = get_customer(#{ id: 3 });
        let orders = list_orders(#{ customer_id: 3 });
        let noted = "";
        try { add_ticket_note(#{ ticket_id: 1, note: "hello" }); noted = "made"; }
        catch (e) { noted = e.kind; }
        #{ name: c.name, orders: orders, noted: noted, again: get_customer(#{ id: 3 }).tier }
        "#,
    )
    .unwrap();
    let (script, file) = (script.to_str().unwrap(), dir.path().join("reads.jsonl"));
    let file = file.to_str().unwrap();
    let value = |out: crate::cli::Output| -> Value {
        assert_eq!(out.code, 0, "{out:?}");
        serde_json::from_str::<Value>(&out.stdout).unwrap()["value"].clone()
    };
    let recorded = value(toolscript(&[
        "run",
        "--json",
        "--no-store",
        "--sandbox",
        "fixture",
        "--record",
        file,
        script,
    ]));
    assert_eq!(recorded["noted"], "side_effect_blocked");
    assert!(std::fs::read_to_string(file).unwrap().lines().count() >= 2);
    for mode in [&[][..], &["--sequential"][..]] {
        let mut args = vec![
            "run",
            "--json",
            "--no-store",
            "--fixtures",
            file,
            "--sandbox",
            "fixture",
        ];
        args.extend_from_slice(mode);
        args.push(script);
        assert_eq!(value(toolscript(&args)), recorded, "{mode:?}");
    }
    // A file that is not there stops the run before it starts, and says how to make one.
    let out = toolscript(&["run", "--fixtures", "/nonexistent/reads.jsonl", script]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("--record"), "{out:?}");
}
