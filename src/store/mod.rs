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

mod cache;
mod catalog;
mod journal;
mod lease;
#[cfg(feature = "sqlite")]
mod plans;
#[cfg(feature = "postgres")]
mod postgres;
mod record;
#[cfg(feature = "sqlite")]
mod sqlite;

pub(crate) use cache::{now_us, MemoryCache};
pub use cache::{CacheDrop, CacheEntry};
pub use catalog::{CatalogPrint, ToolPrint};
pub(crate) use journal::Journal;
pub use journal::{ApprovedRead, JournaledWrite, ReadRow, WriteState};
pub(crate) use lease::keep as keep_lease;
pub use lease::{
    lease_from, parse_lease_s, Claim, Fence, Lease, LeaseListing, Renewed, DEFAULT_LEASE, LEASE_ENV,
};
#[cfg(feature = "postgres")]
pub use postgres::{is_postgres_url, mask_url, PostgresStore};
pub use record::{
    Awaiting, Mode, PendingCall, PruneRule, Pruned, ReadAt, RunPage, RunQuery, RunRecord,
    RunStatus, RunSummary,
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

    /// Records a new run, `running` and leased to the owner `record.lease` names (its token
    /// and times are the store's to set: token 1, expiring [`Store::lease_ttl`] from now). A
    /// record without a lease is stored unowned, as a run whose lease has expired.
    fn create_run(&self, record: RunRecord) -> StoreFuture<'_, ()>;

    /// How long a run's lease holds unless renewed (the store's setting `lease_s`, 30 s unless
    /// set).
    fn lease_ttl(&self) -> std::time::Duration {
        DEFAULT_LEASE
    }

    /// Renews the lease `fence` holds on a running run for another [`Store::lease_ttl`]; says
    /// when a newer owner took the run, or when there is no lease left to renew (the run
    /// paused or ended).
    fn renew_lease<'a>(&'a self, run_id: &'a str, fence: &'a Fence) -> StoreFuture<'a, Renewed>;

    /// A run, if the store has it.
    fn run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunRecord>>;

    /// A page of the list of runs, newest first: only the columns a list shows are read.
    ///
    /// # Errors
    ///
    /// Also [`Error::Store`] for a cursor no page gave.
    fn list_runs(&self, query: RunQuery) -> StoreFuture<'_, RunPage>;

    /// Removes the runs `rule` names (with their journals, and the artifacts no kept run
    /// refers to), except a running run whose lease is live; then gives the freed space back
    /// where `rule.vacuum` asks.
    fn prune(&self, rule: PruneRule) -> StoreFuture<'_, Pruned>;

    /// The ids of running runs whose lease has expired (or that have none), at most `limit`:
    /// the runs another process may take over. The default reads the list of runs and judges
    /// each lease by this machine's clock, newest run first; a store with a clock of its own
    /// (PostgreSQL's) judges by it.
    fn expired_runs(&self, limit: usize) -> StoreFuture<'_, Vec<String>> {
        Box::pin(async move {
            let mut found = Vec::new();
            let mut after = None;
            while found.len() < limit {
                let query = RunQuery::first(256)
                    .statuses([RunStatus::Running])
                    .after(after);
                let page = self.list_runs(query).await?;
                let expired = page
                    .runs
                    .iter()
                    .filter(|run| !run.lease.as_ref().is_some_and(Lease::is_live));
                found.extend(expired.map(|run| run.run_id.clone()));
                after = page.next;
                if after.is_none() {
                    break;
                }
            }
            found.truncate(limit);
            Ok(found)
        })
    }

    /// Records the catalog a run now runs under (its resume was judged by an earlier rule,
    /// or its catalog changed in prose only): both the whole-catalog hash and the fingerprints.
    fn set_catalog<'a>(
        &'a self,
        run_id: &'a str,
        catalog_sha256: String,
        catalog: CatalogPrint,
    ) -> StoreFuture<'a, ()>;

    /// Takes a run for `claim`'s owner to resume, atomically: a paused run with a decision on
    /// the call it waits at, or an interrupted run, or a running one whose lease has expired,
    /// without one. The run is `running` again, leased to `claim` with the next fencing token
    /// for [`Store::lease_ttl`]; the record is as it was before it was taken, but for its
    /// `lease`, which is the new one. A running run whose lease is live is refused
    /// ([`TakeRefused::Busy`], with that lease), unless `claim` retakes its own.
    ///
    /// The decision is checked and journaled in the same transaction that takes the run: the
    /// run must still be paused at `decision.seq` (and `decision.read`), waiting for what the decision answers, and
    /// the journal must hold no outcome of that call (an outcome is never replaced). Anything
    /// else is refused ([`TakeRefused::Stale`], [`TakeRefused::Settled`]) and nothing changes.
    fn take_run<'a>(
        &'a self,
        run_id: &'a str,
        claim: Claim,
        decision: Option<TakeDecision>,
    ) -> StoreFuture<'a, Result<RunRecord, TakeRefused>>;

    /// Records where a run ended (or paused): its status, its pending call and the outcome its
    /// process printed. The run has no owner afterwards (its fencing token stays). With
    /// `end.fence`, refused when a newer owner took the run.
    fn finish_run<'a>(&'a self, run_id: &'a str, end: StoredEnd) -> StoreFuture<'a, ()>;

    /// A run's journal, whole: its non-read calls by seq, and the reads the executor used.
    fn load_journal<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, JournalRows>;

    /// Appends journal rows in one transaction, durable when the future completes: the reads
    /// (a read already stored is kept as it is), then the non-read calls (a row per seq,
    /// replaced whole, unless the stored row has an outcome: then the whole append fails, for
    /// a journaled outcome is never replaced). With `rows.fence`, the append is refused when a
    /// newer owner took the run, and renews the lease otherwise.
    fn append<'a>(&'a self, run_id: &'a str, rows: JournalRows) -> StoreFuture<'a, ()>;

    /// Keeps an artifact under `id` (content-addressed: one kept before with the same id stays).
    fn put_artifact<'a>(&'a self, id: &'a str, artifact: StoredArtifact) -> StoreFuture<'a, ()>;

    /// An artifact, if the store has it.
    fn artifact<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<StoredArtifact>>;

    /// An artifact with only what reading its page `page` needs: when it has a [`PageIndex`],
    /// The key of the journal's keyed digests (arguments that hold a secret or a redacted
    /// value are journaled as an HMAC of them, never in clear): kept apart from the store's
    /// data, so that a copy of the data alone cannot confirm a guessed value. The default has
    /// none: a run that needs one fails to start, saying so.
    fn digest_key(&self) -> StoreFuture<'_, Arc<[u8; 32]>> {
        Box::pin(async move {
            Err(Error::store(
                &self.location(),
                "this store keeps no key for keyed digests, which a run with secrets or redacted values needs",
                None,
            ))
        })
    }

    /// `content` holds only that page's bytes (none when it has no such page), so that reading
    /// a page costs the page; without one (stored before pages were indexed), the whole
    /// content. The default reads the whole artifact and cuts it.
    fn artifact_page<'a>(
        &'a self,
        id: &'a str,
        page: usize,
    ) -> StoreFuture<'a, Option<StoredArtifact>> {
        Box::pin(async move {
            let Some(mut artifact) = self.artifact(id).await? else {
                return Ok(None);
            };
            if let Some(index) = &artifact.index {
                artifact.content = index
                    .ranges
                    .get(page)
                    .and_then(|r| artifact.content.get(r.start as usize..r.end as usize))
                    .map(<[u8]>::to_vec)
                    .unwrap_or_default();
            }
            Ok(Some(artifact))
        })
    }

    /// The cached read under `key` that a run started at `at_us` (microseconds since the Unix
    /// epoch) may use: made before that, and not expired then. A store that keeps no cache
    /// (the default) has none.
    fn cache_get<'a>(&'a self, key: &'a str, at_us: i64) -> StoreFuture<'a, Option<CacheEntry>> {
        let _ = (key, at_us);
        Box::pin(async { Ok(None) })
    }

    /// Keeps cached reads in one transaction, each replacing one under the same key. The
    /// default keeps nothing.
    fn cache_put(&self, entries: Vec<CacheEntry>) -> StoreFuture<'_, ()> {
        let _ = entries;
        Box::pin(async { Ok(()) })
    }

    /// Drops the cached reads `drops` name, in one transaction; how many went. The default has
    /// none to drop.
    fn cache_drop(&self, drops: Vec<CacheDrop>) -> StoreFuture<'_, u64> {
        let _ = drops;
        Box::pin(async { Ok(0) })
    }

    /// Keeps a plan (see docs/plans.md). The default keeps none: a plan is then refused,
    /// saying so.
    fn put_plan(&self, plan: StoredPlan) -> StoreFuture<'_, ()> {
        let _ = plan;
        Box::pin(async move { Err(Error::store(&self.location(), NO_PLANS, None)) })
    }

    /// A plan, if the store keeps it.
    fn plan<'a>(&'a self, plan_id: &'a str) -> StoreFuture<'a, Option<StoredPlan>> {
        let _ = plan_id;
        Box::pin(async { Ok(None) })
    }

    /// The plan run `run_id` applies, if it applies one.
    fn plan_of_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<StoredPlan>> {
        let _ = run_id;
        Box::pin(async { Ok(None) })
    }

    /// Gives a plan to the run `run_id` that applies it, atomically: `Ok(None)` when it is
    /// now that run's, `Ok(Some(other))` when run `other` applied it already (nothing
    /// changes). A plan is applied once.
    fn claim_plan<'a>(
        &'a self,
        plan_id: &'a str,
        run_id: &'a str,
    ) -> StoreFuture<'a, Option<String>> {
        let _ = (plan_id, run_id);
        Box::pin(async move { Err(Error::store(&self.location(), NO_PLANS, None)) })
    }

    /// Whether the artifact `id` belongs to `tenant`: a run of the tenant made it or refers
    /// to it. The default sees no tenants: every artifact is refused to every tenant.
    fn artifact_of_tenant<'a>(&'a self, id: &'a str, tenant: &'a str) -> StoreFuture<'a, bool> {
        let _ = (id, tenant);
        Box::pin(async { Ok(false) })
    }

    /// Takes a plan back from the run `run_id` that claimed it, when that run could not start.
    fn release_plan<'a>(&'a self, plan_id: &'a str, run_id: &'a str) -> StoreFuture<'a, ()> {
        let _ = (plan_id, run_id);
        Box::pin(async { Ok(()) })
    }
}

/// Why a store that keeps no plans refuses one.
const NO_PLANS: &str = "this store keeps no plans";

/// A plan as a store keeps it: its id, times, the run that applied it, and the rest as JSON
/// (the store reads no more of it).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct StoredPlan {
    /// Its id.
    pub plan_id: String,
    /// When it was made, in ms since the Unix epoch.
    pub created_ms: i64,
    /// When it expires.
    pub expires_ms: i64,
    /// The run that applied it.
    pub applied_run: Option<String>,
    /// The whole plan, as JSON.
    pub body: String,
    /// The tenant the plan belongs to (`serve --http --auth`); `None` without one.
    pub tenant: Option<String>,
    /// Which token made the plan: the first hex digits of its SHA-256, never the token.
    pub made_by: Option<String>,
}

impl StoredPlan {
    /// A plan not yet applied.
    pub fn new(plan_id: String, created_ms: i64, expires_ms: i64, body: String) -> StoredPlan {
        StoredPlan {
            plan_id,
            created_ms,
            expires_ms,
            applied_run: None,
            body,
            tenant: None,
            made_by: None,
        }
    }
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
    /// The lease the owner that records it holds: refused when a newer owner took the run.
    pub fence: Option<Fence>,
}

impl StoredEnd {
    /// The end of a run: its status, pending call and printed outcome.
    pub fn new(status: RunStatus, pending: Option<PendingCall>, outcome: Value) -> StoredEnd {
        StoredEnd {
            status,
            pending,
            outcome,
            fence: None,
        }
    }

    /// The end, recorded only while `fence` is the run's newest lease.
    pub fn fenced(mut self, fence: Option<Fence>) -> StoredEnd {
        self.fence = fence;
        self
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
    /// Reads of the script a person approved after the guard asked about them.
    pub approved_reads: Vec<ApprovedRead>,
    /// The lease the owner that appends holds: refused when a newer owner took the run.
    pub fence: Option<Fence>,
}

impl JournalRows {
    /// Rows of non-read calls and reads.
    pub fn new(writes: Vec<JournaledWrite>, reads: Vec<ReadRow>) -> JournalRows {
        JournalRows {
            writes,
            reads,
            approved_reads: Vec::new(),
            fence: None,
        }
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
    /// Where each page is in `content`, computed once when it was stored; `None` for an
    /// artifact stored before pages were indexed, whose pages are cut when read.
    pub index: Option<PageIndex>,
}

/// Where each page of an artifact is in its content: the pages' kind and, for each page, the
/// byte range of its body. The store keeps it as it is given; what the ranges mean is the
/// result policies' business (a page of `items` is the range between `[` and `]`, one of
/// `text` the range between quotes).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PageIndex {
    /// The pages' kind: `items`, `entries`, `text` or `json`.
    pub kind: String,
    /// Each page's byte range in the content, in order.
    pub ranges: Vec<std::ops::Range<u64>>,
}

impl PageIndex {
    /// An index of pages of `kind` at `ranges`.
    pub fn new(kind: impl Into<String>, ranges: Vec<std::ops::Range<u64>>) -> PageIndex {
        PageIndex {
            kind: kind.into(),
            ranges,
        }
    }

    /// The index as the SQLite store keeps it: the kind, a zero byte, then each range's start
    /// and end as little-endian `u64`s.
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.kind.len() + 1 + self.ranges.len() * 16);
        out.extend_from_slice(self.kind.as_bytes());
        out.push(0);
        for range in &self.ranges {
            out.extend_from_slice(&range.start.to_le_bytes());
            out.extend_from_slice(&range.end.to_le_bytes());
        }
        out
    }

    /// The index [`PageIndex::encode`] wrote; `None` for bytes it could not have written.
    #[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
    pub(crate) fn decode(bytes: &[u8]) -> Option<PageIndex> {
        let zero = bytes.iter().position(|b| *b == 0)?;
        let kind = std::str::from_utf8(&bytes[..zero]).ok()?.to_string();
        let rest = &bytes[zero + 1..];
        if !rest.len().is_multiple_of(16) {
            return None;
        }
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        let ranges = rest
            .chunks_exact(16)
            .map(|pair| word(&pair[..8])..word(&pair[8..]))
            .collect::<Vec<_>>();
        ranges
            .iter()
            .all(|r| r.start <= r.end)
            .then_some(PageIndex { kind, ranges })
    }
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
            index: None,
        }
    }

    /// The artifact with its pages' `index`.
    pub fn with_index(mut self, index: PageIndex) -> StoredArtifact {
        self.index = Some(index);
        self
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
    /// The run is running, under this live lease.
    Busy(Lease),
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
    /// For a read the run waits at: where it is (`seq` is then its epoch).
    pub read: Option<ReadAt>,
    /// The decision.
    pub verdict: Verdict,
}

impl TakeDecision {
    /// A decision on the non-read call `seq`.
    pub fn new(seq: u64, verdict: Verdict) -> TakeDecision {
        TakeDecision {
            seq,
            read: None,
            verdict,
        }
    }

    /// A decision on the call `pending` (a non-read call, or a read the guard asked about).
    pub fn on(pending: &PendingCall, verdict: Verdict) -> TakeDecision {
        TakeDecision {
            seq: pending.seq,
            read: pending.read,
            verdict,
        }
    }
}

/// What a decision does to the journal's entry of the call it is for.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Verdict {
    /// Approved: the call is made when the run reaches it.
    Approve,
    /// Approved with the guard's rule that asked about it: the call, and every later call the
    /// rule asks about in the run.
    ApproveRule(String),
    /// Rejected: the call's outcome is this error, and it is never made.
    Reject(crate::error::ToolError),
    /// Its lost outcome took effect: the outcome is a null result.
    Done,
    /// Its lost outcome did not take effect: it is made again.
    Retry,
}

impl Verdict {
    /// Whether a run waiting for `awaiting` takes this verdict.
    pub fn answers(&self, awaiting: Awaiting) -> bool {
        match self {
            Verdict::Approve | Verdict::Reject(_) => {
                matches!(awaiting, Awaiting::Approval | Awaiting::PlanDivergence)
            }
            Verdict::ApproveRule(_) => awaiting == Awaiting::Approval,
            Verdict::Done | Verdict::Retry => awaiting == Awaiting::Resolve,
        }
    }

    /// Sets the verdict on the journal's entry of its call.
    pub fn apply(&self, entry: &mut JournaledWrite) {
        match self {
            Verdict::Approve => entry.state.approved = true,
            Verdict::ApproveRule(rule) => {
                entry.state.approved = true;
                entry.approved_rule = Some(rule.clone());
            }
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
pub(crate) use record::utc as utc_ms;

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
