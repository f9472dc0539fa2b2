//! The guard: a small process that kills a child's whole process group when this process
//! dies, however it dies. The crate's one module with `unsafe` code.
//!
//! [`Guard::start`] makes a pipe and forks. The child, the guard, leads a new process group,
//! closes every descriptor but the pipe's read end, blocks every signal that can be blocked,
//! and reads the pipe. This process keeps the write end (close-on-exec, so no program it
//! starts inherits it) and starts the server in the guard's group
//! (`Command::process_group`, plain std). The read returns when the write end's last copy
//! closes: when the [`Guard`] is dropped, or when this process ends, which the kernel does on
//! any death, `SIGKILL` included. The guard then sends `SIGKILL` to its own group: the server,
//! whatever the server started that stayed in its group (`npx` → `node`), and the guard.
//!
//! A group outlives its leader while it has members, so the guard, a member until it kills
//! the group, keeps the group's id from being given to anyone else: the kill never reaches a
//! stranger.
//!
//! # Safety
//!
//! This process has many threads; after `fork` the child has one, a copy of the forking
//! thread, and any lock another thread held stays held in it (the allocator's among them). So
//! the guard calls only async-signal-safe functions (POSIX.1-2017 §2.4.3: `setpgid`,
//! `sigfillset`, `sigprocmask`, `close`, `read`, `kill`, `_exit`; on Linux the system calls
//! `prctl`, for its name, and `close_range`; `errno`, read through std without allocating), on
//! values that are on its stack or were computed before the fork. It never allocates, never
//! takes a lock, never returns (it ends with `_exit`, running no destructor and no `atexit`
//! handler), and uses no descriptor but the one [`guard_loop`] is given. In this process,
//! every descriptor is owned by a std type that closes it once.
//!
//! # Cost
//!
//! A guard is a copy of this process that shares its memory copy-on-write and touches only
//! its stack: it costs page tables, and keeps the old copy of each page this process writes
//! afterwards. Servers start when a catalog is loaded, early in a process's life, while it is
//! small.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, RawFd};

/// A running guard: dropping it makes the guard kill its process group.
#[derive(Debug)]
pub(crate) struct Guard {
    /// The guard's pid, which is its group's id.
    pid: libc::pid_t,
    /// The pipe's write end: closing it (its last copy) wakes the guard.
    write: Option<io::PipeWriter>,
}

impl Guard {
    /// Forks a guard that leads a new process group, empty but for itself.
    ///
    /// # Errors
    ///
    /// The pipe cannot be made, or the process cannot fork (too many processes).
    pub(crate) fn start() -> io::Result<Guard> {
        reap_exited();
        let (read, write) = io::pipe()?;
        // Computed here, not in the child: the child may not allocate or read files.
        let fd_limit = fd_limit();
        let read_fd = read.as_raw_fd();
        // SAFETY: `fork` is called with no lock of ours held; the child runs only
        // `guard_loop`, which never returns and keeps to the rules in the module's docs.
        let pid = unsafe { libc::fork() };
        match pid {
            -1 => Err(io::Error::last_os_error()),
            0 => guard_loop(read_fd, fd_limit),
            pid => {
                // The guard does the same; either call makes the group exist before the
                // server is started in it. (Failing only if the guard is already gone, which
                // the server's start then reports.)
                // SAFETY: a plain system call on a child of this process.
                unsafe { libc::setpgid(pid, pid) };
                drop(read);
                Ok(Guard {
                    pid,
                    write: Some(write),
                })
            }
        }
    }

    /// The guard's process group, for the server to be started in.
    pub(crate) fn group(&self) -> u32 {
        self.pid as u32
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // The guard wakes, kills its group and exits; it is reaped here if it has already, or
        // by a later guard's start (a zombie holds no resource but its pid until then).
        drop(self.write.take());
        lock_exited().push(self.pid);
        reap_exited();
    }
}

/// Guards that were told to end, not reaped yet.
fn lock_exited() -> std::sync::MutexGuard<'static, Vec<libc::pid_t>> {
    static EXITED: std::sync::Mutex<Vec<libc::pid_t>> = std::sync::Mutex::new(Vec::new());
    crate::sync::lock(&EXITED)
}

/// Reaps the guards that were told to end and have exited, without waiting for any.
fn reap_exited() {
    lock_exited().retain(|&pid| {
        let mut status = 0;
        // SAFETY: a plain system call; `status` is a valid place for the result.
        let reaped = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        // 0: still running. -1: not our child any more (someone else reaped it).
        reaped == 0
    });
}

/// Whether the process group `pgid` has a process (zombies included): `kill(-pgid, 0)`.
#[cfg_attr(target_os = "linux", allow(dead_code))]
pub(crate) fn group_exists(pgid: u32) -> bool {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return false;
    };
    if pgid <= 1 {
        return false;
    }
    // SAFETY: signal 0 only checks that the group exists and may be signalled.
    let sent = unsafe { libc::kill(-pgid, 0) };
    sent == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The highest descriptor number the guard closes when `close_range` is not there: the
/// process's limit, at most 65,536 (a limit of 2^30 would take the loop minutes).
fn fd_limit() -> RawFd {
    // SAFETY: a plain library call.
    let max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) };
    if max <= 0 {
        1024
    } else {
        max.min(65_536) as RawFd
    }
}

/// The guard's whole life: never returns.
fn guard_loop(read_fd: RawFd, fd_limit: RawFd) -> ! {
    // SAFETY: every call below is async-signal-safe and takes only integers and pointers to
    // this function's stack (see the module's docs).
    unsafe {
        libc::setpgid(0, 0);
        // Named for `ps` (it is a copy of this process, and would bear its name).
        #[cfg(target_os = "linux")]
        libc::prctl(libc::PR_SET_NAME, c"ts-child-guard".as_ptr());
        // Nothing but SIGKILL (and SIGSTOP) ends the guard early: not a terminal's Ctrl-C, nor
        // a handler of the parent's, which would run here on a copy of its state.
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
        // Every other descriptor: the server's pipes (it must see its stdin close), this
        // process's stdout, other guards' pipes, a pipe std is waiting on to learn whether
        // another thread's spawn worked.
        close_all_but(read_fd, fd_limit);
        let mut byte = 0u8;
        loop {
            let n = libc::read(read_fd, (&mut byte as *mut u8).cast(), 1);
            // 0: every write end is closed. An error but EINTR: nothing more can be learnt.
            if n == 0 || (n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted)
            {
                break;
            }
        }
        libc::kill(0, libc::SIGKILL);
        libc::_exit(0)
    }
}

/// Closes every descriptor but `keep`.
///
/// # Safety
///
/// Async-signal-safe; it closes descriptors, so nothing may use them afterwards (the guard
/// uses none).
unsafe fn close_all_but(keep: RawFd, fd_limit: RawFd) {
    #[cfg(target_os = "linux")]
    {
        let below = keep > 0 && close_range(0, keep as u32 - 1);
        if (keep == 0 || below) && close_range(keep as u32 + 1, u32::MAX) {
            return;
        }
    }
    for fd in 0..fd_limit.max(keep + 1) {
        if fd != keep {
            libc::close(fd);
        }
    }
}

/// Linux's `close_range` (5.9 and later); `false` where the kernel lacks it.
#[cfg(target_os = "linux")]
unsafe fn close_range(first: u32, last: u32) -> bool {
    libc::syscall(libc::SYS_close_range, first, last, 0u32) == 0
}
