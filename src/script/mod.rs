//! The script executor: the authoritative, sequential run of a script. Rhai runs on a thread of
//! its own; each tool call blocks that thread until the dispatch path, running on the async
//! runtime, has its result. The run's meaning — epochs, identical reads answered once, claims
//! of what the scout started — is kept in the run ledger.

mod check;

pub use check::Problem;

pub(crate) use check::{check, known_functions};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rhai::{Dynamic, Engine, Scope, AST};
use serde_json::Value;

use crate::dispatch::{dispatch, Call, RunContext};
use crate::engine::{self, block_on, Limits, ToolCall, Watch};
use crate::error::{ErrorKind, RunError, ToolError};
use crate::ledger::{Read, ReadKey, RunLedger, WriteRecord};
use crate::sync::lock;
use crate::tool::Effect;

/// What the executor counted during a run.
#[derive(Clone, Debug, Default)]
pub(crate) struct Counts {
    pub(crate) tool_calls: u64,
    pub(crate) deduplicated: u64,
    pub(crate) effectful_calls: u64,
    /// Interpreter operations.
    pub(crate) operations: u64,
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
    ledger: Arc<RunLedger>,
    handle: tokio::runtime::Handle,
    counts: Mutex<Counts>,
}

impl Executor {
    /// One tool call made by the script: reads go through the ledger (answered by an identical
    /// read earlier in the epoch, claimed from the scout, or dispatched); non-read calls are
    /// dispatched and end the epoch.
    fn call(&self, name: &str, args: &Dynamic) -> Result<Value, ToolError> {
        lock(&self.counts).tool_calls += 1;
        let args = engine::to_json(args).map_err(|e| {
            ToolError::invalid_input(format!("the arguments of `{name}` cannot be sent: {e}"))
                .for_tool(name)
        })?;
        let Some(tool) = self.ctx.registry.get(name) else {
            // The dispatch path refuses it (`unknown_tool`) and counts it.
            return self.dispatch(Call::top_level(name, args));
        };
        let (tool, effect, polling) = (
            tool.spec.name.clone(),
            tool.spec.effect,
            tool.spec.allow_repeat,
        );
        match effect {
            // A polling read is dispatched afresh every time.
            Effect::Read if polling => self.dispatch(Call::top_level(tool, args)),
            Effect::Read => self.read(Call::top_level(tool, args)),
            _ => {
                let call = Call::top_level(tool, args);
                let (tool, args_key) = (call.tool.clone(), call.args_key.clone());
                let result = self.dispatch(call);
                lock(&self.counts).effectful_calls += 1;
                self.ledger.record_write(WriteRecord {
                    tool,
                    args: args_key,
                    outcome: Arc::new(result.clone()),
                });
                result
            }
        }
    }

    /// A read, through the ledger.
    fn read(&self, call: Call) -> Result<Value, ToolError> {
        let key = ReadKey {
            epoch: self.ledger.epoch(),
            tool: call.tool.clone(),
            args: call.args_key.clone(),
        };
        match self.ledger.read(&key) {
            Read::Repeat(outcome) => {
                lock(&self.counts).deduplicated += 1;
                (*outcome).clone()
            }
            Read::Claimed(outcome) => (*outcome).clone(),
            Read::Dispatch(cell) => {
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
    if known_functions(engine, ast).contains(name) {
        return None;
    }
    let tool_error = registry.unknown(name, "tool or function");
    let (line, column) = engine::line_column(*position);
    Some(RunError::from_tool(tool_error, line, column))
}

/// What the executor hands back to the runtime.
pub(crate) struct Execution {
    pub(crate) result: Result<Value, RunError>,
    pub(crate) logs: Vec<String>,
    pub(crate) counts: Counts,
}

/// Runs a compiled script to its end on the current thread (a thread of its own, never an async
/// worker: every tool call blocks it), under `watch` (the run's deadline and cancellation).
pub(crate) fn execute(
    ast: &AST,
    ctx: Arc<RunContext>,
    ledger: Arc<RunLedger>,
    handle: tokio::runtime::Handle,
    limits: &Limits,
    watch: Watch,
) -> Execution {
    let operations = Arc::new(AtomicU64::new(0));
    let watch = Watch {
        operations: Some(Arc::clone(&operations)),
        ..watch
    };
    let mut engine = engine::new_engine(limits, watch);
    let logs = Arc::new(Mutex::new(Logs::default()));
    let max_log = limits.max_log_bytes;
    let sink = Arc::clone(&logs);
    engine.on_print(move |s| lock(&sink).push(s, max_log));
    let sink = Arc::clone(&logs);
    engine.on_debug(move |s, _, _| lock(&sink).push(s, max_log));
    let executor = Arc::new(Executor {
        ctx,
        ledger,
        handle,
        counts: Mutex::default(),
    });
    let exec = Arc::clone(&executor);
    let call: ToolCall = Arc::new(move |at, name, args| {
        // A run whose receipts can no longer be written stops before its next call, and the
        // script cannot catch that.
        if let Some(why) = exec.ctx.receipts_failure() {
            let message = crate::dispatch::receipts_failed(&why).message;
            let token = Dynamic::from(format!("{}{message}", engine::STOPPED));
            return Err(Box::new(rhai::EvalAltResult::ErrorTerminated(token, at)));
        }
        engine::outcome_to_rhai(&exec.call(name, args), at)
    });
    engine::register_tool_functions(&mut engine, &executor.ctx.registry, call);

    let _span = tracing::debug_span!("script").entered();
    let result = engine
        .eval_ast_with_scope::<Dynamic>(&mut Scope::new(), ast)
        .map_err(
            |e| match unknown_function(&e, &engine, ast, &executor.ctx.registry) {
                Some(error) => error,
                None => engine::from_rhai(*e, limits),
            },
        )
        .and_then(|value| {
            engine::to_json(&value).map_err(|e| {
                RunError::new(
                    ErrorKind::ScriptError,
                    format!("the script's value cannot be returned: {e}"),
                )
            })
        });
    drop(engine);
    let mut counts = lock(&executor.counts).clone();
    counts.operations = operations.load(Ordering::Relaxed);
    let logs = std::mem::take(&mut lock(&logs).lines);
    Execution {
        result,
        logs,
        counts,
    }
}
