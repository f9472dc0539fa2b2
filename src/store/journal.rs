//! The journal of one run: what a resume answers from instead of calling tools. Kept in memory
//! (loaded whole when a run resumes) and appended to the store as the run goes:
//!
//! - a non-read call's **intent**, committed before the call reaches its body, together with
//!   every read journaled since the last commit, so that the reads a write's arguments may
//!   depend on are durable before the write is made, and with the process's live children
//!   (`children::snapshot`), which a resume checks when the call's outcome was lost;
//! - a non-read call's **outcome**, committed as soon as the executor has it;
//! - the outcomes of the reads the executor used, keyed by (epoch, tool, canonical arguments,
//!   occurrence), batched: committed with the next intent or outcome, every
//!   [`FLUSH_EVERY`] reads (in a task of its own: the script does not wait for it), and when
//!   the run stops. A read lost in a crash is made again.
//!
//! Commits go through [`Store`] one at a time, in order (a commit takes every read journaled
//! before it), so a write's intent is never durable before the reads journaled ahead of it.
//!
//! Every commit carries the run's lease (its [`Fence`]): the store refuses it once a newer
//! owner took the run, and the journal then fails, so that the run makes no further call. A
//! task renews the lease while the run is live ([`Journal::keep_lease`]).
//!
//! Non-read calls are keyed by `seq`, their position among the executor's non-read calls (the
//! epoch each one ends), which is the same in every run and resume of a script.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::{Fence, JournalRows, Store};
use crate::children::ProcessSnapshot;
use crate::error::{Error, Outcome, ToolError};
use crate::sync::lock;

/// Reads journaled between commits, at most.
const FLUSH_EVERY: usize = 256;

/// One read the executor used.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ReadRow {
    /// The executor's epoch when it read.
    pub epoch: u64,
    /// The tool.
    pub tool: String,
    /// The call's canonical arguments.
    pub args: String,
    /// Which occurrence of this read in its epoch (0 but for polling tools, called afresh).
    pub n: u64,
    /// What the read returned.
    pub outcome: Arc<Result<Value, ToolError>>,
}

impl ReadRow {
    /// The `n`th read of `tool` with `args` in `epoch`, and its outcome.
    pub fn new(
        epoch: u64,
        tool: impl Into<String>,
        args: impl Into<String>,
        n: u64,
        outcome: Arc<Result<Value, ToolError>>,
    ) -> ReadRow {
        ReadRow {
            epoch,
            tool: tool.into(),
            args: args.into(),
            n,
            outcome,
        }
    }
}

/// A person's approval of one of the script's reads that the guard asked about (the run paused
/// at it): the read is made when the run reaches it again.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ApprovedRead {
    /// The executor's epoch at the read.
    pub epoch: u64,
    /// The tool.
    pub tool: String,
    /// The call's canonical arguments.
    pub args: String,
    /// Which occurrence of the read in its epoch.
    pub n: u64,
    /// The guard's rule a person approved with it (`--approve-rule`): every later call that
    /// rule asks about in the run is approved too.
    pub rule: Option<String>,
}

impl ApprovedRead {
    /// The approval of the `n`th read of `tool` with `args` in `epoch`, with the rule approved
    /// with it, if any.
    pub fn new(
        epoch: u64,
        tool: impl Into<String>,
        args: impl Into<String>,
        n: u64,
        rule: Option<String>,
    ) -> ApprovedRead {
        ApprovedRead {
            epoch,
            tool: tool.into(),
            args: args.into(),
            n,
            rule,
        }
    }
}

/// What is known of a non-read call besides its outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteState {
    /// A person approved it.
    pub approved: bool,
    /// A person asked for it to be made again after its outcome was lost.
    pub retry: bool,
    /// Its body was reached (or about to be): it may have taken effect.
    pub intent: bool,
}

impl WriteState {
    /// A state from its three flags.
    pub fn new(approved: bool, retry: bool, intent: bool) -> WriteState {
        WriteState {
            approved,
            retry,
            intent,
        }
    }
}

/// One non-read call of the journal.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct JournaledWrite {
    /// Its position among the run's non-read calls.
    pub seq: u64,
    /// The tool.
    pub tool: String,
    /// The call's canonical arguments.
    pub args: String,
    /// Approval, retry and intent.
    pub state: WriteState,
    /// `None`: not made yet, or made and its outcome lost.
    pub outcome: Option<Result<Value, ToolError>>,
    /// The process that journaled its intent, and that process's children then: what a
    /// resume checks to tell whether a call whose outcome was lost may still be running.
    /// `None` before its intent, and in a journal written before it was kept.
    pub processes: Option<ProcessSnapshot>,
    /// The guard's rule a person approved with this call (`--approve-rule`): every later call
    /// that rule asks about in the run is approved too.
    pub approved_rule: Option<String>,
}

impl JournaledWrite {
    /// The call `seq` of `tool` with `args`, in `state`, with its outcome if it has one.
    pub fn new(
        seq: u64,
        tool: impl Into<String>,
        args: impl Into<String>,
        state: WriteState,
        outcome: Option<Result<Value, ToolError>>,
    ) -> JournaledWrite {
        JournaledWrite {
            seq,
            tool: tool.into(),
            args: args.into(),
            state,
            outcome,
            processes: None,
            approved_rule: None,
        }
    }
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
    store: Arc<dyn Store>,
    run_id: String,
    /// The reads earlier processes of the run journaled: what a resume answers from. Reads
    /// journaled by this process are never looked up here (the run ledger has them), so this
    /// never changes, and is read without a lock.
    loaded: HashMap<ReadId, Outcome>,
    /// The reads a person approved (the run paused at each), with the rule approved with each;
    /// only a resume adds them, so this never changes either.
    approved_reads: HashMap<ReadId, Option<String>>,
    state: Mutex<State>,
    /// Held through each commit, so that commits reach the store one at a time and in order.
    committing: tokio::sync::Mutex<()>,
    /// Where a flush of gathered reads runs, off the script's thread.
    handle: tokio::runtime::Handle,
    /// The store's key of keyed digests, for a run that may hold secrets or redacted values.
    key: Option<Arc<[u8; 32]>>,
    /// The lease this process holds on the run, which every commit carries.
    fence: Option<Fence>,
    /// The task that renews the lease while the run is live.
    renewal: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Journal {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.renewal).take() {
            task.abort();
        }
    }
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
    pub(crate) async fn open(
        store: Arc<dyn Store>,
        run_id: &str,
        keyed: bool,
        fence: Option<Fence>,
    ) -> Result<Journal, Error> {
        let rows = store.load_journal(run_id).await?;
        let key = match keyed {
            true => Some(store.digest_key().await?),
            false => None,
        };
        Ok(Journal::from_rows(store, run_id, rows, key, fence))
    }

    /// The journal of `run_id`, with `rows`, what the store holds of it.
    fn from_rows(
        store: Arc<dyn Store>,
        run_id: &str,
        rows: JournalRows,
        key: Option<Arc<[u8; 32]>>,
        fence: Option<Fence>,
    ) -> Journal {
        let state = State {
            writes: rows.writes.into_iter().map(|w| (w.seq, w)).collect(),
            ..State::default()
        };
        Journal {
            store,
            run_id: run_id.to_string(),
            loaded: rows
                .reads
                .into_iter()
                .map(|r| ((r.epoch, r.tool, r.args, r.n), r.outcome))
                .collect(),
            approved_reads: rows
                .approved_reads
                .into_iter()
                .map(|r| ((r.epoch, r.tool, r.args, r.n), r.rule))
                .collect(),
            state: Mutex::new(state),
            committing: tokio::sync::Mutex::new(()),
            handle: tokio::runtime::Handle::current(),
            key,
            fence,
            renewal: Mutex::new(None),
        }
    }

    /// A journal holding `reads`, as a resume would load them (for tests of what reads it).
    #[cfg(test)]
    pub(crate) fn holding(store: Arc<dyn Store>, reads: Vec<ReadRow>) -> Journal {
        Journal::from_rows(
            store,
            "run",
            JournalRows::new(Vec::new(), reads),
            None,
            None,
        )
    }

    /// Renews the run's lease, in a task of its own, until the run lets it go
    /// ([`Journal::release`]) or the journal is dropped.
    pub(crate) fn keep_lease(self: &Arc<Self>) {
        if self.fence.is_some() {
            let task = super::keep_lease(self, Arc::clone(&self.store));
            if let Some(old) = lock(&self.renewal).replace(task) {
                old.abort();
            }
        }
    }

    /// Stops renewing the run's lease: the run is ending or pausing, and the store lets the
    /// lease go when it records that.
    pub(crate) fn release(&self) {
        if let Some(task) = lock(&self.renewal).take() {
            task.abort();
        }
    }

    /// The lease this process holds on the run, if it holds one.
    pub(crate) fn fence(&self) -> Option<&Fence> {
        self.fence.as_ref()
    }

    /// The run's id.
    pub(crate) fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Fails the journal: the run makes no further call, and nothing more is committed.
    pub(crate) fn fail(&self, why: String) {
        let mut state = lock(&self.state);
        if state.failed.is_none() {
            state.failed = Some(why);
        }
    }

    /// A non-read call's arguments (their key form) as the journal keeps them: as they are,
    /// or, when they hold a secret or a redacted value, a keyed digest of them (`hmac:…`; a
    /// plain `sha256:…` in a journal opened without a key), which a resume matches without
    /// the value ever being kept.
    pub(crate) fn args_form<'a>(
        &self,
        masks: crate::secrets::Masks<'_>,
        args: &'a str,
        redacted: bool,
    ) -> std::borrow::Cow<'a, str> {
        if !redacted && (masks.is_empty() || !masks.holds_text(args)) {
            return std::borrow::Cow::Borrowed(args);
        }
        std::borrow::Cow::Owned(match &self.key {
            Some(key) => format!("hmac:{}", crate::json::hmac_sha256_hex(key, args)),
            None => format!("sha256:{}", crate::json::sha256_hex(args)),
        })
    }

    /// The store's key of keyed digests, when the journal was opened with it.
    pub(crate) fn key(&self) -> Option<&Arc<[u8; 32]>> {
        self.key.as_ref()
    }

    /// Whether the arguments `stored` (as [`Journal::args_form`] kept them) are `args`.
    pub(crate) fn same_args(&self, stored: &str, args: &str) -> bool {
        if stored == args {
            return true;
        }
        if let Some(digest) = stored.strip_prefix("hmac:") {
            return self
                .key
                .as_ref()
                .is_some_and(|key| crate::json::hmac_sha256_hex(key, args) == digest);
        }
        stored
            .strip_prefix("sha256:")
            .is_some_and(|digest| crate::json::sha256_hex(args) == digest)
    }

    /// The outcome of a read an earlier process of the run journaled, if there is one.
    pub(crate) fn read(&self, epoch: u64, tool: &str, args: &str, n: u64) -> Option<Outcome> {
        if self.loaded.is_empty() {
            return None;
        }
        let id = (epoch, tool.to_string(), args.to_string(), n);
        self.loaded.get(&id).cloned()
    }

    /// Journals a read the executor used; committed with the next commit, or by a task of its
    /// own when enough have gathered. (A read already in the store is kept as it is.)
    pub(crate) fn record_read(self: &Arc<Self>, row: ReadRow) {
        let mut state = lock(&self.state);
        state.unflushed.push(row);
        if state.unflushed.len() == FLUSH_EVERY {
            drop(state);
            let journal = Arc::clone(self);
            self.handle.spawn(async move { journal.flush().await });
        }
    }

    /// Whether a person approved the non-read call `seq`.
    pub(crate) fn approved(&self, seq: u64) -> bool {
        lock(&self.state)
            .writes
            .get(&seq)
            .is_some_and(|w| w.state.approved)
    }

    /// Whether a person approved the `n`th read of `tool` with `args` in `epoch`.
    pub(crate) fn read_approved(&self, epoch: u64, tool: &str, args: &str, n: u64) -> bool {
        !self.approved_reads.is_empty()
            && self
                .approved_reads
                .contains_key(&(epoch, tool.to_string(), args.to_string(), n))
    }

    /// Whether a person approved the guard's `rule` for the rest of the run.
    pub(crate) fn rule_approved(&self, rule: &str) -> bool {
        self.approved_reads
            .values()
            .any(|r| r.as_deref() == Some(rule))
            || lock(&self.state)
                .writes
                .values()
                .any(|w| w.approved_rule.as_deref() == Some(rule))
    }

    /// The journal's entry for the non-read call `seq`.
    pub(crate) fn write(&self, seq: u64) -> Option<JournaledWrite> {
        lock(&self.state).writes.get(&seq).cloned()
    }

    /// Commits that the call `seq` is about to reach its body; done when the store has it.
    ///
    /// # Errors
    ///
    /// Why the store could not commit it: the call must not be made.
    pub(crate) async fn intent(&self, seq: u64, tool: &str, args: &str) -> Result<(), String> {
        // What the call may reach outside this process, so that a resume after a crash can
        // tell whether it may still be running.
        let processes = crate::children::snapshot();
        self.update(seq, tool, args, move |w| {
            w.state.intent = true;
            w.outcome = None;
            w.processes = Some(processes);
        })
        .await
    }

    /// Commits the outcome of the non-read call `seq`.
    ///
    /// # Errors
    ///
    /// Why the store could not commit it.
    pub(crate) async fn outcome(
        &self,
        seq: u64,
        tool: &str,
        args: &str,
        outcome: &Result<Value, ToolError>,
    ) -> Result<(), String> {
        self.update(seq, tool, args, |w| w.outcome = Some(outcome.clone()))
            .await
    }

    async fn update(
        &self,
        seq: u64,
        tool: &str,
        args: &str,
        change: impl FnOnce(&mut JournaledWrite) + Send,
    ) -> Result<(), String> {
        let (entry, before) = {
            let mut state = lock(&self.state);
            if let Some(why) = &state.failed {
                return Err(why.clone());
            }
            let before = state.writes.get(&seq).cloned();
            let mut entry = before.clone().unwrap_or(JournaledWrite {
                seq,
                tool: tool.to_string(),
                args: args.to_string(),
                state: WriteState::default(),
                outcome: None,
                processes: None,
                approved_rule: None,
            });
            change(&mut entry);
            state.writes.insert(seq, entry.clone());
            (entry, before)
        };
        self.commit(Some(entry)).await;
        match self.failure() {
            Some(why) => {
                // The entry is as the store holds it: a failed intent is known not to be durable.
                let mut state = lock(&self.state);
                match before {
                    Some(before) => state.writes.insert(seq, before),
                    None => state.writes.remove(&seq),
                };
                Err(why)
            }
            None => Ok(()),
        }
    }

    /// Whether the intent of the non-read call `seq` is durable in the store: its body may
    /// have been reached. (A commit that failed left the entry as the store holds it.)
    pub(crate) fn intent_durable(&self, seq: u64) -> bool {
        lock(&self.state)
            .writes
            .get(&seq)
            .is_some_and(|w| w.state.intent)
    }

    /// Commits the reads not committed yet.
    pub(crate) async fn flush(&self) {
        if !lock(&self.state).unflushed.is_empty() {
            self.commit(None).await;
        }
    }

    /// Why the journal could not be written, once it could not.
    pub(crate) fn failure(&self) -> Option<String> {
        lock(&self.state).failed.clone()
    }

    /// Commits `write` with every read journaled so far, after the commits before it.
    async fn commit(&self, write: Option<JournaledWrite>) {
        let _turn = self.committing.lock().await;
        let reads = {
            let mut state = lock(&self.state);
            if state.failed.is_some() {
                return;
            }
            std::mem::take(&mut state.unflushed)
        };
        if reads.is_empty() && write.is_none() {
            return;
        }
        let mut rows = JournalRows::new(write.into_iter().collect(), reads);
        rows.fence = self.fence.clone();
        if let Err(e) = self.store.append(&self.run_id, rows).await {
            let e = e.report();
            tracing::error!(run_id = %self.run_id, error = %e, "the journal could not be written");
            lock(&self.state).failed = Some(e);
        }
    }
}

/// A call's outcome as a journal keeps it: `{"ok": value}` or `{"error": {...}}`.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
pub(crate) fn encode_outcome(outcome: &Result<Value, ToolError>) -> String {
    let value = match outcome {
        Ok(value) => serde_json::json!({ "ok": value }),
        Err(e) => serde_json::json!({ "error": {
            "kind": e.kind_name(),
            "message": e.message,
            "tool": e.tool,
            "recoverable": e.recoverable,
            "suggested_next_action": e.suggested_next_action,
        }}),
    };
    value.to_string()
}

/// An outcome as [`encode_outcome`] wrote it; one that does not parse is an `internal` error.
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
pub(crate) fn decode_outcome(text: &str) -> Result<Value, ToolError> {
    let corrupt = || ToolError::internal("the journal holds an outcome it cannot read");
    let mut value: Value = serde_json::from_str(text).map_err(|_| corrupt())?;
    if let Some(ok) = value.get_mut("ok") {
        return Ok(ok.take());
    }
    let e = value.get("error").ok_or_else(corrupt)?;
    let text = |key: &str| e.get(key).and_then(Value::as_str).map(str::to_string);
    // A tool's own kind keeps its name (`rate_limited`), so a replayed failure reads as it was.
    let mut error = text("kind")
        .and_then(|k| ToolError::with_kind_name(&k, text("message").unwrap_or_default()))
        .ok_or_else(corrupt)?;
    error.tool = text("tool");
    error.recoverable = e
        .get("recoverable")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    error.suggested_next_action = text("suggested_next_action");
    Err(error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use serde_json::json;

    #[test]
    fn outcomes_round_trip() {
        let error = ToolError::not_found("no user 7")
            .for_tool("get_user")
            .with_next_action("look again");
        let own = ToolError::with_kind_name("rate_limited", "slow down")
            .unwrap()
            .with_recoverable(true);
        for outcome in [Ok(json!({"a": [1, 2.5, null]})), Err(error), Err(own)] {
            assert_eq!(decode_outcome(&encode_outcome(&outcome)), outcome);
        }
        let decoded = decode_outcome(&encode_outcome(&Err(ToolError::with_kind_name(
            "rate_limited",
            "x",
        )
        .unwrap())));
        assert_eq!(
            decoded.unwrap_err().kind_name(),
            "rate_limited",
            "a tool's own kind is replayed by its name"
        );
        assert_eq!(
            decode_outcome("garbage").unwrap_err().kind,
            ErrorKind::Internal
        );
    }
}
