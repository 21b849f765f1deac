//! The Redis server's clock, as this process estimates it.
//!
//! Freshness (`fresh_until`) is stamped by the writer and judged by every reader; with each
//! machine's own wall clock, a reader whose clock runs ahead serves values as stale (and starts
//! refreshes), and a writer whose clock is behind by more than the TTL writes values that are
//! stale on arrival. So both sides use the server's clock: each process keeps an estimate of its
//! offset from the server (one `TIME` round trip, counted from its midpoint), measured before the
//! first call that stamps or judges freshness and refreshed in the background. The hit path pays
//! an atomic load and an addition, never a command.
//!
//! The estimate is off by at most half a round trip (plus the drift of the local clock between
//! measurements), which is what freshness can be trusted to.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::ConnectionLike;

use super::system_now_ms;

/// How often the offset is measured again: local clocks drift slowly (and NTP steps them rarely).
const RESYNC_EVERY: Duration = Duration::from_secs(60);
/// After a failed measurement (the server unreachable), how soon to try again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

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
    pub(crate) async fn sync<C: ConnectionLike + Clone + Send>(&self, conn: &C) {
        let _first = self.first.lock().await;
        if self.is_synced() {
            return;
        }
        if let Err(e) = self.measure(&mut conn.clone()).await {
            tracing::debug!(error = %e, "could not read the server clock; using the local clock for now");
        }
        self.synced.store(true, Ordering::Release);
    }

    async fn measure<C: ConnectionLike + Send>(&self, conn: &mut C) -> redis::RedisResult<()> {
        let before = system_now_ms();
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await?;
        let after = system_now_ms();
        let server = secs.saturating_mul(1000).saturating_add(micros / 1000);
        let local_midpoint = before / 2 + after / 2;
        let offset = i128::from(server) - i128::from(local_midpoint);
        let offset = i64::try_from(offset).unwrap_or(if offset < 0 { i64::MIN } else { i64::MAX });
        self.offset_ms.store(offset, Ordering::Relaxed);
        Ok(())
    }

    /// Re-measures every [`RESYNC_EVERY`] in a spawned task, which ends with the clock's owner.
    pub(crate) fn keep_synced<C>(self: &Arc<Self>, conn: C)
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Built outside a runtime: the first call measures, and no refresh runs.
            return;
        };
        let clock: Weak<Self> = Arc::downgrade(self);
        runtime.spawn(async move {
            let mut conn = conn;
            loop {
                let Some(clock) = clock.upgrade() else { return };
                let next = match clock.measure(&mut conn).await {
                    Ok(()) => RESYNC_EVERY,
                    Err(_) => RETRY_AFTER,
                };
                drop(clock);
                tokio::time::sleep(next).await;
            }
        });
    }
}
