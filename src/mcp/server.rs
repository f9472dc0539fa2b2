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
    let running = server
        .serve(rmcp::transport::stdio_pipes())
        .await
        .map_err(|e| mcp_error(format!("the session did not start: {e}")))?;
    let reason = running
        .waiting()
        .await
        .map_err(|e| mcp_error(format!("the session ended abnormally: {e}")))?;
    tracing::debug!(?reason, "the MCP session ended");
    Ok(())
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
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let result = match request.name.as_ref() {
            RUN_SCRIPT => self.run_script(request.arguments).await?,
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
