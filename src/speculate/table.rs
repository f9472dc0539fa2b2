//! The prefetch table: read results keyed by (epoch, tool, canonical arguments), whether the
//! executor made the call or the scout started it early. The executor claims an entry instead of
//! dispatching the same read again; the scout launches into it. It also keeps the executor's
//! non-read calls in order, so a restarted scout can pass the ones already made.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::watch;

use crate::error::ToolError;
use crate::script::ReadKey;

/// The outcome of a call, shared by everyone waiting for it.
pub(crate) type Outcome = Arc<Result<Value, ToolError>>;

/// A value that arrives later: one read's outcome. Waited for by the executor (blocking) and by
/// deferred scout calls (async).
#[derive(Debug)]
pub(crate) struct Cell {
    tx: watch::Sender<Option<Outcome>>,
    /// How many deferred calls lead to this value: 0 for a read started with known arguments.
    depth: u32,
    /// Nested calls a speculative composite made to produce this value; a claim charges them.
    nested: Arc<std::sync::atomic::AtomicU64>,
}

impl Cell {
    pub(crate) fn new() -> Arc<Cell> {
        Cell::at_depth(0)
    }

    pub(crate) fn at_depth(depth: u32) -> Arc<Cell> {
        Arc::new(Cell {
            tx: watch::channel(None).0,
            depth,
            nested: Arc::default(),
        })
    }

    pub(crate) fn depth(&self) -> u32 {
        self.depth
    }

    /// The counter a speculative composite's nested calls are counted in.
    pub(crate) fn nested_counter(&self) -> Arc<std::sync::atomic::AtomicU64> {
        Arc::clone(&self.nested)
    }

    pub(crate) fn nested_calls(&self) -> u64 {
        self.nested.load(Ordering::Relaxed)
    }

    /// The outcome, if it has arrived.
    pub(crate) fn get(&self) -> Option<Outcome> {
        self.tx.borrow().clone()
    }

    /// Sets the outcome; later calls change nothing.
    pub(crate) fn set(&self, outcome: Result<Value, ToolError>) {
        self.tx.send_if_modified(|slot| {
            if slot.is_some() {
                return false;
            }
            *slot = Some(Arc::new(outcome));
            true
        });
    }

    /// Waits for the outcome.
    pub(crate) async fn wait(&self) -> Outcome {
        let mut rx = self.tx.subscribe();
        loop {
            if let Some(outcome) = rx.borrow_and_update().clone() {
                return outcome;
            }
            // The sender lives in `self`, so the channel cannot close while we wait.
            if rx.changed().await.is_err() {
                return Arc::new(Err(ToolError::internal("a pending result was dropped")));
            }
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

/// Who made an entry.
#[derive(Clone, Debug)]
enum Origin {
    Executor,
    /// Started by the scout; the flag says whether the executor claimed it.
    Scout(Arc<AtomicBool>),
}

#[derive(Debug)]
struct Entry {
    cell: Arc<Cell>,
    origin: Origin,
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
}

impl Default for SpeculationLimits {
    fn default() -> Self {
        SpeculationLimits {
            max_in_flight: 256,
            max_in_flight_per_tool: 128,
            max_passes: 64,
            max_deferred_per_pass: 2_048,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<ReadKey, Entry>,
    /// The executor's epoch: non-read calls it has completed.
    epoch: u64,
    writes: Vec<WriteRecord>,
    /// The run has ended: nothing more is launched.
    closed: bool,
    launched: u64,
    claimed: u64,
    in_flight: u64,
    in_flight_per_tool: HashMap<String, u64>,
    /// Reads the executor had to dispatch itself.
    misses: u64,
}

/// A fresh executor entry for `key`, replacing any: the executor dispatches into its cell.
fn executor_entry(state: &mut State, key: &ReadKey) -> Arc<Cell> {
    let cell = Cell::new();
    state.entries.insert(
        key.clone(),
        Entry {
            cell: Arc::clone(&cell),
            origin: Origin::Executor,
        },
    );
    state.misses += 1;
    cell
}

/// What the executor found for a read.
pub(crate) enum Lookup {
    /// An entry the executor made earlier in this epoch.
    Repeat(Arc<Cell>),
    /// An entry the scout started; claim it once its outcome is known.
    Speculated(Arc<Cell>, Arc<AtomicBool>),
    /// Nothing: the executor dispatches into this new cell.
    Miss(Arc<Cell>),
}

/// What the scout may do with a read.
pub(crate) enum Launch {
    /// Someone already made or started it.
    Existing(Arc<Cell>),
    /// Start it: dispatch, then set the cell and call [`PrefetchTable::landed`].
    Start(Arc<Cell>, Arc<AtomicBool>),
    /// Not now: its epoch is past, the run is over, or a cap is reached.
    Refused,
}

/// The prefetch table of one run.
#[derive(Debug)]
pub(crate) struct PrefetchTable {
    limits: SpeculationLimits,
    max_launches: u64,
    state: Mutex<State>,
    /// Bumped whenever the executor completes a non-read call or misses: what a waiting scout
    /// watches.
    progress: watch::Sender<u64>,
}

impl PrefetchTable {
    pub(crate) fn new(limits: SpeculationLimits, max_launches: u64) -> PrefetchTable {
        PrefetchTable {
            limits,
            max_launches,
            state: Mutex::default(),
            progress: watch::channel(0).0,
        }
    }

    pub(crate) fn limits(&self) -> &SpeculationLimits {
        &self.limits
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.progress.send_modify(|n| *n += 1);
    }

    /// The executor looks a read up; a miss inserts the cell it will fill.
    pub(crate) fn lookup(&self, key: &ReadKey) -> Lookup {
        let mut state = self.lock();
        if let Some(entry) = state.entries.get(key) {
            return match &entry.origin {
                Origin::Executor => Lookup::Repeat(Arc::clone(&entry.cell)),
                Origin::Scout(claimed) => {
                    Lookup::Speculated(Arc::clone(&entry.cell), Arc::clone(claimed))
                }
            };
        }
        let cell = executor_entry(&mut state, key);
        drop(state);
        self.bump();
        Lookup::Miss(cell)
    }

    /// The executor takes an entry over whose speculative outcome it cannot use (the runtime
    /// refused the speculative call): a fresh cell it dispatches into.
    pub(crate) fn take_over(&self, key: &ReadKey) -> Arc<Cell> {
        let cell = executor_entry(&mut self.lock(), key);
        self.bump();
        cell
    }

    /// The executor used a speculative outcome.
    pub(crate) fn claim(&self, claimed: &AtomicBool) {
        if !claimed.swap(true, Ordering::SeqCst) {
            self.lock().claimed += 1;
        }
    }

    /// The executor completed a non-read call: the epoch advances.
    pub(crate) fn record_write(&self, record: WriteRecord) {
        let mut state = self.lock();
        state.epoch += 1;
        state.writes.push(record);
        drop(state);
        self.bump();
    }

    /// The executor's `k`-th non-read call (from 0), if it has been made.
    pub(crate) fn write(&self, k: usize) -> Option<WriteRecord> {
        self.lock().writes.get(k).cloned()
    }

    /// The scout asks to start a read of `tool`.
    pub(crate) fn launch(&self, key: &ReadKey) -> Launch {
        let mut state = self.lock();
        if let Some(entry) = state.entries.get(key) {
            return Launch::Existing(Arc::clone(&entry.cell));
        }
        let per_tool = state
            .in_flight_per_tool
            .get(&key.tool)
            .copied()
            .unwrap_or(0);
        // A read for an epoch the executor has left can never be claimed, and one for an epoch
        // it has not reached would start before a non-read call that precedes it.
        if state.closed
            || key.epoch != state.epoch
            || state.launched >= self.max_launches
            || state.in_flight >= self.limits.max_in_flight
            || per_tool >= self.limits.max_in_flight_per_tool
        {
            return Launch::Refused;
        }
        let (cell, claimed) = (Cell::new(), Arc::new(AtomicBool::new(false)));
        state.entries.insert(
            key.clone(),
            Entry {
                cell: Arc::clone(&cell),
                origin: Origin::Scout(Arc::clone(&claimed)),
            },
        );
        state.launched += 1;
        state.in_flight += 1;
        *state
            .in_flight_per_tool
            .entry(key.tool.clone())
            .or_default() += 1;
        Launch::Start(cell, claimed)
    }

    /// A speculative read that [`PrefetchTable::launch`] started has finished.
    pub(crate) fn landed(&self, tool: &str) {
        let mut state = self.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        if let Some(n) = state.in_flight_per_tool.get_mut(tool) {
            *n = n.saturating_sub(1);
        }
    }

    /// Whether the run is over.
    pub(crate) fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Ends speculation for the run: nothing more is launched.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.bump();
    }

    /// Reads the executor dispatched itself so far.
    pub(crate) fn misses(&self) -> u64 {
        self.lock().misses
    }

    /// A receiver that changes whenever the executor completes a non-read call or misses.
    pub(crate) fn watch_progress(&self) -> watch::Receiver<u64> {
        self.progress.subscribe()
    }

    /// Non-read calls the executor has completed.
    pub(crate) fn writes_made(&self) -> usize {
        self.lock().writes.len()
    }

    /// (launched, claimed) so far.
    pub(crate) fn counts(&self) -> (u64, u64) {
        let state = self.lock();
        (state.launched, state.claimed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(epoch: u64, tool: &str) -> ReadKey {
        ReadKey {
            epoch,
            tool: tool.into(),
            args: "{}".into(),
        }
    }

    #[test]
    fn the_executor_claims_what_the_scout_started() {
        let table = PrefetchTable::new(SpeculationLimits::default(), 10);
        let Launch::Start(cell, _) = table.launch(&key(0, "a")) else {
            panic!("expected a start");
        };
        assert!(matches!(table.launch(&key(0, "a")), Launch::Existing(_)));
        cell.set(Ok(json!(1)));
        table.landed("a");
        match table.lookup(&key(0, "a")) {
            Lookup::Speculated(cell, claimed) => {
                assert_eq!(*cell.wait_blocking(), Ok(json!(1)));
                table.claim(&claimed);
                table.claim(&claimed);
            }
            _ => panic!("expected the speculative entry"),
        }
        assert_eq!(table.counts(), (1, 1));
    }

    #[test]
    fn executor_entries_answer_repeats_and_the_scout() {
        let table = PrefetchTable::new(SpeculationLimits::default(), 10);
        let Lookup::Miss(cell) = table.lookup(&key(0, "a")) else {
            panic!("expected a miss");
        };
        assert!(matches!(table.lookup(&key(0, "a")), Lookup::Repeat(_)));
        assert!(matches!(table.launch(&key(0, "a")), Launch::Existing(_)));
        cell.set(Ok(json!(2)));
        cell.set(Ok(json!(3)));
        assert_eq!(*cell.get().unwrap(), Ok(json!(2)), "a cell is set once");
        assert_eq!(table.misses(), 1);
    }

    #[test]
    fn stale_epochs_caps_and_closing_refuse_launches() {
        let limits = SpeculationLimits {
            max_in_flight_per_tool: 1,
            ..SpeculationLimits::default()
        };
        let table = PrefetchTable::new(limits, 3);
        table.record_write(WriteRecord {
            tool: "w".into(),
            args: "{}".into(),
            outcome: Arc::new(Ok(json!(null))),
        });
        assert!(
            matches!(table.launch(&key(0, "a")), Launch::Refused),
            "stale"
        );
        assert!(matches!(table.launch(&key(1, "a")), Launch::Start(..)));
        assert!(matches!(table.launch(&key(1, "b")), Launch::Start(..)));
        let other = ReadKey {
            args: "{\"x\":1}".into(),
            ..key(1, "a")
        };
        assert!(
            matches!(table.launch(&other), Launch::Refused),
            "per-tool cap"
        );
        table.landed("a");
        assert!(matches!(table.launch(&other), Launch::Start(..)));
        let third = ReadKey {
            args: "{\"x\":2}".into(),
            ..key(1, "b")
        };
        assert!(
            matches!(table.launch(&third), Launch::Refused),
            "launch cap"
        );
        table.close();
        assert!(table.is_closed());
        assert_eq!(table.write(0).unwrap().tool, "w");
        assert_eq!(table.writes_made(), 1);
    }

    #[tokio::test]
    async fn async_waiters_wake() {
        let cell = Cell::new();
        let waiter = {
            let cell = Arc::clone(&cell);
            tokio::spawn(async move { cell.wait().await })
        };
        tokio::task::yield_now().await;
        cell.set(Err(ToolError::not_found("x")));
        assert!(waiter.await.unwrap().is_err());
    }
}
