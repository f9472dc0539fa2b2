//! The one place of command tools with `unsafe` code: the child's last step before it runs
//! its program, which restricts it with a Landlock ruleset made beforehand.
//!
//! # Safety
//!
//! `pre_exec` runs its closure in the child, between `fork` and `exec`. This process has many
//! threads, and the child has one, a copy of the forking thread: any lock another thread held
//! (the allocator's among them) stays held. So the closure allocates nothing, takes no lock
//! and touches no value but one integer copied into it: it makes two system calls, `prctl`
//! (`PR_SET_NO_NEW_PRIVS`, which Landlock requires of an unprivileged process) and
//! `landlock_restrict_self`, and reads `errno` through std without allocating
//! (`io::Error::last_os_error` holds the number). Both calls are async-signal-safe: they act on
//! the calling thread's credentials only. The ruleset's descriptor stays open in this process
//! until the command is spawned (the caller holds it), so the child's copy is valid when the
//! closure runs; it is close-on-exec (the kernel makes Landlock rulesets so), so the program
//! does not inherit it.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// Makes `command`'s child restrict itself with `ruleset` before it runs its program: a child
/// whose restriction fails does not run it (the spawn fails with the system's error).
pub(super) fn restrict_before_exec(command: &mut tokio::process::Command, ruleset: &OwnedFd) {
    let fd = ruleset.as_raw_fd();
    // SAFETY: the closure keeps to the rules in the module's docs.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::syscall(libc::SYS_landlock_restrict_self, fd, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
