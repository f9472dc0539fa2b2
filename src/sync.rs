//! Locking that survives a panic elsewhere: every critical section in the crate is a plain
//! update, so a mutex poisoned by a panicking thread still holds consistent data, and the library
//! never panics on a poisoned lock.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, recovering it if a panic poisoned it.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// A hash map for the maps every call looks in (the run's reads, its tools, its breakers):
/// hashed with foldhash, seeded at random per process like the standard library's, several
/// times cheaper than SipHash on short keys. Its `quality` variant, since a script chooses
/// the keys of the ledger's reads.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::quality::RandomState>;

/// How far ahead a deadline too far to represent is put: a century, "no deadline" for any run.
const FAR_FUTURE: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 86_400);

/// `start + length`, checked: a length past what an `Instant` holds (a `timeout_s` of 1e19, a
/// tool's latency of `u64::MAX` ms) gives a deadline a century away, never a panic.
pub(crate) fn deadline_after(
    start: std::time::Instant,
    length: std::time::Duration,
) -> std::time::Instant {
    start
        .checked_add(length)
        .or_else(|| start.checked_add(FAR_FUTURE))
        .unwrap_or(start)
}

/// How much lower than the executor's a thread that runs behind is scheduled (a scout pass's,
/// the receipts hasher's; Linux nice values).
#[cfg(target_os = "linux")]
const BEHIND: i32 = 10;

/// Lowers this thread's priority, so that where the cores are busy the threads of the run that
/// counts (the executor, the tools' bodies) go first: a scout pass calls it on its own thread,
/// which ends with the pass, and the receipts hasher on its own. Only ever lowers (no privilege
/// is needed), and where it cannot, the thread keeps its priority.
pub(crate) fn run_behind() {
    #[cfg(target_os = "linux")]
    {
        use rustix::process::{getpriority_process, setpriority_process};
        let this = Some(rustix::thread::gettid());
        let now = getpriority_process(this).unwrap_or(0);
        if now < BEHIND {
            let _ = setpriority_process(this, BEHIND);
        }
    }
}

#[cfg(test)]
mod tests {
    /// A thread that runs behind is scheduled below its process's other threads (Linux), and
    /// the thread that started it keeps its priority.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_that_runs_behind_has_a_lower_priority() {
        use rustix::process::getpriority_process;
        let before = getpriority_process(Some(rustix::thread::gettid())).unwrap();
        let behind = std::thread::spawn(|| {
            super::run_behind();
            getpriority_process(Some(rustix::thread::gettid())).unwrap()
        })
        .join()
        .unwrap();
        assert!(behind >= super::BEHIND, "{behind}");
        let after = getpriority_process(Some(rustix::thread::gettid())).unwrap();
        assert_eq!(before, after);
    }
}
