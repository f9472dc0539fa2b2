//! The engine toolkit that the executor, the scout and script tools share: the locked-down Rhai
//! engine (no `eval`, no modules, the [`Limits`] applied, a deadline and cancellation checked
//! while it runs), conversions between script values and JSON, errors across the script
//! boundary, the registration of tools as script functions, and the threads scripts run on.
//!
//! It knows nothing of runs, epochs or speculation: those are the executor's (`script`) and the
//! scout's (`speculate`), which both build on it.

mod errors;
mod functions;
mod limits;
mod threads;
mod value;

pub use limits::Limits;

pub(crate) use errors::{
    from_parse, from_rhai, line_column, outcome_to_rhai, thrown_error, to_rhai, Thrown,
};
pub(crate) use functions::{register_tool_functions, ToolCall};
pub(crate) use threads::{block_on, spawn_script_thread, ScriptPool};
pub(crate) use value::{to_dynamic, to_json};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use std::sync::OnceLock;

use rhai::packages::{Package, StandardPackage};
use rhai::{Dynamic, Engine, Shared};

/// The value an engine terminates with when its deadline passes.
pub(crate) const DEADLINE: &str = "deadline";
/// The value an engine terminates with when it is cancelled.
pub(crate) const CANCELLED: &str = "cancelled";

/// How often, in operations, the deadline and the cancellation flag are looked at.
const CHECK_EVERY: u64 = 256;

/// What watches a running script: a deadline and a cancellation flag that terminate it, and a
/// counter of the operations it ran.
#[derive(Default)]
pub(crate) struct Watch {
    pub(crate) deadline: Option<Instant>,
    pub(crate) cancel: Option<Arc<AtomicBool>>,
    pub(crate) operations: Option<Arc<AtomicU64>>,
}

/// An engine with the limits applied, printing to nowhere until the caller says otherwise.
pub(crate) fn new_engine(limits: &Limits, watch: Watch) -> Engine {
    let Watch {
        deadline,
        cancel,
        operations,
    } = watch;
    // Building the standard library is most of what `Engine::new` costs; it is built once and
    // shared by every engine of the process.
    static STANDARD: OnceLock<Shared<rhai::Module>> = OnceLock::new();
    let standard = STANDARD.get_or_init(|| StandardPackage::new().as_shared_module());
    let mut engine = Engine::new_raw();
    engine.register_global_module(standard.clone());
    engine.disable_symbol("eval");
    engine.disable_symbol("import");
    engine.set_module_resolver(rhai::module_resolvers::DummyModuleResolver::new());
    engine.set_max_operations(limits.max_operations);
    engine.set_max_call_levels(limits.max_call_depth);
    engine.set_max_expr_depths(limits.max_expr_depth, (limits.max_expr_depth / 2).max(8));
    engine.set_max_string_size(limits.max_string_size);
    engine.set_max_array_size(limits.max_array_size);
    engine.set_max_map_size(limits.max_map_size);
    engine.on_print(|_| {});
    engine.on_debug(|_, _, _| {});
    if deadline.is_some() || cancel.is_some() || operations.is_some() {
        engine.on_progress(move |ops| {
            if let Some(counter) = &operations {
                counter.store(ops, Ordering::Relaxed);
            }
            if ops % CHECK_EVERY != 0 {
                return None;
            }
            if cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed)) {
                return Some(Dynamic::from(CANCELLED));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Some(Dynamic::from(DEADLINE));
            }
            None
        });
    }
    engine
}
