//! The script executor: the authoritative, sequential run of a script. Rhai runs on a thread of
//! its own; each tool call blocks that thread until the dispatch path, running on the async
//! runtime, has its result.

mod check;
mod engine;
mod errors;
mod limits;
mod value;

pub use check::Problem;
pub use limits::Limits;

pub(crate) use check::check;
pub(crate) use engine::{new_engine, Watch};
pub(crate) use errors::{from_parse, from_rhai, line_column, tool_error_to_rhai};
pub(crate) use value::{to_dynamic, to_json};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rhai::{Dynamic, Engine, ImmutableString, Map, NativeCallContext, Position, Scope, AST};
use serde_json::Value;

use crate::dispatch::{dispatch, Call, RunContext};
use crate::error::{ErrorKind, RunError, ToolError};
use crate::speculate::{Lookup, PrefetchTable, WriteRecord};
use crate::tool::Effect;

/// A read call as the run's meaning sees it: identical reads in one epoch are one call. The
/// prefetch table of speculation uses the same key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ReadKey {
    /// Non-read calls completed before this one.
    pub(crate) epoch: u64,
    pub(crate) tool: String,
    /// Canonical JSON of the arguments.
    pub(crate) args: String,
}

/// What the executor counted during a run.
#[derive(Clone, Debug, Default)]
pub(crate) struct Counts {
    pub(crate) tool_calls: u64,
    pub(crate) deduplicated: u64,
    pub(crate) effectful_calls: u64,
    /// Interpreter operations.
    pub(crate) operations: u64,
}

#[derive(Default)]
struct State {
    counts: Counts,
}

/// The captured `print` and `debug` output of a run.
#[derive(Debug, Default)]
struct Logs {
    lines: Vec<String>,
    bytes: usize,
    truncated: bool,
}

impl Logs {
    fn push(&mut self, line: &str, max_bytes: usize) {
        if self.truncated {
            return;
        }
        if self.bytes + line.len() > max_bytes {
            self.truncated = true;
            self.lines
                .push(format!("(log output cut at {max_bytes} bytes)"));
            return;
        }
        self.bytes += line.len();
        self.lines.push(line.to_string());
    }
}

/// The executor of one run.
struct Executor {
    ctx: Arc<RunContext>,
    /// Read results of the run, the executor's and the scout's; the executor's non-read calls.
    table: Arc<PrefetchTable>,
    handle: tokio::runtime::Handle,
    state: Mutex<State>,
}

impl Executor {
    /// One tool call made by the script: reads are answered from the epoch's earlier identical
    /// read if there was one; non-read calls end the epoch.
    fn call(&self, name: &str, args: &Dynamic) -> Result<Value, ToolError> {
        let args = to_json(args).map_err(|e| {
            ToolError::invalid_input(format!("the arguments of `{name}` cannot be sent: {e}"))
                .for_tool(name)
        })?;
        let tool = self
            .ctx
            .registry
            .get(name)
            .map(|t| (t.spec.name.clone(), t.spec.effect, t.spec.allow_repeat));
        let mut state = self.lock();
        state.counts.tool_calls += 1;
        match tool {
            Some((tool, Effect::Read, false)) => {
                drop(state);
                let call = Call::top_level(tool, args);
                // The epoch is the number of non-read calls made so far, kept by the table.
                let key = ReadKey {
                    epoch: self.table.writes_made() as u64,
                    tool: call.tool.clone(),
                    args: call.args_key.clone(),
                };
                self.read(key, call)
            }
            Some((tool, effect, _)) if effect != Effect::Read => {
                drop(state);
                let call = Call::top_level(tool, args);
                let (tool, args_key) = (call.tool.clone(), call.args_key.clone());
                let result = self.dispatch(call);
                self.lock().counts.effectful_calls += 1;
                self.table.record_write(WriteRecord {
                    tool,
                    args: args_key,
                    outcome: Arc::new(result.clone()),
                });
                result
            }
            // Polling reads and unknown tools go straight to the dispatch path.
            _ => {
                drop(state);
                self.dispatch(Call::top_level(name, args))
            }
        }
    }

    /// A read: answered by an identical read earlier in this epoch, claimed from the scout's
    /// speculation, or dispatched.
    fn read(&self, key: ReadKey, call: Call) -> Result<Value, ToolError> {
        match self.table.lookup(&key) {
            Lookup::Repeat(cell) => {
                self.lock().counts.deduplicated += 1;
                (*cell.wait_blocking()).clone()
            }
            // An outcome the executor already claimed answers a repeat, as its own would.
            Lookup::Speculated(cell, claimed) if claimed.load(Ordering::SeqCst) => {
                self.lock().counts.deduplicated += 1;
                (*cell.wait_blocking()).clone()
            }
            Lookup::Speculated(cell, claimed) => {
                let outcome = cell.wait_blocking();
                if let Err(e) = outcome.as_ref() {
                    if e.kind.is_speculation_refusal() {
                        // The runtime refused the speculative call; the tool never answered.
                        let cell = self.table.take_over(&key);
                        let result = self.dispatch(call);
                        cell.set(result.clone());
                        return result;
                    }
                }
                self.ctx
                    .claim(&key.tool, &outcome, cell.nested_calls())
                    .map_err(|e| e.for_tool(&key.tool))?;
                self.table.claim(&claimed);
                (*outcome).clone()
            }
            Lookup::Miss(cell) => {
                let result = self.dispatch(call);
                cell.set(result.clone());
                result
            }
        }
    }

    /// Runs the dispatch path and blocks this thread until it is done.
    fn dispatch(&self, call: Call) -> Result<Value, ToolError> {
        let ctx = Arc::clone(&self.ctx);
        block_on(&self.handle, async move { dispatch(&ctx, call).await }).unwrap_or_else(|| {
            Err(ToolError::internal(
                "the call was abandoned because the async runtime shut down",
            ))
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What a script's tool functions call: the call site, the tool's name, the argument map.
pub(crate) type ToolCall = Arc<
    dyn Fn(Position, &str, &Dynamic) -> Result<Dynamic, Box<rhai::EvalAltResult>> + Send + Sync,
>;

/// Makes every tool a script function (under its function name: the alias of a `-` name) with
/// one argument or none, plus the generic `tool(name, args)`; all of them call `call`. The
/// executor, the scout and script composites differ only in `call`.
pub(crate) fn register_tool_functions(
    engine: &mut Engine,
    registry: &crate::tool::Registry,
    call: ToolCall,
) {
    let empty = || Dynamic::from_map(Map::new());
    for tool in registry.iter() {
        let function = tool.function_name();
        let (f, name) = (Arc::clone(&call), tool.spec.name.clone());
        engine.register_fn(function, move |ctx: NativeCallContext, args: Dynamic| {
            f(ctx.call_position(), &name, &args)
        });
        let (f, name) = (Arc::clone(&call), tool.spec.name.clone());
        engine.register_fn(function, move |ctx: NativeCallContext| {
            f(ctx.call_position(), &name, &empty())
        });
    }
    let f = Arc::clone(&call);
    engine.register_fn(
        "tool",
        move |ctx: NativeCallContext, name: ImmutableString, args: Dynamic| {
            f(ctx.call_position(), &name, &args)
        },
    );
    engine.register_fn(
        "tool",
        move |ctx: NativeCallContext, name: ImmutableString| {
            call(ctx.call_position(), &name, &empty())
        },
    );
}

/// A call to a function that exists nowhere is a call to a tool that does not exist:
/// `unknown_tool`, with the closest tool name as the hint. (A known function called with the
/// wrong argument types stays a `script_error`.)
fn unknown_function(
    error: &rhai::EvalAltResult,
    engine: &Engine,
    ast: &AST,
    registry: &crate::tool::Registry,
) -> Option<RunError> {
    let mut error = error;
    while let rhai::EvalAltResult::ErrorInFunctionCall(_, _, inner, _) = error {
        error = inner;
    }
    let rhai::EvalAltResult::ErrorFunctionNotFound(signature, position) = error else {
        return None;
    };
    let name = signature
        .split(|c: char| c == '(' || c.is_whitespace())
        .next()
        .unwrap_or_default();
    if check::known_functions(engine, ast).contains(name) {
        return None;
    }
    let mut tool_error = ToolError::new(
        ErrorKind::UnknownTool,
        format!("there is no tool or function named `{name}`"),
    );
    if let Some(near) = registry.suggest(name) {
        tool_error
            .message
            .push_str(&format!("; did you mean `{near}`?"));
        tool_error = tool_error.with_next_action(format!("call `{near}` instead"));
    }
    tool_error.tool = Some(name.to_string());
    let (line, column) = line_column(*position);
    Some(RunError::from_tool(tool_error, line, column))
}

/// Runs `future` on the async runtime from a thread that may block (a script's), and waits for
/// its output; `None` if the runtime shut down first.
///
/// On a multi-thread runtime this thread polls the future itself (its timers are driven by the
/// runtime's workers), which saves two thread switches a call. A current-thread runtime (tests
/// with paused time) drives timers only on its own thread, so there the future runs as a task
/// and this thread waits for its output.
pub(crate) fn block_on<T: Send + 'static>(
    handle: &tokio::runtime::Handle,
    future: impl std::future::Future<Output = T> + Send + 'static,
) -> Option<T> {
    if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::CurrentThread {
        return Some(handle.block_on(future));
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    handle.spawn(async move {
        let _ = tx.send(future.await);
    });
    rx.blocking_recv().ok()
}

/// The stack of a thread a script runs on: deep enough for `Limits::max_call_depth` levels of
/// script functions in an unoptimised build.
const SCRIPT_STACK: usize = 64 << 20;

/// Starts a thread fit to run a script (the executor's, or a scout pass).
pub(crate) fn spawn_script_thread(
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.to_string())
        .stack_size(SCRIPT_STACK)
        .spawn(f)
}

/// What the executor hands back to the runtime.
pub(crate) struct Execution {
    pub(crate) result: Result<Value, RunError>,
    pub(crate) logs: Vec<String>,
    pub(crate) counts: Counts,
}

/// Runs a compiled script to its end on the current thread (a thread of its own, never an async
/// worker: every tool call blocks it).
pub(crate) fn execute(
    ast: &AST,
    ctx: Arc<RunContext>,
    table: Arc<PrefetchTable>,
    handle: tokio::runtime::Handle,
    limits: &Limits,
) -> Execution {
    let operations = Arc::new(AtomicU64::new(0));
    let watch = Watch {
        deadline: Some(Instant::now() + limits.max_duration),
        operations: Some(Arc::clone(&operations)),
        ..Watch::default()
    };
    let mut engine = new_engine(limits, watch);
    let logs = Arc::new(Mutex::new(Logs::default()));
    let max_log = limits.max_log_bytes;
    let sink = Arc::clone(&logs);
    engine.on_print(move |s| {
        sink.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(s, max_log)
    });
    let sink = Arc::clone(&logs);
    engine.on_debug(move |s, _, _| {
        sink.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(s, max_log)
    });
    let executor = Arc::new(Executor {
        ctx,
        table,
        handle,
        state: Mutex::default(),
    });
    let exec = Arc::clone(&executor);
    let call: ToolCall = Arc::new(move |at, name, args| {
        exec.call(name, args)
            .map(|v| to_dynamic(&v))
            .map_err(|e| errors::to_rhai(e, at))
    });
    register_tool_functions(&mut engine, &executor.ctx.registry, call);

    let _span = tracing::debug_span!("script").entered();
    let result = engine
        .eval_ast_with_scope::<Dynamic>(&mut Scope::new(), ast)
        .map_err(
            |e| match unknown_function(&e, &engine, ast, &executor.ctx.registry) {
                Some(error) => error,
                None => from_rhai(*e, limits),
            },
        )
        .and_then(|value| {
            to_json(&value).map_err(|e| {
                RunError::new(
                    ErrorKind::ScriptError,
                    format!("the script's value cannot be returned: {e}"),
                )
            })
        });
    drop(engine);
    let mut counts = executor.lock().counts.clone();
    counts.operations = operations.load(Ordering::Relaxed);
    let logs = std::mem::take(&mut logs.lock().unwrap_or_else(|p| p.into_inner()).lines);
    Execution {
        result,
        logs,
        counts,
    }
}
