//! One pass's log: the pending cells its decisions depended on (so that the scout knows when a
//! new pass can see more) and the guesses it made at conditions it did not know yet. Each pass
//! builds its own and hands it to every function it registers on its engine; nothing outlives
//! the pass.

use std::sync::{Arc, Mutex};

use rhai::{Dynamic, EvalAltResult, INT};

use super::{shallow, Resolved};
use crate::ledger::OutcomeSlot;
use crate::sync::lock;

/// What one pass learns while it runs. A log that no pass reads (outside a pass, say) costs
/// nothing but the notes written into it.
#[derive(Default)]
pub(crate) struct PassLog {
    inner: Mutex<Log>,
}

#[derive(Default)]
struct Log {
    /// The pending cells the pass's decisions depended on.
    pending: Vec<Arc<OutcomeSlot>>,
    /// The pass's guesses.
    guesses: GuessLog,
}

/// A guess a pass made at a condition it did not know yet: the condition, and the value it
/// went on with. A deferred call made after it, over the same pending reads, carries it, and is
/// not started once the condition proved the guess wrong: the pass was then on a path the run
/// does not take.
#[derive(Debug)]
pub(crate) struct Guess {
    condition: Dynamic,
    taken: bool,
}

impl Guess {
    /// Whether the condition is known now and is not what was guessed (or not a boolean, which
    /// ends the run there). One still unknown has proved nothing. Asked once the pass is
    /// over, so what the condition waits for is no pass's to note.
    pub(crate) fn proved_wrong(&self) -> bool {
        match shallow(&self.condition, &PassLog::default()) {
            Resolved::Value(v) => v.as_bool() != Ok(self.taken),
            Resolved::Pending(_) | Resolved::Never => false,
        }
    }
}

/// Guesses kept for one pending cell, the latest ones: a deferred call looks only at these.
pub(super) const GUESSES_PER_CELL: usize = 8;
/// Guesses one deferred call carries at most.
pub(crate) const GUESSES_PER_CALL: usize = 16;

/// The guesses of one pass.
#[derive(Default)]
struct GuessLog {
    /// Conditions guessed so far, recorded or not (see `rewrite::SETTLE`).
    count: INT,
    /// The latest recorded guesses, by each pending cell their condition waits for (keyed by
    /// the cell's address; the entry holds the cell, so the address is not reused meanwhile).
    by_cell: std::collections::HashMap<usize, (Arc<OutcomeSlot>, Vec<Arc<Guess>>)>,
}

impl PassLog {
    /// Notes that a decision depended on `cell`.
    pub(super) fn note(&self, cell: &Arc<OutcomeSlot>) {
        let mut log = lock(&self.inner);
        if !log.pending.iter().any(|c| Arc::ptr_eq(c, cell)) {
            log.pending.push(Arc::clone(cell));
        }
    }

    /// The pending cells noted so far, taken: the pass waits for them before it runs again.
    pub(crate) fn take_pending(&self) -> Vec<Arc<OutcomeSlot>> {
        std::mem::take(&mut lock(&self.inner).pending)
    }

    /// Conditions guessed so far, recorded or not (see `rewrite::SETTLE`).
    pub(super) fn guesses_made(&self) -> INT {
        lock(&self.inner).guesses.count
    }

    /// A guess at a condition the scout does not know yet: counted, and, when the condition
    /// waits for reads and the guess alone decides the branch (`recorded`), kept by those reads.
    fn guess(
        &self,
        condition: &Dynamic,
        cells: &[Arc<OutcomeSlot>],
        taken: bool,
        recorded: bool,
    ) -> bool {
        let log = &mut lock(&self.inner).guesses;
        log.count += 1;
        if !recorded || cells.is_empty() {
            return taken;
        }
        let guess = Arc::new(Guess {
            condition: condition.clone(),
            taken,
        });
        for cell in cells {
            let (_, kept) = log
                .by_cell
                .entry(Arc::as_ptr(cell) as usize)
                .or_insert_with(|| (Arc::clone(cell), Vec::new()));
            if kept.last().is_some_and(|g| Arc::ptr_eq(g, &guess)) {
                continue;
            }
            if kept.len() == GUESSES_PER_CELL {
                kept.remove(0);
            }
            kept.push(Arc::clone(&guess));
        }
        taken
    }

    /// The guesses made so far in this pass over any of `cells`, latest first, at most
    /// [`GUESSES_PER_CALL`].
    pub(crate) fn guesses_over(&self, cells: &[Arc<OutcomeSlot>]) -> Vec<Arc<Guess>> {
        let log = &lock(&self.inner).guesses;
        let mut out: Vec<Arc<Guess>> = Vec::new();
        for cell in cells {
            let Some((_, kept)) = log.by_cell.get(&(Arc::as_ptr(cell) as usize)) else {
                continue;
            };
            for guess in kept.iter().rev() {
                if out.len() == GUESSES_PER_CALL {
                    return out;
                }
                if !out.iter().any(|g| Arc::ptr_eq(g, guess)) {
                    out.push(Arc::clone(guess));
                }
            }
        }
        out
    }

    /// A condition's value: known, or guessed `guessed` (see [`PassLog::guess`]).
    pub(super) fn decide(
        &self,
        value: &Dynamic,
        guessed: bool,
        recorded: bool,
    ) -> Result<bool, Box<EvalAltResult>> {
        match shallow(value, self) {
            Resolved::Value(v) => v
                .as_bool()
                .map_err(|t| format!("a condition must be a boolean, not {t}").into()),
            Resolved::Pending(cells) => {
                cells.iter().for_each(|cell| self.note(cell));
                Ok(self.guess(value, &cells, guessed, recorded))
            }
            Resolved::Never => Ok(self.guess(value, &[], guessed, false)),
        }
    }

    /// A value as far as it is known: a placeholder that resolved becomes its value; a pending
    /// one is noted and stays `Err(())`.
    pub(super) fn known(&self, value: &Dynamic) -> Result<Dynamic, ()> {
        match shallow(value, self) {
            Resolved::Value(v) => Ok(v),
            Resolved::Pending(cells) => {
                cells.iter().for_each(|cell| self.note(cell));
                Err(())
            }
            Resolved::Never => Err(()),
        }
    }
}
