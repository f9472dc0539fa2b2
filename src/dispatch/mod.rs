//! The one dispatch path. Every call — top-level, nested inside a composite, or speculative —
//! goes through [`dispatch`], which reads top to bottom as the ten steps of DESIGN.md section 5.
//!
//! # Order
//!
//! 1. resolve the tool;
//! 2. check the caller may call it;
//! 3. repeat guard;
//! 4. charge the budget;
//! 5. breaker admits;
//! 6. validate input;
//! 7. run the body under its timeout, catching panics, retrying;
//! 8. validate output;
//! 9. record the outcome in the breaker;
//! 10. write the receipt.
//!
//! Steps 2–9 can refuse a call; every call that resolved to a tool gets a receipt.

mod breaker;
mod budget;
mod receipt;
mod repeat;
mod schema;

pub use breaker::BreakerConfig;
pub use budget::Budget;
pub use receipt::{verify_receipts, write_receipts, Receipt, Status, RECEIPT_VERSION};

pub(crate) use breaker::Breakers;
pub(crate) use budget::BudgetMeter;
pub(crate) use receipt::ReceiptLog;
pub(crate) use repeat::RepeatGuard;
pub(crate) use schema::check_input;

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;
use tracing::Instrument;

use crate::error::{ErrorKind, ToolError};
use crate::json::{canonical, sha256_hex};
use crate::tool::{Effect, RegisteredTool, Registry, ToolContext};
use breaker::Health;

/// A non-read call that reached its tool's body, in the order the bodies started. A composite's
/// own entry comes before the entries of the calls nested in it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct EffectRecord {
    /// The tool called.
    pub tool: String,
    /// Its effect (never `read`).
    pub effect: Effect,
    /// The validated arguments.
    pub args: Value,
    /// Whether the call succeeded.
    pub ok: bool,
}

/// Counters a caller can watch while a run is going (the CLI's live line).
#[derive(Debug, Default)]
pub struct Progress {
    done: AtomicU64,
    in_flight: AtomicU64,
}

impl Progress {
    /// Calls finished so far.
    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Calls running now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }
}

/// Everything one run shares between its calls: the registry, the runtime's breakers, and the
/// run's own budget, repeat guard, receipts and effect log.
pub(crate) struct RunContext {
    pub(crate) registry: Arc<Registry>,
    breakers: Arc<Breakers>,
    budget: BudgetMeter,
    repeat: RepeatGuard,
    receipts: ReceiptLog,
    effects: Mutex<Vec<EffectRecord>>,
    started: Instant,
    next_call_id: AtomicU64,
    dispatched: AtomicU64,
    pub(crate) progress: Arc<Progress>,
    /// Set when the run ends: speculative calls still running are cancelled.
    cancel: tokio::sync::watch::Sender<bool>,
}

impl RunContext {
    pub(crate) fn new(
        registry: Arc<Registry>,
        breakers: Arc<Breakers>,
        budget: Budget,
        run_id: String,
        progress: Arc<Progress>,
    ) -> RunContext {
        let started = Instant::now();
        RunContext {
            registry,
            breakers,
            budget: BudgetMeter::new(budget, started),
            repeat: RepeatGuard::default(),
            receipts: ReceiptLog::new(run_id),
            effects: Mutex::default(),
            started,
            next_call_id: AtomicU64::new(1),
            dispatched: AtomicU64::new(0),
            progress,
            cancel: tokio::sync::watch::channel(false).0,
        }
    }

    /// Cancels the speculative calls still running (the run no longer needs them).
    pub(crate) fn cancel_speculation(&self) {
        self.cancel.send_replace(true);
    }

    /// The executor claims a speculative outcome: the steps a sequential dispatch of the same
    /// call would take at this point — budget, breaker admission, breaker record — so that
    /// speculation never changes where a budget runs out or a breaker opens.
    pub(crate) fn claim(
        &self,
        tool: &str,
        outcome: &Result<Value, ToolError>,
        nested_calls: u64,
    ) -> Result<(), ToolError> {
        let now = Instant::now();
        // A composite's nested calls are charged with it, as in a sequential run.
        for _ in 0..=nested_calls {
            self.budget.charge_claim(now)?;
        }
        let admission = self.breakers.admit(tool, now)?;
        self.breakers
            .record(tool, admission, Health::of(outcome), now);
        Ok(())
    }

    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Calls that entered the dispatch path.
    pub(crate) fn dispatched(&self) -> u64 {
        self.dispatched.load(Ordering::Relaxed)
    }

    pub(crate) fn take_receipts(&self) -> Vec<Receipt> {
        self.receipts.take()
    }

    pub(crate) fn take_effects(&self) -> Vec<EffectRecord> {
        std::mem::take(&mut *self.effects.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// One call to dispatch.
#[derive(Debug)]
pub(crate) struct Call {
    pub(crate) tool: String,
    pub(crate) args: Value,
    /// Canonical JSON of `args`: the call's identity for the read table, the repeat guard and
    /// the receipt, computed once.
    pub(crate) args_key: String,
    /// The composite call this one is nested in, and the tools that composite declared.
    pub(crate) parent: Option<(u64, Arc<[String]>)>,
    /// Started by the scout.
    pub(crate) speculative: bool,
    /// For a speculative call: set when the executor claims its outcome (for the receipt).
    pub(crate) claimed: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// For a speculative composite: counts its nested calls.
    pub(crate) nested_made: Option<Arc<AtomicU64>>,
}

impl Call {
    /// A call made by the script itself.
    pub(crate) fn top_level(tool: impl Into<String>, args: Value) -> Call {
        Call {
            tool: tool.into(),
            args_key: canonical(&args),
            args,
            parent: None,
            speculative: false,
            claimed: None,
            nested_made: None,
        }
    }

    /// A read started by the scout; `args_key` is the canonical JSON of `args`.
    pub(crate) fn speculative(
        tool: impl Into<String>,
        args: Value,
        args_key: String,
        claimed: Arc<std::sync::atomic::AtomicBool>,
        nested_made: Arc<AtomicU64>,
    ) -> Call {
        Call {
            tool: tool.into(),
            args,
            args_key,
            parent: None,
            speculative: true,
            claimed: Some(claimed),
            nested_made: Some(nested_made),
        }
    }
}

/// The handle a composite's body calls its nested tools through.
#[derive(Clone)]
pub(crate) struct NestedCalls {
    ctx: Arc<RunContext>,
    parent: u64,
    allowed: Arc<[String]>,
    speculative: bool,
    /// A speculative composite's claim flag: its nested calls are claimed with it.
    claimed: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Nested calls made so far, for the budget charged when a speculative composite is claimed.
    made: Arc<AtomicU64>,
}

impl NestedCalls {
    pub(crate) fn registry(&self) -> &Registry {
        &self.ctx.registry
    }

    pub(crate) async fn call(&self, tool: &str, args: Value) -> Result<Value, ToolError> {
        self.made.fetch_add(1, Ordering::Relaxed);
        let call = Call {
            tool: tool.to_string(),
            args_key: canonical(&args),
            args,
            parent: Some((self.parent, Arc::clone(&self.allowed))),
            speculative: self.speculative,
            claimed: self.claimed.clone(),
            nested_made: None,
        };
        dispatch(&self.ctx, call).await.map_err(|e| {
            let message = match &e.tool {
                Some(nested) => format!("nested call `{nested}` failed: {}", e.message),
                None => e.message.clone(),
            };
            ToolError {
                message,
                tool: None,
                ..e
            }
        })
    }
}

/// Dispatches one call through the ten steps.
pub(crate) async fn dispatch(ctx: &Arc<RunContext>, call: Call) -> Result<Value, ToolError> {
    ctx.dispatched.fetch_add(1, Ordering::Relaxed);
    // 1. Resolve the tool.
    let Some(tool) = ctx.registry.get(&call.tool).cloned() else {
        let mut message = format!("there is no tool named `{}`", call.tool);
        let mut error = ToolError::new(ErrorKind::UnknownTool, String::new());
        if let Some(near) = ctx.registry.suggest(&call.tool) {
            message.push_str(&format!("; did you mean `{near}`?"));
            error = error.with_next_action(format!("call `{near}` instead"));
        }
        error.message = message;
        return Err(error.for_tool(&call.tool));
    };
    let call_id = ctx.next_call_id.fetch_add(1, Ordering::Relaxed);
    let args_key = call.args_key.as_str();
    let started = ctx.elapsed();
    let span = tracing::debug_span!(
        "tool_call",
        tool = %tool.spec.name,
        call_id,
        speculative = call.speculative
    );
    ctx.progress.in_flight.fetch_add(1, Ordering::Relaxed);
    let mut attempts = 0;
    let result = steps(ctx, &tool, &call, call_id, args_key, &mut attempts)
        .instrument(span)
        .await;
    ctx.progress.in_flight.fetch_sub(1, Ordering::Relaxed);
    ctx.progress.done.fetch_add(1, Ordering::Relaxed);

    // 10. Write the receipt.
    ctx.receipts.append(receipt::Draft {
        call_id,
        parent: call.parent.as_ref().map(|(id, _)| *id),
        tool: tool.spec.name.clone(),
        effect: tool.spec.effect,
        speculative: call.speculative,
        claimed: call.claimed.clone(),
        args_sha256: sha256_hex(args_key),
        result_sha256: result.as_ref().ok().map(|v| sha256_hex(&canonical(v))),
        error_kind: result.as_ref().err().map(|e| e.kind.to_string()),
        started_ms: started.as_secs_f64() * 1e3,
        duration_ms: (ctx.elapsed() - started).as_secs_f64() * 1e3,
        attempt: attempts,
    });
    tracing::debug!(tool = %tool.spec.name, call_id, ok = result.is_ok(), "tool call finished");
    result.map_err(|e| e.for_tool(&tool.spec.name))
}

/// Steps 2 to 9.
async fn steps(
    ctx: &Arc<RunContext>,
    tool: &RegisteredTool,
    call: &Call,
    call_id: u64,
    args_key: &str,
    attempts: &mut u32,
) -> Result<Value, ToolError> {
    let spec = &tool.spec;
    // 2. The caller may call it: a composite only its declared nested tools.
    if let Some((_, allowed)) = &call.parent {
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
    // 3. Repeat guard.
    ctx.repeat.check(spec, args_key)?;
    // 4. Charge the budget; the guard frees the in-flight slot when the call ends.
    let _in_flight = ctx.budget.charge(call.speculative, Instant::now())?;
    // 5. The breaker admits or fails fast. A speculative read only checks it: the executor's
    // claim admits and records, as its own call would.
    let admission = if call.speculative {
        ctx.breakers.check(&spec.name, Instant::now())?;
        None
    } else {
        Some(ctx.breakers.admit(&spec.name, Instant::now())?)
    };
    // 6. Validate the input.
    if let Err(e) = schema::check_input(tool, &call.args) {
        if let Some(admission) = admission {
            ctx.breakers
                .record(&spec.name, admission, Health::Unknown, Instant::now());
        }
        return Err(e);
    }
    // 7. Run the body under its timeout, catching panics, retrying where allowed.
    ctx.repeat.record(spec, args_key);
    let effect_index = (spec.effect != Effect::Read).then(|| {
        let mut effects = ctx.effects.lock().unwrap_or_else(|p| p.into_inner());
        effects.push(EffectRecord {
            tool: spec.name.clone(),
            effect: spec.effect,
            args: call.args.clone(),
            ok: false,
        });
        effects.len() - 1
    });
    let result = if call.speculative {
        // A speculative read ends early when the run no longer needs it.
        let mut cancel = ctx.cancel.subscribe();
        tokio::select! {
            result = run_body(ctx, tool, call, call_id, attempts) => result,
            _ = cancel.wait_for(|cancelled| *cancelled) => Err(ToolError::new(
                ErrorKind::Cancelled,
                "the run ended before this speculative read was needed",
            )),
        }
    } else {
        run_body(ctx, tool, call, call_id, attempts).await
    };
    // 8. Validate the output.
    let result = result.and_then(|value| schema::check_output(tool, &value).map(|()| value));
    if let Some(i) = effect_index {
        ctx.effects.lock().unwrap_or_else(|p| p.into_inner())[i].ok = result.is_ok();
    }
    // 9. Record the outcome in the breaker.
    if let Some(admission) = admission {
        ctx.breakers
            .record(&spec.name, admission, Health::of(&result), Instant::now());
    }
    result
}

/// Step 7: attempts of the body, each under the tool's timeout and within the run's wall clock.
async fn run_body(
    ctx: &Arc<RunContext>,
    tool: &RegisteredTool,
    call: &Call,
    call_id: u64,
    attempts: &mut u32,
) -> Result<Value, ToolError> {
    let spec = &tool.spec;
    let args = &call.args;
    let nested = spec.is_composite().then(|| NestedCalls {
        ctx: Arc::clone(ctx),
        parent: call_id,
        allowed: Arc::from(spec.nested.clone()),
        speculative: call.speculative,
        claimed: call.claimed.clone(),
        made: call.nested_made.clone().unwrap_or_default(),
    });
    let max_attempts = if spec.effect.may_retry() {
        1 + spec.retries
    } else {
        1
    };
    let mut backoff = Duration::from_millis(50);
    loop {
        *attempts += 1;
        let remaining = ctx.budget.remaining(Instant::now());
        let limit = spec.timeout.min(remaining);
        let context = ToolContext {
            tool: spec.name.clone(),
            call_id,
            attempt: *attempts,
            nested: nested.clone(),
        };
        let body =
            AssertUnwindSafe(async { (tool.body)(args.clone(), context).await }).catch_unwind();
        let result = match tokio::time::timeout(limit, body).await {
            Ok(Ok(result)) => result,
            Ok(Err(panic)) => Err(ToolError::internal(format!(
                "the tool panicked: {}",
                panic_message(panic.as_ref())
            ))),
            Err(_) if limit < spec.timeout => Err(budget::exceeded(format!(
                "the run's wall-clock budget of {:?} ran out during the call",
                ctx.budget.wall_clock()
            ))),
            Err(_) => Err(ToolError::new(
                ErrorKind::Timeout,
                format!("no answer within {} ms", spec.timeout.as_millis()),
            )),
        };
        match result {
            Err(e) if e.kind.is_retryable() && *attempts < max_attempts => {
                tracing::debug!(tool = %spec.name, attempt = *attempts, error = %e, "retrying");
                if backoff >= ctx.budget.remaining(Instant::now()) {
                    return Err(e);
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
            other => return other,
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::Tool;
    use serde_json::json;
    use std::sync::atomic::AtomicUsize;

    fn context(budget: Budget) -> (Arc<RunContext>, Arc<AtomicUsize>) {
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&runs);
        let write = Tool::builder("write", Effect::Write)
            .input_schema(json!({"type": "object", "properties": {"n": {"type": "integer"}}}))
            .handler(move |args| {
                counter.fetch_add(1, Ordering::SeqCst);
                async move { Ok(args) }
            });
        let read = Tool::builder("read", Effect::Read).handler(|_| async { Ok(json!(1)) });
        let registry = Registry::builder().tool(write).tool(read).build().unwrap();
        let ctx = RunContext::new(
            Arc::new(registry),
            Arc::new(Breakers::new(BreakerConfig::default())),
            budget,
            "run".into(),
            Arc::default(),
        );
        (Arc::new(ctx), runs)
    }

    #[tokio::test]
    async fn unknown_tools_get_a_suggestion_and_no_receipt() {
        let (ctx, _) = context(Budget::default());
        let e = dispatch(&ctx, Call::top_level("reed", json!({})))
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::UnknownTool);
        assert!(e.message.contains("did you mean `read`"), "{}", e.message);
        assert!(ctx.take_receipts().is_empty());
    }

    #[tokio::test]
    async fn a_composite_may_call_only_its_declared_tools() {
        let (ctx, runs) = context(Budget::default());
        let nested = |tool: &str| Call {
            tool: tool.into(),
            args: json!({}),
            args_key: "{}".into(),
            parent: Some((7, Arc::from(vec!["read".to_string()]))),
            speculative: false,
            claimed: None,
            nested_made: None,
        };
        let e = dispatch(&ctx, nested("write")).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied);
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        assert_eq!(dispatch(&ctx, nested("read")).await.unwrap(), json!(1));
        let receipts = ctx.take_receipts();
        assert_eq!(receipts.len(), 2);
        assert!(receipts.iter().all(|r| r.parent == Some(7)));
    }

    #[tokio::test]
    async fn refused_calls_never_reach_the_body_or_the_effect_log() {
        let (ctx, runs) = context(Budget {
            max_tool_calls: 2,
            ..Budget::default()
        });
        let e = dispatch(&ctx, Call::top_level("write", json!({"n": "x"})))
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput);
        // Invalid input did not count as a repeat: the corrected call runs.
        dispatch(&ctx, Call::top_level("write", json!({"n": 1})))
            .await
            .unwrap();
        let e = dispatch(&ctx, Call::top_level("write", json!({"n": 2})))
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::BudgetExceeded);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        let effects = ctx.take_effects();
        assert_eq!(effects.len(), 1);
        assert_eq!(effects[0].args, json!({"n": 1}));
        assert_eq!(ctx.dispatched(), 3);
    }

    #[test]
    fn panic_messages_are_recovered() {
        assert_eq!(panic_message(&"static"), "static");
        assert_eq!(panic_message(&String::from("owned")), "owned");
        assert_eq!(panic_message(&5_u8), "(no message)");
    }
}
