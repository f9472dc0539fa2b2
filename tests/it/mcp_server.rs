//! `toolscript serve` as MCP clients see it: the built binary, driven by
//! the MCP Inspector's CLI (a real client, run with Node.js) and by rmcp's own client.
//!
//! Expected values come from the library itself: a served run must give what an in-process run
//! of the same script gives, and `describe_tools` what `Runtime::describe` prints.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, Implementation,
    JsonObject, Tool,
};
use rmcp::transport::TokioChildProcess;
use rmcp::{ServiceError, ServiceExt};
use serde_json::{json, Value};
use toolscript::{demo_catalog, Format, Mode, RunOptions, Runtime};

/// Every client session must finish within this, so that a protocol hang fails the test.
const DEADLINE: Duration = Duration::from_secs(60);

/// A script that calls a tool, prints and returns a value; several lines, as models write them.
const SCRIPT: &str = "let c = get_customer(#{id: 3});\nprint(\"hi\");\nc.name";

/// The demo catalog's runtime, as `toolscript serve` without `--tools` builds it.
/// The demo catalog's runtime as `serve` builds it: with a store (so with `ts_artifact`).
fn demo_runtime() -> Runtime {
    let store =
        toolscript::SqliteStore::open(&crate::support::test_store()).expect("the test store");
    Runtime::builder(demo_catalog().expect("the demo catalog is valid"))
        .store(std::sync::Arc::new(store))
        .build()
}

/// The outcome JSON of an in-process run of `script`, as `toolscript run --json` prints it.
fn run_in_process(script: &str, mode: Mode) -> Value {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime starts");
    rt.block_on(demo_runtime().run_with(script, RunOptions::with_mode(mode)))
        .to_json()
}

/// The parts of an outcome that do not depend on timing: `stats` holds wall time and counts of
/// speculation, which may differ between two runs.
fn stable(outcome: &Value) -> Value {
    let mut out = outcome.clone();
    let map = out.as_object_mut().expect("an outcome is an object");
    map.remove("stats");
    // Every run has an id of its own.
    map.remove("run_id");
    // The chain's head hashes the run's own id; its length is the same in every run.
    if let Some(head) = map.get_mut("receipts").and_then(|r| r.get_mut("head")) {
        *head = Value::from(head.is_string());
    }
    out
}

/// The structured content of a `run_script` result, after checking that its text content is
/// the same JSON and that `isError` matches `ok`.
#[track_caller]
pub(crate) fn outcome_of(result: &Value) -> Value {
    let structured = result["structuredContent"].clone();
    assert!(structured.is_object(), "no structured content: {result:#}");
    let text = result["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("no text content: {result:#}"));
    let from_text: Value = serde_json::from_str(text).expect("the text content is JSON");
    assert_eq!(
        numbers_as_floats(&from_text),
        numbers_as_floats(&structured),
        "text and structured content differ"
    );
    assert_eq!(
        result["isError"],
        json!(structured["ok"] == json!(false)),
        "isError must be set exactly when ok is false: {result:#}"
    );
    structured
}

/// `value` with every number a float. A JavaScript client re-serialises the structured content
/// it received, and writes the float `0.0` as `0`.
fn numbers_as_floats(value: &Value) -> Value {
    match value {
        Value::Number(n) => json!(n.as_f64()),
        Value::Array(items) => Value::Array(items.iter().map(numbers_as_floats).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), numbers_as_floats(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Checks `outcome` against the output schema `run_script` declares.
#[track_caller]
pub(crate) fn assert_matches_output_schema(tool: &Tool, outcome: &Value) {
    let schema = Value::Object(
        tool.output_schema
            .as_deref()
            .expect("run_script declares an output schema")
            .clone(),
    );
    let validator = jsonschema::validator_for(&schema).expect("the output schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(outcome)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "the outcome breaks the output schema: {errors:?}\n{outcome:#}"
    );
}

// ---------------------------------------------------------------------------------------------
// The MCP Inspector's CLI (Node.js).
// ---------------------------------------------------------------------------------------------

/// What one run of the Inspector CLI produced.
struct Inspected {
    success: bool,
    stdout: String,
    stderr: String,
}

impl Inspected {
    /// The JSON the Inspector printed, failing the test if it failed.
    #[track_caller]
    fn json(&self) -> Value {
        assert!(
            self.success,
            "the Inspector failed\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.stdout, self.stderr
        );
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("the Inspector printed no JSON ({e}):\n{}", self.stdout))
    }
}

/// The Inspector's CLI, or `None` (after saying so) when Node.js is not installed. With Node.js
/// but without the packages, the test fails: that is a set-up step left out, not a platform
/// without Node.
fn inspector() -> Option<PathBuf> {
    if !crate::support::node_available() {
        return None;
    }
    let bin =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/node_modules/.bin/mcp-inspector");
    assert!(
        bin.exists(),
        "{} is missing: run `npm ci --prefix tests/mcp`",
        bin.display()
    );
    Some(bin)
}

/// Runs the Inspector CLI against `toolscript serve` with `args` (`--method ...`), killing it
/// if it has not finished by [`DEADLINE`].
fn inspect(inspector: &Path, args: &[&str]) -> Inspected {
    let mut cmd = Command::new(inspector);
    cmd.arg("--cli")
        .arg(env!("CARGO_BIN_EXE_toolscript"))
        .arg("serve")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("RUST_LOG")
        .env("TOOLSCRIPT_STORE", crate::support::test_store())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // The Inspector starts a second Node process, which starts the server: a group of its own
    // lets a timeout kill all three.
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().expect("the Inspector starts");
    let stdout = drain(child.stdout.take().expect("stdout is piped"));
    let stderr = drain(child.stderr.take().expect("stderr is piped"));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("the Inspector can be waited for") {
            break Some(status);
        }
        if started.elapsed() > DEADLINE {
            kill_group(&mut child);
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (join(stdout), join(stderr));
    let Some(status) = status else {
        panic!(
            "the Inspector did not finish within {DEADLINE:?}\n--- stdout ---\n{stdout}\n\
             --- stderr ---\n{stderr}"
        );
    };
    Inspected {
        success: status.success(),
        stdout,
        stderr,
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}

fn join(reader: std::thread::JoinHandle<String>) -> String {
    reader.join().expect("the pipe reader does not panic")
}

fn kill_group(child: &mut std::process::Child) {
    #[cfg(unix)]
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .status();
    let _ = child.kill();
    let _ = child.wait();
}

/// `tools/call run_script` through the Inspector, with `args` as `--tool-arg key=value` pairs.
fn inspect_run_script(inspector: &Path, args: &[&str]) -> Inspected {
    let mut all = vec![
        "--method",
        "tools/call",
        "--tool-name",
        "run_script",
        "--tool-arg",
    ];
    all.extend_from_slice(args);
    inspect(inspector, &all)
}

#[test]
fn inspector_lists_the_tools_with_the_api_in_run_script() {
    let Some(inspector) = inspector() else { return };
    let listed = inspect(&inspector, &["--method", "tools/list"]).json();
    let tools = listed["tools"].as_array().expect("a tool list");
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "run_script",
            "describe_tools",
            "resume_run",
            "list_runs",
            "read_artifact",
            "plan_script",
            "apply_plan"
        ]
    );

    let run_script = &tools[0];
    let description = run_script["description"].as_str().expect("a description");
    assert!(description.contains("fn get_customer("), "{description}");
    assert!(
        description.ends_with(&demo_runtime().describe(Format::Rhai)),
        "the description ends with the tools' API:\n{description}"
    );
    assert_eq!(run_script["inputSchema"]["required"], json!(["script"]));
    assert_eq!(
        run_script["inputSchema"]["properties"]["sequential"]["type"],
        "boolean"
    );
    assert_eq!(
        run_script["outputSchema"]["required"],
        json!(["run_id", "ok", "logs", "effects", "receipts"])
    );
    // `status` is required in each way a run ends, with the field that goes with it.
    let ends = run_script["outputSchema"]["oneOf"]
        .as_array()
        .expect("oneOf");
    let required: Vec<&Value> = ends.iter().map(|end| &end["required"]).collect();
    assert_eq!(
        required,
        [
            &json!(["status", "value"]),
            &json!(["status", "error"]),
            &json!(["status", "pending"]),
            // Interrupted: what stopped it (its store could not be written).
            &json!(["status", "error"])
        ]
    );
    assert_eq!(tools[1]["annotations"]["readOnlyHint"], true);
}

#[test]
fn inspector_runs_a_multi_line_script() {
    let Some(inspector) = inspector() else { return };
    let script = format!("script={SCRIPT}");
    // The Inspector checks the structured content against the output schema it listed.
    let result = inspect_run_script(&inspector, &[&script, "stats=true"]).json();
    let outcome = outcome_of(&result);
    assert_eq!(outcome["ok"], true, "{outcome:#}");
    assert_eq!(outcome["logs"], json!(["hi"]));
    assert!(outcome["value"].is_string(), "{outcome:#}");
    assert_eq!(outcome["stats"]["mode"], "speculative");
    assert_eq!(
        stable(&outcome),
        stable(&run_in_process(SCRIPT, Mode::Speculative))
    );
}

#[test]
fn inspector_gets_a_failed_script_as_a_result() {
    let Some(inspector) = inspector() else { return };
    let script = "get_customer(#{id: 999})";
    let result = inspect_run_script(
        &inspector,
        &[&format!("script={script}"), "sequential=true", "stats=true"],
    )
    .json();
    let outcome = outcome_of(&result);
    assert_eq!(result["isError"], true);
    assert_eq!(outcome["ok"], false);
    assert_eq!(outcome["error"]["kind"], "not_found", "{outcome:#}");
    assert_eq!(outcome["error"]["tool"], "get_customer");
    assert_eq!(outcome["stats"]["mode"], "sequential");
    assert_eq!(
        stable(&outcome),
        stable(&run_in_process(script, Mode::Sequential))
    );
}

#[test]
fn inspector_gets_a_syntax_error_with_its_position() {
    let Some(inspector) = inspector() else { return };
    let result = inspect_run_script(&inspector, &["script=let x = ;\nx"]).json();
    let outcome = outcome_of(&result);
    assert_eq!(outcome["ok"], false);
    assert_eq!(outcome["error"]["kind"], "invalid_script", "{outcome:#}");
    assert_eq!(outcome["error"]["line"], 1);
}

/// A call without a script is the model's mistake, which it can correct: an error result that
/// names the field and what it takes, not a protocol error.
#[test]
fn inspector_gets_bad_arguments_as_an_error_result() {
    let Some(inspector) = inspector() else { return };
    let result = inspect_run_script(&inspector, &["sequential=true"]).json();
    assert_eq!(result["isError"], true, "{result:#}");
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    assert!(
        text.contains("\"script\" is a required property")
            && text.contains("`script` (string, required)"),
        "the text names the missing field and what it takes: {text}"
    );
}

#[test]
fn inspector_describes_the_tools() {
    let Some(inspector) = inspector() else { return };
    let result = inspect(
        &inspector,
        &["--method", "tools/call", "--tool-name", "describe_tools"],
    )
    .json();
    assert_ne!(result["isError"], true, "{result:#}");
    assert_eq!(
        result["content"][0]["text"].as_str(),
        Some(demo_runtime().describe(Format::Rhai).as_str())
    );
}

// ---------------------------------------------------------------------------------------------
// rmcp's client (no Node.js needed).
// ---------------------------------------------------------------------------------------------

pub(crate) fn arguments(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        other => panic!("arguments are an object, not {other}"),
    }
}

/// The JSON of a `run_script` result, as the wire carries it, for [`outcome_of`].
pub(crate) fn wire(result: &CallToolResult) -> Value {
    serde_json::to_value(result).expect("a result serialises")
}

/// A Rust MCP client's session with `toolscript serve ARGS`, on the store at `store`.
pub(crate) async fn serve_session(
    args: &[&std::ffi::OsStr],
    store: &Path,
) -> rmcp::service::RunningService<rmcp::RoleClient, ClientConfig> {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolscript"));
    cmd.arg("serve")
        .args(args)
        .env_remove("RUST_LOG")
        .env("TOOLSCRIPT_STORE", store);
    let (transport, _stderr) = TokioChildProcess::builder(cmd)
        .stderr(Stdio::null())
        .spawn()
        .expect("toolscript serve starts");
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("toolscript-tests", "0"),
    )
    .serve(transport)
    .await
    .expect("the session initialises")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_client_lists_tools_and_runs_scripts() {
    tokio::time::timeout(DEADLINE, rust_client_session())
        .await
        .expect("the MCP session finished in time");
}

async fn rust_client_session() {
    let client = serve_session(&[], &crate::support::test_store()).await;

    let info = client.peer_info().expect("the server introduced itself");
    let server = info.server_info.as_ref().expect("the server names itself");
    assert_eq!(server.name, "toolscript");
    assert_eq!(server.version, env!("CARGO_PKG_VERSION"));
    assert!(info
        .instructions
        .as_deref()
        .is_some_and(|i| i.contains("run_script")));

    let tools = client.list_all_tools().await.expect("tools/list answers");
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(
        names,
        [
            "run_script",
            "describe_tools",
            "resume_run",
            "list_runs",
            "read_artifact",
            "plan_script",
            "apply_plan"
        ]
    );
    let run_script = &tools[0];
    assert!(run_script
        .description
        .as_deref()
        .is_some_and(|d| d.contains("fn get_customer(")));

    // A script that succeeds, and one that fails, run at the same time on one server.
    let call = |args: Value| {
        client.call_tool(CallToolRequestParams::new("run_script").with_arguments(arguments(args)))
    };
    let (ok, failed) = tokio::join!(
        call(json!({"script": SCRIPT})),
        call(json!({"script": "get_customer(#{id: 999})", "sequential": true, "stats": true})),
    );
    let ok = outcome_of(&wire(&ok.expect("run_script answers")));
    assert_matches_output_schema(run_script, &ok);
    assert_eq!(ok["ok"], true);
    assert_eq!(ok["logs"], json!(["hi"]));
    assert_eq!(
        stable(&ok),
        stable(
            &demo_runtime()
                .run_with(SCRIPT, RunOptions::with_mode(Mode::Speculative))
                .await
                .to_json()
        )
    );
    let failed = outcome_of(&wire(&failed.expect("a failed script is a result")));
    assert_matches_output_schema(run_script, &failed);
    assert_eq!(failed["ok"], false);
    assert_eq!(failed["error"]["kind"], "not_found");
    assert_eq!(failed["stats"]["mode"], "sequential");

    // The script's input, as `run --input` gives it.
    let with_input = call(json!({
        "script": "get_customer(#{id: input.id}).name",
        "input": {"id": 1}
    }))
    .await;
    let with_input = outcome_of(&wire(&with_input.expect("run_script answers")));
    assert_eq!(with_input["ok"], true, "{with_input}");
    let direct = demo_runtime().run("get_customer(#{id: 1}).name").await;
    assert_eq!(with_input["value"], direct.to_json()["value"]);

    // Wrong arguments are the model's mistake, which it can correct: an error result naming
    // the field, not a protocol error. A tool that does not exist stays invalid params.
    let mut bad = crate::mcp_http::bad_calls();
    bad.extend([
        ("list_runs", json!({"all": true}), "'all' was unexpected"),
        (
            "read_artifact",
            json!({"id": "a", "page": -1}),
            "`page`: -1",
        ),
    ]);
    for (tool, args, names) in bad {
        let result = client
            .call_tool(CallToolRequestParams::new(tool).with_arguments(arguments(args.clone())))
            .await
            .unwrap_or_else(|e| panic!("{tool} {args}: a result, not {e:?}"));
        assert_eq!(result.is_error, Some(true), "{tool} {args}: {result:?}");
        let text = result.content[0]
            .as_text()
            .map(|t| t.text.clone())
            .unwrap_or_default();
        assert!(
            text.contains(names) && text.contains(&format!("`{tool}` takes")),
            "{tool} {args}: the text names the field and what the tool takes: {text}"
        );
    }
    match client
        .call_tool(CallToolRequestParams::new("no_such_tool"))
        .await
    {
        Err(ServiceError::McpError(e)) => assert_eq!(e.code.0, -32602, "{e:?}"),
        other => panic!("expected invalid params, got {other:?}"),
    }

    let described = client
        .call_tool(CallToolRequestParams::new("describe_tools"))
        .await
        .expect("describe_tools answers");
    let text = described.content[0]
        .as_text()
        .map(|t| t.text.clone())
        .expect("text content");
    assert_eq!(text, demo_runtime().describe(Format::Rhai));

    client.cancel().await.expect("the session closes");
}

/// `plan_script` lists the demo triage's calls without making one; `apply_plan` makes exactly
/// them (its outcome's effects are the planned calls, in order), once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_script_then_apply_plan_over_mcp() {
    tokio::time::timeout(DEADLINE, plan_session())
        .await
        .expect("the MCP session finished in time");
}

async fn plan_session() {
    let dir = tempfile::TempDir::new().unwrap();
    let client = serve_session(&[], &dir.path().join("store.sqlite3")).await;
    let demo = std::fs::read_to_string("scripts/demo.rhai").unwrap();
    let call = |tool: &'static str, args: Value| {
        let client = &client;
        async move {
            client
                .call_tool(CallToolRequestParams::new(tool).with_arguments(arguments(args)))
                .await
                .unwrap_or_else(|e| panic!("{tool}: {e:?}"))
        }
    };
    let planned = call("plan_script", json!({"script": demo})).await;
    assert_ne!(planned.is_error, Some(true), "{planned:?}");
    let text = planned.content[0]
        .as_text()
        .map(|t| t.text.clone())
        .unwrap();
    let plan: Value = serde_json::from_str(&text).expect("the plan is JSON");
    let calls: Vec<(String, Value)> = plan["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["tool"].as_str().unwrap().to_string(), c["args"].clone()))
        .collect();
    assert!(calls.len() >= 3, "{plan}");
    assert!(plan["note"].as_str().unwrap().contains("world without it"));
    let plan_id = plan["plan_id"].as_str().unwrap().to_string();
    let applied = call("apply_plan", json!({"plan_id": plan_id})).await;
    let outcome = wire(&applied);
    let outcome = &outcome["structuredContent"];
    assert_eq!(outcome["status"], json!("completed"), "{outcome}");
    let effects: Vec<(String, Value)> = outcome["effects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["tool"].as_str().unwrap().to_string(), e["args"].clone()))
        .collect();
    let planned_tools: Vec<&str> = calls.iter().map(|(t, _)| t.as_str()).collect();
    let made_tools: Vec<&str> = effects.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(made_tools, planned_tools);
    // Arguments without markers are the same; the one with a marker got the real refund id.
    for ((tool, planned), (_, made)) in calls.iter().zip(&effects) {
        if !planned.to_string().contains("<from planned #") {
            assert_eq!(planned, made, "{tool}");
        } else {
            assert!(!made.to_string().contains("<from planned"), "{made}");
        }
    }
    let again = call("apply_plan", json!({"plan_id": plan_id})).await;
    assert_eq!(again.is_error, Some(true));
    let text = again.content[0].as_text().map(|t| t.text.clone()).unwrap();
    assert!(text.contains("applied already"), "{text}");
    client.cancel().await.expect("the session closes");
}

/// What a hostile or broken client sends gets the error JSON-RPC asks for, and the session
/// goes on: text that is not JSON (-32700), JSON that is not a request (-32600), `params` of
/// the wrong type (-32602, with the request's id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_get_json_rpc_errors_and_the_session_goes_on() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolscript"))
        .arg("serve")
        .env_remove("RUST_LOG")
        .env("TOOLSCRIPT_STORE", crate::support::test_store())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("toolscript serve starts");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let reply = exchange(&mut stdin, &mut stdout, "this is not json").await;
    assert_eq!(reply["error"]["code"], json!(-32700), "{reply}");
    assert_eq!(reply["id"], Value::Null);
    let reply = exchange(&mut stdin, &mut stdout, "[1, 2]").await;
    assert_eq!(reply["error"]["code"], json!(-32600), "{reply}");
    let reply = exchange(
        &mut stdin,
        &mut stdout,
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/list","params":"str"}"#,
    )
    .await;
    assert_eq!(reply["error"]["code"], json!(-32602), "{reply}");
    assert_eq!(reply["id"], json!(5));
    // The session is still there: a proper handshake is answered.
    let reply = exchange(&mut stdin, &mut stdout, r#"{"jsonrpc":"2.0","id":6,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#).await;
    assert_eq!(reply["id"], json!(6), "{reply}");
    assert_eq!(
        reply["result"]["serverInfo"]["name"],
        json!("toolscript"),
        "{reply}"
    );
    drop(stdin);
    let status = tokio::time::timeout(DEADLINE, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(
        status.success(),
        "serve ends when its input does: {status:?}"
    );
}

/// Sends one line to a child's stdin and reads one JSON line back.
async fn exchange(
    stdin: &mut tokio::process::ChildStdin,
    stdout: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    line: &str,
) -> Value {
    use tokio::io::AsyncWriteExt;
    stdin
        .write_all(format!("{line}\n").as_bytes())
        .await
        .unwrap();
    let reply = tokio::time::timeout(DEADLINE, stdout.next_line())
        .await
        .expect("an answer in time")
        .unwrap()
        .expect("a line");
    serde_json::from_str::<Value>(&reply).expect("the answer is JSON")
}

// ---------------------------------------------------------------------------------------------
// The published schemas against the server's real answers.
// ---------------------------------------------------------------------------------------------

/// The compiled schema `tool` publishes, its input schema or its output schema.
fn published(tool: &Tool, output: bool) -> jsonschema::Validator {
    let schema = if output {
        tool.output_schema
            .as_deref()
            .unwrap_or_else(|| panic!("{} publishes an output schema", tool.name))
            .clone()
    } else {
        (*tool.input_schema).clone()
    };
    let schema = Value::Object(schema);
    assert!(
        !schema.to_string().contains("\"$ref\"") && schema.get("$schema").is_none(),
        "{}: a plain schema, every part inline: {schema:#}",
        tool.name
    );
    jsonschema::validator_for(&schema)
        .unwrap_or_else(|e| panic!("{}'s schema compiles: {e}\n{schema:#}", tool.name))
}

/// Checks that `answer` holds to `validator`, the output schema of `what`.
#[track_caller]
fn assert_holds(validator: &jsonschema::Validator, what: &str, answer: &Value) {
    let errors: Vec<String> = validator
        .iter_errors(answer)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{what} breaks its published output schema: {errors:?}\n{answer:#}"
    );
}

/// A completed, a failed and a paused run, the resumed run, an artifact read whole and by
/// page, and the list of runs: every structured answer holds to the output schema its tool
/// publishes (`resume_run` answers like `run_script`, with its schema).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_answers_hold_to_the_published_output_schemas() {
    tokio::time::timeout(DEADLINE, output_schemas_session())
        .await
        .expect("the MCP session finished in time");
}

async fn output_schemas_session() {
    let dir = tempfile::TempDir::new().unwrap();
    let manifest = dir.path().join("m.toml");
    std::fs::write(&manifest, crate::support::APPROVAL_MANIFEST).unwrap();
    let client = serve_session(
        &["--tools".as_ref(), manifest.as_os_str()],
        &dir.path().join("store.sqlite3"),
    )
    .await;
    let tools = client.list_all_tools().await.expect("tools/list answers");
    let tool = |name: &str| {
        tools
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("{name} is listed"))
    };
    let run_script = published(tool("run_script"), true);
    let list_runs = published(tool("list_runs"), true);
    let read_artifact = published(tool("read_artifact"), true);
    let call = |name: &'static str, args: Value| {
        let request = CallToolRequestParams::new(name).with_arguments(arguments(args));
        let peer = client.peer().clone();
        async move {
            let result = peer
                .call_tool(request)
                .await
                .unwrap_or_else(|e| panic!("{name} answers: {e:?}"));
            let structured = result.structured_content.clone();
            (result, structured.unwrap_or(Value::Null))
        }
    };

    let (_, completed) = call(
        "run_script",
        json!({"script": "print(\"hi\"); 40 + 2", "stats": true}),
    )
    .await;
    assert_eq!(completed["status"], "completed", "{completed:#}");
    assert!(completed["stats"].is_object(), "{completed:#}");
    assert_holds(&run_script, "a completed run", &completed);

    let (result, failed) = call("run_script", json!({"script": "let x = ;\nx"})).await;
    assert_eq!(result.is_error, Some(true));
    assert_eq!(failed["error"]["kind"], "invalid_script", "{failed:#}");
    assert_holds(&run_script, "a failed run", &failed);

    let (_, thrown) = call("run_script", json!({"script": "throw \"no\""})).await;
    assert_eq!(thrown["status"], "failed", "{thrown:#}");
    assert_holds(&run_script, "a script that throws", &thrown);

    let (_, paused) = call(
        "run_script",
        json!({"script": "charge(#{amount: 5}).charged + 1"}),
    )
    .await;
    assert_eq!(paused["status"], "paused", "{paused:#}");
    assert_eq!(paused["pending"]["awaiting"], "approval");
    assert_holds(&run_script, "a paused run", &paused);

    let (_, runs) = call("list_runs", json!({})).await;
    let listed = runs["runs"].as_array().expect("a list of runs");
    assert!(
        listed.iter().any(|r| r["run_id"] == paused["run_id"]
            && r["status"] == "paused"
            && r["pending"]["tool"] == "charge"),
        "{runs:#}"
    );
    assert!(listed.iter().any(|r| r["pending"].is_null()), "{runs:#}");
    assert_holds(&list_runs, "the list of runs", &runs);

    let (_, resumed) = call(
        "resume_run",
        json!({"run_id": paused["run_id"], "decision": "approve"}),
    )
    .await;
    assert_eq!(resumed["value"], 6, "{resumed:#}");
    assert_eq!(resumed["effects"][0]["ok"], true, "{resumed:#}");
    assert_holds(&run_script, "a resumed run", &resumed);

    // A value over the inline budget leaves an artifact.
    let (_, large) = call(
        "run_script",
        json!({"script": "let a = []; for i in 0..3000 { a.push(i) } a"}),
    )
    .await;
    assert_holds(&run_script, "a run with an artifact", &large);
    let id = large["artifacts"][0]["id"].clone();
    assert!(id.is_string(), "{large:#}");
    // Without a page, page 0.
    let (_, first) = call("read_artifact", json!({"id": id})).await;
    assert_eq!(first["artifact"]["page"], 0, "{first:#}");
    assert_holds(&read_artifact, "an artifact's first page", &first);
    let (_, page) = call("read_artifact", json!({"id": id, "page": 1})).await;
    assert_eq!(page["artifact"]["page"], 1, "{page:#}");
    assert!(page["artifact"]["items"].is_array(), "{page:#}");
    assert_holds(&read_artifact, "an artifact's page", &page);

    client.cancel().await.expect("the session closes");
}

/// Each tool's published input schema takes and refuses what the server does: a wrong call
/// that the schema refuses is an error result, and one it accepts is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_input_schemas_refuse_what_the_server_refuses() {
    tokio::time::timeout(DEADLINE, input_schemas_session())
        .await
        .expect("the MCP session finished in time");
}

async fn input_schemas_session() {
    let client = serve_session(&[], &crate::support::test_store()).await;
    let tools = client.list_all_tools().await.expect("tools/list answers");
    // (tool, arguments, whether the schema and the server take them)
    let cases = [
        ("run_script", json!({"script": "1"}), true),
        (
            "run_script",
            json!({"script": "1", "sequential": true, "stats": false, "input": [1]}),
            true,
        ),
        ("run_script", json!({"script": "1", "scrpit": "1"}), false),
        ("run_script", json!({"script": 5}), false),
        (
            "run_script",
            json!({"script": "1", "sequential": "yes"}),
            false,
        ),
        ("run_script", json!({}), false),
        ("describe_tools", json!({}), true),
        ("describe_tools", json!({"verbose": true}), false),
        ("list_runs", json!({}), true),
        ("list_runs", json!({"all": true}), false),
        (
            "resume_run",
            json!({"run_id": "r", "decision": "maybe"}),
            false,
        ),
        ("resume_run", json!({"run_id": 7}), false),
        (
            "resume_run",
            json!({"run_id": "r", "decision": null}),
            false,
        ),
        (
            "resume_run",
            json!({"run_id": "r", "reason": "x", "why": "y"}),
            false,
        ),
        ("read_artifact", json!({"id": "a", "page": -1}), false),
        ("read_artifact", json!({"id": "a", "page": "1"}), false),
        ("read_artifact", json!({"id": "a", "page": null}), false),
        ("read_artifact", json!({"id": "a", "pages": 1}), false),
    ];
    for (name, args, takes) in cases {
        let tool = tools.iter().find(|t| t.name == name).expect("listed");
        let validator = published(tool, false);
        assert_eq!(
            validator.is_valid(&args),
            takes,
            "{name} {args}: the published schema {}",
            if takes { "refuses it" } else { "takes it" }
        );
        let result = client
            .call_tool(CallToolRequestParams::new(name).with_arguments(arguments(args.clone())))
            .await
            .unwrap_or_else(|e| panic!("{name} {args}: a result, not {e:?}"));
        let text = result.content[0]
            .as_text()
            .map(|t| t.text.clone())
            .unwrap_or_default();
        let refused = text.starts_with(&format!("bad arguments for `{name}`"));
        assert_eq!(
            refused, !takes,
            "{name} {args}: the server's answer disagrees with its schema: {text}"
        );
        if !takes {
            assert_eq!(result.is_error, Some(true), "{name} {args}");
            assert!(text.contains(&format!("`{name}` takes")), "{text}");
        }
    }
    client.cancel().await.expect("the session closes");
}

/// In `serve`, runs share the process and its memory budget: a run that grows past it ends
/// itself, saying the budget is the process's and shared, and the run going on beside it is
/// left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_run_over_the_memory_budget_leaves_another_run_alone() {
    tokio::time::timeout(DEADLINE, memory_session())
        .await
        .expect("the MCP session finished in time");
}

async fn memory_session() {
    let dir = tempfile::TempDir::new().unwrap();
    let args: Vec<&std::ffi::OsStr> = ["--max-memory-mb", "200", "--no-store"]
        .iter()
        .map(std::ffi::OsStr::new)
        .collect();
    let client = serve_session(&args, &dir.path().join("store.sqlite3")).await;
    let run = |script: &'static str| {
        let client = &client;
        async move {
            let result = client
                .call_tool(
                    CallToolRequestParams::new("run_script")
                        .with_arguments(arguments(json!({ "script": script }))),
                )
                .await
                .expect("run_script answers");
            wire(&result)["structuredContent"].clone()
        }
    };
    // The small run starts first and sleeps while the greedy one grows past the budget.
    let small = run("sleep(2.0); 40 + 2");
    let greedy = run(
        "sleep(0.3);\nlet chunk = \"x\";\nfor i in 0..20 { chunk += chunk; }\nlet all = [];\nloop { all.push(chunk + all.len()); }",
    );
    let (small, greedy) = tokio::join!(small, greedy);
    assert_eq!(
        small["value"],
        json!(42),
        "the small run was left alone: {small}"
    );
    assert_eq!(greedy["error"]["kind"], json!("limit_exceeded"), "{greedy}");
    let message = greedy["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("memory budget of 200 MiB, shared by the 2 runs going on"),
        "{message}"
    );
    client.cancel().await.expect("the session closes");
}
