//! The run ledger: what the run's meaning keeps between calls, for the executor and the scout
//! alike. The epoch (how many non-read calls the executor has completed, derived from its write
//! log), the reads of each epoch keyed by (epoch, tool, canonical arguments, occurrence) —
//! whether the executor made them or the scout started them early — and the one claim
//! operation by which the executor takes a speculative outcome as its own.
//!
//! A sequential run uses it too: its reads are de-duplicated here within an epoch. An identical
//! read is answered by the epoch's earlier one unless that one failed in a way the same call
//! may not fail again ([`made_again`]): then it is the read's next *occurrence*, a call of its
//! own, so that a retry loop a model writes retries.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use serde_json::Value;
use tokio::sync::{watch, Notify};

use crate::dispatch::{Claim, RunContext, Speculation};
use crate::error::ToolError;
use crate::sync::lock;

/// A read call as the run's meaning sees it: identical reads in one epoch are one call, one
/// occurrence of the read.
///
/// Its strings are shared, not owned: the tool's name with the registry, the arguments with
/// the call, so that a key is made, kept in the ledger and copied without copying its text.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ReadKey {
    /// Non-read calls completed before this one.
    pub(crate) epoch: u64,
    pub(crate) tool: Arc<str>,
    /// Canonical JSON of the arguments.
    pub(crate) args: Arc<str>,
    /// Which occurrence of the read in its epoch, from 0: the next one begins after each
    /// failure [`made_again`] names (and at every call of a polling tool). The journal keeps
    /// reads by it, so that a resume replays a failure and its retry each as it was.
    pub(crate) n: u64,
}

impl ReadKey {
    /// The first occurrence of `tool` with `args` in `epoch`.
    pub(crate) fn first(epoch: u64, tool: Arc<str>, args: Arc<str>) -> ReadKey {
        ReadKey {
            epoch,
            tool,
            args,
            n: 0,
        }
    }

    /// The same read's occurrence `n`.
    pub(crate) fn occurrence(&self, n: u64) -> ReadKey {
        ReadKey { n, ..self.clone() }
    }
}

/// Whether the next identical read in the same epoch is a new call rather than answered by
/// this outcome: the one rule that makes a model's retry loop retry.
///
/// It is the error's own word: [`ToolError::recoverable`], "the same call may succeed later
/// unchanged" — by default true for `timeout`, `unavailable` and `circuit_open`
/// ([`ErrorKind::default_recoverable`](crate::ErrorKind::default_recoverable)) and false for
/// every other kind, and a tool may say otherwise for its own errors (a `rate_limited` that
/// passes, an `unavailable` that will not). A success, and a failure the same call would meet
/// again (`invalid_input`, `not_found`, `budget_exceeded`...), answer every later identical
/// read of the epoch. The journal keeps the flag, so a resume decides as the first process did.
pub(crate) fn made_again(outcome: &Result<Value, ToolError>) -> bool {
    matches!(outcome, Err(e) if e.recoverable)
}

pub(crate) use crate::error::Outcome;

/// Where a value that arrives later lands: one read's outcome. Waited for by the executor (blocking) and by
/// deferred scout calls (async).
#[derive(Debug)]
pub(crate) struct OutcomeSlot {
    /// Set once, when the outcome arrives.
    outcome: OnceLock<Outcome>,
    /// Wakes the async waiters (and, through them, the blocking ones) when it is set.
    landed: Notify,
    /// How many deferred calls lead to this value: 0 for a read started with known arguments.
    depth: u32,
    /// What the scout may take this value to be until it lands (see [`Prediction`]).
    prediction: Option<Prediction>,
}

/// An identical read's value in an earlier epoch: the scout's guess at a read still in flight.
///
/// Only the scout ever looks at it, to decide which reads to start; the executor claims only
/// the read's own outcome. Most reads return what they returned before the last write (a
/// write touches one record of many), so a guess from the earlier value lets the scout decide
/// conditions and start the reads that depend on this one without waiting a round trip. A
/// wrong guess costs wasted reads, and a tool whose values keep changing stops being guessed
/// (see [`PredictionRecord`]).
#[derive(Debug)]
struct Prediction {
    /// Always a success: errors are not guessed.
    value: Outcome,
    record: Arc<PredictionRecord>,
}

/// How one tool's predictions have fared in this run.
#[derive(Debug, Default)]
pub(crate) struct PredictionRecord {
    right: AtomicU32,
    wrong: AtomicU32,
}

impl PredictionRecord {
    /// Guess while at most one in five guesses (and at least one) has been wrong.
    fn trusted(&self) -> bool {
        self.wrong.load(Ordering::Relaxed) * 4 <= self.right.load(Ordering::Relaxed) + 4
    }
}

impl OutcomeSlot {
    pub(crate) fn new() -> Arc<OutcomeSlot> {
        OutcomeSlot::at_depth(0)
    }

    pub(crate) fn at_depth(depth: u32) -> Arc<OutcomeSlot> {
        OutcomeSlot::with(depth, None)
    }

    fn with(depth: u32, prediction: Option<Prediction>) -> Arc<OutcomeSlot> {
        Arc::new(OutcomeSlot {
            outcome: OnceLock::new(),
            landed: Notify::new(),
            depth,
            prediction,
        })
    }

    /// The value the scout may take this read to have while it is in flight: an identical
    /// read's in an earlier epoch, if the tool's guesses have been good.
    pub(crate) fn predicted(&self) -> Option<&Value> {
        let prediction = self.prediction.as_ref()?;
        if !prediction.record.trusted() {
            return None;
        }
        prediction.value.as_ref().as_ref().ok()
    }

    pub(crate) fn depth(&self) -> u32 {
        self.depth
    }

    /// The outcome, if it has arrived.
    pub(crate) fn get(&self) -> Option<Outcome> {
        self.outcome.get().cloned()
    }

    /// Sets the outcome; later calls change nothing.
    pub(crate) fn set(&self, outcome: Result<Value, ToolError>) {
        if self.outcome.get().is_none() {
            self.set_shared(Arc::new(outcome));
        }
    }

    /// Sets the outcome, shared; later calls change nothing.
    pub(crate) fn set_shared(&self, outcome: Outcome) {
        if self.outcome.set(outcome).is_err() {
            return;
        }
        if let (Some(prediction), Some(outcome)) = (&self.prediction, self.outcome.get()) {
            let count = if **outcome == *prediction.value {
                &prediction.record.right
            } else {
                &prediction.record.wrong
            };
            count.fetch_add(1, Ordering::Relaxed);
        }
        self.landed.notify_waiters();
    }

    /// Waits for the outcome.
    pub(crate) async fn wait(&self) -> Outcome {
        loop {
            // Registered before the outcome is looked at, so that a `set` in between wakes it.
            let mut landed = std::pin::pin!(self.landed.notified());
            landed.as_mut().enable();
            if let Some(outcome) = self.get() {
                return outcome;
            }
            landed.await;
        }
    }

    /// Waits for the outcome, blocking this (non-async) thread.
    pub(crate) fn wait_blocking(&self) -> Outcome {
        if let Some(outcome) = self.get() {
            return outcome;
        }
        futures::executor::block_on(self.wait())
    }
}

/// Where an entry's outcome is.
#[derive(Debug)]
enum Slot {
    /// A cell others may wait on: every entry of a run with a scout.
    Cell(Arc<OutcomeSlot>),
    /// The executor's own read in a run without a scout: no one waits for it, so it is kept
    /// once it has landed, without a cell.
    Landed(Outcome),
}

impl Slot {
    fn get(&self) -> Option<Outcome> {
        match self {
            Slot::Cell(cell) => cell.get(),
            Slot::Landed(outcome) => Some(Arc::clone(outcome)),
        }
    }

    fn wait_blocking(&self) -> Outcome {
        match self {
            Slot::Cell(cell) => cell.wait_blocking(),
            Slot::Landed(outcome) => Arc::clone(outcome),
        }
    }

    /// A cell holding the outcome: the entry's own, or a new one set with what landed.
    fn cell(&self) -> Arc<OutcomeSlot> {
        match self {
            Slot::Cell(cell) => Arc::clone(cell),
            Slot::Landed(outcome) => {
                let cell = OutcomeSlot::new();
                let _ = cell.outcome.set(Arc::clone(outcome));
                cell
            }
        }
    }
}

#[derive(Debug)]
struct Entry {
    slot: Slot,
    /// `None` for the executor's own read or a replayed one; the scout's speculation for one it
    /// started.
    speculation: Option<Arc<Speculation>>,
    /// The journal answered it.
    replayed: bool,
    /// The executor has taken its outcome as its own call's (made it, claimed it, or took it
    /// from the journal): a later identical read is answered by it, or is the next occurrence.
    used: bool,
    /// A read the scout held rather than started ([`RunLedger::hold`]), with its arguments:
    /// the executor makes it when it gets there, or the scout starts it when the executor
    /// waits.
    held: Option<Value>,
}

impl Entry {
    /// The executor's own read, which it makes (or made) itself.
    fn executor_s(slot: Slot) -> Entry {
        Entry {
            slot,
            speculation: None,
            replayed: false,
            used: true,
            held: None,
        }
    }

    /// Whether the next occurrence of this read would be made by the executor: this one has
    /// landed with a failure [`made_again`] names, and it is the executor's outcome or will be
    /// when claimed (not the runtime's refusal of a speculative call, which the executor makes
    /// again itself).
    fn retried(&self) -> bool {
        let Some(outcome) = self.slot.get() else {
            return false;
        };
        let refused = matches!(&*outcome, Err(e) if e.kind.is_speculation_refusal());
        made_again(&outcome) && (self.used || !refused)
    }
}

/// A non-read call the executor made, with its outcome.
#[derive(Clone, Debug)]
pub(crate) struct WriteRecord {
    pub(crate) tool: String,
    pub(crate) args: String,
    pub(crate) outcome: Outcome,
}

/// Caps on what the scout may start.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct SpeculationLimits {
    /// Speculative reads running at once in one run.
    pub max_in_flight: u64,
    /// Speculative reads of one tool running at once.
    pub max_in_flight_per_tool: u64,
    /// Passes of the scout over the script in one run.
    pub max_passes: u64,
    /// Pending deferred calls (reads waiting for their arguments) one pass may create.
    pub max_deferred_per_pass: u64,
    /// Let the scout take a read still in flight to return what the identical read returned in
    /// one of the last few epochs, until it lands (a guess: it only steers which reads start).
    pub predict: bool,
    /// Leave the reads of a tool that answers at once to the executor while it is running,
    /// rather than start them early: they have no latency to hide, and the executor would
    /// only wait for the scout's copies (docs/internals.md, "The scout in detail").
    pub hold_quick: bool,
}

impl Default for SpeculationLimits {
    fn default() -> Self {
        SpeculationLimits {
            max_in_flight: 256,
            max_in_flight_per_tool: 128,
            max_passes: 64,
            max_deferred_per_pass: 2_048,
            predict: true,
            hold_quick: true,
        }
    }
}

#[derive(Debug, Default)]
struct Book {
    entries: crate::sync::FastMap<ReadKey, Entry>,
    /// The executor's non-read calls, in order: their number is the epoch.
    writes: Vec<WriteRecord>,
    /// The run has ended: nothing more is launched.
    closed: bool,
    launched: u64,
    claimed: u64,
    in_flight: u64,
    in_flight_per_tool: HashMap<Arc<str>, u64>,
    /// Reads the executor had to dispatch itself.
    misses: u64,
    /// The reads the scout held, some since made by the executor or started.
    held: Vec<ReadKey>,
    /// Held reads the executor made itself.
    held_made: u64,
    /// Guess reads in flight from earlier epochs ([`Prediction`]).
    predict: bool,
    /// How each tool's guesses have fared.
    predictions: HashMap<Arc<str>, Arc<PredictionRecord>>,
    /// How often the executor used each read (tool, arguments): the occurrences in the whole
    /// run that fixtures are keyed by. Kept only when the run has fixtures or records them.
    tallies: HashMap<(Arc<str>, Arc<str>), Tally>,
}

/// How often the executor used one read (tool and arguments), counted across epochs.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    /// The latest epoch it was used in.
    epoch: u64,
    /// Its uses in the epochs before `epoch`.
    before: u64,
    /// Its uses in `epoch`: its occurrences there are 0 to `now - 1`.
    now: u64,
}

impl Tally {
    /// The read's occurrence in the whole run for its occurrence `n` in `epoch`.
    fn in_run(&self, epoch: u64, n: u64) -> u64 {
        let before = if self.epoch < epoch {
            self.before + self.now
        } else {
            self.before
        };
        before + n
    }

    /// The executor used occurrence `n` of the read in `epoch` (an epoch it has not left).
    fn used(&mut self, epoch: u64, n: u64) {
        if self.epoch < epoch {
            self.before += self.now;
            self.epoch = epoch;
            self.now = 0;
        }
        if self.epoch == epoch {
            self.now = self.now.max(n + 1);
        }
    }
}

/// From how many entries on [`RunLedger::release`] frees a run's ledger on a thread of its
/// own: starting one costs about as much as freeing a thousand entries.
const RELEASE_ELSEWHERE: usize = 1_000;

/// How many epochs back [`Book::prediction`] looks for an identical read.
const LOOKBACK: u64 = 4;

impl Book {
    fn epoch(&self) -> u64 {
        self.writes.len() as u64
    }

    /// An entry for `key` holding the journal's outcome of it; `used` when the executor asked.
    fn replayed_entry(&mut self, key: &ReadKey, outcome: &Outcome, used: bool) -> Arc<OutcomeSlot> {
        let cell = OutcomeSlot::new();
        cell.set((**outcome).clone());
        self.entries.insert(
            key.clone(),
            Entry {
                slot: Slot::Cell(Arc::clone(&cell)),
                speculation: None,
                replayed: true,
                used,
                held: None,
            },
        );
        cell
    }

    /// What the scout may take the read `key` to return while it is in flight: the outcome of
    /// the identical read's first occurrence in the latest of the last [`LOOKBACK`] epochs that
    /// has one (or that read's own guess), when it succeeded.
    fn prediction(&mut self, key: &ReadKey) -> Option<Prediction> {
        if !self.predict || key.epoch == 0 {
            return None;
        }
        let mut probe = key.occurrence(0);
        let value = (key.epoch.saturating_sub(LOOKBACK)..key.epoch)
            .rev()
            .find_map(|epoch| {
                probe.epoch = epoch;
                match &self.entries.get(&probe)?.slot {
                    Slot::Landed(outcome) => outcome.is_ok().then(|| Arc::clone(outcome)),
                    Slot::Cell(cell) => match cell.get() {
                        Some(outcome) => outcome.is_ok().then_some(outcome),
                        None => cell.prediction.as_ref().map(|p| Arc::clone(&p.value)),
                    },
                }
            })?;
        let record = self.predictions.entry(key.tool.clone()).or_default();
        Some(Prediction {
            value,
            record: Arc::clone(record),
        })
    }

    /// A fresh executor entry for `key`, replacing any: the executor dispatches into its cell.
    fn executor_entry(&mut self, key: &ReadKey) -> Arc<OutcomeSlot> {
        let cell = OutcomeSlot::with(0, self.prediction(key));
        let entry = Entry::executor_s(Slot::Cell(Arc::clone(&cell)));
        self.entries.insert(key.clone(), entry);
        self.misses += 1;
        cell
    }

    /// Whether the scout may start the read `key`: its first occurrence always; a later one
    /// only once the occurrence before has landed with a failure that makes the executor call
    /// again. So a retry never reaches its tool before the failure it retries, and a tool sees
    /// one read's occurrences in the order a sequential run makes them.
    fn may_start(&self, key: &ReadKey) -> bool {
        key.n == 0
            || self
                .entries
                .get(&key.occurrence(key.n - 1))
                .is_some_and(Entry::retried)
    }
}

/// What the executor does for a read.
pub(crate) enum Read {
    /// An identical read earlier in this epoch answers it (it succeeded, or failed in a way
    /// the same call would fail again).
    Repeat(Outcome),
    /// The run's journal answers it: an earlier process of the run made it.
    Replayed(Outcome),
    /// The scout's speculative outcome, claimed: charged and recorded as the executor's call.
    Claimed(Outcome),
    /// Nothing usable: the executor dispatches the read itself and lands its outcome with
    /// [`RunLedger::land`], in this cell (`None` in a run without a scout: no one waits for
    /// it, and it is kept once it lands).
    Dispatch(Option<Arc<OutcomeSlot>>),
}

/// What the scout may do with a read.
pub(crate) enum Launch {
    /// Someone already made or started it.
    Existing(Arc<OutcomeSlot>),
    /// Start it: dispatch with this speculation, then set the cell and call
    /// [`RunLedger::landed`].
    Start(Arc<OutcomeSlot>, Arc<Speculation>),
    /// Not now, nor later in this epoch: its epoch is past, the run is over, or the
    /// speculative budget is spent.
    Refused,
    /// Not now: as many speculative reads are in flight as the caps allow. A later pass may
    /// start it once some have landed.
    Busy,
}

/// What the scout may do with a read of a quick tool.
pub(crate) enum Hold {
    /// Held: its outcome will be in this cell.
    Held(Arc<OutcomeSlot>),
    /// Not held: launch it, with these arguments.
    Launch(Value),
}

/// A held read started: the scout dispatches it with this speculation into its cell, then
/// calls [`RunLedger::landed`].
pub(crate) struct HeldRead {
    pub(crate) key: ReadKey,
    pub(crate) args: Value,
    pub(crate) cell: Arc<OutcomeSlot>,
    pub(crate) speculation: Arc<Speculation>,
}

/// The executor waits while this lives ([`RunLedger::executor_waits`]).
pub(crate) struct Waiting<'a>(Option<&'a RunLedger>);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(ledger) = self.0 {
            ledger.executor_runs();
        }
    }
}

/// The ledger of one run.
pub(crate) struct RunLedger {
    ctx: Arc<RunContext>,
    limits: SpeculationLimits,
    book: Mutex<Book>,
    /// Bumped whenever the executor completes a non-read call or misses, or a speculative read
    /// lands: what a waiting scout watches.
    progress: watch::Sender<u64>,
    /// The executor is evaluating the script, not waiting for a call: the scout holds the
    /// reads of quick tools ([`RunLedger::hold`]).
    running: AtomicBool,
    /// Starts the reads the scout held, when the executor is about to wait: the run's scout.
    starter: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Notified when the executor is about to wait, and when the run ends: what a scout that
    /// fell behind the executor waits for.
    waited: Notify,
    /// The run has a scout (it is speculative): every entry has a cell the scout may wait on.
    scouted: bool,
    /// The book's epoch, set under its lock, read without it (the executor reads it at every
    /// read).
    epoch: AtomicU64,
}

impl RunLedger {
    /// The ledger of a run, `scouted` when it is speculative.
    pub(crate) fn new(ctx: Arc<RunContext>, limits: SpeculationLimits, scouted: bool) -> RunLedger {
        let book = Book {
            predict: limits.predict,
            ..Book::default()
        };
        RunLedger {
            ctx,
            limits,
            book: Mutex::new(book),
            progress: watch::channel(0).0,
            running: AtomicBool::new(false),
            starter: OnceLock::new(),
            waited: Notify::new(),
            scouted,
            epoch: AtomicU64::new(0),
        }
    }

    pub(crate) fn limits(&self) -> &SpeculationLimits {
        &self.limits
    }

    fn lock(&self) -> MutexGuard<'_, Book> {
        lock(&self.book)
    }

    /// Wakes the scout, if there is one: a run without (sequential) skips the wake-ups, half
    /// a thousand instructions a call. Nothing reads the count itself, and a scout that
    /// subscribes after a skipped bump looks at the ledger as it is then, bump or not.
    fn bump(&self) {
        if self.progress.receiver_count() > 0 {
            self.progress.send_modify(|n| *n += 1);
        }
    }

    /// The executor's epoch: the non-read calls it has completed.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// The executor's read of `key` (its first occurrence), on the script thread (it may wait
    /// for a speculative outcome); `key` is left at the occurrence that answers it. An
    /// occurrence the executor already used answers it, unless that one failed in a way
    /// [`made_again`] names: then the next occurrence does. A speculative outcome is claimed
    /// here, in one operation: the entry is marked, and the budget and breakers are charged as
    /// the sequential call would have charged them ([`RunContext::claim`]); if they cannot be,
    /// the executor dispatches the read itself.
    pub(crate) fn read(&self, key: &mut ReadKey) -> Read {
        let mut book = self.lock();
        let (cell, speculation) = loop {
            match book.entries.get_mut(key) {
                None => {
                    if let Some(outcome) = self.journaled(key) {
                        book.replayed_entry(key, &outcome, true);
                        return Read::Replayed(outcome);
                    }
                    if !self.scouted {
                        book.misses += 1;
                        return Read::Dispatch(None);
                    }
                    let cell = book.executor_entry(key);
                    drop(book);
                    self.bump();
                    return Read::Dispatch(Some(cell));
                }
                // A read the scout held: the executor makes it, into the cell the scout's
                // placeholders wait on (which is news enough to the scout: no miss, no bump).
                Some(entry) if entry.held.is_some() => {
                    entry.held = None;
                    entry.used = true;
                    let cell = entry.slot.cell();
                    book.held_made += 1;
                    return Read::Dispatch(Some(cell));
                }
                // The executor's own earlier occurrence: it waited for it, so it has landed.
                Some(entry) if entry.used => {
                    let outcome = entry.slot.wait_blocking();
                    if made_again(&outcome) {
                        key.n += 1;
                        continue;
                    }
                    return if entry.replayed {
                        Read::Replayed(outcome)
                    } else {
                        Read::Repeat(outcome)
                    };
                }
                Some(entry) => match &entry.speculation {
                    // The journal answered the scout's ask for it.
                    None => {
                        entry.used = true;
                        return Read::Replayed(entry.slot.wait_blocking());
                    }
                    Some(speculation) => break (entry.slot.cell(), Arc::clone(speculation)),
                },
            }
        };
        drop(book);
        let outcome = match cell.get() {
            Some(outcome) => outcome,
            None => {
                let _waiting = self.executor_waits(true);
                cell.wait_blocking()
            }
        };
        match self.ctx.claim(&key.tool, &speculation, &outcome) {
            Claim::Taken => {
                let mut book = self.lock();
                book.claimed += 1;
                if let Some(entry) = book.entries.get_mut(key) {
                    entry.used = true;
                }
                Read::Claimed(outcome)
            }
            Claim::Refused(e) => {
                let cell = self.lock().executor_entry(key);
                cell.set(Err(e.for_tool(&key.tool)));
                self.bump();
                Read::Claimed(cell.wait_blocking())
            }
            Claim::Redo => {
                let cell = self.lock().executor_entry(key);
                self.bump();
                Read::Dispatch(Some(cell))
            }
        }
    }

    /// The outcome of the executor's read `key`, which [`Read::Dispatch`] gave it to make
    /// into `cell`, has landed: kept as the read's, and given back to share.
    pub(crate) fn land(
        &self,
        key: &ReadKey,
        cell: Option<Arc<OutcomeSlot>>,
        outcome: Outcome,
    ) -> Outcome {
        if let Some(cell) = cell {
            cell.set_shared(outcome);
            // Only the executor sets the cell of its own read: the outcome is the one just
            // set (shared, not copied).
            return cell.wait_blocking();
        }
        let entry = Entry::executor_s(Slot::Landed(Arc::clone(&outcome)));
        self.lock().entries.insert(key.clone(), entry);
        outcome
    }

    /// The journal's outcome of the read `key`, when the run is durable and has one.
    fn journaled(&self, key: &ReadKey) -> Option<Outcome> {
        let journal = self.ctx.journal.as_ref()?;
        journal.read(key.epoch, &key.tool, &key.args, key.n)
    }

    /// The occurrence of the read `key` in the whole run, for fixtures (see
    /// `dispatch::fixture`): `None` when the run neither answers reads from fixtures nor
    /// records them. Known for a read of the executor's epoch: every earlier one is done.
    pub(crate) fn fixture_occurrence(&self, key: &ReadKey) -> Option<u64> {
        if !self.ctx.counts_occurrences() {
            return None;
        }
        let book = self.lock();
        let tally = book.tallies.get(&(key.tool.clone(), key.args.clone()));
        Some(tally.copied().unwrap_or_default().in_run(key.epoch, key.n))
    }

    /// The executor took the outcome of the read `key` as its own, however it was answered:
    /// the next occurrence in the run counts it.
    pub(crate) fn answered(&self, key: &ReadKey) -> Option<u64> {
        if !self.ctx.counts_occurrences() {
            return None;
        }
        let mut book = self.lock();
        let tally = book
            .tallies
            .entry((key.tool.clone(), key.args.clone()))
            .or_default();
        let occurrence = tally.in_run(key.epoch, key.n);
        tally.used(key.epoch, key.n);
        Some(occurrence)
    }

    /// The executor used the outcome of the read `key` (the occurrence it names): a durable
    /// run journals it, and a recording run records it.
    pub(crate) fn used(&self, key: &ReadKey, outcome: &Result<Value, ToolError>) {
        let occurrence = self.answered(key);
        if let (Some(recorder), Some(occurrence)) = (&self.ctx.recorder, occurrence) {
            if !self.holds_secret(key, outcome) {
                recorder.record(&key.tool, &key.args, occurrence, outcome);
            }
        }
        self.journal_read(key, outcome);
        if let Some(plan) = &self.ctx.plan {
            // A read holding a secret is kept by its tool and place alone.
            let args = if self.holds_secret(key, outcome) {
                "(masked)"
            } else {
                &key.args
            };
            plan.read(&key.tool, args, key.epoch, key.n, outcome);
        }
    }

    /// Whether the read `key` or its outcome holds a secret or a value its tool redacts: it is
    /// kept nowhere (neither journaled nor recorded).
    fn holds_secret(&self, key: &ReadKey, outcome: &Result<Value, ToolError>) -> bool {
        let masks = self.ctx.masks();
        self.ctx.registry.tool_redacts(&key.tool, None)
            || (!masks.is_empty() && (masks.holds_text(&key.args) || masks.holds_outcome(outcome)))
    }

    /// A durable run journals the read `key`.
    fn journal_read(&self, key: &ReadKey, outcome: &Result<Value, ToolError>) {
        if let Some(journal) = self.ctx.journal.as_ref() {
            // A read that holds a secret or a redacted value is kept without it: not at all,
            // and a resume makes it again.
            if self.holds_secret(key, outcome) {
                return;
            }
            journal.record_read(crate::store::ReadRow::new(
                key.epoch,
                key.tool.to_string(),
                key.args.to_string(),
                key.n,
                Arc::new(outcome.clone()),
            ));
        }
    }

    /// The executor completed a non-read call: the epoch advances.
    pub(crate) fn record_write(&self, record: WriteRecord) {
        let mut book = self.lock();
        book.writes.push(record);
        self.epoch.store(book.epoch(), Ordering::SeqCst);
        drop(book);
        self.bump();
    }

    /// The executor's `k`-th non-read call (from 0), if it has been made.
    pub(crate) fn write(&self, k: usize) -> Option<WriteRecord> {
        self.lock().writes.get(k).cloned()
    }

    /// The scout asks to start a read (the occurrence `key` names; see [`Book::may_start`]).
    pub(crate) fn launch(&self, key: &ReadKey) -> Launch {
        let mut book = self.lock();
        if let Some(entry) = book.entries.get(key) {
            return Launch::Existing(entry.slot.cell());
        }
        if !book.may_start(key) {
            return Launch::Refused;
        }
        // A read the journal answers is answered for the scout too: speculation goes on
        // across a resume without calling the tool again.
        if let Some(outcome) = self.journaled(key) {
            return Launch::Existing(book.replayed_entry(key, &outcome, false));
        }
        let per_tool = book
            .in_flight_per_tool
            .get(&*key.tool)
            .copied()
            .unwrap_or(0);
        // A read for an epoch the executor has left can never be claimed, and one for an epoch
        // it has not reached would start before a non-read call that precedes it.
        if book.closed || key.epoch != book.epoch() {
            return Launch::Refused;
        }
        if book.in_flight >= self.limits.max_in_flight
            || per_tool >= self.limits.max_in_flight_per_tool
        {
            return Launch::Busy;
        }
        if !self.ctx.reserve_speculative() {
            return Launch::Refused;
        }
        let cell = OutcomeSlot::with(0, book.prediction(key));
        let speculation = Arc::new(Speculation::default());
        book.entries.insert(
            key.clone(),
            Entry {
                slot: Slot::Cell(Arc::clone(&cell)),
                speculation: Some(Arc::clone(&speculation)),
                replayed: false,
                used: false,
                held: None,
            },
        );
        book.launched += 1;
        book.in_flight += 1;
        *book.in_flight_per_tool.entry(key.tool.clone()).or_default() += 1;
        Launch::Start(cell, speculation)
    }

    /// The scout asks to hold the read `key` of a quick tool ([`crate::tool::Pace`]) rather
    /// than start it: held while the executor is running, it is the executor's to make when it
    /// gets there (a read that answers at once has nothing to hide, and the executor would
    /// only wait for the scout's copy of it), and the scout's to start if the executor waits
    /// first ([`RunLedger::executor_waits`]). [`Hold::Launch`] gives the arguments back when
    /// the read is not held: the executor is waiting, or the read is one [`RunLedger::launch`]
    /// decides on (already there, refused, answered by the journal: the journal of a resumed
    /// run is loaded whole before it starts, so a held read is never one it answers).
    pub(crate) fn hold(&self, key: &ReadKey, args: Value) -> Hold {
        let mut book = self.lock();
        // Read under the lock that `executor_waits` takes after clearing it: a read is either
        // held before the executor looks at the held reads, or not held at all.
        if !self.limits.hold_quick
            || !self.running.load(Ordering::SeqCst)
            || book.closed
            || key.epoch != book.epoch()
            || book.entries.contains_key(key)
            || !book.may_start(key)
            || self.journaled(key).is_some()
        {
            return Hold::Launch(args);
        }
        let cell = OutcomeSlot::with(0, book.prediction(key));
        book.entries.insert(
            key.clone(),
            Entry {
                slot: Slot::Cell(Arc::clone(&cell)),
                speculation: None,
                replayed: false,
                used: false,
                held: Some(args),
            },
        );
        book.held.push(key.clone());
        Hold::Held(cell)
    }

    /// The reads held so far that may start now, started as [`RunLedger::launch`] starts a
    /// read (within the caps and the speculative budget; the others stay held). The scout
    /// dispatches them.
    pub(crate) fn start_held(&self) -> Vec<HeldRead> {
        let mut book = self.lock();
        let mut started = Vec::new();
        let keys = std::mem::take(&mut book.held);
        let mut kept = Vec::new();
        for key in keys {
            if book.closed || key.epoch != book.epoch() {
                // Never claimed now: the executor left its epoch, or the run is over.
                continue;
            }
            if book.entries.get(&key).is_none_or(|e| e.held.is_none()) {
                // The executor made it.
                continue;
            }
            let per_tool = book
                .in_flight_per_tool
                .get(&*key.tool)
                .copied()
                .unwrap_or(0);
            if book.in_flight >= self.limits.max_in_flight
                || per_tool >= self.limits.max_in_flight_per_tool
                || !self.ctx.reserve_speculative()
            {
                kept.push(key);
                continue;
            }
            let Some(entry) = book.entries.get_mut(&key) else {
                continue;
            };
            let speculation = Arc::new(Speculation::default());
            let args = entry.held.take().unwrap_or_default();
            entry.speculation = Some(Arc::clone(&speculation));
            let cell = entry.slot.cell();
            book.launched += 1;
            book.in_flight += 1;
            *book.in_flight_per_tool.entry(key.tool.clone()).or_default() += 1;
            started.push(HeldRead {
                key,
                args,
                cell,
                speculation,
            });
        }
        book.held = kept;
        started
    }

    /// Sets what starts the held reads when the executor waits: the run's scout, once.
    pub(crate) fn set_starter(&self, starter: Box<dyn Fn() + Send + Sync>) {
        let _ = self.starter.set(starter);
    }

    /// The executor is evaluating the script from now on (until it waits).
    pub(crate) fn executor_runs(&self) {
        self.running.store(true, Ordering::SeqCst);
    }

    /// The executor is about to wait for a call: the scout holds nothing more and, when the
    /// call is a read (`start`), starts what it held, whose values may be what the scout
    /// needs to go on while the executor waits. (A non-read call ends the epoch of every read
    /// held: those it passed are made, the others never will be.) The executor runs again
    /// when the guard is dropped.
    pub(crate) fn executor_waits(&self, start: bool) -> Waiting<'_> {
        let Some(starter) = self.starter.get() else {
            return Waiting(None);
        };
        self.running.store(false, Ordering::SeqCst);
        if start && !self.lock().held.is_empty() {
            starter();
        }
        self.waited.notify_waiters();
        Waiting(Some(self))
    }

    /// Returns once the executor is not running (it waits for a call, or has not started), or
    /// the run has ended: a scout that fell behind the executor waits for it.
    pub(crate) async fn executor_waited(&self) {
        let mut waited = std::pin::pin!(self.waited.notified());
        // Registered before the state is looked at, so that a change in between wakes it.
        waited.as_mut().enable();
        if !self.running.load(Ordering::SeqCst) || self.is_closed() {
            return;
        }
        waited.await;
    }

    /// Held reads the executor made itself.
    pub(crate) fn held_made(&self) -> u64 {
        self.lock().held_made
    }

    /// A speculative read that [`RunLedger::launch`] started has finished.
    pub(crate) fn landed(&self, tool: &str) {
        let mut book = self.lock();
        book.in_flight = book.in_flight.saturating_sub(1);
        if let Some(n) = book.in_flight_per_tool.get_mut(tool) {
            *n = n.saturating_sub(1);
        }
        drop(book);
        // A scout that met a cap waits for a read to land.
        self.bump();
    }

    /// Whether the run is over.
    pub(crate) fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Ends speculation for the run: nothing more is launched.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.bump();
        self.waited.notify_waiters();
    }

    /// Frees the run's entries and writes once the run has ended and its outcome no longer
    /// needs them: on a thread of its own when there are many, so that a long run's caller
    /// does not wait for thousands of outcomes to be freed. The ledger is closed and left
    /// empty; a lookup after this finds nothing (and launches nothing).
    pub(crate) fn release(&self) {
        let mut book = self.lock();
        book.closed = true;
        let entries = std::mem::take(&mut book.entries);
        let writes = std::mem::take(&mut book.writes);
        self.epoch.store(book.epoch(), Ordering::SeqCst);
        drop(book);
        if entries.len() + writes.len() < RELEASE_ELSEWHERE {
            return;
        }
        // Should no thread start, the closure and what it holds are freed here instead.
        let _ = std::thread::Builder::new()
            .name("toolscript-release".into())
            .spawn(move || drop((entries, writes)));
    }

    /// Reads the executor dispatched itself so far.
    pub(crate) fn misses(&self) -> u64 {
        self.lock().misses
    }

    /// A receiver that changes whenever the executor completes a non-read call or misses.
    pub(crate) fn watch_progress(&self) -> watch::Receiver<u64> {
        self.progress.subscribe()
    }

    /// (launched, claimed) so far.
    pub(crate) fn counts(&self) -> (u64, u64) {
        let book = self.lock();
        (book.launched, book.claimed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::{BreakerConfig, Breakers, Budget};
    use crate::error::ErrorKind;
    use crate::tool::{Effect, Registry, Tool};
    use serde_json::json;

    fn ledger(limits: SpeculationLimits, max_speculative_calls: u64) -> RunLedger {
        scouted(limits, max_speculative_calls, true)
    }

    fn scouted(limits: SpeculationLimits, max_speculative_calls: u64, scout: bool) -> RunLedger {
        let tools = ["a", "b"]
            .map(|name| Tool::builder(name, Effect::Read).handler(|_| async { Ok(json!(0)) }));
        let ctx = RunContext::new(
            Arc::new(Registry::builder().tools(tools).build().unwrap()),
            Arc::new(Breakers::new(BreakerConfig::default())),
            Budget {
                max_speculative_calls,
                ..Budget::default()
            },
            std::time::Duration::from_secs(60),
            "run".into(),
            Arc::default(),
            None,
        );
        RunLedger::new(Arc::new(ctx), limits, scout)
    }

    fn key(epoch: u64, tool: &str) -> ReadKey {
        ReadKey::first(epoch, tool.into(), "{}".into())
    }

    fn write() -> WriteRecord {
        WriteRecord {
            tool: "w".into(),
            args: "{}".into(),
            outcome: Arc::new(Ok(json!(null))),
        }
    }

    #[test]
    fn the_executor_claims_what_the_scout_started() {
        let ledger = ledger(SpeculationLimits::default(), 10);
        let Launch::Start(cell, _) = ledger.launch(&key(0, "a")) else {
            panic!("expected a start");
        };
        assert!(matches!(ledger.launch(&key(0, "a")), Launch::Existing(_)));
        cell.set(Ok(json!(1)));
        ledger.landed("a");
        match ledger.read(&mut key(0, "a")) {
            Read::Claimed(outcome) => assert_eq!(*outcome, Ok(json!(1))),
            _ => panic!("expected the claim"),
        }
        assert!(
            matches!(ledger.read(&mut key(0, "a")), Read::Repeat(_)),
            "a claimed outcome answers repeats"
        );
        assert_eq!(ledger.counts(), (1, 1));
        assert_eq!(ledger.misses(), 0);
    }

    /// A ledger whose starter counts its calls, with the executor running.
    fn holding_ledger(
        limits: SpeculationLimits,
        max_speculative_calls: u64,
    ) -> (RunLedger, Arc<AtomicU32>) {
        let ledger = ledger(limits, max_speculative_calls);
        let started = Arc::new(AtomicU32::new(0));
        let count = Arc::clone(&started);
        ledger.set_starter(Box::new(move || {
            count.fetch_add(1, Ordering::SeqCst);
        }));
        ledger.executor_runs();
        (ledger, started)
    }

    #[test]
    fn a_held_read_is_made_by_the_executor_into_the_scout_s_cell() {
        let (ledger, starts) = holding_ledger(SpeculationLimits::default(), 10);
        let Hold::Held(held) = ledger.hold(&key(0, "a"), json!({"x": 1})) else {
            panic!("expected a hold while the executor runs");
        };
        // A later pass joins it, as it joins a read in flight.
        assert!(
            matches!(ledger.launch(&key(0, "a")), Launch::Existing(c) if Arc::ptr_eq(&c, &held))
        );
        assert!(matches!(
            ledger.hold(&key(0, "a"), json!(1)),
            Hold::Launch(_)
        ));
        let Read::Dispatch(Some(mine)) = ledger.read(&mut key(0, "a")) else {
            panic!("the executor makes a held read itself");
        };
        assert!(
            Arc::ptr_eq(&mine, &held),
            "into the cell the scout waits on"
        );
        mine.set(Ok(json!(3)));
        assert_eq!(held.get().as_deref(), Some(&Ok(json!(3))));
        assert!(matches!(ledger.read(&mut key(0, "a")), Read::Repeat(o) if *o == Ok(json!(3))));
        // Nothing was started or spent: the read is the executor's own.
        assert_eq!(ledger.counts(), (0, 0));
        assert_eq!(ledger.held_made(), 1);
        assert!(ledger.start_held().is_empty(), "nothing is left to start");
        assert_eq!(starts.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn held_reads_start_when_the_executor_waits_and_are_claimed() {
        let (ledger, starts) = holding_ledger(SpeculationLimits::default(), 10);
        let Hold::Held(held) = ledger.hold(&key(0, "a"), json!({"x": 1})) else {
            panic!("expected a hold");
        };
        {
            let _waiting = ledger.executor_waits(true);
            assert_eq!(starts.load(Ordering::SeqCst), 1, "the starter is called");
            assert!(
                matches!(ledger.hold(&key(0, "b"), json!(2)), Hold::Launch(v) if v == json!(2)),
                "nothing is held while the executor waits"
            );
            let started = ledger.start_held();
            assert_eq!(started.len(), 1);
            assert_eq!(started[0].args, json!({"x": 1}));
            assert!(Arc::ptr_eq(&started[0].cell, &held));
        }
        assert!(
            matches!(ledger.hold(&key(0, "b"), json!(2)), Hold::Held(_)),
            "it runs again"
        );
        held.set(Ok(json!(4)));
        ledger.landed("a");
        assert!(matches!(ledger.read(&mut key(0, "a")), Read::Claimed(o) if *o == Ok(json!(4))));
        assert_eq!(ledger.counts(), (1, 1));
        assert_eq!(ledger.held_made(), 0);
    }

    /// A resumed run's journal answers its reads: the scout never holds one (the executor
    /// would make it again rather than replay it); the others it holds as in any run.
    #[tokio::test]
    async fn a_read_the_journal_answers_is_never_held() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::SqliteStore::open(&dir.path().join("s.sqlite3")).unwrap();
        let journaled = crate::store::ReadRow::new(0, "a", "{}", 0, Arc::new(Ok(json!(7))));
        let journal = crate::store::Journal::holding(Arc::new(store), vec![journaled]);
        let (ledger, _) = holding_ledger(SpeculationLimits::default(), 10);
        assert!(ledger.ctx.journal.set(Arc::new(journal)));
        assert!(matches!(
            ledger.hold(&key(0, "a"), json!(1)),
            Hold::Launch(_)
        ));
        assert!(matches!(ledger.hold(&key(0, "b"), json!(1)), Hold::Held(_)));
        assert!(matches!(ledger.read(&mut key(0, "a")), Read::Replayed(o) if *o == Ok(json!(7))));
        assert!(matches!(ledger.read(&mut key(0, "b")), Read::Dispatch(_)));
    }

    #[test]
    fn held_reads_start_only_within_the_caps_and_the_speculative_budget() {
        let limits = SpeculationLimits {
            max_in_flight: 1,
            ..SpeculationLimits::default()
        };
        let (ledger, _) = holding_ledger(limits, 10);
        let Launch::Start(first, _) = ledger.launch(&key(0, "a")) else {
            panic!("expected a start");
        };
        assert!(matches!(ledger.hold(&key(0, "b"), json!(1)), Hold::Held(_)));
        assert!(
            ledger.start_held().is_empty(),
            "one read is in flight already"
        );
        first.set(Ok(json!(1)));
        ledger.landed("a");
        assert_eq!(
            ledger.start_held().len(),
            1,
            "kept, it starts once there is room"
        );

        // Out of speculative budget: held, it stays the executor's.
        let (ledger, _) = holding_ledger(SpeculationLimits::default(), 0);
        assert!(matches!(ledger.hold(&key(0, "a"), json!(1)), Hold::Held(_)));
        assert!(ledger.start_held().is_empty());
        assert!(matches!(ledger.read(&mut key(0, "a")), Read::Dispatch(_)));
    }

    #[test]
    fn nothing_is_held_for_another_epoch_a_closed_run_or_an_idle_executor() {
        let (ledger, _) = holding_ledger(SpeculationLimits::default(), 10);
        assert!(matches!(
            ledger.hold(&key(1, "a"), json!(1)),
            Hold::Launch(_)
        ));
        let Hold::Held(_) = ledger.hold(&key(0, "b"), json!(1)) else {
            panic!("expected a hold");
        };
        ledger.record_write(write());
        assert!(
            ledger.start_held().is_empty(),
            "a read held in an epoch the executor left never starts"
        );
        ledger.close();
        assert!(matches!(
            ledger.hold(&key(1, "a"), json!(1)),
            Hold::Launch(_)
        ));

        // Without a starter (a sequential run, or a scout of a streamed prefix) the executor
        // is never marked as running.
        let idle = self::ledger(SpeculationLimits::default(), 10);
        assert!(matches!(idle.hold(&key(0, "a"), json!(1)), Hold::Launch(_)));

        // Nor when the runtime says so.
        let off = SpeculationLimits {
            hold_quick: false,
            ..SpeculationLimits::default()
        };
        let (never, _) = holding_ledger(off, 10);
        assert!(matches!(
            never.hold(&key(0, "a"), json!(1)),
            Hold::Launch(_)
        ));
    }

    #[test]
    fn a_refused_speculative_read_is_made_by_the_executor() {
        let ledger = ledger(SpeculationLimits::default(), 10);
        let Launch::Start(cell, _) = ledger.launch(&key(0, "a")) else {
            panic!("expected a start");
        };
        cell.set(Err(ToolError::new(ErrorKind::Cancelled, "not needed")));
        let Read::Dispatch(Some(mine)) = ledger.read(&mut key(0, "a")) else {
            panic!("a refusal is never claimed");
        };
        mine.set(Ok(json!(2)));
        assert!(matches!(ledger.read(&mut key(0, "a")), Read::Repeat(o) if *o == Ok(json!(2))));
        assert_eq!(ledger.counts(), (1, 0));
        assert_eq!(ledger.misses(), 1);
    }

    #[test]
    fn executor_entries_answer_repeats_and_the_scout() {
        let ledger = ledger(SpeculationLimits::default(), 10);
        let Read::Dispatch(Some(cell)) = ledger.read(&mut key(0, "a")) else {
            panic!("expected a miss");
        };
        cell.set(Ok(json!(2)));
        assert!(matches!(ledger.read(&mut key(0, "a")), Read::Repeat(_)));
        assert!(matches!(ledger.launch(&key(0, "a")), Launch::Existing(_)));
        cell.set(Ok(json!(3)));
        assert_eq!(*cell.get().unwrap(), Ok(json!(2)), "a cell is set once");
        assert_eq!(ledger.misses(), 1);
    }

    /// The executor's read of `key`'s first occurrence, dispatched and answered with `outcome`;
    /// the occurrence it was.
    fn dispatched(ledger: &RunLedger, outcome: Result<Value, ToolError>) -> u64 {
        let mut key = key(0, "a");
        let Read::Dispatch(cell) = ledger.read(&mut key) else {
            panic!("expected a call of its own");
        };
        ledger.land(&key, cell, Arc::new(outcome));
        key.n
    }

    #[test]
    fn a_recoverable_failure_makes_the_next_identical_read_a_new_call() {
        let ledger = ledger(SpeculationLimits::default(), 10);
        let down = || Err(ToolError::unavailable("down"));
        assert_eq!(dispatched(&ledger, down()), 0);
        assert_eq!(
            dispatched(&ledger, Err(ToolError::new(ErrorKind::Timeout, "slow"))),
            1
        );
        let limited = ToolError::with_kind_name("rate_limited", "wait")
            .unwrap()
            .with_recoverable(true);
        assert_eq!(
            dispatched(&ledger, Err(limited)),
            2,
            "a tool's own kind, recoverable by its word"
        );
        assert_eq!(dispatched(&ledger, Ok(json!(7))), 3);
        let mut again = key(0, "a");
        assert!(
            matches!(ledger.read(&mut again), Read::Repeat(o) if *o == Ok(json!(7))),
            "a success answers every later identical read"
        );
        assert_eq!(again.n, 3);
        assert_eq!(ledger.misses(), 4);
    }

    #[test]
    fn a_failure_the_same_call_would_meet_again_answers_its_repeats() {
        for failure in [
            ToolError::not_found("no a"),
            ToolError::invalid_input("bad"),
            ToolError::unavailable("gone for good").with_recoverable(false),
            ToolError::new(ErrorKind::Cancelled, "dropped"),
        ] {
            let ledger = ledger(SpeculationLimits::default(), 10);
            assert_eq!(dispatched(&ledger, Err(failure.clone())), 0);
            let mut again = key(0, "a");
            assert!(
                matches!(ledger.read(&mut again), Read::Repeat(o) if *o == Err(failure.clone())),
                "{failure}"
            );
            assert_eq!(again.n, 0);
        }
    }

    #[test]
    fn the_scout_starts_a_retry_only_after_the_failure_it_retries() {
        let ledger = ledger(SpeculationLimits::default(), 10);
        let second = key(0, "a").occurrence(1);
        assert!(
            matches!(ledger.launch(&second), Launch::Refused),
            "no first"
        );
        let Launch::Start(first, _) = ledger.launch(&key(0, "a")) else {
            panic!("expected a start");
        };
        assert!(
            matches!(ledger.launch(&second), Launch::Refused),
            "the first is in flight"
        );
        first.set(Err(ToolError::unavailable("down")));
        ledger.landed("a");
        let Launch::Start(retry, _) = ledger.launch(&second) else {
            panic!("the first failed: its retry may start");
        };
        retry.set(Ok(json!(1)));
        ledger.landed("a");
        assert!(
            matches!(ledger.launch(&second.occurrence(2)), Launch::Refused),
            "the retry succeeded: there is no third"
        );
        // The executor claims both in its own order, and repeats the second.
        let mut read = key(0, "a");
        assert!(matches!(ledger.read(&mut read), Read::Claimed(o) if o.is_err()));
        assert_eq!(read.n, 0);
        let mut read = key(0, "a");
        assert!(matches!(ledger.read(&mut read), Read::Claimed(o) if *o == Ok(json!(1))));
        assert_eq!(read.n, 1);
        let mut read = key(0, "a");
        assert!(matches!(ledger.read(&mut read), Read::Repeat(_)));
        assert_eq!(read.n, 1);
        assert_eq!(ledger.counts(), (2, 2));
        assert_eq!(ledger.misses(), 0);
    }

    #[test]
    fn a_refusal_only_speculation_met_starts_no_retry() {
        let ledger = ledger(SpeculationLimits::default(), 10);
        let Launch::Start(first, _) = ledger.launch(&key(0, "a")) else {
            panic!("expected a start");
        };
        // Recoverable, but the runtime's answer to the speculative call, not the tool's: the
        // executor makes the call itself, and that call decides whether there is a retry.
        first.set(Err(ToolError::new(ErrorKind::CircuitOpen, "open")));
        ledger.landed("a");
        let second = key(0, "a").occurrence(1);
        assert!(matches!(ledger.launch(&second), Launch::Refused));
        let mut read = key(0, "a");
        let Read::Dispatch(Some(mine)) = ledger.read(&mut read) else {
            panic!("a refusal is never claimed");
        };
        assert_eq!(read.n, 0);
        assert!(
            matches!(ledger.launch(&second), Launch::Refused),
            "the executor's own is in flight"
        );
        mine.set(Err(ToolError::new(ErrorKind::CircuitOpen, "open")));
        assert!(
            matches!(ledger.launch(&second), Launch::Start(..)),
            "the executor's own circuit_open is retried"
        );
    }

    #[test]
    fn the_epoch_is_the_number_of_writes() {
        let ledger = ledger(SpeculationLimits::default(), 10);
        assert_eq!(ledger.epoch(), 0);
        ledger.record_write(write());
        ledger.record_write(write());
        assert_eq!(ledger.epoch(), 2);
        assert_eq!(ledger.write(1).unwrap().tool, "w");
        assert!(ledger.write(2).is_none());
    }

    #[test]
    fn stale_epochs_caps_and_closing_refuse_launches() {
        let limits = SpeculationLimits {
            max_in_flight_per_tool: 1,
            ..SpeculationLimits::default()
        };
        let ledger = ledger(limits, 3);
        ledger.record_write(write());
        assert!(
            matches!(ledger.launch(&key(0, "a")), Launch::Refused),
            "stale"
        );
        assert!(matches!(ledger.launch(&key(1, "a")), Launch::Start(..)));
        assert!(matches!(ledger.launch(&key(1, "b")), Launch::Start(..)));
        let other = ReadKey {
            args: "{\"x\":1}".into(),
            ..key(1, "a")
        };
        assert!(
            matches!(ledger.launch(&other), Launch::Busy),
            "per-tool cap: not now, later"
        );
        ledger.landed("a");
        assert!(matches!(ledger.launch(&other), Launch::Start(..)));
        let third = ReadKey {
            args: "{\"x\":2}".into(),
            ..key(1, "b")
        };
        ledger.landed("b");
        assert!(
            matches!(ledger.launch(&third), Launch::Refused),
            "the budget's speculative cap"
        );
        ledger.close();
        assert!(ledger.is_closed());
    }

    #[test]
    fn a_read_in_flight_is_guessed_from_the_identical_read_of_an_earlier_epoch() {
        let ledger = ledger(SpeculationLimits::default(), 10);
        let Launch::Start(first, _) = ledger.launch(&key(0, "a")) else {
            panic!("expected a start");
        };
        first.set(Ok(json!({"n": 1})));
        ledger.landed("a");
        ledger.record_write(write());
        let Launch::Start(second, _) = ledger.launch(&key(1, "a")) else {
            panic!("expected a start");
        };
        assert_eq!(second.predicted(), Some(&json!({"n": 1})));
        assert!(
            matches!(ledger.launch(&key(1, "b")), Launch::Start(c, _) if c.predicted().is_none()),
            "no earlier read of it, no guess"
        );
        // The guess of a read in flight carries on to the next epoch, and the executor's own
        // reads are guessed too.
        ledger.record_write(write());
        let Read::Dispatch(Some(third)) = ledger.read(&mut key(2, "a")) else {
            panic!("expected a miss");
        };
        assert_eq!(third.predicted(), Some(&json!({"n": 1})));
        second.set(Ok(json!({"n": 1})));
        third.set(Ok(json!({"n": 1})));
        assert_eq!(
            third.predicted(),
            Some(&json!({"n": 1})),
            "a landed cell keeps its guess; the scout reads the outcome first"
        );
    }

    #[test]
    fn a_tool_whose_guesses_prove_wrong_is_not_guessed_any_more() {
        let ledger = ledger(SpeculationLimits::default(), 100);
        let mut previous = None;
        for epoch in 0..4u64 {
            let Launch::Start(cell, _) = ledger.launch(&key(epoch, "a")) else {
                panic!("expected a start");
            };
            if epoch > 0 {
                assert_eq!(
                    cell.predicted().is_some(),
                    epoch < 3,
                    "epoch {epoch}: one wrong guess is forgiven, two with none right are not"
                );
            }
            // A counter: every epoch's value differs from the last.
            cell.set(Ok(json!(epoch)));
            ledger.landed("a");
            ledger.record_write(write());
            previous = Some(cell);
        }
        assert!(previous.is_some());
    }

    #[test]
    fn errors_are_not_guessed_and_sequential_ledgers_guess_nothing() {
        let speculative = ledger(SpeculationLimits::default(), 10);
        let Launch::Start(cell, _) = speculative.launch(&key(0, "a")) else {
            panic!("expected a start");
        };
        cell.set(Err(ToolError::not_found("x")));
        speculative.record_write(write());
        let Launch::Start(cell, _) = speculative.launch(&key(1, "a")) else {
            panic!("expected a start");
        };
        assert!(cell.predicted().is_none());

        let off = SpeculationLimits {
            predict: false,
            ..SpeculationLimits::default()
        };
        let sequential = ledger(off, 10);
        let Read::Dispatch(Some(cell)) = sequential.read(&mut key(0, "a")) else {
            panic!("expected a miss");
        };
        cell.set(Ok(json!(1)));
        sequential.record_write(write());
        let Read::Dispatch(Some(cell)) = sequential.read(&mut key(1, "a")) else {
            panic!("expected a miss");
        };
        assert!(cell.predicted().is_none());
    }

    #[test]
    fn a_released_ledger_is_closed_and_empty() {
        let ledger = ledger(SpeculationLimits::default(), 10);
        let Read::Dispatch(Some(cell)) = ledger.read(&mut key(0, "a")) else {
            panic!("expected a miss");
        };
        cell.set(Ok(json!(1)));
        ledger.release();
        assert!(ledger.is_closed());
        assert!(matches!(ledger.launch(&key(0, "b")), Launch::Refused));
        assert_eq!(
            *cell.get().unwrap(),
            Ok(json!(1)),
            "a cell held elsewhere lives on"
        );
    }

    #[test]
    fn without_a_scout_the_executor_s_reads_land_without_cells_and_answer_alike() {
        let off = SpeculationLimits {
            predict: false,
            ..SpeculationLimits::default()
        };
        let ledger = scouted(off, 10, false);
        let mut first = key(0, "a");
        let Read::Dispatch(None) = ledger.read(&mut first) else {
            panic!("expected a miss without a cell");
        };
        let outcome = ledger.land(&first, None, Arc::new(Ok(json!(2))));
        assert_eq!(*outcome, Ok(json!(2)));
        match ledger.read(&mut key(0, "a")) {
            Read::Repeat(repeat) => assert!(Arc::ptr_eq(&repeat, &outcome), "shared, not copied"),
            _ => panic!("a landed read answers its repeats"),
        }
        // A failure the same call may not meet again answers its repeats; one it may, does not.
        for (epoch, failure, again) in [
            (1, ToolError::not_found("x"), false),
            (2, ToolError::unavailable("down"), true),
        ] {
            ledger.record_write(write());
            let mut read = key(epoch, "a");
            let Read::Dispatch(None) = ledger.read(&mut read) else {
                panic!("expected a miss in the new epoch");
            };
            ledger.land(&read, None, Arc::new(Err(failure)));
            let mut repeat = key(epoch, "a");
            let answer = ledger.read(&mut repeat);
            assert_eq!(matches!(answer, Read::Dispatch(None)), again);
            assert_eq!(repeat.n, u64::from(again), "the occurrence that answers it");
        }
        assert_eq!(ledger.misses(), 4);
        // Were a scout to ask, a landed read is there for it, with its outcome.
        let Launch::Existing(cell) = ledger.launch(&key(0, "a")) else {
            panic!("expected the executor's read");
        };
        assert_eq!(*cell.get().unwrap(), Ok(json!(2)));
    }

    #[tokio::test]
    async fn async_waiters_wake() {
        let cell = OutcomeSlot::new();
        let waiter = {
            let cell = Arc::clone(&cell);
            tokio::spawn(async move { cell.wait().await })
        };
        tokio::task::yield_now().await;
        cell.set(Err(ToolError::not_found("x")));
        assert!(waiter.await.unwrap().is_err());
    }
}
