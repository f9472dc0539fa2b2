//! The MCP client against real servers (server-everything, server-filesystem, installed by
//! `npm ci --prefix tests/mcp`) and a scripted Node server written at test time: listing, names,
//! effects from annotations and manifests, calls and result mapping, structured content, error
//! results, servers that fail to start or stop mid-run, cancellation, lifetime, speculation.
//!
//! Without Node.js these tests print why they skip; with Node.js but without the servers they
//! fail, since CI installs them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use toolscript::bench::observable;
use toolscript::{Effect, Error, Manifests, Mode, Registry, Runtime, ToolSpec};

use crate::support::{error_of, node_available, run_in, value_of};

/// The installed servers' folder, or `None` (and a message) without Node.js. Fails the test
/// when Node.js is there but the servers are not.
fn servers() -> Option<PathBuf> {
    if !node_available() {
        return None;
    }
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/node_modules/@modelcontextprotocol");
    for server in ["server-everything", "server-filesystem"] {
        assert!(
            dir.join(server).join("dist/index.js").is_file(),
            "the MCP test servers are not installed: run `npm ci --prefix tests/mcp`"
        );
    }
    Some(dir)
}

/// A TOML string holding `text`.
fn quoted(text: impl AsRef<str>) -> String {
    serde_json::to_string(text.as_ref()).unwrap()
}

/// An `[[mcp]]` table for server-everything, with `extra` lines.
fn everything(dir: &Path, extra: &str) -> String {
    format!(
        "[[mcp]]\nname = \"everything\"\ncommand = [\"node\", {}]\n{extra}\n",
        quoted(
            dir.join("server-everything/dist/index.js")
                .to_string_lossy()
        )
    )
}

/// Loads `text` as a manifest in the crate's folder and starts its servers.
async fn build(text: &str) -> Result<Registry, Error> {
    let mut manifests = Manifests::new();
    manifests.load_str(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp_client_test.toml"),
        text,
    )?;
    manifests.build().await
}

fn spec<'r>(registry: &'r Registry, name: &str) -> &'r ToolSpec {
    registry
        .specs()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no tool `{name}` in {registry:?}"))
}

fn mcp_error(result: Result<Registry, Error>) -> (String, String) {
    match result {
        Err(Error::Mcp {
            server, message, ..
        }) => (server, message),
        other => panic!("expected an MCP error, got {other:?}"),
    }
}

/// A scripted MCP server: newline-delimited JSON-RPC on stdio, tools listed five to a page.
/// `MODE=crash` writes to stderr and exits at once; `MODE=garbage` prints a line that is not
/// JSON-RPC and exits; `MODE=cursor_loop` answers every `tools/list` with the same cursor. On end of input it writes `closed` to the file `MARKER`, if set.
const SCRIPTED_SERVER: &str = r#"
const fs = require('fs');
const readline = require('readline');
if (process.env.MODE === 'crash') {
  console.error('scripted server: cannot open the database');
  process.exit(3);
}
if (process.env.MODE === 'garbage') {
  process.stdout.write('hello, I am not an MCP server\n');
  process.exit(0);
}
console.error('scripted server: ready');
const object = { type: 'object' };
const tools = [
  { name: 'plain', description: 'No annotations.', inputSchema: object },
  { name: 'reader', inputSchema: object, annotations: { readOnlyHint: true } },
  { name: 'idem', inputSchema: object, annotations: { idempotentHint: true, openWorldHint: true } },
  { name: 'world', inputSchema: object, annotations: { openWorldHint: true } },
  { name: 'print', inputSchema: object, annotations: { readOnlyHint: true } },
  { name: 'ts_secret', inputSchema: object, annotations: { readOnlyHint: true } },
  { name: 'get-user', inputSchema: object, annotations: { readOnlyHint: true } },
  { name: 'get_user', inputSchema: object, annotations: { readOnlyHint: true } },
  { name: 'get user', inputSchema: object, annotations: { readOnlyHint: true } },
  { name: 'wipe', inputSchema: object, annotations: { readOnlyHint: true, destructiveHint: true } },
  { name: '2fa code', inputSchema: object, annotations: { readOnlyHint: true } },
  { name: 'text', inputSchema: object, annotations: { readOnlyHint: true } },
  { name: 'many', inputSchema: object, annotations: { readOnlyHint: true } },
  { name: 'fail', inputSchema: object, annotations: { readOnlyHint: true } },
  { name: 'vanish', inputSchema: object, annotations: { readOnlyHint: true } },
  { name: 'slow', inputSchema: object, annotations: { readOnlyHint: true } },
  { name: 'cancelled', inputSchema: object, annotations: { readOnlyHint: true } },
  { name: 'exit', inputSchema: object },
  { name: 'secret', inputSchema: object, annotations: { readOnlyHint: true } },
  { name: 'garble', inputSchema: object, annotations: { readOnlyHint: true } },
  { name: 'garble_write', inputSchema: object },
];
const cancelled = [];
const send = (message) => process.stdout.write(JSON.stringify({ jsonrpc: '2.0', ...message }) + '\n');
const text = (t) => ({ content: [{ type: 'text', text: t }] });
readline.createInterface({ input: process.stdin })
  .on('line', (line) => {
    let message;
    try { message = JSON.parse(line); } catch { return; }
    const { id, method, params } = message;
    if (method === 'notifications/cancelled') { cancelled.push(params.requestId); return; }
    if (id === undefined) return;
    if (method === 'initialize') {
      return send({ id, result: { protocolVersion: '2025-06-18', capabilities: { tools: {} },
        serverInfo: { name: 'scripted', version: '1.0.0' } } });
    }
    if (method === 'tools/list' && process.env.MODE === 'cursor_loop') {
      return send({ id, result: { tools: tools.slice(0, 1), nextCursor: 'again' } });
    }
    if (method === 'tools/list') {
      const start = params && params.cursor ? Number(params.cursor) : 0;
      const result = { tools: tools.slice(start, start + 5) };
      if (start + 5 < tools.length) result.nextCursor = String(start + 5);
      return send({ id, result });
    }
    if (method === 'tools/call') {
      const args = params.arguments || {};
      switch (params.name) {
        case 'text': return send({ id, result: text(args.text) });
        case 'many': return send({ id, result: { content: [{ type: 'text', text: 'a' }, { type: 'text', text: 'b' }] } });
        case 'fail': return send({ id, result: { ...text('the widget is jammed'), isError: true } });
        case 'vanish': return send({ id, error: { code: -32602, message: 'Unknown tool: vanish' } });
        case 'slow': return;
        case 'cancelled': return send({ id, result: text(JSON.stringify(cancelled)) });
        case 'exit': process.exit(0);
        case 'secret': return send({ id, result: text('SECRET-VALUE-4711') });
        case 'garble': case 'garble_write': return process.stdout.write('oops, not a frame\n');
        default: return send({ id, result: text(JSON.stringify({ tool: params.name, args })) });
      }
    }
    send({ id, error: { code: -32601, message: 'Method not found' } });
  })
  .on('close', () => {
    if (process.env.MARKER) fs.writeFileSync(process.env.MARKER, 'closed');
    process.exit(0);
  });
"#;

/// Writes the scripted server into `dir` and returns an `[[mcp]]` table for it, named
/// `scripted`, with `extra` lines.
fn scripted(dir: &Path, extra: &str) -> String {
    let path = dir.join("scripted_server.js");
    std::fs::write(&path, SCRIPTED_SERVER).unwrap();
    format!(
        "[[mcp]]\nname = \"scripted\"\ncommand = [\"node\", {}]\n{extra}\n",
        quoted(path.to_string_lossy())
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_tools_are_listed_with_prefix_and_origin() {
    let Some(dir) = servers() else { return };
    let registry = build(&everything(&dir, "prefix = \"ev_\"")).await.unwrap();
    assert!(registry.len() >= 10, "{registry:?}");
    assert!(
        registry.specs().all(|s| s.name.starts_with("ev_")),
        "{registry:?}"
    );
    let echo = spec(&registry, "ev_echo");
    assert_eq!(echo.origin.as_deref(), Some("mcp:everything/echo"));
    assert!(
        echo.description.to_lowercase().contains("echo"),
        "the server's description is kept: {}",
        echo.description
    );
    assert_eq!(echo.input_schema["properties"]["message"]["type"], "string");
    assert_eq!(echo.timeout, toolscript::DEFAULT_TIMEOUT);
    let sum = spec(&registry, "ev_get-sum");
    assert_eq!(sum.origin.as_deref(), Some("mcp:everything/get-sum"));
    let structured = spec(&registry, "ev_get-structured-content");
    assert!(
        structured.output_schema.is_some(),
        "it declares an output schema"
    );
    assert!(echo.output_schema.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotations_give_effects_and_manifests_override_them() {
    let Some(dir) = servers() else { return };
    let trusted = build(&everything(&dir, "")).await.unwrap();
    for (tool, effect) in [
        ("echo", Effect::Read),
        ("get-sum", Effect::Read),
        ("trigger-long-running-operation", Effect::Read),
        // Not read-only, idempotent and open-world: idempotent comes first.
        ("gzip-file-as-resource", Effect::Idempotent),
        // Every hint false.
        ("toggle-simulated-logging", Effect::Write),
    ] {
        assert_eq!(spec(&trusted, tool).effect, effect, "{tool}");
    }

    let overridden = build(&everything(
        &dir,
        "effects = { echo = \"write\", \"toggle-simulated-logging\" = \"idempotent\" }",
    ))
    .await
    .unwrap();
    assert_eq!(spec(&overridden, "echo").effect, Effect::Write);
    assert_eq!(
        spec(&overridden, "toggle-simulated-logging").effect,
        Effect::Idempotent
    );
    assert_eq!(spec(&overridden, "get-sum").effect, Effect::Read);

    let untrusted = build(&everything(
        &dir,
        "trust_annotations = false\neffects = { \"get-sum\" = \"read\" }",
    ))
    .await
    .unwrap();
    assert_eq!(spec(&untrusted, "echo").effect, Effect::Write);
    assert_eq!(spec(&untrusted, "get-sum").effect, Effect::Read);
    assert!(untrusted
        .specs()
        .filter(|s| s.name != "get-sum")
        .all(|s| s.effect == Effect::Write));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn effects_naming_a_missing_tool_are_refused() {
    let Some(dir) = servers() else { return };
    let (server, message) =
        mcp_error(build(&everything(&dir, "effects = { ehco = \"read\" }")).await);
    assert_eq!(server, "everything");
    assert!(message.contains("`ehco`"), "{message}");
    assert!(
        message.contains("echo"),
        "the server's tools are listed: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_run_through_a_script() {
    let Some(dir) = servers() else { return };
    let runtime = Runtime::new(build(&everything(&dir, "")).await.unwrap());
    let outcome = runtime
        .run(
            r#"
            let e = echo(#{ message: "hello" });
            let s = get_sum(#{ a: 2, b: 3 });
            let w = get_structured_content(#{ location: "Chicago" });
            #{ echo: e, sum: s, has_temperature: type_of(w.temperature) != "()" }
            "#,
        )
        .await;
    assert_eq!(
        value_of(&outcome),
        &json!({"echo": "Echo: hello", "sum": "The sum of 2 and 3 is 5.", "has_temperature": true})
    );
    assert_eq!(outcome.stats.tool_calls, 3);
    // The schema is checked on the way in, before the server sees the call.
    let outcome = runtime.run(r#"get_sum(#{ a: "two", b: 3 })"#).await;
    assert_eq!(error_of(&outcome).kind_name(), "invalid_input");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_tools_return_structured_content() {
    let Some(dir) = servers() else { return };
    let root = tempfile::tempdir().unwrap();
    let root_path = root.path().canonicalize().unwrap();
    std::fs::write(root_path.join("a.txt"), "alpha\n").unwrap();
    std::fs::create_dir(root_path.join("sub")).unwrap();
    let manifest = format!(
        "[[mcp]]\nname = \"files\"\nprefix = \"fs_\"\ncommand = [\"node\", {}, {}]\n",
        quoted(
            dir.join("server-filesystem/dist/index.js")
                .to_string_lossy()
        ),
        quoted(root_path.to_string_lossy())
    );
    let registry = build(&manifest).await.unwrap();
    for (tool, effect) in [
        ("fs_read_text_file", Effect::Read),
        ("fs_list_directory", Effect::Read),
        ("fs_write_file", Effect::Idempotent),
        ("fs_edit_file", Effect::Write),
    ] {
        let s = spec(&registry, tool);
        assert_eq!(s.effect, effect, "{tool}");
        assert!(s.output_schema.is_some(), "{tool} has an output schema");
    }
    let runtime = Runtime::new(registry);
    let root_text = root_path.to_string_lossy();
    let script = format!(
        r#"
        let root = {root};
        let listing = fs_list_directory(#{{ path: root }}).content;
        let a = fs_read_text_file(#{{ path: `${{root}}/a.txt` }}).content;
        fs_write_file(#{{ path: `${{root}}/b.txt`, content: "beta" }});
        let b = fs_read_text_file(#{{ path: `${{root}}/b.txt` }}).content;
        #{{ listing: listing, a: a, b: b }}
        "#,
        root = quoted(&root_text)
    );
    let outcome = runtime.run(&script).await;
    let value = value_of(&outcome);
    let listing = value["listing"].as_str().unwrap();
    assert!(
        listing.contains("[FILE] a.txt") && listing.contains("[DIR] sub"),
        "{listing}"
    );
    assert_eq!(value["a"], "alpha\n");
    assert_eq!(value["b"], "beta");
    assert_eq!(
        std::fs::read_to_string(root_path.join("b.txt")).unwrap(),
        "beta"
    );
    assert_eq!(outcome.effects.len(), 1, "{:?}", outcome.effects);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_results_become_tool_errors() {
    let Some(dir) = servers() else { return };
    let root = tempfile::tempdir().unwrap();
    let manifest = format!(
        "[[mcp]]\nname = \"files\"\ncommand = [\"node\", {}, {}]\n",
        quoted(
            dir.join("server-filesystem/dist/index.js")
                .to_string_lossy()
        ),
        quoted(root.path().to_string_lossy())
    );
    let runtime = Runtime::new(build(&manifest).await.unwrap());
    let outside = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let outcome = runtime
        .run(&format!(
            "let r = \"read\";\ntry {{ read_text_file(#{{ path: {} }}); }} catch (e) {{ r = e; }}\nr",
            quoted(outside.to_string_lossy())
        ))
        .await;
    let error = value_of(&outcome);
    assert_eq!(error["kind"], "failed", "{error}");
    assert_eq!(error["tool"], "read_text_file");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("outside allowed directories"), "{message}");
    // Uncaught, it ends the run with the same kind.
    let outcome = runtime
        .run(&format!(
            "read_text_file(#{{ path: {} }})",
            quoted(outside.to_string_lossy())
        ))
        .await;
    assert_eq!(error_of(&outcome).kind_name(), "failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_server_maps_names_results_and_errors() {
    if !node_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let registry = build(&scripted(dir.path(), "")).await.unwrap();
    // Twenty-one tools over five pages.
    assert_eq!(registry.len(), 21, "{registry:?}");
    // A tool keeps its own name; one whose name (or alias) another holds gets a suffix.
    for (name, original) in [
        ("print_", "print"),
        ("mcp_ts_secret", "ts_secret"),
        ("mcp_2fa_code", "2fa code"),
        ("get_user", "get_user"),
        ("get-user_2", "get-user"),
        ("get_user_3", "get user"),
    ] {
        assert_eq!(
            spec(&registry, name).origin.as_deref(),
            Some(format!("mcp:scripted/{original}").as_str())
        );
    }
    for (tool, effect) in [
        ("plain", Effect::Write),
        ("reader", Effect::Read),
        ("idem", Effect::Idempotent),
        ("world", Effect::External),
        ("exit", Effect::Write),
        // Read-only and destructive contradict each other: the more dangerous one counts.
        ("wipe", Effect::Write),
    ] {
        assert_eq!(spec(&registry, tool).effect, effect, "{tool}");
    }
    assert_eq!(spec(&registry, "plain").description, "No annotations.");

    let runtime = Runtime::new(registry);
    let outcome = runtime
        .run(
            r#"
            let kinds = [];
            for t in ["fail", "vanish"] {
                try { tool(t, #{}); } catch (e) { kinds.push([e.kind, e.message]); }
            }
            #{
                json: text(#{ text: "{\"n\": 1}" }),
                words: text(#{ text: "just words" }),
                many: many(),
                renamed: print_(#{ x: 1 }),
                alias: get_user_2(),
                kinds: kinds,
            }
            "#,
        )
        .await;
    let value = value_of(&outcome);
    assert_eq!(value["json"], json!({"n": 1}), "JSON text is parsed");
    assert_eq!(value["words"], "just words");
    assert_eq!(
        value["many"],
        json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
    );
    assert_eq!(
        value["renamed"],
        json!({"tool": "print", "args": {"x": 1}}),
        "calls use the server's own name"
    );
    assert_eq!(value["alias"]["tool"], "get-user");
    assert_eq!(value["kinds"][0], json!(["failed", "the widget is jammed"]));
    assert_eq!(value["kinds"][1][0], "not_found");
    let message = value["kinds"][1][1].as_str().unwrap();
    assert!(
        message.contains("scripted") && message.contains("Unknown tool"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_times_out_is_cancelled_on_the_server() {
    if !node_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let registry = build(&scripted(dir.path(), "timeout_ms = 300"))
        .await
        .unwrap();
    let runtime = Runtime::new(registry);
    let outcome = run_in(&runtime, "slow()", Mode::Sequential).await;
    assert_eq!(error_of(&outcome).kind_name(), "timeout");
    // rmcp sends `notifications/cancelled` from a task of its own, so a later call may overtake
    // it on the way to the server: ask until the server has seen it.
    for _ in 0..100 {
        let outcome = run_in(&runtime, "cancelled()", Mode::Sequential).await;
        let cancelled = value_of(&outcome).as_array().unwrap().len();
        if cancelled > 0 {
            assert_eq!(cancelled, 1, "one request was cancelled");
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the server was never told that the call was cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_exits_mid_run_is_unavailable() {
    if !node_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(build(&scripted(dir.path(), "")).await.unwrap());
    let outcome = run_in(
        &runtime,
        r#"
            let first = reader();
            let kinds = [];
            try { exit(); } catch (e) { kinds.push(e); }
            try { reader(#{ again: true }); } catch (e) { kinds.push(e); }
            #{ first: first.tool, errors: kinds }
        "#,
        Mode::Sequential,
    )
    .await;
    let value = value_of(&outcome);
    assert_eq!(value["first"], "reader");
    let errors = value["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 2, "{value}");
    for e in errors {
        assert_eq!(e["kind"], "unavailable", "{e}");
        let message = e["message"].as_str().unwrap();
        assert!(message.contains("MCP server `scripted`"), "{message}");
        assert_eq!(e["recoverable"], false);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_stops_when_its_last_tool_is_dropped() {
    if !node_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("closed");
    let manifest = scripted(
        dir.path(),
        &format!("env = {{ MARKER = {} }}", quoted(marker.to_string_lossy())),
    );
    let registry = build(&manifest).await.unwrap();
    let runtime = Runtime::new(registry.clone());
    assert_eq!(
        value_of(&runtime.run("reader().tool").await),
        &json!("reader")
    );
    drop(runtime);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!marker.exists(), "the registry still holds the tools");
    drop(registry);
    // The server sees its input end, writes the marker and exits.
    for _ in 0..200 {
        if marker.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the server was not shut down after its last tool was dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_command_is_an_error_naming_the_server() {
    let built = build(
        "[[mcp]]\nname = \"ghost\"\ncommand = [\"toolscript-no-such-program\", \"--stdio\"]\n",
    )
    .await;
    // The operating system's error is kept as the source, and the report writes both.
    let Err(error) = &built else {
        panic!("expected an MCP error, got {built:?}");
    };
    let cause = std::error::Error::source(error)
        .and_then(|e| e.downcast_ref::<std::io::Error>())
        .map(std::io::Error::kind);
    assert_eq!(cause, Some(std::io::ErrorKind::NotFound), "{error:?}");
    assert!(
        error.report().starts_with(&format!("{error}: ")),
        "{}",
        error.report()
    );
    let (server, message) = mcp_error(built);
    assert_eq!(server, "ghost");
    assert!(
        message.contains("cannot start `toolscript-no-such-program`"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_failures_say_what_the_server_did() {
    if !node_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (server, message) =
        mcp_error(build(&scripted(dir.path(), "env = { MODE = \"crash\" }")).await);
    assert_eq!(server, "scripted");
    assert!(
        message.contains("before answering `initialize`"),
        "{message}"
    );
    assert!(
        message.contains("cannot open the database"),
        "its stderr is quoted: {message}"
    );
    let (_, message) =
        mcp_error(build(&scripted(dir.path(), "env = { MODE = \"garbage\" }")).await);
    assert!(
        message.contains("before answering `initialize`"),
        "{message}"
    );
    // A server whose pages go round is an error at once, not a listing without end; and the
    // error is about the listing, not `initialize`.
    let (_, message) =
        mcp_error(build(&scripted(dir.path(), "env = { MODE = \"cursor_loop\" }")).await);
    assert!(message.contains("came twice"), "{message}");
    assert!(!message.contains("initialize"), "{message}");
}

/// A server that never answers: start-up gives up at its timeout (time is paused, so the test
/// does not wait for it).
#[tokio::test(start_paused = true)]
async fn start_up_is_bounded_by_a_timeout() {
    let (server, message) = mcp_error(
        build("[[mcp]]\nname = \"mute\"\ncommand = [\"sleep\", \"600\"]\ntimeout_ms = 45000\n")
            .await,
    );
    assert_eq!(server, "mute");
    assert!(message.contains("within 45 s"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculation_over_mcp_tools_matches_sequential() {
    let Some(dir) = servers() else { return };
    let runtime = Runtime::new(build(&everything(&dir, "")).await.unwrap());
    // `duration` differs so that no two calls are the same call.
    let script = r#"
        let out = [];
        for i in 1..=20 {
            out.push(trigger_long_running_operation(#{ duration: 0.2 + i / 1000.0, steps: 1 }));
        }
        out
    "#;
    let sequential = run_in(&runtime, script, Mode::Sequential).await;
    let speculative = run_in(&runtime, script, Mode::Speculative).await;
    assert_eq!(value_of(&sequential).as_array().map(Vec::len), Some(20));
    assert_eq!(observable(&sequential), observable(&speculative));
    assert!(
        speculative.stats.speculative_launched > 0,
        "{:?}",
        speculative.stats
    );
    assert_eq!(speculative.stats.tool_calls, 20);
    let first: &Value = &value_of(&speculative)[0];
    assert!(
        first.as_str().is_some_and(|t| t.contains("0.201")),
        "{first}"
    );
}

/// The MCP SDK traces whole messages at its lowest levels; `RUST_LOG=trace` must still not put
/// a tool's result on stderr.
#[cfg(feature = "cli")]
#[test]
fn trace_logging_never_prints_tool_results() {
    if !node_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("m.toml");
    std::fs::write(&manifest, scripted(dir.path(), "")).unwrap();
    let script = dir.path().join("s.rhai");
    std::fs::write(&script, "let s = secret(); s.len()").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_toolscript"))
        .args(["run", "--tools"])
        .arg(&manifest)
        .arg(&script)
        .env("RUST_LOG", "trace")
        .env("TOOLSCRIPT_STORE", crate::support::test_store())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "17");
    assert!(
        stderr.contains("TRACE") || stderr.contains("DEBUG"),
        "tracing is on: {stderr}"
    );
    assert!(
        !stderr.contains("SECRET-VALUE"),
        "a result reached the log:\n{stderr}"
    );
}

/// A server that answers a call with a line that is not JSON-RPC: the call fails at once with
/// what the server wrote (not at its timeout, not as a "retry later" timeout), as `internal`
/// for a read and `ambiguous_outcome` for a write; the connection serves the next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protocol_fault_fails_the_waiting_call_at_once() {
    if !node_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(
        build(&scripted(dir.path(), "timeout_ms = 60000"))
            .await
            .unwrap(),
    );
    let outcome = runtime
        .run(
            r#"
            let kinds = [];
            for t in ["garble", "garble_write"] {
                try { tool(t, #{}); } catch (e) { kinds.push([e.kind, e.message]); }
            }
            kinds.push(text(#{ text: "still here" }));
            kinds
            "#,
        )
        .await;
    let value = value_of(&outcome);
    assert_eq!(value[0][0], "internal", "{value}");
    assert!(
        value[0][1].as_str().unwrap().contains("oops, not a frame"),
        "{value}"
    );
    assert_eq!(value[1][0], "ambiguous_outcome", "{value}");
    assert_eq!(value[2], "still here");
    assert_eq!(
        outcome.effects[0].ok, None,
        "the write's outcome is unknown"
    );
}

/// server-filesystem behind `[[mcp]] paths` and a `[guard]`: the guard reads the names in the
/// server's arguments, so `.env` (named directly, by a relative name, in another case, or
/// through a link inside the root) is denied before the server sees the call, and the rest
/// reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_denies_server_filesystem_the_forbidden_names() {
    let Some(dir) = servers() else { return };
    let root = tempfile::tempdir().unwrap();
    let root_path = root.path().canonicalize().unwrap();
    std::fs::write(root_path.join("a.txt"), "alpha\n").unwrap();
    std::fs::write(root_path.join(".env"), "TOKEN=secret\n").unwrap();
    std::os::unix::fs::symlink(".env", root_path.join("notes.txt")).unwrap();
    let manifest = format!(
        "[guard]\nroot = \".\"\n\n[[mcp]]\nname = \"files\"\ncommand = [\"node\", {}, {}]\npaths = {{ move_file = [\"source\", \"destination\"], \"*\" = [\"path\", \"paths\"] }}\n",
        quoted(
            dir.join("server-filesystem/dist/index.js")
                .to_string_lossy()
        ),
        quoted(root_path.to_string_lossy())
    );
    let mut manifests = Manifests::new();
    manifests
        .load_str(&root_path.join("tools.toml"), &manifest)
        .unwrap();
    let runtime = Runtime::new(manifests.build().await.unwrap());
    let root_text = root_path.to_string_lossy().to_string();
    for name in [
        format!("{root_text}/.env"),
        ".env".to_string(),
        format!("{root_text}/.ENV"),
        format!("{root_text}/notes.txt"),
        "/etc/passwd".to_string(),
    ] {
        let script = format!("read_text_file(#{{ path: {} }})", quoted(&name));
        let outcome = runtime.run(&script).await;
        let error = error_of(&outcome);
        assert_eq!(error.kind_name(), "permission_denied", "{name}: {error:?}");
    }
    let script = format!(
        "read_multiple_files(#{{ paths: [{}, {}] }})",
        quoted(format!("{root_text}/a.txt")),
        quoted(format!("{root_text}/.env"))
    );
    let outcome = runtime.run(&script).await;
    assert_eq!(error_of(&outcome).kind_name(), "permission_denied");
    let script = format!(
        "read_text_file(#{{ path: {} }}).content",
        quoted(format!("{root_text}/a.txt"))
    );
    let outcome = runtime.run(&script).await;
    assert_eq!(value_of(&outcome), &serde_json::json!("alpha\n"));
}

/// A plan over server-filesystem: `plan_results` and `plan_stop` in `[[mcp]]` say what its
/// tools answer in a plan; planning writes no file, the write's planned result carries the
/// marker of what it will return, and applying writes exactly the planned file. A
/// `plan_results` entry naming a tool the server does not have is refused when it starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_over_an_mcp_server_writes_nothing_until_applied() {
    let Some(dir) = servers() else { return };
    let root = tempfile::tempdir().unwrap();
    let root_path = root.path().canonicalize().unwrap();
    std::fs::write(root_path.join("a.txt"), "alpha\n").unwrap();
    let server = quoted(
        dir.join("server-filesystem/dist/index.js")
            .to_string_lossy(),
    );
    let manifest = format!(
        "[[mcp]]\nname = \"files\"\nprefix = \"fs_\"\ncommand = [\"node\", {server}, {}]\n\
         plan_results = {{ write_file = '#{{ written: \"planned\", path: args.path }}' }}\n\
         plan_stop = [\"move_file\"]\n",
        quoted(root_path.to_string_lossy())
    );
    let registry = build(&manifest).await.unwrap();
    let store = toolscript::SqliteStore::open(&root_path.join("store.sqlite3")).unwrap();
    let runtime = Runtime::builder(registry)
        .store(std::sync::Arc::new(store))
        .build();
    let root_text = root_path.to_string_lossy();
    let script = format!(
        r#"
        let root = {root};
        let a = fs_read_text_file(#{{ path: `${{root}}/a.txt` }}).content;
        let w = fs_write_file(#{{ path: `${{root}}/b.txt`, content: a + "beta" }});
        w
        "#,
        root = quoted(&root_text)
    );
    let planned = runtime
        .plan(&script, toolscript::RunOptions::default())
        .await
        .unwrap();
    let plan = planned.plan;
    assert!(!root_path.join("b.txt").exists(), "the plan wrote the file");
    assert_eq!(plan.calls.len(), 1);
    assert_eq!(plan.calls[0].tool, "fs_write_file");
    assert_eq!(
        plan.calls[0].args["content"],
        serde_json::json!("alpha\nbeta")
    );
    assert_eq!(
        plan.value.as_ref().unwrap()["written"],
        serde_json::json!("<from planned #0 .written>")
    );
    let applied = runtime
        .apply(&plan.plan_id, toolscript::RunOptions::default())
        .await
        .unwrap();
    assert!(applied.result.is_ok(), "{:?}", applied.result);
    assert_eq!(
        std::fs::read_to_string(root_path.join("b.txt")).unwrap(),
        "alpha\nbeta"
    );
    let wrong = format!(
        "[[mcp]]\nname = \"files\"\ncommand = [\"node\", {server}, {}]\nplan_results = {{ no_such_tool = '()' }}\n",
        quoted(root_path.to_string_lossy())
    );
    let e = build(&wrong).await.unwrap_err().to_string();
    assert!(
        e.contains("plan_results") && e.contains("no_such_tool"),
        "{e}"
    );
}
