//! `toolscript serve --http`: the same handler as on stdio, served over MCP Streamable HTTP at
//! `/mcp` with rmcp's `StreamableHttpService` on a plain hyper HTTP/1.1 server.
//!
//! Stateless by default: every POST is a whole exchange, answered as JSON (or as a short SSE
//! stream when progress notifications precede the result), and no session lives in the
//! process. Several instances may then sit behind one load balancer; what outlives a request
//! — paused runs, artifacts — lives in the store. Stateful sessions (`Mcp-Session-Id`, a GET
//! stream, resumable SSE) are an option for clients that want them.
//!
//! No authentication is built in: bind to loopback, or put the server behind a proxy that
//! authenticates. Requests whose `Host` header is not a loopback name (or one allowed
//! explicitly) are refused, which keeps a web page from reaching a local server by DNS
//! rebinding.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::server::{Server, MAX_MESSAGE};
use crate::runtime::Runtime;

/// The one path the server answers on.
pub const MCP_PATH: &str = "/mcp";

/// How long connections get to finish their requests once the server is asked to stop.
const GRACE: Duration = Duration::from_secs(5);

/// How [`serve_http`] serves.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct HttpOptions {
    /// Keep a session per client (`Mcp-Session-Id`) in this process, instead of answering
    /// every request on its own. A session ties a client to one instance.
    pub stateful: bool,
    /// `Host` names (or `host:port`) accepted besides the loopback ones and the address the
    /// server is bound to, for a server reached by a name.
    pub allowed_hosts: Vec<String>,
}

impl HttpOptions {
    /// Stateless, loopback hosts only.
    pub fn new() -> HttpOptions {
        HttpOptions::default()
    }

    /// Sessions kept in this process (see [`HttpOptions::stateful`]).
    pub fn stateful(mut self, stateful: bool) -> HttpOptions {
        self.stateful = stateful;
        self
    }

    /// One more accepted `Host` name (see [`HttpOptions::allowed_hosts`]).
    pub fn allow_host(mut self, host: impl Into<String>) -> HttpOptions {
        self.allowed_hosts.push(host.into());
        self
    }
}

/// Serves `runtime` over MCP Streamable HTTP at [`MCP_PATH`] on `listener` until `shutdown`
/// completes; then it accepts no more connections and gives those open a few seconds to
/// finish. Bind the listener yourself (its address may have port 0: `local_addr` says which
/// port it got).
pub async fn serve_http(
    runtime: Runtime,
    listener: TcpListener,
    options: HttpOptions,
    shutdown: impl Future<Output = ()>,
) {
    let server = Server::new(Arc::new(runtime));
    std::thread::spawn(|| crate::policy::count(""));
    let stop = CancellationToken::new();
    let mut hosts = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    if let Ok(addr) = listener.local_addr() {
        if !addr.ip().is_unspecified() {
            hosts.push(addr.ip().to_string());
        }
    }
    hosts.extend(options.allowed_hosts);
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(options.stateful)
        // Plain JSON for a plain answer (what curl users expect); SSE only when progress
        // notifications come first.
        .with_json_response(!options.stateful)
        .with_allowed_hosts(hosts)
        .with_max_request_body_bytes(MAX_MESSAGE)
        .with_cancellation_token(stop.child_token());
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let connections = tokio_util::task::TaskTracker::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, or a connection reset before it was accepted: the
                    // listener itself is fine.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        connections.spawn(connection(stream, peer, service.clone(), stop.clone()));
    }
    tracing::info!("stopping: no new connections");
    stop.cancel();
    connections.close();
    if tokio::time::timeout(GRACE, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after {GRACE:?}; closing them");
    }
}

/// Serves one connection: `/mcp` goes to rmcp, anything else is a 404.
async fn connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    service: StreamableHttpService<Server, LocalSessionManager>,
    stop: CancellationToken,
) {
    let handler = hyper::service::service_fn(move |request: Request<Incoming>| {
        let service = service.clone();
        async move {
            if request.uri().path() != MCP_PATH {
                let mut response = Response::new(
                    http_body_util::Full::new(hyper::body::Bytes::from(format!(
                        "not found: the MCP endpoint is {MCP_PATH}\n"
                    )))
                    .boxed(),
                );
                *response.status_mut() = StatusCode::NOT_FOUND;
                return Ok::<_, Infallible>(response);
            }
            Ok(service.handle(request).await)
        }
    });
    let served =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), handler);
    tokio::pin!(served);
    let result = tokio::select! {
        result = &mut served => result,
        () = stop.cancelled() => {
            served.as_mut().graceful_shutdown();
            served.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "a connection ended with an error");
    }
}
