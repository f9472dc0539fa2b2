//! Stateful sessions of `serve --http --stateful`, bounded: rmcp's in-memory session manager
//! behind a cap on live sessions and two expiries, one short for a session that made no request
//! after `initialize` (what a flood of `initialize` posts leaves behind), one longer for a
//! session that went quiet after using the server.
//!
//! A session with a request in progress never expires, however long the request takes. A
//! sweeper closes expired sessions once a second, through rmcp, as a `DELETE` would.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, SessionConfig,
};
use rmcp::transport::streamable_http_server::session::ServerSseMessage;
use rmcp::transport::streamable_http_server::{SessionId, SessionManager};
use tokio_util::sync::CancellationToken;

/// How often expired sessions are looked for.
const SWEEP: Duration = Duration::from_secs(1);

/// The caps and expiries of stateful sessions.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SessionLimits {
    /// Live sessions at most; `initialize` past it is refused.
    pub(crate) max: usize,
    /// Live sessions at most made by one peer (see `limits::peer_key`).
    pub(crate) max_per_peer: usize,
    /// A session that made no request after `initialize` is closed this long after it began.
    pub(crate) unused_expiry: Duration,
    /// A session with no request in progress is closed this long after its last request.
    pub(crate) idle_expiry: Duration,
}

/// Why a session could not be made or used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionsError {
    #[error("the server holds its most live sessions ({0}); close one (HTTP DELETE) or try again when one expires")]
    Full(usize),
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
}

/// rmcp's [`LocalSessionManager`], with [`SessionLimits`].
#[derive(Debug)]
pub(crate) struct BoundedSessions {
    inner: LocalSessionManager,
    limits: SessionLimits,
    /// The live sessions, and how many requests hold a place for one they may make.
    live: Mutex<Live>,
}

#[derive(Debug, Default)]
struct Live {
    sessions: HashMap<SessionId, Usage>,
    reserved: usize,
    reserved_by_peer: HashMap<IpAddr, usize>,
}

/// Which cap a refused `initialize` met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Full {
    /// The server's.
    All(usize),
    /// The peer's.
    Peer(usize),
}

#[derive(Debug)]
struct Usage {
    /// The peer that made it (None until the request that made it says which).
    peer: Option<IpAddr>,
    began: Instant,
    /// When the last request came (None: none yet after `initialize`).
    last_request: Option<Instant>,
    /// Its requests in progress, and when the last one ended.
    in_progress: Arc<Progress>,
}

#[derive(Debug, Default)]
struct Progress {
    /// Response streams still open: while one is, the session does not expire.
    open: AtomicUsize,
    ended: Mutex<Option<Instant>>,
}

impl Progress {
    fn last_ended(&self) -> Option<Instant> {
        *self.ended.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl BoundedSessions {
    /// Bounded sessions, swept until `stop` is cancelled.
    pub(crate) fn new(limits: SessionLimits, stop: CancellationToken) -> Arc<BoundedSessions> {
        let mut inner = LocalSessionManager::default();
        // The sweeper expires sessions instead: rmcp's own idle timer would end a session in the
        // middle of a long request that sends nothing.
        let mut config = SessionConfig::default();
        config.keep_alive = None;
        inner.session_config = config;
        let sessions = Arc::new(BoundedSessions {
            inner,
            limits,
            live: Mutex::new(Live::default()),
        });
        let weak = Arc::downgrade(&sessions);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = stop.cancelled() => return,
                }
                let Some(sessions) = weak.upgrade() else {
                    return;
                };
                sessions.sweep(Instant::now()).await;
            }
        });
        sessions
    }

    /// A place for the session a request from `peer` may make (an `initialize`), held until it
    /// is dropped; refused when the live sessions and the places held reach a cap (the server's,
    /// or the peer's). Taken before the request reaches rmcp, so that concurrent `initialize`
    /// posts past a cap are all refused cleanly.
    pub(crate) fn reserve(self: &Arc<Self>, peer: IpAddr) -> Result<Reservation, Full> {
        let mut live = self.live();
        if live.sessions.len() + live.reserved >= self.limits.max {
            return Err(Full::All(self.limits.max));
        }
        let of_peer = live
            .sessions
            .values()
            .filter(|usage| usage.peer == Some(peer))
            .count()
            + live.reserved_by_peer.get(&peer).copied().unwrap_or(0);
        if of_peer >= self.limits.max_per_peer {
            return Err(Full::Peer(self.limits.max_per_peer));
        }
        live.reserved += 1;
        *live.reserved_by_peer.entry(peer).or_default() += 1;
        Ok(Reservation {
            sessions: Arc::clone(self),
            peer,
        })
    }

    fn live(&self) -> std::sync::MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the sessions expired at `now` out of the live ones, in one step, so that a request
    /// that comes meanwhile either keeps its session or finds it gone.
    fn take_expired(&self, now: Instant) -> Vec<SessionId> {
        let mut live = self.live();
        let expired: Vec<SessionId> = live
            .sessions
            .iter()
            .filter(|(_, usage)| usage.expired(now, &self.limits))
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            live.sessions.remove(id);
        }
        expired
    }

    async fn sweep(&self, now: Instant) {
        for id in self.take_expired(now) {
            tracing::debug!(session = %id, "closing an expired session");
            if let Err(e) = self.inner.close_session(&id).await {
                tracing::debug!(session = %id, error = %e, "closing an expired session failed");
            }
        }
    }

    /// Notes a request on `id` and returns what marks it in progress while its stream lives.
    fn request(&self, id: &SessionId) -> Option<InProgress> {
        let mut live = self.live();
        let usage = live.sessions.get_mut(id)?;
        usage.last_request = Some(Instant::now());
        usage.in_progress.open.fetch_add(1, Ordering::AcqRel);
        Some(InProgress(Arc::clone(&usage.in_progress)))
    }
}

impl Usage {
    fn expired(&self, now: Instant, limits: &SessionLimits) -> bool {
        if self.in_progress.open.load(Ordering::Acquire) > 0 {
            return false;
        }
        match self.last_request.max(self.in_progress.last_ended()) {
            None => now.saturating_duration_since(self.began) >= limits.unused_expiry,
            Some(last) => now.saturating_duration_since(last) >= limits.idle_expiry,
        }
    }
}

/// A place held for a session (see [`BoundedSessions::reserve`]).
#[derive(Debug)]
pub(crate) struct Reservation {
    sessions: Arc<BoundedSessions>,
    peer: IpAddr,
}

impl Reservation {
    /// The session `id` was made in this place: it counts as its peer's from now on.
    pub(crate) fn claim(&self, id: &str) {
        let mut live = self.sessions.live();
        if let Some(usage) = live.sessions.get_mut(id) {
            usage.peer = Some(self.peer);
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut live = self.sessions.live();
        live.reserved -= 1;
        if let Some(n) = live.reserved_by_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                live.reserved_by_peer.remove(&self.peer);
            }
        }
    }
}

/// A response stream in progress on a session.
#[derive(Debug)]
struct InProgress(Arc<Progress>);

impl Drop for InProgress {
    fn drop(&mut self) {
        // The time first: the sweeper sees the request either open or ended now.
        *self.0.ended.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A session's response stream that marks a request in progress until it is dropped.
struct Tracked<S> {
    stream: Pin<Box<S>>,
    _in_progress: Option<InProgress>,
}

impl<S: Stream> Stream for Tracked<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        self.stream.as_mut().poll_next(cx)
    }
}

impl SessionManager for BoundedSessions {
    type Error = SessionsError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        // The HTTP layer holds a place for every request that may make a session, and refuses
        // those past the cap with a clear answer: this is the last line.
        if self.live().sessions.len() >= self.limits.max {
            return Err(SessionsError::Full(self.limits.max));
        }
        let (id, transport) = self.inner.create_session().await?;
        self.live().sessions.insert(
            id.clone(),
            Usage {
                peer: None,
                began: Instant::now(),
                last_request: None,
                in_progress: Arc::new(Progress::default()),
            },
        );
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.live().sessions.remove(id);
        Ok(self.inner.close_session(id).await?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let in_progress = self.request(id);
        let stream = self.inner.create_stream(id, message).await?;
        Ok(Tracked {
            stream: Box::pin(stream),
            _in_progress: in_progress,
        })
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        // A notification or a response to the server: not a request (`notifications/initialized`
        // comes right after `initialize` and does not make a session used).
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        // A GET stream waits for what the server sends by itself: it does not keep the session
        // alive, or one idle client could hold a session for ever.
        Ok(self.inner.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let in_progress = self.request(id);
        let stream = self.inner.resume(id, last_event_id).await?;
        Ok(Tracked {
            stream: Box::pin(stream),
            _in_progress: in_progress,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn limits() -> SessionLimits {
        SessionLimits {
            max: 2,
            max_per_peer: 2,
            unused_expiry: Duration::from_secs(30),
            idle_expiry: Duration::from_secs(600),
        }
    }

    fn usage(began: Instant, last_request: Option<Instant>, in_progress: usize) -> Usage {
        Usage {
            peer: None,
            began,
            last_request,
            in_progress: Arc::new(Progress {
                open: AtomicUsize::new(in_progress),
                ended: Mutex::new(None),
            }),
        }
    }

    #[test]
    fn an_unused_session_expires_after_the_short_expiry() {
        let t0 = Instant::now();
        let unused = usage(t0, None, 0);
        assert!(!unused.expired(t0 + Duration::from_secs(29), &limits()));
        assert!(unused.expired(t0 + Duration::from_secs(30), &limits()));
    }

    #[test]
    fn a_used_session_expires_after_the_long_one_from_its_last_request() {
        let t0 = Instant::now();
        let used = usage(t0, Some(t0 + Duration::from_secs(100)), 0);
        assert!(!used.expired(t0 + Duration::from_secs(650), &limits()));
        assert!(used.expired(t0 + Duration::from_secs(700), &limits()));
    }

    #[test]
    fn the_idle_expiry_counts_from_the_end_of_the_last_request() {
        let t0 = Instant::now();
        let long = usage(t0, Some(t0), 1);
        // A request that began at t0 and ran for 20 minutes.
        *long.in_progress.ended.lock().unwrap() = Some(t0 + Duration::from_secs(1200));
        long.in_progress.open.store(0, Ordering::Release);
        assert!(!long.expired(t0 + Duration::from_secs(1500), &limits()));
        assert!(long.expired(t0 + Duration::from_secs(1800), &limits()));
    }

    #[test]
    fn a_session_with_a_request_in_progress_never_expires() {
        let t0 = Instant::now();
        for last in [None, Some(t0)] {
            let busy = usage(t0, last, 1);
            assert!(!busy.expired(t0 + Duration::from_secs(86_400), &limits()));
        }
    }

    #[tokio::test]
    async fn past_the_cap_no_session_is_made_and_a_closed_one_frees_its_place() {
        let sessions = BoundedSessions::new(limits(), CancellationToken::new());
        let (a, _ta) = sessions.create_session().await.unwrap();
        let (_b, _tb) = sessions.create_session().await.unwrap();
        assert_eq!(sessions.reserve(PEER).unwrap_err(), Full::All(2));
        let err = sessions.create_session().await.err().unwrap();
        assert!(matches!(err, SessionsError::Full(2)), "{err}");
        sessions.close_session(&a).await.unwrap();
        let place = sessions.reserve(PEER).expect("a place again");
        assert!(sessions.reserve(PEER).is_err(), "the place is held");
        assert!(sessions.create_session().await.is_ok());
        drop(place);
        assert!(
            sessions.reserve(PEER).is_err(),
            "the session took the place"
        );
    }

    #[tokio::test]
    async fn places_held_count_toward_the_cap_until_dropped() {
        let sessions = BoundedSessions::new(limits(), CancellationToken::new());
        let first = sessions.reserve(PEER).unwrap();
        let _second = sessions.reserve(PEER).unwrap();
        assert!(sessions.reserve(PEER).is_err());
        drop(first);
        assert!(sessions.reserve(PEER).is_ok());
    }

    #[tokio::test]
    async fn one_peer_holds_at_most_its_share_of_sessions() {
        let mut limits = limits();
        limits.max = 10;
        let sessions = BoundedSessions::new(limits, CancellationToken::new());
        let other = IpAddr::from([10, 0, 0, 1]);
        for _ in 0..2 {
            let place = sessions.reserve(PEER).unwrap();
            let (id, _t) = sessions.create_session().await.unwrap();
            place.claim(&id);
        }
        assert_eq!(sessions.reserve(PEER).unwrap_err(), Full::Peer(2));
        let _theirs = sessions
            .reserve(other)
            .expect("another peer has its own share");
    }

    #[tokio::test]
    async fn the_sweep_closes_expired_sessions_only() {
        let sessions = BoundedSessions::new(limits(), CancellationToken::new());
        let (old, _t1) = sessions.create_session().await.unwrap();
        let (used, _t2) = sessions.create_session().await.unwrap();
        let _busy = sessions.request(&used);
        sessions
            .sweep(Instant::now() + Duration::from_secs(60))
            .await;
        assert!(!sessions.has_session(&old).await.unwrap());
        assert!(sessions.has_session(&used).await.unwrap());
        assert_eq!(sessions.live().sessions.len(), 1);
    }
}
