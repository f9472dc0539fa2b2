//! The guard: what every call may touch. A call passes a chain of policies in the dispatch
//! path, right after its tool is resolved (see `docs/guard.md`).

mod commands;
mod view;

pub use commands::CommandRules;
pub use view::{Access, Argv, CommandLine, GuardView, PathArg};

/// What a policy says of a call. The first answer of a chain that is not [`Decision::Pass`]
/// decides; when every policy passes, the guard's default does.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// The call goes on.
    Allow,
    /// The call fails with `permission_denied`.
    Deny {
        /// The rule that decided, as a person finds it in a manifest: `forbidden "**/.env*"`,
        /// `write.deny "**/*.lock"`, `commands.deny "rm *"`, a rule's name.
        rule: String,
        /// Why, in words, with the path or argv as the guard saw it.
        reason: String,
    },
    /// A person decides: the run pauses (the script's calls), or the call is denied where a
    /// run cannot pause.
    Ask {
        /// The rule that asks.
        rule: String,
        /// Why.
        reason: String,
    },
    /// This policy has nothing to say: the next one decides.
    Pass,
}
