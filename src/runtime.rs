//! The runtime: a registry, the breakers all its runs share, and the settings of a run; and what
//! a run returns.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rhai::{Engine, AST};
use serde::Deserialize;
use serde_json::Value;

use crate::dispatch::{
    BreakerConfig, Breakers, Budget, EffectRecord, Progress, Receipt, RunContext,
};
use crate::engine::{self, Limits};
use crate::error::{ErrorKind, LimitReached, RunError};
use crate::ledger::{RunLedger, SpeculationLimits};
use crate::plan::{PlanBook, PlannedCall};
use crate::report::{Mode, ReceiptChain, RunEnd, RunReport, Stats};
use crate::script::{self, Awaiting, Problem};
use crate::speculate::{self, Scout};

use crate::store::{
    Fence, Journal, PendingCall, RunRecord, RunStatus, Store, StoredEnd, TakeDecision, TakeRefused,
    Verdict,
};
use crate::sync::lock;
use crate::tool::{self, Effect, Format, Registry};
use tokio_util::sync::CancellationToken;
use tracing::Span;

mod stream;
pub use stream::StreamedRun;

/// Runs scripts against one registry. Cheap to share: runs take `&self`, and the per-tool
/// circuit breakers are shared by all of them.
pub struct Runtime {
    registry: Arc<Registry>,
    breakers: Arc<Breakers>,
    limits: Limits,
    speculation: SpeculationLimits,
    /// Compiles scripts and answers `check`; runs get engines of their own.
    compiler: Engine,
    /// The function names of the tools that are not reads, for the scout's rewrite.
    effectful: std::collections::HashSet<String>,
    /// The names of tools whose calls may pause the run (an approval, a guard that may ask).
    pausing: std::collections::HashSet<String>,
    /// Where runs are journaled, when they are durable.
    store: Option<Arc<dyn Store>>,
    /// SHA-256 of the catalog as `tools --format json` prints it: the rule a run stored
    /// before fingerprints is judged by.
    catalog_sha256: String,
    /// The fingerprint of each tool: a resume refuses a catalog in which one of the run's
    /// tools changed how it behaves.
    catalog: crate::store::CatalogPrint,
    /// The field names some tool's output schema declares: a read of one that finds it
    /// missing is no warning (the field may be optional).
    declared_fields: std::collections::HashSet<String>,
    /// Where cached reads are kept: the store, or memory shared by the runtime's runs.
    cache: crate::dispatch::CacheBackend,
    /// SHA-256 of each tool's fingerprint, by name: part of a cached read's key.
    cache_prints: Arc<std::collections::HashMap<String, String>>,
    /// Every run goes without the cache (see [`Runtime::without_cache`]).
    no_cache: bool,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("registry", &self.registry)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// Settings of a [`Runtime`] beyond its registry.
#[derive(Debug, Default)]
#[must_use]
pub struct RuntimeBuilder {
    registry: Registry,
    limits: Limits,
    breaker: BreakerConfig,
    speculation: SpeculationLimits,
    store: Option<Arc<dyn Store>>,
}

impl RuntimeBuilder {
    /// Journals every run in `store` (unless its options say [`RunOptions::no_store`]), so
    /// that it can pause for approvals and be resumed after a crash.
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// Sets the limits and budgets of every run.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
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

    /// Builds the runtime. With a store, the registry gains `ts_artifact`, the read that gives
    /// a script an artifact of an earlier run (or one of its pages).
    pub fn build(mut self) -> Runtime {
        // What every run's engine and every speculative run share is built with the
        // runtime, so that it counts against a run's memory budget the same in both modes and
        // in the first run as in later ones.
        crate::engine::prepare();
        crate::speculate::prepare();
        if let Some(store) = &self.store {
            match self
                .registry
                .with_tool(artifact_tool(Arc::clone(store), None))
            {
                Ok(registry) => self.registry = registry,
                Err(e) => tracing::warn!(error = %e, "`ts_artifact` is not offered"),
            }
        }
        let effectful = self
            .registry
            .iter()
            .filter(|t| t.spec.effect != crate::tool::Effect::Read)
            .flat_map(|t| [t.spec.name.clone(), t.function_name().to_string()])
            .collect();
        // The tools whose calls may pause the run for a person: the scout starts nothing past
        // one (a branch that calls one is guessed taken, so a pass stops at the call).
        let guard = self.registry.guard();
        let pausing = self
            .registry
            .iter()
            .filter(|t| {
                t.spec.approval == tool::Approval::Always
                    || guard.may_ask(&t.spec.name, &t.spec.guard)
            })
            .flat_map(|t| [t.spec.name.clone(), t.function_name().to_string()])
            .collect();
        let catalog = tool::describe(&self.registry, Format::Json);
        let prints = tool::fingerprint(&self.registry);
        let cache_prints = prints
            .0
            .iter()
            .map(|(name, print)| {
                let json = serde_json::to_value(print).unwrap_or_default();
                (name.clone(), crate::json::jcs_value_sha256(&json))
            })
            .collect();
        let cache = match &self.store {
            Some(store) => crate::dispatch::CacheBackend::Store(Arc::clone(store)),
            None => crate::dispatch::CacheBackend::Memory(Arc::new(
                crate::store::MemoryCache::new(crate::dispatch::MEMORY_CACHE_BYTES),
            )),
        };
        let mut compiler = engine::new_engine(&self.limits, engine::RunControls::default());
        crate::rhai_ast::fields::compiler_for_sites(&mut compiler);
        Runtime {
            declared_fields: self.registry.declared_fields(),
            effectful,
            pausing,
            store: self.store,
            catalog_sha256: crate::json::sha256_hex(&catalog),
            catalog: prints,
            cache,
            cache_prints: Arc::new(cache_prints),
            no_cache: false,
            speculation: self.speculation,
            compiler,
            registry: Arc::new(self.registry),
            breakers: Arc::new(Breakers::new(self.breaker)),
            limits: self.limits,
        }
    }
}

/// A compiled script, ready to run any number of times.
#[derive(Clone, Debug)]
pub struct Script {
    ast: Arc<AST>,
    /// The same script rewritten for the scout, whose branch conditions and the like (in the
    /// main body and in functions and closures) go through functions it controls.
    scout: Arc<speculate::ScoutScript>,
    /// Whether it may call a read the scout could start: a script that calls none has no
    /// scout (it would only repeat the script's work).
    scouted: bool,
    /// The reads the scout could start that it names (each once).
    reads: Arc<[Arc<str>]>,
    /// The text it was compiled from: a durable run keeps it, and a resume runs it again.
    source: Arc<str>,
    /// Where the executor watches for reads of missing fields; `None` when nowhere.
    fields: Option<Arc<crate::rhai_ast::fields::FieldPlan>>,
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
    /// Not journaled even though the runtime has a store.
    no_store: bool,
    /// The script's name in the store's list of runs.
    script_name: Option<String>,
    /// What happens to a value that does not fit in the run's output and is no tool's result.
    result_policy: crate::policy::ResultPolicy,
    /// The script's `input`.
    input: Option<Arc<Value>>,
    /// The value every tool body of the run is given.
    context: Option<Arc<Value>>,
    /// Every read is dispatched: the cache of reads across runs neither answers nor keeps.
    no_cache: bool,
    /// Whether non-read calls are refused.
    sandbox: crate::dispatch::Sandbox,
    /// The recorded reads that answer the run's reads.
    fixtures: Option<Arc<crate::dispatch::Fixtures>>,
    /// Where the run's reads are recorded.
    record: Option<Arc<crate::dispatch::Recorder>>,
    /// The plan the run makes or applies.
    plan: Option<Arc<PlanBook>>,
    /// The tenant the run (or plan) is kept under, and the token that started it.
    owner: Option<(String, String)>,
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

    /// Does not journal this run, though the runtime has a store: a throwaway run, which
    /// cannot pause for an approval (it stops there) or be resumed.
    pub fn no_store(mut self) -> RunOptions {
        self.no_store = true;
        self
    }

    /// Runs without the cache of reads across runs: every read reaches its tool, and none is
    /// kept for later runs (an invalidating call still drops the entries it names).
    pub fn no_cache(mut self) -> RunOptions {
        self.no_cache = true;
        self
    }

    /// Sets what happens to the run's value when it does not fit in the output and is not a
    /// tool's result (whose own policy applies): [`ResultPolicy::Auto`](crate::ResultPolicy)
    /// by default.
    pub fn result_policy(mut self, policy: crate::policy::ResultPolicy) -> RunOptions {
        self.result_policy = policy;
        self
    }

    /// Gives the script `input`, which it reads as the constant `input` (without it, `input`
    /// is `()`). A durable run keeps it: a resume gives the script the same input.
    pub fn input(mut self, input: Value) -> RunOptions {
        self.input = Some(Arc::new(input));
        self
    }

    /// Gives every tool body of the run `context` as [`ToolContext::context`](crate::ToolContext)
    /// (a tenant, credentials, a request id; script tools read it as `ctx.context`). It is
    /// never shown to the script, written to receipts or kept in the store: a resume is given
    /// it again by its caller.
    pub fn context(mut self, context: Value) -> RunOptions {
        self.context = Some(Arc::new(context));
        self
    }

    /// Keeps the run (or the plan [`Runtime::plan`] makes) under `tenant`, started by the token
    /// whose SHA-256 begins with `started_by` (`serve --http --auth`; see docs/serving.md).
    pub fn owner(mut self, tenant: impl Into<String>, started_by: impl Into<String>) -> RunOptions {
        self.owner = Some((tenant.into(), started_by.into()));
        self
    }

    /// Names the script in the store's list of runs (its file name, say).
    pub fn script_name(mut self, name: impl Into<String>) -> RunOptions {
        self.script_name = Some(name.into());
        self
    }

    /// Runs in `sandbox`: with [`Sandbox::Fixture`](crate::Sandbox), every non-read call fails
    /// with `side_effect_blocked` (catchable, not recoverable) without reaching its tool, and
    /// its receipt's status is `blocked`; reads run (or are answered by
    /// [`RunOptions::fixtures`]). See docs/fixtures.md.
    pub fn sandbox(mut self, sandbox: crate::dispatch::Sandbox) -> RunOptions {
        self.sandbox = sandbox;
        self
    }

    /// Records each read the run uses in a new fixtures file at `path` (created, or
    /// truncated), one JSON line as each is used: its tool, arguments, occurrence and result or
    /// error. A read whose arguments or outcome hold a secret or a redacted value is not
    /// recorded. The options are for one run: every run given them appends to the same file.
    ///
    /// # Errors
    ///
    /// [`Error::Fixture`](crate::Error::Fixture) when the file cannot be created.
    pub fn record(mut self, path: &std::path::Path) -> Result<RunOptions, crate::Error> {
        self.record = Some(Arc::new(crate::dispatch::Recorder::create(path)?));
        Ok(self)
    }

    /// Answers the run's reads from the fixtures file at `path` (one that
    /// [`RunOptions::record`] wrote) without calling their tools: a read the file lacks fails
    /// with `fixture_missing`. Reads nested in a composite's body are not answered from it.
    ///
    /// # Errors
    ///
    /// [`Error::Fixture`](crate::Error::Fixture) when the file cannot be read, or a line of it
    /// (named) is malformed.
    pub fn fixtures(mut self, path: &std::path::Path) -> Result<RunOptions, crate::Error> {
        self.fixtures = Some(Arc::new(crate::dispatch::Fixtures::load(path)?));
        Ok(self)
    }

    /// Appends the receipts of a resumed run to the receipts file at `path`, continuing its
    /// chain: after the file's last receipt, linked to its hash (a torn last line, left by a
    /// crash, is cut off first). A missing or empty file starts a new chain.
    ///
    /// # Errors
    ///
    /// [`Error::Io`](crate::Error::Io) when the file cannot be opened or read;
    /// [`Error::Receipt`](crate::Error::Receipt) when its last receipt cannot be read.
    pub fn append_receipts(mut self, path: &std::path::Path) -> Result<RunOptions, crate::Error> {
        let sink = crate::dispatch::Sink::append(path)?;
        self.receipts = Some(Arc::new(std::sync::Mutex::new(Some(sink))));
        Ok(self)
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
    /// The call a paused run waits at.
    pub pending: Option<PendingCall>,
    /// Reads of fields the maps did not have, which the script did not handle: one per place
    /// in the script, in the order they first happened, at most 20.
    pub warnings: Vec<crate::Warning>,
    /// Places that read a missing field besides those in `warnings`.
    pub warnings_left_out: usize,
    /// The output as a model receives it: value, logs and error within
    /// `Limits::max_inline_tokens` (`None` for a run that stopped before it ran).
    bounded: Option<crate::policy::Bounded>,
    /// The artifacts holding what the bounded output left out.
    pub artifacts: Vec<crate::policy::Artifact>,
    /// For a run that applied a plan and ended: the planned calls it never reached.
    pub unapplied: Vec<PlannedCall>,
    /// The run's journal could not be written: it stopped, resumable, rather than failed.
    interrupted: bool,
}

/// A person's decision on the call a paused run waits at.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// Make the call that waits for approval.
    Approve,
    /// Make the call the guard asked about, and every later call in this run that the same
    /// rule asks about (never a blanket allow: other rules still ask).
    ApproveRule,
    /// Do not make it: the call throws a catchable `rejected` error at its call site.
    Reject {
        /// Why, for the script (and the model) to read.
        reason: Option<String>,
    },
    /// The call whose outcome was lost took effect: take it as made, with a null result.
    Done,
    /// The call whose outcome was lost did not take effect: make it again (with the same
    /// idempotency key).
    Retry,
}

/// What a decision on the pending call journals; an error when the decision does not fit it.
fn verdict(decision: &Decision, pending: &PendingCall) -> Result<Verdict, String> {
    let tool = pending.tool.as_str();
    Ok(match decision {
        Decision::Approve => Verdict::Approve,
        Decision::ApproveRule => match &pending.rule {
            Some(rule) => Verdict::ApproveRule(rule.clone()),
            None => {
                return Err(format!(
                    "`{tool}` waits for its tool's own approval, not for a rule of the guard: approve it (--approve) or reject it"
                ))
            }
        },
        Decision::Reject { reason } => {
            let reason = reason.as_deref().unwrap_or("no reason given");
            Verdict::Reject(
                crate::error::ToolError::new(
                    ErrorKind::Rejected,
                    format!("a person rejected this call: {reason}"),
                )
                .for_tool(tool),
            )
        }
        Decision::Done => Verdict::Done,
        Decision::Retry => Verdict::Retry,
    })
}

/// What a paused run waits for, as a resume's refusal says it.
fn waits_for(awaiting: Awaiting) -> &'static str {
    match awaiting {
        Awaiting::Approval => "a decision on its approval: --approve or --reject",
        Awaiting::Resolve => {
            "word on whether its last call took effect: --resolve done or --resolve retry"
        }
        Awaiting::PlanDivergence => {
            "a decision on a call its plan did not plan: --approve (make it) or --reject"
        }
    }
}

/// Why a decision is refused for a run that is not paused.
fn not_paused(status: RunStatus) -> String {
    match status {
        RunStatus::Interrupted => "the run is not paused (it was interrupted before its end): resume it without a decision".into(),
        _ => "the run is not paused (its process stopped while it ran): resume it without a decision".into(),
    }
}

/// Why the store refused to take the run as it is `now`, for a decision on call `asked` (or
/// none).
fn stale(now: &RunRecord, asked: Option<u64>) -> String {
    let pending = now
        .pending
        .as_ref()
        .filter(|_| now.status == RunStatus::Paused);
    match (pending, asked) {
        (Some(p), Some(seq)) if p.seq != seq => format!(
            "the run moved on; it now waits at {} `{}` for {}",
            p.place(),
            p.tool,
            waits_for(p.awaiting)
        ),
        (Some(p), _) => format!("the run waits for {}", waits_for(p.awaiting)),
        (None, Some(seq)) => format!(
            "the run moved on: it no longer waits at #{seq}, and {}",
            not_paused(now.status).trim_start_matches("the run ")
        ),
        (None, None) => not_paused(now.status),
    }
}

impl RunOutcome {
    /// Where the run is: `completed`, `failed`, `paused` at [`RunOutcome::pending`], or
    /// `interrupted` (its journal could not be written; `resume` goes on with it).
    pub fn status(&self) -> RunStatus {
        match (&self.pending, &self.result) {
            (Some(_), _) => RunStatus::Paused,
            (None, Err(_)) if self.interrupted => RunStatus::Interrupted,
            (None, Ok(_)) => RunStatus::Completed,
            (None, Err(_)) => RunStatus::Failed,
        }
    }

    /// The outcome as a model receives it (value, logs and error bounded), the form that
    /// `toolscript run --json` prints.
    pub fn report(&self) -> RunReport {
        self.report_naming(LimitReached::library_name)
    }

    /// As [`RunOutcome::report`], with the limit the run reached (if any) named by `name`: how
    /// a front end tells its reader which setting to raise (a flag, a manifest key).
    pub fn report_naming(&self, name: impl Fn(&LimitReached) -> String) -> RunReport {
        let bounded = self.bounded.as_ref();
        let end = match (&self.pending, &self.result) {
            (Some(pending), _) => RunEnd::Paused {
                pending: bounded
                    .and_then(|b| b.pending.clone())
                    .unwrap_or_else(|| pending.clone()),
            },
            (None, Ok(value)) => RunEnd::Completed {
                value: bounded
                    .and_then(|b| b.value.clone())
                    .unwrap_or_else(|| value.clone()),
            },
            (None, Err(e)) => {
                let error = bounded
                    .and_then(|b| b.error.as_ref())
                    .unwrap_or(e)
                    .report(name);
                match self.interrupted {
                    true => RunEnd::Interrupted { error },
                    false => RunEnd::Failed { error },
                }
            }
        };
        let effects_shown = bounded.map_or(self.effects.len(), |b| b.effects_shown);
        let effects_shown = effects_shown.min(self.effects.len());
        let artifacts_shown = bounded
            .map_or(self.artifacts.len(), |b| b.artifacts_shown)
            .min(self.artifacts.len());
        RunReport {
            run_id: self.run_id.clone(),
            end,
            ok: self.result.is_ok(),
            logs: bounded.map_or_else(|| self.logs.clone(), |b| b.logs.clone()),
            warnings: bounded.map_or_else(|| self.warnings.clone(), |b| b.warnings.clone()),
            warnings_left_out: self.warnings_left_out + bounded.map_or(0, |b| b.warnings_left_out),
            effects: self.effects[..effects_shown].to_vec(),
            effects_left_out: self.effects.len() - effects_shown,
            effects_artifact: bounded.and_then(|b| b.effects_artifact.clone()),
            stats: Some(self.stats.clone()),
            receipts: ReceiptChain {
                head: self.receipts.last().map(|r| r.hash.to_string()),
                count: self.receipts.len(),
            },
            artifacts: self.artifacts[..artifacts_shown].to_vec(),
            artifacts_left_out: self.artifacts.len() - artifacts_shown,
            unapplied: self.unapplied.clone(),
        }
    }

    /// The JSON object that `toolscript run --json` prints: [`RunOutcome::report`] as JSON.
    pub fn to_json(&self) -> Value {
        self.report().to_json()
    }

    fn before_running(error: RunError) -> RunOutcome {
        RunOutcome {
            run_id: new_run_id(),
            result: Err(error),
            logs: Vec::new(),
            effects: Vec::new(),
            stats: Stats::default(),
            receipts: Vec::new(),
            pending: None,
            warnings: Vec::new(),
            warnings_left_out: 0,
            bounded: None,
            artifacts: Vec::new(),
            unapplied: Vec::new(),
            interrupted: false,
        }
    }
}

impl Runtime {
    /// Whether a run's journal keeps keyed digests: its tools may hand it a secret (the
    /// registry has some, or this process fetched some) or a redacted value.
    fn keyed(&self) -> bool {
        !self.registry.secrets().is_empty()
            || !crate::secrets::process_mask().is_empty()
            || self.registry.redacts()
    }

    /// A runtime over `registry` with default limits and breakers.
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

    /// Whether a speculative run of `script` has a scout: it names a read the scout could
    /// start, and one that is not quick ([`tool::Pace`]), unless quick reads are not held.
    /// A scout over quick reads alone would hold every one for the executor: it would only
    /// repeat the script's work.
    fn worth_a_scout(&self, script: &Script) -> bool {
        script.scouted
            && (!self.speculation.hold_quick
                || script
                    .reads
                    .iter()
                    .any(|name| self.registry.get(name).is_none_or(|t| !t.pace.is_quick())))
    }

    /// The tokens an answer of this runtime's runs may take (`max_inline_tokens`, at least
    /// [`crate::MIN_INLINE_TOKENS`]).
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) fn inline_budget(&self) -> usize {
        self.limits
            .max_inline_tokens
            .max(crate::policy::MIN_INLINE_TOKENS)
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
            let message = format!(
                "the script is {} bytes; at most {} may be compiled",
                source.len(),
                self.limits.max_script_bytes,
            );
            return Err(engine::limit_exceeded(
                message,
                "max_script_bytes",
                &self.limits,
            ));
        }
        let ast = self
            .compiler
            .compile(&*crate::rhai_ast::mark_escapes(source))
            .map_err(|e| engine::from_parse(source, &e, &self.limits))?;
        let ast = engine::rewrite_catches(ast);
        let scout = Arc::new(speculate::ScoutScript::new(
            &ast,
            &self.effectful,
            &self.pausing,
        ));
        let declared = &self.declared_fields;
        let fields = crate::rhai_ast::fields::FieldPlan::new(&ast, &|name| declared.contains(name))
            .map(Arc::new);
        let registry = &self.registry;
        let reads = std::cell::RefCell::new(Vec::<Arc<str>>::new());
        // Every name is looked at (the test never says it found one).
        crate::rhai_ast::names_one_of(&ast, |name| {
            let tool = registry.get(name);
            if let Some(tool) = tool.filter(|t| t.spec.effect == Effect::Read && t.speculable) {
                let mut reads = reads.borrow_mut();
                if !reads.contains(&tool.name) {
                    reads.push(Arc::clone(&tool.name));
                }
            }
            false
        });
        let reads: Arc<[Arc<str>]> = reads.into_inner().into();
        Ok(Script {
            ast: Arc::new(ast),
            scout,
            scouted: !reads.is_empty(),
            reads,
            source: Arc::from(source),
            fields,
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

    /// Makes every run of this runtime go without the cache of reads across runs, as
    /// [`RunOptions::no_cache`] does for one run (`serve --no-cache`, `bench` without `--cache`).
    pub fn without_cache(mut self) -> Runtime {
        self.no_cache = true;
        self
    }

    /// The limits and budgets of every run.
    pub fn run_limits(&self) -> &Limits {
        &self.limits
    }

    /// What the tenant `tenant` of `serve --http --auth` runs on: the same tools and store
    /// under its `limits`, with circuit breakers of its own, and cached reads of its own (the
    /// tenant is part of each key, so that one tenant's reads never answer another's; an
    /// invalidating call still drops the entries it names for all).
    ///
    /// # Errors
    ///
    /// The registry's error when its `ts_artifact` cannot be replaced by the tenant's.
    pub fn for_tenant(&self, tenant: &str, limits: Limits) -> Result<Runtime, crate::Error> {
        let cache_prints = self
            .cache_prints
            .iter()
            .map(|(name, print)| {
                let keyed = crate::json::sha256_hex(format!("{print}\ntenant\n{tenant}"));
                (name.clone(), keyed)
            })
            .collect();
        let mut compiler = engine::new_engine(&limits, engine::RunControls::default());
        crate::rhai_ast::fields::compiler_for_sites(&mut compiler);
        // `ts_artifact` reads only the tenant's artifacts.
        let registry = match &self.store {
            Some(store) => {
                let tool = artifact_tool(Arc::clone(store), Some(tenant.to_string()));
                Arc::new(self.registry.replacing_own(tool)?)
            }
            None => Arc::clone(&self.registry),
        };
        Ok(Runtime {
            registry,
            breakers: Arc::new(Breakers::new(self.breakers.config().clone())),
            limits,
            speculation: self.speculation.clone(),
            compiler,
            effectful: self.effectful.clone(),
            pausing: self.pausing.clone(),
            store: self.store.clone(),
            catalog_sha256: self.catalog_sha256.clone(),
            catalog: self.catalog.clone(),
            declared_fields: self.declared_fields.clone(),
            cache: self.cache.clone(),
            cache_prints: Arc::new(cache_prints),
            no_cache: self.no_cache,
        })
    }

    /// The store runs are journaled in, if any.
    pub fn store(&self) -> Option<&Arc<dyn Store>> {
        self.store.as_ref()
    }

    /// Runs a compiled script. Must be called within a tokio runtime: tool calls run on it while
    /// the script runs on a thread of its own. With a store (and without
    /// [`RunOptions::no_store`]) the run is journaled: it can pause for approvals and be
    /// resumed after a crash.
    pub async fn run_script(&self, script: &Script, options: RunOptions) -> RunOutcome {
        if let Err(why) = self.room_for_a_run() {
            return RunOutcome::before_running(why);
        }
        let run_id = new_run_id();
        let held = match (&self.store, options.no_store) {
            (Some(store), false) => match self.record_run(store, script, &options, &run_id).await {
                Ok(held) => Some(held),
                Err(e) => {
                    return RunOutcome::before_running(RunError::new(
                        ErrorKind::Internal,
                        format!("the run could not be recorded: {}", e.report()),
                    ))
                }
            },
            _ => None,
        };
        self.execute(script, options, run_id, held).await
    }

    /// Whether a new run may start: not while other runs share a process that already holds
    /// most of the memory budget (`unavailable`, recoverable), so that one more run never ends
    /// the ones going on.
    fn room_for_a_run(&self) -> Result<(), RunError> {
        engine::room_for_a_run(self.limits.max_memory_mb).map_err(|why| {
            let mut e = RunError::new(ErrorKind::Unavailable, why);
            e.recoverable = true;
            e
        })
    }

    /// Records the new run `run_id` of `script` in `store`, and opens its journal; what it
    /// gives records the run's end should it be dropped before the run ends.
    async fn record_run(
        &self,
        store: &Arc<dyn Store>,
        script: &Script,
        options: &RunOptions,
        run_id: &str,
    ) -> Result<InterruptOnDrop, crate::Error> {
        let mut record = RunRecord::new(
            run_id.to_string(),
            options.script_name.clone().unwrap_or_else(|| "-".into()),
            script.source.to_string(),
            self.catalog_sha256.clone(),
            options.mode,
        );
        record.input = options.input.as_deref().cloned();
        record.catalog = Some(self.catalog.clone());
        if let Some((tenant, started_by)) = &options.owner {
            record.tenant = Some(tenant.clone());
            record.started_by = Some(started_by.clone());
        }
        record.context_digest = context_digest(store, options).await?;
        // This process holds the new run's lease (token 1; the store sets its times).
        let claim = crate::store::Claim::this_process();
        record.lease = Some(crate::store::Lease::new(&claim, 1, 0, 0));
        let fence = Some(Fence::new(claim.owner, 1));
        let creating = {
            let store = Arc::clone(store);
            async move {
                store.create_run(record).await?;
                Ok(Ok::<_, std::convert::Infallible>(((), fence)))
            }
        };
        let Ok(((), held)) = own(store, run_id, self.keyed(), creating).await?;
        Ok(held)
    }

    /// Plans a script: it runs with real reads (speculated as `options.mode` says), and no
    /// non-read call is made; each is recorded, in order, and answered with its tool's
    /// `plan_result`. With a store, the plan is kept there for [`Runtime::apply`]; without,
    /// it is shown only. See docs/plans.md.
    ///
    /// # Errors
    ///
    /// [`Error::Plan`](crate::Error::Plan) when the script does not compile;
    /// [`Error::Store`](crate::Error::Store) when the plan cannot be kept.
    pub async fn plan(
        &self,
        source: &str,
        options: RunOptions,
    ) -> Result<PlanOutcome, crate::Error> {
        let script = self.compile(source).map_err(|e| crate::Error::Plan {
            plan_id: String::new(),
            message: format!("the script does not compile: {e}"),
        })?;
        self.room_for_a_run().map_err(|e| crate::Error::Plan {
            plan_id: String::new(),
            message: e.message.clone(),
        })?;
        let key = match &self.store {
            Some(store) => Some(store.digest_key().await?),
            None => None,
        };
        let book = Arc::new(PlanBook::planning(key));
        let mut options = options.no_store();
        options.plan = Some(Arc::clone(&book));
        let (script_name, input) = (options.script_name.clone(), options.input.clone());
        let owner = options.owner.clone();
        let mut run = self.execute(&script, options, new_run_id(), None).await;
        let planning = book.as_planning().expect("a planning book");
        let (calls, reads) = planning.take();
        let status = if planning.stopped() {
            if let Err(e) = &mut run.result {
                e.kind = ErrorKind::PlanIncomplete;
            }
            crate::plan::PlanStatus::Incomplete
        } else {
            crate::plan::PlanStatus::Complete
        };
        let created_ms = crate::store::now_ms();
        let mut plan = crate::plan::Plan {
            plan_id: String::new(),
            status,
            created_ms,
            expires_ms: created_ms.saturating_add(
                i64::try_from(self.limits.plan_ttl.as_millis()).unwrap_or(i64::MAX),
            ),
            script_name: script_name.unwrap_or_else(|| "-".into()),
            script: source.to_string(),
            input: input.as_deref().cloned(),
            catalog_sha256: self.catalog_sha256.clone(),
            catalog: Some(self.catalog.clone()),
            calls,
            reads,
            value: run.result.as_ref().ok().cloned(),
            error: run.result.as_ref().err().map(RunError::to_json),
            applied_by: None,
        };
        if let Some(store) = &self.store {
            plan.plan_id = format!("p{}", new_run_id());
            let body = serde_json::to_string(&plan).map_err(|e| crate::Error::Plan {
                plan_id: plan.plan_id.clone(),
                message: format!("the plan cannot be written: {e}"),
            })?;
            let mut stored = crate::store::StoredPlan::new(
                plan.plan_id.clone(),
                plan.created_ms,
                plan.expires_ms,
                body,
            );
            if let Some((tenant, made_by)) = owner {
                stored.tenant = Some(tenant);
                stored.made_by = Some(made_by);
            }
            store.put_plan(stored).await?;
        }
        Ok(PlanOutcome { plan, run })
    }

    /// Applies a plan [`Runtime::plan`] kept: the same script runs for real, as a durable
    /// run. Each non-read call must be the plan's next planned call (tool and arguments): then
    /// it is made, with the approvals it needs given by the plan; any other call pauses the run
    /// (`awaiting: "plan_divergence"`) for a person. Planned calls the run never reached are
    /// [`RunOutcome::unapplied`]. A plan is applied once; a crash while applying is resumed
    /// like any run (`resume`).
    ///
    /// # Errors
    ///
    /// [`Error::Plan`](crate::Error::Plan) when the runtime has no store, the store has no such
    /// plan, it expired, it was applied already, or the catalog changed since it was made;
    /// [`Error::Store`](crate::Error::Store) when the store fails.
    pub async fn apply(
        &self,
        plan_id: &str,
        options: RunOptions,
    ) -> Result<RunOutcome, crate::Error> {
        let refuse = |message: String| crate::Error::Plan {
            plan_id: plan_id.to_string(),
            message,
        };
        let store = self
            .store
            .as_ref()
            .ok_or_else(|| refuse("this runtime has no store, where plans are kept".into()))?;
        let stored = store
            .plan(plan_id)
            .await?
            .ok_or_else(|| refuse(format!("the store {} has no such plan", store.location())))?;
        let plan: crate::plan::Plan = serde_json::from_str(&stored.body)
            .map_err(|e| refuse(format!("the stored plan does not parse: {e}")))?;
        if let Some(run) = &stored.applied_run {
            return Err(refuse(applied_already(run)));
        }
        let now = crate::store::now_ms();
        if now >= stored.expires_ms {
            return Err(refuse(format!(
                "it expired {} s ago (plans wait at most plan_ttl_s): make a new plan, which shows the world as it is now",
                (now - stored.expires_ms) / 1000
            )));
        }
        self.judge_plan_catalog(&plan).map_err(refuse)?;
        self.room_for_a_run()
            .map_err(|e| refuse(e.message.clone()))?;
        let script = self
            .compile(&plan.script)
            .map_err(|e| refuse(format!("its script no longer compiles: {e}")))?;
        let run_id = new_run_id();
        if let Some(other) = store.claim_plan(plan_id, &run_id).await? {
            return Err(refuse(applied_already(&other)));
        }
        let mut options = options;
        options.no_store = false;
        options.input = plan.input.clone().map(Arc::new);
        options.script_name = Some(plan.script_name.clone());
        let held = match self.record_run(store, &script, &options, &run_id).await {
            Ok(held) => held,
            Err(e) => {
                let _ = store.release_plan(plan_id, &run_id).await;
                return Err(e);
            }
        };
        let key = store.digest_key().await?;
        options.plan = Some(Arc::new(PlanBook::applying(Arc::new(plan), Some(key))));
        Ok(self.execute(&script, options, run_id, Some(held)).await)
    }

    /// Whether a plan may be applied under this runtime's catalog: the one it was made under.
    fn judge_plan_catalog(&self, plan: &crate::plan::Plan) -> Result<(), String> {
        if plan.catalog_sha256 == self.catalog_sha256 {
            return Ok(());
        }
        let what = match &plan.catalog {
            Some(then) => {
                let changes = then.changes(&self.catalog);
                if changes.is_empty() {
                    "its tools' descriptions changed".to_string()
                } else {
                    changes.join("; ")
                }
            }
            None => "it is not the one the plan was made under".to_string(),
        };
        Err(format!(
            "the catalog changed since the plan was made: {what}; make a new plan under this catalog (or apply it with the tools it was made with)"
        ))
    }

    /// Resumes a paused run, or one whose process died: the stored script runs again from the
    /// start, every call the journal holds answered from it (no tool body runs for them), and
    /// goes on live from there. `decision` settles the call a paused run waits at. The run
    /// keeps the mode it started in (`options.mode` is not used) and has a fresh deadline.
    ///
    /// # Errors
    ///
    /// [`Error::Resume`](crate::Error::Resume) when the runtime has no store, the store has no
    /// such run, the run has ended or still runs under a live lease, the decision does not
    /// answer what the run waits for, or the catalog is not the one the run started with;
    /// [`Error::Store`](crate::Error::Store) when the store fails.
    pub async fn resume(
        &self,
        run_id: &str,
        decision: Option<Decision>,
        options: RunOptions,
    ) -> Result<RunOutcome, crate::Error> {
        let refuse = |message: String| crate::Error::Resume {
            run_id: run_id.to_string(),
            message,
        };
        let store = self
            .store
            .as_ref()
            .ok_or_else(|| refuse("this runtime has no store of runs".into()))?;
        let record = store
            .run(run_id)
            .await?
            .ok_or_else(|| refuse(format!("the store {} has no such run", store.location())))?;
        if record.status.is_final() {
            return Err(refuse(format!(
                "the run has already {}; there is nothing to resume",
                record.status.as_str()
            )));
        }
        // A run under a live lease is refused first, whatever else it would be refused for (the
        // store checks again, in the transaction that takes it). A run this process holds but
        // no longer runs (its caller went away before its end was recorded) is this process's
        // to take again, lease or not.
        let mut claim = crate::store::Claim::this_process();
        if !lock(&ACTIVE).contains(run_id) {
            claim = claim.retaking_own();
        }
        if let Some(lease) = record.lease.as_ref().filter(|l| {
            record.status == RunStatus::Running
                && l.is_live()
                && !(claim.retake_own && l.owner == claim.owner)
        }) {
            return Err(refuse(busy_with(lease)));
        }
        self.judge_catalog(&record).map_err(refuse)?;
        if record.context_digest != context_digest(store, &options).await? {
            return Err(refuse(
                match (&record.context_digest, &options.context) {
                    (Some(_), None) => "it started with a per-run context (RunOptions::context): only a caller that gives the same context again may resume it",
                    (None, Some(_)) => "it started without a per-run context: resume it without one",
                    _ => "the context given is not the one it started with",
                }
                .into(),
            ));
        }
        self.room_for_a_run()
            .map_err(|e| refuse(e.message.clone()))?;
        // The decision is for the call the run waited at when it was read; the store checks,
        // in the transaction that takes the run, that it still waits there for that decision.
        let seen = record
            .pending
            .as_ref()
            .filter(|_| record.status == RunStatus::Paused);
        let take = match (&decision, seen) {
            (Some(d), Some(p)) => Some(TakeDecision::on(p, verdict(d, p).map_err(refuse)?)),
            (Some(_), None) => return Err(refuse(not_paused(record.status))),
            (None, _) => None,
        };
        let asked = take.as_ref().map(|t| t.seq);
        let taking = {
            let (store, run_id) = (Arc::clone(store), run_id.to_string());
            async move {
                let taken = store.take_run(&run_id, claim, take).await?;
                Ok(taken.map(|record| {
                    let fence = record.lease.as_ref().map(crate::store::Lease::fence);
                    (record, fence)
                }))
            }
        };
        let taken = own(store, run_id, self.keyed(), taking).await?;
        let (record, held) = taken.map_err(|e| match e {
            TakeRefused::Unknown => refuse("the store has no such run".into()),
            TakeRefused::Ended(r) => refuse(format!("the run has already {}", r.status.as_str())),
            TakeRefused::Busy(lease) => refuse(busy_with(&lease)),
            TakeRefused::Settled(seq) => refuse(format!(
                "the journal already holds the outcome of call #{seq} (another decision or process settled it): a decision never replaces it"
            )),
            TakeRefused::Stale(now) => refuse(stale(&now, asked)),
        })?;
        // From now on the run is judged by the catalog it goes on under (a run stored before
        // fingerprints is judged by the whole-catalog hash this once).
        if record.catalog.as_ref() != Some(&self.catalog) {
            store
                .set_catalog(run_id, self.catalog_sha256.clone(), self.catalog.clone())
                .await?;
        }
        let mut options = options;
        options.mode = record.mode;
        options.input = record.input.map(Arc::new);
        // A run applying a plan goes on applying it.
        if let Some(stored) = store.plan_of_run(run_id).await? {
            let plan: crate::plan::Plan = serde_json::from_str(&stored.body).map_err(|e| {
                refuse(format!(
                    "the plan it applies ({}) does not parse: {e}",
                    stored.plan_id
                ))
            })?;
            let key = store.digest_key().await?;
            options.plan = Some(Arc::new(PlanBook::applying(Arc::new(plan), Some(key))));
        }
        let script = self
            .compile(&record.script)
            .map_err(|e| refuse(format!("its stored script no longer compiles: {e}")))?;
        Ok(self
            .execute(&script, options, run_id.to_string(), Some(held))
            .await)
    }

    /// Whether a run may go on under this runtime's catalog: none of the tools it started with
    /// is gone or behaves otherwise (prose may change). A run stored before fingerprints is
    /// judged by the rule it was stored under: the whole catalog's hash.
    fn judge_catalog(&self, record: &RunRecord) -> Result<(), String> {
        let Some(then) = &record.catalog else {
            if record.catalog_sha256 == self.catalog_sha256 {
                return Ok(());
            }
            return Err(
                "the catalog changed since the run started (it was stored by an earlier toolscript, \
                 which kept only a hash of the whole catalog, so what changed cannot be named): \
                 resume it with the tools it started with (the same --tools)"
                    .into(),
            );
        };
        let changes = then.changes(&self.catalog);
        if changes.is_empty() {
            return Ok(());
        }
        Err(format!(
            "the catalog changed since the run started: {}; resume it with the tools it started with (the same --tools)",
            changes.join("; ")
        ))
    }

    /// Runs `script` as run `run_id`, journaled in `held`'s journal when it is durable.
    async fn execute(
        &self,
        script: &Script,
        options: RunOptions,
        run_id: String,
        held: Option<InterruptOnDrop>,
    ) -> RunOutcome {
        let mut run = Run::start(self, script, options, run_id, held, None);
        let joined = run.join().await;
        run.finish(self, joined).await
    }
}

/// One run's life: started (its context, ledger, scout and script thread), joined (the script
/// has ended, the scout and every call with it), finished (its output bounded, its end
/// recorded).
///
/// # Cancellation
///
/// A run has one cancellation tree: its token is the root; the script's engine watches the
/// root itself and the scout a child of it. Dropping the run before it finished (its caller
/// gave up) cancels the root, which stops the script at its next operation and every scout
/// pass, and closes the ledger so that no read starts afterwards. A script tool's call has a
/// token of its own, cancelled when the call's future is dropped (a timeout), which frees the
/// pool thread its body runs on.
struct Run {
    run_id: String,
    span: tracing::Span,
    started: std::time::Instant,
    mode: Mode,
    policy: crate::policy::ResultPolicy,
    ctx: Arc<RunContext>,
    ledger: Arc<RunLedger>,
    journal: Option<Arc<Journal>>,
    scout: Option<(Arc<Scout>, tokio::task::JoinHandle<u64>)>,
    /// The script thread's execution, when it ends.
    script: Option<tokio::sync::oneshot::Receiver<script::Execution>>,
    /// Cancels the run when it is dropped before it finished.
    _stop: StopOnDrop,
    /// Counts the run among those sharing the process's memory while it goes on.
    _running: engine::Running,
    /// Records a durable run as interrupted when it is dropped before its end was recorded;
    /// marks it as running in this process until then.
    interrupt: InterruptOnDrop,
}

/// A run's context and ledger, made before it starts.
struct Prepared {
    ctx: Arc<RunContext>,
    ledger: Arc<RunLedger>,
}

/// What joining a run gives: the script's execution and the scout's counts.
struct Joined {
    execution: script::Execution,
    scout_passes: u64,
    scout_operations: u64,
}

impl Run {
    /// Starts the run: its context and ledger, the scout (speculative runs), and the script on
    /// a thread of its own, all under one deadline from now. `held` is a durable run's.
    fn start(
        runtime: &Runtime,
        script: &Script,
        options: RunOptions,
        run_id: String,
        held: Option<InterruptOnDrop>,
        prepared: Option<Prepared>,
    ) -> Run {
        let mut interrupt = held.unwrap_or_else(InterruptOnDrop::not_durable);
        let journal = interrupt.journal.clone();
        let span = tracing::info_span!("run", run_id = %run_id);
        let entered = span.enter();
        let started = std::time::Instant::now();
        let deadline = crate::sync::deadline_after(started, runtime.limits.timeout);
        let Prepared { ctx, ledger } =
            prepared.unwrap_or_else(|| Run::prepare(runtime, &options, &run_id, journal.clone()));
        // The root of the run's cancellation tree: the script, the scout and every call.
        let cancel = (*ctx.cancel).clone();
        let scout =
            (options.mode == Mode::Speculative && runtime.worth_a_scout(script)).then(|| {
                // Applying a plan, any non-read call may pause the run (a divergence from the
                // plan): the scout's rewrite guesses towards every branch that makes one.
                let rewritten = match options.plan.as_deref().and_then(PlanBook::as_applying) {
                    Some(_) => Arc::new(speculate::ScoutScript::new(
                        &script.ast,
                        &runtime.effectful,
                        &runtime.effectful,
                    )),
                    None => Arc::clone(&script.scout),
                };
                let scout = Scout::new(
                    Arc::clone(&ctx),
                    Arc::clone(&ledger),
                    rewritten,
                    runtime.limits.clone(),
                    deadline,
                    tokio::runtime::Handle::current(),
                );
                // The executor runs from now on (until it first waits): the scout may hold reads
                // for it from its first pass.
                ledger.executor_runs();
                scout.starts_held_reads();
                (Arc::clone(&scout), tokio::spawn(scout.drive()))
            });
        let stop = StopOnDrop {
            cancel: cancel.clone(),
            ledger: Arc::clone(&ledger),
            scout: scout.as_ref().map(|s| Arc::clone(&s.0)),
        };
        // Over the memory budget, the scout stands down before the script is ended for it:
        // the scout's copies never cost the run what a sequential run would have had.
        let relief = scout.as_ref().map(|(scout, _)| {
            let scout = Arc::clone(scout);
            Arc::new(move || scout.stand_down()) as engine::Relief
        });
        let watch = engine::RunControls {
            deadline: Some(deadline),
            cancel: Some(cancel),
            relief,
            ..engine::RunControls::default()
        };
        let done = interrupt.script.take();
        let script = Run::start_script(script, &ctx, &ledger, &runtime.limits, watch, done);
        drop(entered);
        Run {
            run_id,
            span,
            started,
            mode: options.mode,
            policy: options.result_policy,
            ctx,
            ledger,
            journal,
            scout,
            script,
            _stop: stop,
            _running: engine::Running::enter(),
            interrupt,
        }
    }

    /// The run's context and ledger (made before the run starts when its script streams in).
    fn prepare(
        runtime: &Runtime,
        options: &RunOptions,
        run_id: &str,
        journal: Option<Arc<Journal>>,
    ) -> Prepared {
        let ctx = Run::context(runtime, options, run_id, journal);
        let speculation = SpeculationLimits {
            predict: runtime.speculation.predict && options.mode == Mode::Speculative,
            ..runtime.speculation.clone()
        };
        let scouted = options.mode == Mode::Speculative;
        let ledger = Arc::new(RunLedger::new(Arc::clone(&ctx), speculation, scouted));
        Prepared { ctx, ledger }
    }

    /// The run's shared context: registry, breakers, budget, receipts, journal and values.
    fn context(
        runtime: &Runtime,
        options: &RunOptions,
        run_id: &str,
        journal: Option<Arc<Journal>>,
    ) -> Arc<RunContext> {
        let limits = &runtime.limits;
        let sink = options.receipts.as_ref().and_then(|s| lock(s).take());
        if let Some(progress) = &options.progress {
            progress.name(run_id);
        }
        Arc::new(
            RunContext::new(
                Arc::clone(&runtime.registry),
                Arc::clone(&runtime.breakers),
                Budget {
                    max_calls: limits.max_calls,
                    max_speculative_calls: limits.max_speculative_calls,
                    max_in_flight: limits.max_in_flight,
                },
                limits.timeout,
                run_id.to_string(),
                options.progress.clone().unwrap_or_default(),
                sink,
            )
            .with_journal(journal)
            .with_values(options.input.clone(), options.context.clone())
            .with_cache(Some(crate::dispatch::RunCache::new(
                runtime.cache.clone(),
                Arc::clone(&runtime.cache_prints),
                options.no_cache || runtime.no_cache,
            )))
            .with_fixtures(
                options.sandbox,
                options.fixtures.clone(),
                options.record.clone(),
            )
            .with_plan(options.plan.clone()),
        )
    }

    /// Starts the executor on a script thread; `None` when no thread could be started.
    fn start_script(
        script: &Script,
        ctx: &Arc<RunContext>,
        ledger: &Arc<RunLedger>,
        limits: &Limits,
        watch: engine::RunControls,
        done: Option<tokio_util::sync::DropGuard>,
    ) -> Option<tokio::sync::oneshot::Receiver<script::Execution>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (ast, ctx, ledger) = (Arc::clone(&script.ast), Arc::clone(ctx), Arc::clone(ledger));
        let fields = script.fields.clone();
        let (handle, limits) = (tokio::runtime::Handle::current(), limits.clone());
        let spawned = engine::spawn_script_thread("toolscript-script", move || {
            // Dropped when the script has ended (or the thread never started): the run's end
            // can then be recorded.
            let _done = done;
            let _ = tx.send(script::execute(
                &ast, fields, ctx, ledger, handle, &limits, watch,
            ));
        });
        match spawned {
            Ok(_) => Some(rx),
            Err(e) => {
                tracing::error!(parent: &Span::current(), error = %e, "could not start the script thread");
                None
            }
        }
    }

    /// Waits for the script to end, then ends the scout (its wasted reads cancelled) and
    /// gives calls still running a moment to write their receipts.
    async fn join(&mut self) -> Joined {
        let execution = match self.script.take() {
            Some(rx) => rx.await.ok(),
            None => None,
        };
        self.ledger.close();
        let (mut scout_passes, mut scout_operations) = (0, 0);
        if let Some((scout, driver)) = self.scout.take() {
            scout.finish().await;
            scout_passes = driver.await.unwrap_or_default();
            scout_operations = scout.operations();
        }
        let open = self.ctx.settled(SETTLE).await;
        if let Some(cache) = &self.ctx.cache {
            cache.flush().await;
        }
        if open > 0 {
            tracing::warn!(parent: &self.span, open, "calls still running when the run ended have no receipt");
        }
        let execution = execution.unwrap_or_else(|| script::Execution {
            result: Err(RunError::new(
                ErrorKind::Internal,
                "the script thread stopped without a result",
            )),
            logs: Vec::new(),
            counts: Default::default(),
            pending: None,
            results: Default::default(),
            warnings: Default::default(),
        });
        Joined {
            execution,
            scout_passes,
            scout_operations,
        }
    }

    /// The run's outcome: stats, the note of a paused run, the output bounded within the
    /// inline budget, and (a durable run) its end recorded in the store.
    async fn finish(mut self, runtime: &Runtime, joined: Joined) -> RunOutcome {
        let Joined {
            execution,
            scout_passes,
            scout_operations,
        } = joined;
        let stats = self.stats(&execution, scout_passes, scout_operations);
        let mut result = execution.result;
        if let (Some(pending), Err(e)) = (&execution.pending, &mut result) {
            self.note_pause(e, pending);
        }
        let interrupted = self.journal.as_ref().is_some_and(|j| j.failure().is_some());
        if let (true, None, Err(e)) = (interrupted, &execution.pending, &mut result) {
            e.recoverable = true;
            e.suggested_next_action = Some(format!(
                "once the store can be written again: toolscript resume {}",
                self.run_id
            ));
        }
        let mut effects = self.ctx.take_effects();
        let (mut logs, mut warnings, mut pending) =
            (execution.logs, execution.warnings.list, execution.pending);
        // Nothing the run hands back or keeps holds a secret or a redacted value: masked here,
        // before the output is bounded, so that artifacts are masked too.
        let masks = self.ctx.masks();
        if !masks.is_empty() {
            match &mut result {
                Ok(value) => {
                    masks.value(value);
                }
                Err(e) => masks.error(e),
            }
            logs.iter_mut().for_each(|line| masks.string(line));
            for w in &mut warnings {
                masks.string(&mut w.message);
                masks.string(&mut w.field);
            }
            for effect in &mut effects {
                masks.value(&mut effect.args);
            }
            if let Some(p) = &mut pending {
                let original = crate::json::key_json(&p.args);
                // Masked after the pause (a value learned since): the journal's form of the
                // arguments is their digest, never the values.
                if masks.value(&mut p.args) && p.journal_args.is_none() {
                    if let Some(journal) = &self.journal {
                        p.journal_args =
                            Some(journal.args_form(masks, &original, true).into_owned());
                    }
                }
                for text in [&mut p.reason, &mut p.why, &mut p.rule]
                    .into_iter()
                    .flatten()
                {
                    masks.string(text);
                }
            }
        }
        let effects = Arc::new(effects);
        let output = Output {
            result,
            logs,
            warnings,
            effects: Arc::clone(&effects),
            pending: pending.clone(),
            results: execution.results,
            policy: self.policy,
        };
        let store = runtime.store.clone().filter(|_| self.journal.is_some());
        let budget = runtime.limits.max_inline_tokens;
        let (output, mut bounded) = output.bound_off_worker(store, &self.run_id, budget).await;
        let artifacts = std::mem::take(&mut bounded.artifacts);
        for warning in &output.warnings {
            tracing::debug!(parent: &self.span, warning = %warning.line_text(), "missing field");
        }
        let unapplied = match (&pending, self.ctx.applying()) {
            (None, Some(applying)) => applying.unapplied(),
            _ => Vec::new(),
        };
        let outcome = RunOutcome {
            run_id: self.run_id.clone(),
            result: output.result,
            logs: output.logs,
            effects: {
                drop(output.effects);
                Arc::try_unwrap(effects).unwrap_or_else(|shared| (*shared).clone())
            },
            stats,
            receipts: self.ctx.take_receipts(),
            pending,
            warnings: output.warnings,
            warnings_left_out: execution.warnings.left_out,
            bounded: Some(bounded),
            artifacts,
            unapplied,
            // A journal that could not be written stopped the run: nothing in it is final.
            interrupted,
        };
        self.record_end(runtime, &outcome).await;
        self.interrupt.store = None;
        outcome
    }

    /// The run's counts and timing. Nothing looks at the ledger afterwards: a long run's
    /// entries are freed elsewhere.
    fn stats(
        &self,
        execution: &script::Execution,
        scout_passes: u64,
        scout_operations: u64,
    ) -> Stats {
        let (launched, claimed) = self.ledger.counts();
        self.ledger.release();
        Stats {
            mode: self.mode,
            wall_ms: self.started.elapsed().as_secs_f64() * 1e3,
            tool_calls: execution.counts.tool_calls,
            dispatched: self.ctx.dispatched(),
            speculative_launched: launched,
            speculative_claimed: claimed,
            speculative_wasted: launched - claimed,
            speculative_held: self.ledger.held_made(),
            deduplicated: execution.counts.deduplicated,
            effectful_calls: execution.counts.effectful_calls,
            replayed: execution.counts.replayed,
            scout_passes,
            cache_hits: self.ctx.cache_hits(),
            script_operations: execution.counts.operations,
            scout_operations,
        }
    }

    /// A paused run's error: `paused`, recoverable, saying how to resume it.
    fn note_pause(&self, e: &mut RunError, pending: &PendingCall) {
        let run_id = &self.run_id;
        e.kind = ErrorKind::Paused;
        e.recoverable = true;
        e.suggested_next_action = Some(match (&self.journal, pending.awaiting) {
            (None, _) => "this run has no store, so it cannot be resumed: run it with a store to pause and resume it".into(),
            (Some(_), Awaiting::Approval) if pending.rule.is_some() => format!("toolscript resume {run_id} --approve (this call), --approve-rule (this call and every later one this rule asks about in the run), or --reject --reason TEXT"),
            (Some(_), Awaiting::Approval) => format!("toolscript resume {run_id} --approve (or --reject --reason TEXT)"),
            (Some(_), Awaiting::Resolve) if pending.uncertain == Some(true) => format!(
                "`{}` may still be running (see `why`): wait until the processes named there have ended (or end them), then check whether it took effect, then: toolscript resume {run_id} --resolve done (it did) or --resolve retry (it did not)",
                pending.tool
            ),
            (Some(_), Awaiting::Resolve) => format!(
                "check whether `{}` took effect, then: toolscript resume {run_id} --resolve done (it did) or --resolve retry (it did not)",
                pending.tool
            ),
            (Some(_), Awaiting::PlanDivergence) => format!(
                "the world changed since the plan, or the script took another branch: read `why`; to make this call anyway: toolscript resume {run_id} --approve (or --reject --reason TEXT, or make a new plan)"
            ),
        });
    }

    /// A durable run's end in the store: its journal flushed, then its status, pending call
    /// and printed outcome. A failure is logged: a resume records it later.
    async fn record_end(&self, runtime: &Runtime, outcome: &RunOutcome) {
        let (Some(journal), Some(store)) = (&self.journal, &runtime.store) else {
            return;
        };
        journal.flush().await;
        journal.release();
        let end = StoredEnd::new(outcome.status(), outcome.pending.clone(), outcome.to_json())
            .fenced(journal.fence().cloned());
        if let Err(e) = store.finish_run(&outcome.run_id, end).await {
            // A run a newer owner took is that owner's to end: nothing is left to do here.
            let mine = journal.fence().map(|f| f.token);
            let now = store.run(&outcome.run_id).await.ok().flatten();
            let token = now.and_then(|r| r.lease).map(|l| l.token);
            if mine.is_some() && token > mine {
                tracing::warn!(parent: &self.span, error = %e, "the run was taken over: its new owner records its end");
            } else {
                tracing::error!(parent: &self.span, error = %e, "the run's end could not be recorded; resume it to record it");
            }
        }
    }
}

/// What a run's output is made of, before it is bounded.
struct Output {
    result: Result<Value, RunError>,
    logs: Vec<String>,
    /// Reads of missing fields.
    warnings: Vec<crate::Warning>,
    /// The effects (the outcome holds them too).
    effects: Arc<Vec<EffectRecord>>,
    /// The call a paused run waits at: its error is the pause, not shown as the run's error.
    pending: Option<PendingCall>,
    /// Results of tools with a result policy of their own.
    results: script::ToolResults,
    /// The policy of a value that is no tool's result.
    policy: crate::policy::ResultPolicy,
}

impl Output {
    /// Bounds the output. Keeping an artifact waits for the store, so with one the bounding
    /// runs on the blocking pool, never on a worker.
    async fn bound_off_worker(
        self,
        store: Option<Arc<dyn Store>>,
        run_id: &str,
        budget: usize,
    ) -> (Output, crate::policy::Bounded) {
        let Some(store) = store else {
            return self.bound(None, run_id, budget);
        };
        let id = run_id.to_string();
        tokio::task::spawn_blocking(move || self.bound(Some(&*store), &id, budget))
            .await
            .unwrap_or_else(|e| {
                let failed = RunError::new(
                    ErrorKind::Internal,
                    format!("the run's output could not be bounded: {e}"),
                );
                (Output::failed(failed), crate::policy::Bounded::default())
            })
    }

    fn failed(error: RunError) -> Output {
        Output {
            result: Err(error),
            logs: Vec::new(),
            warnings: Vec::new(),
            effects: Arc::default(),
            pending: None,
            results: Default::default(),
            policy: Default::default(),
        }
    }

    /// The output within `budget` tokens; a value that may not be cut (`inline`, `exact`)
    /// fails the run, whose output is then bounded without it. Artifacts go to `store`.
    fn bound(
        mut self,
        store: Option<&dyn Store>,
        run_id: &str,
        budget: usize,
    ) -> (Output, crate::policy::Bounded) {
        let bounded = match self.try_bound(store, run_id, budget) {
            Ok(bounded) => bounded,
            Err(crate::policy::Unbounded(why)) => {
                self.result = Err(RunError::new(ErrorKind::LimitExceeded, why));
                self.try_bound(store, run_id, budget).unwrap_or_default()
            }
        };
        (self, bounded)
    }

    fn try_bound(
        &self,
        store: Option<&dyn Store>,
        run_id: &str,
        budget: usize,
    ) -> Result<crate::policy::Bounded, crate::policy::Unbounded> {
        let own = match &self.result {
            Ok(value) if !self.results.is_empty() => {
                let hash = crate::json::sha256_hex(crate::json::key_json(value));
                self.results.get(&hash).cloned()
            }
            _ => None,
        };
        let paused = self.pending.is_some();
        let value = match (&self.result, &own, paused) {
            (Ok(v), Some((policy, tool)), false) => Some((v, *policy, Some(tool.as_str()))),
            (Ok(v), None, false) => Some((v, self.policy, None)),
            _ => None,
        };
        let error = self.result.as_ref().err().filter(|_| !paused);
        crate::policy::Bounder::new(store, run_id, budget).bound(crate::policy::Parts {
            value,
            logs: &self.logs,
            error: error.cloned(),
            warnings: &self.warnings,
            effects: &self.effects,
            pending: self.pending.as_ref(),
        })
    }
}

/// `ts_artifact(#{id, page})`: one page of an artifact of the store (page 0 without `page`). An ordinary read:
/// speculated, deduplicated, receipted.
/// `ts_artifact`: an artifact of the store, or with `tenant`, of the tenant's runs only (another's
/// is answered as one the store does not have).
fn artifact_tool(store: Arc<dyn Store>, tenant: Option<String>) -> crate::Tool {
    crate::Tool::builder(crate::policy::ARTIFACT_TOOL, crate::Effect::Read)
        // Without `page` it now gives page 0, not the whole value; the words are left as they
        // were while the catalog hash a paused run resumes under covers descriptions: a new
        // description would leave every run paused before it unresumable.
        .description(
            "An artifact a run's output referred to (`artifact` in its place in the output): the \
             whole value, or with `page` one page of it (`{page, pages, items | text}`).",
        )
        .input_schema(crate::policy::artifact_args_schema())
        .handler(move |args| {
            let store = Arc::clone(&store);
            let tenant = tenant.clone();
            async move {
                // The registry checked them against the schema of the same type.
                let args = crate::policy::ArtifactArgs::deserialize(&args)
                    .map_err(|e| crate::ToolError::invalid_input(e.to_string()))?;
                if let Some(tenant) = &tenant {
                    let theirs = store
                        .artifact_of_tenant(&args.id, tenant)
                        .await
                        .map_err(|e| crate::ToolError::internal(e.report()))?;
                    if !theirs {
                        return Err(crate::policy::no_artifact(&args.id));
                    }
                }
                crate::policy::read_artifact(&*store, &args.id, args.page).await
            }
        })
}

/// The durable runs this process is running now: a run in the store owned by this process is
/// taken for a resume only if it is not among them.
static ACTIVE: std::sync::Mutex<std::collections::BTreeSet<String>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A durable run this process runs, until dropped.
struct Active(String);

impl Active {
    fn enter(run_id: &str) -> Active {
        lock(&ACTIVE).insert(run_id.to_string());
        Active(run_id.to_string())
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        lock(&ACTIVE).remove(&self.0);
    }
}

/// Removes from `store` the runs `rule` names, with their journals and the artifacts no kept
/// run refers to; a running run whose lease is live is never removed.
///
/// # Errors
///
/// [`Error::Store`](crate::Error::Store) when the store fails (a vacuum that fails after the
/// runs were removed says so).
pub async fn prune(
    store: &dyn Store,
    rule: crate::store::PruneRule,
) -> Result<crate::store::Pruned, crate::Error> {
    store.prune(rule).await
}

/// A journal whose lease is renewed while the run is live.
/// The keyed digest a run's record keeps of its per-run context, under the store's digest
/// key: a resume can tell the same context from another, and the store never holds it.
async fn context_digest(
    store: &Arc<dyn Store>,
    options: &RunOptions,
) -> Result<Option<String>, crate::Error> {
    let Some(context) = options.context.as_deref() else {
        return Ok(None);
    };
    let key = store.digest_key().await?;
    let text = crate::json::key_json(context);
    Ok(Some(format!(
        "hmac:{}",
        crate::json::hmac_sha256_hex(&key, text)
    )))
}

fn leased(journal: Journal) -> Arc<Journal> {
    let journal = Arc::new(journal);
    journal.keep_lease();
    journal
}

/// Makes the run `run_id` this process's in `store` and opens its journal, in a task that a
/// caller going away does not cut short: `take` creates the run, or takes it for a resume (or
/// is refused), giving what it took and the fence of this process's lease.
///
/// From the moment the store holds the run as `running` under that lease, the guard this gives
/// must exist: a caller dropped in between (a client that hung up while the store wrote the
/// run) would otherwise leave it `running` under a lease no one renews, until another process
/// takes it over. A guard its caller is no longer there to take is dropped, which records the
/// run as interrupted.
async fn own<T: Send + 'static, R: Send + 'static>(
    store: &Arc<dyn Store>,
    run_id: &str,
    keyed: bool,
    take: impl std::future::Future<Output = Result<Result<(T, Option<Fence>), R>, crate::Error>>
        + Send
        + 'static,
) -> Result<Result<(T, InterruptOnDrop), R>, crate::Error> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (owner, id) = (Arc::clone(store), run_id.to_string());
    tokio::spawn(async move {
        let owned = async {
            let (taken, fence) = match take.await? {
                Ok(taken) => taken,
                Err(refused) => return Ok(Err(refused)),
            };
            let journal = leased(Journal::open(Arc::clone(&owner), &id, keyed, fence).await?);
            Ok(Ok((taken, InterruptOnDrop::new(owner, journal))))
        };
        let _ = tx.send(owned.await);
    });
    rx.await.unwrap_or_else(|_| {
        Err(crate::Error::store(
            &store.location(),
            "the task that records the run stopped",
            None,
        ))
    })
}

/// Why a run under a live lease cannot be taken: who holds it, and until when.
fn busy_with(lease: &crate::store::Lease) -> String {
    format!(
        "the run is still running, held by {} (fencing token {}) under a lease that expires at {} unless its owner renews it: resume it after that, once its owner has stopped",
        lease.holder(),
        lease.token,
        crate::store::utc_ms(lease.expires_ms),
    )
}

/// Cancels a run when the run's future is dropped before it finished: its token (the root of
/// its cancellation tree: the script, the scout), and its ledger, closed to new reads.
struct StopOnDrop {
    cancel: CancellationToken,
    ledger: Arc<RunLedger>,
    scout: Option<Arc<Scout>>,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.ledger.close();
        if let Some(scout) = &self.scout {
            scout.stop();
        }
    }
}

/// Records a durable run as `interrupted` when its future is dropped before its end was
/// recorded (its caller went away: a client that disconnected, a server stopping), so that a
/// resume, here or in another process, takes it. It waits for the script thread to stop first
/// (the run's token stops it at its next operation; a call it was making ends, and its outcome
/// is journaled), and keeps the run marked as running in this process until then. It exists
/// from the moment the store holds the run as this process's ([`own`]), before the run starts.
struct InterruptOnDrop {
    /// The run's store; `None` once the run's end is recorded (or for a run without one).
    store: Option<Arc<dyn Store>>,
    journal: Option<Arc<Journal>>,
    run_id: String,
    /// Cancelled when the script thread has ended, or never started.
    script_done: CancellationToken,
    /// Cancels `script_done` when dropped: the script thread holds it once it starts.
    script: Option<tokio_util::sync::DropGuard>,
    active: Option<Active>,
}

impl InterruptOnDrop {
    /// The guard of the durable run whose journal is `journal`, this process's from now on.
    fn new(store: Arc<dyn Store>, journal: Arc<Journal>) -> InterruptOnDrop {
        let run_id = journal.run_id().to_string();
        let script_done = CancellationToken::new();
        InterruptOnDrop {
            store: Some(store),
            journal: Some(journal),
            active: Some(Active::enter(&run_id)),
            run_id,
            script: Some(script_done.clone().drop_guard()),
            script_done,
        }
    }

    /// The guard of a run without a store, which records nothing.
    fn not_durable() -> InterruptOnDrop {
        let script_done = CancellationToken::new();
        InterruptOnDrop {
            store: None,
            journal: None,
            run_id: String::new(),
            script: Some(script_done.clone().drop_guard()),
            script_done,
            active: None,
        }
    }
}

impl Drop for InterruptOnDrop {
    fn drop(&mut self) {
        let (Some(store), Some(journal)) = (self.store.take(), self.journal.take()) else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (done, active) = (self.script_done.clone(), self.active.take());
        // A run dropped before its script started has no script to wait for.
        drop(self.script.take());
        let run_id = std::mem::take(&mut self.run_id);
        handle.spawn(async move {
            done.cancelled().await;
            journal.flush().await;
            journal.release();
            // Only a run this process still holds: one whose end was recorded as the future
            // was dropped keeps it, and one a newer owner took is that owner's.
            let fence = journal.fence().cloned();
            let owned = match store.run(&run_id).await {
                Ok(Some(r)) => {
                    r.status == RunStatus::Running
                        && r.lease.map(|l| l.token) == fence.as_ref().map(|f| f.token)
                }
                _ => false,
            };
            if owned {
                let outcome = serde_json::json!({
                    "run_id": run_id,
                    "status": RunStatus::Interrupted,
                    "ok": false,
                    "error": {"kind": "cancelled", "message": "the run's caller went away before it ended; resume it to go on"},
                });
                let end = StoredEnd::new(RunStatus::Interrupted, None, outcome).fenced(fence);
                if let Err(e) = store.finish_run(&run_id, end).await {
                    tracing::error!(run_id = %run_id, error = %e.report(), "a dropped run could not be recorded as interrupted; resume it once this process has ended");
                }
            }
            drop(active);
        });
    }
}

/// How long a run waits, after its script ended, for abandoned calls to write their receipts.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(5);

/// Why a plan applied already is refused.
fn applied_already(run: &str) -> String {
    if run.is_empty() {
        return "the plan is gone from the store".into();
    }
    format!("it was applied already, by run {run}: a plan is applied once (`toolscript runs` shows that run; `toolscript resume {run}` goes on with it if it has not ended)")
}

/// What planning a script gives: the plan, and the run that made it (its logs, stats and
/// receipts; every non-read call in them is `planned`).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PlanOutcome {
    /// The plan.
    pub plan: crate::plan::Plan,
    /// The planning run.
    pub run: RunOutcome,
}

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
