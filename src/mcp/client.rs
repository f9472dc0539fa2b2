//! The MCP client: start a server over stdio, list its tools, and make each a toolscript tool.
//!
//! A server is one child process and one rmcp connection, shared by all of its tools: each
//! tool's body holds an `Arc` of the [`Connection`], so calls run concurrently over it and the
//! server lives exactly as long as any of its tools. When the last one is dropped, rmcp's
//! running service is dropped, which cancels its task; the task closes the server's stdin,
//! waits, then terminates it. The child is also spawned with `kill_on_drop`, so it dies even
//! when the async runtime shuts down before that task gets to run.
//!
//! On Unix the server starts in a process group of its own, led by a guard
//! ([`ChildGuard`](crate::children)): whatever the server started there (`npx` → `node`) is
//! killed with it when the connection ends, and the whole group is killed when toolscript
//! dies, however it dies, so that no call of a dead toolscript lands later.
//!
//! Invariants, phrased as absences:
//! - the server's stderr is never inherited: it is drained into `tracing` (stdout is ours);
//! - start-up (spawn, `initialize`, every page of `tools/list`) never waits past its timeout;
//! - nothing a server sends can make this module panic.

use std::collections::{HashSet, VecDeque};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ContentBlock,
    ErrorCode, Implementation, ProtocolVersion, ToolAnnotations,
};
use rmcp::service::{ClientInitializeError, RoleClient, RunningService, ServiceError};
use rmcp::ServiceExt;
use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::process::ChildStderr;

use super::McpServerSpec;
use crate::children::ChildGuard;
use crate::error::{Cause, Error, ErrorKind, ToolError};
use crate::sync::lock;
use crate::tool::{check_name, Effect, Tool, ToolSpec, MAX_NAME_LEN};

/// The least time start-up may take before it is abandoned; a server's own `timeout` extends it.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a failed start-up waits for the dying server's last stderr lines, to quote them.
const STDERR_GRACE: Duration = Duration::from_secs(2);
/// How many of the server's last stderr lines are kept, and quoted when start-up fails.
const STDERR_TAIL_LINES: usize = 10;
/// Where a long stderr line is cut, both when it is kept and when it is read without a newline.
const STDERR_LINE_BYTES: usize = 400;

/// rmcp's running client: its task owns the transport, and the transport owns the child process.
type Client = RunningService<RoleClient, ClientConfig>;

/// One running server: the rmcp client, shared by all of the server's tools.
struct Connection {
    /// The server's name, for errors.
    server: String,
    /// Dropping it cancels the client's task, which closes the server's stdin.
    service: Client,
    /// The server's process: given a moment to exit on its own once its stdin is closed, then
    /// killed.
    child: Mutex<Option<tokio::process::Child>>,
    /// The guard of the server's process group: dropped once the server has exited, it kills
    /// what the server left in its group.
    guard: Mutex<Option<ChildGuard>>,
    /// Bumped at every line the server wrote that is not JSON-RPC: a call waiting when one
    /// comes has lost its answer.
    faults: tokio::sync::watch::Receiver<(u64, String)>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        let child = lock(&self.child).take();
        let guard = lock(&self.guard).take();
        if let (Some(mut child), Ok(handle)) = (child, tokio::runtime::Handle::try_current()) {
            handle.spawn(async move {
                if tokio::time::timeout(EXIT_GRACE, child.wait())
                    .await
                    .is_err()
                {
                    let _ = child.kill().await;
                }
                drop(guard);
            });
        }
    }
}

/// How long a server whose stdin was closed may take to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// The longest line a server may write; a longer one is a protocol fault.
const MAX_LINE: usize = 64 << 20;

/// Reads the server's stdout line by line and passes on only JSON-RPC messages; any other line
/// is a protocol fault, counted in `faults` (with what it looked like) so that the calls then
/// waiting fail at once instead of at their timeout.
async fn validate(
    stdout: tokio::process::ChildStdout,
    mut to_client: tokio::io::DuplexStream,
    faults: tokio::sync::watch::Sender<(u64, String)>,
) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let mut lines = BufReader::new(stdout);
    let mut line = Vec::new();
    loop {
        line.clear();
        let read = (&mut lines)
            .take(MAX_LINE as u64)
            .read_until(b'\n', &mut line)
            .await;
        if matches!(read, Ok(0) | Err(_)) {
            break;
        }
        let text = String::from_utf8_lossy(&line);
        let message: Option<Value> = serde_json::from_str(text.trim()).ok();
        let is_rpc = message
            .as_ref()
            .and_then(Value::as_object)
            .is_some_and(|m| m.get("jsonrpc").and_then(Value::as_str) == Some("2.0"));
        if is_rpc {
            if !line.ends_with(b"\n") {
                // The last line of a server that exits without a final newline.
                line.push(b'\n');
            }
            if to_client.write_all(&line).await.is_err() {
                break;
            }
        } else if !text.trim().is_empty() {
            let seen: String = text.trim().chars().take(80).collect();
            faults.send_modify(|(n, last)| {
                *n += 1;
                *last = seen;
            });
        }
    }
    let _ = to_client.shutdown().await;
}

/// Starts the server, initialises it, lists its tools (all pages) and returns them as tools.
///
/// # Errors
///
/// [`Error::Mcp`] naming the server: the program cannot be started, the server exits or answers
/// something that is not MCP, start-up takes longer than its timeout, or `effects` names a tool
/// the server does not have.
pub(crate) async fn connect(
    spec: &McpServerSpec,
    secrets: &crate::secrets::Secrets,
) -> Result<Vec<Tool>, Error> {
    let fail = |message: String| Error::mcp(&spec.name, message, None);
    let env = crate::secrets::resolve_env(&spec.env, secrets)
        .await
        .map_err(|why| fail(format!("its environment: {why}")))?;
    // The variables secrets come from are not passed on to a server that does not name them.
    let withheld: Vec<&str> = secrets
        .env_vars()
        .filter(|var| !env.contains_key(*var))
        .collect();
    let (service, (child, guard), faults, listed) = start(spec, &env, &withheld).await?;
    let originals: Vec<&str> = listed.iter().map(|t| t.name.as_ref()).collect();
    for (table, mut names) in [
        (
            "effects",
            Box::new(spec.effects.keys()) as Box<dyn Iterator<Item = &String>>,
        ),
        ("approval", Box::new(spec.approval.keys())),
        (
            "paths",
            Box::new(spec.paths.keys().filter(|name| name.as_str() != "*")),
        ),
        ("redact", Box::new(spec.redact.keys())),
        ("cache", Box::new(spec.cache_ttl.keys())),
        ("invalidates", Box::new(spec.invalidates.keys())),
        ("plan_results", Box::new(spec.plan.keys())),
    ] {
        if let Some(unknown) = names.find(|name| !originals.contains(&name.as_str())) {
            let mut known = originals.clone();
            known.sort_unstable();
            return Err(fail(format!(
                "`{table}` names the tool `{unknown}`, which the server does not have (its tools: {})",
                known.join(", ")
            )));
        }
    }
    let names = tool_names(spec.prefix.as_deref().unwrap_or(""), &originals);
    // What a paused run's catalog keeps of the server: its command and environment (a
    // secret by its name, never its value).
    let server = crate::json::jcs_value_sha256(&serde_json::json!({
        "command": spec.command,
        "env": spec.env,
    }));
    tracing::info!(server = %spec.name, tools = listed.len(), "MCP server started");
    let connection = Arc::new(Connection {
        server: spec.name.clone(),
        service,
        child: Mutex::new(Some(child)),
        guard: Mutex::new(Some(guard)),
        faults,
    });
    let slots = crate::tool::SlotPool::new(spec.max_concurrency.max(1));
    let tools = listed
        .iter()
        .zip(names)
        .map(|(tool, name)| {
            let mut tool_spec = ToolSpec::new(name, effect_of(tool, spec));
            tool_spec.description = tool
                .description
                .as_deref()
                .or(tool.title.as_deref())
                .unwrap_or_default()
                .to_string();
            tool_spec.input_schema = Value::Object(tool.input_schema.as_ref().clone());
            tool_spec.output_schema = tool
                .output_schema
                .as_ref()
                .map(|schema| Value::Object(schema.as_ref().clone()));
            tool_spec.timeout = spec.timeout;
            if let Some(&approval) = spec.approval.get(tool.name.as_ref()) {
                tool_spec.approval = approval;
            }
            tool_spec.cache_ttl = spec.cache_ttl.get(tool.name.as_ref()).copied();
            tool_spec.cache_scope = spec
                .cache_scope
                .get(tool.name.as_ref())
                .cloned()
                .unwrap_or_default();
            tool_spec.invalidates = spec
                .invalidates
                .get(tool.name.as_ref())
                .cloned()
                .unwrap_or_default();
            if let Some(args) = spec
                .paths
                .get(tool.name.as_ref())
                .or_else(|| spec.paths.get("*"))
            {
                let access = match tool_spec.effect {
                    Effect::Read => crate::guard::Access::Read,
                    _ => crate::guard::Access::Write,
                };
                tool_spec.guard.paths = args
                    .iter()
                    .map(|arg| crate::guard::PathArg {
                        arg: arg.clone(),
                        access,
                    })
                    .collect();
            }
            if let Some(paths) = spec.redact.get(tool.name.as_ref()) {
                tool_spec.redact = paths.clone();
            }
            if let Some(plan) = spec.plan.get(tool.name.as_ref()) {
                tool_spec.plan = plan.clone();
            }
            tool_spec.origin = Some(format!("mcp:{}/{}", spec.name, tool.name));
            tool_spec.source = Some(crate::tool::BodySource::McpServer(server.clone()));
            let connection = Arc::clone(&connection);
            let original: Arc<str> = Arc::from(tool.name.as_ref());
            let effect = tool_spec.effect;
            Tool::from_spec(tool_spec, move |args, ctx: crate::tool::ToolContext| {
                let (connection, original) = (Arc::clone(&connection), Arc::clone(&original));
                let fencing = ctx
                    .fenced_run()
                    .zip(ctx.fencing_token())
                    .map(|(run, token)| serde_json::json!({"run": run, "token": token}));
                let key = ctx.idempotency_key;
                async move { connection.call(&original, effect, args, key, fencing).await }
            })
            .sharing(&slots)
        })
        .collect();
    Ok(tools)
}

/// A started server: the client, its process and guard, its protocol faults, its tools.
type Started = (
    Client,
    (tokio::process::Child, ChildGuard),
    tokio::sync::watch::Receiver<(u64, String)>,
    Vec<rmcp::model::Tool>,
);

/// Spawns the server and runs the handshake and the listing under the start-up timeout.
async fn start(
    spec: &McpServerSpec,
    env: &std::collections::BTreeMap<String, String>,
    withheld: &[&str],
) -> Result<Started, Error> {
    let fail = |message: String| Error::mcp(&spec.name, message, None);
    let Some((program, args)) = spec.command.split_first() else {
        return Err(fail(
            "the command is empty: give the program and its arguments".to_string(),
        ));
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for var in withheld {
        command.env_remove(var);
    }
    if let Some(cwd) = &spec.cwd {
        command.current_dir(cwd);
    }
    let guard = ChildGuard::start(&format!("MCP server `{}`", spec.name)).map_err(|e| {
        Error::mcp(
            &spec.name,
            "cannot start the guard that ends its processes with toolscript's",
            Cause::from(e),
        )
    })?;
    #[cfg(unix)]
    command.process_group(guard.group() as i32);
    let mut child = command.spawn().map_err(|e| {
        let place = spec
            .cwd
            .as_ref()
            .map(|dir| format!(" in `{}`", dir.display()))
            .unwrap_or_default();
        Error::mcp(
            &spec.name,
            format!("cannot start `{program}`{place}"),
            Cause::from(e),
        )
    })?;
    guard.started(child.id());
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return Err(fail("its stdin and stdout could not be opened".to_string()));
    };
    let stderr = child.stderr.take();
    // The client reads what the validator passes on: JSON-RPC messages only.
    let (to_client, client_reads) = tokio::io::duplex(1 << 16);
    let (faults_tx, faults) = tokio::sync::watch::channel((0u64, String::new()));
    tokio::spawn(validate(stdout, to_client, faults_tx));
    let transport = (client_reads, stdin);
    let tail = StderrTail::default();
    let reader = stderr.map(|stderr| tokio::spawn(tail.clone().drain(stderr, spec.name.clone())));

    let limit = STARTUP_TIMEOUT.max(spec.timeout);
    let initialised = std::sync::atomic::AtomicBool::new(false);
    let started = tokio::time::timeout(limit, async {
        let service = client_config()
            .serve(transport)
            .await
            .map_err(|e| initialise_error(&e))?;
        initialised.store(true, std::sync::atomic::Ordering::SeqCst);
        let tools = list_tools(service.peer()).await?;
        Ok::<_, String>((service, tools))
    })
    .await;
    let message = match started {
        Ok(Ok((service, tools))) => return Ok((service, (child, guard), faults, tools)),
        Ok(Err(message)) => message,
        Err(_) if initialised.load(std::sync::atomic::Ordering::SeqCst) => format!(
            "it answered `initialize` but did not finish listing its tools (`tools/list`) within {} s",
            limit.as_secs()
        ),
        Err(_) => format!(
            "it did not answer `initialize` within {} s: is `{program}` an MCP server speaking JSON-RPC on its stdout?",
            limit.as_secs()
        ),
    };
    // The transport is gone, so the child is being killed: its stderr ends soon.
    if let Some(reader) = reader {
        let _ = tokio::time::timeout(STDERR_GRACE, reader).await;
    }
    Err(fail(format!("{message}{}", tail.quote())))
}

/// At most this many pages of `tools/list`, and this many tools in all: a server that pages
/// forever (the same cursor again and again, say) is an error, not a process that grows until
/// memory runs out.
const MAX_PAGES: usize = 100;
const MAX_TOOLS: usize = 10_000;

/// Every page of the server's tools, within [`MAX_PAGES`] and [`MAX_TOOLS`]; a cursor that
/// comes twice ends the listing with an error at once.
async fn list_tools(peer: &rmcp::Peer<RoleClient>) -> Result<Vec<rmcp::model::Tool>, String> {
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    let mut seen = HashSet::new();
    for _ in 0..MAX_PAGES {
        let params = cursor
            .clone()
            .map(|c| rmcp::model::PaginatedRequestParams::default().with_cursor(Some(c)));
        let page = peer
            .list_tools(params)
            .await
            .map_err(|e| format!("it did not list its tools: {e}"))?;
        tools.extend(page.tools);
        if tools.len() > MAX_TOOLS {
            return Err(format!("it listed more than {MAX_TOOLS} tools"));
        }
        match page.next_cursor {
            None => return Ok(tools),
            Some(next) => {
                if !seen.insert(next.clone()) {
                    return Err(format!(
                        "its `tools/list` pages go round: the cursor `{next}` came twice"
                    ));
                }
                cursor = Some(next);
            }
        }
    }
    Err(format!(
        "its `tools/list` did not end within {MAX_PAGES} pages"
    ))
}

/// What toolscript says about itself in `initialize`: its name and version, no capabilities
/// (no roots, sampling or elicitation), and the newest protocol version that has the handshake.
fn client_config() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("toolscript", env!("CARGO_PKG_VERSION")),
    )
    .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
}

fn initialise_error(e: &ClientInitializeError) -> String {
    match e {
        ClientInitializeError::ConnectionClosed(_) => {
            "it exited, or closed its stdout, before answering `initialize`".to_string()
        }
        ClientInitializeError::JsonRpcError(data) => {
            format!("it refused `initialize`: {}", data.message)
        }
        other => format!("the `initialize` handshake failed: {other}"),
    }
}

/// The effect of a server's tool: the manifest's override, else its annotations when they are
/// trusted (read-only, else idempotent, else open-world, else a write), else a write.
/// Annotations that contradict each other count as the more dangerous one: a tool that says it
/// is read-only and destructive is not a read.
fn effect_of(tool: &rmcp::model::Tool, spec: &McpServerSpec) -> Effect {
    if let Some(&effect) = spec.effects.get(tool.name.as_ref()) {
        return effect;
    }
    if !spec.trust_annotations {
        return Effect::Write;
    }
    let hint = |get: fn(&ToolAnnotations) -> Option<bool>| {
        tool.annotations.as_ref().and_then(get) == Some(true)
    };
    if hint(|a| a.read_only_hint) && !hint(|a| a.destructive_hint) {
        Effect::Read
    } else if hint(|a| a.idempotent_hint) {
        Effect::Idempotent
    } else if hint(|a| a.open_world_hint) {
        Effect::External
    } else {
        Effect::Write
    }
}

/// The toolscript names of a server's tools, in the order given: `prefix` and the tool's name,
/// made valid by [`valid_name`]. Names that would collide (as names or as script aliases, where
/// `-` reads `_`) are told apart with `_2`, `_3`, ... : names that needed no change first, then
/// in the order of the tools' own names, so that a tool never loses its own name to another's
/// mapped one (`get user` never takes `get_user` from `get_user`) and the mapping does not
/// depend on the order the server lists them in.
fn tool_names(prefix: &str, originals: &[&str]) -> Vec<String> {
    let mut order: Vec<usize> = (0..originals.len()).collect();
    let mapped = |i: usize| {
        let own = format!("{prefix}{}", originals[i]);
        valid_name(&own) != own
    };
    // A name without `-` is its own script alias, and keeps it before a `-` name's alias.
    let key = |i: usize| (mapped(i), originals[i].contains('-'), originals[i]);
    order.sort_by(|&a, &b| key(a).cmp(&key(b)).then(a.cmp(&b)));
    let mut taken: HashSet<String> = HashSet::new();
    let mut names = vec![String::new(); originals.len()];
    for i in order {
        let base = valid_name(&format!("{prefix}{}", originals[i]));
        let mut name = base.clone();
        let mut n = 1;
        while !taken.insert(name.replace('-', "_")) {
            n += 1;
            let suffix = format!("_{n}");
            // `base` is ASCII, so any byte index is a character boundary.
            name = format!(
                "{}{suffix}",
                &base[..base.len().min(MAX_NAME_LEN - suffix.len())]
            );
        }
        names[i] = name;
    }
    names
}

/// `raw` as a valid tool name: characters outside `[a-zA-Z0-9_-]` become `_`; a name that does
/// not start with a letter, or whose script alias would start with the runtime's `ts_`, gets
/// `mcp_` in front; it is cut to `MAX_NAME_LEN` characters; a reserved word (or one whose alias is) gets
/// `_` after it.
fn valid_name(raw: &str) -> String {
    let mut name: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let starts_with_letter = name.starts_with(|c: char| c.is_ascii_alphabetic());
    if !starts_with_letter || name.replace('-', "_").starts_with("ts_") {
        name.insert_str(0, "mcp_");
    }
    name.truncate(MAX_NAME_LEN);
    let alias = name.replace('-', "_");
    if check_name(&name).is_err() || check_name(&alias).is_err() {
        name.truncate(MAX_NAME_LEN - 1);
        name.push('_');
    }
    name
}

impl Connection {
    /// Calls the server's tool `tool`. Dropping the future (the call's timeout, or a
    /// speculative call nobody needs) sends `notifications/cancelled` for the request: rmcp's
    /// `Peer::call_tool` arms a guard that does so while the response is awaited.
    ///
    /// A non-read call carries its idempotency key in the request's `_meta`
    /// (`idempotency_key`), the same in every attempt and across a resume of the run. A call
    /// of a durable run carries the run's fencing token there too
    /// (`"toolscript/fencing": {"run": ID, "token": N}`), so that a service can refuse an
    /// owner that lost the run.
    async fn call(
        &self,
        tool: &str,
        effect: Effect,
        args: Value,
        idempotency_key: Option<String>,
        fencing: Option<Value>,
    ) -> Result<Value, ToolError> {
        let mut params = CallToolRequestParams::new(tool.to_string());
        let mut meta = rmcp::model::RequestMetaObject::new();
        if let Some(key) = idempotency_key {
            meta.0
                 .0
                .insert("idempotency_key".into(), Value::String(key));
        }
        if let Some(fencing) = fencing {
            meta.0 .0.insert("toolscript/fencing".into(), fencing);
        }
        if !meta.0 .0.is_empty() {
            params.meta = Some(meta);
        }
        match args {
            Value::Object(map) => params = params.with_arguments(map),
            Value::Null => {}
            other => {
                return Err(ToolError::invalid_input(format!(
                    "the arguments must be an object map, not `{other}`"
                )))
            }
        }
        let mut faults = self.faults.clone();
        faults.mark_unchanged();
        tokio::select! {
            answer = self.service.peer().call_tool(params) => match answer {
                Ok(result) => result_value(result),
                Err(e) => Err(self.call_error(tool, e)),
            },
            // A line that is not JSON-RPC came while the call waited: its answer may have been
            // that line. The call fails now rather than at its timeout; a non-read call may or
            // may not have taken effect.
            Ok(()) = faults.changed() => {
                let seen = faults.borrow().1.clone();
                let why = format!(
                    "the MCP server `{}` wrote a line that is not JSON-RPC (`{seen}`) while `{tool}` was running: its answer is lost",
                    self.server
                );
                Err(if effect == Effect::Read {
                    ToolError::internal(why)
                } else {
                    ToolError::new(ErrorKind::AmbiguousOutcome, why).with_recoverable(false)
                })
            }
        }
    }

    fn call_error(&self, tool: &str, e: ServiceError) -> ToolError {
        let server = &self.server;
        match e {
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => {
                ToolError::unavailable(format!(
                    "the MCP server `{server}` has stopped: its connection closed ({e})"
                ))
                .with_recoverable(false)
                .with_next_action(format!(
                    "do not call the tools of the MCP server `{server}` again in this run"
                ))
            }
            ServiceError::McpError(data) => {
                let message = &data.message;
                let lower = message.to_lowercase();
                match data.code {
                    ErrorCode::INVALID_PARAMS
                        if lower.contains("unknown tool") || lower.contains("not found") =>
                    {
                        ToolError::not_found(format!(
                            "the MCP server `{server}` answered `{tool}`: {message}"
                        ))
                    }
                    ErrorCode::INVALID_PARAMS => ToolError::invalid_input(format!(
                        "the MCP server `{server}` refused the arguments of `{tool}`: {message}"
                    )),
                    ErrorCode::RESOURCE_NOT_FOUND => ToolError::not_found(format!(
                        "the MCP server `{server}` answered `{tool}`: {message}"
                    )),
                    ErrorCode::METHOD_NOT_FOUND | ErrorCode::INTERNAL_ERROR => {
                        ToolError::internal(format!(
                            "the MCP server `{server}` failed to run `{tool}`: {message}"
                        ))
                    }
                    code => ToolError::new(
                        ErrorKind::Failed,
                        format!(
                            "the MCP server `{server}` answered `{tool}` with error {}: {message}",
                            code.0
                        ),
                    ),
                }
            }
            ServiceError::Timeout { timeout } => ToolError::new(
                ErrorKind::Timeout,
                format!(
                    "the MCP server `{server}` did not answer `{tool}` within {} ms",
                    timeout.as_millis()
                ),
            ),
            ServiceError::Cancelled { reason } => ToolError::new(
                ErrorKind::Failed,
                format!(
                    "the MCP server `{server}` cancelled the call of `{tool}`: {}",
                    reason.as_deref().unwrap_or("no reason given")
                ),
            ),
            ServiceError::UnexpectedResponse => ToolError::internal(format!(
                "the MCP server `{server}` answered `{tool}` with something that is not a tool result (toolscript does not drive input requests or tasks)"
            )),
            other => ToolError::internal(format!(
                "the call of `{tool}` on the MCP server `{server}` failed: {other}"
            )),
        }
    }
}

/// A tool result as a value: an error result is a `failed` tool error with the result's text;
/// otherwise the structured content when there is any (the dispatch path checks it against the
/// output schema); else one text item, parsed as JSON when it is JSON, or as a string; else the
/// content items themselves.
fn result_value(result: CallToolResult) -> Result<Value, ToolError> {
    if result.is_error == Some(true) {
        let text: Vec<&str> = result
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
            .collect();
        let message = if text.is_empty() {
            "the tool reported an error without saying why".to_string()
        } else {
            text.join("\n")
        };
        return Err(ToolError::new(ErrorKind::Failed, message));
    }
    if let Some(value) = result.structured_content {
        return Ok(value);
    }
    match result.content.as_slice() {
        [ContentBlock::Text(text)] => {
            Ok(serde_json::from_str(&text.text)
                .unwrap_or_else(|_| Value::String(text.text.clone())))
        }
        items => serde_json::to_value(items).map_err(|e| {
            ToolError::internal(format!("the tool's content cannot be returned: {e}"))
        }),
    }
}

/// The last lines the server wrote to stderr. Every line is also logged at `debug`.
#[derive(Clone, Default)]
struct StderrTail(Arc<Mutex<VecDeque<String>>>);

impl StderrTail {
    /// Reads the server's stderr to its end, so that a chatty server never blocks on a full
    /// pipe. Lines are cut at [`STDERR_LINE_BYTES`], and any bytes are accepted.
    async fn drain(self, mut stderr: ChildStderr, server: String) {
        let mut buffer = [0u8; 4096];
        let mut line: Vec<u8> = Vec::new();
        loop {
            let read = match stderr.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            for &byte in &buffer[..read] {
                if byte == b'\n' {
                    self.push(&server, &line);
                    line.clear();
                } else if line.len() < STDERR_LINE_BYTES {
                    line.push(byte);
                }
            }
        }
        if !line.is_empty() {
            self.push(&server, &line);
        }
    }

    fn push(&self, server: &str, line: &[u8]) {
        let line = String::from_utf8_lossy(line).trim_end().to_string();
        tracing::debug!(target: "toolscript::mcp", server, "stderr: {line}");
        let mut tail = lock(&self.0);
        if tail.len() == STDERR_TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    }

    /// The tail for an error message, or nothing when the server wrote nothing.
    fn quote(&self) -> String {
        let tail = lock(&self.0);
        if tail.iter().all(|l| l.is_empty()) {
            return String::new();
        }
        let lines: Vec<&str> = tail.iter().map(String::as_str).collect();
        format!("; its stderr ends with:\n  {}", lines.join("\n  "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_valid() {
        let cases = [
            ("", "echo", "echo"),
            ("fs_", "read_file", "fs_read_file"),
            ("", "get-sum", "get-sum"),
            ("", "has space.and/dots", "has_space_and_dots"),
            ("", "1st", "mcp_1st"),
            ("", "_private", "mcp__private"),
            ("", "", "mcp_"),
            ("", "ts_run", "mcp_ts_run"),
            ("", "ts-run", "mcp_ts-run"),
            ("ts_", "x", "mcp_ts_x"),
            ("", "print", "print_"),
            ("", "type-of", "type-of_"),
            ("", "café", "caf_"),
            ("my server ", "x", "my_server_x"),
        ];
        for (prefix, raw, expected) in cases {
            let name = &tool_names(prefix, &[raw])[0];
            assert_eq!(name, expected, "{prefix:?} + {raw:?}");
            assert!(check_name(name).is_ok(), "{name}");
        }
        let long = tool_names("", &[&"x".repeat(300)]);
        assert_eq!(long[0].len(), MAX_NAME_LEN);
    }

    #[test]
    fn collisions_are_told_apart_whatever_the_order() {
        let originals = ["get_user", "get-user", "get user", "print", "print_"];
        let names = tool_names("", &originals);
        let reversed: Vec<&str> = originals.iter().rev().copied().collect();
        let mut names_reversed = tool_names("", &reversed);
        names_reversed.reverse();
        assert_eq!(
            names, names_reversed,
            "the mapping does not depend on order"
        );
        assert_eq!(names[0], "get_user", "a tool keeps its own name");
        assert_eq!(
            names[1], "get-user_2",
            "`get-user`'s alias would be `get_user`"
        );
        assert_eq!(
            names[2], "get_user_3",
            "`get user` maps to a name of its own"
        );
        assert_eq!(
            names[4], "print_",
            "a valid name is kept before a mapped one"
        );
        let aliases: HashSet<String> = names.iter().map(|n| n.replace('-', "_")).collect();
        assert_eq!(aliases.len(), originals.len(), "{names:?}");
        for name in &names {
            assert!(check_name(name).is_ok(), "{name}");
        }
        let long = "y".repeat(200);
        let names = tool_names("", &[&long, &long]);
        assert_ne!(names[0], names[1]);
        assert!(names.iter().all(|n| n.len() <= MAX_NAME_LEN));
    }

    #[test]
    fn results_map_to_values() {
        let text = |t: &str| CallToolResult::success(vec![ContentBlock::text(t)]);
        assert_eq!(
            result_value(text("{\"a\": 1}")).unwrap(),
            serde_json::json!({"a": 1})
        );
        assert_eq!(
            result_value(text("Echo: hi")).unwrap(),
            serde_json::json!("Echo: hi")
        );
        let two = CallToolResult::success(vec![ContentBlock::text("a"), ContentBlock::text("b")]);
        assert_eq!(
            result_value(two).unwrap(),
            serde_json::json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
        );
        let structured = CallToolResult::structured(serde_json::json!({"content": "x"}));
        assert_eq!(
            result_value(structured).unwrap(),
            serde_json::json!({"content": "x"})
        );
        let error = CallToolResult::error(vec![ContentBlock::text("Access denied")]);
        let e = result_value(error).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Failed);
        assert_eq!(e.message, "Access denied");
    }
}
