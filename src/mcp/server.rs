//! The MCP server: `toolscript serve` offers `run_script` and `describe_tools` over stdio.
//!
//! The tool list is built once, when the server starts, from the runtime's registry:
//! `run_script`'s description carries the whole Rhai API of the tools, so a model that reads the
//! tool list can write a script without another round trip. A script that fails is an ordinary
//! result (`ok: false`, `isError: true`), never a protocol error; only a malformed request is.
//!
//! stdout is the protocol channel: nothing here prints, scripts' `print` lines are captured in the
//! run's `logs`, and tracing goes to stderr.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::Error;
use crate::runtime::{Mode, RunOptions, Runtime};
use crate::tool::{Effect, Format};

/// The tool that runs a script.
const RUN_SCRIPT: &str = "run_script";
/// The tool that returns the tools' API.
const DESCRIBE_TOOLS: &str = "describe_tools";

/// How to write a script; `run_script`'s description puts the tools' API after it.
const HOW_TO: &str = "\
Run one Rhai script that orchestrates the tools below, and get the whole outcome back as one \
JSON object: {ok, value | error, logs, effects, stats}.

Write the whole task as one script rather than calling tools one by one:
- each tool is a Rhai function taking one object map: `let c = get_customer(#{ id: 3 });`
- the script's last expression is its value (return a map or an array to give back several things);
- `print(...)` lines go to `logs`;
- a failed tool call throws a map #{kind, message, tool, recoverable, suggested_next_action} that \
`try { ... } catch (e) { ... }` can catch; an uncaught one ends the run with ok=false and `error`.
Reads the script will need are started early and in parallel; writes run once, in program order. \
Set `sequential: true` to dispatch every call in program order instead.

The tools a script can call:

";

/// The server's instructions to the client.
const INSTRUCTIONS: &str = "\
toolscript runs orchestration scripts: one Rhai script makes many tool calls and returns one \
result. Call `run_script` with the whole task as a script; its description lists the tools the \
script can call (`describe_tools` returns the same API). A failed script is a normal result with \
ok=false and an `error` saying what went wrong and where.";

/// Serves `runtime` over stdio until the client disconnects.
///
/// # Errors
///
/// [`Error::Mcp`] when the transport fails or the client never initialises the session.
pub async fn serve_stdio(runtime: Runtime) -> Result<(), Error> {
    let server = Server::new(Arc::new(runtime));
    // `stdio_pipes` reads stdin through the IO reactor when it is a pipe (as MCP clients start
    // servers), so a pending read does not hold the process at exit the way `tokio::io::stdin`
    // does.
    let (stdin, stdout) = rmcp::transport::stdio_pipes();
    let (transport, filter) = guarded(stdin, stdout);
    let running = server
        .serve(transport)
        .await
        .map_err(|e| mcp_error(format!("the session did not start: {e}")))?;
    let reason = running
        .waiting()
        .await
        .map_err(|e| mcp_error(format!("the session ended abnormally: {e}")))?;
    tracing::debug!(?reason, "the MCP session ended");
    let _ = filter.await;
    Ok(())
}

/// The largest JSON-RPC message accepted, in bytes: a longer line is answered with an error
/// and dropped, never buffered whole.
const MAX_MESSAGE: usize = 16 << 20;

/// Stands between the client and the protocol: every line the client sends is checked to be a
/// JSON-RPC message before it reaches rmcp, and what is not gets the error JSON-RPC asks for
/// (`-32700` for text that is not JSON, `-32600` for JSON that is not a request, `-32602` for
/// `params` that are neither an object nor an array) instead of silence. rmcp's frames and
/// these errors reach stdout one whole line at a time.
fn guarded<R, W>(
    input: R,
    output: W,
) -> (
    (tokio::io::DuplexStream, tokio::io::DuplexStream),
    tokio::task::JoinHandle<()>,
)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let (to_rmcp, rmcp_in) = tokio::io::duplex(1 << 16);
    let (rmcp_out, from_rmcp) = tokio::io::duplex(1 << 16);
    let (errors_tx, mut errors_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let reader = tokio::spawn(async move {
        let mut to_rmcp = to_rmcp;
        let mut lines = BufReader::new(input);
        let mut line = Vec::new();
        loop {
            line.clear();
            let read = (&mut lines)
                .take(MAX_MESSAGE as u64 + 1)
                .read_until(b'\n', &mut line)
                .await;
            match read {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if line.len() > MAX_MESSAGE && !line.ends_with(b"\n") {
                let _ = errors_tx.send(rpc_error(
                    &Value::Null,
                    -32600,
                    &format!("a message may be at most {MAX_MESSAGE} bytes"),
                ));
                // Skip the rest of the line.
                let mut rest = Vec::new();
                if lines.read_until(b'\n', &mut rest).await.is_err() {
                    break;
                }
                continue;
            }
            match check_message(&line) {
                Ok(true) => {
                    if to_rmcp.write_all(&line).await.is_err() {
                        break;
                    }
                }
                Ok(false) => {}
                Err(error) => {
                    let _ = errors_tx.send(error);
                }
            }
        }
        // The client closed its end: so does rmcp's input, which ends the session.
        let _ = to_rmcp.shutdown().await;
    });
    let writer = tokio::spawn(async move {
        let mut output = output;
        let mut frames = BufReader::new(from_rmcp).lines();
        let mut errors_open = true;
        loop {
            let line = tokio::select! {
                frame = frames.next_line() => match frame {
                    Ok(Some(frame)) => frame,
                    _ => break,
                },
                error = errors_rx.recv(), if errors_open => match error {
                    Some(error) => error,
                    None => { errors_open = false; continue; }
                },
            };
            let written = output.write_all(line.as_bytes()).await;
            if written.is_err() || output.write_all(b"\n").await.is_err() {
                break;
            }
            let _ = output.flush().await;
        }
        reader.abort();
    });
    ((rmcp_in, rmcp_out), writer)
}

/// Whether a line is a JSON-RPC message to pass on (`Ok(true)`), one to drop silently (a blank
/// line), or the error response it gets.
fn check_message(line: &[u8]) -> Result<bool, String> {
    let text = String::from_utf8_lossy(line);
    if text.trim().is_empty() {
        return Ok(false);
    }
    let message: Value = serde_json::from_str(&text)
        .map_err(|e| rpc_error(&Value::Null, -32700, &format!("parse error: {e}")))?;
    let Some(object) = message.as_object() else {
        return Err(rpc_error(
            &Value::Null,
            -32600,
            "a message must be one JSON-RPC object (batches are not supported)",
        ));
    };
    let id = object.get("id").cloned().unwrap_or(Value::Null);
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(rpc_error(&id, -32600, "`jsonrpc` must be \"2.0\""));
    }
    let is_request = object.contains_key("method");
    let is_response = object.contains_key("result") || object.contains_key("error");
    if !is_request && !is_response {
        return Err(rpc_error(
            &id,
            -32600,
            "a message needs a `method` (a request) or a `result` or `error` (a response)",
        ));
    }
    if let Some(params) = object.get("params") {
        if !params.is_object() && !params.is_array() {
            if object.contains_key("id") {
                return Err(rpc_error(
                    &id,
                    -32602,
                    "`params` must be an object or an array",
                ));
            }
            // A notification gets no response, even an error.
            return Ok(false);
        }
    }
    Ok(true)
}

fn rpc_error(id: &Value, code: i64, message: &str) -> String {
    serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        .to_string()
}

fn mcp_error(message: String) -> Error {
    Error::Mcp {
        server: "toolscript".to_string(),
        message,
    }
}

/// The handler: one runtime shared by every call, and the tool list built from it.
struct Server {
    /// Runs may be concurrent: `run_with` takes `&self`, and the handler is shared by the
    /// tasks rmcp starts for each request.
    runtime: Arc<Runtime>,
    /// The tools' API as Rhai signatures, returned by `describe_tools`.
    api: String,
    /// `run_script` and `describe_tools`, with their schemas.
    tools: Vec<Tool>,
}

/// The arguments of `run_script`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunScriptArgs {
    script: String,
    #[serde(default)]
    sequential: bool,
}

impl Server {
    fn new(runtime: Arc<Runtime>) -> Server {
        let api = runtime.describe(Format::Rhai);
        let effects: Vec<Effect> = runtime.registry().specs().map(|s| s.effect).collect();
        let tools = vec![run_script_tool(&api, &effects), describe_tools_tool()];
        Server {
            runtime,
            api,
            tools,
        }
    }

    async fn run_script(&self, arguments: Option<JsonObject>) -> Result<CallToolResult, ErrorData> {
        let args: RunScriptArgs =
            serde_json::from_value(Value::Object(arguments.unwrap_or_default())).map_err(|e| {
                ErrorData::invalid_params(format!("bad arguments for `{RUN_SCRIPT}`: {e}"), None)
            })?;
        let mode = Mode::sequential_if(args.sequential);
        let outcome = self
            .runtime
            .run_with(&args.script, RunOptions::with_mode(mode))
            .await;
        tracing::debug!(run_id = %outcome.run_id, ok = outcome.result.is_ok(), "run_script ran");
        let json = outcome.to_json();
        // Both constructors also put the JSON as text, for clients without structured content.
        Ok(if outcome.result.is_ok() {
            CallToolResult::structured(json)
        } else {
            CallToolResult::structured_error(json)
        })
    }

    fn describe_tools(&self, arguments: Option<JsonObject>) -> Result<CallToolResult, ErrorData> {
        if let Some(unknown) = arguments.as_ref().and_then(|a| a.keys().next()) {
            return Err(ErrorData::invalid_params(
                format!("`{DESCRIBE_TOOLS}` takes no arguments, not `{unknown}`"),
                None,
            ));
        }
        Ok(CallToolResult::success(vec![ContentBlock::text(
            self.api.clone(),
        )]))
    }
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("toolscript", env!("CARGO_PKG_VERSION"))
                    .with_title("toolscript")
                    .with_description("Runs orchestration scripts: many tool calls, one script."),
            )
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let result = match request.name.as_ref() {
            // A client that cancels its request (`notifications/cancelled`) ends its run: the
            // run's future is dropped, which stops its script and its speculation.
            RUN_SCRIPT => tokio::select! {
                result = self.run_script(request.arguments) => result?,
                () = context.ct.cancelled() => {
                    return Err(ErrorData::internal_error("the request was cancelled", None));
                }
            },
            DESCRIBE_TOOLS => self.describe_tools(request.arguments)?,
            other => {
                // The MCP specification answers an unknown tool with invalid params.
                let message = format!(
                    "unknown tool `{other}`: this server offers `{RUN_SCRIPT}` and \
                     `{DESCRIBE_TOOLS}`"
                );
                return Err(ErrorData::invalid_params(message, None));
            }
        };
        Ok(result.into())
    }
}

/// `run_script`: its description is the how-to followed by the API; its annotations follow
/// from the effects of the tools a script may call.
fn run_script_tool(api: &str, effects: &[Effect]) -> Tool {
    let read_only = effects.iter().all(|e| *e == Effect::Read);
    let annotations = ToolAnnotations::with_title("Run a toolscript script")
        .read_only(read_only)
        .destructive(!read_only)
        // Running a script twice repeats its writes.
        .idempotent(
            effects
                .iter()
                .all(|e| matches!(e, Effect::Read | Effect::Idempotent)),
        )
        .open_world(effects.contains(&Effect::External));
    Tool::new(
        RUN_SCRIPT,
        format!("{HOW_TO}{api}"),
        object(json!({
            "type": "object",
            "properties": {
                "script": {
                    "type": "string",
                    "description": "The Rhai script: the whole task, its last expression the value."
                },
                "sequential": {
                    "type": "boolean",
                    "default": false,
                    "description": "Dispatch every call in program order; no read starts early."
                }
            },
            "required": ["script"],
            "additionalProperties": false
        })),
    )
    .with_annotations(annotations)
    .with_raw_output_schema(Arc::new(object(outcome_schema())))
}

/// `describe_tools`: no arguments, the API as text.
fn describe_tools_tool() -> Tool {
    Tool::new(
        DESCRIBE_TOOLS,
        "The API of the tools a `run_script` script can call, as Rhai function signatures with \
         doc comments (the same text as in `run_script`'s description).",
        object(json!({"type": "object", "properties": {}, "additionalProperties": false})),
    )
    .with_annotations(
        ToolAnnotations::with_title("Describe the tools")
            .read_only(true)
            .destructive(false)
            .idempotent(true)
            .open_world(false),
    )
}

/// The schema of [`crate::RunOutcome::to_json`], the object `toolscript run --json` prints.
fn outcome_schema() -> Value {
    let count = json!({"type": "integer", "minimum": 0});
    json!({
        "type": "object",
        "properties": {
            "ok": {"type": "boolean", "description": "Whether the script finished with a value."},
            "value": {"description": "The script's value, any JSON; present when ok is true."},
            "error": {
                "type": "object",
                "description": "What ended the script; present when ok is false.",
                "properties": {
                    "kind": {"type": "string", "description": "not_found, invalid_script, ..."},
                    "message": {"type": "string"},
                    "tool": {"type": "string", "description": "The tool whose call failed."},
                    "line": {"type": "integer", "minimum": 1},
                    "column": {"type": "integer", "minimum": 1},
                    "recoverable": {
                        "type": "boolean",
                        "description": "Whether the same call may succeed later unchanged."
                    },
                    "suggested_next_action": {"type": "string"}
                },
                "required": ["kind", "message", "recoverable"]
            },
            "logs": {
                "type": "array",
                "items": {"type": "string"},
                "description": "The script's print lines, in order."
            },
            "effects": {
                "type": "array",
                "description": "Calls of non-read tools that reached their tool, in order.",
                "items": {
                    "type": "object",
                    "properties": {
                        "tool": {"type": "string"},
                        "effect": {"enum": ["write", "idempotent", "external"]},
                        "args": {"description": "The validated arguments."},
                        "ok": {
                            "type": ["boolean", "null"],
                            "description": "null when the outcome is unknown (ambiguous_outcome): it may have taken effect."
                        }
                    },
                    "required": ["tool", "effect", "args", "ok"]
                }
            },
            "receipts": {
                "type": "object",
                "description": "The run's receipt chain: its last hash and its length.",
                "properties": {
                    "head": {"type": ["string", "null"]},
                    "count": {"type": "integer"}
                },
                "required": ["head", "count"]
            },
            "stats": {
                "type": "object",
                "properties": {
                    "mode": {"enum": ["sequential", "speculative"]},
                    "wall_ms": {"type": "number", "minimum": 0},
                    "tool_calls": count,
                    "dispatched": count,
                    "speculative_launched": count,
                    "speculative_claimed": count,
                    "speculative_wasted": count,
                    "deduplicated": count,
                    "effectful_calls": count,
                    "scout_passes": count
                },
                "required": [
                    "mode", "wall_ms", "tool_calls", "dispatched", "speculative_launched",
                    "speculative_claimed", "speculative_wasted", "deduplicated",
                    "effectful_calls", "scout_passes"
                ]
            }
        },
        "required": ["ok", "logs", "effects", "receipts", "stats"],
        "oneOf": [
            {"properties": {"ok": {"const": true}}, "required": ["value"]},
            {"properties": {"ok": {"const": false}}, "required": ["error"]}
        ]
    })
}

/// The object inside a `json!` object literal.
fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => JsonObject::new(),
    }
}
