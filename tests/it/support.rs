//! Shared fixtures: a small catalog of Rust tools whose bodies count their invocations, and
//! helpers to run scripts against it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use toolscript::{
    Effect, Mode, Registry, RunError, RunOptions, RunOutcome, Runtime, Tool, ToolError,
};

/// Counts how often each fixture body ran, and switches the flaky tool between failing and healthy.
#[derive(Default, Clone)]
pub struct Probe {
    pub user_calls: Arc<AtomicUsize>,
    pub order_calls: Arc<AtomicUsize>,
    pub write_calls: Arc<AtomicUsize>,
    pub flaky_calls: Arc<AtomicUsize>,
    pub poll_calls: Arc<AtomicUsize>,
    /// While true, `flaky` fails with `unavailable`.
    pub failing: Arc<AtomicBool>,
}

impl Probe {
    pub fn count(counter: &AtomicUsize) -> usize {
        counter.load(Ordering::SeqCst)
    }
}

fn id_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"id": {"type": "integer"}},
        "required": ["id"],
        "additionalProperties": false
    })
}

/// The fixture catalog: reads, writes, and tools that misbehave on purpose.
pub fn fixture_tools(probe: &Probe) -> Vec<Tool> {
    let mut tools = Vec::new();

    let calls = Arc::clone(&probe.user_calls);
    tools.push(
        Tool::builder("get_user", Effect::Read)
            .description("Look up one user by id.")
            .input_schema(id_schema())
            .output_schema(json!({"type": "object", "required": ["id", "name"]}))
            .handler(move |args| {
                calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    let id = args["id"].as_i64().unwrap_or_default();
                    if id > 100 {
                        return Err(ToolError::not_found(format!("no user {id}")));
                    }
                    Ok(json!({"id": id, "name": format!("user{id}"), "active": id % 2 == 0}))
                }
            }),
    );

    let calls = Arc::clone(&probe.order_calls);
    tools.push(
        Tool::builder("get_orders", Effect::Read)
            .input_schema(json!({"type": "object", "properties": {"user": {"type": "integer"}}, "required": ["user"]}))
            .handler(move |args| {
                calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    let user = args["user"].as_i64().unwrap_or_default();
                    Ok(json!((0..user % 3).map(|i| user * 10 + i).collect::<Vec<_>>()))
                }
            }),
    );

    let calls = Arc::clone(&probe.write_calls);
    tools.push(
        Tool::builder("create_order", Effect::Write)
            .input_schema(json!({"type": "object", "properties": {"user": {"type": "integer"}}, "required": ["user"]}))
            .handler(move |args| {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    if args["user"] == json!(0) {
                        return Err(ToolError::new(toolscript::ErrorKind::Conflict, "user 0 cannot order"));
                    }
                    Ok(json!({"order": n, "user": args["user"]}))
                }
            }),
    );

    tools.push(Tool::builder("notify", Effect::External).handler(|_| async { Ok(json!("sent")) }));

    tools.push(Tool::builder("ping", Effect::Read).handler(|_| async { Ok(json!("pong")) }));

    let calls = Arc::clone(&probe.poll_calls);
    tools.push(
        Tool::builder("poll", Effect::Read)
            .allow_repeat(true)
            .handler(move |_| {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                async move { Ok(json!(n)) }
            }),
    );

    let (calls, failing) = (Arc::clone(&probe.flaky_calls), Arc::clone(&probe.failing));
    tools.push(Tool::builder("flaky", Effect::Read).handler(move |_| {
        calls.fetch_add(1, Ordering::SeqCst);
        let fail = failing.load(Ordering::SeqCst);
        async move {
            if fail {
                Err(ToolError::unavailable("the backend is down"))
            } else {
                Ok(json!("ok"))
            }
        }
    }));

    // Reads with a real latency, for tests that need the scout to get ahead of the executor.
    tools.push(
        Tool::builder("lookup", Effect::Read)
            .input_schema(id_schema())
            .handler(|args| async move {
                tokio::time::sleep(Duration::from_millis(30)).await;
                let id = args["id"].as_i64().unwrap_or_default();
                Ok(json!({"id": id, "active": id % 2 == 0}))
            }),
    );
    tools.push(
        Tool::builder("orders_of", Effect::Read)
            .input_schema(id_schema())
            .handler(|args| async move {
                tokio::time::sleep(Duration::from_millis(30)).await;
                Ok(json!([args["id"], args["id"]]))
            }),
    );

    tools.push(
        Tool::builder("hang", Effect::Read)
            .timeout(Duration::from_millis(50))
            .handler(|_| async {
                std::future::pending::<()>().await;
                Ok(Value::Null)
            }),
    );

    tools.push(Tool::builder("boom", Effect::Read).handler(|_| async {
        if true {
            panic!("the tool body exploded");
        }
        Ok(Value::Null)
    }));

    tools.push(
        Tool::builder("bad_output", Effect::Read)
            .output_schema(json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}))
            .handler(|_| async { Ok(json!({"n": "secret-value-42"})) }),
    );

    tools
}

pub fn fixture_registry(probe: &Probe) -> Registry {
    Registry::builder()
        .tools(fixture_tools(probe))
        .build()
        .expect("the fixture catalog is valid")
}

pub fn fixture_runtime(probe: &Probe) -> Runtime {
    Runtime::new(fixture_registry(probe))
}

/// Runs `script` on a fresh fixture runtime.
pub async fn run(script: &str) -> RunOutcome {
    fixture_runtime(&Probe::default()).run(script).await
}

/// The run's error, failing the test if it succeeded.
#[track_caller]
pub fn error_of(outcome: &RunOutcome) -> &RunError {
    match &outcome.result {
        Err(e) => e,
        Ok(v) => panic!("expected an error, the run returned {v}"),
    }
}

/// The run's value, failing the test with the error if it failed.
#[track_caller]
pub fn value_of(outcome: &RunOutcome) -> &Value {
    match &outcome.result {
        Ok(v) => v,
        Err(e) => panic!("expected a value, the run failed: {e}"),
    }
}

/// How many times a tool made by [`by_occurrence`] was called, by its arguments (as JSON text).
pub type Occurrences = Arc<Mutex<HashMap<String, u64>>>;

/// A read that fails by its arguments and by how many times it has been called with them,
/// never by a count shared between arguments: its `n`th call (from 0) with `args` takes
/// `latency(args)`, then fails with `fail(args, n)` when that is an error, and otherwise returns
/// `{"args": args, "n": n}`. A model's retry loop over it ends the same way however its calls
/// are scheduled, as long as each arguments' calls are made in the same order.
pub fn by_occurrence(
    name: &str,
    latency: impl Fn(&Value) -> Duration + Send + Sync + 'static,
    fail: impl Fn(&Value, u64) -> Option<ToolError> + Send + Sync + 'static,
) -> (Tool, Occurrences) {
    let counts = Occurrences::default();
    let seen = Arc::clone(&counts);
    let rule = Arc::new((latency, fail));
    let tool = Tool::builder(name, Effect::Read).handler(move |args| {
        let n = {
            let mut seen = seen.lock().unwrap();
            let n = seen.entry(args.to_string()).or_default();
            *n += 1;
            *n - 1
        };
        let rule = Arc::clone(&rule);
        async move {
            tokio::time::sleep((rule.0)(&args)).await;
            match (rule.1)(&args, n) {
                Some(e) => Err(e),
                None => Ok(json!({"args": args, "n": n})),
            }
        }
    });
    (tool, counts)
}

/// Calls of a [`by_occurrence`] tool in all, over every argument.
pub fn calls_of(occurrences: &Occurrences) -> u64 {
    occurrences.lock().unwrap().values().sum()
}

/// Runs `script` in one mode.
pub async fn run_in(runtime: &Runtime, script: &str, mode: Mode) -> RunOutcome {
    runtime.run_with(script, RunOptions::with_mode(mode)).await
}

/// SHA-256 of `text`, as lowercase hex (as in receipts).
pub fn sha256(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether `node` runs, for the tests that talk to real MCP servers. Without Node.js they skip
/// (saying so), except in CI (`CI=true`), where a missing Node.js is a broken set-up and fails
/// the test.
pub fn node_available() -> bool {
    let found = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "Node.js is not installed, and CI needs the MCP tests: install Node.js and run `npm ci --prefix tests/mcp`"
        );
        eprintln!("skipping: Node.js is not installed");
    }
    found
}

/// The store of runs that every `toolscript` process a test starts uses (`TOOLSCRIPT_STORE`):
/// one file per test process in the build's own temporary folder (which `cargo clean`
/// empties), never the user's own store.
pub fn test_store() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("toolscript-it-{}.sqlite3", std::process::id()))
}

/// A manifest whose one tool, a write, waits for a person's approval, so that a run can pause.
pub const APPROVAL_MANIFEST: &str = r#"
[[tool]]
name = "charge"
effect = "write"
approval = "always"
input = { type = "object", properties = { amount = { type = "integer" } }, required = ["amount"] }
script = '#{ charged: args.amount }'
"#;

/// The schema version of the SQLite store this toolscript writes: a store it opens is upgraded
/// to it.
pub const SQLITE_SCHEMA: i64 = 11;

/// The schema version (`PRAGMA user_version`) of the SQLite file at `path`.
pub fn user_version(path: &std::path::Path) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap()
}

/// The one run `store` holds, once its end is recorded: its id and status. Waits (not a timed
/// assertion: up to a minute) while it is still `running`, as a dropped run's end is recorded
/// in the background.
pub async fn the_run_once_ended(store: &dyn toolscript::Store) -> (String, toolscript::RunStatus) {
    let runs = store
        .list_runs(toolscript::RunQuery::first(10))
        .await
        .unwrap()
        .runs;
    assert_eq!(runs.len(), 1, "{runs:?}");
    let id = runs[0].run_id.clone();
    let mut status = runs[0].status;
    for _ in 0..6000 {
        status = store.run(&id).await.unwrap().unwrap().status;
        if status != toolscript::RunStatus::Running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (id, status)
}
