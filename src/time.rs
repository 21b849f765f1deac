//! The crate's one bound on durations, and the arithmetic that keeps to it.
//!
//! A leaf: every layer may use it, and it uses none. Every duration a user passes is taken whole
//! (up to `Duration::MAX`) and cut down here, once, where it enters; so neither the stores nor
//! the monotonic clock ever see a value they cannot represent.
//!
//! Also the one door to this process's monotonic clock (`now`, `sleep`, `timeout`, `spawn`...):
//! tokio's, unchanged, in every build but the simulation's. Under the `simulation` feature a
//! task may run on a drifting clock ([`drifted`]): each simulated instance's clock runs fast or
//! slow by its own rate, so that leases, the near tier's proofs and every time-out are judged
//! on a clock that disagrees with the server's, as real machines' do. The server's side
//! (`store/memory.rs`, the simulated server) keeps tokio's clock.

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

/// The most a machine's clock may run fast or slow, in parts per million: what NTP lets a
/// clock's frequency err by (and quartz clocks keep well within). Leases give it up
/// ([`drift_allowance`]); the simulation draws every instance's clock within it.
pub(crate) const MAX_DRIFT_PPM: u32 = 500;

/// What a holder gives up of a lease for its clock running slow by up to [`MAX_DRIFT_PPM`].
pub(crate) fn drift_allowance(lease: Duration) -> Duration {
    lease / (1_000_000 / MAX_DRIFT_PPM)
}

/// A bound promised in real time, counted on this machine's clock: `d` less what the clock's
/// drift could add to it ([`drift_allowance`]). [`FOREVER`] stays forever.
pub(crate) fn less_drift(d: Duration) -> Duration {
    if d >= FOREVER {
        return d;
    }
    d.saturating_sub(drift_allowance(d))
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

pub(crate) use clock::{interval, interval_at, now, since, sleep, sleep_until, spawn, timeout};
pub(crate) use clock::{spawn_on, timeout_at};

/// This process's monotonic clock, as every layer but the server's reads it.
#[cfg(not(feature = "simulation"))]
mod clock {
    pub(crate) use tokio::spawn;
    use tokio::time::Instant;
    pub(crate) use tokio::time::{interval, interval_at, sleep, sleep_until, timeout, timeout_at};

    #[inline(always)]
    pub(crate) fn now() -> Instant {
        Instant::now()
    }

    /// How long ago `t` was.
    #[inline(always)]
    pub(crate) fn since(t: Instant) -> std::time::Duration {
        t.elapsed()
    }

    #[inline(always)]
    pub(crate) fn spawn_on<F>(
        runtime: &tokio::runtime::Handle,
        work: F,
    ) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        runtime.spawn(work)
    }
}

/// The simulation's clocks: tokio's, seen through the drift of the task's instance, if any.
#[cfg(feature = "simulation")]
mod clock {
    use std::future::Future;
    use std::time::Duration;
    use tokio::time::{Instant, Interval, Sleep, Timeout};

    /// A clock that runs `ppm` parts per million fast (or slow, below zero) from `base` on.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Drift {
        pub(crate) base: Instant,
        pub(crate) ppm: i32,
    }

    tokio::task_local! {
        /// The drift of the instance this task belongs to; none outside the simulation.
        static DRIFT: Drift;
    }

    fn current() -> Option<Drift> {
        DRIFT.try_with(|d| *d).ok()
    }

    /// `real` nanoseconds on tokio's clock are this many on a clock `ppm` fast.
    fn scaled(real: u128, ppm: i32) -> u128 {
        let rate = (1_000_000 + i128::from(ppm)).max(1) as u128;
        real * rate / 1_000_000
    }

    /// How many real nanoseconds make `local` on a clock `ppm` fast: rounded up, so that a
    /// task woken at a local deadline reads that deadline or later on its own clock.
    fn unscaled(local: u128, ppm: i32) -> u128 {
        let rate = (1_000_000 + i128::from(ppm)).max(1) as u128;
        (local * 1_000_000).div_ceil(rate)
    }

    fn from_nanos(n: u128) -> Duration {
        Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
    }

    /// Tokio's instant at which the drifting clock reads `local`.
    fn real_at(local: Instant, drift: Drift) -> Instant {
        let ahead = local.saturating_duration_since(drift.base).as_nanos();
        if ahead == 0 {
            return local;
        }
        drift.base + from_nanos(unscaled(ahead, drift.ppm))
    }

    /// Tokio's duration that the drifting clock counts as `d`.
    fn real_for(d: Duration, drift: Option<Drift>) -> Duration {
        match drift {
            Some(drift) => from_nanos(unscaled(d.as_nanos(), drift.ppm)),
            None => d,
        }
    }

    /// Runs `work` (and every task it spawns through [`spawn`]) on a clock `ppm` parts per
    /// million fast from `base` on.
    pub(crate) async fn drifted<F: Future>(base: Instant, ppm: i32, work: F) -> F::Output {
        DRIFT.scope(Drift { base, ppm }, work).await
    }

    pub(crate) fn now() -> Instant {
        let real = Instant::now();
        match current() {
            Some(drift) => {
                let elapsed = real.saturating_duration_since(drift.base).as_nanos();
                drift.base + from_nanos(scaled(elapsed, drift.ppm))
            }
            None => real,
        }
    }

    pub(crate) fn since(t: Instant) -> Duration {
        now().saturating_duration_since(t)
    }

    pub(crate) fn sleep(d: Duration) -> Sleep {
        tokio::time::sleep(real_for(d, current()))
    }

    pub(crate) fn sleep_until(deadline: Instant) -> Sleep {
        match current() {
            Some(drift) => tokio::time::sleep_until(real_at(deadline, drift)),
            None => tokio::time::sleep_until(deadline),
        }
    }

    pub(crate) fn timeout<F: Future>(d: Duration, work: F) -> Timeout<F> {
        tokio::time::timeout(real_for(d, current()), work)
    }

    pub(crate) fn timeout_at<F: Future>(deadline: Instant, work: F) -> Timeout<F> {
        match current() {
            Some(drift) => tokio::time::timeout_at(real_at(deadline, drift), work),
            None => tokio::time::timeout_at(deadline, work),
        }
    }

    pub(crate) fn interval(period: Duration) -> Interval {
        tokio::time::interval(real_for(period, current()))
    }

    pub(crate) fn interval_at(start: Instant, period: Duration) -> Interval {
        match current() {
            Some(drift) => {
                tokio::time::interval_at(real_at(start, drift), real_for(period, Some(drift)))
            }
            None => tokio::time::interval_at(start, period),
        }
    }

    /// `tokio::spawn`, the task on the spawner's clock.
    pub(crate) fn spawn<F>(work: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match current() {
            Some(drift) => tokio::spawn(DRIFT.scope(drift, work)),
            None => tokio::spawn(work),
        }
    }

    /// `runtime.spawn`, the task on the spawner's clock.
    pub(crate) fn spawn_on<F>(
        runtime: &tokio::runtime::Handle,
        work: F,
    ) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match current() {
            Some(drift) => runtime.spawn(DRIFT.scope(drift, work)),
            None => runtime.spawn(work),
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[tokio::test(start_paused = true)]
        async fn a_drifting_clock_counts_its_own_time_and_wakes_on_it() {
            let base = Instant::now();
            // 500 ppm slow: a lease of 150 ms on this clock lasts 150.075 ms of tokio's.
            drifted(base, -500, async move {
                let deadline = now() + Duration::from_millis(150);
                sleep_until(deadline).await;
                assert!(now() >= deadline);
                assert!(Instant::now() - base >= Duration::from_micros(150_075));
                let inner = spawn(async { now() }).await.expect("the task ends");
                assert!(inner < Instant::now());
            })
            .await;
            // Outside, tokio's clock.
            assert_eq!(now(), Instant::now());
        }

        #[test]
        fn scaling_there_and_back_never_falls_short() {
            for ppm in [-500, -1, 0, 1, 250, 500] {
                for local in [0u128, 1, 999, 1_000_000, 150_000_000, 3_600_000_000_000] {
                    assert!(scaled(unscaled(local, ppm), ppm) >= local, "{ppm} {local}");
                }
            }
        }
    }
}

#[cfg(feature = "simulation")]
pub(crate) use clock::drifted;
