//! The runtime: a registry, the breakers all its runs share, and the settings of a run; and what
//! a run returns.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rhai::{Engine, AST};
use serde::Serialize;
use serde_json::{json, Value};

use crate::dispatch::{
    BreakerConfig, Breakers, Budget, EffectRecord, Progress, Receipt, RunContext,
};
use crate::engine::{self, Limits};
use crate::error::{ErrorKind, RunError};
use crate::ledger::{RunLedger, SpeculationLimits};
use crate::script::{self, Problem};
use crate::speculate::{self, Scout};
use crate::sync::lock;
use crate::tool::{self, Format, Registry};

/// How a run dispatches its reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Mode {
    /// The executor alone: every call blocks the script until its result is there.
    Sequential,
    /// The executor, plus the scout starting reads early and in parallel.
    #[default]
    Speculative,
}

impl Mode {
    /// `Sequential` when `sequential` is set (a `--sequential` flag, a request's option), else
    /// `Speculative`.
    pub fn sequential_if(sequential: bool) -> Mode {
        if sequential {
            Mode::Sequential
        } else {
            Mode::Speculative
        }
    }

    /// The mode's name, as in `stats.mode`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Sequential => "sequential",
            Mode::Speculative => "speculative",
        }
    }
}

/// Runs scripts against one registry. Cheap to share: runs take `&self`, and the per-tool
/// circuit breakers are shared by all of them.
pub struct Runtime {
    registry: Arc<Registry>,
    breakers: Arc<Breakers>,
    limits: Limits,
    budget: Budget,
    speculation: SpeculationLimits,
    /// Compiles scripts and answers `check`; runs get engines of their own.
    compiler: Engine,
    /// The function names of the tools that are not reads, for the scout's rewrite.
    effectful: std::collections::HashSet<String>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("registry", &self.registry)
            .field("limits", &self.limits)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

/// Settings of a [`Runtime`] beyond its registry.
#[derive(Debug, Default)]
#[must_use]
pub struct RuntimeBuilder {
    registry: Registry,
    limits: Limits,
    budget: Budget,
    breaker: BreakerConfig,
    speculation: SpeculationLimits,
}

impl RuntimeBuilder {
    /// Sets the script limits of every run.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Sets the budget of every run.
    pub fn budget(mut self, budget: Budget) -> Self {
        self.budget = budget;
        self
    }

    /// Sets when breakers open and how long they stay open.
    pub fn breaker(mut self, breaker: BreakerConfig) -> Self {
        self.breaker = breaker;
        self
    }

    /// Sets the caps on speculation.
    pub fn speculation(mut self, speculation: SpeculationLimits) -> Self {
        self.speculation = speculation;
        self
    }

    /// Builds the runtime.
    pub fn build(self) -> Runtime {
        let effectful = self
            .registry
            .iter()
            .filter(|t| t.spec.effect != crate::tool::Effect::Read)
            .flat_map(|t| [t.spec.name.clone(), t.function_name().to_string()])
            .collect();
        Runtime {
            effectful,
            speculation: self.speculation,
            compiler: engine::new_engine(&self.limits, engine::Watch::default()),
            registry: Arc::new(self.registry),
            breakers: Arc::new(Breakers::new(self.breaker)),
            limits: self.limits,
            budget: self.budget,
        }
    }
}

/// A compiled script, ready to run any number of times.
#[derive(Clone, Debug)]
pub struct Script {
    ast: Arc<AST>,
    /// The same script rewritten for the scout, whose branch conditions and the like go
    /// through functions it controls.
    scout_ast: Arc<AST>,
}

/// Options of one run.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct RunOptions {
    /// How reads are dispatched.
    pub mode: Mode,
    /// Counters to watch while the run goes on.
    pub progress: Option<Arc<Progress>>,
    /// The file receipts are appended to as calls finish (see [`RunOptions::receipts`]).
    receipts: Option<Arc<std::sync::Mutex<Option<crate::dispatch::Sink>>>>,
}

impl RunOptions {
    /// Options for a run in `mode`.
    pub fn with_mode(mode: Mode) -> RunOptions {
        RunOptions {
            mode,
            ..RunOptions::default()
        }
    }

    /// Sets the counters to watch while the run goes on.
    pub fn progress(mut self, progress: Arc<Progress>) -> RunOptions {
        self.progress = Some(progress);
        self
    }

    /// Appends the run's receipts to a new file at `path` (created, or truncated) as each
    /// becomes final: an executor's call when it finishes, a speculative one when it is
    /// claimed or the run ends. If an append fails, the run makes no further call and fails
    /// with `internal`. The options are for one run: a second run with them writes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Io`](crate::Error::Io) when the file cannot be created.
    pub fn receipts(mut self, path: &std::path::Path) -> Result<RunOptions, crate::Error> {
        let sink = crate::dispatch::Sink::create(path)?;
        self.receipts = Some(Arc::new(std::sync::Mutex::new(Some(sink))));
        Ok(self)
    }
}

/// Counts and timing of one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Stats {
    /// How reads were dispatched.
    pub mode: Mode,
    /// Wall-clock time of the run, in milliseconds.
    pub wall_ms: f64,
    /// Tool calls the script made, including those answered by an earlier identical read.
    pub tool_calls: u64,
    /// Calls that entered the dispatch path.
    pub dispatched: u64,
    /// Reads started by speculation.
    pub speculative_launched: u64,
    /// Of those, reads the executor claimed.
    pub speculative_claimed: u64,
    /// Of those, reads nobody needed.
    pub speculative_wasted: u64,
    /// Reads answered by an identical read earlier in the same epoch.
    pub deduplicated: u64,
    /// Non-read calls the script made.
    pub effectful_calls: u64,
    /// Passes of the scout over the script.
    pub scout_passes: u64,
    /// Interpreter operations of the executor; not in the JSON output.
    #[serde(skip)]
    pub script_operations: u64,
    /// Interpreter operations of all scout passes; not in the JSON output.
    #[serde(skip)]
    pub scout_operations: u64,
}

/// Everything a run produced: its value or error, logs, effects, stats and receipts.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RunOutcome {
    /// The run's id, as in its receipts.
    pub run_id: String,
    /// The script's value, or the error that ended it.
    pub result: Result<Value, RunError>,
    /// Captured `print` and `debug` lines.
    pub logs: Vec<String>,
    /// Non-read calls that reached their tool, in order.
    pub effects: Vec<EffectRecord>,
    /// Counts and timing.
    pub stats: Stats,
    /// One receipt per dispatch, chained by hash.
    pub receipts: Vec<Receipt>,
}

impl RunOutcome {
    /// The JSON object that `toolscript run --json` prints.
    pub fn to_json(&self) -> Value {
        let mut out = json!({
            "ok": self.result.is_ok(),
            "logs": self.logs,
            "effects": self.effects,
            "stats": self.stats,
            "receipts": {
                "head": self.receipts.last().map(|r| r.hash.as_str()),
                "count": self.receipts.len(),
            },
        });
        match &self.result {
            Ok(value) => out["value"] = value.clone(),
            Err(e) => out["error"] = e.to_json(),
        }
        out
    }

    fn before_running(error: RunError) -> RunOutcome {
        RunOutcome {
            run_id: new_run_id(),
            result: Err(error),
            logs: Vec::new(),
            effects: Vec::new(),
            stats: Stats::default(),
            receipts: Vec::new(),
        }
    }
}

impl Runtime {
    /// A runtime over `registry` with default limits, budget and breakers.
    pub fn new(registry: Registry) -> Runtime {
        Runtime::builder(registry).build()
    }

    /// Starts a runtime over `registry`.
    pub fn builder(registry: Registry) -> RuntimeBuilder {
        RuntimeBuilder {
            registry,
            ..RuntimeBuilder::default()
        }
    }

    /// The tools this runtime calls.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The API of the tools, as a model reads it.
    pub fn describe(&self, format: Format) -> String {
        tool::describe(&self.registry, format)
    }

    /// Compiles a script.
    ///
    /// # Errors
    ///
    /// `invalid_script`, with the line and column of the first syntax error (or of the first
    /// function over `Limits::max_functions`); `limit_exceeded` for a script longer than
    /// `Limits::max_script_bytes`.
    pub fn compile(&self, source: &str) -> Result<Script, RunError> {
        if source.len() > self.limits.max_script_bytes {
            return Err(RunError::new(
                ErrorKind::LimitExceeded,
                format!(
                    "the script is {} bytes; at most {} may be compiled",
                    source.len(),
                    self.limits.max_script_bytes
                ),
            ));
        }
        let ast = self
            .compiler
            .compile(source)
            .map_err(|e| engine::from_parse(&e))?;
        let scout_ast = Arc::new(speculate::rewrite_with(&ast, &self.effectful));
        Ok(Script {
            ast: Arc::new(ast),
            scout_ast,
        })
    }

    /// Compiles a script and checks it without running a tool: calls to functions that exist
    /// nowhere, unknown literal tool names, tool functions given more than one argument.
    ///
    /// # Errors
    ///
    /// `invalid_script` when it does not compile.
    pub fn check(&self, source: &str) -> Result<Vec<Problem>, RunError> {
        let script = self.compile(source)?;
        Ok(script::check(&self.compiler, &script.ast, &self.registry))
    }

    /// Compiles and runs a script with default options.
    pub async fn run(&self, source: &str) -> RunOutcome {
        self.run_with(source, RunOptions::default()).await
    }

    /// Compiles and runs a script; a compile error is the run's `invalid_script` error.
    pub async fn run_with(&self, source: &str, options: RunOptions) -> RunOutcome {
        match self.compile(source) {
            Ok(script) => self.run_script(&script, options).await,
            Err(e) => RunOutcome::before_running(e),
        }
    }

    /// Runs a compiled script. Must be called within a tokio runtime: tool calls run on it while
    /// the script runs on a thread of its own.
    pub async fn run_script(&self, script: &Script, options: RunOptions) -> RunOutcome {
        let run_id = new_run_id();
        let span = tracing::info_span!("run", run_id = %run_id);
        let _entered = span.enter();
        let started = std::time::Instant::now();
        // The run's one deadline, from now: the script, the scout and every call meet the same.
        let mut limits = self.limits.clone();
        limits.max_duration = limits.max_duration.min(self.budget.wall_clock);
        let deadline = started + limits.max_duration;
        let sink = options.receipts.as_ref().and_then(|s| lock(s).take());
        let ctx = Arc::new(RunContext::new(
            Arc::clone(&self.registry),
            Arc::clone(&self.breakers),
            self.budget.clone(),
            limits.max_duration,
            run_id.clone(),
            options.progress.unwrap_or_default(),
            sink,
        ));
        let handle = tokio::runtime::Handle::current();
        let ledger = Arc::new(RunLedger::new(Arc::clone(&ctx), self.speculation.clone()));
        let scout = (options.mode == Mode::Speculative).then(|| {
            let scout = Scout::new(
                Arc::clone(&ctx),
                Arc::clone(&ledger),
                Arc::clone(&script.scout_ast),
                limits.clone(),
                deadline,
                handle.clone(),
            );
            (Arc::clone(&scout), tokio::spawn(scout.drive()))
        });
        let (tx, rx) = tokio::sync::oneshot::channel();
        // Dropping this run's future (a client gave up) cancels the script and the scout.
        let cancel = StopOnDrop::new(
            Arc::clone(&ledger),
            scout.as_ref().map(|s| Arc::clone(&s.0)),
        );
        let (ast, thread_ctx, thread_ledger) = (
            Arc::clone(&script.ast),
            Arc::clone(&ctx),
            Arc::clone(&ledger),
        );
        let watch = engine::Watch {
            deadline: Some(deadline),
            cancel: Some(Arc::clone(&cancel.flag)),
            ..engine::Watch::default()
        };
        let spawned = engine::spawn_script_thread("toolscript-script", move || {
            let execution =
                script::execute(&ast, thread_ctx, thread_ledger, handle, &limits, watch);
            let _ = tx.send(execution);
        });
        drop(_entered);
        let execution = match spawned {
            Ok(_) => rx.await.ok(),
            Err(e) => {
                tracing::error!(error = %e, "could not start the script thread");
                None
            }
        };
        ledger.close();
        let (mut scout_passes, mut scout_operations) = (0, 0);
        if let Some((scout, driver)) = scout {
            scout.finish().await;
            scout_passes = driver.await.unwrap_or_default();
            scout_operations = scout.operations();
        }
        let open = ctx.settled(SETTLE).await;
        if open > 0 {
            tracing::warn!(
                open,
                "calls still running when the run ended have no receipt"
            );
        }
        let execution = execution.unwrap_or_else(|| script::Execution {
            result: Err(RunError::new(
                ErrorKind::Internal,
                "the script thread stopped without a result",
            )),
            logs: Vec::new(),
            counts: Default::default(),
        });
        let (launched, claimed) = ledger.counts();
        let stats = Stats {
            mode: options.mode,
            wall_ms: started.elapsed().as_secs_f64() * 1e3,
            tool_calls: execution.counts.tool_calls,
            dispatched: ctx.dispatched(),
            speculative_launched: launched,
            speculative_claimed: claimed,
            speculative_wasted: launched - claimed,
            deduplicated: execution.counts.deduplicated,
            effectful_calls: execution.counts.effectful_calls,
            scout_passes,
            script_operations: execution.counts.operations,
            scout_operations,
        };
        RunOutcome {
            run_id,
            result: execution.result,
            logs: execution.logs,
            effects: ctx.take_effects(),
            stats,
            receipts: ctx.take_receipts(),
        }
    }
}

/// Ends a run's script and scout when the run's future is dropped before it finished.
struct StopOnDrop {
    flag: Arc<std::sync::atomic::AtomicBool>,
    ledger: Arc<RunLedger>,
    scout: Option<Arc<Scout>>,
}

impl StopOnDrop {
    fn new(ledger: Arc<RunLedger>, scout: Option<Arc<Scout>>) -> StopOnDrop {
        StopOnDrop {
            flag: Arc::default(),
            ledger,
            scout,
        }
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.flag.store(true, Ordering::SeqCst);
        self.ledger.close();
        if let Some(scout) = &self.scout {
            scout.stop();
        }
    }
}

/// How long a run waits, after its script ended, for abandoned calls to write their receipts.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(5);

/// A run id unique within the process and unlikely to repeat across processes.
fn new_run_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let seed = format!(
        "{nanos}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    crate::json::sha256_hex(&seed)[..16].to_string()
}
