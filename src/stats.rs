//! What a cache did: counters for [`Cache::stats`](crate::Cache::stats), and the same events sent
//! to the `metrics` facade when the `metrics` feature is on.
//!
//! Metric names, for dashboards (Prometheus's conventions: counters end in `_total`, times are
//! in seconds and end in `_seconds`; each call is counted once, in `stampede_guard_calls_total`):
//!
//! - `stampede_guard_calls_total{answer}`: calls of the `get_or_compute` family by how each was
//!   answered, `answer` one of `near_hit`, `hit`, `computed`, `joined`, `waited`, `stale`,
//!   `fail_safe`, `held`, `uncached`, `error` (see [`Calls`]);
//! - `stampede_guard_computations_saved_total`: calls answered by someone else's computation
//!   (`joined` + `waited`);
//! - `stampede_guard_lock_wait_seconds{answer}` (histogram): how long those calls waited, by
//!   `answer` (`joined`, `waited`);
//! - `stampede_guard_computes_total` and `stampede_guard_compute_seconds` (histogram):
//!   computations run by this process (foreground, background refreshes, each key of a batch)
//!   and how long each ran;
//! - `stampede_guard_wait_timeouts_total` (waits that gave up), `stampede_guard_lock_takeovers_total`,
//!   `stampede_guard_lease_renewals_total`, `stampede_guard_leases_lost_total`,
//!   `stampede_guard_soft_timeouts_total`, `stampede_guard_hard_timeouts_total`,
//!   `stampede_guard_backend_errors_total`;
//! - with a near tier, its look-ups (a call answered by it is also a `near_hit` call; a plain
//!   `get` is a look-up, not a call): `stampede_guard_near_hits_total`,
//!   `stampede_guard_near_misses_total`, `stampede_guard_near_invalidations_total`,
//!   `stampede_guard_near_switched_off_total`;
//! - `stampede_guard_not_stored_total{reason}` (`out-of-memory`, `refused`, `fence-lost`,
//!   `backend-failed`);
//! - with auto-recovery `stampede_guard_recovery_replayed_total`,
//!   `stampede_guard_recovery_refused_total` and the gauge `stampede_guard_recovery_queued` (the
//!   queue's length, in keys);
//! - for the circuit breaker `stampede_guard_fast_failures_total`,
//!   `stampede_guard_breaker_transitions_total{to}` (`open`, `half-open`, `closed`), the gauge
//!   `stampede_guard_breaker_state{state}` (1 for the state it is in, 0 for the others) and the
//!   gauge `stampede_guard_breaker_open` (1 while not closed).
//!
//! Explained in the guide: `docs/observability.md`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::BackendErrorKind;
use crate::log::LogThrottle;

/// A snapshot of what a cache has done since it was built (shared by all its handles).
///
/// ```
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let cache = stampede_guard::Cache::in_memory();
/// for _ in 0..3 {
///     let _: u8 = cache
///         .get_or_compute("k", Duration::from_secs(60), || async { Ok::<_, String>(1) })
///         .await
///         .unwrap();
/// }
/// let stats = cache.stats();
/// assert_eq!((stats.misses, stats.computes, stats.hits), (1, 1, 2));
/// # }
/// ```
///
/// `Stats` implements `serde::Serialize`, for a `/stats` endpoint: the counters under their field
/// names, and `wait_time` as `wait_time_seconds`, a number of seconds (like the
/// `stampede_guard_wait_seconds` metric):
///
/// ```
/// let stats = stampede_guard::Cache::in_memory().stats();
/// let json = serde_json::to_value(stats).unwrap();
/// assert_eq!(json["hits"], 0);
/// assert_eq!(json["wait_time_seconds"], 0.0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Calls served a fresh value from the cache.
    pub hits: u64,
    /// Calls that found no usable value and went on to lock, compute or wait.
    pub misses: u64,
    /// Computations run by this process (foreground and background refreshes); a batch's
    /// computation counts once per key it computes.
    pub computes: u64,
    /// Calls that waited for another caller's computation and got its value.
    pub waits: u64,
    /// Total time those calls waited.
    pub wait_time: Duration,
    /// Calls served a stale value while a refresh ran.
    pub stale_served: u64,
    /// Calls computed without the cache because the backend was down.
    pub uncached: u64,
    /// Calls that gave up waiting ([`Error::WaitTimeout`](crate::Error::WaitTimeout)).
    pub wait_timeouts: u64,
    /// Calls that met a backend failure ([`Error::is_backend`](crate::Error::is_backend)),
    /// including a `get` or `set` that the [`OnBackendError`](crate::OnBackendError) answered as a miss or a
    /// skipped write (a `get_or_compute` it answered is counted in `uncached` instead).
    pub backend_errors: u64,
    /// Successful lease renewals of this cache's locks.
    pub lease_renewals: u64,
    /// Leases of this cache's locks that were lost while computing.
    pub leases_lost: u64,
    /// Calls answered with a fail-safe fallback ([`Source::FailSafe`](crate::Source::FailSafe)):
    /// a kept value served because the computation failed, timed out, or is throttled.
    pub fallback_served: u64,
    /// Calls that reached their [`soft_timeout`](crate::CallOptions::soft_timeout) with a
    /// fallback at hand (also counted in `fallback_served`); each key of a batch counts.
    pub soft_timeouts: u64,
    /// Computations of this process cancelled by their hard timeout
    /// ([`max_hold`](crate::CallOptions::max_hold)), once per key they were computing.
    pub hard_timeouts: u64,
    /// Calls answered from the near tier ([`NearCacheOptions`](crate::NearCacheOptions)), without Redis.
    /// Also counted in `hits`.
    pub near_hits: u64,
    /// Calls that looked in the near tier and went on to Redis: no copy, another type, a copy
    /// past its fresh-until, or the near tier switched off.
    pub near_misses: u64,
    /// Announcements of changed entries the near tier received (each drops the key's copy,
    /// unless it is the very write the copy holds).
    pub near_invalidations: u64,
    /// Times the near tier stopped serving and dropped its copies because its invalidation
    /// stream was not proven live within [`max_staleness`](crate::NearCacheOptions::max_staleness)
    /// (a dropped or black-holed connection, a restarted server, a paused process).
    pub near_switched_off: u64,
    /// Values computed but not stored in the cache, by reason (the value was still returned).
    pub not_stored: NotStored,
    /// Keys whose write waits in the auto-recovery queue now (a gauge, not a counter):
    /// [`CacheBuilder::auto_recovery`](crate::CacheBuilder::auto_recovery).
    pub recovery_queued: u64,
    /// Queued writes replayed once the backend answered (each key's newest intent counts once).
    pub recovery_replayed: u64,
    /// Writes refused because the auto-recovery queue was full
    /// ([`Error::RecoveryQueueFull`](crate::Error::RecoveryQueueFull)); an `invalidate_many`
    /// refused counts once.
    pub recovery_refused: u64,
    /// The circuit breaker in front of the backend now ([`BreakerOptions`](crate::BreakerOptions)):
    /// closed unless the backend stopped answering.
    pub breaker: BreakerState,
    /// Times the circuit breaker opened.
    pub breaker_opened: u64,
    /// Backend operations the open breaker failed at once, without reaching the backend.
    pub fast_failures: u64,
    /// Calls answered with a near copy while the backend was unreachable
    /// ([`Source::Held`](crate::Source::Held), [`serve_while_down`](crate::NearCacheOptions::serve_while_down)).
    pub held_served: u64,
    /// Calls of the `get_or_compute` family by how each was answered, every call in exactly one
    /// field (the fields above overlap: a near hit is in `hits` and `near_hits`, a wait in
    /// `misses` and `waits`). The `stampede_guard_calls_total` metric, by its `answer` label.
    pub calls: Calls,
    /// Calls answered by another caller's computation or read: those that joined a flight of
    /// this process or waited on the lock ([`Calls::computations_saved`]).
    pub computations_saved: u64,
    /// Total time computations of this process ran, to their value, error or hard timeout (a
    /// batch's time once per key it computed). The `stampede_guard_compute_seconds` histogram.
    pub compute_time: Duration,
    /// Locks granted to a caller that had found them held and waited, with no value landed:
    /// the holder's lease ran out (it died or stalled) or it let the lock go without a value (its
    /// computation failed or was cancelled), and this caller took over the computation.
    pub lock_takeovers: u64,
    /// Whether Redis tells the near tier of changes made outside the crate (`CLIENT TRACKING`,
    /// see [`NearCacheOptions::track_outside_writes`](crate::NearCacheOptions::track_outside_writes)):
    /// [`TrackingState::Off`] without a near tier.
    pub near_tracking: TrackingState,
}

/// The state of a cache's circuit breaker (resilience4j's and Polly's names), in [`Stats`] and
/// the health report. Serialized as `"closed"`, `"open"` or `"half-open"`.
///
/// ```
/// use stampede_guard::{BreakerState, Cache};
/// assert_eq!(Cache::in_memory().stats().breaker, BreakerState::Closed);
/// assert_eq!(BreakerState::HalfOpen.to_string(), "half-open");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BreakerState {
    /// Calls go to the backend.
    #[default]
    Closed,
    /// The backend failed too often in a row: calls fail fast (or take their fallback) without
    /// reaching it, until the cool-down ends.
    Open,
    /// One probe is checking whether the backend answers again; calls still fail fast.
    HalfOpen,
}

impl BreakerState {
    /// The state's name: `closed`, `open` or `half-open`.
    ///
    /// ```
    /// assert_eq!(stampede_guard::BreakerState::Open.as_str(), "open");
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half-open",
        }
    }

    fn index(self) -> u8 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::Open => 1,
            BreakerState::HalfOpen => 2,
        }
    }
}

/// Whether the near tier hears of every change of its keys, whoever makes it (Redis's
/// server-assisted client-side caching, `CLIENT TRACKING ... BCAST`), in [`Stats`] and the health
/// report. Serialized as `"off"`, `"connecting"`, `"on"` or `"refused"`.
///
/// ```
/// use stampede_guard::{Cache, TrackingState};
/// assert_eq!(Cache::in_memory().stats().near_tracking, TrackingState::Off);
/// assert_eq!(TrackingState::Refused.to_string(), "refused");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TrackingState {
    /// No near tier, or tracking turned off
    /// ([`track_outside_writes(false)`](crate::NearCacheOptions::track_outside_writes)): the
    /// tier hears of the crate's own writes only.
    #[default]
    Off,
    /// The near tier's feed is not connected yet (or is reconnecting): no copy is served.
    Connecting,
    /// Every change of a tracked key reaches the tier: writes from other programs, `DEL`,
    /// `EXPIRE`, expiry, eviction, `FLUSHDB`.
    On,
    /// The server refused `CLIENT TRACKING` (an ACL without `client`, a managed service that
    /// disables the command): the tier hears of the crate's own writes only, as with `Off`, and
    /// the log said so once.
    Refused,
}

impl TrackingState {
    /// The state's name: `off`, `connecting`, `on` or `refused`.
    ///
    /// ```
    /// assert_eq!(stampede_guard::TrackingState::On.as_str(), "on");
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            TrackingState::Off => "off",
            TrackingState::Connecting => "connecting",
            TrackingState::On => "on",
            TrackingState::Refused => "refused",
        }
    }

    /// Its number, for an atomic.
    pub(crate) fn index(self) -> u8 {
        match self {
            TrackingState::Off => 0,
            TrackingState::Connecting => 1,
            TrackingState::On => 2,
            TrackingState::Refused => 3,
        }
    }

    /// The state numbered `index` by [`index`](Self::index).
    pub(crate) fn from_index(index: u8) -> Self {
        match index {
            1 => TrackingState::Connecting,
            2 => TrackingState::On,
            3 => TrackingState::Refused,
            _ => TrackingState::Off,
        }
    }
}

/// `Display` and `serde::Serialize` for state enums whose text is their `as_str` word, so a log
/// line, a status page's JSON and `as_str` can never disagree.
macro_rules! text_is_as_str {
    ($($state:ty),+ $(,)?) => {$(
        impl std::fmt::Display for $state {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $state {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }
    )+};
}
pub(crate) use text_is_as_str;

text_is_as_str!(TrackingState, BreakerState);

/// Calls of the `get_or_compute` family (single keys and each key of a batch), by how each was
/// answered: every call in exactly one field, so they add up to the calls made, and a
/// computation is counted once, in the call that ran it (`computed`), however many callers
/// it answered. The label values of `stampede_guard_calls_total{answer}` are the field names.
///
/// ```
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let cache = stampede_guard::Cache::in_memory();
/// for _ in 0..3 {
///     let _: u8 = cache
///         .get_or_compute("k", Duration::from_secs(60), || async { Ok::<_, String>(1) })
///         .await
///         .unwrap();
/// }
/// let calls = cache.stats().calls;
/// assert_eq!((calls.computed, calls.hit, calls.total()), (1, 2, 3));
/// assert_eq!(calls.computations_saved(), 0);
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Calls {
    /// A fresh copy in this instance's near tier, without Redis.
    pub near_hit: u64,
    /// A fresh value read by this call from Redis (or the embedded store).
    pub hit: u64,
    /// A value this call computed under the lock.
    pub computed: u64,
    /// The value of another call of this process computing or reading the key, which this call
    /// joined (the in-process single flight) instead of asking Redis itself.
    pub joined: u64,
    /// A value another holder of the lock computed (another process, or another cache or a
    /// background refresh of this one) while this call waited on the lock.
    pub waited: u64,
    /// A value past its freshness, inside the stale window, while a refresh ran.
    pub stale: u64,
    /// The fail-safe fallback: a kept value, served because the computation failed, timed out
    /// or is throttled.
    pub fail_safe: u64,
    /// A copy held in process, served while the backend was unreachable.
    pub held: u64,
    /// A value computed without the cache, the backend being down.
    pub uncached: u64,
    /// An error: the computation's, a time-out, the backend's, or a remembered failure.
    pub error: u64,
}

impl Calls {
    /// Every call counted, once each.
    ///
    /// ```
    /// assert_eq!(stampede_guard::Cache::in_memory().stats().calls.total(), 0);
    /// ```
    pub fn total(&self) -> u64 {
        self.near_hit
            + self.hit
            + self.computed
            + self.joined
            + self.waited
            + self.stale
            + self.fail_safe
            + self.held
            + self.uncached
            + self.error
    }

    /// Calls answered by someone else's computation (or read): `joined + waited`. In a
    /// stampede of `n` cold calls for one key over the fleet, one computes and `n - 1` are
    /// saved, less those that arrived after the value landed (hits).
    ///
    /// ```
    /// assert_eq!(stampede_guard::Cache::in_memory().stats().calls.computations_saved(), 0);
    /// ```
    pub fn computations_saved(&self) -> u64 {
        self.joined + self.waited
    }
}

impl serde::Serialize for Calls {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("Calls", Answered::ALL.len())?;
        for answer in Answered::ALL {
            s.serialize_field(answer.as_str(), &answer.of(self))?;
        }
        s.end()
    }
}

/// How a call was answered: a field of [`Calls`], and the `answer` label of
/// `stampede_guard_calls_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answered {
    NearHit,
    Hit,
    Computed,
    Joined,
    Waited,
    Stale,
    FailSafe,
    Held,
    Uncached,
    Error,
}

impl Answered {
    /// Every answer, in the order of [`Calls`]'s fields.
    const ALL: [Answered; 10] = [
        Answered::NearHit,
        Answered::Hit,
        Answered::Computed,
        Answered::Joined,
        Answered::Waited,
        Answered::Stale,
        Answered::FailSafe,
        Answered::Held,
        Answered::Uncached,
        Answered::Error,
    ];

    /// The label value, and the field's name in [`Calls`].
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Answered::NearHit => "near_hit",
            Answered::Hit => "hit",
            Answered::Computed => "computed",
            Answered::Joined => "joined",
            Answered::Waited => "waited",
            Answered::Stale => "stale",
            Answered::FailSafe => "fail_safe",
            Answered::Held => "held",
            Answered::Uncached => "uncached",
            Answered::Error => "error",
        }
    }

    /// Its field in `calls`.
    fn of(self, calls: &Calls) -> u64 {
        match self {
            Answered::NearHit => calls.near_hit,
            Answered::Hit => calls.hit,
            Answered::Computed => calls.computed,
            Answered::Joined => calls.joined,
            Answered::Waited => calls.waited,
            Answered::Stale => calls.stale,
            Answered::FailSafe => calls.fail_safe,
            Answered::Held => calls.held,
            Answered::Uncached => calls.uncached,
            Answered::Error => calls.error,
        }
    }

    /// Its slot in the per-answer array.
    fn index(self) -> usize {
        self as usize
    }
}

/// Values a cache computed and returned but could not store, by reason: a full Redis, a
/// refused write, a fence lost to a newer writer, a backend that failed. Each is also logged,
/// at most once a minute per reason, with the count since the last line. A single-key call
/// computed without the cache is counted once its value is computed; a key of a batch, when
/// it goes to the batch's uncached computation.
///
/// ```
/// let stats = stampede_guard::Cache::in_memory().stats();
/// assert_eq!(stats.not_stored.total(), 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NotStored {
    /// Redis refused the write because its memory is full (`OOM`, `maxmemory` under
    /// `noeviction`), or refused the lock for it, so the value was computed without the cache.
    pub out_of_memory: u64,
    /// Redis refused the write (`NOPERM`, `READONLY`, `WRONGTYPE`...): a configuration error.
    pub refused: u64,
    /// The key was invalidated, set or taken over while the value was computed: the newer
    /// write wins (the fencing token), by design.
    pub fence_lost: u64,
    /// The backend was unreachable, busy or failed otherwise at the write, or before it (a value
    /// computed without the cache).
    pub backend_failed: u64,
}

impl NotStored {
    /// Every value not stored, whatever the reason.
    pub fn total(&self) -> u64 {
        self.out_of_memory + self.refused + self.fence_lost + self.backend_failed
    }
}

impl serde::Serialize for NotStored {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("NotStored", 4)?;
        s.serialize_field("out_of_memory", &self.out_of_memory)?;
        s.serialize_field("refused", &self.refused)?;
        s.serialize_field("fence_lost", &self.fence_lost)?;
        s.serialize_field("backend_failed", &self.backend_failed)?;
        s.end()
    }
}

/// Why a computed value was not stored: the label of `stampede_guard_not_stored_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotStoredReason {
    OutOfMemory,
    Refused,
    FenceLost,
    BackendFailed,
}

impl NotStoredReason {
    /// The reason a backend failure of `kind` gives.
    pub(crate) fn of(kind: BackendErrorKind) -> Self {
        match kind {
            BackendErrorKind::OutOfMemory => NotStoredReason::OutOfMemory,
            BackendErrorKind::RefusedPermission
            | BackendErrorKind::RefusedRole
            | BackendErrorKind::WrongType => NotStoredReason::Refused,
            _ => NotStoredReason::BackendFailed,
        }
    }

    /// The metric label and log field.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            NotStoredReason::OutOfMemory => "out-of-memory",
            NotStoredReason::Refused => "refused",
            NotStoredReason::FenceLost => "fence-lost",
            NotStoredReason::BackendFailed => "backend-failed",
        }
    }

    /// Its slot in the per-reason arrays.
    fn index(self) -> usize {
        self as usize
    }
}

/// How often at most a reason for values not stored is logged: one line with the count since
/// the last, instead of one per call (a full Redis would otherwise log on every miss).
const NOT_STORED_LOG_EVERY: Duration = Duration::from_secs(60);

// By hand rather than derived: no proc-macro dependency for users, and the duration gets a
// name that carries its unit.
impl serde::Serialize for Stats {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("Stats", 30)?;
        s.serialize_field("hits", &self.hits)?;
        s.serialize_field("misses", &self.misses)?;
        s.serialize_field("computes", &self.computes)?;
        s.serialize_field("waits", &self.waits)?;
        s.serialize_field("wait_time_seconds", &self.wait_time.as_secs_f64())?;
        s.serialize_field("stale_served", &self.stale_served)?;
        s.serialize_field("uncached", &self.uncached)?;
        s.serialize_field("wait_timeouts", &self.wait_timeouts)?;
        s.serialize_field("backend_errors", &self.backend_errors)?;
        s.serialize_field("lease_renewals", &self.lease_renewals)?;
        s.serialize_field("leases_lost", &self.leases_lost)?;
        s.serialize_field("fallback_served", &self.fallback_served)?;
        s.serialize_field("soft_timeouts", &self.soft_timeouts)?;
        s.serialize_field("hard_timeouts", &self.hard_timeouts)?;
        s.serialize_field("near_hits", &self.near_hits)?;
        s.serialize_field("near_misses", &self.near_misses)?;
        s.serialize_field("near_invalidations", &self.near_invalidations)?;
        s.serialize_field("near_switched_off", &self.near_switched_off)?;
        s.serialize_field("not_stored", &self.not_stored)?;
        s.serialize_field("recovery_queued", &self.recovery_queued)?;
        s.serialize_field("recovery_replayed", &self.recovery_replayed)?;
        s.serialize_field("recovery_refused", &self.recovery_refused)?;
        s.serialize_field("breaker", &self.breaker)?;
        s.serialize_field("breaker_opened", &self.breaker_opened)?;
        s.serialize_field("fast_failures", &self.fast_failures)?;
        s.serialize_field("held_served", &self.held_served)?;
        s.serialize_field("calls", &self.calls)?;
        s.serialize_field("computations_saved", &self.computations_saved)?;
        s.serialize_field("compute_time_seconds", &self.compute_time.as_secs_f64())?;
        s.serialize_field("lock_takeovers", &self.lock_takeovers)?;
        s.end()
    }
}

/// Something worth counting.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Event {
    /// A call of the `get_or_compute` family answered so (not after a wait: `AnsweredAfter`).
    Answered(Answered),
    /// A call answered by another's computation after waiting this long (`Joined`, `Waited`).
    AnsweredAfter(Answered, Duration),
    /// A call answered with an error; `miss`: it had found no usable value, so it counts in
    /// `Stats::misses` (a backend error or a remembered failure does not).
    Failed {
        miss: bool,
    },
    /// A computation of this process starts.
    Compute,
    /// A computation of this process ended (its value, error or hard timeout) after this long.
    ComputeTime(Duration),
    /// A lock found held was granted to this caller without a value landing.
    LockTakeover,
    WaitTimeout,
    BackendError,
    LeaseRenewed,
    LeaseLost,
    SoftTimeout,
    HardTimeout,
    NearHit,
    /// A call answered by the near tier's quick path: a hit and a near hit, counted once.
    NearHitServed,
    NearMiss,
    NearInvalidation,
    NearSwitchedOff,
    /// A computed value was not stored, for this reason.
    NotStored(NotStoredReason),
    /// A queued write was replayed.
    RecoveryReplayed,
    /// A write was refused by the full auto-recovery queue.
    RecoveryRefused,
    /// The open circuit breaker failed a backend operation at once.
    FastFailure,
    /// A call was answered with a near copy held while the backend was unreachable.
    HeldServed,
}

/// The live counters behind [`Stats`]; relaxed atomics, since each is an independent tally.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Calls by how they were answered (an [`Answered`]'s `index`), but for the near tier's
    /// quick hits, counted in `near_hits_served`.
    calls: [AtomicU64; 10],
    /// Calls answered with an error that had found no usable value (part of `misses`).
    failed_misses: AtomicU64,
    computes: AtomicU64,
    compute_micros: AtomicU64,
    lock_takeovers: AtomicU64,
    /// Time waited by the calls that joined a flight or waited on the lock.
    wait_micros: AtomicU64,
    wait_timeouts: AtomicU64,
    backend_errors: AtomicU64,
    lease_renewals: AtomicU64,
    leases_lost: AtomicU64,
    soft_timeouts: AtomicU64,
    hard_timeouts: AtomicU64,
    near_hits: AtomicU64,
    /// Calls answered by the near tier's quick path, in both `hits` and `near_hits` of the
    /// snapshot: one atomic add on the hottest path instead of two.
    near_hits_served: AtomicU64,
    near_misses: AtomicU64,
    near_invalidations: AtomicU64,
    near_switched_off: AtomicU64,
    /// Values not stored, per [`NotStoredReason`] (its `index`).
    not_stored: [AtomicU64; 4],
    /// The log line of each reason, throttled.
    not_stored_log: [LogThrottle; 4],
    /// The auto-recovery queue's length, set by the queue on every change (a gauge).
    recovery_queued: AtomicU64,
    recovery_replayed: AtomicU64,
    recovery_refused: AtomicU64,
    /// The circuit breaker's state ([`BreakerState::index`]), set on each transition.
    breaker: std::sync::atomic::AtomicU8,
    breaker_opened: AtomicU64,
    fast_failures: AtomicU64,
    held_served: AtomicU64,
}

impl Counters {
    pub(crate) fn record(&self, event: Event) {
        let add = |counter: &AtomicU64| {
            counter.fetch_add(1, Ordering::Relaxed);
        };
        let add_time = |counter: &AtomicU64, took: Duration| {
            let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
            counter.fetch_add(micros, Ordering::Relaxed);
        };
        match event {
            Event::Answered(answer) => add(&self.calls[answer.index()]),
            Event::AnsweredAfter(answer, waited) => {
                add(&self.calls[answer.index()]);
                add_time(&self.wait_micros, waited);
            }
            Event::Failed { miss } => {
                add(&self.calls[Answered::Error.index()]);
                if miss {
                    add(&self.failed_misses);
                }
            }
            Event::Compute => add(&self.computes),
            Event::ComputeTime(took) => add_time(&self.compute_micros, took),
            Event::LockTakeover => add(&self.lock_takeovers),
            Event::WaitTimeout => add(&self.wait_timeouts),
            Event::BackendError => add(&self.backend_errors),
            Event::LeaseRenewed => add(&self.lease_renewals),
            Event::LeaseLost => add(&self.leases_lost),
            Event::SoftTimeout => add(&self.soft_timeouts),
            Event::HardTimeout => add(&self.hard_timeouts),
            Event::NearHit => add(&self.near_hits),
            Event::NearHitServed => add(&self.near_hits_served),
            Event::NearMiss => add(&self.near_misses),
            Event::NearInvalidation => add(&self.near_invalidations),
            Event::NearSwitchedOff => add(&self.near_switched_off),
            Event::NotStored(reason) => add(&self.not_stored[reason.index()]),
            Event::RecoveryReplayed => add(&self.recovery_replayed),
            Event::RecoveryRefused => add(&self.recovery_refused),
            Event::FastFailure => add(&self.fast_failures),
            Event::HeldServed => add(&self.held_served),
        }
        emit(event);
    }

    /// The auto-recovery queue now holds `len` keys.
    pub(crate) fn set_recovery_queued(&self, len: usize) {
        let len = u64::try_from(len).unwrap_or(u64::MAX);
        self.recovery_queued.store(len, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::gauge!("stampede_guard_recovery_queued").set(len as f64);
    }

    /// The circuit breaker moved to `state`.
    pub(crate) fn breaker(&self, state: BreakerState) {
        self.breaker.store(state.index(), Ordering::Relaxed);
        if state == BreakerState::Open {
            self.breaker_opened.fetch_add(1, Ordering::Relaxed);
        }
        #[cfg(feature = "metrics")]
        {
            metrics::gauge!("stampede_guard_breaker_open").set(if state == BreakerState::Closed {
                0.0
            } else {
                1.0
            });
            metrics::counter!("stampede_guard_breaker_transitions_total", "to" => state.as_str())
                .increment(1);
            // One series per state, 1 for the state it is in: the usual shape of an enum in
            // Prometheus, so a panel shows which state, not only whether closed.
            for each in [
                BreakerState::Closed,
                BreakerState::Open,
                BreakerState::HalfOpen,
            ] {
                metrics::gauge!("stampede_guard_breaker_state", "state" => each.as_str())
                    .set(if each == state { 1.0 } else { 0.0 });
            }
        }
    }

    /// The value computed for `key` was not stored, for `reason` (`error` says how): counted,
    /// and logged at most once per [`NOT_STORED_LOG_EVERY`] per reason, with the count since
    /// the last line, so that a full or refusing Redis does not log once per call.
    pub(crate) fn not_stored(
        &self,
        reason: NotStoredReason,
        key: &str,
        error: &dyn std::fmt::Display,
    ) {
        self.record(Event::NotStored(reason));
        let Some(count) = self.not_stored_log[reason.index()].due(NOT_STORED_LOG_EVERY) else {
            return;
        };
        let label = reason.as_str();
        if reason == NotStoredReason::FenceLost {
            // By design: a newer write won while this value was computed.
            tracing::info!(reason = label, count, last_key = %key,
                "computed values returned but not stored: the key was invalidated, set or taken over meanwhile (count since the last such line)");
        } else if reason == NotStoredReason::BackendFailed {
            // The fallback of an outage (`ComputeUncached`) doing what it says: the outage
            // itself is the warning (the breaker's, the store's).
            tracing::info!(reason = label, count, last_key = %key, error = %error,
                "computed values returned but not stored: the backend is unreachable (count since the last such line)");
        } else {
            tracing::warn!(reason = label, count, last_key = %key, error = %error,
                "computed values returned but not stored in the cache (count since the last such line)");
        }
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let near_hits_served = get(&self.near_hits_served);
        let calls = self.calls(near_hits_served);
        Stats {
            hits: calls.hit + calls.near_hit,
            misses: calls.computed
                + calls.computations_saved()
                + calls.uncached
                + get(&self.failed_misses),
            computes: get(&self.computes),
            waits: calls.computations_saved(),
            wait_time: Duration::from_micros(get(&self.wait_micros)),
            stale_served: calls.stale,
            uncached: calls.uncached,
            wait_timeouts: get(&self.wait_timeouts),
            backend_errors: get(&self.backend_errors),
            lease_renewals: get(&self.lease_renewals),
            leases_lost: get(&self.leases_lost),
            fallback_served: calls.fail_safe,
            soft_timeouts: get(&self.soft_timeouts),
            hard_timeouts: get(&self.hard_timeouts),
            near_hits: get(&self.near_hits) + near_hits_served,
            near_misses: get(&self.near_misses),
            near_invalidations: get(&self.near_invalidations),
            near_switched_off: get(&self.near_switched_off),
            not_stored: NotStored {
                out_of_memory: get(&self.not_stored[NotStoredReason::OutOfMemory.index()]),
                refused: get(&self.not_stored[NotStoredReason::Refused.index()]),
                fence_lost: get(&self.not_stored[NotStoredReason::FenceLost.index()]),
                backend_failed: get(&self.not_stored[NotStoredReason::BackendFailed.index()]),
            },
            recovery_queued: get(&self.recovery_queued),
            recovery_replayed: get(&self.recovery_replayed),
            recovery_refused: get(&self.recovery_refused),
            breaker: match self.breaker.load(Ordering::Relaxed) {
                1 => BreakerState::Open,
                2 => BreakerState::HalfOpen,
                _ => BreakerState::Closed,
            },
            breaker_opened: get(&self.breaker_opened),
            fast_failures: get(&self.fast_failures),
            held_served: get(&self.held_served),
            calls,
            computations_saved: calls.computations_saved(),
            compute_time: Duration::from_micros(get(&self.compute_micros)),
            lock_takeovers: get(&self.lock_takeovers),
            // Filled in by `Cache::stats` from the near tier, which holds it.
            near_tracking: TrackingState::Off,
        }
    }
}

impl Counters {
    /// The calls by answer; `near_hits_served`: the near tier's quick hits.
    fn calls(&self, near_hits_served: u64) -> Calls {
        let get = |answer: Answered| self.calls[answer.index()].load(Ordering::Relaxed);
        Calls {
            near_hit: get(Answered::NearHit) + near_hits_served,
            hit: get(Answered::Hit),
            computed: get(Answered::Computed),
            joined: get(Answered::Joined),
            waited: get(Answered::Waited),
            stale: get(Answered::Stale),
            fail_safe: get(Answered::FailSafe),
            held: get(Answered::Held),
            uncached: get(Answered::Uncached),
            error: get(Answered::Error),
        }
    }
}

/// Sends the event to the `metrics` facade (whatever recorder the application installed).
#[cfg(feature = "metrics")]
fn emit(event: Event) {
    let name = match event {
        Event::Answered(answer) => return count_call(answer),
        Event::AnsweredAfter(answer, waited) => {
            metrics::histogram!("stampede_guard_lock_wait_seconds", "answer" => answer.as_str())
                .record(waited.as_secs_f64());
            metrics::counter!("stampede_guard_computations_saved_total").increment(1);
            return count_call(answer);
        }
        Event::Failed { .. } => return count_call(Answered::Error),
        Event::Compute => "stampede_guard_computes_total",
        Event::ComputeTime(took) => {
            metrics::histogram!("stampede_guard_compute_seconds").record(took.as_secs_f64());
            return;
        }
        Event::LockTakeover => "stampede_guard_lock_takeovers_total",
        Event::WaitTimeout => "stampede_guard_wait_timeouts_total",
        Event::BackendError => "stampede_guard_backend_errors_total",
        Event::LeaseRenewed => "stampede_guard_lease_renewals_total",
        Event::LeaseLost => "stampede_guard_leases_lost_total",
        Event::SoftTimeout => "stampede_guard_soft_timeouts_total",
        Event::HardTimeout => "stampede_guard_hard_timeouts_total",
        Event::NearHit => "stampede_guard_near_hits_total",
        Event::NearHitServed => {
            count_call(Answered::NearHit);
            "stampede_guard_near_hits_total"
        }
        Event::NearMiss => "stampede_guard_near_misses_total",
        Event::NearInvalidation => "stampede_guard_near_invalidations_total",
        Event::NearSwitchedOff => "stampede_guard_near_switched_off_total",
        Event::RecoveryReplayed => "stampede_guard_recovery_replayed_total",
        Event::RecoveryRefused => "stampede_guard_recovery_refused_total",
        Event::NotStored(reason) => {
            metrics::counter!("stampede_guard_not_stored_total", "reason" => reason.as_str())
                .increment(1);
            return;
        }
        Event::FastFailure => "stampede_guard_fast_failures_total",
        // A call answered so is counted by its answer (`held`); this counts the copies served.
        Event::HeldServed => return,
    };
    metrics::counter!(name).increment(1);
}

/// One call, by how it was answered.
#[cfg(feature = "metrics")]
fn count_call(answer: Answered) {
    metrics::counter!("stampede_guard_calls_total", "answer" => answer.as_str()).increment(1);
}

#[cfg(not(feature = "metrics"))]
fn emit(_: Event) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_near_hit_served_counts_as_a_hit_and_a_near_hit() {
        let counters = Counters::default();
        let hit = Event::Answered(Answered::Hit);
        for event in [Event::NearHitServed, Event::NearHit, hit] {
            counters.record(event);
        }
        let stats = counters.snapshot();
        assert_eq!((stats.hits, stats.near_hits), (2, 2));
        // Two calls, one answered by the near tier; the plain near look-up is no call.
        assert_eq!((stats.calls.near_hit, stats.calls.hit), (1, 1));
        assert_eq!(stats.calls.total(), 2);
    }

    /// Each call in exactly one answer: the answers add up to the calls, the saved
    /// computations are the joined and waited calls, and the older overlapping fields are
    /// derived from the same counts (a wait is a miss and a wait, never two misses).
    #[test]
    fn every_call_is_counted_once_by_its_answer() {
        let counters = Counters::default();
        let second = Duration::from_secs(1);
        for answer in Answered::ALL {
            match answer {
                Answered::Joined | Answered::Waited => {
                    counters.record(Event::AnsweredAfter(answer, second))
                }
                Answered::Error => counters.record(Event::Failed { miss: true }),
                answer => counters.record(Event::Answered(answer)),
            }
        }
        counters.record(Event::Failed { miss: false });
        let stats = counters.snapshot();
        assert_eq!(stats.calls.total(), 11);
        assert_eq!(stats.calls.error, 2);
        assert_eq!(stats.computations_saved, 2);
        assert_eq!(stats.calls.computations_saved(), 2);
        assert_eq!((stats.waits, stats.wait_time), (2, 2 * second));
        // computed, joined, waited, uncached and the error that found nothing.
        assert_eq!(stats.misses, 5);
        assert_eq!(
            (stats.hits, stats.stale_served, stats.fallback_served),
            (2, 1, 1)
        );
        let json = serde_json::to_value(stats.calls).unwrap();
        let fields = json.as_object().unwrap();
        assert_eq!(fields.len(), 10);
        assert!(fields.values().all(|n| n.as_u64().unwrap() >= 1));
    }

    /// A metric's name with its labels, `name{label=value,...}`.
    #[cfg(feature = "metrics")]
    fn named(key: &metrics::Key) -> String {
        let labels: Vec<String> = key
            .labels()
            .map(|label| format!("{}={}", label.key(), label.value()))
            .collect();
        if labels.is_empty() {
            key.name().to_owned()
        } else {
            format!("{}{{{}}}", key.name(), labels.join(","))
        }
    }

    /// The metrics see what `Stats` shows: a near hit served is one call and one near hit.
    #[cfg(feature = "metrics")]
    #[test]
    fn a_near_hit_served_reaches_both_metrics() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};

        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            Counters::default().record(Event::NearHitServed)
        });
        let mut counters: Vec<(String, u64)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(key, _, _, value)| match value {
                DebugValue::Counter(n) => Some((named(key.key()), n)),
                _ => None,
            })
            .collect();
        counters.sort();
        assert_eq!(
            counters,
            [
                ("stampede_guard_calls_total{answer=near_hit}".to_owned(), 1),
                ("stampede_guard_near_hits_total".to_owned(), 1)
            ]
        );
    }

    #[test]
    fn values_not_stored_are_counted_per_reason_and_logged_once_per_interval() {
        let counters = Counters::default();
        for _ in 0..3 {
            counters.not_stored(NotStoredReason::OutOfMemory, "k", &"OOM");
        }
        counters.not_stored(NotStoredReason::FenceLost, "k", &"fence");
        let stats = counters.snapshot();
        assert_eq!(
            (stats.not_stored.out_of_memory, stats.not_stored.fence_lost),
            (3, 1)
        );
        assert_eq!(stats.not_stored.total(), 4);
        // The first of each reason was logged (its count taken); the next two wait for the
        // next line, a minute later, which will say 2.
        let oom = &counters.not_stored_log[NotStoredReason::OutOfMemory.index()];
        assert_eq!(oom.pending(), 2);
        let fence = &counters.not_stored_log[NotStoredReason::FenceLost.index()];
        assert_eq!(fence.pending(), 0);
    }

    #[test]
    fn stats_serialize_every_counter_and_the_wait_time_in_seconds() {
        let counters = Counters::default();
        let hit = Event::Answered(Answered::Hit);
        for event in [hit, hit, Event::Compute, Event::BackendError] {
            counters.record(event);
        }
        let waited = Duration::from_millis(1500);
        counters.record(Event::AnsweredAfter(Answered::Waited, waited));
        counters.record(Event::ComputeTime(Duration::from_millis(250)));
        counters.record(Event::FastFailure);
        counters.breaker(BreakerState::HalfOpen);
        let json = serde_json::to_value(counters.snapshot()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "hits": 2, "misses": 1, "computes": 1, "waits": 1, "wait_time_seconds": 1.5,
                "stale_served": 0, "uncached": 0, "wait_timeouts": 0, "backend_errors": 1,
                "lease_renewals": 0, "leases_lost": 0, "fallback_served": 0, "soft_timeouts": 0,
                "hard_timeouts": 0, "near_hits": 0, "near_misses": 0,
                "near_invalidations": 0, "near_switched_off": 0,
                "not_stored": {"out_of_memory": 0, "refused": 0, "fence_lost": 0, "backend_failed": 0},
                "recovery_queued": 0, "recovery_replayed": 0, "recovery_refused": 0,
                "breaker": "half-open", "breaker_opened": 0, "fast_failures": 1, "held_served": 0,
                "calls": {"near_hit": 0, "hit": 2, "computed": 0, "joined": 0, "waited": 1,
                          "stale": 0, "fail_safe": 0, "held": 0, "uncached": 0, "error": 0},
                "computations_saved": 1, "compute_time_seconds": 0.25, "lock_takeovers": 0,
            })
        );
    }

    #[test]
    fn a_throttled_line_is_due_first_then_once_per_period_with_the_count() {
        let throttle = LogThrottle::new();
        assert_eq!(
            throttle.due(Duration::from_secs(60)),
            Some(1),
            "the first at once"
        );
        for _ in 0..5 {
            assert_eq!(throttle.due(Duration::from_secs(60)), None);
        }
        // A period of zero has passed: the line is due, counting the five held back.
        assert_eq!(throttle.due(Duration::ZERO), Some(6));
    }
}
