//! The fail-safe's decisions, one small function each, so that every path that reads, waits or
//! computes (the single-key path here, the batch path per key) takes them the same way:
//!
//! - where a stored entry stands for this caller ([`Cache::standing_of`]): live, a throttled
//!   fallback, or past its stale window (then kept as a [`Kept`] fallback);
//! - when a caller's soft timeout falls ([`Cache::soft_deadline`]);
//! - which errors the fallback answers ([`falls_back`]) and how it is served
//!   ([`Cache::serve_fallback`]).
//!
//! Invariants: a kept value is served only as [`Source::Fallback`], never as a hit, and never
//! enters the near tier; a throttled copy is written only under the computing caller's lock and
//! fencing token, in the same step that frees the lock, so it never overwrites a newer value.

use serde::de::DeserializeOwned;
use tokio::time::Instant;

use crate::cache::entry::StoredEntry;
use crate::cache::freshness::{standing, Standing};
use crate::options::later_by;
use crate::wire::codec::Codec;
use crate::wire::key::EntryKeys;
use crate::{Cache, Error, Fetched, Source};

/// A value past its stale window, kept as the fallback of the computation that replaces it.
#[derive(Debug, Clone)]
pub(crate) struct Kept<T> {
    pub value: T,
    /// Its stored bytes, from which a throttled copy is made after a failure.
    pub bytes: Vec<u8>,
}

/// A stored entry, sorted by [`Cache::sort`].
pub(crate) enum Sorted<T> {
    /// Serve it ([`Cache::serve`](crate::Cache) decides fresh, stale or throttled fallback).
    Serve(StoredEntry<T>),
    /// Past its stale window: take the lock over it and compute ([`Cache::keep`] makes it the
    /// fallback, once the lock is taken).
    Past(StoredEntry<T>),
}

/// Whether `error` is one the fail-safe answers with the fallback: the computation failed, hit
/// its hard timeout, or the wait for another's outlasted the wait bound. Not a backend failure
/// (the fallback lives in the backend) nor a bug of the caller's (a key, an encoding).
pub(crate) fn falls_back(error: &Error) -> bool {
    matches!(
        error,
        Error::Compute(_) | Error::ComputeTimeout { .. } | Error::WaitTimeout { .. }
    )
}

impl<C: Codec> Cache<C> {
    /// Where `entry` stands for this handle's options, by the store's clock now.
    pub(crate) fn standing_of<T>(&self, entry: &StoredEntry<T>) -> Standing {
        let stale_ms = u64::try_from(self.options.stale_for.as_millis()).unwrap_or(u64::MAX);
        standing(
            self.inner.store.now_ms(),
            entry.fresh_until_ms,
            entry.throttled,
            stale_ms,
            self.options.fail_safe(),
        )
    }

    /// The fallback an expired `entry` offers this handle: its value, if the fail-safe is on and
    /// it is a value (a remembered failure is never a fallback).
    pub(crate) fn keep<T>(&self, entry: StoredEntry<T>, bytes: &[u8]) -> Option<Kept<T>> {
        if !self.options.fail_safe() {
            return None;
        }
        entry.value.ok().map(|value| Kept {
            value,
            bytes: bytes.to_vec(),
        })
    }

    /// When a call that started at `started` stops waiting and answers with its fallback: at
    /// its soft timeout, if the fail-safe is on and a soft timeout is set.
    pub(crate) fn soft_deadline(&self, started: Instant) -> Option<Instant> {
        if !self.options.fail_safe() {
            return None;
        }
        self.options
            .soft_timeout
            .map(|budget| later_by(started, budget))
    }

    /// Serves a kept value as the fallback (counted with the call's outcome, in `fetch`).
    pub(crate) fn serve_fallback<T>(&self, value: T) -> Fetched<T> {
        Fetched {
            value,
            source: Source::Fallback,
        }
    }

    /// A computation or a wait ended with `error`: the fallback if the fail-safe answers it and
    /// one is kept, else the error.
    pub(crate) fn fall_back<T>(
        &self,
        error: Error,
        kept: Option<Kept<T>>,
        keys: &EntryKeys,
    ) -> Result<Fetched<T>, Error> {
        match kept {
            Some(kept) if falls_back(&error) => {
                tracing::warn!(key = %keys.user, error = %error.chain(), "serving the fail-safe value");
                Ok(self.serve_fallback(kept.value))
            }
            _ => Err(error),
        }
    }

    /// Sorts a stored entry for this caller: serve it (live, or a throttled fallback), or it is
    /// past its stale window: compute.
    pub(crate) fn sort<T>(&self, entry: StoredEntry<T>) -> Sorted<T> {
        match self.standing_of(&entry) {
            Standing::Live | Standing::Throttled => Sorted::Serve(entry),
            Standing::Expired => Sorted::Past(entry),
        }
    }

    /// Reads the key again once a waiter's budget ran out (its soft timeout, or its wait bound):
    /// a value that landed meanwhile (`Ok(Some(entry))`, to serve), or the fallback kept in the
    /// store (`Err(kept)`), or nothing.
    pub(crate) async fn look_again<T: DeserializeOwned + 'static>(
        &self,
        keys: &EntryKeys,
    ) -> Option<Result<StoredEntry<T>, Kept<T>>> {
        let bytes = self.inner.store.get(keys).await.ok()??;
        let entry = self.read_stored::<T>(keys, &bytes)?;
        match self.sort(entry) {
            Sorted::Serve(entry) => Some(Ok(entry)),
            Sorted::Past(entry) => self.keep(entry, &bytes).map(Err),
        }
    }
}
