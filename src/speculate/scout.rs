//! The scout: an advisory run of the same script on a second engine that never blocks. Reads
//! return placeholders at once and are dispatched (marked speculative) into the run ledger;
//! reads whose arguments are not known yet become deferred calls, dispatched the moment their
//! inputs resolve. At a non-read call the scout stops, unless the executor already made that
//! exact call. The scout never changes a run's result: the executor only claims outcomes of
//! the calls it makes itself.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio_util::sync::CancellationToken;

use rhai::{Dynamic, Engine, EvalAltResult, Position};
use serde_json::Value;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use super::functions::ScoutScript;
use super::placeholder::{self, resolve_deep, PassLog, Placeholder, Resolution};

use crate::dispatch::{dispatch_shared, Call, Caller, RunContext};
use crate::engine::{self, outcome_to_rhai, Limits};
use crate::error::{ErrorKind, ToolError};
use crate::json::{key_json, key_json_shared};
use crate::ledger::{made_again, HeldRead, Hold, Launch, OutcomeSlot, ReadKey, RunLedger};
use crate::sync::lock;
use crate::tool::Effect;

/// Why a pass ended.
#[derive(Debug, PartialEq)]
enum End {
    /// The script ran to its end.
    Finished,
    /// It reached the executor's `k`-th non-read call before the executor made it.
    Write(usize),
    /// It held [`HELD_IN_A_ROW`] reads in a row for the executor, and nothing else: the
    /// executor keeps up with it, and the scout only costs it CPU until the executor waits.
    Behind,
    /// Anything else: an error, a wrong guess at a non-read call, a cap.
    Stopped,
}

/// One pass's report.
struct Report {
    end: End,
    pending: Vec<Arc<OutcomeSlot>>,
    /// Reads started or deferred.
    started: u64,
    /// Reads the caps on reads in flight turned away: a later pass may start them.
    busy: bool,
}

/// Per-pass state the tool functions update.
#[derive(Default)]
struct Pass {
    /// Non-read calls passed (the scout's epoch).
    writes: usize,
    stop: Option<End>,
    started: u64,
    deferred: u64,
    /// The pass stopped at its cap on the depth of deferred calls.
    capped: bool,
    /// A read was turned away by the caps on reads in flight.
    busy: bool,
    /// Reads held for the executor since the pass last started or deferred one.
    held_in_row: u32,
    /// The occurrence the pass is at, by read (its first occurrence's key), for the reads whose
    /// earlier occurrences it saw fail in a way that makes the next call a new one
    /// ([`crate::ledger::made_again`]); 0 for every other. Shared with the deferred calls the
    /// pass makes (it changes only at such a failure, rarely), which take it as it was.
    occurrences: Arc<HashMap<ReadKey, u64>>,
}

impl Pass {
    /// The occurrence of the read `first` (a first occurrence's key) the pass is at.
    fn occurrence(&self, first: &ReadKey) -> ReadKey {
        occurrence_in(&self.occurrences, first)
    }
}

/// The occurrence of the read `first` that `occurrences` says a pass is at.
fn occurrence_in(occurrences: &HashMap<ReadKey, u64>, first: &ReadKey) -> ReadKey {
    first.occurrence(occurrences.get(first).copied().unwrap_or(0))
}

/// How deep a chain of deferred calls (each waiting for the one before) the first pass may
/// build; each pass that reaches the cap doubles it. A dependency chain (pagination) then costs
/// the scout work in proportion to its length, as passes grow geometrically, and a short chain
/// does not pay for a long one. Independent deferred calls (one per item of a fan-out) are one
/// deep and only bounded by `SpeculationLimits::max_deferred_per_pass`.
const FIRST_DEPTH_CAP: u64 = 16;

/// How many reads in a row a pass holds for the executor, starting or deferring none, before
/// it ends and leaves the script to the executor until the executor waits for a call: a loop
/// over a tool that answers at once has nothing for the scout to do.
const HELD_IN_A_ROW: u32 = 32;

/// How long the executor waits, at most, for the scout's passes to end when it stands down.
const STAND_DOWN_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// Counts a pass as running until it is dropped.
struct Running<'a>(&'a AtomicU64);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The scout of one run.
pub(crate) struct Scout {
    ctx: Arc<RunContext>,
    ledger: Arc<RunLedger>,
    /// The script rewritten for the scout: its main body and its functions' bodies.
    script: Arc<ScoutScript>,
    limits: Limits,
    /// The run's deadline: every pass meets the same one.
    deadline: Instant,
    handle: Handle,
    /// Speculative dispatches, awaited when the run ends (cancelled, they end at once and
    /// still write their receipts).
    dispatches: Mutex<Vec<JoinHandle<()>>>,
    /// Deferred calls, aborted when the run ends.
    deferred: Mutex<Vec<JoinHandle<()>>>,
    /// Ends a running pass: the run's speculation node of its cancellation tree, so that
    /// stopping the scout also cancels the speculative calls still running.
    stop: CancellationToken,
    /// Ends the passes alone, not the calls they started (a child of `stop`): a scout over a
    /// prefix of a streamed script halts when a longer prefix takes over.
    halt: CancellationToken,
    /// Interpreter operations of all passes.
    operations: AtomicU64,
    /// The current pass's cap on the depth of deferred calls.
    depth_cap: AtomicU64,
    /// Passes running now (a pass runs on a thread of its own).
    passes: AtomicU64,
}

impl Scout {
    pub(crate) fn new(
        ctx: Arc<RunContext>,
        ledger: Arc<RunLedger>,
        script: Arc<ScoutScript>,
        limits: Limits,
        deadline: Instant,
        handle: Handle,
    ) -> Arc<Scout> {
        Arc::new(Scout {
            halt: ctx.speculation.child_token(),
            stop: (*ctx.speculation).clone(),
            ctx,
            ledger,
            script,
            limits,
            deadline,
            handle,
            dispatches: Mutex::default(),
            deferred: Mutex::default(),
            operations: AtomicU64::new(0),
            depth_cap: AtomicU64::new(FIRST_DEPTH_CAP),
            passes: AtomicU64::new(0),
        })
    }

    /// Stops the scout for the rest of the run and waits (a moment at most) until no pass
    /// runs, so that what the passes built is let go of: the executor asks it when the
    /// process is over the memory budget, which the scout's copies must never make it meet.
    /// Its speculative calls are cancelled, and the executor makes them itself.
    pub(crate) fn stand_down(&self) -> bool {
        self.stop();
        let until = std::time::Instant::now() + STAND_DOWN_WAIT;
        while self.passes.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        tracing::debug!("the scout stood down: the process was over the memory budget");
        true
    }

    /// Runs passes until the scout has nothing more to learn, the pass cap is reached, or the
    /// run ends; returns the number of passes.
    pub(crate) async fn drive(self: Arc<Self>) -> u64 {
        let mut passes = 0;
        let mut quiet = 0u32;
        let mut progress = self.ledger.watch_progress();
        while passes < self.ledger.limits().max_passes && !self.ledger.is_closed() {
            // The writes made before the pass began: one made since is news to the scout.
            let seen = self.ledger.epoch();
            // A pass runs on a thread with a script's stack, like the executor.
            let (scout, (tx, rx)) = (Arc::clone(&self), tokio::sync::oneshot::channel());
            if engine::spawn_script_thread("toolscript-scout", move || {
                crate::sync::run_behind();
                let _ = tx.send(scout.pass());
            })
            .is_err()
            {
                break;
            }
            let Ok(report) = rx.await else {
                break;
            };
            passes += 1;
            tracing::debug!(pass = passes, end = ?report.end, started = report.started,
                pending = report.pending.len(), "scout pass");
            quiet = if report.started < 2 { quiet + 1 } else { 0 };
            // Reads the in-flight caps turned away (a fan-out larger than they allow): the next
            // pass starts them as soon as one in flight lands, whatever else the pass found.
            if report.busy && !matches!(report.end, End::Write(_) | End::Behind) {
                if progress.changed().await.is_err() || self.ledger.is_closed() {
                    return passes;
                }
                continue;
            }
            match report.end {
                End::Behind => {
                    // Until the executor waits for a call (or the run ends): then a pass may
                    // get ahead of it again. Nothing else it does is news meanwhile, and with
                    // no one watching, its progress wakes no one.
                    drop(progress);
                    tokio::select! {
                        () = self.ledger.executor_waited() => {}
                        () = self.stop.cancelled() => return passes,
                    }
                    if self.ledger.is_closed() {
                        return passes;
                    }
                    progress = self.ledger.watch_progress();
                    continue;
                }
                End::Finished if report.pending.is_empty() => break,
                // Stopped at a non-read call the executor has not made: wait for it, or for
                // the reads whose guessed values led there (the guess may have been wrong).
                End::Write(k) => {
                    let landed: futures::future::BoxFuture<'_, ()> = if report.pending.is_empty() {
                        Box::pin(futures::future::pending())
                    } else {
                        Box::pin(all_landed(&report.pending))
                    };
                    tokio::pin!(landed);
                    while self.ledger.epoch() as usize <= k {
                        tokio::select! {
                            _ = &mut landed => break,
                            changed = progress.changed() => {
                                if changed.is_err() || self.ledger.is_closed() {
                                    return passes;
                                }
                            }
                        }
                    }
                }
                _ if report.pending.is_empty() => break,
                _ => {
                    let all = all_landed(&report.pending);
                    tokio::pin!(all);
                    loop {
                        tokio::select! {
                            _ = &mut all => break,
                            changed = progress.changed() => {
                                if changed.is_err() || self.ledger.is_closed() {
                                    return passes;
                                }
                            }
                        }
                    }
                }
            }
            // A scout that keeps learning little sleeps until the executor has missed 2, 4,
            // 8, ... more reads: a pure dependency chain then costs linear work.
            // A write made since the pass began wakes it at once, and it starts afresh: after
            // a write the script often fans out over what the write returned.
            if quiet >= 3 {
                let wake = self.ledger.misses() + (1u64 << (quiet - 2).min(16));
                while self.ledger.misses() < wake && !self.ledger.is_closed() {
                    if self.ledger.epoch() != seen {
                        quiet = 0;
                        break;
                    }
                    if progress.changed().await.is_err() {
                        return passes;
                    }
                }
            }
        }
        passes
    }

    /// Runs passes as [`Scout::drive`] does until [`Scout::halt`]: the scout of a prefix of a
    /// streamed script.
    pub(crate) async fn drive_until_halted(self: Arc<Self>) -> u64 {
        let halted = self.halt.clone();
        tokio::select! {
            passes = self.drive() => passes,
            () = halted.cancelled() => 0,
        }
    }

    /// Ends the running pass and every pass to come, but not the reads the passes started:
    /// they stay in the ledger for the run to claim.
    pub(crate) fn halt(&self) {
        self.halt.cancel();
    }

    /// Interpreter operations of all passes so far.
    pub(crate) fn operations(&self) -> u64 {
        self.operations.load(Ordering::Relaxed)
    }

    /// Stops the running pass and every pass to come, and cancels the speculative calls still
    /// running; [`Scout::finish`] also waits for them.
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }

    /// Ends the scout: the running pass stops, wasted reads are cancelled, and every task is
    /// done when this returns.
    pub(crate) async fn finish(&self) {
        self.stop();
        for task in take(&self.deferred) {
            task.abort();
            let _ = task.await;
        }
        for task in take(&self.dispatches) {
            let _ = task.await;
        }
    }

    fn spawn(
        &self,
        into: &Mutex<Vec<JoinHandle<()>>>,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let handle = self.handle.spawn(task);
        let mut tasks = lock(into);
        // Finished tasks are dropped only when the list would grow, so that a run's spawns
        // cost amortised constant time rather than a walk of the list each.
        if tasks.len() == tasks.capacity() {
            tasks.retain(|t| !t.is_finished());
        }
        tasks.push(handle);
    }

    /// One pass over the script, on a script thread of its own.
    fn pass(self: &Arc<Self>) -> Report {
        self.passes.fetch_add(1, Ordering::SeqCst);
        let _running = Running(&self.passes);
        let operations = Arc::new(AtomicU64::new(0));
        let watch = engine::RunControls {
            deadline: Some(self.deadline),
            cancel: Some(self.halt.clone()),
            operations: Some(Arc::clone(&operations)),
            // The scout never waits for what the executor would wait for.
            skip_sleep: true,
            ..engine::RunControls::default()
        };
        // A pass stops at half the memory budget, well before the executor could meet it.
        let mut limits = self.limits.clone();
        limits.max_memory_mb = (limits.max_memory_mb / 2).max(1);
        let mut engine = engine::new_engine(&limits, watch);
        let pass = Arc::new(Mutex::new(Pass::default()));
        // What the pass's decisions waited for and what it guessed: the pass's own, handed to
        // every function it registers, and gone with its engine.
        let log = Arc::new(PassLog::default());
        self.register_tools(&mut engine, &pass, &log);
        let result = engine
            .eval_ast_with_scope::<Dynamic>(&mut engine::run_scope(&self.ctx), self.script.ast());
        if lock(&pass).capped {
            let cap = self.depth_cap.load(Ordering::Relaxed);
            let max = self.ledger.limits().max_deferred_per_pass;
            self.depth_cap.store((cap * 2).min(max), Ordering::Relaxed);
        }
        self.operations
            .fetch_add(operations.load(Ordering::Relaxed), Ordering::Relaxed);
        let mut pass = std::mem::take(&mut *lock(&pass));
        let end = match (result, pass.stop.take()) {
            (_, Some(stop)) => stop,
            (Ok(_), None) => End::Finished,
            (Err(_), None) => {
                // Not the error's words: they may hold what the script computed.
                tracing::trace!("scout pass stopped on an error");
                End::Stopped
            }
        };
        Report {
            end,
            pending: log.take_pending(),
            started: pass.started,
            busy: pass.busy,
        }
    }

    fn register_tools(
        self: &Arc<Self>,
        engine: &mut Engine,
        pass: &Arc<Mutex<Pass>>,
        log: &Arc<PassLog>,
    ) {
        let (scout, pass_, log_) = (Arc::clone(self), Arc::clone(pass), Arc::clone(log));
        let call: engine::ToolCall =
            Arc::new(move |_, name, args| scout.call(&pass_, &log_, name, args.clone()));
        engine::register_tool_functions(engine, &self.ctx.registry, call);
        // The script's own functions are reserved too: Rhai also reports a missing function
        // when it tries a closure with a `this` first (`reduce` does), and the scout must let it
        // go on to the call that fits.
        let reserved: Vec<String> = std::iter::once("tool".to_string())
            .chain(
                self.ctx
                    .registry
                    .iter()
                    .map(|t| t.function_name().to_string()),
            )
            .chain(self.script.names().map(str::to_string))
            .collect();
        placeholder::register(engine, reserved.into(), log);
        self.script.register(engine);
    }

    /// A tool call in the scout.
    fn call(
        self: &Arc<Self>,
        pass: &Mutex<Pass>,
        log: &PassLog,
        name: &str,
        args: Dynamic,
    ) -> Result<Dynamic, Box<EvalAltResult>> {
        let mut state = lock(pass);
        let Some(tool) = self.ctx.registry.get(name) else {
            return Err(stop(&mut state, End::Stopped));
        };
        let spec = &tool.spec;
        if spec.effect != Effect::Read {
            return self.pass_non_read(&mut state, log, &spec.name, &args);
        }
        if !tool.speculable {
            return Ok(Placeholder::unknown());
        }
        let epoch = state.writes as u64;
        match resolve_deep(&args, log) {
            Resolution::Never => Ok(Placeholder::unknown()),
            Resolution::Ready(args) => {
                let first = ReadKey::first(epoch, Arc::clone(&tool.name), key_json_shared(&args));
                let key = state.occurrence(&first);
                let n = key.n;
                // A read a person would be asked about may pause the run there: the pass
                // starts nothing from it on until a person has decided.
                if self.asks_a_person(tool, &args, &key) {
                    return Err(stop(&mut state, End::Stopped));
                }
                let quick = tool.pace.is_quick();
                let Some(cell) = self.launch(key, args, quick, &mut state) else {
                    return Ok(Placeholder::unknown());
                };
                if state.held_in_row >= HELD_IN_A_ROW {
                    return Err(stop(&mut state, End::Behind));
                }
                let Some(outcome) = cell.get() else {
                    // Until it lands, the pass takes a repeat of this read to be answered by it,
                    // as it is unless it fails: a retry is started only after its failure.
                    return Ok(Dynamic::from(Placeholder::of(cell)));
                };
                if made_again(&outcome) {
                    Arc::make_mut(&mut state.occurrences).insert(first, n + 1);
                }
                outcome_to_rhai(&outcome, Position::NONE)
            }
            Resolution::Pending(inputs) => {
                // Whether the guard asks about a read is known only with its arguments: one
                // it may ask about may pause the run, and the pass goes no further.
                let guard = self.ctx.registry.guard();
                if guard.is_active() && guard.may_ask(&spec.name, &spec.guard) {
                    return Err(stop(&mut state, End::Stopped));
                }
                let depth = 1 + inputs.iter().map(|c| c.depth()).max().unwrap_or(0);
                if u64::from(depth) > self.depth_cap.load(Ordering::Relaxed) {
                    state.capped = true;
                    return Err(stop(&mut state, End::Stopped));
                }
                if state.deferred >= self.ledger.limits().max_deferred_per_pass {
                    return Err(stop(&mut state, End::Stopped));
                }
                state.deferred += 1;
                state.started += 1;
                state.held_in_row = 0;
                let cell = OutcomeSlot::at_depth(depth);
                // The guesses this pass made over the same reads: the call is on the path
                // they chose, and is not started if one of them proves wrong.
                let guesses = log.guesses_over(&inputs);
                let (scout, out, tool) =
                    (Arc::clone(self), Arc::clone(&cell), Arc::clone(&tool.name));
                let call = Deferred {
                    epoch,
                    tool,
                    args,
                    inputs,
                    guesses,
                    occurrences: Arc::clone(&state.occurrences),
                };
                self.spawn(
                    &self.deferred,
                    async move { scout.deferred(call, out).await },
                );
                Ok(Dynamic::from(Placeholder::of(cell)))
            }
        }
    }

    /// Whether the guard would ask a person about a read of `spec` with `args` (and no person
    /// approved its rule in this run): the executor's call of it may pause the run.
    fn asks_a_person(
        &self,
        tool: &crate::tool::RegisteredTool,
        args: &Value,
        key: &ReadKey,
    ) -> bool {
        let guard = self.ctx.registry.guard();
        if !guard.is_active() {
            return false;
        }
        let spec = &tool.spec;
        let crate::guard::Decision::Ask { rule, .. } =
            guard.authorize(&spec.name, spec.effect, &spec.guard, args)
        else {
            return false;
        };
        // A person approved the rule in this run, or this very read.
        let Some(journal) = self.ctx.journal.as_ref() else {
            return true;
        };
        let redacts = tool.redacts(crate::secrets::Side::Args);
        let form = journal.args_form(self.ctx.masks(), &key.args, redacts);
        !(journal.rule_approved(&rule)
            || journal.read_approved(key.epoch, &spec.name, &form, key.n))
    }

    /// A non-read call: passed with the executor's recorded outcome if the executor already made
    /// exactly this call; otherwise the pass stops.
    fn pass_non_read(
        &self,
        state: &mut Pass,
        log: &PassLog,
        tool: &str,
        args: &Dynamic,
    ) -> Result<Dynamic, Box<EvalAltResult>> {
        let k = state.writes;
        let Some(record) = self.ledger.write(k) else {
            return Err(stop(state, End::Write(k)));
        };
        let Resolution::Ready(args) = resolve_deep(args, log) else {
            return Err(stop(state, End::Stopped));
        };
        if record.tool != tool || record.args != key_json(&args) {
            return Err(stop(state, End::Stopped));
        }
        state.writes += 1;
        outcome_to_rhai(&record.outcome, Position::NONE)
    }

    /// Starts the read `key` with `args` (or joins the entry already there); `None` when the
    /// ledger refuses. The read of a `quick` tool is held instead while the executor runs
    /// ([`RunLedger::hold`]).
    fn launch(
        self: &Arc<Self>,
        key: ReadKey,
        args: Value,
        quick: bool,
        state: &mut Pass,
    ) -> Option<Arc<OutcomeSlot>> {
        let args = if quick {
            match self.ledger.hold(&key, args) {
                Hold::Held(cell) => {
                    state.started += 1;
                    state.held_in_row += 1;
                    return Some(cell);
                }
                Hold::Launch(args) => args,
            }
        } else {
            args
        };
        match self.ledger.launch(&key) {
            Launch::Existing(cell) => Some(cell),
            Launch::Refused => None,
            Launch::Busy => {
                state.busy = true;
                None
            }
            Launch::Start(cell, speculation) => {
                state.started += 1;
                state.held_in_row = 0;
                let read = self.read(key, args, Arc::clone(&cell), speculation);
                // A read that lands at once is done here; only one that waits becomes a task.
                if let Some(rest) = engine::poll_once(&self.handle, read) {
                    self.spawn(&self.dispatches, rest);
                }
                Some(cell)
            }
        }
    }

    /// The speculative read `key` the ledger started: dispatched with `args` into `cell`,
    /// then counted as landed.
    fn read(
        &self,
        key: ReadKey,
        args: Value,
        cell: Arc<OutcomeSlot>,
        speculation: Arc<crate::dispatch::Speculation>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (ctx, ledger) = (Arc::clone(&self.ctx), Arc::clone(&self.ledger));
        let fixture = self.ledger.fixture_occurrence(&key);
        async move {
            let tool = Arc::clone(&key.tool);
            let call = Call {
                tool: Arc::clone(&tool),
                args,
                args_key: key.args,
                caller: Caller::Scout(speculation),
                seq: None,
                idempotency_key: None,
                read_at: None,
                fixture,
                planned: false,
            };
            cell.set_shared(dispatch_shared(&ctx, call).await);
            ledger.landed(&tool);
        }
    }

    /// Has the ledger call [`Scout::start_held`] when the executor is about to wait: the run's
    /// own scout (not a scout of a streamed prefix, whose tasks end before the run starts).
    pub(crate) fn starts_held_reads(self: &Arc<Self>) {
        let scout = Arc::downgrade(self);
        self.ledger.set_starter(Box::new(move || {
            if let Some(scout) = scout.upgrade() {
                scout.start_held();
            }
        }));
    }

    /// Starts the reads held for the executor, which is about to wait (they are dispatched as
    /// tasks: this runs on the executor's thread). Nothing once the scout is stopped: the
    /// executor makes them itself.
    fn start_held(&self) {
        if self.stop.is_cancelled() {
            return;
        }
        for held in self.ledger.start_held() {
            let HeldRead {
                key,
                args,
                cell,
                speculation,
            } = held;
            self.spawn(&self.dispatches, self.read(key, args, cell, speculation));
        }
    }

    /// A deferred call: waits for its inputs, then starts the read and forwards its outcome,
    /// unless a guess it was made under proved wrong.
    async fn deferred(self: Arc<Self>, call: Deferred, out: Arc<OutcomeSlot>) {
        let Deferred {
            epoch,
            tool,
            args,
            inputs,
            guesses,
            occurrences,
        } = call;
        let mut pending = inputs;
        let ready = loop {
            futures::future::join_all(pending.iter().map(|c| c.wait())).await;
            // Outside any pass: what it waits for is no pass's to note.
            match resolve_deep(&args, &PassLog::default()) {
                Resolution::Ready(args) => break Some(args),
                Resolution::Pending(more) => pending = more,
                Resolution::Never => break None,
            }
        };
        // The reads it waited for are known now, and often so are the conditions guessed on
        // them: a call down a branch the run does not take would only be wasted.
        let ready = ready.filter(|_| !guesses.iter().any(|g| g.proved_wrong()));
        let cell = ready.and_then(|args| {
            let quick = self
                .ctx
                .registry
                .get(&tool)
                .is_some_and(|t| t.pace.is_quick());
            let first = ReadKey::first(epoch, tool, key_json_shared(&args));
            let key = occurrence_in(&occurrences, &first);
            self.launch(key, args, quick, &mut Pass::default())
        });
        match cell {
            Some(cell) => out.set(Arc::unwrap_or_clone(cell.wait().await)),
            None => out.set(Err(ToolError::new(
                ErrorKind::Cancelled,
                "a deferred speculative read was not started",
            ))),
        }
    }
}

/// A read whose arguments wait for reads in flight, as a pass made it.
struct Deferred {
    epoch: u64,
    tool: Arc<str>,
    args: Dynamic,
    /// The reads its arguments wait for.
    inputs: Vec<Arc<OutcomeSlot>>,
    /// The guesses the pass made over those reads before the call.
    guesses: Vec<Arc<placeholder::Guess>>,
    /// The occurrences the pass was at when it made the call (see [`Pass::occurrences`]).
    occurrences: Arc<HashMap<ReadKey, u64>>,
}

/// Waits until every one of `pending` has landed, from the last to the first: they land in
/// about the order a pass met them (the executor makes held reads in that order), so the
/// waiter wakes about once rather than at every one.
async fn all_landed(pending: &[Arc<OutcomeSlot>]) {
    for cell in pending.iter().rev() {
        cell.wait().await;
    }
}

fn take(tasks: &Mutex<Vec<JoinHandle<()>>>) -> Vec<JoinHandle<()>> {
    std::mem::take(&mut *lock(tasks))
}

/// Ends the pass where it is; `try`/`catch` cannot catch it.
fn stop(state: &mut Pass, end: End) -> Box<EvalAltResult> {
    if state.stop.is_none() {
        state.stop = Some(end);
    }
    Box::new(EvalAltResult::ErrorTerminated(
        Dynamic::from("scout stop"),
        Position::NONE,
    ))
}
