//! The engine toolkit that the executor, the scout and script tools share: the locked-down Rhai
//! engine (no `eval`, no modules, the [`Limits`] applied, a deadline and cancellation checked
//! while it runs), conversions between script values and JSON, errors across the script
//! boundary, the registration of tools as script functions, and the threads scripts run on.
//!
//! It knows nothing of runs, epochs or speculation: those are the executor's (`script`) and the
//! scout's (`speculate`), which both build on it.

mod catch;
pub(crate) mod diagnose;
mod errors;
mod functions;
pub(crate) mod helpers;
mod limits;
mod memory;
mod threads;
mod value;

pub use limits::{LimitKey, Limits};
pub use memory::set_memory_probe;
pub(crate) use memory::{room_for_a_run, Running};

pub(crate) use catch::rewrite as rewrite_catches;
pub(crate) use errors::{from_parse, from_rhai_with, limit_exceeded, line_column, outcome_to_rhai};
// Script tools' bodies (feature `manifest`) run on the pool, and throw and read errors themselves.
#[cfg(feature = "manifest")]
pub(crate) use errors::{from_rhai, thrown_error, to_rhai, Thrown};
pub(crate) use functions::{register_tool_functions, ToolCall};
pub(crate) use threads::{block_on, block_on_noting, poll_once, spawn_script_thread};
#[cfg(feature = "manifest")]
pub(crate) use threads::{run_in_place, stack_room, ScriptPool};

#[cfg(test)]
mod tests;
pub(crate) use value::{to_dynamic, to_json};

use std::sync::atomic::{AtomicU64, Ordering};

use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

use std::sync::OnceLock;

use rhai::packages::{Package, StandardPackage};
use rhai::{Dynamic, Engine, NativeCallContext, Shared};

/// The value an engine terminates with when its deadline passes.
pub(crate) const DEADLINE: &str = "deadline";
/// The value an engine terminates with when it is cancelled.
pub(crate) const CANCELLED: &str = "cancelled";
/// The value an engine terminates with when the process holds more than the memory budget.
pub(crate) const MEMORY: &str = "memory";
/// What begins the value an engine terminates with when the run must stop for a reason of the
/// runtime's (the rest of the value): the script cannot catch it.
pub(crate) const STOPPED: &str = "stopped: ";

/// How often, in operations, the deadline and the cancellation flag are looked at.
const CHECK_EVERY: u64 = 256;

/// What a speculative run may hold past its memory budget once its scout has stood down: the
/// scout's own bookkeeping, kept until the run ends (a few kilobytes; measured 0.2–2.6 KB over
/// a sequential run's peak on a script at its budget's edge).
const SPECULATION_KEEPS: usize = 64 << 10;

/// What controls a running script from outside: a deadline and a cancellation flag that
/// terminate it, and a counter of the operations it ran.
#[derive(Default)]
pub(crate) struct RunControls {
    pub(crate) deadline: Option<Instant>,
    pub(crate) cancel: Option<CancellationToken>,
    pub(crate) operations: Option<Arc<AtomicU64>>,
    /// `sleep` returns at once (the scout: it never waits for what the executor would).
    pub(crate) skip_sleep: bool,
    /// Called once when the process holds more than the memory budget, before the script is
    /// ended for it: it lets go of memory that is not the script's (the executor's: the scout
    /// stands down), and says whether it did.
    pub(crate) relief: Option<Relief>,
    /// Wraps each `sleep` of the script that waits at all: the executor's marks itself waiting
    /// meanwhile (`RunLedger::executor_waits`), so that the scout starts the reads it held, as
    /// it does while the executor waits for a call.
    pub(crate) sleeps: Option<Sleeps>,
}

/// What a script asks to let go of memory that is not its own.
pub(crate) type Relief = Arc<dyn Fn() -> bool + Send + Sync>;

/// What wraps a script's `sleep`: it calls the sleep it is given, once.
pub(crate) type Sleeps = Arc<dyn Fn(&mut dyn FnMut()) + Send + Sync>;

/// The longest slice a `sleep` waits before it looks at its deadline and cancellation again.
const SLEEP_SLICE: std::time::Duration = std::time::Duration::from_millis(10);

/// Rhai's `sleep` is one operation, so no operation count or progress check sees it. This one
/// waits in slices and ends the script, as any work would, at the deadline or a cancellation
/// (of the engine, or of the pool job it runs in). A sleep of a negative, NaN or huge number of
/// seconds is no sleep, or one until the deadline: never a panic.
fn sleep(
    seconds: f64,
    deadline: Option<Instant>,
    cancel: Option<&CancellationToken>,
    position: rhai::Position,
) -> Result<(), Box<rhai::EvalAltResult>> {
    // Too long to represent: a sleep until the deadline or a cancellation.
    let end = std::time::Duration::try_from_secs_f64(seconds.max(0.0))
        .ok()
        .and_then(|length| Instant::now().checked_add(length));
    loop {
        if cancel.is_some_and(CancellationToken::is_cancelled) || threads::job_cancelled() {
            return Err(terminated(CANCELLED, position));
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(terminated(DEADLINE, position));
        }
        let left = end.map_or(SLEEP_SLICE, |end| end.saturating_duration_since(now));
        if left.is_zero() {
            return Ok(());
        }
        let until_deadline = deadline.map_or(SLEEP_SLICE, |d| d.saturating_duration_since(now));
        std::thread::sleep(left.min(SLEEP_SLICE).min(until_deadline));
    }
}

fn terminated(token: &str, position: rhai::Position) -> Box<rhai::EvalAltResult> {
    Box::new(rhai::EvalAltResult::ErrorTerminated(
        Dynamic::from(token.to_string()),
        position,
    ))
}

/// The scope a run's script starts in: its `input`, a constant (`()` when it was given none).
/// The executor and every scout pass start in the same one.
pub(crate) fn run_scope(ctx: &crate::dispatch::RunContext) -> rhai::Scope<'static> {
    let mut scope = rhai::Scope::new();
    let input = ctx.input.as_deref().map_or(Dynamic::UNIT, to_dynamic);
    scope.push_constant("input", input);
    scope
}

/// The standard library: building it is most of what `Engine::new` costs, so it is built
/// once and shared by every engine of the process.
fn standard() -> Shared<rhai::Module> {
    static STANDARD: OnceLock<Shared<rhai::Module>> = OnceLock::new();
    STANDARD
        .get_or_init(|| StandardPackage::new().as_shared_module())
        .clone()
}

/// Registers `f` in `module` under `name`, as `Engine::register_fn` does in an engine's: for
/// the modules built once and shared by every engine.
pub(crate) fn set<
    A: 'static,
    const N: usize,
    const X: bool,
    R: rhai::Variant + Clone,
    const F: bool,
>(
    module: &mut rhai::Module,
    name: &str,
    f: impl rhai::RhaiNativeFunc<A, N, X, R, F> + Send + Sync + 'static,
) {
    rhai::FuncRegistration::new(name)
        .in_global_namespace()
        .set_into_module(module, f);
}

/// Builds the modules every engine shares, if no engine has yet (see [`new_engine`]).
pub(crate) fn prepare() {
    let _ = (standard(), helpers::module(), catch::module());
    let _ = memory::checked_builtins(memory_budget(&Limits::default()));
}

/// The memory budget of `limits`, in bytes.
fn memory_budget(limits: &Limits) -> usize {
    usize::try_from(limits.max_memory_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
}

/// An engine with the limits applied, printing to nowhere until the caller says otherwise.
pub(crate) fn new_engine(limits: &Limits, watch: RunControls) -> Engine {
    let RunControls {
        deadline,
        cancel,
        operations,
        skip_sleep,
        relief,
        sleeps,
    } = watch;
    let mut engine = Engine::new_raw();
    let max_memory = memory_budget(limits);
    // Searched in the reverse of this order: the size-checked built-ins come before the
    // standard library's functions of the same signatures.
    engine.register_global_module(standard());
    engine.register_global_module(helpers::module());
    engine.register_global_module(catch::module());
    engine.register_global_module(memory::checked_builtins(max_memory));
    engine.disable_symbol("eval");
    engine.disable_symbol("import");
    engine.set_module_resolver(rhai::module_resolvers::DummyModuleResolver::new());
    engine.set_max_operations(limits.max_operations);
    // `Limits`' fields are public: ones set past their maximum (which `Limits::set` refuses)
    // are held to it, so that no setting overflows a stack.
    engine.set_max_call_levels(limits.max_call_depth.min(Limits::MAX_CALL_DEPTH));
    let expr_depth = limits.max_expr_depth.min(Limits::MAX_EXPR_DEPTH);
    engine.set_max_expr_depths(expr_depth, (expr_depth / 2).max(8));
    let (strings, arrays, maps) = limits.container_sizes();
    engine.set_max_string_size(strings);
    engine.set_max_array_size(arrays);
    engine.set_max_map_size(maps);
    engine.set_max_functions(limits.max_functions);
    engine.set_max_variables(limits.max_variables);
    crate::rhai_ast::decode_marked_strings(&mut engine);
    engine.on_print(|_| {});
    engine.on_debug(|_, _, _| {});
    let flag = cancel.clone();
    let bounded = move |ctx: NativeCallContext, seconds: f64| {
        if skip_sleep {
            return Ok(());
        }
        let sleep = || sleep(seconds, deadline, flag.as_ref(), ctx.call_position());
        match &sleeps {
            // A sleep of no time (or of NaN) is no wait.
            Some(sleeps) if seconds > 0.0 => {
                let mut slept = Ok(());
                sleeps(&mut || slept = sleep());
                slept
            }
            _ => sleep(),
        }
    };
    // A durable run replays its script on resume and must take the same path: nothing the
    // script reads may differ between two runs but tool results, which the journal keeps.
    // The clock is the one such thing Rhai offers.
    engine.register_fn("timestamp", |ctx: NativeCallContext| -> Result<rhai::INT, Box<rhai::EvalAltResult>> {
        Err(Box::new(rhai::EvalAltResult::ErrorRuntime(
            "`timestamp()` is not available: a run must take the same path when it is resumed, so a script does not read the clock (ask a tool for the time)".into(),
            ctx.call_position(),
        )))
    });
    let by_int = bounded.clone();
    engine.register_fn("sleep", bounded);
    engine.register_fn(
        "sleep",
        move |ctx: NativeCallContext, seconds: rhai::INT| by_int(ctx, seconds as f64),
    );
    engine.on_progress(move |ops| {
        if let Some(counter) = &operations {
            counter.store(ops, Ordering::Relaxed);
        }
        // The count of allocated bytes is one atomic load: it is read at every operation, so
        // that a value doubling at each step (`s += s`) is stopped one step past the budget.
        if memory::allocated().is_some_and(|bytes| bytes > max_memory) {
            // What was let go of may be enough: the script goes on if it is. What speculation
            // keeps until the run ends (the scout itself, its entries in the ledger) is not let
            // go of, and is allowed for, so that a run fails where a sequential one would.
            let relieved = relief.as_ref().is_some_and(|relief| relief());
            let allowed = max_memory.saturating_add(SPECULATION_KEEPS);
            if !relieved || memory::allocated().is_some_and(|bytes| bytes > allowed) {
                return Some(Dynamic::from(MEMORY));
            }
        }
        if ops % CHECK_EVERY != 0 {
            return None;
        }
        if cancel.as_ref().is_some_and(CancellationToken::is_cancelled) || threads::job_cancelled()
        {
            return Some(Dynamic::from(CANCELLED));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Some(Dynamic::from(DEADLINE));
        }
        None
    });
    engine
}
