//! What one run shares between its calls: the registry, the runtime's breakers, and the run's
//! own budget, repeat guard, receipts and effect log; and the claim of a speculative outcome,
//! which replays on them what the sequential call would have done.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::breaker::{Breakers, Replay};
use super::budget::BudgetMeter;
use super::receipt::{ReceiptLog, Sink};
use super::repeat::RepeatGuard;
use super::{Budget, Receipt, Speculation};
use crate::error::{ErrorKind, ToolError};
use crate::store::Journal;
use crate::sync::lock;
use crate::tool::{Effect, Registry, ToolSpec};

/// A non-read call that reached its tool's body, in the order the bodies started. A composite's
/// own entry comes before the entries of the calls nested in it.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct EffectRecord {
    /// The tool called.
    pub tool: String,
    /// Its effect (never `read`).
    pub effect: Effect,
    /// The validated arguments.
    pub args: Value,
    /// Whether the call succeeded; `None` (`null` in JSON) when its outcome is unknown: it
    /// timed out or was abandoned after its body started, so it may or may not have taken
    /// effect.
    pub ok: Option<bool>,
}

/// Counters a caller can watch while a run is going (the CLI's live line), and the run's id
/// from the moment the run has one.
#[derive(Debug, Default)]
pub struct Progress {
    done: AtomicU64,
    in_flight: AtomicU64,
    run_id: std::sync::OnceLock<String>,
    named: tokio::sync::Notify,
}

impl Progress {
    /// The id of the run these counters watch, once it started (or, resumed, was taken).
    pub fn run_id(&self) -> Option<&str> {
        self.run_id.get().map(String::as_str)
    }

    /// Waits until the run has an id, and returns it.
    pub async fn named(&self) -> &str {
        loop {
            let notified = self.named.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(id) = self.run_id() {
                return id;
            }
            notified.await;
        }
    }

    /// Gives the counters the id of their run; only the first call counts.
    pub(crate) fn name(&self, run_id: &str) {
        if self.run_id.set(run_id.to_string()).is_ok() {
            self.named.notify_waiters();
        }
    }

    /// Calls finished so far.
    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Calls running now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub(super) fn started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn finished(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.done.fetch_add(1, Ordering::Relaxed);
    }
}

/// What the executor's claim of a speculative outcome came to.
#[derive(Debug)]
pub(crate) enum Claim {
    /// Charged to the budget and replayed on the breakers exactly as the sequential call; the
    /// outcome is the run's.
    Taken,
    /// The sequential call would have been refused at this point, with this error (charged as
    /// it would have been).
    Refused(ToolError),
    /// The outcome cannot stand for the sequential one (a limit only speculation has shaped
    /// it, or the sequential call would have taken another path): nothing was charged, and the
    /// executor makes the call itself.
    Redo,
}

/// Everything one run shares between its calls.
pub(crate) struct RunContext {
    pub(crate) registry: Arc<Registry>,
    pub(super) breakers: Arc<Breakers>,
    pub(super) budget: BudgetMeter,
    pub(super) repeat: RepeatGuard,
    pub(super) receipts: ReceiptLog,
    effects: Mutex<Vec<EffectRecord>>,
    started: Instant,
    next_call_id: AtomicU64,
    dispatched: AtomicU64,
    pub(crate) progress: Arc<Progress>,
    /// The root of the run's cancellation tree: cancelled when the run's future is dropped.
    /// Under it, the scout's and its speculative calls' (`speculation`), and each call's, which
    /// its body sees in its [`ToolContext`](crate::tool::ToolContext). Shared behind an `Arc`,
    /// as every node a call hangs from: a call's context takes it without the lock a token's
    /// clone takes.
    pub(crate) cancel: Arc<CancellationToken>,
    /// Cancelled when the run no longer needs speculation: the scout stops, and speculative
    /// calls still running end `cancelled`.
    pub(crate) speculation: Arc<CancellationToken>,
    /// Calls of this run that have resolved to a tool and not yet written their receipt.
    open: AtomicU64,
    /// Notified when `open` falls to zero.
    all_closed: tokio::sync::Notify,
    /// Someone waits in [`RunContext::settled`]: only then does the last call to close wake
    /// it (a sequential run closes its only open call at every call).
    settling: AtomicBool,
    /// The run's journal, when the run is durable.
    pub(crate) journal: JournalSlot,
    /// The script's `input` (`None`: it was given none, and reads `()`).
    pub(crate) input: Option<Arc<Value>>,
    /// The value every tool body of the run is given (`ToolContext::context`).
    pub(crate) context: Option<Arc<Value>>,
    /// The guard's rule and reason of the last call it asked a person about: what the pause
    /// shows.
    asked: Mutex<Option<(String, String)>>,
    /// The run's own masked values (the values its tools' `redact` paths name), besides the
    /// process's secrets.
    pub(crate) mask: crate::secrets::Mask,
    /// The run's view of the cache of reads across runs; `None`: the run does not use it.
    pub(crate) cache: Option<super::cache::RunCache>,
    /// Whether non-read calls are refused (the fixture sandbox).
    pub(crate) sandbox: super::Sandbox,
    /// The recorded reads that answer this run's reads, when it has them.
    pub(crate) fixtures: Option<Arc<super::Fixtures>>,
    /// Where the reads this run uses are recorded, when they are.
    pub(crate) recorder: Option<Arc<super::Recorder>>,
    /// The plan the run makes or applies, when it does.
    pub(crate) plan: Option<Arc<crate::plan::PlanBook>>,
}

/// A run's journal: set when the run is made, or (a streamed run) once its text is complete
/// and the run is recorded; nothing journals before then.
#[derive(Debug, Default)]
pub(crate) struct JournalSlot(std::sync::OnceLock<Arc<Journal>>);

impl JournalSlot {
    /// The journal, when the run is durable.
    pub(crate) fn as_ref(&self) -> Option<&Arc<Journal>> {
        self.0.get()
    }

    /// Makes the run durable; `false` when it already was (the journal is kept).
    pub(crate) fn set(&self, journal: Arc<Journal>) -> bool {
        self.0.set(journal).is_ok()
    }
}

impl RunContext {
    /// The context of a run that must end within `deadline` (the run's one deadline).
    pub(crate) fn new(
        registry: Arc<Registry>,
        breakers: Arc<Breakers>,
        budget: Budget,
        deadline: Duration,
        run_id: String,
        progress: Arc<Progress>,
        receipts: Option<Sink>,
    ) -> RunContext {
        let started = Instant::now();
        let cancel = Arc::new(CancellationToken::new());
        RunContext {
            registry,
            breakers,
            budget: BudgetMeter::new(budget, started, deadline),
            repeat: RepeatGuard::default(),
            receipts: ReceiptLog::new(run_id, receipts),
            effects: Mutex::default(),
            started,
            next_call_id: AtomicU64::new(1),
            dispatched: AtomicU64::new(0),
            progress,
            speculation: Arc::new(cancel.child_token()),
            cancel,
            open: AtomicU64::new(0),
            all_closed: tokio::sync::Notify::new(),
            settling: AtomicBool::new(false),
            journal: JournalSlot::default(),
            input: None,
            context: None,
            asked: Mutex::new(None),
            cache: None,
            mask: crate::secrets::Mask::default(),
            sandbox: super::Sandbox::Off,
            fixtures: None,
            recorder: None,
            plan: None,
        }
    }

    /// A keyed digest of `text` (`hmac:…`), for a receipt of a call whose arguments or result
    /// hold a secret or a redacted value: under the store's key in a durable run, else under a
    /// key this process made and never shows.
    pub(crate) fn keyed_digest(&self, text: &str) -> String {
        static PROCESS_KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
        let key = match self.journal.as_ref().and_then(|j| j.key()) {
            Some(key) => **key,
            None => *PROCESS_KEY.get_or_init(|| {
                let mut key = [0u8; 32];
                // Without the system's random bytes, a key from the clock and the process:
                // still never written anywhere.
                if getrandom::fill(&mut key).is_err() {
                    let seed = format!("{:?}-{}", std::time::SystemTime::now(), std::process::id());
                    key = sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(
                        seed,
                    ))
                    .into();
                }
                key
            }),
        };
        format!("hmac:{}", crate::json::hmac_sha256_hex(&key, text))
    }

    /// The masks of what the run keeps and hands back: the process's secrets, then the run's
    /// own values.
    pub(crate) fn masks(&self) -> crate::secrets::Masks<'_> {
        crate::secrets::Masks {
            masks: [crate::secrets::process_mask(), &self.mask],
        }
    }

    /// Starts the run's deadline again, `length` from now: a streamed run's, once its text is
    /// complete (until then it bounded the streaming phase).
    pub(crate) fn restart_deadline(&self, length: std::time::Duration) {
        self.budget.restart(tokio::time::Instant::now(), length);
    }

    /// Makes the run use the cache of reads across runs.
    pub(crate) fn with_cache(mut self, cache: Option<super::cache::RunCache>) -> RunContext {
        self.cache = cache;
        self
    }

    /// The run's id and the fencing token of the lease this process holds on it, for a tool's
    /// context.
    pub(crate) fn fencing(&self) -> Option<(Arc<str>, u64)> {
        let journal = self.journal.as_ref()?;
        let token = journal.fence()?.token;
        Some((Arc::from(journal.run_id()), token))
    }

    /// Makes the run durable: its non-read calls' intents are committed to `journal`.
    pub(crate) fn with_journal(self, journal: Option<Arc<Journal>>) -> RunContext {
        if let Some(journal) = journal {
            self.journal.set(journal);
        }
        self
    }

    /// The fixture sandbox, the fixtures that answer reads, and where reads are recorded.
    pub(crate) fn with_fixtures(
        mut self,
        sandbox: super::Sandbox,
        fixtures: Option<Arc<super::Fixtures>>,
        recorder: Option<Arc<super::Recorder>>,
    ) -> RunContext {
        self.sandbox = sandbox;
        self.fixtures = fixtures;
        self.recorder = recorder;
        self
    }

    /// Makes the run make or apply a plan.
    pub(crate) fn with_plan(mut self, plan: Option<Arc<crate::plan::PlanBook>>) -> RunContext {
        self.plan = plan;
        self
    }

    /// The plan the run makes, when it makes one.
    pub(crate) fn planning(&self) -> Option<&crate::plan::Planning> {
        self.plan
            .as_deref()
            .and_then(crate::plan::PlanBook::as_planning)
    }

    /// The plan the run applies, when it applies one.
    pub(crate) fn applying(&self) -> Option<&crate::plan::Applying> {
        self.plan
            .as_deref()
            .and_then(crate::plan::PlanBook::as_applying)
    }

    /// Whether the run keys reads by their occurrence in the whole run: it answers them from
    /// fixtures or records them.
    pub(crate) fn counts_occurrences(&self) -> bool {
        self.fixtures.is_some() || self.recorder.is_some()
    }

    /// The run's `input` for the script and the `context` for its tools.
    pub(crate) fn with_values(
        mut self,
        input: Option<Arc<Value>>,
        context: Option<Arc<Value>>,
    ) -> RunContext {
        self.input = input;
        self.context = context;
        self
    }

    /// The run's id.
    pub(crate) fn run_id(&self) -> &str {
        self.receipts.run_id()
    }

    pub(super) fn call_opened(&self) {
        self.progress.started();
        self.open.fetch_add(1, Ordering::SeqCst);
    }

    pub(super) fn call_closed(&self) {
        self.progress.finished();
        if self.open.fetch_sub(1, Ordering::SeqCst) == 1 && self.settling.load(Ordering::SeqCst) {
            self.all_closed.notify_waiters();
        }
    }

    /// Waits until every call of the run has written its receipt, or `limit` has passed; the
    /// number of calls still open. A call abandoned by its caller (a nested call whose
    /// composite timed out) may settle a moment after its caller returned.
    pub(crate) async fn settled(&self, limit: Duration) -> u64 {
        let deadline = Instant::from_std(crate::sync::deadline_after(
            Instant::now().into_std(),
            limit,
        ));
        // Set before the count is first read: a call that closes after that read sees it.
        self.settling.store(true, Ordering::SeqCst);
        loop {
            let closed = self.all_closed.notified();
            tokio::pin!(closed);
            // Registered before the count is read, so that a close in between is not missed.
            closed.as_mut().enable();
            let open = self.open.load(Ordering::SeqCst);
            if open == 0 || Instant::now() >= deadline {
                return open;
            }
            let _ = tokio::time::timeout_at(deadline, closed).await;
        }
    }

    /// Counts a read the scout wants to start against the run's speculative cap.
    pub(crate) fn reserve_speculative(&self) -> bool {
        self.budget.reserve_speculative()
    }

    /// The executor claims the outcome of a speculative call of `tool`: the budget is charged
    /// and the breakers replay what the sequential call — with every call nested in it —
    /// would have done at this point, or nothing happens and the call is made afresh.
    ///
    /// Called by the read ledger only, which keeps the entry's side of the claim.
    pub(crate) fn claim(
        &self,
        tool: &str,
        speculation: &Speculation,
        outcome: &Result<Value, ToolError>,
    ) -> Claim {
        // A composite that timed out after a nested call queued for a slot: the queue is
        // speculation's (sequential composites run one at a time), so the timeout may be too.
        let queued = matches!(outcome, Err(e) if e.kind == ErrorKind::Timeout)
            && speculation.waited.load(Ordering::SeqCst);
        if matches!(outcome, Err(e) if e.kind.is_speculation_refusal())
            || queued
            || speculation.shaped.load(Ordering::SeqCst)
        {
            return Claim::Redo;
        }
        let now = Instant::now();
        // A read the cache answered never reached its breaker: the claim charges the budget
        // alone, as the sequential call's hit does.
        if speculation.cached.load(Ordering::SeqCst) {
            if let Err(e) = self.budget.has_room(1, now) {
                return Claim::Refused(e);
            }
            let _ = self.budget.charge_claim(1, now);
            speculation.claimed.store(true, Ordering::SeqCst);
            self.receipts.release(&speculation.claimed);
            self.count_speculative_hits(speculation);
            return Claim::Taken;
        }
        let nested = lock(&speculation.nested).clone();
        let calls = 1 + nested.len() as u64;
        // Sequentially the composite is in flight while its nested calls run: at their busiest
        // they must have fitted under `max_in_flight`, or a sequential run met the cap.
        let peak = speculation.nested_peak.load(Ordering::SeqCst);
        if peak > 0 && !self.budget.fits_in_flight(1 + peak) {
            return Claim::Redo;
        }
        if let Err(e) = self.budget.has_room(calls, now) {
            // A composite's nested calls would have met the budget's end inside its body.
            return if nested.is_empty() {
                Claim::Refused(e)
            } else {
                Claim::Redo
            };
        }
        // The room was checked above, and only the executor charges calls while it claims,
        // so the charges below cannot fail.
        let health = *lock(&speculation.health);
        // A read its fixtures answered never met its breaker, sequentially either.
        let replayed = if speculation.answered.load(Ordering::SeqCst) {
            Ok(())
        } else {
            self.breakers.replay(tool, health, &nested, now)
        };
        match replayed {
            Err(Replay::Diverged) => Claim::Redo,
            Err(Replay::Refused(e)) => {
                // As the sequential call: charged, then refused by its breaker.
                let _ = self.budget.charge_claim(1, now);
                Claim::Refused(e)
            }
            Ok(()) => {
                let _ = self.budget.charge_claim(calls, now);
                speculation.claimed.store(true, Ordering::SeqCst);
                self.receipts.release(&speculation.claimed);
                self.count_speculative_hits(speculation);
                Claim::Taken
            }
        }
    }

    /// Counts the hits of a claimed speculation (its nested calls') as the run's.
    fn count_speculative_hits(&self, speculation: &Speculation) {
        if let Some(cache) = &self.cache {
            cache.count_hits(speculation.hits.load(Ordering::SeqCst));
        }
    }

    /// Hits of the cache the run used.
    pub(crate) fn cache_hits(&self) -> u64 {
        self.cache.as_ref().map_or(0, super::cache::RunCache::hits)
    }

    /// The time from the run's start to `now`.
    pub(crate) fn elapsed_at(&self, now: tokio::time::Instant) -> Duration {
        now.saturating_duration_since(self.started)
    }

    /// Calls that entered the dispatch path.
    pub(crate) fn dispatched(&self) -> u64 {
        self.dispatched.load(Ordering::Relaxed)
    }

    pub(super) fn count_dispatch(&self) {
        self.dispatched.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn next_call_id(&self) -> u64 {
        self.next_call_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Logs a non-read call whose body is about to start; its outcome is set when it ends.
    pub(super) fn log_effect(&self, spec: &ToolSpec, args: &Value) -> usize {
        let mut effects = lock(&self.effects);
        effects.push(EffectRecord {
            tool: spec.name.clone(),
            effect: spec.effect,
            args: args.clone(),
            ok: None,
        });
        effects.len() - 1
    }

    /// Logs a non-read call the journal answered, with its journaled outcome: it reached its
    /// tool in an earlier process of the run.
    pub(crate) fn log_replayed_effect(
        &self,
        tool: &str,
        effect: Effect,
        args: Value,
        outcome: &Result<Value, ToolError>,
    ) {
        lock(&self.effects).push(EffectRecord {
            tool: tool.to_string(),
            effect,
            args,
            ok: super::effect_ok(outcome),
        });
    }

    pub(super) fn set_effect_outcome(&self, index: usize, ok: Option<bool>) {
        if let Some(record) = lock(&self.effects).get_mut(index) {
            record.ok = ok;
        }
    }

    /// Why the run's receipts file could not be written, once it could not: the run makes no
    /// further call.
    pub(crate) fn receipts_failure(&self) -> Option<String> {
        self.receipts.failure()
    }

    pub(crate) fn take_receipts(&self) -> Vec<Receipt> {
        self.receipts.take()
    }

    /// Notes the rule and reason of a call the guard asks a person about.
    pub(crate) fn note_asked(&self, rule: String, reason: String) {
        *lock(&self.asked) = Some((rule, reason));
    }

    /// The rule and reason of the last call the guard asked about, taken.
    pub(crate) fn take_asked(&self) -> Option<(String, String)> {
        lock(&self.asked).take()
    }

    pub(crate) fn take_effects(&self) -> Vec<EffectRecord> {
        std::mem::take(&mut *lock(&self.effects))
    }
}
