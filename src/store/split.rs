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

use super::calls::one_by_one;
use super::{
    Acquire, BoxFuture, Clock, LockOp, LockStore, LockStoreExt, Op, ReadOrLock, Reply, Store,
    StoreExt, StoreResult, Stored, Write,
};
use crate::store::wakeup::Listener;
use crate::wire::key::EntryKeys;

pub(crate) struct SplitStore {
    pub values: Arc<dyn Store>,
    pub locks: Arc<dyn LockStore>,
}

impl SplitStore {
    /// The lock's renewal on the lock side, and the value side's counter kept as long.
    async fn extend_across(
        &self,
        keys: &EntryKeys,
        token: &str,
        lease: Duration,
    ) -> StoreResult<bool> {
        let extended = self.locks.extend(keys, token, lease).await?;
        if extended {
            // The value store's counter guards this holder's write (an invalidation since
            // its acquisition raised it above the holder's token): keep it as long as the
            // lock, or it could lapse under a long computation and let the write through.
            // A failure here is not the lock's: the lease is extended; the value store may
            // only have been briefly unreachable.
            if let Err(e) = self.values.raise_fence(keys, 0, lease).await {
                tracing::debug!(key = %keys.user(), error = %e, "could not keep the value store's fencing counter");
            }
        }
        Ok(extended)
    }

    /// The lock freed on the lock side; its waiters woken on the value side.
    async fn unlock_across(&self, keys: &EntryKeys, token: &str) -> StoreResult<bool> {
        let released = self.locks.unlock(keys, token).await?;
        if released {
            // The lock nodes published, but waiters listen on the value store: tell them
            // there, or they would learn of it only at their backoff. The lock is free either
            // way, so a failed wake-up is no failed release.
            if let Err(e) = self.values.wake(keys).await {
                tracing::debug!(key = %keys.user(), error = %e, "could not wake the waiters; they look again at their backoff");
            }
        }
        Ok(released)
    }

    async fn read_or_lock_across(
        &self,
        keys: &EntryKeys,
        token: &str,
        lease: Duration,
        read_value: bool,
    ) -> StoreResult<ReadOrLock> {
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
                if let Err(e) = self.unlock_across(keys, token).await {
                    crate::log::throttled!(warn, key = %keys.user(), error = %e, "could not free a lock taken over a value that had landed; it frees itself when its lease runs out");
                }
                return Ok(ReadOrLock::Value(value.to_vec()));
            }
        }
        // The value store learns the holder's token now, so that only this holder's write
        // matches it (see the module docs).
        self.values.raise_fence(keys, fence, lease).await?;
        Ok(answer.into())
    }

    async fn store_and_unlock_across(
        &self,
        keys: &EntryKeys,
        token: &str,
        fence: u64,
        write: Write,
    ) -> StoreResult<Stored> {
        // The single-store rule on the value store (written only while its counter equals
        // our token); the lock itself is freed on the lock nodes.
        let Stored { written, .. } = self
            .values
            .store_and_unlock(keys, token, fence, write)
            .await?;
        let released = self.locks.unlock(keys, token).await?;
        Ok(Stored { written, released })
    }

    async fn set_across(
        &self,
        keys: &EntryKeys,
        value: Vec<u8>,
        ttl: Duration,
        lease: Duration,
    ) -> StoreResult<()> {
        let fence = self.locks.next_fence(keys, lease).await?;
        self.values
            .write_fenced(keys, fence, Write::Value { bytes: value, ttl }, lease)
            .await?;
        Ok(())
    }

    async fn invalidate_across(&self, keys: &EntryKeys, lease: Duration) -> StoreResult<()> {
        let fence = self.locks.next_fence(keys, lease).await?;
        // Recorded on the value store, then bumped past by its own invalidation: every token
        // handed out before `fence` is refused from now on.
        self.values.raise_fence(keys, fence, lease).await?;
        self.values.invalidate(keys, lease).await
    }
}

impl LockStore for SplitStore {
    /// Lock operations go to the lock side; a renewal and a release also tell the value side.
    fn lock<'a>(&'a self, op: LockOp<'a>) -> BoxFuture<'a, StoreResult<Reply>> {
        match op {
            LockOp::Extend { keys, token, lease } => {
                Box::pin(
                    async move { Ok(Reply::Flag(self.extend_across(keys, token, lease).await?)) },
                )
            }
            LockOp::Unlock { keys, token } => {
                Box::pin(async move { Ok(Reply::Flag(self.unlock_across(keys, token).await?)) })
            }
            other => self.locks.lock(other),
        }
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
    /// Value operations go to the value side (reads in one `MGET` there; epochs and births
    /// live with the values they judge); those that take a lock or move the fencing counter
    /// cross to the lock side first. Locking and invalidating many keys go one key after
    /// another: each needs its own round over the Redlock quorum.
    fn run<'a>(&'a self, op: Op<'a>) -> BoxFuture<'a, StoreResult<Reply>> {
        match op {
            // The lock side is a Redlock quorum: no trace is kept beside its locks.
            Op::ReadOrLock {
                keys,
                token,
                lease,
                read_value,
                trace: _,
            } => Box::pin(async move {
                let answer = self
                    .read_or_lock_across(keys, token, lease, read_value)
                    .await?;
                Ok(Reply::ReadOrLock(answer))
            }),
            Op::StoreAndUnlock {
                keys,
                token,
                fence,
                write,
            } => Box::pin(async move {
                let stored = self
                    .store_and_unlock_across(keys, token, fence, write)
                    .await?;
                Ok(Reply::Stored(stored))
            }),
            Op::Set {
                keys,
                value,
                ttl,
                lease,
            } => Box::pin(async move {
                self.set_across(keys, value, ttl, lease).await?;
                Ok(Reply::Done)
            }),
            Op::Invalidate { keys, lease } => Box::pin(async move {
                self.invalidate_across(keys, lease).await?;
                Ok(Reply::Done)
            }),
            batch @ (Op::ReadOrLockMany { .. } | Op::InvalidateMany { .. }) => {
                one_by_one(self, batch)
            }
            values => self.values.run(values),
        }
    }

    fn clock(&self) -> &dyn Clock {
        self.values.clock()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    /// The lease of every lock: the fencing counter is kept two of them after a bump or renewal.
    const LEASE: Duration = Duration::from_secs(1);
    /// A TTL no test outlives.
    const HOUR: Duration = Duration::from_secs(3600);

    /// The one key the tests use.
    fn keys() -> EntryKeys {
        EntryKeys::new("t", "report").unwrap()
    }

    /// A value write of `bytes`.
    fn value(bytes: &[u8]) -> Write {
        Write::Value {
            bytes: bytes.to_vec(),
            ttl: HOUR,
        }
    }

    /// A split store over `locks` and a memory value side, and that value side.
    fn split_over(locks: Arc<dyn LockStore>) -> (SplitStore, Arc<MemoryStore>) {
        let values = Arc::new(MemoryStore::default());
        let store = SplitStore {
            values: Arc::clone(&values) as Arc<dyn Store>,
            locks,
        };
        (store, values)
    }

    /// A split store over two memory stores: the store, its value side and its lock side.
    fn split() -> (SplitStore, Arc<MemoryStore>, Arc<MemoryStore>) {
        let locks = Arc::new(MemoryStore::default());
        let (store, values) = split_over(Arc::clone(&locks) as Arc<dyn LockStore>);
        (store, values, locks)
    }

    /// Takes the free lock through the split store for `token`; its fencing token.
    async fn fence_of(store: &SplitStore, keys: &EntryKeys, token: &str, read: bool) -> u64 {
        match store.read_or_lock(keys, token, LEASE, read).await.unwrap() {
            ReadOrLock::Acquired { fence, .. } => fence,
            other => panic!("the lock is free: {other:?}"),
        }
    }

    /// The value bytes the split store reads.
    async fn stored(store: &SplitStore, keys: &EntryKeys) -> Option<Vec<u8>> {
        store.get(keys).await.unwrap().map(|blob| blob.to_vec())
    }

    #[tokio::test(start_paused = true)]
    async fn the_holders_write_lands_and_its_lock_is_freed_on_the_lock_side() {
        let (store, _values, locks) = split();
        let k = keys();
        let fence = fence_of(&store, &k, "a", true).await;
        let held = locks.try_lock(&k, "b", LEASE).await.unwrap();
        assert!(
            matches!(held, Acquire::Held { .. }),
            "the lock lives on the lock side"
        );
        let answer = store.store_and_unlock(&k, "a", fence, value(b"v")).await;
        let Stored { written, released } = answer.unwrap();
        assert!(written, "the value store knew the holder's token");
        assert!(released);
        assert_eq!(stored(&store, &k).await.as_deref(), Some(&b"v"[..]));
        let next = locks.try_lock(&k, "b", LEASE).await.unwrap();
        assert!(matches!(next, Acquire::Acquired { .. }));
    }

    /// A lock side on which, just before the lock is taken, another holder's value lands on
    /// the value side (the race between the read and the lock of a split store).
    struct LandsFirst {
        locks: MemoryStore,
        values: Arc<MemoryStore>,
    }

    impl LockStore for LandsFirst {
        fn lock<'a>(&'a self, op: LockOp<'a>) -> BoxFuture<'a, StoreResult<Reply>> {
            let LockOp::TryLock { keys, lease, .. } = op else {
                return self.locks.lock(op);
            };
            Box::pin(async move {
                let landed = b"landed".to_vec();
                self.values.set(keys, landed, HOUR, lease).await?;
                self.locks.lock(op).await
            })
        }

        fn listen<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Listener>> {
            self.locks.listen(keys)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_value_that_lands_before_the_lock_is_read_and_the_lock_let_go() {
        let values = Arc::new(MemoryStore::default());
        let lands = Arc::new(LandsFirst {
            locks: MemoryStore::default(),
            values: Arc::clone(&values),
        });
        let store = SplitStore {
            values: values as Arc<dyn Store>,
            locks: Arc::clone(&lands) as Arc<dyn LockStore>,
        };
        let k = keys();
        let answer = store.read_or_lock(&k, "a", LEASE, true).await.unwrap();
        assert_eq!(answer, ReadOrLock::Value(b"landed".to_vec()));
        let next = lands.locks.try_lock(&k, "b", LEASE).await.unwrap();
        assert!(
            matches!(next, Acquire::Acquired { .. }),
            "the lock taken over the value is freed"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn set_and_invalidate_refuse_the_write_of_a_holder_that_locked_before() {
        let (store, _values, _locks) = split();
        let k = keys();
        let fence = fence_of(&store, &k, "a", true).await;
        store.set(&k, b"new".to_vec(), HOUR, LEASE).await.unwrap();
        let late = store.store_and_unlock(&k, "a", fence, value(b"old")).await;
        assert!(!late.unwrap().written);
        assert_eq!(stored(&store, &k).await.as_deref(), Some(&b"new"[..]));

        let fence = fence_of(&store, &k, "b", false).await;
        store.invalidate(&k, LEASE).await.unwrap();
        let late = store.store_and_unlock(&k, "b", fence, value(b"old")).await;
        assert!(!late.unwrap().written);
        assert_eq!(stored(&store, &k).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_wakes_the_waiters_on_the_value_side() {
        let (store, _values, _locks) = split();
        let k = keys();
        fence_of(&store, &k, "a", true).await;
        let mut waiter = store.listen(&k).await.unwrap();
        assert!(store.unlock(&k, "a").await.unwrap());
        tokio::time::timeout(LEASE, waiter.notified())
            .await
            .expect("woken by the release, not at its backoff");
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_keep_the_value_sides_fence_through_a_long_computation() {
        let (store, _values, _locks) = split();
        let k = keys();
        let fence = fence_of(&store, &k, "a", true).await;
        // Many times the counter's retention (two leases), renewed every third of a lease.
        for _ in 0..30 {
            tokio::time::sleep(LEASE / 3).await;
            assert!(store.extend(&k, "a", LEASE).await.unwrap());
        }
        let Stored { written, released } = store
            .store_and_unlock(&k, "a", fence, value(b"v"))
            .await
            .unwrap();
        assert!(written, "the holder's token lapsed on the value side");
        assert!(released);
    }
}
