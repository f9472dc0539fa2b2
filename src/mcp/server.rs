//! The MCP server: `toolscript serve` offers `run_script`, `describe_tools`, `resume_run`,
//! `list_runs`, `read_artifact`, `plan_script` and `apply_plan` over stdio, and (`http.rs`) over Streamable HTTP, with one
//! handler.
//!
//! The tool list is built once, when the server starts, from the runtime's registry:
//! `run_script`'s description carries the whole Rhai API of the tools, so a model that reads the
//! tool list can write a script without another round trip. A script that fails is an ordinary
//! result (`ok: false`, `isError: true`), and so are wrong arguments to one of the tools (the
//! text names the field and what it takes, so that a model can correct its call); only a
//! malformed request, or a tool that does not exist, is a protocol error. A request that
//! carries a `progressToken` gets `notifications/progress` while its run goes on.
//!
//! On stdio, stdout is the protocol channel: nothing here prints, scripts' `print` lines are
//! captured in the run's `logs`, and tracing goes to stderr.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ProgressToken,
    ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, Peer, RoleServer, ServerHandler, ServiceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::formats::{
    ApplyPlanArgs, ArtifactRead, DecisionArg, ListRunsArgs, NoArgs, PlanScriptArgs, ResumeRunArgs,
    RunList, RunScriptArgs,
};
use crate::dispatch::Progress;
use crate::error::Error;
use crate::policy::ArtifactArgs;
use crate::report::{Mode, RunListing, RunReport};
use crate::runtime::{Decision, RunOptions, Runtime};
use crate::schema;
use crate::store::{RunPage, RunQuery};
use crate::tool::{Effect, Format};

/// The tool that runs a script.
const RUN_SCRIPT: &str = "run_script";
/// The tool that returns the tools' API.
const DESCRIBE_TOOLS: &str = "describe_tools";
/// The tool that resumes a paused run.
const RESUME_RUN: &str = "resume_run";
/// The tool that lists the store's runs.
const LIST_RUNS: &str = "list_runs";
/// The tool that reads an artifact.
const READ_ARTIFACT: &str = "read_artifact";
/// The tool that plans a script.
const PLAN_SCRIPT: &str = "plan_script";
/// The tool that applies a plan.
const APPLY_PLAN: &str = "apply_plan";

/// The runs a page of `list_runs` holds unless its `limit` says.
const LIST_RUNS_PAGE: u32 = 50;

/// The most tokens a page of `list_runs` holds (with at least one run): a page is cut short
/// before a run that would pass it, and its `next_cursor` goes on from there.
const LIST_RUNS_MAX_TOKENS: usize = 8000;

/// The most tokens of one run in `list_runs`: a paused run whose pending call's arguments
/// are larger has them left out, with their size (`toolscript runs --json` gives them whole).
const LIST_RUN_MAX_TOKENS: usize = 1000;

/// How to write a script; `run_script`'s description puts the tools' API after it.
const HOW_TO: &str = "\
Run one Rhai script that orchestrates the tools below, and get the whole outcome back as one \
JSON object: {ok, value | error, logs, effects}. Write the whole task as one script rather than \
calling tools one by one, and return a map or an array to give back several things. An uncaught \
error ends the run with ok=false and `error` (kind, message, line, column, suggested_next_action). \
`input` (any JSON) is the script's `input`.

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
    // Building the tokenizer's vocabulary takes a moment: a server does it before its first
    // large answer needs it.
    std::thread::spawn(|| crate::policy::count(""));
    // `stdio_pipes` reads stdin through the IO reactor when it is a pipe (as MCP clients start
    // servers), so a pending read does not hold the process at exit the way `tokio::io::stdin`
    // does.
    let (stdin, stdout) = rmcp::transport::stdio_pipes();
    let (transport, filter) = guarded(stdin, stdout);
    let running = server
        .serve(transport)
        .await
        .map_err(|e| mcp_error("the session did not start", e))?;
    let reason = running
        .waiting()
        .await
        .map_err(|e| mcp_error("the session ended abnormally", e))?;
    tracing::debug!(?reason, "the MCP session ended");
    let _ = filter.await;
    Ok(())
}

/// The largest JSON-RPC message accepted, in bytes: a longer line is answered with an error
/// and dropped, never buffered whole.
pub(super) const MAX_MESSAGE: usize = 16 << 20;

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

fn mcp_error(message: &str, source: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::mcp("toolscript", message, crate::error::Cause::from(source))
}

/// How often a run with a progress token reports how far it got.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);

/// The handler: one runtime shared by every call, and the tool list built from it. Cloning it
/// is cheap: the HTTP transport makes one per request (stateless) or per session.
#[derive(Clone)]
pub(super) struct Server {
    /// Runs may be concurrent: `run_with` takes `&self`, and the handler is shared by the
    /// tasks rmcp starts for each request.
    pub(super) runtime: Arc<Runtime>,
    /// The tools' API as Rhai signatures, returned by `describe_tools`.
    api: Arc<str>,
    /// Our five tools, with their schemas.
    tools: Arc<[Tool]>,
    /// Each tool's input schema, compiled: arguments are checked against it before anything
    /// else, so that a wrong one is answered as a result that names the field.
    inputs: Arc<[jsonschema::Validator]>,
    /// Tokens and tenants (`serve --http --auth`; see `tenancy.rs`).
    #[cfg(feature = "http")]
    pub(super) tenancy: Option<Arc<super::tenancy::Tenancy>>,
    /// Who made the request this handler answers (a clone per request, with `--auth`).
    #[cfg(feature = "http")]
    pub(super) caller: Option<super::auth::Caller>,
}

/// A run's outcome as a tool result, without `stats` unless asked: a paused run is a normal result (its `pending` call says
/// what it waits for), a failed one an error result. Both constructors also put the JSON as
/// text, for clients without structured content.
fn outcome_result(outcome: &crate::RunOutcome, stats: bool) -> CallToolResult {
    let json = report_json(outcome, stats);
    if matches!(
        outcome.status(),
        crate::RunStatus::Failed | crate::RunStatus::Interrupted
    ) {
        CallToolResult::structured_error(json)
    } else {
        CallToolResult::structured(json)
    }
}

/// The run's outcome as `run_script` answers it: a limit the run reached is named as the key of
/// the server's `[limits]` (the client cannot pass flags), and `stats` are left out unless asked
/// for (the counts and timings are for people, not for the model).
pub(super) fn report_json(outcome: &crate::RunOutcome, stats: bool) -> Value {
    let mut report: RunReport = outcome.report_naming(|limit| {
        format!(
            "{}; the server's limit, `{}` in its [limits]",
            limit.key, limit.key
        )
    });
    if !stats {
        report.stats = None;
    }
    report.to_json()
}

/// `answer` as a tool's structured result.
fn structured<T: Serialize>(answer: &T) -> CallToolResult {
    match serde_json::to_value(answer) {
        Ok(json) => CallToolResult::structured(json),
        Err(e) => CallToolResult::error(vec![ContentBlock::text(format!(
            "the answer could not be written as JSON: {e}"
        ))]),
    }
}

impl Server {
    pub(super) fn new(runtime: Arc<Runtime>) -> Server {
        let api = runtime.describe(Format::Rhai);
        let effects: Vec<Effect> = runtime.registry().specs().map(|s| s.effect).collect();
        let tools = vec![
            run_script_tool(&api, &effects),
            describe_tools_tool(),
            resume_run_tool(),
            list_runs_tool(),
            read_artifact_tool(),
            plan_script_tool(),
            apply_plan_tool(),
        ];
        let inputs = tools
            .iter()
            .map(|tool| {
                jsonschema::validator_for(&Value::Object((*tool.input_schema).clone()))
                    .expect("our tools' input schemas compile")
            })
            .collect();
        Server {
            runtime,
            api: api.into(),
            tools: tools.into(),
            inputs,
            #[cfg(feature = "http")]
            tenancy: None,
            #[cfg(feature = "http")]
            caller: None,
        }
    }

    /// Requires a token of `auth` of every call, and keeps each tenant to its own runs.
    #[cfg(feature = "http")]
    pub(super) fn with_auth(mut self, auth: Arc<super::auth::Auth>) -> Server {
        let tenancy = super::tenancy::Tenancy::new(auth, &self.runtime);
        self.tenancy = Some(Arc::new(tenancy));
        self
    }

    /// This handler for the request `context` (with `--auth`: its caller, the caller's
    /// tenant's runtime), or the result that refuses the call `name`.
    #[cfg(feature = "http")]
    fn for_request(
        &self,
        context: &RequestContext<RoleServer>,
        name: &str,
        arguments: Option<&JsonObject>,
    ) -> Result<Option<Server>, CallToolResult> {
        use super::tenancy;
        let Some(tenancy) = &self.tenancy else {
            return Ok(None);
        };
        let Some(caller) = tenancy::caller(context) else {
            return Err(CallToolResult::error(vec![ContentBlock::text(
                "this server requires a bearer token, and the request carried none",
            )]));
        };
        let right = tenancy::right_for(name, arguments);
        if !caller.rights.allow(right) {
            return Err(tenancy::lacks(name, right));
        }
        let mut scoped = self.clone();
        scoped.runtime = tenancy.runtime_of(&caller)?;
        scoped.caller = Some(caller);
        Ok(Some(scoped))
    }

    /// The arguments of the tool `name`, checked against its input schema and then read into
    /// `T`; wrong ones are the error result a model reads to correct its call.
    fn arguments<T: DeserializeOwned>(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
    ) -> Result<T, CallToolResult> {
        let arguments = Value::Object(arguments.unwrap_or_default());
        let index = self.tools.iter().position(|t| t.name == name);
        if let Some(index) = index {
            let problems: Vec<String> = self.inputs[index]
                .iter_errors(&arguments)
                .map(|e| {
                    let at = e.instance_path().to_string();
                    if at.is_empty() {
                        e.to_string()
                    } else {
                        format!("`{}`: {e}", at.trim_start_matches('/').replace('/', "."))
                    }
                })
                .collect();
            if !problems.is_empty() {
                let schema = &self.tools[index].input_schema;
                return Err(bad_arguments(name, &problems.join("; "), schema));
            }
        }
        serde_json::from_value(arguments)
            .map_err(|e| bad_arguments(name, &e.to_string(), &self.schema(name)))
    }

    /// `result` with each text of an answer that has no structured content (an error's words,
    /// which may quote what the client sent) cut to the server's budget. An answer with
    /// structured content is bounded where it is made, and its text is its JSON.
    fn bounded_text(&self, mut result: CallToolResult) -> CallToolResult {
        if result.structured_content.is_some() {
            return result;
        }
        let budget = self.runtime.inline_budget();
        for block in &mut result.content {
            let Some(text) = block.as_text().map(|t| t.text.clone()) else {
                continue;
            };
            if !crate::policy::fits(&text, budget) {
                let note = format!(" ({} characters in all)", text.chars().count());
                *block = ContentBlock::text(crate::policy::cut(&text, budget, &note));
            }
        }
        result
    }

    /// The input schema of our tool `name`.
    fn schema(&self, name: &str) -> Arc<JsonObject> {
        self.tools
            .iter()
            .find(|t| t.name == name)
            .map(|t| Arc::clone(&t.input_schema))
            .unwrap_or_default()
    }

    async fn run_script(
        &self,
        arguments: Option<JsonObject>,
        progress: Arc<Progress>,
    ) -> CallToolResult {
        let args: RunScriptArgs = match self.arguments(RUN_SCRIPT, arguments) {
            Ok(args) => args,
            Err(bad) => return bad,
        };
        let options = script_options(RUN_SCRIPT, args.sequential, args.input, progress);
        let _slot = match self.slot() {
            Ok(slot) => slot,
            Err(refused) => return refused,
        };
        let outcome = self
            .runtime
            .run_with(&args.script, self.owned(options))
            .await;
        tracing::debug!(run_id = %outcome.run_id, ok = outcome.result.is_ok(), "run_script ran");
        outcome_result(&outcome, args.stats)
    }

    async fn read_artifact(&self, arguments: Option<JsonObject>) -> CallToolResult {
        let args: ArtifactArgs = match self.arguments(READ_ARTIFACT, arguments) {
            Ok(args) => args,
            Err(bad) => return bad,
        };
        let Some(store) = self.runtime.store().cloned() else {
            return CallToolResult::error(vec![ContentBlock::text(
                "this server keeps no store of runs, so it has no artifacts",
            )]);
        };
        if let Err(refused) = self.may_read(&args.id).await {
            return refused;
        }
        let artifact = match crate::policy::read_artifact(&*store, &args.id, args.page).await {
            Ok(artifact) => artifact,
            Err(e) => return CallToolResult::error(vec![ContentBlock::text(e.to_string())]),
        };
        // A page is cut for the budget of the run that made it: one made by another process
        // on the same store, with a larger budget, may not fit this server's answers.
        let answer = ArtifactRead { artifact };
        let tokens = crate::policy::count(&crate::json::key_json(&serde_json::json!(answer)));
        let budget = self.runtime.inline_budget();
        if tokens > budget {
            let page = args.page.unwrap_or(0);
            return CallToolResult::error(vec![ContentBlock::text(format!(
                "page {page} of artifact `{}` is {tokens} tokens, over this server's max_inline_tokens ({budget}): it was made by a run with a larger budget; read it with `toolscript artifact ID --page {page}`",
                crate::error::shown_run_id(&args.id)
            ))]);
        }
        structured(&answer)
    }

    async fn resume_run(
        &self,
        arguments: Option<JsonObject>,
        progress: Arc<Progress>,
    ) -> CallToolResult {
        let args: ResumeRunArgs = match self.arguments(RESUME_RUN, arguments) {
            Ok(args) => args,
            Err(bad) => return bad,
        };
        let decision = args.decision.map(|decision| match decision {
            DecisionArg::Approve => Decision::Approve,
            DecisionArg::ApproveRule => Decision::ApproveRule,
            DecisionArg::Reject => Decision::Reject {
                reason: args.reason,
            },
            DecisionArg::Done => Decision::Done,
            DecisionArg::Retry => Decision::Retry,
        });
        if let Err(refused) = self.may_resume(&args.run_id, decision.is_some()).await {
            return refused;
        }
        let _slot = match self.slot() {
            Ok(slot) => slot,
            Err(refused) => return refused,
        };
        // A run that has ended answers with its outcome: a client whose instance went away
        // before it answered (and whose run another finished) gets it here.
        if decision.is_none() {
            if let Some(answer) = self.ended_outcome(&args.run_id).await {
                return answer;
            }
        }
        let options = RunOptions::default().progress(progress);
        match self.runtime.resume(&args.run_id, decision, options).await {
            Ok(outcome) => outcome_result(&outcome, false),
            Err(e) => CallToolResult::error(vec![ContentBlock::text(e.report())]),
        }
    }

    /// The stored outcome of `run_id` when it has ended, as `run_script` answered it (without
    /// `stats`).
    async fn ended_outcome(&self, run_id: &str) -> Option<CallToolResult> {
        let record = self.runtime.store()?.run(run_id).await.ok()??;
        if !record.status.is_final() {
            return None;
        }
        let mut outcome = record.outcome?;
        if let Some(object) = outcome.as_object_mut() {
            object.remove("stats");
        }
        Some(if record.status == crate::RunStatus::Failed {
            CallToolResult::structured_error(outcome)
        } else {
            CallToolResult::structured(outcome)
        })
    }

    async fn list_runs(&self, arguments: Option<JsonObject>) -> CallToolResult {
        let args: ListRunsArgs = match self.arguments(LIST_RUNS, arguments) {
            Ok(args) => args,
            Err(bad) => return bad,
        };
        let Some(store) = self.runtime.store() else {
            return CallToolResult::error(vec![ContentBlock::text(
                "this server keeps no store of runs",
            )]);
        };
        let limit = args.limit.unwrap_or(LIST_RUNS_PAGE).clamp(1, 200) as usize;
        let query = RunQuery::first(limit)
            .statuses(args.status)
            .after(args.cursor)
            .tenant(self.tenant());
        match store.list_runs(query).await {
            Ok(page) => structured(&bounded(page)),
            Err(e) => CallToolResult::error(vec![ContentBlock::text(e.report())]),
        }
    }

    async fn plan_script(
        &self,
        arguments: Option<JsonObject>,
        progress: Arc<Progress>,
    ) -> CallToolResult {
        let args: PlanScriptArgs = match self.arguments(PLAN_SCRIPT, arguments) {
            Ok(args) => args,
            Err(bad) => return bad,
        };
        let options = script_options(PLAN_SCRIPT, args.sequential, args.input, progress);
        let _slot = match self.slot() {
            Ok(slot) => slot,
            Err(refused) => return refused,
        };
        match self.runtime.plan(&args.script, self.owned(options)).await {
            Ok(planned) => {
                let answer = plan_answer(&planned.plan, &planned.run.logs);
                CallToolResult::success(vec![ContentBlock::text(answer.to_string())])
            }
            Err(e) => CallToolResult::error(vec![ContentBlock::text(e.report())]),
        }
    }

    async fn apply_plan(
        &self,
        arguments: Option<JsonObject>,
        progress: Arc<Progress>,
    ) -> CallToolResult {
        let args: ApplyPlanArgs = match self.arguments(APPLY_PLAN, arguments) {
            Ok(args) => args,
            Err(bad) => return bad,
        };
        if let Err(refused) = self.may_apply(&args.plan_id).await {
            return refused;
        }
        let _slot = match self.slot() {
            Ok(slot) => slot,
            Err(refused) => return refused,
        };
        let options =
            RunOptions::with_mode(Mode::sequential_if(args.sequential)).progress(progress);
        match self.runtime.apply(&args.plan_id, self.owned(options)).await {
            Ok(outcome) => outcome_result(&outcome, false),
            Err(e) => CallToolResult::error(vec![ContentBlock::text(e.report())]),
        }
    }

    fn describe_tools(&self, arguments: Option<JsonObject>) -> CallToolResult {
        if let Err(bad) = self.arguments::<NoArgs>(DESCRIBE_TOOLS, arguments) {
            return bad;
        }
        CallToolResult::success(vec![ContentBlock::text(self.api.to_string())])
    }
}

/// Without the feature `http` there is no `--auth`: one tenant, every hook a no-op.
#[cfg(not(feature = "http"))]
impl Server {
    fn owned(&self, options: RunOptions) -> RunOptions {
        options
    }

    fn tenant(&self) -> Option<String> {
        None
    }

    fn slot(&self) -> Result<Option<()>, CallToolResult> {
        Ok(None)
    }

    async fn may_resume(&self, _run_id: &str, _decides: bool) -> Result<(), CallToolResult> {
        Ok(())
    }

    async fn may_apply(&self, _plan_id: &str) -> Result<(), CallToolResult> {
        Ok(())
    }

    async fn may_read(&self, _id: &str) -> Result<(), CallToolResult> {
        Ok(())
    }
}

/// The options of a script `run_script` or `plan_script` (the tool `name`) runs: its mode,
/// its input (none for `null`) and the request's progress.
fn script_options(
    name: &str,
    sequential: bool,
    input: Value,
    progress: Arc<Progress>,
) -> RunOptions {
    let options = RunOptions::with_mode(Mode::sequential_if(sequential))
        .script_name(name)
        .progress(progress);
    if input.is_null() {
        options
    } else {
        options.input(input)
    }
}

/// A page of runs as `list_runs` answers it: within [`LIST_RUNS_MAX_TOKENS`], each run within
/// [`LIST_RUN_MAX_TOKENS`] (a pending call's large arguments left out, with their size).
fn bounded(page: RunPage) -> RunList {
    let tokens_of = |listing: &RunListing| {
        crate::policy::count(&serde_json::to_string(listing).unwrap_or_default())
    };
    let mut runs = Vec::new();
    let mut total = 0;
    let mut next_cursor = page.next.clone();
    for (i, summary) in page.runs.iter().enumerate() {
        let mut listing = RunListing::of_summary(summary);
        let mut tokens = tokens_of(&listing);
        if tokens > LIST_RUN_MAX_TOKENS {
            if let Some(pending) = &mut listing.pending {
                let args = crate::policy::count(&pending.args.to_string());
                pending.args = Value::String(format!(
                    "(left out: {args} tokens; `toolscript runs --json` gives them)"
                ));
                tokens = tokens_of(&listing);
            }
        }
        if i > 0 && total + tokens > LIST_RUNS_MAX_TOKENS {
            next_cursor = Some(page.runs[i - 1].cursor());
            break;
        }
        total += tokens;
        runs.push(listing);
    }
    RunList { runs, next_cursor }
}

/// The error result for wrong arguments: what is wrong, then what the tool takes, read from its
/// input schema (`script` (string, required), ...).
fn bad_arguments(tool: &str, problem: &str, schema: &JsonObject) -> CallToolResult {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let takes: Vec<String> = schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|properties| {
            properties
                .iter()
                .map(|(name, property)| {
                    let kind = match (property.get("type"), property.get("enum")) {
                        (_, Some(Value::Array(values))) => {
                            let values: Vec<String> = values
                                .iter()
                                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                                .collect();
                            format!("one of {}", values.join(", "))
                        }
                        (Some(Value::String(kind)), _) => kind.clone(),
                        _ => "any JSON".to_string(),
                    };
                    let required = if required.contains(&name.as_str()) {
                        ", required"
                    } else {
                        ""
                    };
                    format!("`{name}` ({kind}{required})")
                })
                .collect()
        })
        .unwrap_or_default();
    let takes = if takes.is_empty() {
        "no arguments".to_string()
    } else {
        takes.join(", ")
    };
    CallToolResult::error(vec![ContentBlock::text(format!(
        "bad arguments for `{tool}`: {problem}. `{tool}` takes {takes}, and nothing else."
    ))])
}

/// `run`'s result, unless the client cancels its request first (`notifications/cancelled`):
/// then `run` is dropped, which stops its script and its speculation.
async fn until_cancelled<T>(
    context: &RequestContext<RoleServer>,
    run: impl Future<Output = T>,
) -> Result<T, ErrorData> {
    tokio::select! {
        result = run => Ok(result),
        () = context.ct.cancelled() => {
            Err(ErrorData::internal_error("the request was cancelled", None))
        }
    }
}

/// Runs `run` and, when the request carries a progress token, tells the client as soon as the
/// run has an id (so that a client whose connection drops knows which run to ask about), then
/// every [`PROGRESS_EVERY`] how many calls are done and how many in flight, and once more at
/// the end. The progress is the number of calls done, and a notification is sent only when it
/// has grown (the specification asks it to increase with each one), except the first.
async fn reporting<T>(
    context: &RequestContext<RoleServer>,
    progress: Arc<Progress>,
    run: impl Future<Output = T>,
) -> T {
    let Some(token) = context.meta.get_progress_token() else {
        return run.await;
    };
    let mut reporter = Reporter {
        peer: context.peer.clone(),
        token,
        progress,
        sent: None,
    };
    let start = tokio::time::Instant::now() + PROGRESS_EVERY;
    let mut ticks = tokio::time::interval_at(start, PROGRESS_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let watched = Arc::clone(&reporter.progress);
    let named = watched.named();
    tokio::pin!(run, named);
    let mut announced = false;
    let out = loop {
        tokio::select! {
            out = &mut run => break out,
            _ = &mut named, if !announced => {
                announced = true;
                reporter.report().await;
            }
            _ = ticks.tick() => reporter.report().await,
        }
    };
    // Before the result: on HTTP, the request's stream ends with it.
    reporter.report().await;
    out
}

/// One request's progress notifications.
struct Reporter {
    peer: Peer<RoleServer>,
    token: ProgressToken,
    progress: Arc<Progress>,
    /// The progress last sent, if any: the next must be larger.
    sent: Option<u64>,
}

impl Reporter {
    async fn report(&mut self) {
        let done = self.progress.done();
        if self.sent.is_some_and(|sent| done <= sent) {
            return;
        }
        self.sent = Some(done);
        let counts = format!("{done} calls done, {} in flight", self.progress.in_flight());
        let message = match self.progress.run_id() {
            Some(run_id) => format!("run {run_id}: {counts}"),
            None => counts,
        };
        let params =
            ProgressNotificationParam::new(self.token.clone(), done as f64).with_message(message);
        // A client that went away gets its answer dropped too; nothing to do about it here.
        if let Err(e) = self.peer.notify_progress(params).await {
            tracing::debug!(error = %e, "a progress notification was not sent");
        }
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
        Ok(ListToolsResult::with_all_items(self.tools.to_vec()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        #[cfg(feature = "http")]
        let scoped = match self.for_request(&context, &request.name, request.arguments.as_ref()) {
            Ok(scoped) => scoped,
            Err(refused) => return Ok(refused.into()),
        };
        #[cfg(feature = "http")]
        let this = scoped.as_ref().unwrap_or(self);
        #[cfg(not(feature = "http"))]
        let this = self;
        let progress = Arc::new(Progress::default());
        let result = match request.name.as_ref() {
            RUN_SCRIPT => {
                let run = this.run_script(request.arguments, Arc::clone(&progress));
                until_cancelled(&context, reporting(&context, progress, run)).await?
            }
            DESCRIBE_TOOLS => this.describe_tools(request.arguments),
            RESUME_RUN => {
                let run = this.resume_run(request.arguments, Arc::clone(&progress));
                until_cancelled(&context, reporting(&context, progress, run)).await?
            }
            LIST_RUNS => this.list_runs(request.arguments).await,
            READ_ARTIFACT => this.read_artifact(request.arguments).await,
            PLAN_SCRIPT => {
                let run = this.plan_script(request.arguments, Arc::clone(&progress));
                until_cancelled(&context, reporting(&context, progress, run)).await?
            }
            APPLY_PLAN => {
                let run = this.apply_plan(request.arguments, Arc::clone(&progress));
                until_cancelled(&context, reporting(&context, progress, run)).await?
            }
            other => {
                // The MCP specification answers an unknown tool with invalid params.
                let message = format!(
                    "unknown tool `{other}`: this server offers `{RUN_SCRIPT}`, \
                     `{DESCRIBE_TOOLS}`, `{RESUME_RUN}`, `{LIST_RUNS}`, `{READ_ARTIFACT}`, \
                     `{PLAN_SCRIPT}` and `{APPLY_PLAN}`"
                );
                return Err(ErrorData::invalid_params(message, None));
            }
        };
        let result = match request.name.as_ref() {
            // The API is the catalog, not an answer; the list of runs is paged on its own.
            DESCRIBE_TOOLS | LIST_RUNS => result,
            _ => this.bounded_text(result),
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
        schema::input::<RunScriptArgs>(),
    )
    .with_annotations(annotations)
    .with_raw_output_schema(Arc::new(schema::output::<RunReport>()))
}

/// `resume_run`: a run id and a decision. It answers with `run_script`'s object, but declares
/// no output schema: a second tool with the same output schema makes the MCP Inspector's CLI
/// exit silently, with status 0, on a later error.
fn resume_run_tool() -> Tool {
    Tool::new(
        RESUME_RUN,
        "Resume a paused run (`run_script` answered with status `paused` and a `pending` call), \
         or one whose server stopped while it ran. A run awaiting `approval` takes `approve` or \
         `reject` (with a `reason`); one awaiting `resolve` (a call whose outcome was lost) takes \
         `done` (it took effect) or `retry` (make it again); if its `pending` says `uncertain: \
         true`, the call may still be running (`why` names what still runs): decide once that \
         has ended. A decision is a person's: pass on one a person made, never decide a call \
         yourself (a server with tokens refuses a decision from the token that started the \
         run). Calls made before are not made again. Answers like `run_script`; without a \
         decision, a run that has ended answers with its outcome.",
        schema::input::<ResumeRunArgs>(),
    )
    .with_annotations(
        ToolAnnotations::with_title("Resume a paused run")
            .read_only(false)
            .destructive(true)
            .idempotent(false)
            .open_world(true),
    )
}

/// A plan as an MCP client receives it: what a person reads to decide, without the script,
/// its input, the catalog or the reads' hashes (the store keeps them).
fn plan_answer(plan: &crate::plan::Plan, logs: &[String]) -> Value {
    serde_json::json!({
        "plan_id": plan.plan_id,
        "status": plan.status,
        "calls": plan.calls,
        "value": plan.value,
        "error": plan.error,
        "logs": logs,
        "reads": plan.reads.len(),
        "expires_ms": plan.expires_ms,
        "note": crate::plan::WORLD_AS_IT_IS,
    })
}

/// `plan_script`: a script planned, its non-read calls listed and none made.
fn plan_script_tool() -> Tool {
    Tool::new(
        PLAN_SCRIPT,
        "Plan a script without changing anything: it runs with real reads, and no other call is \
         made; each is listed in order with its arguments (`calls`: tool, args, status \
         `planned` or `refused`, `asks` where a person would be asked) and answered in the \
         script with its tool's planned result, where `<from planned #N .field>` stands for a \
         value known only once call #N is made. Reads after a planned call see the world \
         without it. Answers `{plan_id, status, calls, value | error, logs, expires_ms}`; a \
         person reads the plan, and `apply_plan` makes exactly those calls.",
        schema::input::<PlanScriptArgs>(),
    )
    .with_annotations(
        ToolAnnotations::with_title("Plan a script")
            .read_only(true)
            .destructive(false)
            .idempotent(false)
            .open_world(true),
    )
}

/// `apply_plan`: a plan made, exactly.
fn apply_plan_tool() -> Tool {
    Tool::new(
        APPLY_PLAN,
        "Apply a plan `plan_script` made, once: its script runs for real and makes exactly the \
         planned calls, in order, with the approvals they need given by applying the plan (a \
         person's decision: apply a plan a person has read). A call the plan did not plan \
         (the world changed, or the script took another branch) pauses the run with `awaiting: \
         \"plan_divergence\"` and is made only if a person approves it (`resume_run`). Answers \
         like `run_script`, with `unapplied`: planned calls the run never reached.",
        schema::input::<ApplyPlanArgs>(),
    )
    .with_annotations(
        ToolAnnotations::with_title("Apply a plan")
            .read_only(false)
            .destructive(true)
            .idempotent(false)
            .open_world(true),
    )
}

/// `read_artifact`: an artifact, whole or one page.
fn read_artifact_tool() -> Tool {
    Tool::new(
        READ_ARTIFACT,
        "A page of an artifact a run's output referred to (an `artifact` id where a value, a \
         log, a message or the effects were too large for the output): page `page` (from 0; \
         page 0 without it) as `{page, pages, items | entries | text | json}`: some of an \
         array's items, a map's entries, a string's text, or else its JSON's text. Read pages 0 \
         to pages - 1 for the whole.",
        schema::input::<ArtifactArgs>(),
    )
    .with_raw_output_schema(Arc::new(schema::output::<ArtifactRead>()))
    .with_annotations(
        ToolAnnotations::with_title("Read an artifact")
            .read_only(true)
            .destructive(false)
            .idempotent(true)
            .open_world(false),
    )
}

/// `list_runs`: the store's runs.
fn list_runs_tool() -> Tool {
    Tool::new(
        LIST_RUNS,
        "The runs this server keeps, newest first, a page at a time (50 unless `limit` says, \
         up to 200): `run_id`, `status` (running, paused, completed, failed, interrupted), start, \
         and the `pending` call of a paused run. `status` filters (e.g. [\"paused\"]); give \
         the answer's `next_cursor` as `cursor` for the next page (null: the last page).",
        schema::input::<ListRunsArgs>(),
    )
    .with_raw_output_schema(Arc::new(schema::output::<RunList>()))
    .with_annotations(
        ToolAnnotations::with_title("List runs")
            .read_only(true)
            .destructive(false)
            .idempotent(true)
            .open_world(false),
    )
}

/// `describe_tools`: no arguments, the API as text.
fn describe_tools_tool() -> Tool {
    Tool::new(
        DESCRIBE_TOOLS,
        "The API of the tools a `run_script` script can call, as Rhai function signatures with \
         doc comments (the same text as in `run_script`'s description).",
        schema::input::<NoArgs>(),
    )
    .with_annotations(
        ToolAnnotations::with_title("Describe the tools")
            .read_only(true)
            .destructive(false)
            .idempotent(true)
            .open_world(false),
    )
}
