//! Simulated latency that is as long as it says. The async runtime's timer fires on whole
//! milliseconds, rounded up, so that `sleep_until(t)` ends about a millisecond late: a 20 ms
//! read measured 21.3 ms, and every benchmark over simulated tools paid it per round. A latency
//! is waited out on the runtime's timer to within a couple of milliseconds of its end, then on
//! one thread of the process that sleeps to the earliest pending end and wakes each call there.

use std::collections::BinaryHeap;
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// What the runtime's timer is left to wait: its rounding is less than this.
const COARSE_MARGIN: Duration = Duration::from_millis(2);

/// Waits until `end`, to within the operating system's thread wake-up (tens of microseconds).
pub(super) async fn sleep_until(end: Instant) {
    let coarse = end.checked_sub(COARSE_MARGIN);
    if let Some(coarse) = coarse.filter(|c| *c > Instant::now()) {
        tokio::time::sleep_until(coarse.into()).await;
    }
    if Instant::now() >= end {
        return;
    }
    let (wake, woken) = oneshot::channel();
    match timer().send(Pending { end, wake }) {
        Ok(()) => {
            let _ = woken.await;
        }
        // The timer thread could not be started: the runtime's timer is late, not wrong.
        Err(_) => tokio::time::sleep_until(end.into()).await,
    }
}

/// A call waiting for its end.
struct Pending {
    end: Instant,
    wake: oneshot::Sender<()>,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.end == other.end
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    /// The earliest end is the greatest, for a max-heap.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.end.cmp(&self.end)
    }
}

/// The sending end of the timer thread, started on first use.
fn timer() -> &'static Timer {
    static TIMER: OnceLock<Timer> = OnceLock::new();
    TIMER.get_or_init(Timer::start)
}

struct Timer(Option<mpsc::Sender<Pending>>);

impl Timer {
    fn start() -> Timer {
        let (tx, rx) = mpsc::channel::<Pending>();
        let started = std::thread::Builder::new()
            .name("toolscript-latency".into())
            .spawn(move || run(&rx));
        Timer(started.ok().map(|_| tx))
    }

    fn send(&self, pending: Pending) -> Result<(), Pending> {
        match &self.0 {
            Some(tx) => tx.send(pending).map_err(|e| e.0),
            None => Err(pending),
        }
    }
}

/// The timer thread: sleeps to the earliest end, wakes every call whose end has come, and takes
/// new calls as they arrive.
fn run(rx: &mpsc::Receiver<Pending>) {
    let mut pending = BinaryHeap::new();
    loop {
        let now = Instant::now();
        while pending.peek().is_some_and(|p: &Pending| p.end <= now) {
            if let Some(p) = pending.pop() {
                let _ = p.wake.send(());
            }
        }
        let next = match pending.peek() {
            Some(p) => rx.recv_timeout(p.end.saturating_duration_since(now)),
            None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
        };
        match next {
            Ok(p) => pending.push(p),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // No more calls can come: wake those that wait, at their ends.
                while let Some(p) = pending.pop() {
                    std::thread::sleep(p.end.saturating_duration_since(Instant::now()));
                    let _ = p.wake.send(());
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sleeps_end_on_time_and_in_order() {
        let started = Instant::now();
        let ends: Vec<Duration> = [7u64, 3, 20, 3, 12]
            .iter()
            .map(|ms| Duration::from_millis(*ms))
            .collect();
        let waits = ends.iter().map(|d| async move {
            sleep_until(started + *d).await;
            started.elapsed()
        });
        let took = futures::future::join_all(waits).await;
        for (end, took) in ends.iter().zip(&took) {
            assert!(
                took >= end,
                "a sleep never ends early: {took:?} for {end:?}"
            );
        }
        // An end that has passed returns without waiting for the timer thread.
        sleep_until(started).await;
    }
}
