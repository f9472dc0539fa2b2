//! The journal of one run: what a resume answers from instead of calling tools. Kept in memory
//! (loaded whole when a run resumes) and appended to the store as the run goes:
//!
//! - a non-read call's **intent**, committed before the call reaches its body, together with
//!   every read journaled since the last commit, so that the reads a write's arguments may
//!   depend on are durable before the write is made;
//! - a non-read call's **outcome**, committed as soon as the executor has it;
//! - the outcomes of the reads the executor used, keyed by (epoch, tool, canonical arguments,
//!   occurrence), batched: committed with the next intent or outcome, every
//!   [`FLUSH_EVERY`] reads, and when the run stops. A read lost in a crash is made again.
//!
//! Non-read calls are keyed by `seq`, their position among the executor's non-read calls (the
//! epoch each one ends), which is the same in every run and resume of a script.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::Store;
use crate::error::{Error, Outcome, ToolError};
use crate::sync::lock;

/// Reads journaled between commits, at most.
const FLUSH_EVERY: usize = 256;

/// One read the executor used.
#[derive(Clone, Debug)]
pub(crate) struct ReadRow {
    pub(crate) epoch: u64,
    pub(crate) tool: String,
    pub(crate) args: String,
    /// Which occurrence of this read in its epoch (0 but for polling tools, called afresh).
    pub(crate) n: u64,
    pub(crate) outcome: Outcome,
}

/// What is known of a non-read call besides its outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct WriteState {
    /// A person approved it.
    pub(crate) approved: bool,
    /// A person asked for it to be made again after its outcome was lost.
    pub(crate) retry: bool,
    /// Its body was reached (or about to be): it may have taken effect.
    pub(crate) intent: bool,
}

/// One non-read call of the journal.
#[derive(Clone, Debug)]
pub(crate) struct JournaledWrite {
    pub(crate) seq: u64,
    pub(crate) tool: String,
    pub(crate) args: String,
    pub(crate) state: WriteState,
    /// `None`: not made yet, or made and its outcome lost.
    pub(crate) outcome: Option<Result<Value, ToolError>>,
}

type ReadId = (u64, String, String, u64);

#[derive(Debug, Default)]
struct State {
    writes: BTreeMap<u64, JournaledWrite>,
    unflushed: Vec<ReadRow>,
    /// Why a commit failed, once one has: the run makes no further call.
    failed: Option<String>,
}

/// The journal of one run.
pub(crate) struct Journal {
    store: Arc<Store>,
    run_id: String,
    /// The reads earlier processes of the run journaled: what a resume answers from. Reads
    /// journaled by this process are never looked up here (the run ledger has them), so this
    /// never changes, and is read without a lock.
    loaded: HashMap<ReadId, Outcome>,
    state: Mutex<State>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("run_id", &self.run_id)
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// The journal of `run_id`, with what the store already holds of it.
    ///
    /// # Errors
    ///
    /// [`Error::Store`] when it cannot be read.
    pub(crate) fn open(store: Arc<Store>, run_id: &str) -> Result<Journal, Error> {
        let (writes, reads) = store.load_journal(run_id)?;
        let state = State {
            writes: writes.into_iter().map(|w| (w.seq, w)).collect(),
            ..State::default()
        };
        Ok(Journal {
            store,
            run_id: run_id.to_string(),
            loaded: reads
                .into_iter()
                .map(|r| ((r.epoch, r.tool, r.args, r.n), r.outcome))
                .collect(),
            state: Mutex::new(state),
        })
    }

    /// The outcome of a read an earlier process of the run journaled, if there is one.
    pub(crate) fn read(&self, epoch: u64, tool: &str, args: &str, n: u64) -> Option<Outcome> {
        if self.loaded.is_empty() {
            return None;
        }
        let id = (epoch, tool.to_string(), args.to_string(), n);
        self.loaded.get(&id).cloned()
    }

    /// Journals a read the executor used; committed with the next commit, or now when enough
    /// have gathered. (A read already in the store is kept as it is.)
    pub(crate) fn record_read(&self, row: ReadRow) {
        let mut state = lock(&self.state);
        state.unflushed.push(row);
        if state.unflushed.len() >= FLUSH_EVERY {
            self.commit(&mut state, None);
        }
    }

    /// Whether a person approved the non-read call `seq`.
    pub(crate) fn approved(&self, seq: u64) -> bool {
        lock(&self.state)
            .writes
            .get(&seq)
            .is_some_and(|w| w.state.approved)
    }

    /// The journal's entry for the non-read call `seq`.
    pub(crate) fn write(&self, seq: u64) -> Option<JournaledWrite> {
        lock(&self.state).writes.get(&seq).cloned()
    }

    /// Commits that the call `seq` is about to reach its body. Blocks until the store has it.
    ///
    /// # Errors
    ///
    /// Why the store could not commit it: the call must not be made.
    pub(crate) fn intent(&self, seq: u64, tool: &str, args: &str) -> Result<(), String> {
        self.update(seq, tool, args, |w| {
            w.state.intent = true;
            w.outcome = None;
        })
    }

    /// Commits the outcome of the non-read call `seq`.
    ///
    /// # Errors
    ///
    /// Why the store could not commit it.
    pub(crate) fn outcome(
        &self,
        seq: u64,
        tool: &str,
        args: &str,
        outcome: &Result<Value, ToolError>,
    ) -> Result<(), String> {
        self.update(seq, tool, args, |w| w.outcome = Some(outcome.clone()))
    }

    /// Commits a person's decision on the call `seq`: `change` sets it on the call's entry.
    ///
    /// # Errors
    ///
    /// Why the store could not commit it.
    pub(crate) fn decide(
        &self,
        seq: u64,
        tool: &str,
        args: &str,
        change: impl FnOnce(&mut JournaledWrite),
    ) -> Result<(), String> {
        self.update(seq, tool, args, change)
    }

    fn update(
        &self,
        seq: u64,
        tool: &str,
        args: &str,
        change: impl FnOnce(&mut JournaledWrite),
    ) -> Result<(), String> {
        let mut state = lock(&self.state);
        if let Some(why) = &state.failed {
            return Err(why.clone());
        }
        let mut entry = state.writes.get(&seq).cloned().unwrap_or(JournaledWrite {
            seq,
            tool: tool.to_string(),
            args: args.to_string(),
            state: WriteState::default(),
            outcome: None,
        });
        change(&mut entry);
        state.writes.insert(seq, entry.clone());
        self.commit(&mut state, Some(entry));
        match &state.failed {
            Some(why) => Err(why.clone()),
            None => Ok(()),
        }
    }

    /// Commits the reads not committed yet.
    pub(crate) fn flush(&self) {
        let mut state = lock(&self.state);
        if !state.unflushed.is_empty() {
            self.commit(&mut state, None);
        }
    }

    /// Why the journal could not be written, once it could not.
    pub(crate) fn failure(&self) -> Option<String> {
        lock(&self.state).failed.clone()
    }

    fn commit(&self, state: &mut State, write: Option<JournaledWrite>) {
        if state.failed.is_some() {
            return;
        }
        let reads = std::mem::take(&mut state.unflushed);
        let writes: Vec<JournaledWrite> = write.into_iter().collect();
        if let Err(e) = self.store.append(&self.run_id, &reads, &writes) {
            tracing::error!(run_id = %self.run_id, error = %e, "the journal could not be written");
            state.failed = Some(e.to_string());
        }
    }
}
