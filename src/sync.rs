//! The mutex helper every layer shares.
//!
//! A leaf: it uses no layer. The crate's `std` mutexes guard maps and counters whose every
//! critical section is one operation that runs no user code, so a panic elsewhere cannot leave
//! their data half-changed; propagating poison would only turn one panic into many.

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex whose data stays consistent even if a holder panicked (every critical section
/// that uses this is a single map operation), so poisoning is ignored rather than propagated.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
