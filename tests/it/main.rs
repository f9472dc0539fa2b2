//! Integration tests: one binary, a `support` module, one module per topic.

mod support;

// The command line is a default feature; its tests run the binary.
#[cfg(feature = "cli")]
mod cli;
mod composites;
mod dispatch_path;
mod equivalence;
mod errors;
mod hardening;
mod layering;
mod limits;
mod manifests;
mod mcp_client;
#[cfg(feature = "cli")]
mod mcp_server;
mod meaning;
mod receipts;
mod speculation;
