//! The threads scripts run on. A script blocks its thread at every tool call and recurses on its
//! stack, so it never runs on an async worker nor on tokio's blocking pool (whose threads have
//! the default 2 MiB stack): the executor and every scout pass get a thread of their own, and
//! script tools' bodies run on a small pool of threads of the same stack size.

use crate::sync::lock;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};

use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use tokio_util::sync::CancellationToken;

/// The stack of a thread a script runs on: deep enough for `Limits::max_call_depth` levels of
/// script functions in an unoptimised build.
const SCRIPT_STACK: usize = 64 << 20;

/// Starts a thread fit to run a script (the executor's, a scout pass, a composite's body).
pub(crate) fn spawn_script_thread(
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.to_string())
        .stack_size(SCRIPT_STACK)
        .spawn(move || {
            let top = 0u8;
            STACK_TOP.set(Some(std::ptr::addr_of!(top) as usize));
            f();
        })
}

thread_local! {
    /// On a script thread: an address near the top of its stack, from which [`stack_room`]
    /// tells how much is left.
    static STACK_TOP: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// The bytes of stack left below this point, on a script thread; `None` on any other thread.
/// (Only addresses are compared: nothing is read through them.)
#[cfg_attr(not(feature = "manifest"), allow(dead_code))]
pub(crate) fn stack_room() -> Option<usize> {
    let here = 0u8;
    let used = STACK_TOP.get()?.abs_diff(std::ptr::addr_of!(here) as usize);
    Some(SCRIPT_STACK.saturating_sub(used))
}

/// Runs `future` on the async runtime from a thread that may block (a script's), and waits for
/// its output; `None` if the runtime shut down first (tokio panics when a timer is polled on a
/// runtime that is shutting down; that panic is caught here).
///
/// On a multi-thread runtime this thread polls the future itself (its timers are driven by the
/// runtime's workers), which saves two thread switches a call. The future stays where it is
/// (on this thread's stack) and is polled once, inside the runtime's context, before the
/// runtime's `block_on` is entered: a call that answers at once (a native tool) then costs no
/// allocation, no parker and no seeding of the runtime's random generator. If it has to wait,
/// `block_on` polls it again with a waker of its own, as a future's contract allows (only the
/// last poll's waker is woken). A current-thread runtime (tests with paused time) drives timers
/// only on its own thread, so there the future runs as a task and this thread waits for its
/// output.
pub(crate) fn block_on<T: Send + 'static>(
    handle: &tokio::runtime::Handle,
    future: impl Future<Output = T> + Send + 'static,
) -> Option<T> {
    block_on_noting(handle, || future, || ())
}

/// [`block_on`], calling `waits` when the future cannot finish at once, before this thread
/// waits for it; what `waits` returns is dropped when the wait is over. The future is the one
/// `make` makes, made where it is polled: a call's future (a few kilobytes) is never copied.
pub(crate) fn block_on_noting<T: Send + 'static, F, G>(
    handle: &tokio::runtime::Handle,
    make: impl FnOnce() -> F + Send + 'static,
    waits: impl FnOnce() -> G,
) -> Option<T>
where
    F: Future<Output = T> + Send + 'static,
{
    if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::CurrentThread {
        let mut future = std::pin::pin!(make());
        let first = {
            let _entered = handle.enter();
            let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
            catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(&mut cx)))
        };
        return match first {
            Ok(std::task::Poll::Ready(output)) => Some(output),
            Ok(std::task::Poll::Pending) => {
                let _waiting = waits();
                catch_unwind(AssertUnwindSafe(|| handle.block_on(future.as_mut()))).ok()
            }
            Err(_) => None,
        };
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    handle.spawn(async move {
        let _ = tx.send(make().await);
    });
    let _waiting = waits();
    rx.blocking_recv().ok()
}

/// What is left of a future that [`poll_once`] could not finish: to be spawned.
pub(crate) type Rest<F> = std::pin::Pin<Box<F>>;

/// Polls `future` once on this thread, inside `handle`'s runtime, and gives back what is left of
/// it if it has to wait, for the caller to spawn: a scout's read of a tool that answers at once
/// (a native tool) then costs no task and no wake-up of a worker, and its value is there for the
/// rest of the pass. The task that takes the rest over polls it again, with its own waker, as
/// soon as it starts. A panic is caught and ends the future, as it would end a task. On a
/// current-thread runtime nothing is polled here (as in [`block_on`]): the whole future is
/// given back.
pub(crate) fn poll_once<F: Future<Output = ()> + Send + 'static>(
    handle: &tokio::runtime::Handle,
    future: F,
) -> Option<Rest<F>> {
    let mut future = Box::pin(future);
    if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread {
        return Some(future);
    }
    let _entered = handle.enter();
    let mut cx = std::task::Context::from_waker(futures::task::noop_waker_ref());
    match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(&mut cx))) {
        Ok(std::task::Poll::Pending) => Some(future),
        Ok(std::task::Poll::Ready(())) | Err(_) => None,
    }
}

#[cfg_attr(not(feature = "manifest"), allow(dead_code))]
type Job = Box<dyn FnOnce() + Send>;

thread_local! {
    /// The cancellation of the pool job running on this thread, if any: a body's `sleep` and
    /// its progress checks look at it, so a job whose call was abandoned frees its thread. (A
    /// script tool's engine is built once and shared by its calls, so its watch cannot hold
    /// one call's token: the thread it runs on does.)
    static JOB_CANCEL: std::cell::RefCell<Option<CancellationToken>> =
        const { std::cell::RefCell::new(None) };

    /// The deadline of a body run in place (see [`run_in_place`]).
    static JOB_DEADLINE: std::cell::Cell<Option<std::time::Instant>> =
        const { std::cell::Cell::new(None) };
}

/// Whether the job running on this thread (a pool job, or a body run in place by
/// [`run_in_place`]) was cancelled, or is past its deadline.
pub(crate) fn job_cancelled() -> bool {
    let cancelled = JOB_CANCEL.with(|c| {
        c.borrow()
            .as_ref()
            .is_some_and(CancellationToken::is_cancelled)
    });
    cancelled
        || JOB_DEADLINE
            .get()
            .is_some_and(|d| std::time::Instant::now() >= d)
}

/// Runs `f` here, on a script thread that polls a call's future, as the pool would run it:
/// `cancel` set or `deadline` passed stops it at its next operation or `sleep` slice. This
/// thread is busy until `f` is done, so nothing else can stop it: the caller checks the
/// deadline again when it is. `Err` holds the message of a panic.
pub(crate) fn run_in_place<T>(
    cancel: CancellationToken,
    deadline: Option<std::time::Instant>,
    f: impl FnOnce() -> T,
) -> Result<Option<T>, String> {
    if cancel.is_cancelled() {
        return Ok(None);
    }
    let outer = JOB_CANCEL.with(|c| c.replace(Some(cancel)));
    let outer_deadline = JOB_DEADLINE.replace(deadline);
    let result = catch_unwind(AssertUnwindSafe(f))
        .map(Some)
        .map_err(|panic| crate::dispatch::panic_message(panic.as_ref()).to_string());
    JOB_CANCEL.with(|c| *c.borrow_mut() = outer);
    JOB_DEADLINE.set(outer_deadline);
    result
}

/// A pool of script-sized threads, one per core, for bodies that never block on a tool call
/// (script tools that are not composites). At most one body per core runs at once: a fan-out of
/// a hundred calls would otherwise wake a hundred threads whose switching costs more than the
/// bodies. Only script tools (feature `manifest`) use it.
#[cfg_attr(not(feature = "manifest"), allow(dead_code))]
pub(crate) struct ScriptPool {
    jobs: Mutex<mpsc::Sender<Job>>,
}

#[cfg_attr(not(feature = "manifest"), allow(dead_code))]
impl ScriptPool {
    /// The number of threads of the pool: one per core.
    pub(crate) fn threads() -> usize {
        std::thread::available_parallelism().map_or(2, |n| n.get())
    }

    /// The process's pool, started on first use.
    pub(crate) fn shared() -> &'static ScriptPool {
        static POOL: OnceLock<ScriptPool> = OnceLock::new();
        POOL.get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Job>();
            let rx = Arc::new(Mutex::new(rx));
            for i in 0..ScriptPool::threads() {
                let rx = Arc::clone(&rx);
                // A pool that cannot start a thread runs with the ones it has; one that has none
                // answers every job with `None` (the receiver is dropped with the last thread).
                let _ = spawn_script_thread(&format!("toolscript-tool-{i}"), move || loop {
                    let job = lock(&rx).recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                });
            }
            ScriptPool {
                jobs: Mutex::new(tx),
            }
        })
    }

    /// Runs `f` on a pool thread and waits for it without blocking the async runtime; `cancel`
    /// set stops it (before it starts, or at its next operation or `sleep` slice). `Err` holds
    /// the message of a panic, or says that no pool thread could run it.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        cancel: CancellationToken,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<Option<T>, String> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = tx.send(run_in_place(cancel, None, f));
        });
        let sent = lock(&self.jobs).send(job);
        if sent.is_err() {
            return Err("no script thread could be started".to_string());
        }
        rx.await
            .unwrap_or_else(|_| Err("the script thread stopped".to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pool_threads_have_a_script_stack_and_survive_panics() {
        let pool = ScriptPool::shared();
        let go = CancellationToken::new;
        // Recursion that would overflow a 2 MiB stack in a debug build.
        fn depth(n: u64) -> u64 {
            let pad = [n; 512];
            if n == 0 {
                pad[0]
            } else {
                std::hint::black_box(depth(n - 1)) + pad[1] - n + 1
            }
        }
        assert_eq!(pool.run(go(), || depth(5_000)).await, Ok(Some(5_000)));
        let e = pool
            .run(go(), || -> u32 { panic!("boom") })
            .await
            .unwrap_err();
        assert_eq!(e, "boom");
        assert_eq!(
            pool.run(go(), || 7).await,
            Ok(Some(7)),
            "the pool still runs jobs"
        );
        let cancelled = CancellationToken::new();
        cancelled.cancel();
        assert_eq!(
            pool.run(cancelled, || 7).await,
            Ok(None),
            "a cancelled job never runs"
        );
    }

    /// A script thread knows how much of its stack is left, less the deeper it is; no other
    /// thread claims to be one.
    #[test]
    fn a_script_thread_knows_its_stack_room() {
        fn deeper(n: u32) -> usize {
            let pad = std::hint::black_box([0u8; 4096]);
            if n == 0 {
                stack_room().unwrap()
            } else {
                deeper(n - 1) + usize::from(pad[0])
            }
        }
        let (tx, rx) = std::sync::mpsc::channel();
        spawn_script_thread("room", move || {
            tx.send((stack_room().unwrap(), deeper(100))).unwrap();
        })
        .unwrap()
        .join()
        .unwrap();
        let (top, deep) = rx.recv().unwrap();
        assert!(
            top > SCRIPT_STACK - (1 << 20) && top <= SCRIPT_STACK,
            "{top}"
        );
        assert!(top - deep >= 100 * 4096, "{top} {deep}");
        assert_eq!(stack_room(), None, "the test's thread is no script thread");
    }

    /// `block_on` from a plain thread: a future that answers at its first poll, one that waits
    /// (its first poll's waker is a no-op: the runtime's poll must wake it), one that needs the
    /// runtime's context at its first poll (a timer), and one that panics at either poll.
    #[test]
    fn block_on_answers_at_once_after_a_wait_and_after_a_panic() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let handle = rt.handle().clone();
        std::thread::spawn(move || {
            assert_eq!(block_on(&handle, async { 7 }), Some(7));
            let (tx, rx) = tokio::sync::oneshot::channel();
            handle.spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                tx.send(8).unwrap();
            });
            assert_eq!(block_on(&handle, async { rx.await.unwrap() }), Some(8));
            let slept = block_on(&handle, async {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                9
            });
            assert_eq!(slept, Some(9));
            assert_eq!(
                block_on(&handle, async { panic!("first poll") }),
                None::<u8>
            );
            let late = block_on(&handle, async {
                tokio::task::yield_now().await;
                panic!("second poll")
            });
            assert_eq!(late, None::<u8>);
            assert_eq!(block_on(&handle, async { 10 }), Some(10), "it still runs");
        })
        .join()
        .unwrap();
    }
}
