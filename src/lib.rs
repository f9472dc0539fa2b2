//! toolscript runs orchestration scripts written by language models.
//!
//! A model writes one [Rhai](https://rhai.rs) script that calls many tools; toolscript runs it
//! with exactly the meaning of running it line by line. Every call — top-level, nested inside a
//! composite tool, or speculative — goes through one dispatch path of budget, circuit breaker,
//! schema validation, timeout and receipts.
//!
//! # Examples
//!
//! ```
//! use serde_json::json;
//! use toolscript::{Effect, Registry, Runtime, Tool};
//!
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), toolscript::Error> {
//! let double = Tool::builder("double", Effect::Read)
//!     .description("Doubles a number.")
//!     .input_schema(json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}))
//!     .handler(|args| async move { Ok(json!(args["n"].as_i64().unwrap_or(0) * 2)) });
//! let runtime = Runtime::new(Registry::builder().tool(double).build()?);
//! let outcome = runtime.run("let x = double(#{n: 20}); x + 2").await;
//! assert_eq!(outcome.result.unwrap(), json!(42));
//! # Ok(())
//! # }
//! ```
//!
//! # Layout
//!
//! Modules from the bottom up; each uses only those above it in this table (a test,
//! `layering::modules_form_no_cycle`, checks it from the sources).
//!
//! | module | what it holds |
//! |---|---|
//! | `error`, `json`, `sync`, `schema`, `rhai_ast` | error kinds and errors; canonical JSON (the frozen key form, and RFC 8785 for receipts) and SHA-256; locks that survive a panic; JSON Schemas generated from types; Rhai's syntax tree (the one module naming Rhai's internal AST types: walks, the scout's and the catch rewrites, running a body one call deeper) |
//! | `children` | child processes that die with toolscript: a guard per child's process group (with `unsafe`), the snapshot journaled with each intent, and whether a lost call may still run |
//! | `store` | the store of durable runs behind the [`Store`] trait (runs, their journals, artifacts); its SQLite backend |
//! | `policy` | result policies: the run's output bounded in tokens (behind a counter), artifacts and their pages |
//! | `tool` | tool specs, effects, names, the registry and its validation, catalog rendering |
//! | `files` | the built-in file tools ([`files::Files`]) in a jail of directory handles |
//! | `commands` | command tools: a program run beneath a root, with a cleared environment, bounded output, a timeout that kills its process group, Landlock on Linux (feature `commands`) |
//! | `dispatch` | the one dispatch path and its steps: budget, breaker, schema, repeat guard, retries, receipts; a run's shared context and the claim of a speculative outcome |
//! | `engine` | the engine toolkit: the locked-down Rhai engine, [`Limits`], values, errors across the script boundary, tools as script functions, script threads |
//! | `ledger` | the run ledger: epochs, reads de-duplicated per epoch, the scout's entries and their claims, the executor's write log |
//! | `script` | the executor (the authoritative run) and the static checks of `check` |
//! | `speculate` | the scout, placeholders and the AST rewrite |
//! | `report` | the JSON formats of a run's outcome ([`RunReport`], [`Stats`]) and of the list of runs ([`RunListing`]) |
//! | `runtime` | [`Runtime`]: compile, check and run scripts; [`RunOutcome`] |
//! | `manifest` | TOML manifests, script tools (`manifest::script_tool`), the embedded demo catalog |
//! | `mcp` | tools from MCP servers (client), and `toolscript serve` (server) |
//! | `bench` | `toolscript bench`: speculative against sequential runs of whole scripts |
//!
//! The public surface: the runtime, tools, errors and the store of durable runs at the root; [`receipts`], [`mcp`],
//! [`bench`] and [`stores`] (what a backend of [`Store`] implements against) as modules of their own.
//!
//! # Features
//!
//! | feature | what it adds | dependencies |
//! |---|---|---|
//! | `sqlite` | [`SqliteStore`], the embedded store of durable runs | `rusqlite` (SQLite bundled), `dirs` |
//! | `postgres` | [`PostgresStore`], the store of durable runs that several machines share (`docs/several-machines.md`) | `tokio-postgres`, `deadpool-postgres`, `tokio-postgres-rustls`, `rustls` (`ring`), `webpki-roots` |
//! | `tokens` | token counts by the o200k_base BPE; without it one token per byte, never fewer than a model counts, so pages and budgets are conservative | `tiktoken-rs` |
//! | `mcp` | tools from MCP servers, and the MCP server (`mcp::serve_stdio`) | `rmcp` |
//! | `http` | the MCP server over Streamable HTTP (`mcp::serve_http`); implies `mcp` | `hyper`, `hyper-util`, `http-body-util` |
//! | `manifest` | TOML manifests ([`Manifests`]), script tools, [`demo_catalog`] | `toml` |
//! | `files` | the built-in file tools, [`files::Files`] (`docs/files.md`) | `cap-std`, `ignore`, `regex` |
//! | `commands` | command tools ([`commands`]), confined by Landlock on Linux | `landlock` (Linux) |
//! | `cli` | the `toolscript` binary; implies all of the above | `clap`, `tracing-subscriber`, `indicatif`, `cap` |
//!
//! The default is `cli`. With no feature, scripts run over Rust tools with speculation,
//! receipts and result policies; durable runs need a [`Store`] of the embedder's.

// Two modules need `unsafe`, each with its safety argument: `children::guard` forks a process,
// `commands::pre_exec` restricts a child before it runs its program; everywhere else it is
// refused.
#![deny(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]
// Errors carry a message, a hint and a position for the model that wrote the script; they are
// returned once per failed call, so their size is not worth an allocation and a less plain API.
#![allow(clippy::result_large_err)]

pub mod bench;
mod children;
#[cfg(feature = "commands")]
pub mod commands;
mod dispatch;
mod effect;
mod engine;
mod error;
#[cfg(feature = "files")]
pub mod files;
pub mod guard;
mod json;
mod ledger;
#[cfg(feature = "manifest")]
mod manifest;
pub mod mcp;
pub mod plan;
mod policy;
mod report;
mod rhai_ast;
mod runtime;
mod schema;
mod script;
pub mod secrets;
mod speculate;
mod store;
mod sync;
mod tool;

pub use dispatch::{BreakerConfig, EffectRecord, Progress, Sandbox};
pub use engine::{set_memory_probe, LimitKey, Limits};
pub use error::{
    Cause, Error, ErrorKind, ErrorReport, LimitReached, LimitReport, RunError, ToolError, Warning,
};
pub use ledger::SpeculationLimits;
#[cfg(feature = "manifest")]
pub use manifest::{demo_catalog, Manifests};
pub use policy::{
    page_of as artifact_page, pages_of as artifact_pages, stored_page as stored_artifact_page,
    Artifact, ArtifactPage, PageContent, ResultPolicy, ANSWER_OVERHEAD, MIN_INLINE_TOKENS,
    MIN_PAGE_TOKENS,
};
pub use report::{Mode, ReceiptChain, RunEnd, RunListing, RunReport, Stats};
pub use runtime::{
    prune, Decision, PlanOutcome, RunOptions, RunOutcome, Runtime, RuntimeBuilder, Script,
    StreamedRun,
};
pub use script::{Awaiting, Problem, Severity};
#[cfg(feature = "postgres")]
pub use store::{is_postgres_url, mask_url, PostgresStore};
pub use store::{
    lease_from, parse_lease_s, CatalogPrint, LeaseListing, PendingCall, PruneRule, Pruned, ReadAt,
    RunPage, RunQuery, RunRecord, RunStatus, RunSummary, Store, StoredArtifact, StoredPlan,
    ToolPrint, DEFAULT_LEASE, LEASE_ENV,
};
#[cfg(feature = "sqlite")]
pub use store::{SqliteStore, STORE_ENV};
pub use tool::{
    Approval, Effect, Format, Registry, RegistryBuilder, Tool, ToolBuilder, ToolContext,
    ToolFuture, ToolSpec, DEFAULT_MAX_CONCURRENCY, DEFAULT_TIMEOUT,
};

/// Receipts: one per dispatch, chained by hash, written as JSON Lines and verified.
pub mod receipts {
    pub use crate::dispatch::{
        verify_receipts, verify_receipts_to, write_receipts, Receipt, Status, RECEIPT_VERSION,
    };
    pub use crate::json::{jcs as canonical_json, jcs_value_sha256 as canonical_sha256, Hex};
}

/// What a backend of [`Store`] implements against: the futures it returns, the rows of a
/// run's journal, the end of a run, and why a run cannot be taken.
pub mod stores {
    pub use crate::children::{ChildRecord, ProcessSnapshot};
    pub use crate::store::{
        ApprovedRead, CacheDrop, CacheEntry, Claim, Fence, JournalRows, JournaledWrite, Lease,
        PageIndex, ReadRow, Renewed, StoreFuture, StoredEnd, TakeDecision, TakeRefused, Verdict,
        WriteState,
    };
}

/// The README's Rust examples, compiled and run as doc tests so that they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The Rust examples of `docs/library.md`, compiled and run as doc tests.
#[doc = include_str!("../docs/library.md")]
#[cfg(doctest)]
pub struct LibraryDoctests;
