//! Locking that survives a panic elsewhere: every critical section in the crate is a plain
//! update, so a mutex poisoned by a panicking thread still holds consistent data, and the library
//! never panics on a poisoned lock.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, recovering it if a panic poisoned it.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
