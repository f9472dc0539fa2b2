//! `toolscript serve`: toolscript as an MCP server, on stdio or over Streamable HTTP.

use std::process::ExitCode;
use std::time::Duration;

use toolscript::mcp::{serve_http, serve_stdio, HttpOptions, MCP_PATH};

use super::{runtime, LimitsArg, StoreArg, ToolsArg};

#[derive(clap::Args)]
pub(crate) struct Serve {
    /// Serve MCP Streamable HTTP at http://ADDR/mcp instead of stdio (e.g. 127.0.0.1:8080;
    /// port 0 picks a free port, printed on stderr). No authentication without --auth: bind to
    /// loopback, or put it behind a proxy that authenticates.
    #[arg(long, value_name = "ADDR")]
    http: Option<String>,
    /// With --http: require a bearer token on every request, from the tokens FILE lists by
    /// their SHA-256, each with a tenant and rights (run, read, approve); each tenant sees its
    /// own runs only (see docs/serving.md).
    #[arg(long, value_name = "FILE", requires = "http")]
    auth: Option<std::path::PathBuf>,
    /// With --http: keep a session per client (Mcp-Session-Id) in this process instead of
    /// answering each request on its own (stateless, the default).
    #[arg(long, requires = "http")]
    stateful: bool,
    /// With --http: accept this Host header (a name, or name:port) besides loopback names
    /// and the bound address; repeat for several.
    #[arg(long = "allow-host", value_name = "HOST", requires = "http")]
    allow_hosts: Vec<String>,
    /// With --http: accept requests from this browser origin (scheme://host, scheme://host:port,
    /// or scheme://host:* for any port) besides loopback ones and the bound address; other
    /// Origin headers get 403; repeat for several.
    #[arg(long = "allow-origin", value_name = "ORIGIN", requires = "http")]
    allow_origins: Vec<String>,
    /// With --http: connections open at once, all peers together; past it an idle one is closed
    /// to make room, or the new one refused when all are busy. Default 1024, or less when the
    /// limit of open files (ulimit -n) would not leave room for them.
    #[arg(long, value_name = "N", requires = "http")]
    max_connections: Option<usize>,
    /// With --http: connections open at once from one peer address.
    #[arg(long, value_name = "N", default_value_t = 64, requires = "http")]
    max_connections_per_peer: usize,
    /// With --http: seconds a request's head may take to arrive (from the connection opening
    /// or the previous answer); a slower connection is closed.
    #[arg(long, value_name = "S", default_value = "10", value_parser = seconds, requires = "http")]
    header_timeout_s: Duration,
    /// With --http: seconds a connection may stay with nothing moving and no request in
    /// progress (and an answer unwritten, or a body unfinished) before it is closed.
    #[arg(long, value_name = "S", default_value = "60", value_parser = seconds, requires = "http")]
    idle_timeout_s: Duration,
    /// With --stateful: live sessions at most; past it `initialize` gets 503.
    #[arg(long, value_name = "N", default_value_t = 1024, requires = "stateful")]
    max_sessions: usize,
    /// With --stateful: live sessions at most made from one peer address (an IPv4 address, or
    /// an IPv6 /64).
    #[arg(long, value_name = "N", default_value_t = 256, requires = "stateful")]
    max_sessions_per_peer: usize,
    /// With --stateful: seconds a session that made no request after `initialize` lives.
    #[arg(long, value_name = "S", default_value = "30", value_parser = seconds, requires = "stateful")]
    session_unused_expiry_s: Duration,
    /// With --stateful: seconds a session lives after its last request ends.
    #[arg(long, value_name = "S", default_value = "600", value_parser = seconds, requires = "stateful")]
    session_idle_expiry_s: Duration,
    /// With --http: resume the store's running runs whose lease expired (an instance died or
    /// stalled), sweeping every half lease; a run started with a per-run context is left to
    /// its caller (see docs/several-machines.md).
    #[arg(long, requires = "http")]
    take_over: bool,
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
        // A wrong auth file is said before anything starts.
        let auth = self
            .auth
            .as_deref()
            .map(toolscript::mcp::Auth::load)
            .transpose()?;
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
                let mut options = HttpOptions::new()
                    .stateful(self.stateful)
                    .max_connections(
                        connection_cap(self.max_connections),
                        self.max_connections_per_peer,
                    )
                    .timeouts(self.header_timeout_s, self.idle_timeout_s)
                    .sessions(
                        self.max_sessions,
                        self.session_unused_expiry_s,
                        self.session_idle_expiry_s,
                    )
                    .max_sessions_per_peer(self.max_sessions_per_peer)
                    .take_over(self.take_over);
                for host in self.allow_hosts {
                    options = options.allow_host(host);
                }
                for origin in &self.allow_origins {
                    options = options.allow_origin(origin)?;
                }
                let authenticated = auth.is_some();
                if let Some(auth) = auth {
                    options = options.auth(auth);
                }
                if !bound.ip().is_loopback() && authenticated {
                    eprintln!(
                        "toolscript: warning: serving on {bound} without TLS: bearer tokens cross \
                         the network in clear. Put a proxy that terminates TLS in front."
                    );
                }
                if !bound.ip().is_loopback() && !authenticated {
                    eprintln!(
                        "toolscript: warning: serving on {bound}, which is not a loopback \
                         address, without authentication: anyone who can reach it can run \
                         scripts with these tools. Bind to 127.0.0.1, or put it behind a proxy \
                         that authenticates."
                    );
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

/// A number of seconds, more than zero and at most a year.
fn seconds(text: &str) -> Result<Duration, String> {
    match text.trim().parse::<f64>() {
        Ok(s) if s > 0.0 && s <= 31_536_000.0 => Ok(Duration::from_secs_f64(s)),
        _ => Err(format!(
            "`{text}` is not a number of seconds between 0 (excluded) and 31536000"
        )),
    }
}

/// Descriptors kept for what is not a connection: the store, MCP servers' pipes, files.
const DESCRIPTORS_KEPT: usize = 128;

/// The cap on connections: the one given (with a warning if the limit of open files is lower:
/// past it, `accept` fails), or the default, lowered to leave [`DESCRIPTORS_KEPT`] free.
fn connection_cap(given: Option<usize>) -> usize {
    const DEFAULT: usize = 1024;
    let room = open_files_limit().map(|limit| limit.saturating_sub(DESCRIPTORS_KEPT).max(16));
    match (given, room) {
        (Some(n), Some(room)) if n > room => {
            eprintln!(
                "toolscript: warning: --max-connections {n} is more than the limit of open files \
                 leaves room for (about {room}): past it, connections wait unaccepted. Raise \
                 `ulimit -n`, or lower --max-connections."
            );
            n
        }
        (Some(n), _) => n,
        (None, Some(room)) => DEFAULT.min(room),
        (None, None) => DEFAULT,
    }
}

/// This process's limit of open files (the soft one), where the system says it.
fn open_files_limit() -> Option<usize> {
    soft_open_files(&std::fs::read_to_string("/proc/self/limits").ok()?)
}

/// The soft limit of open files in the text of `/proc/self/limits` (None: unlimited).
fn soft_open_files(limits: &str) -> Option<usize> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_positive_finite_and_at_most_a_year() {
        assert_eq!(seconds("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(seconds(" 10 "), Ok(Duration::from_secs(10)));
        for bad in ["0", "-1", "nan", "inf", "31536001", "ten", ""] {
            let err = seconds(bad).unwrap_err();
            assert!(err.contains("not a number of seconds"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_soft_limit_of_open_files_is_read_from_proc() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max cpu time              unlimited            unlimited            seconds\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(soft_open_files(limits), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(soft_open_files(unlimited), None);
        assert_eq!(soft_open_files(""), None);
    }
}
