//! The slots of a tool (or of a resource its tools share): at most so many calls run at once,
//! and the executor's calls go first. A speculative call never takes a slot while one of the
//! executor's calls waits for one, and one it was handed while the executor waits is passed
//! on at once: speculation never makes the executor's call wait behind it (beyond a call
//! already running, which it cannot take back).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Slots shared by the tools of one resource.
pub(crate) type Slots = Arc<SlotPool>;

/// A pool of slots with the executor's calls first.
#[derive(Debug)]
pub(crate) struct SlotPool {
    slots: Arc<Semaphore>,
    /// The executor's calls waiting for a slot now.
    urgent: AtomicUsize,
    /// Woken when no executor's call waits any more.
    calm: Notify,
}

/// Counts an executor's call among those waiting until it has its slot or gives up.
struct Waiting<'a>(&'a SlotPool);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.0.urgent.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.calm.notify_waiters();
        }
    }
}

impl SlotPool {
    /// A pool of `n` slots.
    pub(crate) fn new(n: usize) -> Slots {
        Arc::new(SlotPool {
            slots: Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS))),
            urgent: AtomicUsize::new(0),
            calm: Notify::new(),
        })
    }

    /// A free slot at once, if there is one (for a speculative call, only while no executor's
    /// call waits).
    pub(crate) fn try_take(&self, speculative: bool) -> Option<OwnedSemaphorePermit> {
        if speculative && self.urgent.load(Ordering::SeqCst) > 0 {
            return None;
        }
        Arc::clone(&self.slots).try_acquire_owned().ok()
    }

    /// A slot, once one is free: an executor's call in the order they came; a speculative one
    /// only when no executor's call waits.
    pub(crate) async fn take(&self, speculative: bool) -> OwnedSemaphorePermit {
        if !speculative {
            self.urgent.fetch_add(1, Ordering::SeqCst);
            let _waiting = Waiting(self);
            return self.acquire().await;
        }
        loop {
            self.calm_down().await;
            let slot = self.acquire().await;
            if self.urgent.load(Ordering::SeqCst) == 0 {
                return slot;
            }
            // An executor's call came while this one waited: the slot goes on to it (the
            // semaphore hands it to the next in line, this call's turn comes again later).
            drop(slot);
        }
    }

    /// Waits until no executor's call waits for a slot.
    async fn calm_down(&self) {
        loop {
            let calm = self.calm.notified();
            tokio::pin!(calm);
            calm.as_mut().enable();
            if self.urgent.load(Ordering::SeqCst) == 0 {
                return;
            }
            calm.await;
        }
    }

    async fn acquire(&self) -> OwnedSemaphorePermit {
        match Arc::clone(&self.slots).acquire_owned().await {
            Ok(slot) => slot,
            // The semaphore is never closed.
            Err(_) => unreachable!("the slots' semaphore is never closed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_executor_s_call_goes_before_speculative_ones_waiting() {
        let pool = SlotPool::new(1);
        let held = pool.take(false).await;
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..4 {
            let (pool, order) = (Arc::clone(&pool), Arc::clone(&order));
            waiters.push(tokio::spawn(async move {
                let slot = pool.take(true).await;
                order.lock().unwrap().push(format!("s{i}"));
                tokio::time::sleep(Duration::from_millis(2)).await;
                drop(slot);
            }));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let executor = {
            let (pool, order) = (Arc::clone(&pool), Arc::clone(&order));
            tokio::spawn(async move {
                let slot = pool.take(false).await;
                order.lock().unwrap().push("e".to_string());
                drop(slot);
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            pool.try_take(true).is_none(),
            "a speculative call waits its turn"
        );
        drop(held);
        executor.await.unwrap();
        for w in waiters {
            w.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        assert_eq!(order[0], "e", "{order:?}");
        assert_eq!(order.len(), 5);
    }
}
