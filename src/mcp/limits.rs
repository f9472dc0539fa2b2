//! What keeps `serve --http` answering when clients misbehave: a cap on open connections (in
//! all, and per peer address), a clock of each connection's last byte for the idle timeout, and
//! a log that says a repeated failure at most once a second.
//!
//! Over a cap, the oldest connection that has no request in progress (one still waiting for its
//! request head, or an idle keep-alive one) makes room for the new one; only when every
//! connection is working on a request is the new one refused. Half-open connections therefore
//! never keep a legitimate request out: they are the first to go.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;

/// The open connections, so that a new one can be admitted, can make room, or be refused.
#[derive(Debug)]
pub(crate) struct Connections {
    max_total: usize,
    max_per_peer: usize,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    /// Every admitted connection by its number (numbers grow: the smallest is the oldest).
    by_id: HashMap<u64, Entry>,
    /// How many of them each peer address holds.
    per_peer: HashMap<IpAddr, usize>,
    next_id: u64,
}

#[derive(Debug)]
struct Entry {
    peer: IpAddr,
    /// Requests in progress on the connection: a connection with none may be closed to make room.
    busy: Arc<AtomicUsize>,
    /// Cancelled to close the connection.
    close: CancellationToken,
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Every one of the server's connections has a request in progress.
    Total,
    /// Every one of this peer's connections has a request in progress.
    PerPeer,
}

/// An admitted connection: its slot is given back when this is dropped.
#[derive(Debug)]
pub(crate) struct Admitted {
    connections: Arc<Connections>,
    id: u64,
    /// Requests in progress: raised by the connection's handler while it works on one.
    pub(crate) busy: Arc<AtomicUsize>,
    /// Cancelled when the connection must close to make room for a newer one.
    pub(crate) close: CancellationToken,
}

impl Connections {
    /// At most `max_total` connections open, at most `max_per_peer` from one address (both at
    /// least 1).
    pub(crate) fn new(max_total: usize, max_per_peer: usize) -> Arc<Connections> {
        Arc::new(Connections {
            max_total: max_total.max(1),
            max_per_peer: max_per_peer.max(1),
            open: Mutex::new(Open::default()),
        })
    }

    /// Admits a connection from `peer`, closing the oldest idle one (of this peer, or of all)
    /// if a cap is reached; refused if no connection is idle.
    pub(crate) fn admit(self: &Arc<Connections>, peer: IpAddr) -> Result<Admitted, Refused> {
        let peer = peer_key(peer);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.per_peer.get(&peer).copied().unwrap_or(0) >= self.max_per_peer
            && !open.evict_oldest_idle(Some(peer))
        {
            return Err(Refused::PerPeer);
        }
        if open.by_id.len() >= self.max_total && !open.evict_oldest_idle(None) {
            return Err(Refused::Total);
        }
        let id = open.next_id;
        open.next_id += 1;
        let busy = Arc::new(AtomicUsize::new(0));
        let close = CancellationToken::new();
        open.by_id.insert(
            id,
            Entry {
                peer,
                busy: Arc::clone(&busy),
                close: close.clone(),
            },
        );
        *open.per_peer.entry(peer).or_default() += 1;
        Ok(Admitted {
            connections: Arc::clone(self),
            id,
            busy,
            close,
        })
    }

    /// Connections open now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.open.lock().unwrap().by_id.len()
    }
}

/// What counts as one peer: an IPv4 address (also when mapped into IPv6), or an IPv6 /64, the
/// block one host usually holds whole.
pub(crate) fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut segments = v6.segments();
                segments[4..].fill(0);
                IpAddr::from(segments)
            }
        },
    }
}

impl Open {
    /// Closes the oldest connection with no request in progress (of `peer` only, if given) and
    /// gives its slot back at once; false if there is none.
    fn evict_oldest_idle(&mut self, peer: Option<IpAddr>) -> bool {
        let oldest = self
            .by_id
            .iter()
            .filter(|(_, e)| peer.is_none_or(|p| e.peer == p))
            .filter(|(_, e)| e.busy.load(Ordering::Acquire) == 0)
            .map(|(id, _)| *id)
            .min();
        match oldest {
            Some(id) => {
                self.remove(id);
                true
            }
            None => false,
        }
    }

    fn remove(&mut self, id: u64) {
        let Some(entry) = self.by_id.remove(&id) else {
            return;
        };
        entry.close.cancel();
        if let Some(n) = self.per_peer.get_mut(&entry.peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&entry.peer);
            }
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self
            .connections
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        open.remove(self.id);
    }
}

/// Marks a request in progress on a connection while it lives.
#[derive(Debug)]
pub(crate) struct Busy(Arc<AtomicUsize>);

impl Busy {
    pub(crate) fn new(count: &Arc<AtomicUsize>) -> Busy {
        count.fetch_add(1, Ordering::AcqRel);
        Busy(Arc::clone(count))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// When a connection last moved a byte, and since when a write of it has waited, in
/// milliseconds since it opened.
#[derive(Debug)]
pub(crate) struct Activity {
    opened: Instant,
    last_ms: AtomicU64,
    /// [`NOT_BLOCKED`] while no write waits for the peer to read.
    write_blocked_ms: AtomicU64,
}

const NOT_BLOCKED: u64 = u64::MAX;

impl Activity {
    pub(crate) fn new() -> Arc<Activity> {
        Arc::new(Activity {
            opened: Instant::now(),
            last_ms: AtomicU64::new(0),
            write_blocked_ms: AtomicU64::new(NOT_BLOCKED),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(NOT_BLOCKED - 1)
    }

    fn touch(&self) {
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    fn wrote(&self, polled: &Poll<io::Result<usize>>) {
        match polled {
            Poll::Pending => {
                let _ = self.write_blocked_ms.compare_exchange(
                    NOT_BLOCKED,
                    self.now_ms(),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
            Poll::Ready(result) => {
                self.write_blocked_ms.store(NOT_BLOCKED, Ordering::Relaxed);
                if matches!(result, Ok(n) if *n > 0) {
                    self.touch();
                }
            }
        }
    }

    /// How long a write has waited for the peer to read (zero when none waits).
    pub(crate) fn write_blocked_for(&self) -> Duration {
        match self.write_blocked_ms.load(Ordering::Relaxed) {
            NOT_BLOCKED => Duration::ZERO,
            since => self
                .opened
                .elapsed()
                .saturating_sub(Duration::from_millis(since)),
        }
    }

    /// How long since the last byte moved.
    pub(crate) fn quiet_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.opened.elapsed().saturating_sub(last)
    }
}

/// A stream that notes in an [`Activity`] every time a byte is read or written.
#[derive(Debug)]
pub(crate) struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> Watched<S> {
    pub(crate) fn new(inner: S, activity: Arc<Activity>) -> Watched<S> {
        Watched { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        self.activity.wrote(&polled);
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.activity.wrote(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A warning that may repeat many times a second (accept errors, refused connections): written
/// at most once per interval, with the number of repeats held back since the last line.
#[derive(Debug)]
pub(crate) struct Throttled {
    interval: Duration,
    last: Option<Instant>,
    held_back: u64,
}

impl Throttled {
    pub(crate) fn new(interval: Duration) -> Throttled {
        Throttled {
            interval,
            last: None,
            held_back: 0,
        }
    }

    /// `Some(n)` when a line is due now, `n` being how many were held back before it; `None`
    /// when this one is held back.
    pub(crate) fn due(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < self.interval)
        {
            self.held_back += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held_back))
    }
}

/// The pause after a failed accept: short at first, doubling while failures go on, so that the
/// loop neither spins on an error that lasts (out of descriptors) nor waits long after it ends.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    failures: u32,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MOST: Duration = Duration::from_millis(500);

    pub(crate) fn failed(&mut self) -> Duration {
        let pause = Self::FIRST.saturating_mul(1 << self.failures.min(16));
        self.failures = self.failures.saturating_add(1);
        pause.min(Self::MOST)
    }

    pub(crate) fn succeeded(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn an_idle_connection_makes_room_for_a_new_one() {
        let connections = Connections::new(2, 2);
        let first = connections.admit(ip(1)).unwrap();
        let second = connections.admit(ip(2)).unwrap();
        let third = connections.admit(ip(3)).unwrap();
        assert!(first.close.is_cancelled(), "the oldest idle one goes");
        assert!(!second.close.is_cancelled());
        assert!(!third.close.is_cancelled());
        assert_eq!(connections.len(), 2);
        drop(first); // its slot was given back already: dropping it frees nothing more
        assert_eq!(connections.len(), 2);
    }

    #[test]
    fn busy_connections_are_kept_and_the_new_one_refused() {
        let connections = Connections::new(2, 2);
        let first = connections.admit(ip(1)).unwrap();
        let second = connections.admit(ip(2)).unwrap();
        let _a = Busy::new(&first.busy);
        let _b = Busy::new(&second.busy);
        assert_eq!(connections.admit(ip(3)).unwrap_err(), Refused::Total);
        assert!(!first.close.is_cancelled() && !second.close.is_cancelled());
        drop(_a);
        let third = connections.admit(ip(3)).unwrap();
        assert!(first.close.is_cancelled(), "idle again, so it may go");
        assert!(!third.close.is_cancelled());
    }

    #[test]
    fn one_peer_makes_room_among_its_own_connections_only() {
        let connections = Connections::new(10, 2);
        let other = connections.admit(ip(9)).unwrap();
        let a = connections.admit(ip(1)).unwrap();
        let b = connections.admit(ip(1)).unwrap();
        let c = connections.admit(ip(1)).unwrap();
        assert!(a.close.is_cancelled());
        assert!(
            !other.close.is_cancelled(),
            "another peer's connection stays"
        );
        let _b = Busy::new(&b.busy);
        let _c = Busy::new(&c.busy);
        assert_eq!(connections.admit(ip(1)).unwrap_err(), Refused::PerPeer);
        assert!(connections.admit(ip(2)).is_ok());
    }

    #[test]
    fn a_closed_connection_gives_its_slot_back() {
        let connections = Connections::new(1, 1);
        let first = connections.admit(ip(1)).unwrap();
        let _busy = Busy::new(&first.busy);
        assert!(connections.admit(ip(1)).is_err());
        drop(_busy);
        drop(first);
        assert_eq!(connections.len(), 0);
        assert!(connections.admit(ip(1)).is_ok());
    }

    #[test]
    fn an_ipv6_block_is_one_peer_and_a_mapped_ipv4_address_its_own() {
        let connections = Connections::new(10, 1);
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        let first = connections.admit(a).unwrap();
        let _busy = Busy::new(&first.busy);
        assert_eq!(connections.admit(b).unwrap_err(), Refused::PerPeer);
        assert!(connections.admit(other).is_ok());
        let v4 = connections.admit(ip(7)).unwrap();
        let _busy_v4 = Busy::new(&v4.busy);
        let mapped: IpAddr = "::ffff:10.0.0.7".parse().unwrap();
        assert_eq!(connections.admit(mapped).unwrap_err(), Refused::PerPeer);
    }

    #[test]
    fn zero_caps_still_admit_one() {
        let connections = Connections::new(0, 0);
        assert!(connections.admit(ip(1)).is_ok());
    }

    #[tokio::test]
    async fn a_write_the_peer_does_not_read_is_seen_blocked_until_it_goes_through() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (ours, mut theirs) = tokio::io::duplex(16);
        let activity = Activity::new();
        let mut watched = Watched::new(ours, Arc::clone(&activity));
        assert_eq!(activity.write_blocked_for(), Duration::ZERO);
        // 16 bytes fit; the next write waits for the peer to read.
        watched.write_all(&[0; 16]).await.unwrap();
        let blocked = tokio::time::timeout(Duration::from_millis(50), watched.write_all(&[1; 8]));
        assert!(blocked.await.is_err(), "the write waits");
        assert!(activity.write_blocked_for() > Duration::ZERO);
        let mut buf = [0; 16];
        theirs.read_exact(&mut buf).await.unwrap();
        watched.write_all(&[2; 8]).await.unwrap();
        assert_eq!(
            activity.write_blocked_for(),
            Duration::ZERO,
            "no longer blocked"
        );
        assert!(
            activity.quiet_for() < Duration::from_secs(5),
            "the write moved bytes"
        );
    }

    #[test]
    fn a_repeated_warning_is_written_once_per_interval_with_a_count() {
        let mut log = Throttled::new(Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(log.due(t0), Some(0));
        for i in 1..=99 {
            assert_eq!(log.due(t0 + Duration::from_millis(i * 5)), None);
        }
        assert_eq!(log.due(t0 + Duration::from_millis(1000)), Some(99));
        assert_eq!(log.due(t0 + Duration::from_millis(1001)), None);
    }

    #[test]
    fn backoff_grows_to_a_bound_and_starts_over() {
        let mut backoff = Backoff::default();
        let first = backoff.failed();
        let second = backoff.failed();
        assert!(second > first);
        for _ in 0..100 {
            assert!(backoff.failed() <= Backoff::MOST);
        }
        backoff.succeeded();
        assert_eq!(backoff.failed(), first);
    }
}
