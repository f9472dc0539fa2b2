//! The dispatch path seen from scripts: panics, hangs, invalid output, retries, the breaker
//! opening and half-opening (with paused time), and typed tools.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use toolscript::receipts::Status;
use toolscript::{BreakerConfig, Effect, ErrorKind, Mode, Registry, Runtime, Tool, ToolError};

use crate::support::{error_of, fixture_registry, fixture_runtime, run, run_in, value_of, Probe};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_tool_is_an_internal_error_and_the_run_goes_on() {
    let outcome = run("let k = ();\ntry { boom(); } catch (e) { k = e.kind; }\n[k, ping()]").await;
    assert_eq!(value_of(&outcome), &json!(["internal", "pong"]));
}

#[tokio::test(start_paused = true)]
async fn a_hanging_tool_times_out() {
    let outcome = run("hang()").await;
    let e = error_of(&outcome);
    assert_eq!(e.kind, ErrorKind::Timeout);
    assert_eq!(outcome.receipts.len(), 1);
    assert_eq!(outcome.receipts[0].error_kind.as_deref(), Some("timeout"));
    assert_eq!(
        outcome.receipts[0].duration_ms, 50.0,
        "paused time: exactly the timeout"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_output_is_reported_never_shown() {
    let outcome =
        run("let m = ();\ntry { bad_output(); } catch (e) { m = e.message; print(e); }\nm").await;
    let message = value_of(&outcome).as_str().unwrap().to_string();
    assert!(
        message.contains("/n") && message.contains("type"),
        "{message}"
    );
    let everything = format!(
        "{} {:?} {}",
        outcome.to_json(),
        outcome.logs,
        serde_json::to_string(&outcome.receipts).unwrap()
    );
    assert!(!everything.contains("secret-value-42"), "{everything}");
    assert_eq!(outcome.receipts[0].result_sha256, None);
}

fn flaky_read(failures: usize, retries: u32, effect: Effect) -> (Tool, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let tool = Tool::builder("sometimes", effect)
        .retries(retries)
        .handler(move |_| {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < failures {
                    Err(ToolError::unavailable("try again"))
                } else {
                    Ok(json!(n))
                }
            }
        });
    (tool, calls)
}

#[tokio::test(start_paused = true)]
async fn reads_are_retried_on_unavailable() {
    let (tool, calls) = flaky_read(2, 2, Effect::Read);
    let runtime = Runtime::new(Registry::builder().tool(tool).build().unwrap());
    let outcome = runtime.run("sometimes()").await;
    assert_eq!(value_of(&outcome), &json!(2));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(outcome.receipts.len(), 1, "one receipt per dispatch");
    assert_eq!(outcome.receipts[0].attempt, 3);
}

#[tokio::test(start_paused = true)]
async fn retries_run_out() {
    let (tool, calls) = flaky_read(5, 1, Effect::Idempotent);
    let runtime = Runtime::new(Registry::builder().tool(tool).build().unwrap());
    let outcome = runtime.run("sometimes()").await;
    assert_eq!(error_of(&outcome).kind, ErrorKind::Unavailable);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_error_is_not_retried() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let tool = Tool::builder("lookup", Effect::Read)
        .retries(3)
        .handler(move |_| {
            counter.fetch_add(1, Ordering::SeqCst);
            async { Err(ToolError::not_found("nothing")) }
        });
    let runtime = Runtime::new(Registry::builder().tool(tool).build().unwrap());
    let outcome = runtime.run("lookup()").await;
    assert_eq!(error_of(&outcome).kind, ErrorKind::NotFound);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn the_breaker_opens_then_half_opens_across_runs() {
    let probe = Probe::default();
    probe.failing.store(true, Ordering::SeqCst);
    let runtime = Runtime::builder(fixture_registry(&probe))
        .breaker({
            let mut config = BreakerConfig::default();
            config.failure_threshold = 3;
            config.cooldown = Duration::from_secs(30);
            config
        })
        .build();
    let script = "let kinds = [];\nfor i in 0..5 { try { flaky(#{i: i}); kinds.push(\"ok\"); } catch (e) { kinds.push(e.kind); } }\nkinds";

    // Sequential runs, so that the calls that reach the tool can be counted (the scout would
    // also try the failing tool; the results would be the same).
    let outcome = run_in(&runtime, script, Mode::Sequential).await;
    assert_eq!(
        value_of(&outcome),
        &json!([
            "unavailable",
            "unavailable",
            "unavailable",
            "circuit_open",
            "circuit_open"
        ])
    );
    assert_eq!(Probe::count(&probe.flaky_calls), 3);

    // The breaker belongs to the runtime: a new run still finds it open.
    let outcome = run_in(&runtime, "flaky(#{i: 99})", Mode::Sequential).await;
    assert_eq!(error_of(&outcome).kind, ErrorKind::CircuitOpen);
    assert_eq!(Probe::count(&probe.flaky_calls), 3);

    // After the cool-down one probe goes through; it fails, and the breaker opens again.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let outcome = run_in(&runtime, script, Mode::Sequential).await;
    assert_eq!(
        value_of(&outcome),
        &json!([
            "unavailable",
            "circuit_open",
            "circuit_open",
            "circuit_open",
            "circuit_open"
        ])
    );
    assert_eq!(Probe::count(&probe.flaky_calls), 4);

    // The tool recovers; after another cool-down the probe succeeds and the breaker closes.
    probe.failing.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let outcome = run_in(&runtime, script, Mode::Sequential).await;
    assert_eq!(value_of(&outcome), &json!(["ok", "ok", "ok", "ok", "ok"]));
    assert_eq!(Probe::count(&probe.flaky_calls), 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_errors_never_open_the_breaker() {
    let runtime = fixture_runtime(&Probe::default());
    let outcome = runtime
        .run("for i in 0..10 { try { get_user(#{id: 1000 + i}); } catch {} }\nget_user(#{id: 1}).name")
        .await;
    assert_eq!(value_of(&outcome), &json!("user1"));
}

#[derive(Deserialize, schemars::JsonSchema)]
struct AddInput {
    /// The first term.
    a: i64,
    /// The second term.
    b: i64,
}

#[derive(Serialize, schemars::JsonSchema)]
struct AddOutput {
    sum: i64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_tools_take_their_schemas_from_their_types() {
    let add = Tool::builder("add", Effect::Read).typed(|input: AddInput| async move {
        Ok(AddOutput {
            sum: input.a + input.b,
        })
    });
    assert_eq!(
        add.spec().input_schema["properties"]["a"]["type"],
        json!("integer")
    );
    let runtime = Runtime::new(Registry::builder().tool(add).build().unwrap());
    let outcome = runtime.run("add(#{a: 2, b: 40}).sum").await;
    assert_eq!(value_of(&outcome), &json!(42));
    let outcome = runtime.run("add(#{a: 2})").await;
    let e = error_of(&outcome);
    assert_eq!(e.kind, ErrorKind::InvalidInput);
    assert!(e.message.contains("required"), "{}", e.message);
    assert_eq!(outcome.receipts[0].status, Status::Error);
    assert_eq!(
        outcome.receipts[0].attempt, 0,
        "refused before the body ran"
    );
}

/// A read whose body watches its call's node of the run's cancellation tree from a task of its
/// own (as a body that works outside its future does), then waits for ever; `tx` hears when the
/// node is cancelled.
fn watching(name: &str, tx: tokio::sync::mpsc::UnboundedSender<&'static str>) -> Tool {
    let spec = toolscript::ToolSpec::new(name, Effect::Read);
    let label: &'static str = Box::leak(name.to_string().into_boxed_str());
    Tool::from_spec(spec, move |_, ctx| {
        let tx = tx.clone();
        async move {
            assert!(!ctx.is_cancelled(), "a fresh call is not cancelled");
            tokio::spawn(async move {
                ctx.cancelled().await;
                let _ = tx.send(label);
            });
            std::future::pending::<()>().await;
            Ok(json!(null))
        }
    })
}

/// The next body to hear of its cancellation; the bound is against hanging, not a timing claim.
async fn heard(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<&'static str>,
) -> Option<&'static str> {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .ok()
        .flatten()
}

/// One cancellation tree: dropping a run's future cancels what its calls' bodies watch, and a
/// composite's call that ends (its timeout) cancels its nested calls' — while the run goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_hang_from_the_run_s_cancellation_tree() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let wrap = Tool::builder("wrap", Effect::Read)
        .nested(["inner"])
        .timeout(Duration::from_millis(30))
        .composite(|_, ctx| async move { ctx.call("inner", json!({})).await });
    let registry = Registry::builder()
        .tool(watching("inner", tx.clone()))
        .tool(watching("outer", tx))
        .tool(wrap)
        .build()
        .unwrap();
    let runtime = Runtime::builder(registry).build();

    // The composite times out; its nested call's node is cancelled; the script goes on to
    // `outer`, whose call never ends: the run is still running when the nested call hears it.
    let run = runtime.run("let k = (); try { wrap() } catch (e) { k = e.kind } outer()");
    let mut run = Box::pin(run);
    let first = tokio::select! {
        first = heard(&mut rx) => first.expect("the nested call hears of it"),
        _ = &mut run => panic!("the run cannot end: `outer` never answers"),
    };
    assert_eq!(first, "inner");
    // Dropping the run's future cancels the root: `outer`'s body hears it.
    drop(run);
    assert_eq!(heard(&mut rx).await, Some("outer"));
}
