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
//! | module | what it holds |
//! |---|---|
//! | `tool` | tool specs, effects, names, the registry and its validation, catalog rendering |
//! | `dispatch` | the one dispatch path and its steps: budget, breaker, schema, repeat guard, receipts |
//! | `script` | the Rhai executor: engine set-up, limits, bindings, value conversion, static checks |
//! | `speculate` | the scout, placeholders, the AST rewrite and the prefetch table |
//! | `manifest` | TOML manifests and script tools, and the embedded demo catalog |
//! | `mcp` | tools from MCP servers (client), and `toolscript serve` (server) |
//! | `runtime` | [`Runtime`]: compile, check and run scripts; [`RunOutcome`] |

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]
// Errors carry a message, a hint and a position for the model that wrote the script; they are
// returned once per failed call, so their size is not worth an allocation and a less plain API.
#![allow(clippy::result_large_err)]

mod bench;
mod dispatch;
mod error;
mod json;
mod manifest;
mod mcp;
mod runtime;
mod script;
mod speculate;
mod tool;

pub use bench::{bench_script, observable, BenchError, BenchReport};
pub use dispatch::{
    verify_receipts, write_receipts, BreakerConfig, Budget, EffectRecord, Progress, Receipt,
    Status, RECEIPT_VERSION,
};
pub use error::{Error, ErrorKind, RunError, ToolError};
pub use json::canonical as canonical_json;
pub use manifest::{demo_catalog, Manifests};
pub use mcp::{serve_stdio, McpServerSpec};
pub use runtime::{
    error_json, Mode, RunOptions, RunOutcome, Runtime, RuntimeBuilder, Script, Stats,
};
pub use script::{Limits, Problem};
pub use speculate::SpeculationLimits;
pub use tool::{
    Effect, Format, Registry, RegistryBuilder, Tool, ToolBuilder, ToolContext, ToolFuture,
    ToolSpec, DEFAULT_TIMEOUT,
};

/// The README's Rust examples, compiled and run as doc tests so that they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
