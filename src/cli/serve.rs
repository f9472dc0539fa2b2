//! `toolscript serve`: toolscript as an MCP server, on stdio or over Streamable HTTP.

use std::process::ExitCode;

use toolscript::mcp::{serve_http, serve_stdio, HttpOptions, MCP_PATH};

use super::{runtime, LimitsArg, StoreArg, ToolsArg};

#[derive(clap::Args)]
pub(crate) struct Serve {
    /// Serve MCP Streamable HTTP at http://ADDR/mcp instead of stdio (e.g. 127.0.0.1:8080;
    /// port 0 picks a free port, printed on stderr). No authentication: bind to loopback,
    /// or put it behind a proxy that authenticates.
    #[arg(long, value_name = "ADDR")]
    http: Option<String>,
    /// With --http: keep a session per client (Mcp-Session-Id) in this process instead of
    /// answering each request on its own (stateless, the default).
    #[arg(long, requires = "http")]
    stateful: bool,
    /// With --http: accept this Host header (a name, or name:port) besides loopback names
    /// and the bound address; repeat for several.
    #[arg(long = "allow-host", value_name = "HOST", requires = "http")]
    allow_hosts: Vec<String>,
    #[command(flatten)]
    tools: ToolsArg,
    #[command(flatten)]
    store: StoreArg,
    #[command(flatten)]
    limits: LimitsArg,
    /// Every run dispatches every read: the cache of reads across runs neither answers nor
    /// keeps any.
    #[arg(long)]
    no_cache: bool,
}

impl Serve {
    /// Serves until the client closes stdio, or (over HTTP) until Ctrl-C or SIGTERM.
    pub(crate) async fn apply(self) -> Result<ExitCode, String> {
        let store = self.store.open()?;
        let mut runtime = runtime(&self.tools, store, &self.limits).await?;
        if self.no_cache {
            runtime = runtime.without_cache();
        }
        match self.http {
            None => serve_stdio(runtime).await.map_err(|e| e.report())?,
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(&addr)
                    .await
                    .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
                let bound = listener.local_addr().map_err(|e| e.to_string())?;
                let mut options = HttpOptions::new().stateful(self.stateful);
                for host in self.allow_hosts {
                    options = options.allow_host(host);
                }
                let stop = super::stop_signal();
                let stop = async move {
                    stop.await;
                };
                // The one line a user (or a test, with port 0) reads to find the server.
                eprintln!("toolscript: serving MCP on http://{bound}{MCP_PATH}");
                serve_http(runtime, listener, options, stop).await;
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}
