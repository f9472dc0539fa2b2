//! MCP: tools from MCP servers, usable from scripts like any other (the client), and toolscript
//! itself served as an MCP server over stdio or Streamable HTTP (the server; HTTP with the
//! feature `http`). Built on the official Rust SDK, rmcp (feature `mcp`); without it only the
//! specification of a server is here, and starting one is an error that says so.

// Servers' tools are declared in manifests: the client is reached through them only.
#[cfg(feature = "http")]
mod auth;
#[cfg(feature = "http")]
mod checks;
#[cfg(all(feature = "mcp", feature = "manifest"))]
mod client;
#[cfg(feature = "mcp")]
mod formats;
#[cfg(feature = "http")]
mod http;
#[cfg(feature = "http")]
mod limits;
#[cfg(feature = "mcp")]
mod server;
#[cfg(feature = "http")]
mod sessions;
#[cfg(feature = "http")]
mod stream_http;
#[cfg(feature = "http")]
mod take_over;
#[cfg(feature = "http")]
mod tenancy;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::tool::{Approval, Effect};

#[cfg(feature = "http")]
pub use auth::Auth;
#[cfg(all(feature = "mcp", feature = "manifest"))]
pub(crate) use client::connect;
#[cfg(feature = "http")]
pub use http::{serve_http, HttpOptions, MCP_PATH};
#[cfg(feature = "mcp")]
pub use server::serve_stdio;
#[cfg(feature = "http")]
pub use stream_http::STREAM_PATH;

/// Waits until every MCP server this process started has been closed (its tools dropped, its
/// process ended, what it left in its process group killed), or until `timeout`; whether they
/// all were. A program that stops early (at Ctrl-C, say) drops its runtime and waits here, so
/// that its servers get their stdin closed and a moment to exit before the process ends (its
/// end kills whatever is left of them).
pub async fn servers_closed(timeout: Duration) -> bool {
    let deadline = crate::sync::deadline_after(std::time::Instant::now(), timeout);
    while crate::children::live() > 0 {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// One MCP server to start and take tools from: an `[[mcp]]` table of a manifest.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct McpServerSpec {
    /// The server's name in errors and in `tools` (`name`, or the program's file name).
    pub name: String,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Extra environment variables for the server: values, or secrets'
    /// (`{ secret = "NAME" }`), fetched when the server starts.
    pub env: BTreeMap<String, crate::secrets::EnvValue>,
    /// The server's working directory (a manifest's own folder), or the current one.
    pub cwd: Option<PathBuf>,
    /// Put before every tool name (`fs_` makes `read_file` `fs_read_file`).
    pub prefix: Option<String>,
    /// The timeout of each call to one of its tools.
    pub timeout: Duration,
    /// Effects by the server's tool name, overriding what the server's annotations say.
    pub effects: BTreeMap<String, Effect>,
    /// Approvals by the server's tool name: `always` makes every call of the tool wait for a
    /// person (see [`crate::Approval`]).
    pub approval: BTreeMap<String, Approval>,
    /// Whether annotations decide effects; when `false`, every tool not in `effects` is a write.
    pub trust_annotations: bool,
    /// Calls to the server's tools that may run at once, all tools together; more wait for a
    /// slot outside their timeout, so that speculation queues behind a server rather than
    /// overloading it into failing.
    pub max_concurrency: usize,
    /// The arguments that name files, by the server's tool name (`"*"` for every tool not
    /// named): the guard checks them against its path rules, a read tool's as reads, any
    /// other's as writes. The server opens the files itself: the guard sees only the names.
    pub paths: BTreeMap<String, Vec<String>>,
    /// Redaction paths by the server's tool name (`args.token`, `result.items[*].email`):
    /// see [`crate::secrets::RedactPath`].
    pub redact: BTreeMap<String, Vec<String>>,
    /// Cached reads' lifetimes, by the server's tool name (see docs/cache.md).
    pub cache_ttl: BTreeMap<String, Duration>,
    /// Cached reads' scopes, by the server's tool name.
    pub cache_scope: BTreeMap<String, Vec<String>>,
    /// The cached reads (by their names in the catalog) each tool makes stale, by the
    /// server's tool name.
    pub invalidates: BTreeMap<String, Vec<String>>,
    /// How each tool takes part in a plan, by the server's tool name (see docs/plans.md).
    pub plan: BTreeMap<String, crate::plan::PlanSpec>,
}

impl McpServerSpec {
    /// A server started with `command`, with the defaults: no extra environment, no prefix,
    /// a 30 s timeout, annotations trusted.
    pub fn new(command: Vec<String>) -> McpServerSpec {
        let name = command
            .first()
            .map(|program| {
                std::path::Path::new(program)
                    .file_name()
                    .map_or_else(|| program.clone(), |f| f.to_string_lossy().into_owned())
            })
            .unwrap_or_default();
        McpServerSpec {
            name,
            command,
            env: BTreeMap::new(),
            cwd: None,
            prefix: None,
            timeout: crate::tool::DEFAULT_TIMEOUT,
            effects: BTreeMap::new(),
            approval: BTreeMap::new(),
            trust_annotations: true,
            max_concurrency: 16,
            paths: BTreeMap::new(),
            redact: BTreeMap::new(),
            cache_ttl: BTreeMap::new(),
            cache_scope: BTreeMap::new(),
            invalidates: BTreeMap::new(),
            plan: BTreeMap::new(),
        }
    }
}

/// Without the feature `mcp` no MCP server can be started: a manifest that declares one fails
/// to load its tools, naming the server.
#[cfg(all(feature = "manifest", not(feature = "mcp")))]
pub(crate) async fn connect(
    spec: &McpServerSpec,
    _secrets: &crate::secrets::Secrets,
) -> Result<Vec<crate::tool::Tool>, crate::error::Error> {
    Err(crate::error::Error::mcp(
        &spec.name,
        "this toolscript was built without the feature `mcp`",
        None,
    ))
}
