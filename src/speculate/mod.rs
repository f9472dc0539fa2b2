//! Speculation: the scout starts reads early and in parallel, into a prefetch table the
//! executor claims from. Correctness stays with the executor (it alone decides every result and
//! makes every non-read call); the scout only spends reads, within caps.

mod placeholder;
mod rewrite;
mod scout;
mod table;

pub use table::SpeculationLimits;

pub(crate) use rewrite::rewrite;
pub(crate) use scout::Scout;
pub(crate) use table::{Lookup, PrefetchTable, WriteRecord};
