//! What calling a tool does to the world: the one fact about a tool that every layer reads (the
//! store keeps it with a paused call, dispatch decides retries by it, speculation starts reads
//! only).

use std::fmt;

/// What calling a tool does to the world. It has no default: every tool declares one, and it
/// decides speculation, retries and what a repeated call means.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Effect {
    /// No durable side effect: may be speculated, deduplicated within an epoch, retried.
    Read,
    /// Mutates something: runs exactly once, never retried or repeated.
    Write,
    /// Safe to retry with the same arguments, but still never speculated or repeated.
    Idempotent,
    /// Leaves the process (mail, payment, another agent): never retried or repeated.
    External,
}

impl Effect {
    /// The effect's name as written in manifests and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Read => "read",
            Effect::Write => "write",
            Effect::Idempotent => "idempotent",
            Effect::External => "external",
        }
    }

    /// Whether automatic retries are allowed for this effect.
    pub fn may_retry(self) -> bool {
        matches!(self, Effect::Read | Effect::Idempotent)
    }
}

impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
