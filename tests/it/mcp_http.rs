//! `toolscript serve --http` as MCP clients see it: the built binary on 127.0.0.1, driven by
//! rmcp's Streamable HTTP client and by the Python MCP SDK's (`tests/http/client.py`, run with
//! the venv `.ci/setup` makes).
//!
//! The server is stateless: nothing a client relies on lives in the process, so a client goes
//! on across a restart of the server, and a paused run is resumed by another instance on the
//! same store.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, Implementation,
    JsonObject, ProgressNotificationParam,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, RoleClient, ServiceError, ServiceExt};
use serde_json::{json, Value};
use tempfile::TempDir;

/// Every session, call and server start must finish within this, so that a hang fails the test.
const DEADLINE: Duration = Duration::from_secs(60);

/// A script that calls a tool, prints and returns a value.
const SCRIPT: &str = "let c = get_customer(#{id: 3});\nprint(\"hi\");\nc.name";

/// A script that takes about 1.5 s and makes 6 calls one after another.
const SLOW: &str = "for i in 1..7 { get_customer(#{id: i}); sleep(0.25); } 6";

// ---------------------------------------------------------------------------------------------
// The server.
// ---------------------------------------------------------------------------------------------

/// A `toolscript serve --http` process, killed when dropped.
struct Served {
    child: Child,
    /// `http://127.0.0.1:PORT/mcp`, as the server printed it.
    url: String,
    /// Everything the server wrote on stderr so far.
    stderr: Arc<Mutex<String>>,
}

impl Served {
    /// Starts `toolscript serve --http ADDR ARGS...` on `store` and waits for the line that
    /// says where it listens.
    fn start(addr: &str, store: &Path, args: &[&str]) -> Served {
        let mut child = Command::new(env!("CARGO_BIN_EXE_toolscript"))
            .args(["serve", "--http", addr])
            .args(args)
            .env_remove("RUST_LOG")
            .env("TOOLSCRIPT_STORE", store)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("toolscript serve --http starts");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (url_tx, url_rx) = mpsc::channel();
        let pipe = child.stderr.take().expect("stderr is piped");
        let all = Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if let Some(url) = line.strip_prefix("toolscript: serving MCP on ") {
                    let _ = url_tx.send(url.to_string());
                }
                let mut all = all.lock().unwrap();
                all.push_str(&line);
                all.push('\n');
            }
        });
        let Ok(url) = url_rx.recv_timeout(DEADLINE) else {
            let _ = child.kill();
            panic!(
                "the server never said where it listens; stderr:\n{}",
                stderr.lock().unwrap()
            );
        };
        Served { child, url, stderr }
    }

    /// `127.0.0.1:PORT`, the address the server is bound to.
    fn addr(&self) -> String {
        let rest = self.url.trim_start_matches("http://");
        rest.trim_end_matches("/mcp").to_string()
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Kills the server at once (SIGKILL): no chance to finish anything.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.kill();
    }
}

fn write(dir: &TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

// ---------------------------------------------------------------------------------------------
// rmcp's client.
// ---------------------------------------------------------------------------------------------

/// A client that keeps the progress notifications it receives (rmcp's client puts a progress
/// token on every request).
#[derive(Clone, Default)]
struct Recorder {
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
}

impl ClientHandler for Recorder {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push(params);
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("toolscript-tests", "0"),
        )
    }
}

async fn rust_client(url: &str) -> RunningService<RoleClient, Recorder> {
    let transport = StreamableHttpClientTransport::from_uri(url.to_string());
    tokio::time::timeout(DEADLINE, Recorder::default().serve(transport))
        .await
        .expect("the session initialises in time")
        .expect("the session initialises")
}

fn arguments(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        other => panic!("arguments are an object, not {other}"),
    }
}

async fn call(
    client: &RunningService<RoleClient, Recorder>,
    tool: &'static str,
    args: Value,
) -> Result<CallToolResult, ServiceError> {
    let request = CallToolRequestParams::new(tool).with_arguments(arguments(args));
    tokio::time::timeout(DEADLINE, client.call_tool(request))
        .await
        .expect("the call answers in time")
}

/// The structured content of a result, after checking that `isError` matches `ok`.
#[track_caller]
fn outcome(result: &CallToolResult) -> Value {
    let structured = result
        .structured_content
        .clone()
        .unwrap_or_else(|| panic!("no structured content: {result:?}"));
    assert_eq!(
        result.is_error.unwrap_or(false),
        structured["ok"] == json!(false) && structured["status"] == "failed",
        "isError is set exactly when the run failed: {structured:#}"
    );
    structured
}

#[track_caller]
fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect()
}

/// The value of an in-process run of `script` on the demo catalog.
async fn value_in_process(script: &str) -> Value {
    let runtime = toolscript::Runtime::new(toolscript::demo_catalog().expect("the demo catalog"));
    runtime
        .run(script)
        .await
        .result
        .expect("the script succeeds in process")
}

/// The wrong calls every client must get back as error results naming the field, and the text
/// each must contain.
pub(crate) fn bad_calls() -> Vec<(&'static str, Value, &'static str)> {
    vec![
        ("run_script", json!({}), "\"script\" is a required property"),
        (
            "run_script",
            json!({"script": 5}),
            "`script`: 5 is not of type \"string\"",
        ),
        (
            "run_script",
            json!({"script": "1", "scrpit": "1"}),
            "'scrpit' was unexpected",
        ),
        (
            "resume_run",
            json!({"run_id": "r", "decision": "maybe"}),
            "`decision`: \"maybe\"",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_client_lists_tools_runs_a_script_and_gets_bad_arguments_as_results() {
    // `-v`: the server's own logs, which must be plain text on a pipe.
    let served = Served::start("127.0.0.1:0", &crate::support::test_store(), &["-v"]);
    let client = rust_client(&served.url).await;
    let info = client.peer_info().expect("the server introduced itself");
    assert_eq!(
        info.server_info.as_ref().map(|s| s.name.as_str()),
        Some("toolscript")
    );

    let tools = tokio::time::timeout(DEADLINE, client.list_all_tools())
        .await
        .unwrap()
        .expect("tools/list answers");
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

    let ran = outcome(
        &call(&client, "run_script", json!({"script": SCRIPT}))
            .await
            .unwrap(),
    );
    assert_eq!(ran["ok"], true, "{ran:#}");
    assert_eq!(ran["status"], "completed");
    assert_eq!(ran["value"], value_in_process(SCRIPT).await);
    assert_eq!(ran["logs"], json!(["hi"]));
    assert!(
        ran["run_id"].as_str().is_some_and(|id| !id.is_empty()),
        "{ran:#}"
    );
    assert!(ran.get("stats").is_none(), "compact unless asked: {ran:#}");

    for (tool, args, names) in bad_calls() {
        let result = call(&client, tool, args.clone())
            .await
            .unwrap_or_else(|e| panic!("{tool} {args}: a result, not {e:?}"));
        assert_eq!(result.is_error, Some(true), "{tool} {args}: {result:?}");
        let text = text(&result);
        assert!(
            text.contains(names) && text.contains(&format!("`{tool}` takes")),
            "{tool} {args}: the text names the field and what the tool takes: {text}"
        );
    }
    // A tool that does not exist is a protocol error, as the specification says.
    match call(&client, "no_such_tool", json!({})).await {
        Err(ServiceError::McpError(e)) => assert_eq!(e.code.0, -32602, "{e:?}"),
        other => panic!("expected invalid params, got {other:?}"),
    }
    client.cancel().await.expect("the session closes");

    let stderr = served.stderr();
    assert!(
        stderr.contains("DEBUG"),
        "-v shows the server's debug logs:\n{stderr}"
    );
    assert!(
        !stderr.contains('\x1b'),
        "no terminal escapes in logs that go to a pipe:\n{stderr}"
    );
}

/// Runs `SLOW` on `client` and checks the progress notifications it heard; closes the session.
async fn slow_run_reports_its_progress(client: RunningService<RoleClient, Recorder>) {
    let result = call(
        &client,
        "run_script",
        json!({"script": SLOW, "sequential": true}),
    )
    .await
    .unwrap();
    assert_eq!(outcome(&result)["value"], 6);
    let progress = client.service().progress.lock().unwrap().clone();
    assert_progress(
        &progress
            .iter()
            .map(|p| (p.progress, p.message.clone().unwrap_or_default()))
            .collect::<Vec<_>>(),
        6.0,
        outcome(&result)["run_id"].as_str().unwrap(),
    );
    client.cancel().await.expect("the session closes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_client_gets_progress_notifications_while_a_script_runs() {
    let served = Served::start("127.0.0.1:0", &crate::support::test_store(), &[]);
    let client = rust_client(&served.url).await;
    slow_run_reports_its_progress(client).await;
}

/// One raw HTTP/1.1 POST of `body` to the server; the response's head (lowercase) and body.
fn post(served: &Served, body: &str) -> (String, String) {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(served.addr()).expect("the server accepts");
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nConnection: close\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    (head.to_lowercase(), body.to_string())
}

/// Stateless, the server hands out no session; `--stateful` does, and rmcp's client uses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateless_answers_carry_no_session_and_stateful_ones_do() {
    let initialize = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;
    let stateless = Served::start("127.0.0.1:0", &crate::support::test_store(), &[]);
    let (head, body) = post(&stateless, initialize);
    assert!(head.starts_with("http/1.1 200"), "{head}\n{body}");
    assert!(body.contains("\"toolscript\""), "{body}");
    assert!(!head.contains("mcp-session-id"), "{head}");
    // A call with no initialize before it: every request stands alone.
    let call = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_script","arguments":{"script":"40 + 2"}}}"#;
    let (head, body) = post(&stateless, call);
    assert!(head.starts_with("http/1.1 200"), "{head}\n{body}");
    assert!(body.contains("\"value\":42"), "{body}");

    let stateful = Served::start(
        "127.0.0.1:0",
        &crate::support::test_store(),
        &["--stateful"],
    );
    let (head, body) = post(&stateful, initialize);
    assert!(head.contains("mcp-session-id:"), "{head}\n{body}");
    let client = rust_client(&stateful.url).await;
    let ran = outcome(&call_script(&client, "40 + 2").await);
    assert_eq!(ran["value"], 42, "{ran:#}");
    client.cancel().await.expect("the session closes");
}

async fn call_script(
    client: &RunningService<RoleClient, Recorder>,
    script: &str,
) -> CallToolResult {
    call(client, "run_script", json!({"script": script}))
        .await
        .expect("run_script answers")
}

/// Progress is the handler's, not the transport's: the same notifications come over stdio.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_notifications_come_over_stdio_too() {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolscript"));
    cmd.arg("serve")
        .env_remove("RUST_LOG")
        .env("TOOLSCRIPT_STORE", crate::support::test_store());
    let (transport, _stderr) = rmcp::transport::TokioChildProcess::builder(cmd)
        .stderr(Stdio::null())
        .spawn()
        .expect("toolscript serve starts");
    let client = tokio::time::timeout(DEADLINE, Recorder::default().serve(transport))
        .await
        .unwrap()
        .expect("the session initialises");
    slow_run_reports_its_progress(client).await;
}

/// SIGTERM (as a service manager sends) and SIGINT (Ctrl-C) end the server cleanly: status 0,
/// soon.
#[test]
fn sigterm_and_sigint_stop_the_server_cleanly() {
    for signal in ["-TERM", "-INT"] {
        let mut served = Served::start("127.0.0.1:0", &crate::support::test_store(), &[]);
        let status = Command::new("kill")
            .args([signal, &served.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
        let started = Instant::now();
        let status = loop {
            if let Some(status) = served.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the server did not stop within 10 s of {signal}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            status.success(),
            "{signal}: {status:?}\n{}",
            served.stderr()
        );
    }
}

/// At least two notifications, their progress increasing, from 0 (the first is sent as the run
/// starts) up to `done` (the calls the run made; the last is sent before the result), each
/// saying `run RUN_ID: N calls done, M in flight`.
#[track_caller]
fn assert_progress(progress: &[(f64, String)], done: f64, run_id: &str) {
    assert!(
        progress.len() >= 2,
        "a 1.5 s run reports more than once: {progress:?}"
    );
    assert!(
        progress.windows(2).all(|w| w[0].0 < w[1].0),
        "progress increases with every notification: {progress:?}"
    );
    assert_eq!(
        progress.last().map(|p| p.0),
        Some(done),
        "the last one says every call is done: {progress:?}"
    );
    assert_eq!(
        progress.first().map(|p| p.0),
        Some(0.0),
        "the first is sent as the run starts: {progress:?}"
    );
    for (value, message) in progress {
        assert!(
            message.starts_with(&format!("run {run_id}: {value} calls done, "))
                && message.ends_with(" in flight"),
            "{message:?} for {value}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_runs_over_one_server_all_answer_right() {
    let served = Served::start("127.0.0.1:0", &crate::support::test_store(), &[]);
    let client = rust_client(&served.url).await;
    let script = |k: usize| {
        format!(
            "let c = get_customer(#{{id: {}}}); #{{k: {k}, id: c.id}}",
            k % 20 + 1
        )
    };
    let started = Instant::now();
    let calls = (0..50).map(|k| {
        let peer = client.peer().clone();
        let request = CallToolRequestParams::new("run_script")
            .with_arguments(arguments(json!({"script": script(k)})));
        async move { (k, peer.call_tool(request).await) }
    });
    let results = tokio::time::timeout(DEADLINE, futures::future::join_all(calls))
        .await
        .expect("50 runs answer in time");
    let mut run_ids = std::collections::BTreeSet::new();
    for (k, result) in results {
        let ran = outcome(&result.unwrap_or_else(|e| panic!("run {k}: {e:?}")));
        assert_eq!(ran["value"], json!({"k": k, "id": k % 20 + 1}), "run {k}");
        run_ids.insert(ran["run_id"].as_str().unwrap().to_string());
    }
    assert_eq!(run_ids.len(), 50, "every run has an id of its own");
    eprintln!("50 concurrent runs (Rust client): {:?}", started.elapsed());

    // The same over the Python client's one session.
    let Some(python) = python() else { return };
    let calls: Vec<Value> = (0..50).map(|k| json!({"script": script(k)})).collect();
    let lines = python_plan(
        &python,
        &served.url,
        &json!([{"op": "concurrent", "tool": "run_script", "calls": calls}]),
        None,
    );
    let results = step(&lines, 0)["result"].clone();
    let results = results.as_array().expect("one result per call");
    assert_eq!(results.len(), 50);
    for (k, result) in results.iter().enumerate() {
        assert_eq!(result["is_error"], false, "run {k}: {result}");
        assert_eq!(
            result["structured"]["value"],
            json!({"k": k, "id": k % 20 + 1}),
            "run {k}"
        );
    }
    client.cancel().await.expect("the session closes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_run_is_resumed_by_a_restarted_server_on_the_same_store() {
    let dir = TempDir::new().unwrap();
    let manifest = write(&dir, "m.toml", crate::support::APPROVAL_MANIFEST);
    let store = dir.path().join("store.sqlite3");
    let tools = ["--tools", manifest.to_str().unwrap()];
    let mut first = Served::start("127.0.0.1:0", &store, &tools);
    let python = python();

    // One run paused by each client.
    let client = rust_client(&first.url).await;
    let script = "let c = charge(#{amount: 5}); c.charged + 1";
    let paused = outcome(
        &call(&client, "run_script", json!({"script": script}))
            .await
            .unwrap(),
    );
    assert_eq!(paused["status"], "paused", "{paused:#}");
    assert_eq!(paused["pending"]["awaiting"], "approval");
    let rust_run = paused["run_id"].as_str().unwrap().to_string();
    let python_run = python.as_ref().map(|python| {
        let lines = python_plan(
            python,
            &first.url,
            &json!([{"op": "call", "tool": "run_script",
                     "args": {"script": "charge(#{amount: 7}).charged * 2"}}]),
            None,
        );
        let paused = step(&lines, 0)["result"]["structured"].clone();
        assert_eq!(paused["status"], "paused", "{paused:#}");
        paused["run_id"].as_str().unwrap().to_string()
    });
    drop(client);
    first.kill();

    // Another instance on the same store, on another port, resumes both.
    let second = Served::start("127.0.0.1:0", &store, &tools);
    assert_ne!(second.url, first.url);
    let client = rust_client(&second.url).await;
    let listed = call(&client, "list_runs", json!({})).await.unwrap();
    let runs = listed.structured_content.clone().expect("the runs")["runs"].clone();
    assert!(
        runs.as_array()
            .unwrap()
            .iter()
            .any(|r| r["run_id"] == json!(rust_run) && r["status"] == "paused"),
        "{runs:#}"
    );
    let resumed = outcome(
        &call(
            &client,
            "resume_run",
            json!({"run_id": rust_run, "decision": "approve"}),
        )
        .await
        .unwrap(),
    );
    assert_eq!(resumed["status"], "completed", "{resumed:#}");
    assert_eq!(resumed["value"], 6);
    assert_eq!(resumed["effects"][0]["tool"], "charge");
    if let (Some(python), Some(run)) = (python, python_run) {
        let lines = python_plan(
            &python,
            &second.url,
            &json!([{"op": "call", "tool": "resume_run",
                     "args": {"run_id": run, "decision": "approve"}}]),
            None,
        );
        let resumed = step(&lines, 0)["result"]["structured"].clone();
        assert_eq!(resumed["status"], "completed", "{resumed:#}");
        assert_eq!(resumed["value"], 14);
    }
    client.cancel().await.expect("the session closes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_when_the_server_dies_fails_and_the_restarted_server_serves_the_next() {
    let dir = TempDir::new().unwrap();
    let store = dir.path().join("store.sqlite3");
    let mut first = Served::start("127.0.0.1:0", &store, &[]);
    let addr = first.addr();
    let client = rust_client(&first.url).await;

    // A long run; its first progress notification says it has started on the server.
    let peer = client.peer().clone();
    let in_flight = tokio::spawn(async move {
        let request = CallToolRequestParams::new("run_script")
            .with_arguments(arguments(json!({"script": "sleep(30); 1"})));
        peer.call_tool(request).await
    });
    let started = Instant::now();
    while client.service().progress.lock().unwrap().is_empty() {
        assert!(
            started.elapsed() < DEADLINE,
            "the run never reported progress"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill();
    let failed = tokio::time::timeout(Duration::from_secs(20), in_flight)
        .await
        .expect("the call in flight fails soon after the server dies, never hangs")
        .unwrap();
    assert!(
        failed.is_err(),
        "the call cannot have succeeded: {failed:?}"
    );

    // A new server on the same port: the same client, stateless, goes on.
    let second = Served::start(&addr, &store, &[]);
    let ran = outcome(
        &call(&client, "run_script", json!({"script": "40 + 2"}))
            .await
            .unwrap(),
    );
    assert_eq!(ran["value"], 42, "{ran:#}");
    drop(client);
    drop(second);

    // The Python client: its call in flight fails when the server dies, and after a restart on
    // the same port its session goes on.
    let Some(python) = python() else { return };
    let mut third = Served::start(&addr, &store, &[]);
    let plan = json!([
        {"op": "call", "tool": "run_script", "args": {"script": "sleep(30); 1"}, "progress": true},
        {"op": "wait"},
        {"op": "call", "tool": "run_script", "args": {"script": "40 + 2"}}
    ]);
    let mut fourth = None;
    let url = third.url.clone();
    let lines = python_plan(
        &python,
        &url,
        &plan,
        Some(&mut |line: &Value, stdin: &mut ChildStdin| {
            if line["event"] == "progress" && line["step"] == 0 {
                third.kill();
            }
            if line["step"] == 0 && line.get("error").is_some() {
                fourth = Some(Served::start(&addr, &store, &[]));
                writeln!(stdin).unwrap();
            }
        }),
    );
    let failed = step(&lines, 0);
    assert!(
        failed.get("error").is_some(),
        "the call in flight fails: {failed}"
    );
    let next = step(&lines, 2);
    assert_eq!(next["result"]["structured"]["value"], 42, "{next}");
    drop(fourth);
}

// ---------------------------------------------------------------------------------------------
// The Python client.
// ---------------------------------------------------------------------------------------------

/// The venv's interpreter: `$TOOLSCRIPT_PYTHON`, else `.venv/bin/python` in the repository. A
/// missing one fails the test (it is a set-up step left out), saying how to make it.
fn python() -> Option<PathBuf> {
    let path = std::env::var_os("TOOLSCRIPT_PYTHON").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"),
        PathBuf::from,
    );
    assert!(
        path.exists(),
        "{} is missing: the HTTP tests need the Python MCP client; run `bash .ci/setup` \
         (it makes .venv and installs tests/http/requirements.txt), or set TOOLSCRIPT_PYTHON \
         to a Python with `mcp==2.3.0`",
        path.display()
    );
    Some(path)
}

/// What a test does with each line the Python client prints, given the client's stdin.
type OnLine<'a> = dyn FnMut(&Value, &mut ChildStdin) + 'a;

/// Runs `tests/http/client.py URL PLAN` and returns the JSON lines it printed; `on_line` sees
/// each as it arrives, with the script's stdin (for a `wait` step). Fails the test if the
/// script fails or does not finish by [`DEADLINE`].
fn python_plan(
    python: &Path,
    url: &str,
    plan: &Value,
    mut on_line: Option<&mut OnLine<'_>>,
) -> Vec<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/http/client.py");
    let mut child = Command::new(python)
        .arg(&script)
        .arg(url)
        .arg(plan.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the Python client starts");
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let (line_tx, line_rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line_tx.send(line).is_err() {
                break;
            }
        }
    });
    let started = Instant::now();
    let mut lines = Vec::new();
    loop {
        let left = DEADLINE.saturating_sub(started.elapsed());
        match line_rx.recv_timeout(left) {
            Ok(line) => {
                let value: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("the Python client printed {line:?}: {e}"));
                if let Some(on_line) = on_line.as_mut() {
                    on_line(&value, &mut stdin);
                }
                lines.push(value);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                panic!("the Python client did not finish in {DEADLINE:?}: {lines:#?}");
            }
        }
    }
    let status = child.wait().expect("the Python client ends");
    let errors = errors.join().unwrap_or_default();
    assert!(
        status.success(),
        "the Python client failed ({status}):\n{errors}\n{lines:#?}"
    );
    lines
}

/// The line that answers step `index` (not a progress event).
#[track_caller]
fn step(lines: &[Value], index: i64) -> Value {
    lines
        .iter()
        .find(|l| l["step"] == json!(index) && l.get("event").is_none())
        .cloned()
        .unwrap_or_else(|| panic!("no answer to step {index}: {lines:#?}"))
}

#[test]
fn python_client_lists_tools_runs_a_script_gets_progress_and_bad_arguments_as_results() {
    let Some(python) = python() else { return };
    let served = Served::start("127.0.0.1:0", &crate::support::test_store(), &[]);
    let mut plan = vec![
        json!({"op": "list_tools"}),
        json!({"op": "call", "tool": "run_script", "args": {"script": SCRIPT}}),
        json!({"op": "call", "tool": "run_script",
               "args": {"script": SLOW, "sequential": true}, "progress": true}),
        json!({"op": "call", "tool": "no_such_tool", "args": {}}),
    ];
    for (tool, args, _) in bad_calls() {
        plan.push(json!({"op": "call", "tool": tool, "args": args}));
    }
    let lines = python_plan(&python, &served.url, &Value::Array(plan), None);
    assert_eq!(step(&lines, -1)["result"]["server"], "toolscript");

    let tools = step(&lines, 0)["result"]["tools"].clone();
    let names: Vec<&str> = tools
        .as_array()
        .expect("a tool list")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
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

    let ran = step(&lines, 1)["result"].clone();
    assert_eq!(ran["is_error"], false, "{ran:#}");
    let expected = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(value_in_process(SCRIPT));
    assert_eq!(ran["structured"]["value"], expected, "{ran:#}");
    assert_eq!(ran["structured"]["ok"], true);
    assert!(ran["structured"]["run_id"].is_string(), "{ran:#}");

    let slow = step(&lines, 2)["result"].clone();
    assert_eq!(slow["structured"]["value"], 6, "{slow:#}");
    let progress: Vec<(f64, String)> = lines
        .iter()
        .filter(|l| l["step"] == 2 && l["event"] == "progress")
        .map(|l| {
            (
                l["progress"].as_f64().unwrap(),
                l["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_progress(
        &progress,
        6.0,
        slow["structured"]["run_id"].as_str().unwrap(),
    );

    let unknown = step(&lines, 3);
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");

    for (i, (tool, args, names)) in bad_calls().into_iter().enumerate() {
        let result = step(&lines, 4 + i as i64)["result"].clone();
        assert_eq!(result["is_error"], true, "{tool} {args}: {result}");
        let text = result["text"][0].as_str().unwrap_or_default();
        assert!(
            text.contains(names) && text.contains(&format!("`{tool}` takes")),
            "{tool} {args}: {text}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// A client that goes away.
// ---------------------------------------------------------------------------------------------

/// `toolscript runs --json` on `store`, from another process while the server holds it.
fn listed_runs(store: &Path) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_toolscript"))
        .args(["runs", "--json", "--store"])
        .arg(store)
        .output()
        .expect("toolscript runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    match serde_json::from_slice(&out.stdout).expect("runs --json is JSON") {
        Value::Array(runs) => runs,
        other => other["runs"].as_array().cloned().unwrap_or_default(),
    }
}

/// A client that sends a durable run and hangs up while a write's body runs: the server does
/// not leave the run `running` under its own name for ever. The run is recorded as
/// `interrupted` (or, if the server finished it, `completed`), and another process resumes it
/// from the journal while the server still lives, each write made once.
#[test]
fn a_run_whose_client_hangs_up_is_resumable_by_another_process() {
    let dir = TempDir::new().unwrap();
    let manifest = write(
        &dir,
        "m.toml",
        "[[tool]]\nname = \"put\"\neffect = \"write\"\nlatency_ms = 1500\n\
         input = { type = \"object\", properties = { n = { type = \"integer\" } }, required = [\"n\"] }\n\
         script = '#{ n: args.n }'\n",
    );
    let store = dir.path().join("store.sqlite3");
    let served = Served::start(
        "127.0.0.1:0",
        &store,
        &["--tools", manifest.to_str().unwrap()],
    );
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "run_script",
        "arguments": {"script": "let a = put(#{n: 1}); let b = put(#{n: 2}); a.n + b.n"}}})
    .to_string();
    let mut stream = std::net::TcpStream::connect(served.addr()).expect("the server accepts");
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{call}",
        call.len()
    )
    .unwrap();
    // The run is in the store, running: the client hangs up during its first write.
    let started = Instant::now();
    let run = loop {
        if let Some(run) = listed_runs(&store).into_iter().next() {
            break run;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the run never reached the store"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(run["status"], "running", "{run:#}");
    let id = run["run_id"].as_str().unwrap().to_string();
    stream.shutdown(std::net::Shutdown::Both).unwrap();
    drop(stream);

    // Not a timed assertion: the status is awaited for up to a minute.
    let status = loop {
        let run = listed_runs(&store).into_iter().next().unwrap();
        if run["status"] != "running" {
            break run["status"].as_str().unwrap().to_string();
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the run stays running after its client left: {run:#}\n{}",
            served.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let resume = |decision: &[&str]| -> (bool, Value, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_toolscript"))
            .args(["resume", &id, "--json", "--store"])
            .arg(&store)
            .args(["--tools", manifest.to_str().unwrap()])
            .args(decision)
            .output()
            .expect("toolscript resume");
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out.status.success(), json, stderr)
    };
    let (ok, mut resumed, stderr) = resume(&[]);
    if status == "completed" {
        // The server finished the run: nothing is left to resume, and the resume says so.
        assert!(!ok, "{resumed:#}\n{stderr}");
        return;
    }
    assert_eq!(status, "interrupted");
    if resumed["status"] == "paused" {
        // The first write's body may have been reached: a person says what became of it.
        assert_eq!(resumed["pending"]["awaiting"], "resolve", "{resumed:#}");
        assert_eq!(resumed["pending"]["tool"], "put", "{resumed:#}");
        (_, resumed, _) = resume(&["--resolve", "retry"]);
    } else {
        assert!(ok, "{resumed:#}\n{stderr}");
    }
    assert_eq!(resumed["status"], "completed", "{resumed:#}\n{stderr}");
    assert_eq!(resumed["value"], 3, "{resumed:#}");
    let made: Vec<Value> = resumed["effects"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ok"] == true)
        .map(|e| e["args"]["n"].clone())
        .collect();
    assert_eq!(made, [json!(1), json!(2)], "each write once: {resumed:#}");
}
