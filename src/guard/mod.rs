//! The guard: what every call may touch. A call passes a chain of policies in the dispatch
//! path, right after its tool is resolved (see `docs/guard.md`).

mod view;

pub use view::{Access, Argv, CommandLine, GuardView, PathArg};
