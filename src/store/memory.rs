//! The embedded store: one process, no server. The default of [`Cache::in_memory`].
//!
//! It keeps the same semantics as the Redis store (TTLs, leases, fencing, wake-ups) so that code
//! written against it behaves the same on Redis. Time is `tokio::time`, so tests can pause it.
//!
//! # Layout and atomicity
//! Every key of one entry (value, lock, fencing counter, a leader's last run) lives in one
//! [`Entry`], found by the entry's value key in one of [`SHARDS`] shards chosen by that key's
//! hash. Every operation touches one entry, so it is one short critical section of one shard's
//! mutex, without `.await`: atomic, as a Lua script is in Redis, while operations on other
//! shards run in parallel.
//!
//! # Bounds
//! Values are bounded by count and by bytes ([`MemoryLimits`]); eviction is S3-FIFO, spread over
//! the shards (see `shard.rs`), and costs a few steps per write, never a sweep. Only values are
//! evicted: a lock is held until its lease runs out, and a fencing counter lives as long as the
//! value it guards (after an eviction, as long as the leases need it). Expired parts are dropped
//! when an operation meets them and by a hand that visits a few slots of the shard per write.
//!
//! # The hit path
//! A value read through `get_or_compute` is also kept decoded next to its bytes (and goes with
//! them), so a later hit of a fresh value clones the decoded `T` instead of decoding the bytes
//! again: [`MemoryStore::fresh`].
//!
//! [`Cache::in_memory`]: crate::Cache::in_memory

mod entry;
mod shard;

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use self::entry::{deadline, Decoded, Entry, Expiring};
use self::shard::{Shard, Step, Totals};
use super::calls::one_by_one;
use super::{
    retention, Blob, BoxFuture, LockOp, LockPeek, LockStore, Op, ReadOrLock, Reply, Store,
    StoreExt, StoreResult, Stored, Write,
};
use crate::store::wakeup::{Listener, Wakeups};
use crate::sync::lock;
#[cfg(test)]
use crate::time::FOREVER;
use crate::wire::key::{value_key_into, EntryKeys};

/// How many shards: enough that two threads rarely meet on one on a machine of a few dozen
/// cores, few enough that eviction's round of the shards stays short.
const SHARDS: usize = 64;

/// How many slots of its shard a write's sweep hand visits.
const SWEEP_STEPS: usize = 4;

/// The most eviction steps one operation takes; if the store is still over its bounds (values
/// read while they waited are moved on, not evicted), the next write goes on.
const MAX_EVICTION_STEPS: usize = 4 * SHARDS;

/// The embedded store's bounds: how many values and how many bytes of them it keeps. Given to
/// [`CacheBuilder::in_memory_with`](crate::CacheBuilder::in_memory_with);
/// [`Cache::in_memory`](crate::Cache::in_memory) uses the defaults.
///
/// | setting | default |
/// |---|---|
/// | [`max_entries`](Self::max_entries) | 1,000,000 |
/// | [`max_bytes`](Self::max_bytes) | 256 MiB |
///
/// Past either bound, values are evicted, favouring those read more than once over those read
/// once (a scan of keys read once does not push out the keys read again: S3-FIFO). Locks and
/// fencing counters are not values: they are never evicted (they expire with their leases), so
/// a computation's lock holds and its write is fenced as without a bound.
///
/// ```
/// use stampede_guard::{Cache, MemoryLimits};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// let limits = MemoryLimits::default().max_entries(10_000).max_bytes(16 << 20);
/// assert_eq!(limits.get_max_entries(), 10_000);
/// let cache = Cache::builder().in_memory_with(limits).build().await?;
/// # let _ = cache;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[must_use]
pub struct MemoryLimits {
    pub(crate) max_entries: u64,
    pub(crate) max_bytes: u64,
}

impl Default for MemoryLimits {
    fn default() -> Self {
        MemoryLimits {
            max_entries: 1_000_000,
            max_bytes: 256 << 20,
        }
    }
}

impl MemoryLimits {
    /// At most this many values (default 1,000,000; at least 1).
    ///
    /// ```
    /// let limits = stampede_guard::MemoryLimits::default().max_entries(0);
    /// assert_eq!(limits.get_max_entries(), 1);
    /// ```
    pub fn max_entries(mut self, max_entries: u64) -> Self {
        self.max_entries = max_entries.max(1);
        self
    }

    /// At most this many bytes of values (default 256 MiB; at least 1), each counted as its
    /// encoded size (twice once it is also held decoded for fast hits), its key, and 96 bytes of
    /// bookkeeping. A value larger than this is written and evicted at once.
    ///
    /// ```
    /// let limits = stampede_guard::MemoryLimits::default().max_bytes(1 << 20);
    /// assert_eq!(limits.get_max_bytes(), 1 << 20);
    /// ```
    pub fn max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes.max(1);
        self
    }

    /// The value-count bound in force.
    ///
    /// ```
    /// assert_eq!(stampede_guard::MemoryLimits::default().get_max_entries(), 1_000_000);
    /// ```
    pub fn get_max_entries(&self) -> u64 {
        self.max_entries
    }

    /// The byte bound in force.
    ///
    /// ```
    /// assert_eq!(stampede_guard::MemoryLimits::default().get_max_bytes(), 256 << 20);
    /// ```
    pub fn get_max_bytes(&self) -> u64 {
        self.max_bytes
    }
}

#[derive(Debug)]
pub(crate) struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    totals: Totals,
    limits: MemoryLimits,
    /// The highest fencing token handed out, so that a re-seeded counter never repeats one even
    /// when tokio's clock is paused and the wall clock has not moved. Raised under the shard
    /// lock of the key whose token it is, so that key's next re-seed sees it.
    high_water: AtomicU64,
    /// The shard eviction takes its next step in.
    evict_hand: AtomicUsize,
    wakeups: Arc<Wakeups>,
    /// The wall clock at creation, and the tokio instant it corresponds to: `now_ms` moves with
    /// `tokio::time`, so freshness follows paused time in tests like TTLs do.
    epoch_ms: u64,
    epoch: Instant,
    /// The epochs raised by `clear` and `invalidate_tag` (by name; never removed: they are a
    /// few per tag ever invalidated). Checked by every read of a value that carries them.
    epochs: RwLock<HashMap<String, u64>>,
    /// Whether any epoch was ever raised: until then the hit path takes no lock for them.
    raised: AtomicBool,
    /// The clock births and epochs are read from: a counter, strictly increasing, so a
    /// computation that starts after an invalidation returned is born after it.
    clock: AtomicU64,
    /// The simulation's clock, when the simulated server made this store: births are read from
    /// it instead (see `simulated.rs`), so that they, the epochs and the simulation's history
    /// share one clock that never goes back, across restarts too.
    #[cfg(feature = "simulation")]
    shared_clock: Option<Arc<AtomicU64>>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new(MemoryLimits::default())
    }
}

thread_local! {
    /// The value key of a hit, built here so that a hit allocates nothing for it.
    static VALUE_KEY: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

impl MemoryStore {
    pub(crate) fn new(limits: MemoryLimits) -> Self {
        MemoryStore::starting_at(limits, super::system_now_ms())
    }

    /// A store whose wall clock reads `epoch_ms` now (the simulation's, which must not read
    /// the machine's).
    pub(crate) fn starting_at(limits: MemoryLimits, epoch_ms: u64) -> Self {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            totals: Totals::default(),
            limits,
            high_water: AtomicU64::new(0),
            evict_hand: AtomicUsize::new(0),
            wakeups: Arc::default(),
            epoch_ms,
            epoch: Instant::now(),
            epochs: RwLock::default(),
            raised: AtomicBool::new(false),
            clock: AtomicU64::new(0),
            #[cfg(feature = "simulation")]
            shared_clock: None,
        }
    }

    /// The simulated server's store: births and epochs on the simulation's `clock`.
    #[cfg(feature = "simulation")]
    pub(crate) fn simulated(limits: MemoryLimits, epoch_ms: u64, clock: Arc<AtomicU64>) -> Self {
        MemoryStore {
            shared_clock: Some(clock),
            ..MemoryStore::starting_at(limits, epoch_ms)
        }
    }

    /// Whether a value born at `born` outlived every epoch of `names`: none was raised at or
    /// after its birth.
    fn alive(&self, born: u64, names: &[String]) -> bool {
        if !self.raised.load(Ordering::Acquire) {
            return true;
        }
        let epochs = self.epochs.read().unwrap_or_else(PoisonError::into_inner);
        names
            .iter()
            .all(|name| epochs.get(name).is_none_or(|&epoch| born > epoch))
    }

    /// The store's wall clock in microseconds at `now`: like `now_ms`, it moves with
    /// `tokio::time`, so a counter re-seeded after paused time passed is seeded later, as on Redis.
    fn wall_us(&self, now: Instant) -> u64 {
        let elapsed = u64::try_from((now - self.epoch).as_micros()).unwrap_or(u64::MAX);
        self.epoch_ms.saturating_mul(1000).saturating_add(elapsed)
    }

    /// [`StoreExt::now_ms`] at `now`.
    fn ms_at(&self, now: Instant) -> u64 {
        let elapsed = u64::try_from(now.saturating_duration_since(self.epoch).as_millis())
            .unwrap_or(u64::MAX);
        self.epoch_ms.saturating_add(elapsed)
    }

    /// The shard of a value key. Not the maps' own hash (SipHash, DoS-resistant): keys that an
    /// attacker makes collide here only share a mutex.
    fn shard(&self, value_key: &str) -> &Mutex<Shard> {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let bytes = value_key.as_bytes();
        let mut words = bytes.chunks_exact(8);
        let mut hash = bytes.len() as u64;
        for word in &mut words {
            let word: [u8; 8] = word.try_into().unwrap_or_default();
            hash = (hash.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
        }
        let mut last = [0u8; 8];
        last[..words.remainder().len()].copy_from_slice(words.remainder());
        hash = (hash.rotate_left(5) ^ u64::from_le_bytes(last)).wrapping_mul(K);
        &self.shards[(hash >> 32) as usize % SHARDS]
    }

    /// Runs `op` on the entry of `keys`, atomically; then sweeps a few slots of the shard and
    /// evicts what the bounds ask for.
    fn update<R>(&self, keys: &EntryKeys, op: impl FnOnce(&mut Entry, Instant) -> R) -> R {
        let now = Instant::now();
        let answer = {
            let mut shard = lock(self.shard(&keys.value));
            let answer = shard.update(&keys.value, now, &self.totals, |entry| op(entry, now));
            shard.sweep(SWEEP_STEPS, now, &self.totals);
            answer
        };
        self.enforce_limits(now);
        answer
    }

    /// Runs `op` on the entry of `keys` as a read (nothing created or removed).
    fn read<R>(&self, keys: &EntryKeys, op: impl FnOnce(Option<&Entry>, Instant) -> R) -> R {
        let now = Instant::now();
        lock(self.shard(&keys.value)).read(&keys.value, now, |entry| op(entry, now))
    }

    fn over_limits(&self) -> bool {
        self.totals.values.load(Ordering::Relaxed) > self.limits.max_entries
            || self.totals.bytes.load(Ordering::Relaxed) > self.limits.max_bytes
    }

    /// Evicts, one shard at a time (never two locks held), until the store is within its bounds.
    /// While a tenth or more of the values are on probation, they go first (S3-FIFO's small
    /// queue); otherwise the main queues give up their least read.
    fn enforce_limits(&self, now: Instant) {
        let mut idle = 0;
        for _ in 0..MAX_EVICTION_STEPS {
            if !self.over_limits() || idle >= SHARDS {
                return;
            }
            let values = self.totals.values.load(Ordering::Relaxed);
            let probation = self.totals.probation.load(Ordering::Relaxed);
            let from_probation = probation > 0 && probation.saturating_mul(10) >= values;
            let at = self.evict_hand.fetch_add(1, Ordering::Relaxed) % SHARDS;
            let step = lock(&self.shards[at]).evict_one(from_probation, now, &self.totals);
            idle = if step == Step::Empty { idle + 1 } else { 0 };
        }
    }

    /// A fresh value of `key` as a `T`, if one is held decoded as a `T`: the hit path of
    /// `get_or_compute` (without XFetch), which then needs nothing else. `None` sends the call
    /// down the normal path, which reads the bytes (and keeps them decoded for next time).
    /// Keys that are not valid are never held: `None`, and the normal path reports them.
    pub(crate) fn fresh<T: Clone + 'static>(&self, namespace: &str, key: &str) -> Option<T> {
        if key.is_empty() || key.len() > crate::MAX_KEY_BYTES {
            return None;
        }
        let now = Instant::now();
        let decoded = VALUE_KEY.with_borrow_mut(|buffer| {
            buffer.clear();
            value_key_into(namespace, key, buffer);
            lock(self.shard(buffer)).read(buffer, now, |entry| entry?.value(now)?.decoded.clone())
        })?;
        // The same test as `freshness::judge` without XFetch: fresh strictly before fresh-until.
        if decoded.fresh_until_ms <= self.ms_at(now) || decoded.type_id != TypeId::of::<T>() {
            return None;
        }
        if !self.alive(decoded.born, &decoded.epochs) {
            return None;
        }
        decoded.value.downcast_ref::<T>().cloned()
    }

    /// Keeps `value`, decoded from `bytes` (as [`StoreExt::get`] handed them out), next to them,
    /// if they are still the value of `keys`: a write since the read replaced them, and then
    /// the decoded value would be of an older value.
    pub(crate) fn keep_decoded<T: Clone + Send + Sync + 'static>(
        &self,
        keys: &EntryKeys,
        bytes: &Arc<[u8]>,
        value: &T,
        fresh_until_ms: u64,
        born: u64,
        epochs: Box<[String]>,
    ) {
        let decoded = Arc::new(Decoded {
            type_id: TypeId::of::<T>(),
            value: Box::new(value.clone()),
            fresh_until_ms,
            born,
            epochs,
        });
        let now = Instant::now();
        lock(self.shard(&keys.value)).with_value(&keys.value, now, &self.totals, |held| {
            if Arc::ptr_eq(&held.bytes, bytes) {
                held.decoded = Some(decoded);
            }
        });
        // It weighs more now.
        self.enforce_limits(now);
    }
}

/// The lock operations, each one critical section of the entry's shard.
impl MemoryStore {
    fn extend_now(&self, keys: &EntryKeys, token: &str, lease: Duration) -> bool {
        self.update(keys, |e, now| {
            let ours = e.locked_by(token, now);
            if ours {
                if let Some(l) = e.lock.as_mut() {
                    l.until = deadline(now, lease);
                }
                e.lease_fence(retention(lease), now);
            }
            ours
        })
    }

    fn unlock_now(&self, keys: &EntryKeys, token: &str) -> bool {
        let released = self.update(keys, |e, now| {
            let ours = e.locked_by(token, now);
            if ours {
                e.lock = None;
            }
            ours
        });
        if released {
            self.wakeups.notify(keys.channel());
        }
        released
    }

    fn record_run_now(&self, keys: &EntryKeys, fence: u64, keep: Duration) -> bool {
        let at = self.now_ms();
        self.update(keys, |e, now| {
            if e.run(now).is_some_and(|(newer, _)| newer > fence) {
                return false;
            }
            e.run = Some(Expiring {
                item: (fence, at),
                until: deadline(now, keep),
            });
            true
        })
    }

    fn since_last_run_now(&self, keys: &EntryKeys) -> Option<Duration> {
        let now_ms = self.now_ms();
        self.read(keys, |e, now| {
            e?.run(now)
                .map(|(_, at)| Duration::from_millis(now_ms.saturating_sub(at)))
        })
    }

    fn peek_now(&self, keys: &EntryKeys) -> LockPeek {
        self.read(keys, |e, now| {
            let Some(e) = e else {
                return LockPeek::default();
            };
            LockPeek {
                holder: (e.lock(now))
                    .map(|held| (held.item.clone(), held.until.map(|until| until - now))),
                fence: e.fence(now),
            }
        })
    }

    /// Bumps the fencing counter of `keys`: the new token.
    fn next_fence_now(&self, keys: &EntryKeys, lease: Duration) -> u64 {
        self.update(keys, |e, now| self.bump(e, lease, now))
    }

    fn bump(&self, e: &mut Entry, lease: Duration, now: Instant) -> u64 {
        let n = e.bump_fence(retention(lease), now, self.wall_us(now), &self.high_water);
        // The simulated server stands for Redis, whose script hands out max(counter + 1, its
        // clock in µs) so that a failover that lost the last bumps hands out no token twice.
        // In one process no bump is ever lost: counter + 1 is enough there.
        #[cfg(feature = "simulation")]
        if self.shared_clock.is_some() {
            return e.raise_to_clock(n, self.wall_us(now), &self.high_water);
        }
        n
    }

    fn raise_fence_now(&self, keys: &EntryKeys, floor: u64, lease: Duration) {
        self.update(keys, |e, now| {
            e.raise_fence(floor, retention(lease), now, &self.high_water);
        });
    }
}

/// The value operations, each one critical section of the entry's shard (the epochs: of their
/// map); the waiters are woken after it.
impl MemoryStore {
    fn write_fenced_now(
        &self,
        keys: &EntryKeys,
        fence: u64,
        write: Write,
        lease: Duration,
    ) -> bool {
        let written = self.update(keys, |e, now| {
            if e.fence(now).unwrap_or(0) > fence {
                return false;
            }
            e.raise_fence(fence, retention(lease), now, &self.high_water);
            e.apply(write, now);
            true
        });
        self.wakeups.notify(keys.channel());
        written
    }

    fn get_now(&self, keys: &EntryKeys) -> Option<Blob> {
        self.read(keys, |e, now| {
            e?.value(now).map(|v| Blob::Shared(Arc::clone(&v.bytes)))
        })
    }

    fn read_or_lock_now(
        &self,
        keys: &EntryKeys,
        token: &str,
        lease: Duration,
        read_value: bool,
    ) -> ReadOrLock {
        self.update(keys, |e, now| {
            if read_value {
                if let Some(v) = e.value(now) {
                    return ReadOrLock::Value(v.bytes.to_vec());
                }
            }
            if let Some(held) = e.lock(now) {
                return ReadOrLock::Held {
                    expires_in: held.until.map(|until| until - now),
                };
            }
            e.lock = Some(Expiring {
                item: token.to_owned(),
                until: deadline(now, lease),
            });
            let fence = self.bump(e, lease, now);
            // The birth with the grant, as one Redis server's script answers it.
            ReadOrLock::Acquired {
                fence,
                born: Some(self.born_now()),
            }
        })
    }

    fn store_and_unlock_now(
        &self,
        keys: &EntryKeys,
        token: &str,
        fence: u64,
        write: Write,
    ) -> Stored {
        let stored = self.update(keys, |e, now| {
            let written = e.fence(now) == Some(fence)
                || crate::planted::on(crate::planted::Bug::FenceSkipped);
            if written {
                e.apply(write, now);
            }
            let released = e.locked_by(token, now);
            if released {
                e.lock = None;
            }
            Stored { written, released }
        });
        self.wakeups.notify(keys.channel());
        stored
    }

    fn set_now(&self, keys: &EntryKeys, value: Vec<u8>, ttl: Duration, lease: Duration) {
        self.update(keys, |e, now| {
            self.bump(e, lease, now);
            e.put_value(value, ttl, now);
        });
        self.wakeups.notify(keys.channel());
    }

    fn invalidate_now(&self, keys: &EntryKeys, lease: Duration) {
        self.update(keys, |e, now| {
            self.bump(e, lease, now);
            e.value = None;
        });
        self.wakeups.notify(keys.channel());
    }

    /// Another program's `DEL` of the value key (the simulation's outside writer): the value
    /// goes, the lock and the fencing counter stay, and nobody is woken.
    #[cfg(feature = "simulation")]
    pub(crate) fn outside_delete(&self, keys: &EntryKeys) {
        self.update(keys, |e, _| e.value = None);
    }

    /// Another program's `SET` of `bytes` under the value key (`PX ttl` if given): the
    /// value is replaced and its expiry with it; the lock and the fencing counter stay (they
    /// are keys of their own on Redis), and nobody is woken.
    #[cfg(feature = "simulation")]
    pub(crate) fn outside_set(&self, keys: &EntryKeys, bytes: Vec<u8>, ttl: Option<Duration>) {
        self.update(keys, |e, now| {
            e.value = Some(entry::Value {
                bytes: Arc::from(bytes),
                until: ttl.and_then(|ttl| deadline(now, ttl)),
                decoded: None,
            });
        });
    }

    /// Another program's `PEXPIRE` of the value key: a live value goes `ttl` from now, whatever
    /// it was given; nothing else changes. Whether the value is there to expire.
    #[cfg(feature = "simulation")]
    pub(crate) fn outside_expire(&self, keys: &EntryKeys, ttl: Duration) -> bool {
        self.update(keys, |e, now| match e.value_mut(now) {
            Some(value) => {
                value.until = deadline(now, ttl);
                true
            }
            None => false,
        })
    }

    /// The fencing counter and the live value's bytes of `keys`, looked at without counting as
    /// a read (the simulation's record of a failover; whether a shortened expiry fell due).
    #[cfg(feature = "simulation")]
    pub(crate) fn fence_and_value(&self, keys: &EntryKeys) -> (Option<u64>, Option<Vec<u8>>) {
        let now = Instant::now();
        let shard = lock(self.shard(&keys.value));
        let Some(entry) = shard.entry(&keys.value) else {
            return (None, None);
        };
        (entry.fence(now), entry.value(now).map(|v| v.bytes.to_vec()))
    }

    /// A replica's copy of the store as it is now (the simulation's lagging replica): every
    /// entry and epoch, with the same expiries, on the same clock; no waiters (a failover
    /// closes every connection) and no high-water mark of tokens (a replica's counters are
    /// what was replicated; one missing is seeded again from the clock, as on Redis).
    #[cfg(feature = "simulation")]
    pub(crate) fn replica(&self) -> MemoryStore {
        let now = Instant::now();
        let copy = MemoryStore {
            shared_clock: self.shared_clock.clone(),
            ..MemoryStore::starting_at(self.limits.clone(), self.ms_at(now))
        };
        for shard in self.shards.iter() {
            let shard = lock(shard);
            // In a fixed order: the copy's eviction queues must not depend on a hash seed.
            let mut keys: Vec<&str> = shard.keys().collect();
            keys.sort_unstable();
            for key in keys {
                if let Some(entry) = shard.entry(key).map(Entry::replica) {
                    lock(copy.shard(key)).update(key, now, &copy.totals, |e| *e = entry);
                }
            }
        }
        let epochs = self.epochs.read().unwrap_or_else(PoisonError::into_inner);
        *copy.epochs.write().unwrap_or_else(PoisonError::into_inner) = epochs.clone();
        copy.raised
            .store(self.raised.load(Ordering::Acquire), Ordering::Release);
        copy
    }

    /// The store after another program's `FLUSHDB`: empty (values, locks, fencing counters,
    /// epochs, the high-water mark of tokens, so a counter is seeded again from the clock as on
    /// Redis), on the same clock, with the same waiters (a flush closes no connection: the
    /// subscriptions stay).
    #[cfg(feature = "simulation")]
    pub(crate) fn flushed(&self) -> MemoryStore {
        MemoryStore {
            wakeups: Arc::clone(&self.wakeups),
            shared_clock: self.shared_clock.clone(),
            ..MemoryStore::starting_at(self.limits.clone(), self.ms_at(Instant::now()))
        }
    }

    fn born_now(&self) -> u64 {
        #[cfg(feature = "simulation")]
        if let Some(clock) = &self.shared_clock {
            return crate::time::tick(clock, self.wall_us(Instant::now()));
        }
        self.clock.fetch_add(1, Ordering::AcqRel) + 1
    }

    fn epochs_now(&self, names: &[String]) -> Vec<u64> {
        let epochs = self.epochs.read().unwrap_or_else(PoisonError::into_inner);
        names
            .iter()
            .map(|name| epochs.get(name).copied().unwrap_or(0))
            .collect()
    }

    fn raise_epochs_now(&self, names: &[String], floor: u64) {
        let mut epochs = self.epochs.write().unwrap_or_else(PoisonError::into_inner);
        for name in names {
            let epoch = epochs.entry(name.clone()).or_insert(0);
            *epoch = floor.max(epoch.saturating_add(1));
            // Births from now on come after it.
            self.clock.fetch_max(*epoch, Ordering::AcqRel);
            #[cfg(feature = "simulation")]
            if let Some(clock) = &self.shared_clock {
                clock.fetch_max(*epoch, Ordering::AcqRel);
            }
        }
        self.raised.store(true, Ordering::Release);
    }
}

/// Every operation of one entry is carried out when it is sent, before its future is polled: it
/// takes no `.await`, and a caller that drops the future has still done it, as with a sent
/// request. A batch is asked one entry after another as its future is polled.
impl LockStore for MemoryStore {
    fn lock<'a>(&'a self, op: LockOp<'a>) -> BoxFuture<'a, StoreResult<Reply>> {
        let reply = match op {
            LockOp::TryLock { keys, token, lease } => {
                Reply::Acquire(self.read_or_lock_now(keys, token, lease, false).into())
            }
            LockOp::Extend { keys, token, lease } => {
                Reply::Flag(self.extend_now(keys, token, lease))
            }
            LockOp::Unlock { keys, token } => Reply::Flag(self.unlock_now(keys, token)),
            LockOp::NextFence { keys, lease } => Reply::Number(self.next_fence_now(keys, lease)),
            LockOp::RaiseFence { keys, floor, lease } => {
                self.raise_fence_now(keys, floor, lease);
                Reply::Done
            }
            LockOp::RecordRun { keys, fence, keep } => {
                Reply::Flag(self.record_run_now(keys, fence, keep))
            }
            LockOp::SinceLastRun { keys } => Reply::Since(self.since_last_run_now(keys)),
            LockOp::Peek { keys } => Reply::Peek(self.peek_now(keys)),
        };
        Box::pin(std::future::ready(Ok(reply)))
    }

    fn listen<'a>(&'a self, keys: &'a EntryKeys) -> BoxFuture<'a, StoreResult<Listener>> {
        Box::pin(std::future::ready(Ok(self.wakeups.listen(keys.channel()))))
    }
}

impl Store for MemoryStore {
    fn run<'a>(&'a self, op: Op<'a>) -> BoxFuture<'a, StoreResult<Reply>> {
        let reply = match op {
            Op::Get { keys } => Reply::Value(self.get_now(keys)),
            // Traces are not kept here: the embedded store serves one process, whose waiters
            // learn the computation from their flight (`cache/trace.rs`).
            Op::ReadOrLock {
                keys,
                token,
                lease,
                read_value,
                trace: _,
            } => Reply::ReadOrLock(self.read_or_lock_now(keys, token, lease, read_value)),
            Op::StoreAndUnlock {
                keys,
                token,
                fence,
                write,
            } => Reply::Stored(self.store_and_unlock_now(keys, token, fence, write)),
            Op::WriteFenced {
                keys,
                fence,
                write,
                lease,
            } => Reply::Flag(self.write_fenced_now(keys, fence, write, lease)),
            Op::Set {
                keys,
                value,
                ttl,
                lease,
            } => {
                self.set_now(keys, value, ttl, lease);
                Reply::Done
            }
            Op::Invalidate { keys, lease } => {
                self.invalidate_now(keys, lease);
                Reply::Done
            }
            Op::Wake { keys } => {
                self.wakeups.notify(keys.channel());
                Reply::Done
            }
            Op::Born { .. } => Reply::Number(self.born_now()),
            Op::Epochs { names } => Reply::Epochs(self.epochs_now(names)),
            Op::RaiseEpochs { names, floor } => {
                self.raise_epochs_now(names, floor);
                Reply::Done
            }
            Op::Ping => Reply::Done,
            batch @ (Op::GetMany { .. }
            | Op::ReadOrLockMany { .. }
            | Op::InvalidateMany { .. }
            | Op::GetWithEpochs { .. }
            | Op::GetManyWithEpochs { .. }) => return one_by_one(self, batch),
        };
        Box::pin(std::future::ready(Ok(reply)))
    }

    fn clock(&self) -> &dyn super::Clock {
        self
    }
}

/// The store's wall clock moves with `tokio::time` (see [`MemoryStore::ms_at`]).
impl super::Clock for MemoryStore {
    fn now_ms(&self) -> u64 {
        self.ms_at(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LockStoreExt;

    fn keys(k: &str) -> EntryKeys {
        EntryKeys::new("t", k).unwrap()
    }

    /// The fence of a lock `answer` must have granted (`why`, if it did not).
    fn granted(answer: StoreResult<ReadOrLock>, why: &str) -> u64 {
        match answer.unwrap() {
            ReadOrLock::Acquired { fence, .. } => fence,
            other => panic!("{why}: {other:?}"),
        }
    }

    /// The fence of a lock that must be free, taken by `token` (reading a value there first if
    /// `read_value`).
    async fn free_lock(
        store: &MemoryStore,
        k: &EntryKeys,
        token: &str,
        lease: Duration,
        read_value: bool,
    ) -> u64 {
        granted(
            store.read_or_lock(k, token, lease, read_value).await,
            "a free lock must be granted",
        )
    }

    /// What a write-and-release did.
    fn stored(written: bool, released: bool) -> Stored {
        Stored { written, released }
    }

    /// A write-and-release through `store` by `token` under `fence`: what it did.
    async fn write_back(
        store: &MemoryStore,
        k: &EntryKeys,
        token: &str,
        fence: u64,
        write: Write,
    ) -> Stored {
        store
            .store_and_unlock(k, token, fence, write)
            .await
            .unwrap()
    }

    fn value(bytes: &[u8], ttl: Duration) -> Write {
        Write::Value {
            bytes: bytes.to_vec(),
            ttl,
        }
    }

    /// The counter's expiry and the value's: `None` is none (kept for ever).
    fn expiries(store: &MemoryStore, k: &EntryKeys) -> (Option<Instant>, Option<Instant>) {
        let shard = lock(store.shard(&k.value));
        let entry = shard.entry(&k.value).unwrap();
        let fence = entry.fence.as_ref().map(|f| f.until).unwrap();
        let value = entry.value.as_ref().map(|v| v.until).unwrap();
        (fence, value)
    }

    fn bounded(max_entries: u64, max_bytes: u64) -> MemoryStore {
        MemoryStore::new(
            MemoryLimits::default()
                .max_entries(max_entries)
                .max_bytes(max_bytes),
        )
    }

    /// How many of `keys` have a value (each read counts as a read for eviction).
    async fn held(store: &MemoryStore, keys: &[EntryKeys]) -> usize {
        let mut n = 0;
        for k in keys {
            n += usize::from(store.get(k).await.unwrap().is_some());
        }
        n
    }

    const HOUR: Duration = Duration::from_secs(3600);
    const LEASE: Duration = Duration::from_secs(10);

    #[tokio::test(start_paused = true)]
    async fn a_peek_sees_the_holder_its_lease_left_and_the_counter_and_changes_nothing() {
        let store = MemoryStore::default();
        let k = keys("a");
        assert_eq!(store.peek(&k).await.unwrap(), LockPeek::default());
        let lease = Duration::from_secs(10);
        let fence = granted(store.read_or_lock(&k, "A", lease, false).await, "free");
        tokio::time::advance(Duration::from_secs(4)).await;
        let peek = store.peek(&k).await.unwrap();
        let left = Some(Duration::from_secs(6));
        assert_eq!(peek.holder, Some(("A".to_owned(), left)));
        assert_eq!(peek.fence, Some(fence));
        assert_eq!(
            store.peek(&k).await.unwrap(),
            peek,
            "a peek changes nothing"
        );
        assert!(store.unlock(&k, "A").await.unwrap());
        let peek = store.peek(&k).await.unwrap();
        assert_eq!((peek.holder, peek.fence), (None, Some(fence)));
    }

    #[tokio::test(start_paused = true)]
    async fn values_are_bounded_by_count_and_by_bytes() {
        let by_count = bounded(100, u64::MAX);
        let by_bytes = bounded(u64::MAX, 50_000);
        let all: Vec<EntryKeys> = (0..2_000).map(|i| keys(&format!("k{i}"))).collect();
        let kilobyte = vec![7u8; 1_000];
        for k in &all {
            by_count.set(k, b"v".to_vec(), HOUR, LEASE).await.unwrap();
            by_bytes
                .set(k, kilobyte.clone(), HOUR, LEASE)
                .await
                .unwrap();
            assert!(by_count.totals.values.load(Ordering::Relaxed) <= 100);
            assert!(by_bytes.totals.bytes.load(Ordering::Relaxed) <= 50_000);
        }
        let counted = held(&by_count, &all).await;
        assert!((90..=100).contains(&counted), "{counted} values held");
        // Each weighs its 1,000 bytes, its key (`t:{k123}`) and the bookkeeping.
        let fit = 50_000 / (1_000 + 9 + entry::OVERHEAD_BYTES) as usize;
        let weighed = held(&by_bytes, &all).await;
        assert!(
            (fit - 5..=fit).contains(&weighed),
            "{weighed} values of 1 kB held"
        );
        // The fencing counter of an evicted value outlives it only as long as the leases need
        // it; then the sweep hand of later writes reclaims the entry.
        tokio::time::advance(retention(LEASE) + Duration::from_millis(1)).await;
        for i in 0..3_000 {
            let k = keys(&format!("later{i}"));
            by_count.set(&k, b"v".to_vec(), HOUR, LEASE).await.unwrap();
        }
        let evicted_left = by_count
            .shards
            .iter()
            .map(|s| {
                let shard = lock(s);
                let first = shard.keys().filter(|k| k.starts_with("t:{k"));
                first
                    .filter(|k| shard.entry(k).is_some_and(|e| e.value.is_none()))
                    .count()
            })
            .sum::<usize>();
        assert_eq!(evicted_left, 0, "entries of evicted values left");
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_read_again_survives_a_scan_of_keys_read_once() {
        let store = bounded(100, u64::MAX);
        let hot = keys("hot");
        store.set(&hot, b"h".to_vec(), HOUR, LEASE).await.unwrap();
        for _ in 0..3 {
            store.get(&hot).await.unwrap();
        }
        // Each written and never read again, as a scan through `get_or_compute` does.
        for i in 0..10_000 {
            let cold = keys(&format!("cold{i}"));
            store.set(&cold, b"c".to_vec(), HOUR, LEASE).await.unwrap();
        }
        assert_eq!(
            store.get(&hot).await.unwrap().as_deref(),
            Some(&b"h"[..]),
            "the hot key was evicted by the scan"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn eviction_never_takes_a_lock_nor_the_fence_of_its_holder() {
        let store = bounded(10, u64::MAX);
        let locked = keys("locked");
        // A value, then a lock taken over it (to replace it), so both are in the entry.
        store
            .set(&locked, b"old".to_vec(), HOUR, LEASE)
            .await
            .unwrap();
        let ReadOrLock::Acquired { fence, .. } = store
            .read_or_lock(&locked, "A", LEASE, false)
            .await
            .unwrap()
        else {
            panic!("a free lock must be granted");
        };
        for i in 0..1_000 {
            let k = keys(&format!("k{i}"));
            store.set(&k, b"v".to_vec(), HOUR, LEASE).await.unwrap();
        }
        assert!(store.get(&locked).await.unwrap().is_none(), "value evicted");
        assert!(
            matches!(
                store.read_or_lock(&locked, "B", LEASE, true).await.unwrap(),
                ReadOrLock::Held { .. }
            ),
            "the lock is still A's"
        );
        // The holder's write is accepted: its fencing counter was kept.
        assert_eq!(
            write_back(&store, &locked, "A", fence, value(b"new", HOUR)).await,
            stored(true, true)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_decoded_copy_goes_with_the_bytes_it_was_decoded_from() {
        let store = MemoryStore::default();
        let k = keys("a");
        let fresh_until = store.now_ms() + 60_000;
        store.set(&k, b"v1".to_vec(), HOUR, LEASE).await.unwrap();
        let Some(Blob::Shared(first)) = store.get(&k).await.unwrap() else {
            panic!("the memory store shares its bytes");
        };
        store.keep_decoded(
            &k,
            &first,
            &"one".to_owned(),
            fresh_until,
            1,
            Box::default(),
        );
        assert_eq!(store.fresh::<String>("t", "a").as_deref(), Some("one"));
        assert_eq!(store.fresh::<Vec<u8>>("t", "a"), None, "another type");
        // A write replaces the bytes: the copy goes, and a late offer of the old one is refused.
        store.set(&k, b"v2".to_vec(), HOUR, LEASE).await.unwrap();
        assert_eq!(store.fresh::<String>("t", "a"), None);
        store.keep_decoded(
            &k,
            &first,
            &"one".to_owned(),
            fresh_until,
            1,
            Box::default(),
        );
        assert_eq!(store.fresh::<String>("t", "a"), None);
        // Never served at or after its fresh-until.
        let Some(Blob::Shared(second)) = store.get(&k).await.unwrap() else {
            panic!("the memory store shares its bytes");
        };
        store.keep_decoded(
            &k,
            &second,
            &"two".to_owned(),
            fresh_until,
            1,
            Box::default(),
        );
        tokio::time::advance(Duration::from_millis(59_999)).await;
        assert_eq!(store.fresh::<String>("t", "a").as_deref(), Some("two"));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(store.fresh::<String>("t", "a"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_fencing_counter_lives_as_long_as_the_value_it_guards() {
        let store = MemoryStore::default();
        let lease = Duration::from_millis(100);
        for (name, ttl) in [("hour", Duration::from_secs(3600)), ("forever", FOREVER)] {
            let k = keys(name);
            let fence = free_lock(&store, &k, "A", lease, true).await;
            let stored = write_back(&store, &k, "A", fence, value(b"v", ttl)).await;
            assert!(stored.written);
            // Many leases later the counter still guards the value: an acquisition continues it.
            tokio::time::advance(lease * 50).await;
            let (fence_until, value_until) = expiries(&store, &k);
            assert_eq!(fence_until, value_until, "{name}");
            let next = free_lock(&store, &k, "B", lease, false).await;
            assert_eq!(
                next,
                fence + 1,
                "{name}: the counter was kept, not re-seeded"
            );
            // A bump with a short retention does not shorten it either.
            assert_eq!(expiries(&store, &k), (fence_until, value_until), "{name}");
            // A late writer with the old token is refused.
            let late = write_back(&store, &k, "A", fence, value(b"late", ttl)).await;
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
        let fence = free_lock(&store, &k, "A", lease, false).await;
        // Another writer lands while A computes: A's delete must not remove it.
        store.set(&k, b"new".to_vec(), hour, lease).await.unwrap();
        assert_eq!(
            write_back(&store, &k, "A", fence, Write::Delete).await,
            stored(false, true)
        );
        assert_eq!(store.get(&k).await.unwrap().as_deref(), Some(&b"new"[..]));
        // Nobody in between: the delete goes through.
        let fence = free_lock(&store, &k, "A", lease, false).await;
        let out = write_back(&store, &k, "A", fence, Write::Delete).await;
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
        let first = free_lock(&store, &k, "A", lease, true).await;
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(
            store.read_or_lock(&k, "B", lease, true).await.unwrap(),
            ReadOrLock::Held {
                expires_in: Some(Duration::from_secs(3))
            }
        );
        tokio::time::advance(Duration::from_secs(3)).await;
        let second = granted(
            store.read_or_lock(&k, "B", lease, true).await,
            "an expired lock must be granted to the next caller",
        );
        assert!(second > first);
        assert!(
            !store.extend(&k, "A", lease).await.unwrap(),
            "A lost the lease"
        );
        assert_eq!(
            write_back(&store, &k, "A", first, value(b"old", lease)).await,
            stored(false, false)
        );
        assert_eq!(
            write_back(&store, &k, "B", second, value(b"new", lease)).await,
            stored(true, true)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn invalidation_refuses_the_write_of_a_computation_in_flight() {
        let store = MemoryStore::default();
        let k = keys("a");
        let lease = Duration::from_secs(5);
        let fence = free_lock(&store, &k, "A", lease, true).await;
        store.invalidate(&k, lease).await.unwrap();
        assert_eq!(
            write_back(&store, &k, "A", fence, value(b"v", lease)).await,
            stored(false, true)
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
            let fence = granted(
                store.read_or_lock(&k, "A", lease, false).await,
                "the lock must be free",
            );
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
