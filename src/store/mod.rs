//! The store of durable runs: runs (their script, catalog hash, status and pending call), their
//! journals and the artifacts of their outputs, behind one narrow interface, [`Store`], so that
//! an embedded database and a networked one can back it alike.
//!
//! - [`Store`] is the interface: asynchronous methods, plain records in and out, the crate's
//!   [`Error`] for every failure. Nothing of a backend shows through it.
//! - `sqlite` (feature `sqlite`) is the embedded backend: one SQLite file, its blocking work
//!   done on tokio's blocking pool, never on a worker.
//! - [`Journal`] is one run's journal as the dispatch path and the executor use it, written
//!   through the interface.

mod catalog;
mod journal;
mod record;
#[cfg(feature = "sqlite")]
mod sqlite;

pub use catalog::{CatalogPrint, ToolPrint};
pub(crate) use journal::Journal;
pub use journal::{JournaledWrite, ReadRow, WriteState};
pub use record::{
    Awaiting, Mode, PendingCall, PruneRule, Pruned, RunPage, RunQuery, RunRecord, RunStatus,
    RunSummary,
};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteStore, STORE_ENV};

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::Value;

use crate::error::Error;

/// What a store's method returns: a future that owns or borrows what it was given, `Send` so
/// that a run can await it on any worker.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

/// Whether the process that owns a running run still runs it (given its process id).
pub type OwnerAlive = Arc<dyn Fn(u32) -> bool + Send + Sync>;

/// The store of durable runs: runs, their journals and artifacts.
///
/// It is a trait object (`Arc<dyn Store>`) because the backend is chosen when the program
/// starts (a file, a database server), not when it is compiled; its methods therefore return
/// boxed futures ([`StoreFuture`]) rather than being `async fn`s, whose futures could not be
/// named through `dyn`. A box per call costs nothing next to a commit that syncs a file or
/// crosses a network.
///
/// Every method may wait on I/O, and none blocks the thread that polls it: a backend whose
/// client is blocking (SQLite) does that work on tokio's blocking pool. Methods must be awaited
/// within a tokio runtime.
///
/// # Errors
///
/// Every method fails with [`Error::Store`] when the store cannot be read or written, and a
/// method that reads a run fails the same way, naming the run and the field, when a stored
/// record does not parse: bad data is never read as a default.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Where the store is, for messages: a file's path, or a server's address without its
    /// credentials.
    fn location(&self) -> String;

    /// Records a new run, `running` and owned by this process.
    fn create_run(&self, record: RunRecord) -> StoreFuture<'_, ()>;

    /// A run, if the store has it.
    fn run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunRecord>>;

    /// A page of the list of runs, newest first: only the columns a list shows are read.
    ///
    /// # Errors
    ///
    /// Also [`Error::Store`] for a cursor no page gave.
    fn list_runs(&self, query: RunQuery) -> StoreFuture<'_, RunPage>;

    /// Removes the runs `rule` names (with their journals, and the artifacts no kept run
    /// refers to), except a running run whose process is alive (`alive` says so); then gives
    /// the freed space back where `rule.vacuum` asks.
    fn prune(&self, rule: PruneRule, alive: OwnerAlive) -> StoreFuture<'_, Pruned>;

    /// Records the catalog a run now runs under (its resume was judged by an earlier rule,
    /// or its catalog changed in prose only): both the whole-catalog hash and the fingerprints.
    fn set_catalog<'a>(
        &'a self,
        run_id: &'a str,
        catalog_sha256: String,
        catalog: CatalogPrint,
    ) -> StoreFuture<'a, ()>;

    /// Takes a run for this process to resume, atomically: a paused run with a decision on
    /// the call it waits at, or an interrupted run, or a running one whose owner is gone
    /// (`alive` says whether an owner still runs it), without one. The run is `running`
    /// again, owned by this process; the record is as it was before it was taken.
    ///
    /// The decision is checked and journaled in the same transaction that takes the run: the
    /// run must still be paused at `decision.seq`, waiting for what the decision answers, and
    /// the journal must hold no outcome of that call (an outcome is never replaced). Anything
    /// else is refused ([`TakeRefused::Stale`], [`TakeRefused::Settled`]) and nothing changes.
    fn take_run<'a>(
        &'a self,
        run_id: &'a str,
        alive: OwnerAlive,
        decision: Option<TakeDecision>,
    ) -> StoreFuture<'a, Result<RunRecord, TakeRefused>>;

    /// Records where a run ended (or paused): its status, its pending call and the outcome its
    /// process printed. The run has no owner afterwards.
    fn finish_run<'a>(&'a self, run_id: &'a str, end: StoredEnd) -> StoreFuture<'a, ()>;

    /// A run's journal, whole: its non-read calls by seq, and the reads the executor used.
    fn load_journal<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, JournalRows>;

    /// Appends journal rows in one transaction, durable when the future completes: the reads
    /// (a read already stored is kept as it is), then the non-read calls (a row per seq,
    /// replaced whole, unless the stored row has an outcome: then the whole append fails, for
    /// a journaled outcome is never replaced).
    fn append<'a>(&'a self, run_id: &'a str, rows: JournalRows) -> StoreFuture<'a, ()>;

    /// Keeps an artifact under `id` (content-addressed: one kept before with the same id stays).
    fn put_artifact<'a>(&'a self, id: &'a str, artifact: StoredArtifact) -> StoreFuture<'a, ()>;

    /// An artifact, if the store has it.
    fn artifact<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<StoredArtifact>>;
}

/// Where a run ended or paused, as [`Store::finish_run`] records it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct StoredEnd {
    /// Where the run is now.
    pub status: RunStatus,
    /// The call a paused run waits at.
    pub pending: Option<PendingCall>,
    /// What the run's process printed with `--json`.
    pub outcome: Value,
}

impl StoredEnd {
    /// The end of a run: its status, pending call and printed outcome.
    pub fn new(status: RunStatus, pending: Option<PendingCall>, outcome: Value) -> StoredEnd {
        StoredEnd {
            status,
            pending,
            outcome,
        }
    }
}

/// Rows of one run's journal, as loaded or appended.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct JournalRows {
    /// Non-read calls, by seq.
    pub writes: Vec<JournaledWrite>,
    /// Reads the executor used.
    pub reads: Vec<ReadRow>,
}

impl JournalRows {
    /// Rows of non-read calls and reads.
    pub fn new(writes: Vec<JournaledWrite>, reads: Vec<ReadRow>) -> JournalRows {
        JournalRows { writes, reads }
    }
}

/// An artifact as the store keeps it: the canonical JSON of a value a run's output could not
/// hold, and the page budget its pages are cut for.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct StoredArtifact {
    /// The bytes, exactly as stored (their SHA-256 is the id).
    pub content: Vec<u8>,
    /// The tokens each page holds at most.
    pub page_tokens: usize,
    /// The policy that made it.
    pub policy: String,
    /// The run that made it first.
    pub run_id: String,
}

impl StoredArtifact {
    /// An artifact of `run_id` made by `policy`, paged for `page_tokens`.
    pub fn new(
        content: Vec<u8>,
        page_tokens: usize,
        policy: impl Into<String>,
        run_id: impl Into<String>,
    ) -> StoredArtifact {
        StoredArtifact {
            content,
            page_tokens,
            policy: policy.into(),
            run_id: run_id.into(),
        }
    }
}

/// Why a run cannot be taken for resuming.
#[derive(Debug)]
#[non_exhaustive]
pub enum TakeRefused {
    /// The store has no such run.
    Unknown,
    /// The run has ended.
    Ended(Box<RunRecord>),
    /// The run is running, in the process with this id.
    Busy(u32),
    /// The decision does not fit the run as it is now (it is not paused, or paused at another
    /// call, or waiting for another kind of decision), or a paused run was given none: the
    /// record says where it is.
    Stale(Box<RunRecord>),
    /// The journal already holds the outcome of the call the decision was for.
    Settled(u64),
}

/// A person's decision on the call a paused run waits at, as [`Store::take_run`] journals it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct TakeDecision {
    /// The call the decision is for: the run must still wait at it.
    pub seq: u64,
    /// The decision.
    pub verdict: Verdict,
}

impl TakeDecision {
    /// A decision on the call `seq`.
    pub fn new(seq: u64, verdict: Verdict) -> TakeDecision {
        TakeDecision { seq, verdict }
    }
}

/// What a decision does to the journal's entry of the call it is for.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Verdict {
    /// Approved: the call is made when the run reaches it.
    Approve,
    /// Rejected: the call's outcome is this error, and it is never made.
    Reject(crate::error::ToolError),
    /// Its lost outcome took effect: the outcome is a null result.
    Done,
    /// Its lost outcome did not take effect: it is made again.
    Retry,
}

impl Verdict {
    /// What a run must wait for to take this verdict.
    pub fn answers(&self) -> Awaiting {
        match self {
            Verdict::Approve | Verdict::Reject(_) => Awaiting::Approval,
            Verdict::Done | Verdict::Retry => Awaiting::Resolve,
        }
    }

    /// Sets the verdict on the journal's entry of its call.
    pub fn apply(&self, entry: &mut JournaledWrite) {
        match self {
            Verdict::Approve => entry.state.approved = true,
            Verdict::Reject(error) => entry.outcome = Some(Err(error.clone())),
            Verdict::Done => entry.outcome = Some(Ok(Value::Null)),
            Verdict::Retry => {
                entry.state.intent = false;
                entry.state.retry = true;
            }
        }
    }
}

pub(crate) use crate::error::shown_run_id;

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
