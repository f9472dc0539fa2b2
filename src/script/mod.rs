//! The script executor: the authoritative, sequential run of a script. Rhai runs on a thread of
//! its own; each tool call blocks that thread until the dispatch path, running on the async
//! runtime, has its result. The run's meaning — epochs, identical reads answered once (but
//! made again after a recoverable failure), claims of what the scout started — is kept in the
//! run ledger.

mod check;
mod warnings;

pub use crate::store::Awaiting;
pub use check::{Problem, Severity};

pub(crate) use check::{check, known_functions};
pub(crate) use warnings::Warnings;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rhai::{Dynamic, Engine, AST};
use serde_json::Value;

use crate::dispatch::{dispatch_shared, Call, RunContext};
use crate::engine::{self, block_on_noting, Limits, RunControls, ToolCall};
use crate::error::{ErrorKind, RunError, ToolError};
use crate::ledger::{Outcome, Read, ReadKey, RunLedger, WriteRecord};
use crate::policy::ResultPolicy;
use crate::store::{PendingCall, ReadAt};
use crate::sync::lock;
use crate::tool::Effect;

/// What the executor counted during a run.
#[derive(Clone, Debug, Default)]
pub(crate) struct Counts {
    pub(crate) tool_calls: u64,
    pub(crate) deduplicated: u64,
    pub(crate) effectful_calls: u64,
    /// Calls the run's journal answered.
    pub(crate) replayed: u64,
    /// Interpreter operations.
    pub(crate) operations: u64,
}

/// What the executor counts, counted without a lock (the tool calls at every call).
#[derive(Debug, Default)]
struct Tally {
    tool_calls: AtomicU64,
    deduplicated: AtomicU64,
    effectful_calls: AtomicU64,
    replayed: AtomicU64,
}

impl Tally {
    fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn counts(&self) -> Counts {
        Counts {
            tool_calls: self.tool_calls.load(Ordering::Relaxed),
            deduplicated: self.deduplicated.load(Ordering::Relaxed),
            effectful_calls: self.effectful_calls.load(Ordering::Relaxed),
            replayed: self.replayed.load(Ordering::Relaxed),
            operations: 0,
        }
    }
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
            self.lines.push(format!(
                "(log output cut at {max_bytes} bytes: the limit max_log_bytes)"
            ));
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
    counts: Tally,
    /// Occurrences of each polling read so far, by its first occurrence's key: the next one's
    /// number.
    polls: Mutex<std::collections::HashMap<ReadKey, u64>>,
    /// Why the run must stop at once (a pause, a journal that cannot be written or that the
    /// script no longer matches): the script cannot catch it.
    stop: Mutex<Option<String>>,
    /// Set once `stop` is: read around every call, without its lock.
    stopping: AtomicBool,
    /// The call the run paused at.
    pending: Mutex<Option<PendingCall>>,
    /// For a pause at a call the applied plan did not plan: the planned call expected there
    /// (`None`: the plan had no more) and why the run diverged.
    divergence: Mutex<Option<(Option<Value>, String)>>,
    /// Results of tools with a result policy of their own, by the SHA-256 of their canonical
    /// JSON: the policy and the tool.
    results: Mutex<ToolResults>,
}

/// Results of tools with a result policy, by SHA-256: the policy and the tool.
pub(crate) type ToolResults = std::collections::HashMap<String, (ResultPolicy, String)>;

impl Executor {
    /// One tool call made by the script: reads go through the ledger (answered by an identical
    /// read earlier in the epoch, claimed from the scout, or dispatched); non-read calls are
    /// dispatched and end the epoch. The outcome is shared with the ledger, not copied.
    fn call(&self, name: &str, args: &Dynamic) -> Outcome {
        Tally::add(&self.counts.tool_calls);
        let args = match engine::to_json(args) {
            Ok(args) => args,
            Err(e) => {
                return Arc::new(Err(ToolError::invalid_input(format!(
                    "the arguments of `{name}` cannot be sent: {e}"
                ))
                .for_tool(name)))
            }
        };
        let Some(tool) = self.ctx.registry.get(name) else {
            // The dispatch path refuses it (`unknown_tool`) and counts it.
            return self.dispatch(Call::top_level(name, args), false);
        };
        let (shared, effect, polling, policy) = (
            Arc::clone(&tool.name),
            tool.spec.effect,
            tool.spec.allow_repeat,
            tool.spec.result,
        );
        let name = (policy != ResultPolicy::Auto).then(|| tool.spec.name.clone());
        let call = Call::top_level(Arc::clone(&shared), args);
        let result = match effect {
            Effect::Read if polling => self.poll(call, shared),
            Effect::Read => self.read(call, shared),
            _ => self.non_read(call, effect),
        };
        // A tool with a result policy of its own: the run's output knows its results by hash.
        if let (Some(name), Ok(value)) = (name, &*result) {
            let hash = crate::json::sha256_hex(crate::json::key_json(value));
            lock(&self.results).insert(hash, (policy, name));
        }
        result
    }

    /// A non-read call: answered by the journal when an earlier process of the run made it,
    /// else dispatched (its intent journaled before its body runs, its outcome after). Either
    /// way the epoch advances.
    fn non_read(&self, call: Call, effect: Effect) -> Outcome {
        let seq = self.ledger.epoch();
        let call = call.at_seq(self.ctx.run_id(), seq);
        let journal = self.ctx.journal.as_ref().cloned();
        let journaled = journal.as_ref().and_then(|j| j.write(seq));
        if let Some(entry) = &journaled {
            // Answered without the dispatch path: the values its tool redacts are masked here,
            // before anything can quote them.
            let tool = self.ctx.registry.get(&call.tool);
            if let Some(tool) = tool.filter(|t| !t.redact.is_empty()) {
                tool.mask_redacted(crate::secrets::Side::Args, &call.args, &self.ctx.mask);
            }
            if let Some(journal) = journal.as_ref() {
                if *entry.tool != *call.tool || !journal.same_args(&entry.args, &call.args_key) {
                    let now = journal.args_form(
                        self.ctx.masks(),
                        &call.args_key,
                        self.redacts_args(&call),
                    );
                    return Arc::new(Err(self.stop_with(format!(
                        "the script no longer matches its journal: its non-read call #{seq} was `{}` with {}, and is now `{}` with {now}",
                        entry.tool, entry.args, call.tool
                    ))));
                }
            }
            if let Some(outcome) = &entry.outcome {
                if entry.state.intent {
                    let mut args = call.args.clone();
                    if let Some(tool) = tool {
                        tool.redact_args(&mut args);
                    }
                    self.ctx
                        .log_replayed_effect(&call.tool, effect, args, outcome);
                }
                Tally::add(&self.counts.replayed);
                Tally::add(&self.counts.effectful_calls);
                // An applied plan follows its journal as it followed the run.
                if let Some(applying) = self.ctx.applying() {
                    if let crate::plan::Next::Planned =
                        applying.next(&call.tool, &call.args, &call.args_key)
                    {
                        applying.made(outcome);
                    }
                }
                return self.written(&call, Arc::new(outcome.clone()));
            }
            // Made, and its outcome lost with the process: only a person (or an idempotent
            // tool, made again under the same key) may decide whether to make it again.
            if entry.state.intent && effect != Effect::Idempotent {
                // Whether the call may still be running: its process is gone, but a process it
                // may have reached is not known to have ended.
                let why = crate::children::still_running(
                    entry.processes.as_ref(),
                    crate::children::GROUPS_GRACE,
                );
                return Arc::new(Err(self.pause_uncertain(&call, effect, why)));
            }
        }
        let mut call = call;
        if let Some(applying) = self.ctx.applying() {
            match applying.next(&call.tool, &call.args, &call.args_key) {
                crate::plan::Next::Planned => call.planned = true,
                crate::plan::Next::Refused(e) => return self.written(&call, Arc::new(Err(e))),
                crate::plan::Next::Diverges(planned) => {
                    let approved = journal.as_ref().is_some_and(|j| j.approved(seq));
                    if !approved {
                        return Arc::new(Err(self.pause_divergence(&call, effect, planned)));
                    }
                }
            }
        }
        let outcome = self.dispatch(call.clone(), false);
        let result = &*outcome;
        if let Some(applying) = self.ctx.applying().filter(|_| call.planned) {
            applying.made(result);
        }
        if matches!(result, Err(e) if e.kind == ErrorKind::Paused) {
            return Arc::new(Err(self.pause(&call, effect, Awaiting::Approval)));
        }
        // A tool that ends a plan ends the run: nothing after it is planned.
        if let (Err(e), Some(_)) = (result, self.ctx.planning()) {
            if e.kind == ErrorKind::PlanIncomplete {
                return Arc::new(Err(self.stop_with(e.message.clone())));
            }
        }
        Tally::add(&self.counts.effectful_calls);
        if let Some(journal) = journal {
            // The store failed before the call's intent was durable: its body was not reached.
            if let Some(why) = journal.failure().filter(|_| !journal.intent_durable(seq)) {
                return Arc::new(Err(self.stop_with(format!(
                    "the run's journal could not be written ({why}): `{}` (call #{seq}) was not made; the run is interrupted, and a resume goes on from this call",
                    call.tool
                ))));
            }
            // The run was cancelled (its caller went away) while the call was being made: an
            // error then (`cancelled`, an unknown outcome, a composite's nested call cut short)
            // may be the run's end rather than the tool's answer. It is not journaled: the
            // intent stays open, so a resume asks whether the call took effect (or makes an
            // idempotent one again under its key) instead of replaying an error the script
            // never met.
            if result.is_err() && self.ctx.cancel.is_cancelled() {
                let made = if journal.intent_durable(seq) {
                    "whether it took effect is not known, and a resume asks"
                } else {
                    "it was not made, and a resume makes it"
                };
                return Arc::new(Err(self.stop_with(format!(
                    "the run was cancelled while `{}` (call #{seq}) was being made: {made}",
                    call.tool
                ))));
            }
            // What holds a secret or a redacted value is kept without it: the arguments as a
            // keyed digest, the outcome masked.
            let masks = self.ctx.masks();
            let (tool, args, outcome) = (
                call.tool.to_string(),
                journal
                    .args_form(masks, &call.args_key, self.redacts_args(&call))
                    .into_owned(),
                masks.outcome(result),
            );
            let committed = engine::block_on(&self.handle, async move {
                journal.outcome(seq, &tool, &args, &outcome).await
            })
            .unwrap_or_else(|| Err("the async runtime shut down".to_string()));
            if let Err(why) = committed {
                let answered = match result {
                    Ok(_) => "it answered with a result".to_string(),
                    Err(e) => format!("it answered with an error of kind `{}`", e.kind_name()),
                };
                let again = match effect {
                    Effect::Idempotent => "a resume makes it again under the same idempotency key",
                    _ => "a resume will ask whether it took effect (--resolve done or --resolve retry)",
                };
                return Arc::new(Err(self.stop_with(format!(
                    "`{}` (call #{seq}) was made ({answered}), but its outcome could not be journaled ({why}): the run is interrupted, and {again}",
                    call.tool
                ))));
            }
        }
        self.written(&call, outcome)
    }

    /// The executor is done with a non-read call: the epoch advances.
    fn written(&self, call: &Call, outcome: Outcome) -> Outcome {
        self.ledger.record_write(WriteRecord {
            tool: call.tool.to_string(),
            args: call.args_key.to_string(),
            outcome: Arc::clone(&outcome),
        });
        outcome
    }

    /// Pauses the run at `call`, whose outcome was lost, for a person to resolve; `why` it
    /// might still be running, if it might.
    fn pause_uncertain(&self, call: &Call, effect: Effect, why: Option<String>) -> ToolError {
        let still = why.as_ref().map_or(String::new(), |why| {
            format!("; it may still be running: {why}")
        });
        self.pause_with(call, effect, Awaiting::Resolve, Some(why), &still)
    }

    /// Pauses the applying run at `call`, which is not the plan's next call (`planned`, or
    /// none left): a person decides whether it is made.
    fn pause_divergence(
        &self,
        call: &Call,
        effect: Effect,
        planned: Option<Box<crate::plan::PlannedCall>>,
    ) -> ToolError {
        let applying = self.ctx.applying();
        let expected = match &planned {
            Some(p) => format!(
                "the plan's next call is `{}` with {}",
                p.tool,
                crate::plan::rhai_literal(&p.args)
            ),
            None => "the plan has no more calls".to_string(),
        };
        let changed = applying
            .map(crate::plan::Applying::changed_reads)
            .unwrap_or_default();
        let why = if changed.is_empty() {
            expected.clone()
        } else {
            format!(
                "{expected}; reads whose results changed since the plan: {}",
                changed.join(", ")
            )
        };
        *lock(&self.divergence) = Some((
            planned.map(|p| serde_json::to_value(*p).unwrap_or_default()),
            why.clone(),
        ));
        self.pause_with(
            call,
            effect,
            Awaiting::PlanDivergence,
            None,
            &format!(": {why}"),
        )
    }

    /// Whether the tool of `call` redacts values of its arguments.
    fn redacts_args(&self, call: &Call) -> bool {
        self.ctx
            .registry
            .tool_redacts(&call.tool, Some(crate::secrets::Side::Args))
    }

    /// Pauses the run at `call`: it ends here, uncatchably, with `call` pending.
    fn pause(&self, call: &Call, effect: Effect, awaiting: Awaiting) -> ToolError {
        self.pause_with(call, effect, awaiting, None, "")
    }

    /// Pauses the run at the script's read `call` (its place set), which the guard asks a
    /// person about.
    fn pause_read(&self, call: &Call) -> ToolError {
        self.pause_with(call, Effect::Read, Awaiting::Approval, None, "")
    }

    /// Pauses the run at `call`, with what is known of whether it still runs (`Some` for a
    /// call awaiting `resolve`), and `more` to say in the message.
    fn pause_with(
        &self,
        call: &Call,
        effect: Effect,
        awaiting: Awaiting,
        running: Option<Option<String>>,
        more: &str,
    ) -> ToolError {
        let seq = call
            .seq
            .or(call.read_at.map(|at| at.epoch))
            .unwrap_or_default();
        let mut pending = PendingCall::new(
            seq,
            call.tool.to_string(),
            effect,
            call.args.clone(),
            awaiting,
        );
        if let Some(why) = running {
            pending = pending.still_running(why);
        }
        if let Some(tool) = self.ctx.registry.get(&call.tool) {
            tool.redact_args(&mut pending.args);
        }
        // Arguments that hold a secret or a redacted value are shown masked while the run
        // waits; the journal's form of them (a keyed digest) is what a decision is kept by.
        if let Some(journal) = self.ctx.journal.as_ref() {
            let args = journal.args_form(self.ctx.masks(), &call.args_key, self.redacts_args(call));
            if let std::borrow::Cow::Owned(args) = args {
                pending.journal_args = Some(args);
            }
        }
        pending.read = call.read_at;
        if let (Awaiting::PlanDivergence, Some((planned, why))) =
            (awaiting, lock(&self.divergence).take())
        {
            pending.planned = Some(planned.unwrap_or(Value::Null));
            pending.why = Some(why);
        }
        let asked = self.ctx.take_asked();
        if let (Awaiting::Approval, Some((rule, reason))) = (awaiting, &asked) {
            pending.rule = Some(rule.clone());
            pending.reason = Some(reason.clone());
        }
        let which = pending.place();
        *lock(&self.pending) = Some(pending);
        let what = match (awaiting, &asked) {
            (Awaiting::Approval, Some((rule, reason))) => {
                format!("waits for a person's approval: the guard asks ({rule}: {reason})")
            }
            (Awaiting::Approval, None) => "waits for a person's approval".to_string(),
            (Awaiting::Resolve, _) => {
                "was being made when the run's process stopped, and whether it took effect is unknown".to_string()
            }
            (Awaiting::PlanDivergence, _) => {
                "is not the applied plan's next call, and waits for a person's approval".to_string()
            }
        };
        self.stop_with(format!(
            "the run is paused: `{}` ({which}) {what}{more}",
            call.tool
        ))
    }

    /// Makes the run stop at once, for `why`.
    fn stop_with(&self, why: String) -> ToolError {
        let mut stop = lock(&self.stop);
        stop.get_or_insert(why.clone());
        self.stopping.store(true, Ordering::SeqCst);
        ToolError::internal(why)
    }

    /// Why the run must stop, once it must.
    fn stopped(&self) -> Option<String> {
        if !self.stopping.load(Ordering::SeqCst) {
            return None;
        }
        lock(&self.stop).clone()
    }

    /// A polling read of the tool `tool` (its shared name): dispatched afresh every time, each
    /// call an occurrence of its own (or answered by the journal, which keeps each occurrence).
    fn poll(&self, call: Call, tool: Arc<str>) -> Outcome {
        let first = ReadKey::first(self.ledger.epoch(), tool, Arc::clone(&call.args_key));
        let n = {
            let mut polls = lock(&self.polls);
            let n = polls.entry(first.clone()).or_default();
            *n += 1;
            *n - 1
        };
        let key = first.occurrence(n);
        let journaled = self
            .ctx
            .journal
            .as_ref()
            .and_then(|j| j.read(key.epoch, &key.tool, &key.args, key.n));
        if let Some(outcome) = journaled {
            Tally::add(&self.counts.replayed);
            self.ledger.answered(&key);
            return outcome;
        }
        let outcome = match self.dispatch_read(call, &key) {
            Ok(outcome) => outcome,
            Err(paused) => return Arc::new(Err(paused)),
        };
        self.ledger.used(&key, &outcome);
        outcome
    }

    /// A read of the tool `tool` (its shared name), through the ledger, which says which
    /// occurrence of the read it is.
    fn read(&self, call: Call, tool: Arc<str>) -> Outcome {
        let mut key = ReadKey::first(self.ledger.epoch(), tool, Arc::clone(&call.args_key));
        match self.ledger.read(&mut key) {
            Read::Repeat(outcome) => {
                Tally::add(&self.counts.deduplicated);
                outcome
            }
            Read::Replayed(outcome) => {
                Tally::add(&self.counts.replayed);
                self.ledger.answered(&key);
                outcome
            }
            Read::Claimed(outcome) => {
                self.ledger.used(&key, &outcome);
                outcome
            }
            Read::Dispatch(cell) => match self.dispatch_read(call, &key) {
                Ok(result) => {
                    let outcome = self.ledger.land(&key, cell, result);
                    self.ledger.used(&key, &outcome);
                    outcome
                }
                Err(paused) => self.ledger.land(&key, cell, Arc::new(Err(paused))),
            },
        }
    }

    /// Dispatches the script's read at `key`; `Err` with the run's pause when the guard asks a
    /// person about it (the read, never made, is not journaled).
    fn dispatch_read(&self, call: Call, key: &ReadKey) -> Result<Outcome, ToolError> {
        let fixture = self.ledger.fixture_occurrence(key);
        let call = call
            .read_at(ReadAt::new(key.epoch, key.n))
            .fixture_at(fixture);
        // Only the guard pauses a read: without one, the call is not kept for a pause.
        let kept = self.ctx.registry.guard().is_active().then(|| call.clone());
        let outcome = self.dispatch(call, true);
        match (kept, &*outcome) {
            (Some(call), Err(e)) if e.kind == ErrorKind::Paused => Err(self.pause_read(&call)),
            _ => Ok(outcome),
        }
    }

    /// Runs the dispatch path and blocks this thread until it is done. While it waits, the
    /// scout starts the reads it held for this one, a `read`, to reach: not for a non-read
    /// call, which ends the epoch they belong to.
    fn dispatch(&self, call: Call, read: bool) -> Outcome {
        let ctx = Arc::clone(&self.ctx);
        let call = || async move { dispatch_shared(&ctx, call).await };
        let waits = || self.ledger.executor_waits(read);
        block_on_noting(&self.handle, call, waits).unwrap_or_else(|| {
            Arc::new(Err(ToolError::internal(
                "the call was abandoned because the async runtime shut down",
            )))
        })
    }
}

/// Whatever ended the script, as the run's error, diagnosed knowing the run's tools and the
/// script's functions: a function that exists nowhere is an unknown tool (with the closest
/// tool name as the hint), a tool given positional arguments names its parameters.
fn run_error(
    error: rhai::EvalAltResult,
    engine: &Engine,
    ast: &AST,
    registry: &crate::tool::Registry,
    limits: &Limits,
) -> RunError {
    let mut error = error;
    // Rhai gives a data race no position: it is placed at the call of the function it names
    // (the first, when the script calls it more than once).
    if error.position().is_none() {
        if let rhai::EvalAltResult::ErrorDataRace(text, _) = &error {
            let function = engine::diagnose::data_race_function(text);
            let mut at = None;
            crate::rhai_ast::visit(ast, |node| {
                if let crate::rhai_ast::Node::Call(call) = node {
                    if call.name() == function {
                        at = Some(call.position());
                    }
                }
                at.is_none()
            });
            if let Some(at) = at {
                error.set_position(at);
            }
        }
    }
    let functions = known_functions(engine, ast);
    let exists = |name: &str| functions.contains(name);
    let known = engine::diagnose::Known {
        registry: Some(registry),
        functions: &exists,
    };
    engine::from_rhai_with(error, limits, Some(&known))
}

/// What the executor hands back to the runtime.
pub(crate) struct Execution {
    pub(crate) result: Result<Value, RunError>,
    pub(crate) logs: Vec<String>,
    pub(crate) counts: Counts,
    /// The call the run paused at.
    pub(crate) pending: Option<PendingCall>,
    /// Results of tools with a result policy of their own.
    pub(crate) results: ToolResults,
    /// Reads of fields the maps did not have.
    pub(crate) warnings: Warnings,
}

/// Runs a compiled script to its end on the current thread (a thread of its own, never an async
/// worker: every tool call blocks it), under `watch` (the run's deadline and cancellation).
pub(crate) fn execute(
    ast: &AST,
    fields: Option<Arc<crate::rhai_ast::fields::FieldPlan>>,
    ctx: Arc<RunContext>,
    ledger: Arc<RunLedger>,
    handle: tokio::runtime::Handle,
    limits: &Limits,
    watch: RunControls,
) -> Execution {
    let operations = Arc::new(AtomicU64::new(0));
    // While the script sleeps, the executor waits as it does for a call.
    let waits = Arc::clone(&ledger);
    let watch = RunControls {
        operations: Some(Arc::clone(&operations)),
        sleeps: Some(Arc::new(move |sleep: &mut dyn FnMut()| {
            let _waiting = waits.executor_waits(true);
            sleep();
        })),
        ..watch
    };
    let cancelled = watch.cancel.clone();
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
        counts: Tally::default(),
        polls: Mutex::default(),
        stop: Mutex::default(),
        stopping: AtomicBool::new(false),
        pending: Mutex::default(),
        divergence: Mutex::default(),
        results: Mutex::default(),
    });
    let exec = Arc::clone(&executor);
    let call: ToolCall = Arc::new(move |at, name, args| {
        // A run whose receipts can no longer be written stops before its next call, and the
        // script cannot catch that.
        let failed = |exec: &Executor| {
            if let Some(why) = exec.ctx.receipts_failure() {
                return Some(crate::dispatch::receipts_failed(&why).message);
            }
            if let Some(why) = exec.ctx.journal.as_ref().and_then(|j| j.failure()) {
                return Some(format!(
                    "the run's journal could not be written ({why}); it makes no further call"
                ));
            }
            // A run whose caller went away (its future dropped) makes no further call, even
            // before the engine's next check of its token.
            if cancelled.as_ref().is_some_and(|c| c.is_cancelled()) {
                return Some(
                    "the run was cancelled: its caller went away; it makes no further call".into(),
                );
            }
            exec.stopped()
        };
        let stop = |message: String| {
            let token = Dynamic::from(format!("{}{message}", engine::STOPPED));
            Err(Box::new(rhai::EvalAltResult::ErrorTerminated(token, at)))
        };
        if let Some(message) = failed(&exec) {
            return stop(message);
        }
        let outcome = exec.call(name, args);
        if let Some(message) = exec.stopped() {
            return stop(message);
        }
        engine::outcome_to_rhai(&outcome, at)
    });
    engine::register_tool_functions(&mut engine, &executor.ctx.registry, call);
    // Reads of missing fields are watched where the script does not handle them; the script
    // is then the one whose computed assignments are marked, if it has any.
    let warnings = Arc::new(Mutex::new(Warnings::default()));
    if let Some(plan) = &fields {
        warnings::watch(&mut engine, Arc::clone(plan), Arc::clone(&warnings));
    }
    let ast = fields.as_deref().and_then(|p| p.marked()).unwrap_or(ast);

    let _span = tracing::debug_span!("script").entered();
    let result = engine
        .eval_ast_with_scope::<Dynamic>(&mut engine::run_scope(&executor.ctx), ast)
        .map_err(|e| run_error(*e, &engine, ast, &executor.ctx.registry, limits))
        .and_then(|value| {
            engine::to_json(&value).map_err(|e| {
                RunError::new(
                    ErrorKind::ScriptError,
                    format!("the script's value cannot be returned: {e}"),
                )
            })
        });
    drop(engine);
    let mut counts = executor.counts.counts();
    counts.operations = operations.load(Ordering::Relaxed);
    let logs = std::mem::take(&mut lock(&logs).lines);
    let pending = lock(&executor.pending).take();
    let results = std::mem::take(&mut *lock(&executor.results));
    let warnings = std::mem::take(&mut *lock(&warnings));
    Execution {
        result,
        logs,
        counts,
        pending,
        results,
        warnings,
    }
}
