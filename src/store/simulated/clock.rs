//! One simulated instance's wall clock, and its estimate of the server's: what
//! `store/redis/clock.rs` keeps on Redis, over the simulation's network.
//!
//! The instance's own wall clock is off the server's by a seeded offset (the docs promise
//! freshness for a reader an hour ahead) and runs at the seeded rate of the instance's
//! monotonic clock (`crate::time::drifted`: one oscillator drives both). Freshness must not
//! read it directly: as on Redis, the offset is measured from the fastest of three round
//! trips, from its midpoint, before the first call that stamps or judges freshness; a failed
//! measurement leaves the local clock in use and is retried a second later. What remains is
//! the estimate's own error: half the fastest round trip, plus the drift since the
//! measurement. The minute between measurements on Redis is longer than any schedule: one
//! success is the last.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{Network, Server};
use crate::store::BoxFuture;

/// After a failed measurement, how soon to try again (as `redis/clock.rs`).
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// Round trips per measurement; the fastest one counts.
const SAMPLES: usize = 3;

/// What an instance's wall clock is off by: `offset_ms` at the server's start, and `ppm`
/// parts per million fast (slow, below zero) from then on.
#[derive(Debug, Clone, Copy, Default)]
pub struct Skew {
    /// Milliseconds ahead of the server's clock (behind, below zero).
    pub offset_ms: i64,
    /// The rate error of the instance's clocks, in parts per million.
    pub ppm: i32,
}

/// An instance's estimate of the server's clock.
pub(super) struct WallClock {
    shared: Arc<Estimate>,
    /// Lets concurrent first callers share one measurement.
    first: tokio::sync::Mutex<()>,
}

/// What the measurements need and found, shared with the retrying task.
struct Estimate {
    server: Arc<Server>,
    network: Arc<dyn Network>,
    conn: u64,
    timeout: Duration,
    skew: Skew,
    /// Server milliseconds minus local milliseconds, as last measured (0 before).
    offset_ms: AtomicI64,
    synced: AtomicBool,
}

impl WallClock {
    pub(super) fn new(
        server: Arc<Server>,
        network: Arc<dyn Network>,
        conn: u64,
        timeout: Duration,
        skew: Skew,
    ) -> Self {
        WallClock {
            shared: Arc::new(Estimate {
                server,
                network,
                conn,
                timeout,
                skew,
                offset_ms: AtomicI64::new(0),
                synced: AtomicBool::new(false),
            }),
            first: tokio::sync::Mutex::new(()),
        }
    }

    pub(super) fn now_ms(&self) -> u64 {
        let shared = &self.shared;
        let server = shared
            .local_ms()
            .saturating_add(shared.offset_ms.load(Ordering::Relaxed));
        u64::try_from(server).unwrap_or(0)
    }

    pub(super) fn is_synced(&self) -> bool {
        self.shared.synced.load(Ordering::Acquire)
    }

    pub(super) fn sync(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let _first = self.first.lock().await;
            if self.is_synced() {
                return;
            }
            let measured = self.shared.measure().await;
            self.shared.synced.store(true, Ordering::Release);
            if !measured {
                // The local clock until a measurement succeeds, as on Redis.
                let shared = Arc::downgrade(&self.shared);
                drop(crate::time::spawn(retry(shared)));
            }
        })
    }
}

/// Measures again every [`RETRY_AFTER`] until one succeeds or the clock's owner is gone.
async fn retry(shared: Weak<Estimate>) {
    loop {
        crate::time::sleep(RETRY_AFTER).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if shared.measure().await {
            return;
        }
    }
}

impl Estimate {
    /// The instance's own wall clock, in milliseconds since the Unix epoch.
    fn local_ms(&self) -> i64 {
        let real = self.server.epoch.elapsed().as_micros();
        let rate = (1_000_000 + i128::from(self.skew.ppm)).max(0);
        let local_us = i128::try_from(real).unwrap_or(i128::MAX) * rate / 1_000_000;
        let start = i128::from(self.server.epoch_ms) + i128::from(self.skew.offset_ms);
        i64::try_from(start + local_us / 1000).unwrap_or(i64::MAX)
    }

    /// The offset from the fastest of [`SAMPLES`] round trips (each a `TIME` on the calls'
    /// connection, within the response time-out); `false` if none came back.
    async fn measure(&self) -> bool {
        let mut best: Option<(i64, i64)> = None;
        for _ in 0..SAMPLES {
            let before = self.local_ms();
            let exchange = async {
                if !self.network.request(self.conn).await {
                    return None;
                }
                let server = i64::try_from(super::Clock::now_ms(&*self.server)).ok()?;
                self.network.reply(self.conn).await.then_some(server)
            };
            let Ok(Some(server)) = crate::time::timeout(self.timeout, exchange).await else {
                return false;
            };
            let after = self.local_ms();
            let round_trip = after.saturating_sub(before);
            let offset = server.saturating_sub(before / 2 + after / 2);
            if best.is_none_or(|(fastest, _)| round_trip < fastest) {
                best = Some((round_trip, offset));
            }
        }
        if let Some((_, offset)) = best {
            self.offset_ms.store(offset, Ordering::Relaxed);
        }
        true
    }
}
