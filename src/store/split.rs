//! A store whose values live on one backend and whose locks live on another: the cache over one
//! Redis with its per-key locks taken through a Redlock quorum.
//!
//! The fencing rule still holds, across the two. A computation's token is recorded on the value
//! store as soon as the lock is granted (its renewals keep it there), and its write is accepted
//! only while the value store's counter still equals it, as on a single store: a newer holder,
//! a `set` or an invalidation moves the counter on, and a counter that lapsed (a holder paused
//! for longer than the counter's retention) refuses the write rather than accept a stale one.
//! `set` and `invalidate` first draw a number from the lock quorum above every token handed out
//! so far, so a computation that took its lock before them cannot write over them afterwards.
//!
//! Explained in the guide: `docs/cluster-and-redlock.md` (Redlock-locked caches).

use std::sync::Arc;
use std::time::Duration;

use super::{Acquire, Blob, BoxFuture, LockStore, ReadOrLock, Store, StoreResult, Stored, Write};
use crate::store::wakeup::Listener;
use crate::wire::key::EntryKeys;

pub(crate) struct SplitStore {
    pub values: Arc<dyn Store>,
    pub locks: Arc<dyn LockStore>,
}

impl LockStore for SplitStore {
    fn try_lock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<Acquire>> {
        self.locks.try_lock(keys, token, lease)
    }

    fn extend<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<bool>> {
        Box::pin(async move {
            let extended = self.locks.extend(keys, token, lease).await?;
            if extended {
                // The value store's counter guards this holder's write (an invalidation since
                // its acquisition raised it above the holder's token): keep it as long as the
                // lock, or it could lapse under a long computation and let the write through.
                // A failure here is not the lock's: the lease is extended; the value store may
                // only have been briefly unreachable.
                if let Err(e) = self.values.raise_fence(keys, 0, lease).await {
                    tracing::debug!(key = %keys.user, error = %e, "could not keep the value store's fencing counter");
                }
            }
            Ok(extended)
        })
    }

    fn unlock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
    ) -> BoxFuture<'a, StoreResult<bool>> {
        Box::pin(async move {
            let released = self.locks.unlock(keys, token).await?;
            if released {
                // The lock nodes published, but waiters listen on the value store: tell them
                // there, or they would learn of it only at their backoff. The lock is free either
                // way, so a failed wake-up is no failed release.
                if let Err(e) = self.values.wake(keys).await {
                    tracing::debug!(key = %keys.user, error = %e, "could not wake the waiters; they look again at their backoff");
                }
            }
            Ok(released)
        })
    }

    fn next_fence<'a>(
        &'a self,
        keys: &'a EntryKeys,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<u64>> {
        self.locks.next_fence(keys, lease)
    }

    fn raise_fence<'a>(
        &'a self,
        keys: &'a EntryKeys,
        floor: u64,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<()>> {
        self.locks.raise_fence(keys, floor, lease)
    }

    fn record_run<'a>(
        &'a self,
        keys: &'a EntryKeys,
        fence: u64,
        keep: Duration,
    ) -> BoxFuture<'a, StoreResult<bool>> {
        self.locks.record_run(keys, fence, keep)
    }

    fn since_last_run<'a>(
        &'a self,
        keys: &'a EntryKeys,
    ) -> BoxFuture<'a, StoreResult<Option<Duration>>> {
        self.locks.since_last_run(keys)
    }

    /// Wake-ups come from the value store, where values land; a release publishes there too.
    fn listen<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Listener>> {
        self.values.listen(keys)
    }

    fn clock_drift(&self, lease: Duration) -> Duration {
        self.locks.clock_drift(lease)
    }
}

impl Store for SplitStore {
    fn get<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Option<Blob>>> {
        self.values.get(keys)
    }

    // Reads in one `MGET` on the value store; locking and invalidating many keys keep the
    // defaults, one key after another: each needs its own round over the Redlock quorum.
    fn get_many<'a>(
        &'a self,
        entries: &'a [&'a EntryKeys],
    ) -> BoxFuture<'a, StoreResult<Vec<Option<Blob>>>> {
        self.values.get_many(entries)
    }

    fn read_or_lock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
        read_value: bool,
    ) -> BoxFuture<'a, StoreResult<ReadOrLock>> {
        Box::pin(async move {
            if read_value {
                if let Some(value) = self.values.get(keys).await? {
                    return Ok(ReadOrLock::Value(value.to_vec()));
                }
            }
            let answer = self.locks.try_lock(keys, token, lease).await?;
            let Acquire::Acquired { fence } = answer else {
                return Ok(answer.into());
            };
            if read_value {
                // Not one step as in a single store: a holder may have written its value and
                // freed the lock between the read above and this lock. Read again, or the value
                // would be computed twice.
                if let Some(value) = self.values.get(keys).await? {
                    // The value is the answer; a lock that cannot be freed now frees itself at
                    // the end of its lease, which must not turn this read into an error.
                    if let Err(e) = self.unlock(keys, token).await {
                        tracing::warn!(key = %keys.user, error = %e, "could not free a lock taken over a value that had landed; it frees itself when its lease runs out");
                    }
                    return Ok(ReadOrLock::Value(value.to_vec()));
                }
            }
            // The value store learns the holder's token now, so that only this holder's write
            // matches it (see the module docs).
            self.values.raise_fence(keys, fence, lease).await?;
            Ok(answer.into())
        })
    }

    fn store_and_unlock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        fence: u64,
        write: Write,
    ) -> BoxFuture<'a, StoreResult<Stored>> {
        Box::pin(async move {
            // The single-store rule on the value store (written only while its counter equals
            // our token); the lock itself is freed on the lock nodes.
            let Stored { written, .. } = self
                .values
                .store_and_unlock(keys, token, fence, write)
                .await?;
            let released = self.locks.unlock(keys, token).await?;
            Ok(Stored { written, released })
        })
    }

    fn write_fenced<'a>(
        &'a self,
        keys: &'a EntryKeys,
        fence: u64,
        write: Write,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<bool>> {
        self.values.write_fenced(keys, fence, write, lease)
    }

    fn set<'a>(
        &'a self,
        keys: &'a EntryKeys,
        value: Vec<u8>,
        ttl: Duration,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<()>> {
        Box::pin(async move {
            let fence = self.locks.next_fence(keys, lease).await?;
            self.values
                .write_fenced(keys, fence, Write::Value { bytes: value, ttl }, lease)
                .await?;
            Ok(())
        })
    }

    fn invalidate<'a>(
        &'a self,
        keys: &'a EntryKeys,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<()>> {
        Box::pin(async move {
            let fence = self.locks.next_fence(keys, lease).await?;
            // Recorded on the value store, then bumped past by its own invalidation: every token
            // handed out before `fence` is refused from now on.
            self.values.raise_fence(keys, fence, lease).await?;
            self.values.invalidate(keys, lease).await
        })
    }

    fn wake<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<()>> {
        self.values.wake(keys)
    }

    fn now_ms(&self) -> u64 {
        self.values.now_ms()
    }

    fn clock_synced(&self) -> bool {
        self.values.clock_synced()
    }

    fn sync_clock(&self) -> BoxFuture<'_, ()> {
        self.values.sync_clock()
    }
}
