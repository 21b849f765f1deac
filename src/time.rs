//! The crate's one bound on durations, and the arithmetic that keeps to it.
//!
//! A leaf: every layer may use it, and it uses none. Every duration a user passes is taken whole
//! (up to `Duration::MAX`) and cut down here, once, where it enters; so neither the stores nor
//! the monotonic clock ever see a value they cannot represent.

use std::time::Duration;

/// The longest duration the crate works with: 100 years. Every duration a user passes (a TTL,
/// a lease, a wait bound...) may be anything up to [`Duration::MAX`]; it is cut down to
/// `FOREVER` where it enters, and an expiry of `FOREVER` means *no expiry*: a value cached for
/// `FOREVER` (or `Duration::MAX`) is written without a TTL on Redis (`PTTL` -1) and never
/// expires in memory; it stays until it is replaced, invalidated or evicted.
///
/// Why 100 years and not what Redis accepts (about 292 million years from now): every store
/// must represent the same expiries, and a deadline of 100 years from now fits every platform's
/// monotonic clock, on which leases and waits are counted.
///
/// ```
/// use stampede_guard::{Cache, FOREVER};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// let cache = Cache::in_memory();
/// // Past months never change: keep them until invalidated.
/// let total: u64 = cache
///     .get_or_compute("2019-05", FOREVER, || async { Ok::<_, std::io::Error>(1234) })
///     .await?;
/// let again: u64 = cache
///     .get_or_compute("2019-05", Duration::MAX, || async { Ok::<_, std::io::Error>(0) })
///     .await?;
/// assert_eq!((total, again), (1234, 1234));
/// # Ok(())
/// # }
/// ```
pub const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// A user's duration, taken whole: anything longer than [`FOREVER`] is `FOREVER`.
pub(crate) fn saturate(d: Duration) -> Duration {
    d.min(FOREVER)
}

/// `t + d` on the monotonic clock, for a `d` of any size: at most [`FOREVER`] ahead, which fits
/// the clock on every platform (where `t + Duration::MAX` would panic).
pub(crate) fn later_by(t: tokio::time::Instant, d: Duration) -> tokio::time::Instant {
    t + saturate(d)
}

/// `a + b`, where either may be [`FOREVER`] (and so is the sum, then).
pub(crate) fn add(a: Duration, b: Duration) -> Duration {
    saturate(a.saturating_add(b))
}

/// The simulation's clock (feature `simulation`, `store/simulated.rs`): the next reading of
/// `clock`, one above the last or `wall_us` if that is later. Strictly increasing, so under
/// paused time, where many events share one instant, the readings still order the events as
/// they happened.
#[cfg(feature = "simulation")]
pub(crate) fn tick(clock: &std::sync::atomic::AtomicU64, wall_us: u64) -> u64 {
    use std::sync::atomic::Ordering::{AcqRel, Acquire};
    let next = |now: u64| now.saturating_add(1).max(wall_us);
    // The closure always answers, so the update cannot fail: either arm is the reading before.
    let before = match clock.fetch_update(AcqRel, Acquire, |now| Some(next(now))) {
        Ok(before) | Err(before) => before,
    };
    next(before)
}
