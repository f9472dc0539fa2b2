//! Integration tests: one binary, a `support` module, one module per topic.

mod support;

mod cli;
mod composites;
mod dispatch_path;
mod equivalence;
mod errors;
mod layering;
mod limits;
mod manifests;
mod mcp_client;
mod mcp_server;
mod meaning;
mod receipts;
mod speculation;
