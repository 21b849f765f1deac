//! The embedded store: one process, no server. The default of [`Cache::in_memory`].
//!
//! It keeps the same semantics as the Redis store (TTLs, leases, fencing, wake-ups) so that code
//! written against it behaves the same on Redis. Time is `tokio::time`, so tests can pause it.
//!
//! [`Cache::in_memory`]: crate::Cache::in_memory
//!
//! Explained in the guide: `docs/how-it-works.md` (the same protocol, in one process).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::{
    retention, Acquire, Blob, BoxFuture, LockStore, ReadOrLock, Store, StoreResult, Stored, Write,
};
use crate::options::FOREVER;
use crate::wait::wakeup::{lock, Listener, Wakeups};
use crate::wire::key::EntryKeys;

/// Sweep expired entries after this many writes, so memory stays bounded by the live entries.
const SWEEP_EVERY: u64 = 1024;

#[derive(Debug)]
pub(crate) struct MemoryStore {
    /// One mutex for all maps: every operation is one short critical section without `.await`,
    /// which is what makes each operation atomic, as a Lua script is in Redis.
    state: Mutex<State>,
    wakeups: Arc<Wakeups>,
    /// The wall clock at creation, and the tokio instant it corresponds to: `now_ms` moves with
    /// `tokio::time`, so freshness follows paused time in tests like TTLs do.
    epoch_ms: u64,
    epoch: Instant,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore {
            state: Mutex::default(),
            wakeups: Arc::default(),
            epoch_ms: super::system_now_ms(),
            epoch: Instant::now(),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    values: HashMap<String, Expiring<Arc<[u8]>>>,
    locks: HashMap<String, Expiring<String>>,
    fences: HashMap<String, Expiring<u64>>,
    /// A leader's last run: its fence and when it started (the store's clock, ms).
    runs: HashMap<String, Expiring<(u64, u64)>>,
    /// The highest fencing token handed out, so that a re-seeded counter never repeats one even
    /// when tokio's clock is paused and the wall clock has not moved.
    high_water: u64,
    writes: u64,
}

#[derive(Debug)]
struct Expiring<T> {
    item: T,
    /// `None`: no expiry (a duration of [`FOREVER`]), as a Redis key without a TTL.
    until: Option<Instant>,
}

impl<T> Expiring<T> {
    fn live(&self, now: Instant) -> bool {
        self.until.is_none_or(|until| until > now)
    }
}

fn live<'m, T>(map: &'m HashMap<String, Expiring<T>>, key: &str, now: Instant) -> Option<&'m T> {
    map.get(key).filter(|e| e.live(now)).map(|e| &e.item)
}

/// When something kept for `d` from `now` expires: never for [`FOREVER`] (the stores' shared
/// reading of it), so no deadline past the monotonic clock's range is ever computed.
fn deadline(now: Instant, d: Duration) -> Option<Instant> {
    (d < FOREVER).then(|| now + d)
}

/// The later of two expiries, `None` (never) being the latest.
fn later(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    Some(a?.max(b?))
}

impl State {
    /// Bumps the counter and keeps it at least `retention` longer (never shorter than before:
    /// it may be guarding a value that lives longer).
    /// `wall_us`: the store's wall clock in microseconds, which seeds a lapsed counter.
    fn bump_fence(&mut self, key: &str, retention: Duration, now: Instant, wall_us: u64) -> u64 {
        let retained = deadline(now, retention);
        let (next, until) = match self.fences.get(key).filter(|e| e.live(now)) {
            Some(e) => (e.item + 1, later(e.until, retained)),
            // Seeded from the clock in microseconds, like the Redis script: a counter that lapsed
            // never hands out a token at or below one handed out before (in memory the
            // high-water mark makes this certain; on Redis it rests on the server's clock).
            None => (wall_us.max(self.high_water).saturating_add(1), retained),
        };
        self.high_water = self.high_water.max(next);
        self.fences
            .insert(key.to_owned(), Expiring { item: next, until });
        next
    }

    /// Keeps a live counter at least until `until`: it guards what lives that long (a value).
    fn keep_fence(&mut self, key: &str, until: Option<Instant>, now: Instant) {
        if let Some(fence) = self.fences.get_mut(key).filter(|e| e.live(now)) {
            fence.until = later(fence.until, until);
        }
    }

    /// Writes a value for `ttl`, and keeps the fencing counter at least as long.
    fn put_value(&mut self, keys: &EntryKeys, value: Vec<u8>, ttl: Duration, now: Instant) {
        let until = deadline(now, ttl);
        self.values.insert(
            keys.value.clone(),
            Expiring {
                item: Arc::from(value),
                until,
            },
        );
        self.keep_fence(keys.fence(), until, now);
    }

    /// Raises the counter to at least `floor`, keeping it at least `retention` longer; with a
    /// `floor` of 0, only keeps a live counter.
    fn raise_fence(&mut self, key: &str, floor: u64, retention: Duration, now: Instant) {
        let kept = self.fences.get(key).filter(|e| e.live(now));
        let (current, until) = match kept {
            Some(e) => (e.item, later(e.until, deadline(now, retention))),
            // As in Redis: raising a missing counter to 0 (only keeping it alive) creates none.
            None if floor == 0 => return,
            None => (0, deadline(now, retention)),
        };
        self.fences.insert(
            key.to_owned(),
            Expiring {
                item: current.max(floor),
                until,
            },
        );
        self.high_water = self.high_water.max(floor);
    }

    /// Carries out a fenced write that was accepted.
    fn apply(&mut self, keys: &EntryKeys, write: Write, now: Instant) {
        match write {
            Write::Value { bytes, ttl } => self.put_value(keys, bytes, ttl, now),
            Write::Delete => {
                self.values.remove(&keys.value);
            }
            Write::Keep { bytes, at_least } => {
                // As `set_keeping` in the scripts: the value's life is never shortened, and
                // the fencing counter is kept as long as the value.
                let wanted = deadline(now, at_least);
                let current = self.values.get(&keys.value).filter(|e| e.live(now));
                let until = match current {
                    Some(e) => later(e.until, wanted),
                    None => wanted,
                };
                self.values.insert(
                    keys.value.clone(),
                    Expiring {
                        item: Arc::from(bytes),
                        until,
                    },
                );
                self.keep_fence(keys.fence(), until, now);
            }
        }
    }

    fn wrote(&mut self, now: Instant) {
        self.writes += 1;
        if self.writes.is_multiple_of(SWEEP_EVERY) {
            self.values.retain(|_, e| e.live(now));
            self.locks.retain(|_, e| e.live(now));
            self.fences.retain(|_, e| e.live(now));
            self.runs.retain(|_, e| e.live(now));
        }
    }
}

impl MemoryStore {
    /// The store's wall clock in microseconds at `now`: like `now_ms`, it moves with
    /// `tokio::time`, so a counter re-seeded after paused time passed is seeded later, as on Redis.
    fn wall_us(&self, now: Instant) -> u64 {
        let elapsed = u64::try_from((now - self.epoch).as_micros()).unwrap_or(u64::MAX);
        self.epoch_ms.saturating_mul(1000).saturating_add(elapsed)
    }

    fn with_state<R>(&self, f: impl FnOnce(&mut State, Instant) -> R) -> R {
        let now = Instant::now();
        f(&mut lock(&self.state), now)
    }
}

impl LockStore for MemoryStore {
    fn try_lock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<Acquire>> {
        Box::pin(async move { Ok(self.read_or_lock(keys, token, lease, false).await?.into()) })
    }

    fn extend<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<bool>> {
        let extended = self.with_state(|s, now| {
            let ours = live(&s.locks, keys.lock(), now).is_some_and(|t| t == token);
            if ours {
                if let Some(l) = s.locks.get_mut(keys.lock()) {
                    l.until = deadline(now, lease);
                }
                s.keep_fence(keys.fence(), deadline(now, retention(lease)), now);
            }
            ours
        });
        Box::pin(std::future::ready(Ok(extended)))
    }

    fn unlock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
    ) -> BoxFuture<'a, StoreResult<bool>> {
        let released = self.with_state(|s, now| {
            let ours = live(&s.locks, keys.lock(), now).is_some_and(|t| t == token);
            if ours {
                s.locks.remove(keys.lock());
            }
            ours
        });
        if released {
            self.wakeups.notify(keys.channel());
        }
        Box::pin(std::future::ready(Ok(released)))
    }

    fn listen<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Listener>> {
        Box::pin(std::future::ready(Ok(self.wakeups.listen(keys.channel()))))
    }

    fn record_run<'a>(
        &'a self,
        keys: &'a EntryKeys,
        fence: u64,
        keep: Duration,
    ) -> BoxFuture<'a, StoreResult<bool>> {
        let at = self.now_ms();
        let recorded = self.with_state(|s, now| {
            let key = keys.last_run();
            if live(&s.runs, &key, now).is_some_and(|(newer, _)| *newer > fence) {
                return false;
            }
            s.runs.insert(
                key,
                Expiring {
                    item: (fence, at),
                    until: deadline(now, keep),
                },
            );
            s.wrote(now);
            true
        });
        Box::pin(std::future::ready(Ok(recorded)))
    }

    fn since_last_run<'a>(
        &'a self,
        keys: &'a EntryKeys,
    ) -> BoxFuture<'a, StoreResult<Option<Duration>>> {
        let now_ms = self.now_ms();
        let since = self.with_state(|s, now| {
            live(&s.runs, &keys.last_run(), now)
                .map(|(_, at)| Duration::from_millis(now_ms.saturating_sub(*at)))
        });
        Box::pin(std::future::ready(Ok(since)))
    }

    fn next_fence<'a>(
        &'a self,
        keys: &'a EntryKeys,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<u64>> {
        let fence = self.with_state(|s, now| {
            s.bump_fence(keys.fence(), retention(lease), now, self.wall_us(now))
        });
        Box::pin(std::future::ready(Ok(fence)))
    }

    fn raise_fence<'a>(
        &'a self,
        keys: &'a EntryKeys,
        floor: u64,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<()>> {
        self.with_state(|s, now| {
            s.raise_fence(keys.fence(), floor, retention(lease), now);
        });
        Box::pin(std::future::ready(Ok(())))
    }
}

impl Store for MemoryStore {
    fn write_fenced<'a>(
        &'a self,
        keys: &'a EntryKeys,
        fence: u64,
        write: Write,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<bool>> {
        let written = self.with_state(|s, now| {
            let current = live(&s.fences, keys.fence(), now).copied().unwrap_or(0);
            if current > fence {
                return false;
            }
            s.raise_fence(keys.fence(), fence, retention(lease), now);
            s.apply(keys, write, now);
            s.wrote(now);
            true
        });
        self.wakeups.notify(keys.channel());
        Box::pin(std::future::ready(Ok(written)))
    }

    fn get<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Option<Blob>>> {
        let value = self.with_state(|s, now| {
            live(&s.values, &keys.value, now).map(|v| Blob::Shared(Arc::clone(v)))
        });
        Box::pin(std::future::ready(Ok(value)))
    }

    fn read_or_lock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        lease: Duration,
        read_value: bool,
    ) -> BoxFuture<'a, StoreResult<ReadOrLock>> {
        let answer = self.with_state(|s, now| {
            if read_value {
                if let Some(v) = live(&s.values, &keys.value, now) {
                    return ReadOrLock::Value(v.to_vec());
                }
            }
            if let Some(held) = s.locks.get(keys.lock()).filter(|e| e.live(now)) {
                return ReadOrLock::Held {
                    expires_in: held.until.map(|until| until - now),
                };
            }
            s.locks.insert(
                keys.lock().to_owned(),
                Expiring {
                    item: token.to_owned(),
                    until: deadline(now, lease),
                },
            );
            let fence = s.bump_fence(keys.fence(), retention(lease), now, self.wall_us(now));
            s.wrote(now);
            ReadOrLock::Acquired { fence }
        });
        Box::pin(std::future::ready(Ok(answer)))
    }

    fn store_and_unlock<'a>(
        &'a self,
        keys: &'a EntryKeys,
        token: &'a str,
        fence: u64,
        write: Write,
    ) -> BoxFuture<'a, StoreResult<Stored>> {
        let stored = self.with_state(|s, now| {
            let written = live(&s.fences, keys.fence(), now) == Some(&fence);
            if written {
                s.apply(keys, write, now);
            }
            let released = live(&s.locks, keys.lock(), now).is_some_and(|t| t == token);
            if released {
                s.locks.remove(keys.lock());
            }
            s.wrote(now);
            Stored { written, released }
        });
        self.wakeups.notify(keys.channel());
        Box::pin(std::future::ready(Ok(stored)))
    }

    fn set<'a>(
        &'a self,
        keys: &'a EntryKeys,
        value: Vec<u8>,
        ttl: Duration,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<()>> {
        self.with_state(|s, now| {
            s.bump_fence(keys.fence(), retention(lease), now, self.wall_us(now));
            s.put_value(keys, value, ttl, now);
            s.wrote(now);
        });
        self.wakeups.notify(keys.channel());
        Box::pin(std::future::ready(Ok(())))
    }

    fn invalidate<'a>(
        &'a self,
        keys: &'a EntryKeys,
        lease: Duration,
    ) -> BoxFuture<'a, StoreResult<()>> {
        self.with_state(|s, now| {
            s.bump_fence(keys.fence(), retention(lease), now, self.wall_us(now));
            s.values.remove(&keys.value);
            s.wrote(now);
        });
        self.wakeups.notify(keys.channel());
        Box::pin(std::future::ready(Ok(())))
    }

    fn wake<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<()>> {
        self.wakeups.notify(keys.channel());
        Box::pin(std::future::ready(Ok(())))
    }

    fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.epoch_ms.saturating_add(elapsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(k: &str) -> EntryKeys {
        EntryKeys::new("t", k).unwrap()
    }

    fn value(bytes: &[u8], ttl: Duration) -> Write {
        Write::Value {
            bytes: bytes.to_vec(),
            ttl,
        }
    }

    /// The counter's expiry and the value's: `None` is none (kept for ever).
    fn expiries(store: &MemoryStore, k: &EntryKeys) -> (Option<Instant>, Option<Instant>) {
        let s = lock(&store.state);
        let fence = s.fences.get(k.fence()).map(|e| e.until).unwrap();
        let value = s.values.get(&k.value).map(|e| e.until).unwrap();
        (fence, value)
    }

    #[tokio::test(start_paused = true)]
    async fn the_fencing_counter_lives_as_long_as_the_value_it_guards() {
        let store = MemoryStore::default();
        let lease = Duration::from_millis(100);
        for (name, ttl) in [("hour", Duration::from_secs(3600)), ("forever", FOREVER)] {
            let k = keys(name);
            let ReadOrLock::Acquired { fence } =
                store.read_or_lock(&k, "A", lease, true).await.unwrap()
            else {
                panic!("a free lock must be granted");
            };
            let stored = store
                .store_and_unlock(&k, "A", fence, value(b"v", ttl))
                .await
                .unwrap();
            assert!(stored.written);
            // Many leases later the counter still guards the value: an acquisition continues it.
            tokio::time::advance(lease * 50).await;
            let (fence_until, value_until) = expiries(&store, &k);
            assert_eq!(fence_until, value_until, "{name}");
            let ReadOrLock::Acquired { fence: next } =
                store.read_or_lock(&k, "B", lease, false).await.unwrap()
            else {
                panic!("a free lock must be granted");
            };
            assert_eq!(
                next,
                fence + 1,
                "{name}: the counter was kept, not re-seeded"
            );
            // A bump with a short retention does not shorten it either.
            assert_eq!(expiries(&store, &k), (fence_until, value_until), "{name}");
            // A late writer with the old token is refused.
            let late = store
                .store_and_unlock(&k, "A", fence, value(b"late", ttl))
                .await
                .unwrap();
            assert!(!late.written, "{name}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_fenced_delete_removes_only_the_value_it_was_to_replace() {
        let store = MemoryStore::default();
        let k = keys("a");
        let lease = Duration::from_secs(5);
        let hour = Duration::from_secs(3600);
        store.set(&k, b"old".to_vec(), hour, lease).await.unwrap();
        let ReadOrLock::Acquired { fence } =
            store.read_or_lock(&k, "A", lease, false).await.unwrap()
        else {
            panic!("a free lock must be granted");
        };
        // Another writer lands while A computes: A's delete must not remove it.
        store.set(&k, b"new".to_vec(), hour, lease).await.unwrap();
        let out = store
            .store_and_unlock(&k, "A", fence, Write::Delete)
            .await
            .unwrap();
        assert_eq!(
            out,
            Stored {
                written: false,
                released: true
            }
        );
        assert_eq!(store.get(&k).await.unwrap().as_deref(), Some(&b"new"[..]));
        // Nobody in between: the delete goes through.
        let ReadOrLock::Acquired { fence } =
            store.read_or_lock(&k, "A", lease, false).await.unwrap()
        else {
            panic!("a free lock must be granted");
        };
        let out = store
            .store_and_unlock(&k, "A", fence, Write::Delete)
            .await
            .unwrap();
        assert!(out.written && out.released);
        assert!(store.get(&k).await.unwrap().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn values_expire_after_their_ttl() {
        let store = MemoryStore::default();
        let k = keys("a");
        store
            .set(
                &k,
                b"v".to_vec(),
                Duration::from_secs(10),
                Duration::from_secs(1),
            )
            .await
            .unwrap();
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert_eq!(store.get(&k).await.unwrap().as_deref(), Some(&b"v"[..]));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(store.get(&k).await.unwrap().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_is_exclusive_until_its_lease_runs_out() {
        let store = MemoryStore::default();
        let k = keys("a");
        let lease = Duration::from_secs(5);
        let ReadOrLock::Acquired { fence: first } =
            store.read_or_lock(&k, "A", lease, true).await.unwrap()
        else {
            panic!("a free lock must be granted");
        };
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(
            store.read_or_lock(&k, "B", lease, true).await.unwrap(),
            ReadOrLock::Held {
                expires_in: Some(Duration::from_secs(3))
            }
        );
        tokio::time::advance(Duration::from_secs(3)).await;
        let ReadOrLock::Acquired { fence: second } =
            store.read_or_lock(&k, "B", lease, true).await.unwrap()
        else {
            panic!("an expired lock must be granted to the next caller");
        };
        assert!(second > first);
        assert!(
            !store.extend(&k, "A", lease).await.unwrap(),
            "A lost the lease"
        );
        let stale = store
            .store_and_unlock(&k, "A", first, value(b"old", lease))
            .await
            .unwrap();
        assert_eq!(
            stale,
            Stored {
                written: false,
                released: false
            }
        );
        let fresh = store
            .store_and_unlock(&k, "B", second, value(b"new", lease))
            .await
            .unwrap();
        assert_eq!(
            fresh,
            Stored {
                written: true,
                released: true
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn invalidation_refuses_the_write_of_a_computation_in_flight() {
        let store = MemoryStore::default();
        let k = keys("a");
        let lease = Duration::from_secs(5);
        let ReadOrLock::Acquired { fence } =
            store.read_or_lock(&k, "A", lease, true).await.unwrap()
        else {
            panic!("a free lock must be granted");
        };
        store.invalidate(&k, lease).await.unwrap();
        let out = store
            .store_and_unlock(&k, "A", fence, value(b"v", lease))
            .await
            .unwrap();
        assert_eq!(
            out,
            Stored {
                written: false,
                released: true
            }
        );
        assert!(store.get(&k).await.unwrap().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn fencing_tokens_keep_rising_after_the_counter_lapses() {
        let store = MemoryStore::default();
        let k = keys("a");
        let lease = Duration::from_millis(100);
        let mut last = 0;
        for _ in 0..3 {
            let ReadOrLock::Acquired { fence } =
                store.read_or_lock(&k, "A", lease, false).await.unwrap()
            else {
                panic!("the lock must be free");
            };
            assert!(fence > last);
            last = fence;
            // Past the lock's lease and the counter's retention.
            tokio::time::advance(lease * (super::super::FENCE_RETENTION_LEASES + 1)).await;
        }
    }
    #[tokio::test(start_paused = true)]
    async fn a_late_run_record_of_an_older_term_does_not_move_the_schedule_back() {
        let store = MemoryStore::default();
        let k = keys("job");
        let keep = Duration::from_secs(60);
        assert_eq!(store.since_last_run(&k).await.unwrap(), None);
        assert!(store.record_run(&k, 7, keep).await.unwrap());
        tokio::time::advance(Duration::from_secs(5)).await;
        // The old term (fence 6) resumes from a pause and tries to record a run: refused.
        assert!(!store.record_run(&k, 6, keep).await.unwrap());
        assert_eq!(
            store.since_last_run(&k).await.unwrap(),
            Some(Duration::from_secs(5))
        );
        // The same term's next run moves it forward.
        assert!(store.record_run(&k, 7, keep).await.unwrap());
        assert_eq!(
            store.since_last_run(&k).await.unwrap(),
            Some(Duration::ZERO)
        );
    }
}

#[cfg(test)]
#[path = "memory_model_tests.rs"]
mod model_tests;
