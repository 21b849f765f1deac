//! The Redis server's clock, as this process estimates it.
//!
//! Freshness (`fresh_until`) is stamped by the writer and judged by every reader; with each
//! machine's own wall clock, a reader whose clock runs ahead serves values as stale (and starts
//! refreshes), and a writer whose clock is behind by more than the TTL writes values that are
//! stale on arrival. So both sides use the server's clock: each process keeps an estimate of its
//! offset from the server (the fastest of three `TIME` round trips, from its midpoint), measured
//! before the first call that stamps or judges freshness and every minute after. The hit path
//! pays an atomic load and an addition, never a command.
//!
//! The estimate is off by at most half the fastest round trip (plus the drift of the local clock
//! between measurements), which is what freshness can be trusted to. On Redis Cluster, `TIME`
//! goes to any node: the nodes' clocks are taken to agree (NTP), as Redis itself assumes.
//!
//! Explained in the guide: `docs/guarantees.md` (Clocks).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::store::system_now_ms;

/// How often the offset is measured again: local clocks drift slowly (and NTP steps them rarely).
const RESYNC_EVERY: Duration = Duration::from_secs(60);
/// After a failed measurement (the server unreachable), how soon to try again.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// Round trips per measurement; the fastest one counts.
const SAMPLES: usize = 3;

#[derive(Debug, Default)]
pub(crate) struct ServerClock {
    /// Server milliseconds minus local milliseconds.
    offset_ms: AtomicI64,
    /// Set after the first measurement was attempted: until then, callers wait for one.
    synced: AtomicBool,
    /// Lets concurrent first callers share one measurement. Never held on the hit path.
    first: tokio::sync::Mutex<()>,
}

impl ServerClock {
    /// The server's wall clock in milliseconds since the Unix epoch, as estimated here (the local
    /// clock until a measurement succeeded).
    pub(crate) fn now_ms(&self) -> u64 {
        let local = i64::try_from(system_now_ms()).unwrap_or(i64::MAX);
        let server = local.saturating_add(self.offset_ms.load(Ordering::Relaxed));
        u64::try_from(server).unwrap_or(0)
    }

    pub(crate) fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Measures the offset once, if no measurement was attempted yet. A failure is logged and
    /// leaves the local clock in use until the background refresh succeeds.
    pub(crate) async fn sync<C>(self: &Arc<Self>, conn: &C)
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let _first = self.first.lock().await;
        if self.is_synced() {
            return;
        }
        let next = match self.measure(&mut conn.clone()).await {
            Ok(()) => RESYNC_EVERY,
            Err(e) => {
                tracing::debug!(error = %e, "could not read the server clock; using the local clock for now");
                RETRY_AFTER
            }
        };
        self.synced.store(true, Ordering::Release);
        self.keep_synced(conn.clone(), next);
    }

    /// Takes the offset from the fastest of a few `TIME` round trips: the first may include
    /// setting up the connection (a lazy connection, TLS, AUTH), which would bias the midpoint.
    async fn measure<C: ConnectionLike + Send>(&self, conn: &mut C) -> redis::RedisResult<()> {
        let mut best: Option<(u64, i64)> = None;
        for _ in 0..SAMPLES {
            let before = system_now_ms();
            let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await?;
            let after = system_now_ms();
            let server = secs.saturating_mul(1000).saturating_add(micros / 1000);
            let local_midpoint = before / 2 + after / 2;
            let offset = i128::from(server) - i128::from(local_midpoint);
            let offset =
                i64::try_from(offset).unwrap_or(if offset < 0 { i64::MIN } else { i64::MAX });
            let round_trip = after.saturating_sub(before);
            if best.is_none_or(|(fastest, _)| round_trip < fastest) {
                best = Some((round_trip, offset));
            }
        }
        if let Some((_, offset)) = best {
            self.offset_ms.store(offset, Ordering::Relaxed);
        }
        self.synced.store(true, Ordering::Release);
        Ok(())
    }

    /// Re-measures every [`RESYNC_EVERY`] (after `first`) in a spawned task, which ends with the
    /// clock's owner. Started by the first [`sync`](Self::sync), so stores that never stamp or
    /// judge freshness (the nodes of a Redlock) run none.
    fn keep_synced<C>(self: &Arc<Self>, conn: C, first: Duration)
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let clock: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut conn = conn;
            let mut next = first;
            loop {
                tokio::time::sleep(next).await;
                let Some(clock) = clock.upgrade() else { return };
                next = match clock.measure(&mut conn).await {
                    Ok(()) => RESYNC_EVERY,
                    Err(_) => RETRY_AFTER,
                };
            }
        });
    }
}
