//! The one dispatch path. Every call — top-level, nested inside a composite, or speculative —
//! goes through [`dispatch`], which reads top to bottom as the steps below.
//!
//! # Order
//!
//! 1. resolve the tool;
//! 2. check the caller may call it;
//!    then authorize: the guard's policies decide whether the call may go on (`permission_denied`
//!    naming the rule), or ask a person (the script's own call pauses, `paused`; any other
//!    call a rule asks about is denied: the scout leaves it to the executor); then the fixture
//!    sandbox refuses a non-read call (`side_effect_blocked`, [`fixture`]);
//! 3. repeat guard;
//! 4. approval gate: a call of the script to a tool that needs approval, not yet approved,
//!    pauses the run (`paused`);
//! 5. charge the budget; a read the run's fixtures answer ends here, never reaching its breaker
//!    or body (`fixture_missing` when they lack it); then the cache of reads across runs: a hit
//!    answers the call here, never reaching the breaker, the body, its timeout or its retries
//!    (`cache.rs`);
//! 6. breaker admits;
//! 7. validate input;
//! 8. wait for a slot of the tool (outside its timeout); journal a non-read call's intent
//!    (committed before its body is reached); then run the body under its timeout, catching
//!    panics, retrying;
//! 9. validate output;
//! 10. record the outcome in the breaker;
//! 11. write the receipt; then a read that missed the cache leaves its result there, and a
//!     call that invalidates cached reads drops them before it returns.
//!
//! Steps 2–9 can refuse a call; every call that resolved to a tool gets exactly one receipt,
//! whatever happens to its future (see [`InProgress`]).

mod breaker;
mod budget;
mod cache;
mod context;
mod fixture;
mod nested;
mod receipt;
mod repeat;
mod retry;
mod schema;

pub use breaker::BreakerConfig;
pub(crate) use budget::Budget;
pub use context::{EffectRecord, Progress};
pub use fixture::Sandbox;
pub use receipt::{
    verify_receipts, verify_receipts_to, write_receipts, Receipt, Status, RECEIPT_VERSION,
};

pub(crate) use breaker::Breakers;
pub(crate) use budget::deadline_passed;
pub(crate) use cache::{Backend as CacheBackend, RunCache, MEMORY_CACHE_BYTES};
pub(crate) use context::{Claim, RunContext};
pub(crate) use fixture::{Fixtures, Recorder};
pub(crate) use receipt::Sink;
pub(crate) use schema::check_input;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;

use futures::FutureExt;
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::error::{ErrorKind, Outcome, ToolError};
use crate::guard::Decision;
use crate::json::{
    jcs_value_digest, jcs_value_digest_keyed, key_json, key_json_shared, DraftDigest, Hex,
    LaterValue,
};
use crate::secrets::Side;
use crate::store::ReadAt;
use crate::sync::lock;
use crate::tool::{Approval, Effect, RegisteredTool, ToolContext};
use breaker::{Admission, Health};
use retry::RetryPolicy;

/// Who makes a call. Each caller carries exactly what its kind of call needs.
#[derive(Clone, Debug)]
pub(crate) enum Caller {
    /// The script itself, through the executor.
    Script,
    /// The scout, ahead of the executor: a speculative read.
    Scout(Arc<Speculation>),
    /// A composite's body.
    Composite {
        /// The composite's call id, the receipt's `parent`.
        parent: u64,
        /// The tools the composite declared: the only ones it may call.
        allowed: Arc<[String]>,
        /// The composite's speculation, when the scout started it: its nested calls are
        /// speculative too, and claimed with it.
        speculation: Option<Arc<Speculation>>,
        /// The composite call's cancellation, the parent of its nested calls'.
        cancel: Arc<CancellationToken>,
    },
}

impl Caller {
    /// The speculation this call belongs to, if it is speculative.
    fn speculation(&self) -> Option<&Arc<Speculation>> {
        match self {
            Caller::Script => None,
            Caller::Scout(speculation) => Some(speculation),
            Caller::Composite { speculation, .. } => speculation.as_ref(),
        }
    }

    fn parent(&self) -> Option<u64> {
        match self {
            Caller::Composite { parent, .. } => Some(*parent),
            _ => None,
        }
    }

    /// The node of the run's cancellation tree the call hangs from: the run's for the
    /// script's calls, speculation's for the scout's, the composite call's for nested ones.
    fn cancellation<'a>(&'a self, ctx: &'a RunContext) -> &'a Arc<CancellationToken> {
        match self {
            Caller::Script => &ctx.cancel,
            Caller::Scout(_) => &ctx.speculation,
            Caller::Composite { cancel, .. } => cancel,
        }
    }
}

/// What a speculative call (and every call nested in it) leaves for the executor's claim: what
/// the sequential call would have done to the budget and the breakers, and whether anything
/// only speculation has shaped its outcome. The claim replays it (see [`RunContext::claim`]).
#[derive(Debug, Default)]
pub(crate) struct Speculation {
    /// Set when the executor claims the outcome (the receipts say so).
    claimed: Arc<AtomicBool>,
    /// What the call would have recorded in its breaker; `None` if it stopped before.
    health: Mutex<Option<Health>>,
    /// The nested calls of a speculative composite, in the order they reached the budget step,
    /// with what each would have recorded in its breaker.
    nested: Mutex<Vec<(String, Option<Health>)>>,
    /// A nested call was refused or cut short by something only speculation has (an open
    /// breaker seen without admitting, a cancellation): the outcome is not the sequential one.
    shaped: AtomicBool,
    /// The cache answered the call itself: its claim charges the budget and never the breaker.
    cached: AtomicBool,
    /// Hits of the cache among the call and its nested calls, counted as the run's when the
    /// call is claimed.
    hits: AtomicU64,
    /// The run's fixtures answered it before its breaker: the claim replays no breaker.
    answered: AtomicBool,
    /// A speculative composite's nested calls running now, and the most that ran at once: a
    /// sequential composite holds a call in flight while they run, and must fit them all
    /// under `max_in_flight` (the claim checks it).
    nested_running: AtomicU64,
    nested_peak: AtomicU64,
    /// A nested call of a speculative composite waited for a slot of its tool, inside the
    /// composite's timeout: speculative composites start together and queue where sequential
    /// ones would not, so the composite's timeout is not the one a sequential run would meet.
    waited: AtomicBool,
}

/// A nested call of a speculative composite, counted while it runs.
struct NestedFlight(Arc<Speculation>);

impl NestedFlight {
    fn enter(speculation: &Arc<Speculation>) -> NestedFlight {
        let now = speculation.nested_running.fetch_add(1, Ordering::SeqCst) + 1;
        speculation.nested_peak.fetch_max(now, Ordering::SeqCst);
        NestedFlight(Arc::clone(speculation))
    }
}

impl Drop for NestedFlight {
    fn drop(&mut self) {
        self.0.nested_running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One call to dispatch.
#[derive(Clone, Debug)]
pub(crate) struct Call {
    /// The tool's name as the caller wrote it; shared with the registry's copy when it named
    /// a registered tool.
    pub(crate) tool: Arc<str>,
    pub(crate) args: Value,
    /// `args` in the key form of canonical JSON ([`key_json`]): the call's identity for the
    /// read ledger, the repeat guard and the journal, computed once. (The receipt hashes the
    /// arguments in the receipt form instead.)
    pub(crate) args_key: Arc<str>,
    pub(crate) caller: Caller,
    /// For a non-read call of the script: its position among the script's non-read calls
    /// (the journal's key), and the idempotency key its tool sees.
    pub(crate) seq: Option<u64>,
    pub(crate) idempotency_key: Option<String>,
    /// For a read of the script: its epoch and occurrence (the journal's key of the read, and
    /// of a person's approval of it).
    pub(crate) read_at: Option<ReadAt>,
    /// For a read of the script (or the scout's ahead of it): its occurrence in the whole run,
    /// the key of its answer in the run's fixtures (see [`fixture`]). `None`: no fixture
    /// answers it (a composite's nested call, a run without fixtures).
    pub(crate) fixture: Option<u64>,
    /// For a non-read call of a run applying a plan: it is the plan's next planned call, and
    /// the plan gives the approvals it needs (see [`crate::plan`]).
    pub(crate) planned: bool,
}

impl Call {
    /// A call made by `caller`.
    pub(crate) fn new(tool: impl Into<Arc<str>>, args: Value, caller: Caller) -> Call {
        Call {
            tool: tool.into(),
            args_key: key_json_shared(&args),
            args,
            caller,
            seq: None,
            idempotency_key: None,
            read_at: None,
            fixture: None,
            planned: false,
        }
    }

    /// Makes this the script's non-read call number `seq` of run `run_id`.
    pub(crate) fn at_seq(mut self, run_id: &str, seq: u64) -> Call {
        self.seq = Some(seq);
        self.idempotency_key = Some(format!("{run_id}:{seq}"));
        self
    }

    /// Makes this the script's read `at`.
    pub(crate) fn read_at(mut self, at: ReadAt) -> Call {
        self.read_at = Some(at);
        self
    }

    /// Makes this the read answered by the run's fixtures at `occurrence`.
    pub(crate) fn fixture_at(mut self, occurrence: Option<u64>) -> Call {
        self.fixture = occurrence;
        self
    }

    /// A call made by the script itself.
    pub(crate) fn top_level(tool: impl Into<Arc<str>>, args: Value) -> Call {
        Call::new(tool, args, Caller::Script)
    }
}

/// A call from the moment it resolved to a tool until its receipt is written. Whatever happens
/// to the call's future, the receipt is written exactly once and the progress counts stay right:
/// [`InProgress::finish`] writes it with the call's result; dropped before that (a composite's
/// timeout dropped a nested call, a client went away), the guard writes it with the outcome such
/// a call has — `cancelled` for a read or a call whose body never started, `ambiguous_outcome`
/// for a non-read call whose body had started (it may have taken effect).
struct InProgress<'a> {
    /// Borrowed, as the tool's name: the call's future holds the run's context throughout.
    ctx: &'a RunContext,
    call_id: u64,
    tool: &'a Arc<str>,
    effect: Effect,
    parent: Option<u64>,
    speculation: Option<Arc<Speculation>>,
    args_sha256: DraftDigest,
    /// Its tool redacts values of its results: the receipt's digest of one is keyed.
    redacts_result: bool,
    started: std::time::Duration,
    /// Attempts of the body made so far.
    attempts: u32,
    /// Whether the last attempt's body answered at its first poll (`None` before a body ran).
    answered_at_once: Option<bool>,
    /// Its tool's pace, which the call's outcome updates.
    pace: &'a crate::tool::Pace,
    /// How far the call got.
    stage: Stage,
    /// The call's entry in the effect log, for a non-read call whose body started.
    effect_index: Option<usize>,
    /// The breaker's admission, to record the outcome against.
    admission: Option<Admission>,
    /// For a call nested in a speculative composite: its place in the composite's record.
    nested_index: Option<usize>,
    /// The age of the cached entry that answered the call, in milliseconds.
    cached_age_ms: Option<f64>,
    /// The call of a cached read that missed: where its result is left.
    lookup: Option<cache::Lookup>,
    /// What the call, an invalidating one whose body started, drops when it completes.
    drops: Vec<crate::store::CacheDrop>,
    /// The fixture sandbox refused it: its receipt's status is `blocked`.
    blocked: bool,
    /// A plan recorded it: its receipt's status is `planned`.
    planned: bool,
    finished: bool,
}

/// How far a call got through the steps: what its breaker learns from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Refused before the breaker admitted it: the breaker learns nothing and is not touched.
    Refused,
    /// Admitted, then stopped before its body (invalid input, or the deadline while it waited
    /// for a slot): an admission with nothing learned.
    Admitted,
    /// Its body was entered: a non-read call may have taken effect from here on.
    Running,
}

impl<'a> InProgress<'a> {
    /// Opens the call. The receipt names the tool by its own name (the registry's).
    fn start(
        ctx: &'a RunContext,
        tool: &'a RegisteredTool,
        call: &Call,
        now: Instant,
    ) -> InProgress<'a> {
        ctx.call_opened();
        InProgress {
            ctx,
            call_id: ctx.next_call_id(),
            tool: &tool.name,
            effect: tool.spec.effect,
            parent: call.caller.parent(),
            speculation: call.caller.speculation().cloned(),
            args_sha256: if tool.redacts(Side::Args) || ctx.masks().holds_text(&call.args_key) {
                Hex::from(ctx.keyed_digest(&call.args_key)).into()
            } else {
                jcs_value_digest_keyed(&call.args, &call.args_key)
            },
            redacts_result: tool.redacts(Side::Result),
            started: ctx.elapsed_at(now),
            attempts: 0,
            answered_at_once: None,
            pace: &tool.pace,
            stage: Stage::Refused,
            effect_index: None,
            admission: None,
            nested_index: None,
            cached_age_ms: None,
            lookup: None,
            drops: Vec::new(),
            blocked: false,
            planned: false,
            finished: false,
        }
    }

    /// Steps 10 and 11 for a call that ran to its end; its receipt shares `outcome` when
    /// `share`.
    fn finish(mut self, outcome: &Outcome, share: bool) {
        let result = &**outcome;
        let health = match self.stage {
            Stage::Refused => None,
            Stage::Admitted => Some(Health::Unknown),
            Stage::Running => Some(Health::of(result)),
        };
        // A nested call refused by a limit only speculation has: the composite's outcome is
        // not the one a sequential run would see. (A nested call dropped by its composite is
        // not: the sequential composite drops it the same way.)
        let refused = matches!(result, Err(e) if e.kind.is_speculation_refusal());
        if let (Some(speculation), Some(_), true) = (&self.speculation, self.parent, refused) {
            speculation.shaped.store(true, Ordering::SeqCst);
        }
        self.settle(result, health, share.then_some(outcome));
    }

    fn settle(
        &mut self,
        result: &Result<Value, ToolError>,
        health: Option<Health>,
        shared: Option<&Outcome>,
    ) {
        self.finished = true;
        if let Some(i) = self.effect_index {
            self.ctx.set_effect_outcome(i, effect_ok(result));
        }
        let now = Instant::now();
        // 10. Record the outcome in the breaker; a speculative call leaves it to the claim.
        if let (Some(admission), Some(health)) = (self.admission, health) {
            self.ctx.breakers.record(self.tool, admission, health, now);
        }
        if let Some(speculation) = &self.speculation {
            match self.nested_index {
                Some(i) => lock(&speculation.nested)[i].1 = health,
                None if self.parent.is_none() => *lock(&speculation.health) = health,
                None => {}
            }
        }
        let duration = self.ctx.elapsed_at(now) - self.started;
        if let Some(at_once) = self.answered_at_once {
            self.pace
                .note(at_once && duration < crate::tool::Pace::QUICK);
        }
        tracing::debug!(tool = %self.tool, call_id = self.call_id, ok = result.is_ok(), "tool call finished");
        // 11. Write the receipt.
        self.ctx.receipts.append(receipt::Draft {
            call_id: self.call_id,
            parent: self.parent,
            tool: Arc::clone(self.tool),
            effect: self.effect,
            speculative: self.speculation.is_some(),
            claimed: self.speculation.as_ref().map(|s| Arc::clone(&s.claimed)),
            args_sha256: std::mem::replace(&mut self.args_sha256, DraftDigest::Sha256([0; 32])),
            result_sha256: result.as_ref().ok().map(|value| {
                if self.redacts_result || self.ctx.masks().holds(value) {
                    Hex::from(self.ctx.keyed_digest(&key_json(value))).into()
                } else if let Some(outcome) = shared {
                    DraftDigest::OfValue(Arc::clone(outcome) as Arc<dyn LaterValue>)
                } else {
                    jcs_value_digest(value)
                }
            }),
            error_kind: result.as_ref().err().map(|e| e.kind_name().to_string()),
            started_ms: self.started.as_secs_f64() * 1e3,
            duration_ms: duration.as_secs_f64() * 1e3,
            attempt: self.attempts,
            cached_age_ms: self.cached_age_ms,
            blocked: self.blocked,
            planned: self.planned,
        });
        self.ctx.call_closed();
    }
}

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let error = if self.stage == Stage::Running && self.effect != Effect::Read {
            ambiguous(
                self.tool,
                "its call was abandoned while the tool was running",
            )
        } else {
            ToolError::new(
                ErrorKind::Cancelled,
                "the call was abandoned before it finished",
            )
        };
        let health = (self.stage != Stage::Refused).then_some(Health::Unknown);
        self.settle(&Err(error), health, None);
        cache::invalidate_abandoned(self.ctx, std::mem::take(&mut self.drops));
    }
}

/// A call's outcome, its result digested when its receipt is made (see [`dispatch_shared`]).
impl LaterValue for Result<Value, ToolError> {
    fn later_value(&self) -> Option<&Value> {
        self.as_ref().ok()
    }
}

/// What the effect log says of a non-read call's outcome: `None` when nobody knows whether it
/// took effect.
pub(crate) fn effect_ok(result: &Result<Value, ToolError>) -> Option<bool> {
    match result {
        Err(e) if e.kind == ErrorKind::AmbiguousOutcome => None,
        other => Some(other.is_ok()),
    }
}

/// The error of a non-read call whose outcome is unknown.
fn ambiguous(tool: &str, why: &str) -> ToolError {
    ToolError::new(
        ErrorKind::AmbiguousOutcome,
        format!("`{tool}` may or may not have taken effect: {why}"),
    )
    .with_recoverable(false)
}

/// Step 2's second half: the guard decides. `Ask` pauses the script's own call, in a run that
/// can pause (it has a journal), unless a person approved that call or the rule; every other
/// call a rule asks about is refused, closed (the scout's with a refusal the executor answers
/// by making the call itself, unless a person approved the rule).
fn authorize(ctx: &RunContext, spec: &crate::tool::ToolSpec, call: &Call) -> Result<(), ToolError> {
    let guard = ctx.registry.guard();
    if !guard.is_active() {
        return Ok(());
    }
    let denied = |rule: &str, reason: &str, next: &str| {
        ToolError::new(
            ErrorKind::PermissionDenied,
            format!("the guard denies `{}`: {rule}: {reason}", spec.name),
        )
        .with_next_action(next)
    };
    let (rule, reason) = match guard.authorize(&spec.name, spec.effect, &spec.guard, &call.args) {
        Decision::Allow | Decision::Pass => return Ok(()),
        Decision::Deny { rule, reason } => {
            return Err(denied(
                &rule,
                &reason,
                "do without this call, or ask the person who runs toolscript to change the guard's rules",
            ))
        }
        Decision::Ask { rule, reason } => (rule, reason),
    };
    let journal = ctx.journal.as_ref();
    match &call.caller {
        Caller::Scout(_) if journal.is_some_and(|j| j.rule_approved(&rule)) => Ok(()),
        Caller::Scout(_) => Err(ToolError::new(
            ErrorKind::Cancelled,
            format!(
                "the guard asks a person about `{}` ({rule}): the script's own call decides",
                spec.name
            ),
        )),
        Caller::Composite { .. } => Err(denied(
            &rule,
            &format!(
                "{reason} (a person would decide, and a composite's nested call cannot pause)"
            ),
            "call the tool from the script itself, where the run can pause for a person",
        )),
        // Applying a plan approves the calls it planned.
        Caller::Script if call.planned => Ok(()),
        Caller::Script => {
            // A plan marks the non-read call a run would ask about (and makes none).
            let planning = spec.effect != Effect::Read && ctx.planning().is_some();
            if !planning && approved_for(ctx, spec, call, &rule, &reason, &denied)? {
                return Ok(());
            }
            ctx.note_asked(rule.clone(), reason.clone());
            Err(ToolError::new(
                ErrorKind::Paused,
                format!(
                    "the guard asks a person about `{}`: {rule}: {reason}",
                    spec.name
                ),
            ))
        }
    }
}

/// Whether a person approved the script's call that the guard's `rule` asks about: the rule
/// in this run, or this very call. A run without a journal cannot pause: the call is denied.
fn approved_for(
    ctx: &RunContext,
    spec: &crate::tool::ToolSpec,
    call: &Call,
    rule: &str,
    reason: &str,
    denied: &dyn Fn(&str, &str, &str) -> ToolError,
) -> Result<bool, ToolError> {
    let Some(journal) = ctx.journal.as_ref() else {
        return Err(denied(
            rule,
            &format!("{reason} (a person would decide, and a run without a store cannot pause)"),
            "run with a store (--store) so that the run can pause for a person",
        ));
    };
    Ok(journal.rule_approved(rule)
        || match (call.seq, call.read_at) {
            (Some(seq), _) => journal.approved(seq),
            (None, Some(at)) => {
                let redacts = ctx.registry.tool_redacts(&spec.name, Some(Side::Args));
                let args = journal.args_form(ctx.masks(), &call.args_key, redacts);
                journal.read_approved(at.epoch, &spec.name, &args, at.occurrence)
            }
            // Every call of the script is one or the other; one that is neither is denied,
            // closed.
            (None, None) => {
                return Err(denied(
                    rule,
                    &format!("{reason} (a person would decide, and this call cannot pause)"),
                    "ask the person who runs toolscript for a rule that allows this call",
                ))
            }
        })
}

/// Dispatches one call through the steps.
pub(crate) async fn dispatch(ctx: &Arc<RunContext>, call: Call) -> Result<Value, ToolError> {
    let outcome = dispatch_as(ctx, call, false).await;
    // Shared with no one: the receipt took the digest of the result when the call ended.
    Arc::try_unwrap(outcome).unwrap_or_else(|shared| (*shared).clone())
}

/// [`dispatch`], for a caller that shares the outcome (the executor, the scout): the call's
/// receipt shares it too, and the digest of its result is taken when the receipt is made (for
/// most runs by the receipts hasher, on another core).
pub(crate) async fn dispatch_shared(ctx: &Arc<RunContext>, call: Call) -> Outcome {
    dispatch_as(ctx, call, true).await
}

/// Dispatches one call through the steps; the receipt shares its outcome when `share`.
async fn dispatch_as(ctx: &Arc<RunContext>, call: Call, share: bool) -> Outcome {
    ctx.count_dispatch();
    // A run whose receipts can no longer be written makes no further call.
    if let Some(why) = ctx.receipts_failure() {
        return Arc::new(Err(receipts_failed(&why)));
    }
    // 1. Resolve the tool.
    let Some(tool) = ctx.registry.get(&call.tool) else {
        return Arc::new(Err(ctx.registry.unknown_tool(&call.tool)));
    };
    let mut call = call;
    // The values its redaction paths name are masked from the moment the call is seen.
    if !tool.redact.is_empty() {
        tool.mask_redacted(Side::Args, &call.args, &ctx.mask);
    }
    // The call's start: its receipt's, and the budget's and the breaker's moment.
    let now = Instant::now();
    let mut flight = InProgress::start(ctx, tool, &call, now);
    let span = tracing::debug_span!(
        "tool_call",
        tool = %tool.spec.name,
        call_id = flight.call_id,
        speculative = flight.speculation.is_some()
    );
    // Pinned where they are made, so that the call's future holds them once. A span no
    // subscriber wants would only be entered and left at every poll.
    let result = if span.is_disabled() {
        std::pin::pin!(steps(ctx, tool, &mut call, &mut flight, now)).await
    } else {
        std::pin::pin!(steps(ctx, tool, &mut call, &mut flight, now).instrument(span)).await
    }
    .map_err(|e| e.for_tool(&tool.spec.name));
    // A plan keeps the script's non-read calls the dispatch path refused, as refused.
    if let (Some(planning), Some(seq), Err(e)) = (ctx.planning(), call.seq, &result) {
        if !planning.has(seq) {
            let (shown, _) = shown_args(ctx, tool, &call);
            planning.refuse(seen(&tool.spec, seq, shown), e);
        }
    }
    if let (false, Ok(value)) = (tool.redact.is_empty(), &result) {
        tool.mask_redacted(Side::Result, value, &ctx.mask);
    }
    let (lookup, drops) = (flight.lookup.take(), std::mem::take(&mut flight.drops));
    let outcome = Arc::new(result);
    flight.finish(&outcome, share);
    match (lookup, &*outcome) {
        (Some(lookup), Ok(value)) => cache::remember(ctx, &tool.spec, lookup, value),
        _ => cache::invalidate(ctx, drops).await,
    }
    outcome
}

/// Steps 2 to 9, from the call's start `now`. The body's last attempt is given the call's
/// arguments themselves.
async fn steps(
    ctx: &Arc<RunContext>,
    tool: &RegisteredTool,
    call: &mut Call,
    flight: &mut InProgress<'_>,
    now: Instant,
) -> Result<Value, ToolError> {
    let spec = &tool.spec;
    let speculation = call.caller.speculation().cloned();
    // 2. The caller may call it: a composite only its declared nested tools.
    if let Caller::Composite { allowed, .. } = &call.caller {
        if !allowed.contains(&spec.name) {
            return Err(ToolError::new(
                ErrorKind::PermissionDenied,
                format!(
                    "this composite did not declare `{}` among its nested tools",
                    spec.name
                ),
            ));
        }
    }
    // 2. Authorize: the guard's policies, then its default. Then the fixture sandbox: a
    // non-read call goes no further (and no person is asked about a call never to be made).
    let blocked = ctx.sandbox.refuse(spec);
    let planning = ctx.planning().filter(|_| spec.effect != Effect::Read);
    if planning.is_some() && !matches!(call.caller, Caller::Script) {
        return Err(ToolError::new(
            ErrorKind::SideEffectBlocked,
            format!(
                "a plan makes no non-read call: `{}`, called inside a composite, is not planned on its own",
                spec.name
            ),
        )
        .with_recoverable(false));
    }
    // What a run would ask a person before making the call, which applying the plan answers.
    let mut asks = None;
    match authorize(ctx, spec, call) {
        Err(e) if e.kind == ErrorKind::Paused && blocked.is_some() => {
            ctx.take_asked();
        }
        Err(e) if e.kind == ErrorKind::Paused && planning.is_some() => {
            asks = ctx
                .take_asked()
                .map(|(rule, reason)| format!("the guard asks ({rule}: {reason})"));
        }
        other => other?,
    }
    if let Some(blocked) = blocked {
        flight.blocked = true;
        return Err(blocked);
    }
    // 3. Repeat guard.
    ctx.repeat.check(spec, &call.args_key)?;
    // 4. Approval gate: the script's call waits for a person, unless one approved it.
    if spec.approval == Approval::Always && matches!(call.caller, Caller::Script) {
        let approved = call.planned
            || call
                .seq
                .is_some_and(|seq| ctx.journal.as_ref().is_some_and(|j| j.approved(seq)));
        if planning.is_some() {
            asks.get_or_insert_with(|| "the tool needs a person's approval".into());
        } else if !approved {
            return Err(ToolError::new(
                ErrorKind::Paused,
                format!("`{}` waits for a person's approval", spec.name),
            ));
        }
    }
    // 5. Charge the budget; the guard frees the in-flight slot when the call ends. A
    // speculative call is charged when it is claimed.
    let _in_flight = match speculation {
        None => ctx.budget.charge(now)?,
        Some(_) => ctx.budget.charge_speculative(now)?,
    };
    // A plan records the call and answers it with the tool's `plan_result`: held to the
    // tool's input schema first, and seen by the repeat guard, as the call would be.
    if let Some(planning) = planning {
        schema::check_input(tool, &call.args)?;
        ctx.repeat.record(spec, &call.args_key);
        flight.planned = true;
        let (shown, masked) = shown_args(ctx, tool, call);
        let seen = seen(spec, call.seq.unwrap_or_default(), shown);
        return planning.plan(seen, &call.args, &call.args_key, masked, asks);
    }
    let _nested_flight = match (&call.caller, &speculation) {
        (Caller::Composite { .. }, Some(speculation)) => Some(NestedFlight::enter(speculation)),
        _ => None,
    };
    if let (Caller::Composite { .. }, Some(speculation)) = (&call.caller, &speculation) {
        let mut nested = lock(&speculation.nested);
        flight.nested_index = Some(nested.len());
        nested.push((spec.name.clone(), None));
    }
    // 5. A read the run's fixtures answer: recorded, it reaches neither breaker nor body.
    if let (Some(fixtures), Some(occurrence)) = (&ctx.fixtures, call.fixture) {
        if let Some(speculation) = &speculation {
            speculation.answered.store(true, Ordering::SeqCst);
        }
        // A hand-edited answer is held to the tool's output schema, as the tool's would be.
        return fixtures
            .answer(&spec.name, &call.args_key, occurrence)
            .and_then(|value| checked_output(ctx, tool, value));
    }
    // The call's start, for as long as it has not waited for anything: its body's timer then
    // starts there (what lies between is the dispatch path's own work), without reading the
    // clock again.
    let mut unwaited = Some(now);
    // The cache: a hit answers the call, charged as a call, before the breaker.
    if let Some(lookup) = cache::lookup_of(ctx, spec, call) {
        unwaited = None;
        // Boxed, as the other steps that only some runs take: the call's future stays small.
        if let Some(hit) = Box::pin(cache::find(ctx, &lookup)).await {
            flight.cached_age_ms = Some(hit.age_ms);
            match &speculation {
                None => ctx.cache.iter().for_each(|c| c.count_hits(1)),
                Some(speculation) => {
                    speculation.hits.fetch_add(1, Ordering::SeqCst);
                    if matches!(call.caller, Caller::Scout(_)) {
                        speculation.cached.store(true, Ordering::SeqCst);
                    }
                }
            }
            return Ok(hit.value);
        }
        flight.lookup = Some(lookup);
    }
    // 6. The breaker admits or fails fast. A speculative call only checks it: the executor's
    // claim admits and records, as its own call would.
    match speculation {
        None => flight.admission = Some(ctx.breakers.admit(&spec.name, now)?),
        Some(_) => ctx.breakers.check(&spec.name, now)?,
    }
    flight.stage = Stage::Admitted;
    // 7. Validate the input.
    schema::check_input(tool, &call.args)?;
    // 8. Wait for a slot of the tool (or of the resource it shares: an MCP server, the script
    // threads) within the run's deadline but outside the call's timeout, which measures the
    // tool's own work; then run the body under its timeout, catching panics, retrying where
    // the policy allows.
    // Pinned where it is made: moved into `select!` or awaited, it would be kept twice.
    let mut work = std::pin::pin!(async {
        // A free slot is taken at once; only a wait for one needs the deadline's timer. The
        // executor's calls go first: a speculative call never keeps one waiting for a slot.
        let speculative = speculation.is_some();
        let slot = match tool.slots.try_take(speculative) {
            Some(slot) => slot,
            None => {
                unwaited = None;
                if let (Caller::Composite { .. }, Some(speculation)) = (&call.caller, &speculation)
                {
                    speculation.waited.store(true, Ordering::SeqCst);
                }
                let slot = Box::pin(tokio::time::timeout(
                    ctx.budget.remaining(Instant::now()),
                    tool.slots.take(speculative),
                ));
                let Ok(slot) = slot.await else {
                    return Err(ctx.budget.past_deadline());
                };
                slot
            }
        };
        // Held until the call ends, or until its body gives it back.
        let slot = Held::new(slot, tool.body.takes_context());
        // The intent of a script's non-read call is committed before its body is reached: a
        // crash from here on leaves the call ambiguous, never forgotten.
        if let (Some(journal), Some(seq)) = (ctx.journal.as_ref(), call.seq) {
            unwaited = None;
            let args = journal.args_form(ctx.masks(), &call.args_key, tool.redacts(Side::Args));
            if let Err(why) = Box::pin(journal.intent(seq, &spec.name, &args)).await {
                return Err(ToolError::internal(format!(
                    "the run's journal could not be written ({why}); the call was not made"
                ))
                .with_recoverable(false));
            }
        }
        ctx.repeat.record(spec, &call.args_key);
        if spec.effect != Effect::Read {
            flight.effect_index = Some(if tool.redacts(Side::Args) {
                let mut args = call.args.clone();
                tool.redact_args(&mut args);
                ctx.log_effect(spec, &args)
            } else {
                ctx.log_effect(spec, &call.args)
            });
            flight.drops = cache::drops_of(ctx, spec, &call.args);
        }
        flight.stage = Stage::Running;
        run_body(ctx, tool, call, flight, &slot, unwaited).await
    });
    let result = match speculation {
        // A speculative call ends early when the run no longer needs it.
        Some(_) => {
            tokio::select! {
                result = &mut work => result,
                () = ctx.speculation.cancelled() => Err(ToolError::new(
                    ErrorKind::Cancelled,
                    "the run ended before this speculative read was needed",
                )),
            }
        }
        None => work.await,
    };
    // 9. Validate the output.
    result.and_then(|value| checked_output(ctx, tool, value))
}

/// The call `seq` of `spec`'s tool, as a plan records it.
fn seen(spec: &crate::tool::ToolSpec, seq: u64, shown: Value) -> crate::plan::Seen<'_> {
    crate::plan::Seen {
        tool: &spec.name,
        effect: spec.effect,
        settings: &spec.plan,
        seq,
        shown,
    }
}

/// A call's arguments as a person may read them (in a plan): the values its tool redacts and
/// every secret masked; and whether anything was.
fn shown_args(ctx: &RunContext, tool: &RegisteredTool, call: &Call) -> (Value, bool) {
    let mut shown = call.args.clone();
    let redacts = tool.redacts(Side::Args);
    if redacts {
        tool.redact_args(&mut shown);
    }
    let masked = ctx.masks().value(&mut shown);
    (shown, redacts || masked)
}

/// Step 9: the output, held to the tool's output schema. The values its redaction paths name
/// are masked first, so that an invalid output's error cannot quote one.
fn checked_output(
    ctx: &RunContext,
    tool: &RegisteredTool,
    value: Value,
) -> Result<Value, ToolError> {
    if !tool.redact.is_empty() {
        tool.mask_redacted(Side::Result, &value, &ctx.mask);
    }
    schema::check_output(tool, &value).map(|()| value)
}

/// The slot of a tool a call holds until it ends: shared with its body's context when the
/// body takes one, which may give it back sooner.
enum Held {
    /// Held for its drop, which gives the slot back.
    Own(#[allow(dead_code)] tokio::sync::OwnedSemaphorePermit),
    Shared(Arc<std::sync::Mutex<Option<tokio::sync::OwnedSemaphorePermit>>>),
}

impl Held {
    fn new(slot: tokio::sync::OwnedSemaphorePermit, shared: bool) -> Held {
        if shared {
            Held::Shared(Arc::new(std::sync::Mutex::new(Some(slot))))
        } else {
            Held::Own(slot)
        }
    }

    /// The slot, for the body's context. A body that takes no context is given none, so
    /// this is only asked of a shared one; an own one gives an empty handle.
    fn shared(&self) -> Arc<std::sync::Mutex<Option<tokio::sync::OwnedSemaphorePermit>>> {
        match self {
            Held::Shared(slot) => Arc::clone(slot),
            Held::Own(_) => Arc::default(),
        }
    }
}

/// Step 8: attempts of the body, each under the tool's timeout and within the run's wall clock.
/// A non-read call whose last attempt did not answer in time has an unknown outcome.
async fn run_body(
    ctx: &Arc<RunContext>,
    tool: &RegisteredTool,
    call: &mut Call,
    flight: &mut InProgress<'_>,
    slot: &Held,
    unwaited: Option<Instant>,
) -> Result<Value, ToolError> {
    let spec = &tool.spec;
    // A composite's call is a node of the cancellation tree of its own, cancelled when the
    // call ends or is dropped: the parent of its nested calls'. Other calls share their
    // caller's node.
    let parent = call.caller.cancellation(ctx);
    let own = spec.is_composite().then(|| Arc::new(parent.child_token()));
    let _cancel_on_drop = own.as_deref().cloned().map(CancellationToken::drop_guard);
    let nested = own.clone().map(|own| {
        nested::NestedCalls::handle(
            ctx,
            spec,
            flight.call_id,
            call.caller.speculation(),
            call.idempotency_key.as_deref(),
            own,
        )
    });
    let cancel = own.as_ref().unwrap_or(parent);
    let policy = RetryPolicy::of(spec);
    loop {
        flight.attempts += 1;
        let started = match unwaited {
            Some(start) if flight.attempts == 1 => start,
            _ => Instant::now(),
        };
        let limit = spec.timeout.min(ctx.budget.remaining(started));
        // The last attempt there can be takes the arguments; one that may be retried, a copy.
        let args = if policy.is_last(flight.attempts) {
            std::mem::take(&mut call.args)
        } else {
            call.args.clone()
        };
        // Made only for a body that takes it.
        let (call_id, attempt, key) = (flight.call_id, flight.attempts, &call.idempotency_key);
        let context = || {
            ToolContext::new(
                &spec.name,
                call_id,
                attempt,
                key.clone(),
                ctx.context.clone(),
                nested.clone(),
                Some(Arc::clone(ctx.registry.secrets())),
                slot.shared(),
                cancel.clone(),
            )
            .with_fencing(ctx.fencing())
            .with_deadline(started + limit)
        };
        let body = AssertUnwindSafe(async { tool.body.call(args, context).await }).catch_unwind();
        let mut body = std::pin::pin!(body);
        // A body that answers at its first poll (a native tool) needs no timer: the timer
        // starts with the body all the same, and fires only at a poll that waits.
        let first = std::future::poll_fn(|cx| Poll::Ready(body.as_mut().poll(cx))).await;
        flight.answered_at_once = Some(first.is_ready());
        let answer = match first {
            Poll::Ready(answer) => Ok(answer),
            // Boxed, as every wait only some calls have: the call's future stays small.
            Poll::Pending => Box::pin(tokio::time::timeout_at(started + limit, body)).await,
        };
        let result = match answer {
            Ok(Ok(result)) => result,
            Ok(Err(panic)) => Err(ToolError::internal(format!(
                "the tool panicked: {}",
                panic_message(panic.as_ref())
            ))),
            Err(_) if spec.effect != Effect::Read => Err(ambiguous(
                &spec.name,
                &format!("it did not answer within {} ms", limit.as_millis()),
            )),
            Err(_) if limit < spec.timeout => Err(ctx.budget.past_deadline()),
            Err(_) => Err(ToolError::new(
                ErrorKind::Timeout,
                format!("no answer within {} ms", spec.timeout.as_millis()),
            )),
        };
        let Err(error) = &result else {
            return result;
        };
        match policy.retry_after(flight.attempts, error) {
            Some(pause) if pause < ctx.budget.remaining(Instant::now()) => {
                // The error's kind alone: its words may quote the call's values.
                tracing::debug!(tool = %spec.name, attempt = flight.attempts, kind = error.kind_name(), "retrying");
                Box::pin(tokio::time::sleep(pause)).await;
            }
            _ => return result,
        }
    }
}

/// The error of every call a run tries after its receipts file failed.
pub(crate) fn receipts_failed(why: &str) -> ToolError {
    ToolError::internal(format!(
        "the run's receipts could not be written ({why}); it makes no further call"
    ))
    .with_recoverable(false)
}

/// The message of a caught panic.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
    }
}

#[cfg(test)]
mod tests;
