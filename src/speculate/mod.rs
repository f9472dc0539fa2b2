//! Speculation: the scout starts reads early and in parallel, into the run ledger the executor
//! claims from. Correctness stays with the executor (it alone decides every result and
//! makes every non-read call); the scout only spends reads, within caps.

mod functions;
mod placeholder;
mod rewrite;
#[cfg(test)]
mod rhai_facts;
mod scout;

pub(crate) use functions::ScoutScript;
pub(crate) use placeholder::prepare;
pub(crate) use scout::Scout;
