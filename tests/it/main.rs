//! Integration tests: one binary, a `support` module, one module per topic.

mod support;

/// Counts the test binary's allocations, as the command line counts its own, so that the
/// memory budget can be tested (see `hardening::a_run_past_its_memory_budget_ends_cleanly`).
#[global_allocator]
static ALLOCATOR: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

#[cfg(feature = "cli")]
mod answers;
mod api;
mod cache;
// The command line is a default feature; its tests run the binary.
mod check_corpus;
#[cfg(feature = "cli")]
mod cli;
#[cfg(feature = "commands")]
mod commands;
mod composites;
mod dispatch_path;
mod docs;
#[cfg(feature = "cli")]
mod durable;
#[cfg(feature = "cli")]
mod durable_edges;
mod durable_faults;
mod equivalence;
mod errors;
#[cfg(feature = "cli")]
mod extreme_limits;
mod files;
mod fixtures;
mod fuzz;
mod guard;
mod hardening;
mod helpers;
#[cfg(feature = "cli")]
mod inputs;
mod jcs;
mod layering;
#[cfg(feature = "cli")]
mod leases;
mod limits;
#[cfg(feature = "cli")]
mod load;
mod lossless;
mod manifests;
mod mcp_client;
#[cfg(feature = "cli")]
mod mcp_http;
#[cfg(feature = "cli")]
mod mcp_server;
mod meaning;
mod mistakes;
mod pg;
#[cfg(feature = "cli")]
mod pg_runs;
mod placed;
mod plans;
mod receipts;
#[cfg(feature = "cli")]
mod results;
#[cfg(feature = "cli")]
mod retention;
#[cfg(feature = "cli")]
mod secrets;
#[cfg(feature = "cli")]
mod serve_limits;
mod speculation;
#[cfg(feature = "cli")]
mod store_suite;
mod streaming;
#[cfg(feature = "cli")]
mod streaming_cli;
mod strings;
#[cfg(feature = "cli")]
mod take_over;
#[cfg(feature = "cli")]
mod tenants;
mod warnings;
