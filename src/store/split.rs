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

use super::{
    Acquire, Blob, BoxFuture, LockStore, ManyWithEpochs, ReadOrLock, Store, StoreResult, Stored,
    Write,
};
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

    // Epochs and births live with the values they judge.
    fn born<'a>(&'a self, clock: &'a str) -> BoxFuture<'a, StoreResult<u64>> {
        self.values.born(clock)
    }

    fn epochs<'a>(&'a self, names: &'a [String]) -> BoxFuture<'a, StoreResult<Vec<u64>>> {
        self.values.epochs(names)
    }

    fn raise_epochs<'a>(
        &'a self,
        names: &'a [String],
        floor: u64,
    ) -> BoxFuture<'a, StoreResult<()>> {
        self.values.raise_epochs(names, floor)
    }

    fn get_with_epochs<'a>(
        &'a self,
        keys: &'a EntryKeys,
        names: &'a Arc<[String]>,
    ) -> BoxFuture<'a, StoreResult<(Option<Blob>, Vec<u64>)>> {
        self.values.get_with_epochs(keys, names)
    }

    fn get_many_with_epochs<'a>(
        &'a self,
        entries: &'a [&'a EntryKeys],
        names: &'a [String],
    ) -> BoxFuture<'a, StoreResult<ManyWithEpochs>> {
        self.values.get_many_with_epochs(entries, names)
    }

    fn ping(&self) -> BoxFuture<'_, StoreResult<()>> {
        self.values.ping()
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
            ReadOrLock::Acquired { fence } => fence,
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
        fn try_lock<'a>(
            &'a self,
            keys: &'a EntryKeys,
            token: &'a str,
            lease: Duration,
        ) -> BoxFuture<'a, StoreResult<Acquire>> {
            Box::pin(async move {
                let landed = b"landed".to_vec();
                self.values.set(keys, landed, HOUR, lease).await?;
                self.locks.try_lock(keys, token, lease).await
            })
        }

        fn extend<'a>(
            &'a self,
            keys: &'a EntryKeys,
            token: &'a str,
            lease: Duration,
        ) -> BoxFuture<'a, StoreResult<bool>> {
            self.locks.extend(keys, token, lease)
        }

        fn unlock<'a>(
            &'a self,
            keys: &'a EntryKeys,
            token: &'a str,
        ) -> BoxFuture<'a, StoreResult<bool>> {
            self.locks.unlock(keys, token)
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
