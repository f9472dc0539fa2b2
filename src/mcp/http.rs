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
//! explicitly), that carry two `Host` headers, or whose `Origin` is not a loopback origin (or
//! one allowed explicitly) are refused, which keeps a web page from reaching a local server by
//! DNS rebinding.
//!
//! The `Host` and `Origin` checks are in `checks.rs`. Misbehaving clients are bounded (see
//! `limits.rs` and `sessions.rs`): a request head must arrive within a few seconds, a connection
//! on which nothing moves is closed, connections are capped in all and per peer address,
//! stateful sessions are capped and expire, and a failing `accept` is logged at most once a
//! second.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::checks::{check, Refusal};
use super::limits::{
    peer_key, Activity, Admitted, Backoff, Busy, Connections, Refused, Throttled, Watched,
};
use super::server::{Server, MAX_MESSAGE};
use super::sessions::{BoundedSessions, Full as SessionsFull, SessionLimits};
use crate::runtime::Runtime;

/// The one path the server answers on.
pub const MCP_PATH: &str = "/mcp";

/// How long connections get to finish their requests once the server is asked to stop.
const GRACE: Duration = Duration::from_secs(5);

/// How often a repeated warning (accept errors, refused connections) may be written.
const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// What a connection refused over the cap is told before it is closed.
const REFUSED: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\n\
content-length: 51\r\nconnection: close\r\nretry-after: 1\r\n\r\n\
too many connections: close one or try again later\n";

/// How [`serve_http`] serves.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct HttpOptions {
    /// Keep a session per client (`Mcp-Session-Id`) in this process, instead of answering
    /// every request on its own. A session ties a client to one instance.
    pub stateful: bool,
    /// `Host` names (or `host:port`) accepted besides the loopback ones and the address the
    /// server is bound to, for a server reached by a name.
    pub allowed_hosts: Vec<String>,
    /// Browser origins (`https://app.example.com`, `http://host:*` for any port) accepted
    /// besides loopback ones and the bound address; a request with another `Origin` gets 403.
    /// Requests without `Origin` (clients other than browsers) are not affected.
    pub allowed_origins: Vec<String>,
    /// Connections open at once, all peers together (default 1,024).
    pub max_connections: usize,
    /// Connections open at once from one peer address (default 64).
    pub max_connections_per_peer: usize,
    /// A request's head must arrive within this of the connection opening or of the previous
    /// answer (default 10 s): a silent or slow connection is closed.
    pub header_timeout: Duration,
    /// A connection is closed when nothing has moved on it for this long with no request in
    /// progress, or when an answer could not be written for this long; a request's body must
    /// arrive within it too (default 60 s).
    pub idle_timeout: Duration,
    /// Live stateful sessions at most (default 1,024); `initialize` past it gets 503.
    pub max_sessions: usize,
    /// Live stateful sessions at most made from one peer address (default 256).
    pub max_sessions_per_peer: usize,
    /// A stateful session that made no request after `initialize` ends after this (default 30 s).
    pub unused_session_expiry: Duration,
    /// A stateful session with no request in progress ends this long after its last request
    /// (default 10 minutes).
    pub idle_session_expiry: Duration,
    /// Bearer tokens, their rights and tenants (`--auth FILE`): with them, a request without
    /// a listed token gets 401, and each tenant sees its own runs only. None: no
    /// authentication, one tenant.
    pub auth: Option<Arc<super::auth::Auth>>,
    /// Resume the store's running runs whose lease expired (their owner died or stalled),
    /// sweeping every half lease: `serve --take-over`. A run started with a per-run context
    /// is left to its caller. Default off.
    pub take_over: bool,
}

impl Default for HttpOptions {
    fn default() -> HttpOptions {
        HttpOptions {
            stateful: false,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_connections: 1024,
            max_connections_per_peer: 64,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_sessions: 1024,
            max_sessions_per_peer: 256,
            unused_session_expiry: Duration::from_secs(30),
            idle_session_expiry: Duration::from_secs(600),
            auth: None,
            take_over: false,
        }
    }
}

impl HttpOptions {
    /// Stateless, loopback hosts and origins only, the default limits.
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

    /// One more accepted browser origin, `scheme://host`, `scheme://host:port` or
    /// `scheme://host:*` (see [`HttpOptions::allowed_origins`]); an error says what is wrong
    /// with one that is not an origin.
    pub fn allow_origin(mut self, origin: &str) -> Result<HttpOptions, String> {
        self.allowed_origins.push(origin_entry(origin)?);
        Ok(self)
    }

    /// The caps on connections: in all, and per peer address (each at least 1).
    pub fn max_connections(mut self, total: usize, per_peer: usize) -> HttpOptions {
        self.max_connections = total.max(1);
        self.max_connections_per_peer = per_peer.max(1);
        self
    }

    /// The header-read and idle timeouts (see [`HttpOptions::header_timeout`]).
    pub fn timeouts(mut self, header: Duration, idle: Duration) -> HttpOptions {
        self.header_timeout = header;
        self.idle_timeout = idle;
        self
    }

    /// Requires a bearer token of `auth` on every request (see [`HttpOptions::auth`]).
    pub fn auth(mut self, auth: super::auth::Auth) -> HttpOptions {
        self.auth = Some(Arc::new(auth));
        self
    }

    /// Sweeps the store for runs whose lease expired and resumes them (see
    /// [`HttpOptions::take_over`]).
    pub fn take_over(mut self, take_over: bool) -> HttpOptions {
        self.take_over = take_over;
        self
    }

    /// The cap on live stateful sessions made from one peer address (at least 1).
    pub fn max_sessions_per_peer(mut self, max: usize) -> HttpOptions {
        self.max_sessions_per_peer = max.max(1);
        self
    }

    /// The cap on live stateful sessions and their two expiries (see
    /// [`HttpOptions::max_sessions`]).
    pub fn sessions(mut self, max: usize, unused_expiry: Duration, idle_expiry: Duration) -> Self {
        self.max_sessions = max.max(1);
        self.unused_session_expiry = unused_expiry;
        self.idle_session_expiry = idle_expiry;
        self
    }
}

/// An allowed origin as rmcp matches it: a missing port is the scheme's default (as browsers
/// send it), `:*` any port, `null` the opaque origin.
fn origin_entry(raw: &str) -> Result<String, String> {
    let raw = raw.trim();
    if raw.eq_ignore_ascii_case("null") {
        return Ok("null".to_string());
    }
    let (base, any_port) = match raw.strip_suffix(":*") {
        Some(base) => (base, true),
        None => (raw, false),
    };
    let bad = |why: &str| {
        format!(
            "`{raw}` is not an origin ({why}): give `scheme://host`, `scheme://host:port` or \
             `scheme://host:*`, e.g. `https://app.example.com`"
        )
    };
    let uri: hyper::Uri = base.parse().map_err(|_| bad("it does not parse"))?;
    let scheme = uri.scheme_str().ok_or_else(|| bad("no scheme"))?;
    let authority = uri.authority().ok_or_else(|| bad("no host"))?;
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(bad("an origin has no path"));
    }
    if authority.as_str().contains('@') {
        return Err(bad("an origin has no user name"));
    }
    let port = match (any_port, authority.port_u16()) {
        (true, None) => "*".to_string(),
        (true, Some(_)) => return Err(bad("a port and `:*`")),
        (false, Some(port)) => port.to_string(),
        (false, None) => match scheme {
            "http" => "80".to_string(),
            "https" => "443".to_string(),
            _ => return Err(bad("give the port: the scheme has no default one")),
        },
    };
    Ok(format!("{scheme}://{}:{port}", authority.host()))
}

/// The origins always accepted: loopback names and the bound address, any port, http or https.
fn default_origins(bound: Option<IpAddr>) -> Vec<String> {
    let mut hosts = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "[::1]".to_string(),
    ];
    if let Some(ip) = bound.filter(|ip| !ip.is_unspecified() && !ip.is_loopback()) {
        hosts.push(match ip {
            IpAddr::V4(ip) => ip.to_string(),
            IpAddr::V6(ip) => format!("[{ip}]"),
        });
    }
    hosts
        .iter()
        .flat_map(|host| ["http", "https"].map(|scheme| format!("{scheme}://{host}:*")))
        .collect()
}

/// What every connection shares.
#[derive(Clone)]
struct Shared {
    service: StreamableHttpService<Server, BoundedSessions>,
    /// The stateful sessions, to refuse `initialize` past their cap (None: stateless).
    sessions: Option<Arc<BoundedSessions>>,
    header_timeout: Duration,
    idle_timeout: Duration,
    /// What a client refused a session is told to wait (`Retry-After`).
    unused_session_expiry: Duration,
    /// The `Host` names and `Origin`s accepted (rmcp has the same lists).
    hosts: Arc<[String]>,
    origins: Arc<[String]>,
    /// Refused requests, said at most once a second.
    refusals: Arc<Mutex<Throttled>>,
    stop: CancellationToken,
    /// The tokens every request must carry one of, if any.
    auth: Option<Arc<super::auth::Auth>>,
    /// The handler, for the streaming endpoint (`stream_http.rs`).
    server: Server,
}

impl Shared {
    fn refused(&self, refusal: Refusal) {
        let due = self
            .refusals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .due(Instant::now());
        if let Some(held_back) = due {
            tracing::warn!(?refusal, held_back, "refused a request (Host or Origin)");
        }
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
    let mut server = Server::new(Arc::new(runtime));
    if let Some(auth) = &options.auth {
        server = server.with_auth(Arc::clone(auth));
    }
    std::thread::spawn(|| crate::policy::count(""));
    let stop = CancellationToken::new();
    let bound = listener.local_addr().ok().map(|addr| addr.ip());
    let mut hosts = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    if let Some(ip) = bound.filter(|ip| !ip.is_unspecified()) {
        hosts.push(ip.to_string());
    }
    hosts.extend(options.allowed_hosts.iter().cloned());
    let mut origins = default_origins(bound);
    origins.extend(options.allowed_origins.iter().cloned());
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(options.stateful)
        // Plain JSON for a plain answer (what curl users expect); SSE only when progress
        // notifications come first.
        .with_json_response(!options.stateful)
        .with_allowed_hosts(hosts.clone())
        .with_allowed_origins(origins.clone())
        .with_max_request_body_bytes(MAX_MESSAGE)
        .with_cancellation_token(stop.child_token());
    let sessions = BoundedSessions::new(
        SessionLimits {
            max: options.max_sessions,
            max_per_peer: options.max_sessions_per_peer,
            unused_expiry: options.unused_session_expiry,
            idle_expiry: options.idle_session_expiry,
        },
        stop.child_token(),
    );
    let handler = server.clone();
    let sweeper = options.take_over.then(|| {
        tokio::spawn(super::take_over::sweep_until(
            server.clone(),
            stop.child_token(),
        ))
    });
    let service =
        StreamableHttpService::new(move || Ok(server.clone()), Arc::clone(&sessions), config);
    let shared = Shared {
        service,
        sessions: options.stateful.then_some(sessions),
        header_timeout: options.header_timeout,
        idle_timeout: options.idle_timeout,
        unused_session_expiry: options.unused_session_expiry,
        hosts: hosts.into(),
        origins: origins.into(),
        refusals: Arc::new(Mutex::new(Throttled::new(LOG_INTERVAL))),
        stop: stop.clone(),
        auth: options.auth.clone(),
        server: handler,
    };
    let limits = Connections::new(options.max_connections, options.max_connections_per_peer);
    let connections = tokio_util::task::TaskTracker::new();
    let mut accept_log = Throttled::new(LOG_INTERVAL);
    let mut refusal_log = Throttled::new(LOG_INTERVAL);
    let mut backoff = Backoff::default();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => {
                    backoff.succeeded();
                    accepted
                }
                Err(e) => {
                    // Out of descriptors, or a connection reset before it was accepted: the
                    // listener itself is fine. Said once a second at most, and paused on.
                    if let Some(held_back) = accept_log.due(Instant::now()) {
                        tracing::warn!(error = %e, held_back, "accepting a connection failed");
                    }
                    tokio::time::sleep(backoff.failed()).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        match limits.admit(peer.ip()) {
            Ok(admitted) => {
                connections.spawn(connection(stream, peer, admitted, shared.clone()));
            }
            Err(refused) => {
                // Never waits: what does not fit in the socket's buffer is not sent.
                let _ = stream.try_write(REFUSED);
                if let Some(held_back) = refusal_log.due(Instant::now()) {
                    let cap = match refused {
                        Refused::Total => "the server's",
                        Refused::PerPeer => "this peer's",
                    };
                    tracing::warn!(
                        %peer,
                        held_back,
                        "refused a connection: {cap} connections are all busy (--max-connections, --max-connections-per-peer)"
                    );
                }
            }
        }
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
    // Runs taken over get the same grace; past it, the process's end leaves them to the
    // next instance when their lease expires.
    if let Some(sweeper) = sweeper {
        if tokio::time::timeout(GRACE, sweeper).await.is_err() {
            tracing::warn!("runs taken over still going after {GRACE:?}; leaving them");
        }
    }
}

/// Serves one connection until it ends, the server stops, it is closed to make room for a newer
/// one, or nothing moves on it for the idle timeout.
async fn connection(stream: TcpStream, peer: SocketAddr, admitted: Admitted, shared: Shared) {
    let activity = Activity::new();
    let io = TokioIo::new(Watched::new(stream, Arc::clone(&activity)));
    let busy = Arc::clone(&admitted.busy);
    let idle_timeout = shared.idle_timeout;
    let header_timeout = shared.header_timeout;
    let stop = shared.stop.clone();
    let handler = hyper::service::service_fn(move |request: Request<Incoming>| {
        let shared = shared.clone();
        let busy = Busy::new(&busy);
        async move {
            let response = answer(request, &shared, peer.ip()).await;
            // The connection stays busy until the answer is written to its end (an SSE stream
            // may last), so that it is never closed to make room while it answers.
            Ok::<_, Infallible>(response.map(|body| Guarded { body, _busy: busy }.boxed()))
        }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(io, handler);
    tokio::pin!(served);
    let result = tokio::select! {
        result = &mut served => result,
        () = stop.cancelled() => {
            served.as_mut().graceful_shutdown();
            served.await
        }
        () = admitted.close.cancelled() => {
            tracing::debug!(%peer, "closed an idle connection to make room for a new one");
            return;
        }
        () = stalled(&activity, &admitted, idle_timeout) => {
            tracing::debug!(%peer, "closed a connection on which nothing moved for {idle_timeout:?}");
            return;
        }
    };
    if let Err(e) = result {
        tracing::debug!(%peer, error = %e, "a connection ended with an error");
    }
}

/// Completes when nothing has moved on the connection for `idle` while no request was in
/// progress, or when an answer could not be written for `idle`.
async fn stalled(activity: &Activity, admitted: &Admitted, idle: Duration) {
    let every = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    loop {
        tokio::time::sleep(every).await;
        let idle_now = admitted.busy.load(std::sync::atomic::Ordering::Acquire) == 0;
        if (idle_now && activity.quiet_for() >= idle) || activity.write_blocked_for() >= idle {
            return;
        }
    }
}

/// The answer to one request: `/mcp` goes to rmcp, after the checks rmcp does not make.
async fn answer(
    request: Request<Incoming>,
    shared: &Shared,
    peer: IpAddr,
) -> Response<BoxBody<Bytes, Infallible>> {
    let streamed = request.uri().path() == super::stream_http::STREAM_PATH;
    if !streamed && request.uri().path() != MCP_PATH {
        return plain(
            StatusCode::NOT_FOUND,
            format!("not found: the MCP endpoint is {MCP_PATH}\n"),
        );
    }
    if let Err(refusal) = check(
        request.uri(),
        request.headers(),
        &shared.hosts,
        &shared.origins,
    ) {
        shared.refused(refusal);
        let (status, text) = refusal.answer();
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
        return plain(status, text.to_string());
    }
    // Who asks, before anything else is done for them: a request without a listed token is
    // refused here, and never reaches the MCP layer.
    let caller = match &shared.auth {
        Some(auth) => match super::auth::caller_of(auth, request.headers()) {
            Ok(caller) => Some(caller),
            Err(why) => return unauthorized(why),
        },
        None => None,
    };
    if streamed {
        return super::stream_http::answer(request, &shared.server, caller, shared.idle_timeout)
            .await;
    }
    // A place for the session an `initialize` makes, held until the answer is made.
    let place = match &shared.sessions {
        Some(sessions) if opens_a_session(&request) => match sessions.reserve(peer_key(peer)) {
            Ok(place) => Some(place),
            Err(full) => return sessions_full(full, shared.unused_session_expiry),
        },
        _ => None,
    };
    let (mut parts, body) = request.into_parts();
    if let Some(caller) = caller {
        // rmcp hands the request's parts to the handler, which reads the caller from them.
        parts.extensions.insert(caller);
    }
    // The whole body first, bounded in size and time, so that a client that sends it slowly
    // holds no more than its connection.
    let body = match tokio::time::timeout(
        shared.idle_timeout,
        Limited::new(body, MAX_MESSAGE).collect(),
    )
    .await
    {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(e))
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            return plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("payload too large: a message has at most {MAX_MESSAGE} bytes\n"),
            );
        }
        Ok(Err(e)) => {
            return plain(
                StatusCode::BAD_REQUEST,
                format!("bad request: reading the body failed: {e}\n"),
            );
        }
        Err(_) => {
            return plain(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "request timeout: the body did not arrive within {:?}\n",
                    shared.idle_timeout
                ),
            );
        }
    };
    let response = shared
        .service
        .handle(Request::from_parts(parts, Full::new(body)))
        .await;
    if let Some(place) = place {
        if let Some(id) = response.headers().get("mcp-session-id") {
            place.claim(id.to_str().unwrap_or_default());
        }
    }
    response
}

/// Whether rmcp would make a session for this request: a POST without `Mcp-Session-Id` (an
/// `initialize`; anything else without one is refused by rmcp).
fn opens_a_session<B>(request: &Request<B>) -> bool {
    request.method() == Method::POST && !request.headers().contains_key("mcp-session-id")
}

/// 503 with a JSON-RPC error body, for an `initialize` past a cap on sessions.
fn sessions_full(full: SessionsFull, retry: Duration) -> Response<BoxBody<Bytes, Infallible>> {
    let message = match full {
        SessionsFull::All(max) => format!(
            "the server holds its most live sessions ({max}, --max-sessions): close a session \
             (HTTP DELETE with its Mcp-Session-Id) or try again when one expires"
        ),
        SessionsFull::Peer(max) => format!(
            "your address holds its most live sessions ({max}, --max-sessions-per-peer): close \
             a session (HTTP DELETE with its Mcp-Session-Id) or try again when one expires"
        ),
    };
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": -32000, "message": message},
    });
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(
        RETRY_AFTER,
        HeaderValue::from(retry.as_secs().clamp(1, 3600)),
    );
    response
}

/// 401 with `WWW-Authenticate: Bearer`, for a request without a listed token.
fn unauthorized(why: &'static str) -> Response<BoxBody<Bytes, Infallible>> {
    let mut response = plain(
        StatusCode::UNAUTHORIZED,
        format!("unauthorized: {why}: send `Authorization: Bearer TOKEN` with a token the server lists\n"),
    );
    let challenge = if why.starts_with("no ") {
        "Bearer"
    } else {
        "Bearer error=\"invalid_token\""
    };
    response.headers_mut().insert(
        hyper::header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    response
}

fn plain(status: StatusCode, text: String) -> Response<BoxBody<Bytes, Infallible>> {
    let mut response = Response::new(Full::new(Bytes::from(text)).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// An answer's body that keeps its connection marked busy until it is written or dropped.
struct Guarded {
    body: BoxBody<Bytes, Infallible>,
    _busy: Busy,
}

impl hyper::body::Body for Guarded {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_of_a_connection_is_a_whole_http_answer() {
        let text = std::str::from_utf8(REFUSED).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(length, body.len());
        assert!(head.starts_with("HTTP/1.1 503 "));
    }

    #[test]
    fn origins_are_normalized_with_their_port() {
        assert_eq!(
            origin_entry("https://app.example.com").unwrap(),
            "https://app.example.com:443"
        );
        assert_eq!(
            origin_entry("http://app.example.com/").unwrap(),
            "http://app.example.com:80"
        );
        assert_eq!(
            origin_entry("http://host:8080").unwrap(),
            "http://host:8080"
        );
        assert_eq!(origin_entry("http://host:*").unwrap(), "http://host:*");
        assert_eq!(origin_entry("null").unwrap(), "null");
    }

    #[test]
    fn what_is_not_an_origin_is_refused_with_the_form_to_give() {
        for bad in [
            "app.example.com",
            "https://app.example.com/path",
            "https://app.example.com?q=1",
            "https://user@app.example.com",
            "https://app.example.com:443:*",
            "ftp://files.example.com",
            "",
        ] {
            let err = origin_entry(bad).unwrap_err();
            assert!(err.contains("scheme://host"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_bound_address_is_an_origin_unless_it_is_unspecified() {
        let none = default_origins(Some(IpAddr::from([0, 0, 0, 0])));
        assert_eq!(none, default_origins(None));
        let some = default_origins(Some(IpAddr::from([10, 1, 2, 3])));
        assert!(some.contains(&"http://10.1.2.3:*".to_string()));
        let v6 = default_origins(Some("fd00::1".parse().unwrap()));
        assert!(v6.contains(&"https://[fd00::1]:*".to_string()));
        assert!(none.contains(&"http://[::1]:*".to_string()));
    }
}
