//! One entry of the embedded store: its value, lock, fencing counter and a leader's last run,
//! each with its own expiry, and the rules the Redis scripts apply to them.

use std::any::{Any, TypeId};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::store::Write;
use crate::time::FOREVER;

/// What a value counts for in the byte bound besides its bytes and key: the entry's bookkeeping.
pub(super) const OVERHEAD_BYTES: u64 = 96;

#[derive(Debug, Default)]
pub(super) struct Entry {
    pub(super) value: Option<Value>,
    pub(super) lock: Option<Expiring<String>>,
    pub(super) fence: Option<Fence>,
    /// A leader's last run: its fence and when it started (the store's clock, ms).
    pub(super) run: Option<Expiring<(u64, u64)>>,
}

#[derive(Debug)]
pub(super) struct Expiring<T> {
    pub(super) item: T,
    /// `None`: no expiry (a duration of [`FOREVER`]), as a Redis key without a TTL.
    pub(super) until: Option<Instant>,
}

impl<T> Expiring<T> {
    fn live(&self, now: Instant) -> bool {
        live(self.until, now)
    }
}

fn live(until: Option<Instant>, now: Instant) -> bool {
    until.is_none_or(|until| until > now)
}

/// A stored value: its bytes, and once read through `get_or_compute`, the same value decoded.
#[derive(Debug)]
pub(super) struct Value {
    pub(super) bytes: Arc<[u8]>,
    pub(super) until: Option<Instant>,
    /// Decoded from exactly these bytes, so it goes wherever they go.
    pub(super) decoded: Option<Arc<Decoded>>,
}

impl Value {
    /// What it counts for in the byte bound: its bytes, its key and the bookkeeping, and its
    /// bytes again once it is also held decoded (the encoded size stands for the decoded one,
    /// as in the near tier: an estimate that needs no help from the type).
    pub(super) fn weight(&self, key_len: usize) -> u64 {
        let bytes = self.bytes.len() as u64;
        let decoded = if self.decoded.is_some() { bytes } else { 0 };
        (bytes + decoded + key_len as u64 + OVERHEAD_BYTES).max(1)
    }
}

/// A value decoded as one Rust type, with what its envelope said.
pub(super) struct Decoded {
    pub(super) type_id: TypeId,
    pub(super) value: Box<dyn Any + Send + Sync>,
    pub(super) fresh_until_ms: u64,
    /// Its birth, and the epochs that judge it (its namespace's clear key, then its tags').
    pub(super) born: u64,
    pub(super) epochs: Box<[String]>,
}

impl std::fmt::Debug for Decoded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoded")
            .field("fresh_until_ms", &self.fresh_until_ms)
            .finish_non_exhaustive()
    }
}

/// The fencing counter of an entry.
#[derive(Debug)]
pub(super) struct Fence {
    pub(super) n: u64,
    /// When it expires: at least as late as everything it guards.
    pub(super) until: Option<Instant>,
    /// When it would expire for the leases alone (acquisitions, renewals, invalidations),
    /// without the value it guards: what it falls back to when that value is evicted.
    pub(super) leased_until: Option<Instant>,
}

/// When something kept for `d` from `now` expires: never for [`FOREVER`] (the stores' shared
/// reading of it), so no deadline past the monotonic clock's range is ever computed.
pub(super) fn deadline(now: Instant, d: Duration) -> Option<Instant> {
    (d < FOREVER).then(|| now + d)
}

/// The later of two expiries, `None` (never) being the latest.
fn later(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    Some(a?.max(b?))
}

impl Entry {
    /// What a replica holds of this entry (the simulation's failover): the same keys with the
    /// same expiries, the bytes without their decoded copy (a replica has bytes only).
    #[cfg(feature = "simulation")]
    pub(super) fn replica(&self) -> Entry {
        Entry {
            value: self.value.as_ref().map(|v| Value {
                bytes: Arc::clone(&v.bytes),
                until: v.until,
                decoded: None,
            }),
            lock: self.lock.as_ref().map(|l| Expiring {
                item: l.item.clone(),
                until: l.until,
            }),
            fence: self.fence.as_ref().map(|f| Fence {
                n: f.n,
                until: f.until,
                leased_until: f.leased_until,
            }),
            run: self.run.as_ref().map(|r| Expiring {
                item: r.item,
                until: r.until,
            }),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.value.is_none() && self.lock.is_none() && self.fence.is_none() && self.run.is_none()
    }

    /// Drops what has expired: invisible to every operation, which treats it as absent anyway.
    pub(super) fn prune(&mut self, now: Instant) {
        if self.value.as_ref().is_some_and(|v| !live(v.until, now)) {
            self.value = None;
        }
        if self.lock.as_ref().is_some_and(|l| !l.live(now)) {
            self.lock = None;
        }
        if self.fence.as_ref().is_some_and(|f| !live(f.until, now)) {
            self.fence = None;
        }
        if self.run.as_ref().is_some_and(|r| !r.live(now)) {
            self.run = None;
        }
    }

    pub(super) fn value(&self, now: Instant) -> Option<&Value> {
        self.value.as_ref().filter(|v| live(v.until, now))
    }

    pub(super) fn value_mut(&mut self, now: Instant) -> Option<&mut Value> {
        self.value.as_mut().filter(|v| live(v.until, now))
    }

    /// The value, live or not (for weighing what is held).
    pub(super) fn value_any(&self) -> Option<&Value> {
        self.value.as_ref()
    }

    pub(super) fn lock(&self, now: Instant) -> Option<&Expiring<String>> {
        self.lock.as_ref().filter(|l| l.live(now))
    }

    pub(super) fn fence(&self, now: Instant) -> Option<u64> {
        self.fence
            .as_ref()
            .filter(|f| live(f.until, now))
            .map(|f| f.n)
    }

    pub(super) fn run(&self, now: Instant) -> Option<(u64, u64)> {
        self.run.as_ref().filter(|r| r.live(now)).map(|r| r.item)
    }

    /// Whether the lock is held by `token` now.
    pub(super) fn locked_by(&self, token: &str, now: Instant) -> bool {
        self.lock(now).is_some_and(|l| l.item == token)
    }

    /// Bumps the counter and keeps it at least `retention` longer (never shorter than before:
    /// it may be guarding a value that lives longer). `wall_us`: the store's wall clock in
    /// microseconds, which seeds a lapsed counter; `high_water`: the highest token the store
    /// handed out, so that a re-seeded counter never repeats one even when tokio's clock is
    /// paused and the wall clock has not moved.
    pub(super) fn bump_fence(
        &mut self,
        retention: Duration,
        now: Instant,
        wall_us: u64,
        high_water: &AtomicU64,
    ) -> u64 {
        let retained = deadline(now, retention);
        let fence = match self.fence.take().filter(|f| live(f.until, now)) {
            Some(f) => Fence {
                n: f.n + 1,
                until: later(f.until, retained),
                leased_until: later(f.leased_until, retained),
            },
            // Seeded from the clock in microseconds, like the Redis script: a counter that lapsed
            // never hands out a token at or below one handed out before (in memory the
            // high-water mark makes this certain; on Redis it rests on the server's clock).
            None => Fence {
                n: wall_us
                    .max(high_water.load(Ordering::Relaxed))
                    .saturating_add(1),
                until: retained,
                leased_until: retained,
            },
        };
        high_water.fetch_max(fence.n, Ordering::Relaxed);
        let n = fence.n;
        self.fence = Some(fence);
        n
    }

    /// After a bump to `n`: the counter raised to `wall_us` if the clock is ahead of it, as
    /// the Redis script bumps (the simulated server's counters); the token handed out.
    #[cfg(feature = "simulation")]
    pub(super) fn raise_to_clock(&mut self, n: u64, wall_us: u64, high_water: &AtomicU64) -> u64 {
        let Some(fence) = self.fence.as_mut().filter(|_| wall_us > n) else {
            return n;
        };
        fence.n = wall_us;
        high_water.fetch_max(wall_us, Ordering::Relaxed);
        wall_us
    }

    /// Keeps a live counter at least until `until`: it guards what lives that long (a value).
    pub(super) fn keep_fence(&mut self, until: Option<Instant>, now: Instant) {
        if let Some(fence) = self.fence.as_mut().filter(|f| live(f.until, now)) {
            fence.until = later(fence.until, until);
        }
    }

    /// Keeps a live counter `retention` longer for a lease (a renewal).
    pub(super) fn lease_fence(&mut self, retention: Duration, now: Instant) {
        let until = deadline(now, retention);
        if let Some(fence) = self.fence.as_mut().filter(|f| live(f.until, now)) {
            fence.until = later(fence.until, until);
            fence.leased_until = later(fence.leased_until, until);
        }
    }

    /// Writes a value for `ttl`, and keeps the fencing counter at least as long.
    pub(super) fn put_value(&mut self, bytes: Vec<u8>, ttl: Duration, now: Instant) {
        let until = deadline(now, ttl);
        self.value = Some(Value {
            bytes: Arc::from(bytes),
            until,
            decoded: None,
        });
        self.keep_fence(until, now);
    }

    /// Raises the counter to at least `floor`, keeping it at least `retention` longer; with a
    /// `floor` of 0, only keeps a live counter.
    pub(super) fn raise_fence(
        &mut self,
        floor: u64,
        retention: Duration,
        now: Instant,
        high_water: &AtomicU64,
    ) {
        let retained = deadline(now, retention);
        let fence = match self.fence.take().filter(|f| live(f.until, now)) {
            Some(f) => Fence {
                n: f.n.max(floor),
                until: later(f.until, retained),
                leased_until: later(f.leased_until, retained),
            },
            // As in Redis: raising a missing counter to 0 (only keeping it alive) creates none.
            None if floor == 0 => return,
            None => Fence {
                n: floor,
                until: retained,
                leased_until: retained,
            },
        };
        self.fence = Some(fence);
        high_water.fetch_max(floor, Ordering::Relaxed);
    }

    /// Carries out a fenced write that was accepted.
    pub(super) fn apply(&mut self, write: Write, now: Instant) {
        match write {
            Write::Value { bytes, ttl } => self.put_value(bytes, ttl, now),
            Write::Delete => self.value = None,
            Write::Keep { bytes, at_least } => {
                // As `set_keeping` in the scripts: the value's life is never shortened, and
                // the fencing counter is kept as long as the value.
                let wanted = deadline(now, at_least);
                let until = match self.value.as_ref().filter(|v| live(v.until, now)) {
                    Some(v) => later(v.until, wanted),
                    None => wanted,
                };
                self.value = Some(Value {
                    bytes: Arc::from(bytes),
                    until,
                    decoded: None,
                });
                self.keep_fence(until, now);
            }
        }
    }

    /// Evicts the value for room. Its fencing counter no longer guards it, so it is kept only
    /// as long as the leases need it (which covers a lock held now: the counter is kept two
    /// leases past every acquisition and renewal). The lock and a leader's run are never
    /// evicted: they expire with their leases.
    pub(super) fn evict(&mut self, now: Instant) {
        self.value = None;
        if let Some(fence) = self.fence.as_mut() {
            fence.until = fence.leased_until;
        }
        self.prune(now);
    }
}
