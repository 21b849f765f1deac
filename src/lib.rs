//! Stops cache stampedes: when many tasks, processes or machines miss the same key at once,
//! exactly one computes it and the others wait for its value.
//!
//! # Quick start
//!
//! On Redis, shared by every process and machine that uses the same namespace:
//!
//! ```no_run
//! use serde::{Deserialize, Serialize};
//! use stampede_guard::Cache;
//! use std::time::Duration;
//!
//! #[derive(Clone, Serialize, Deserialize)]
//! struct MonthlyReport { orders: u64, revenue_cents: u64 }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), stampede_guard::Error> {
//!     let cache = Cache::builder()
//!         .redis_url("redis://127.0.0.1:6379/0")
//!         .namespace("reports")
//!         .build()
//!         .await?;
//!
//!     let report: MonthlyReport = cache
//!         .get_or_compute("2019-05", Duration::from_secs(300), || async {
//!             // the slow query; any future returning Result<T, E> with E: Display + Debug
//!             Ok::<_, std::io::Error>(MonthlyReport { orders: 2_000, revenue_cents: 1_000_000 })
//!         })
//!         .await?;
//!     println!("{} orders", report.orders);
//!     Ok(())
//! }
//! ```
//!
//! Without Redis, the embedded store gives the same behaviour inside one process:
//!
//! ```
//! use stampede_guard::Cache;
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), stampede_guard::Error> {
//! let cache = Cache::in_memory();
//! let rows: Vec<u64> = cache
//!     .get_or_compute("2019-05", Duration::from_secs(300), || async {
//!         Ok::<_, std::io::Error>(vec![1, 2, 3]) // the slow query
//!     })
//!     .await?;
//! assert_eq!(rows, [1, 2, 3]);
//! # Ok(())
//! # }
//! ```
//!
//! In an axum handler (feature `axum`), `?` turns the crate's [`Error`] into a response: 503 with
//! `Retry-After` when Redis is down, 500 when the computation failed (module `web`).
//!
//! # The guide
//!
//! The API is documented here; the questions around it are answered in the guide, one page each:
//!
//! - [Choose your options](https://github.com/stampede-guard/stampede-guard/blob/main/docs/choose-your-options.md):
//!   by situation (a fleet, Redis outages, writes after commits, many tenants, a managed Redis),
//!   the builder to copy and what it gives up.
//! - [A complete service](https://github.com/stampede-guard/stampede-guard/blob/main/docs/service-example.md): axum + sqlx + `get_or_compute` + a
//!   [`leader::Leader`] job with one shutdown signal.
//! - [How it works](https://github.com/stampede-guard/stampede-guard/blob/main/docs/how-it-works.md): the protocol, the keys, the scripts, the round trips.
//! - [Guarantees and failure semantics](https://github.com/stampede-guard/stampede-guard/blob/main/docs/guarantees.md): the full table, the clock and fencing
//!   rules, eviction policies, [when Redis is down](https://github.com/stampede-guard/stampede-guard/blob/main/docs/guarantees.md#when-redis-is-down).
//! - [Freshness](https://github.com/stampede-guard/stampede-guard/blob/main/docs/freshness.md) (stale-while-revalidate, XFetch, negative caching),
//!   [Fail-safe and timeouts](https://github.com/stampede-guard/stampede-guard/blob/main/docs/fail-safe.md), [Batch](https://github.com/stampede-guard/stampede-guard/blob/main/docs/batch.md).
//! - [The near tier](https://github.com/stampede-guard/stampede-guard/blob/main/docs/near-cache.md), [The lock and leader election](https://github.com/stampede-guard/stampede-guard/blob/main/docs/lock-and-leader.md),
//!   [Redis Cluster and Redlock](https://github.com/stampede-guard/stampede-guard/blob/main/docs/cluster-and-redlock.md).
//! - [Security](https://github.com/stampede-guard/stampede-guard/blob/main/docs/security.md), [Observability](https://github.com/stampede-guard/stampede-guard/blob/main/docs/observability.md),
//!   [Configuration reference](https://github.com/stampede-guard/stampede-guard/blob/main/docs/configuration.md) (every option, default, unit and bound).
//! - [Performance](https://github.com/stampede-guard/stampede-guard/blob/main/docs/performance.md) (every figure with its command and date),
//!   [Testing under faults](https://github.com/stampede-guard/stampede-guard/blob/main/docs/testing-under-faults.md).
//!
//! # How it works
//! 1. Read the value; a hit returns at once (one `GET`).
//! 2. On a miss, one task per process per key goes on (in-process single flight); it runs a
//!    script that reads the value again or takes the key's lock (`SET NX PX` with a random token)
//!    and bumps its fencing counter.
//! 3. The lock holder computes while a heartbeat renews its lease, then writes the value and frees
//!    the lock in one script, which refuses the write if the key was invalidated, set or taken
//!    over in the meantime (fencing), and publishes a wake-up.
//! 4. Everyone else waits for the wake-up (or a jittered, capped exponential backoff, never past
//!    the holder's lease) and reads again; if the holder died, its lease runs out and one waiter
//!    takes over.
//!
//! # Which API do I want?
//! - [`Cache::get_or_compute`]: an expensive value behind a shared cache, computed once.
//! - [`Lock`] ([`Lock::builder`] or [`Cache::lock`]): a named lease with fencing tokens, for work
//!   that must run on one machine at a time.
//! - [`leader::Leader`]: a scheduled job that exactly one of many instances runs, the others
//!   standing by to take over.
//! - [`Redlock`]: the same [`Lock`] held over a majority of independent Redis masters, when one
//!   Redis is too much of a single point of failure for the lock.
//! - `#[cached]` (feature `macros`): the same as `get_or_compute`, written as an attribute on an
//!   async function or method, its key a template of the arguments.
//! - [`NearCacheOptions`] (via [`CacheBuilder::near_cache`]): hot values served from this process
//!   without a round trip, kept coherent across instances, never staler than a bound you choose.
//!
//! # Failure semantics
//!
//! The full table, with the clock and fencing rules: [Guarantees](https://github.com/stampede-guard/stampede-guard/blob/main/docs/guarantees.md).
//!
//! | situation | what happens |
//! |---|---|
//! | many callers miss one key at once | one computes; in its process the others share its outcome; other processes wait for the value |
//! | the computation fails | the lock is freed at once and waiters wake; this process's waiting callers get the same [`Error::Compute`]; nothing is cached unless [`CallOptions::negative_ttl`] is set |
//! | it panics, or the caller's future is dropped | the lock is freed (best effort from `Drop`, the lease running out as the backstop) and one waiter takes over; the panic reaches the computing caller |
//! | the caller is dropped while its lock request is in flight | the lock is freed all the same: the owner token is known before the request is sent, and its guard exists from then on |
//! | the holder dies | its lease runs out (at most one lease after its last renewal) and one waiter takes over |
//! | the holder pauses past its lease | [`Lease::lost`] fires; its value is returned to it but not written over a newer holder's (fencing) |
//! | `invalidate` or `set` during a computation | that computation's write is refused |
//! | bytes under a key that are not ours, or a value written for another shape of `T` ([type changes](Codec#type-changes)) | a miss, logged; the next computation overwrites them |
//! | waiting longer than [`CallOptions::wait_timeout`] | [`Error::WaitTimeout`] |
//! | Redis refuses (`NOPERM`, `WRONGPASS`, `READONLY`, `WRONGTYPE`) | [`Error::Backend`] with [`Error::is_refused`] (or kind [`BackendErrorKind::WrongType`]), its message naming the key and the fix, whatever the [`OnBackendError`]: a refusal is not an outage |
//! | Redis unreachable | [`Error::Backend`] naming the operation, or with [`OnBackendError::ComputeUncached`] the value computed without the cache (still once per process), `get` a miss and `set` a skipped write (`invalidate` and locks still fail); reconnection is automatic |
//! | machines whose clocks disagree | freshness is stamped and judged by the Redis server's clock, which each process estimates (three `TIME`s before its first call, then every minute; no command on the hit path) |
//! | Redis evicts our keys (`maxmemory` with a policy other than `noeviction`) | an evicted value is recomputed; an evicted fence key makes the running computation's write be refused (the caller still gets its value); an evicted lock key lets a second holder of a [`Lock`] or [`leader::Leader`] in at once (the first learns at its next renewal; fencing tokens still order their writes). Warned once per store; use `noeviction`, or a separate server for locks |
//! | the near tier's invalidation stream breaks (a dropped, cut or black-holed connection, a restarted server, a paused process) | within [`NearCacheOptions::max_staleness`] it stops serving copies, drops them and reads Redis until the stream is proven live again |
//! | a stale value inside [`CallOptions::stale_for`] | served at once while one caller in the fleet refreshes it; a failed refresh keeps it until its hard expiry |
//!
//! # Backends
//! - The embedded in-memory store ([`Cache::in_memory`]): one process, no server; the default.
//! - Redis ([`CacheBuilder::redis_url`]), for many processes and machines. A password or an ACL
//!   user goes into the URL (`redis://user:password@host:port/db`); it never appears in this
//!   crate's `Debug` output, errors or logs.
//! - Redis Cluster ([`CacheBuilder::redis_cluster`]), with sharded pub/sub for wake-ups.
//!
//! # Feature flags
//! No feature is on by default; each one adds an integration and nothing else (they are additive).
//! (The items of a feature are not linked below, so that these docs build with or without it.)
//!
//! | feature | what it adds | extra dependencies |
//! |---|---|---|
//! | `metrics` | every call's outcome, waits, lease renewals and losses go to the `metrics` facade as well as to [`Cache::stats`] (names in [`Stats`]) | `metrics` |
//! | `tls` | `rediss://` URLs, through rustls with the ring crypto provider, trusting the system's root certificates (or those of a client made with `redis::Client::build_with_tls` and passed to [`CacheBuilder::redis_client`]); if your program also enables rustls's `aws-lc-rs` provider, install a process-wide default provider at start-up, as rustls requires when it finds two | `rustls` (ring), redis's rustls features |
//! | `axum` | [`Error`] implements axum's `IntoResponse` (503 for backend errors, wait timeouts and an unavailable source, 500 for failed computations, 400 for invalid keys) with a JSON body (`{"error": "...", "status": 503}`; `web::text_response` for plain text), and `web::response` (the whole response: status, `Retry-After`, the log line, one per kind of error and minute) and `web::status` serve handlers with their own error type; the `x-cache` header from a `Fetched`, the health report as a response, `web::probes` (`/livez`, `/readyz`: ready while the instance serves, Redis down or not), and `web::shutdown_signal()` for `axum::serve` and `Leader::run` together; see the module `stampede_guard::web` | `axum` (no default features), `serde_json`, tokio's `signal` |
//! | `tower` | `web::ResponseCacheLayer`: whole `GET`/`HEAD` responses cached through the crate, one handler execution per key across the fleet, with `Vary`, `Cache-Control`, `ETag`/`304` and the `x-cache` header (implies `axum`) | `tower`, `http-body`, `http-body-util`, `bytes` (all of which axum already builds on) |
//! | `sqlx` | a computation's sqlx error that says the database is down or busy (a pool time-out or closed pool, I/O, a lost connection, PostgreSQL's `admin_shutdown`, `cannot_connect_now`, `too_many_connections`, a connection exception, a serialization failure or deadlock) counts as an unavailable source ([`Error::is_source_unavailable`]): with `axum`, a 503 with `Retry-After` instead of a 500; a syntax, constraint or missing-table error stays a 500. `From<sqlx::Error>` for [`Error`], so `?` works in a `#[cached]` function | `sqlx` (no default features: no driver, no runtime) |
//! | `compression` | `Compressed`, a codec for [`CacheBuilder::codec`] that LZ4-compresses another codec's payloads (by default [`Bincode`]'s) from a threshold on (1 KiB by default): for a ~100 KiB report of rows, measured: 0.44× the Redis memory and the bytes per hit, half the server's time per read, about 30 µs more client CPU per hit and 200 µs per write; decompression bounded by [`MAX_VALUE_BYTES`]. Changing the codec makes each stored value a miss once. Figures and when to turn it on: [Performance](https://github.com/stampede-guard/stampede-guard/blob/main/docs/performance.md#compressing-large-values) | `lz4_flex` (pure Rust, its safe decoder, no default features) |
//! | `macros` | the `#[cached]` attribute (`stampede_guard::cached`): an async function or method whose body is the computation of `get_or_compute`, its key a template of its arguments, its error its own | `stampede-guard-macros` (this crate's proc-macro crate: `syn`, `quote`, `proc-macro2`) |
//!
//! One more feature, `simulation`, is not for applications: it builds the hooks of the crate's
//! deterministic simulation test (`tests/sim/`, hidden, not part of the API; see
//! [Testing under faults](https://github.com/stampede-guard/stampede-guard/blob/main/docs/testing-under-faults.md#the-deterministic-simulation)).
//!
//! # Limits
//! Keys longer than [`MAX_KEY_BYTES`] (512 bytes) are refused with [`Error::InvalidKey`], and
//! values whose encoding exceeds [`MAX_VALUE_BYTES`] (64 MiB) with [`Error::ValueTooLarge`],
//! and many-key calls of more than [`MAX_BATCH_KEYS`] (20,000) keys with
//! [`Error::TooManyKeys`], before anything is sent to the backend.
//!
//! # Examples
//! In `examples/`, each runnable with `cargo run --example NAME`:
//! - `monthly_report`: 10 concurrent dashboard requests × 12 months on a cold cache.
//! - `sqlx_query`: a slow aggregate query on a real database (SQLite in memory, or PostgreSQL
//!   with `DATABASE_URL`), naive cache-aside against `get_or_compute`.
//! - `axum_report` (`--features axum`): an HTTP service, `GET /report/{month}`, computed from the
//!   database through the cache.
//! - `leader_sync`: leader election with hand-over.
//! - `stampede_bench`: the load generator of the figures in
//!   [Performance](https://github.com/stampede-guard/stampede-guard/blob/main/docs/performance.md).
#![deny(missing_docs, missing_debug_implementations)]
#![warn(rust_2018_idioms, unreachable_pub)]

// Five layers; imports point down only (a child module may use its parent's items):
// `cache` (the handle and its call paths; `web` beside it) → `lock` (locks, leases, leader
// election, Redlock) → `wait` (single flight, waiting for a holder) → `store`
// (the backends, `backend` that builds them, and the wake-ups they produce) → `wire` (keys,
// envelope, codec, shape). Below them the leaves, which every layer may use and which use no
// layer: `error`, `time`, `sync`, `join`, `options` (which uses `time`) and `stats`.
mod cache;
#[cfg(feature = "macros")]
mod cached;
mod error;
mod join;
mod lock;
mod log;
mod options;
mod planted;
mod random;
mod signal;
#[cfg(feature = "sqlx")]
mod sqlx_source;
mod stats;
mod store;
mod sync;
mod time;
mod wait;
#[cfg(feature = "axum")]
pub mod web;
mod wire;

pub use cache::batch::MAX_BATCH_KEYS;
pub use cache::bounds::{CacheValue, ComputeFailure};
pub use cache::builder::CacheBuilder;
pub use cache::freshness::{Computed, Fetched, Source};
pub use cache::health::{Health, HealthReason, HealthState};
pub use cache::inspect::{Inspection, LockHolder, NearCopy, Standing, StoredValue};
pub use cache::near::NearCacheOptions;
pub use cache::recovery::{RecoveryOptions, Written};
pub use cache::Cache;
pub use error::BackendError;
pub use error::{
    BackendErrorKind, ComputeError, Error, NotShared, RecoveryLimit, SourceUnavailable,
};
pub use lock::leader;
pub use lock::lease::Lease;
pub use lock::redlock::{Redlock, RedlockBuilder};
pub use lock::{Lock, LockBuilder, LockGuard};
pub use options::{Backoff, CallOptions, OnBackendError, SpanKeys};
pub use stats::{BreakerState, Calls, NotStored, Stats, TrackingState};
pub use store::{
    BreakerOptions, Capabilities, ConnectionOptions, LockWrite, MemoryLimits, ServerKind,
};
pub use time::FOREVER;
pub use wire::codec::{Bincode, Codec, CodecError, MAX_VALUE_BYTES};
#[cfg(feature = "compression")]
pub use wire::compressed::Compressed;
pub use wire::key::{MAX_KEY_BYTES, MAX_TAGS};

/// Caches an async function's `Ok` value through a [`Cache`], one run of its body per key
/// across the fleet: `#[cached(cache = .., key = "..", ttl_secs = ..)]` (feature `macros`).
///
/// The function's body becomes the computation of [`Cache::get_or_compute`]: a hit returns the
/// cached value without running it; on a miss exactly one caller in the fleet runs it, the
/// others in its process share its outcome and other processes wait for its value.
///
/// ```
/// use stampede_guard::{cached, Cache, Error};
/// use std::sync::LazyLock;
///
/// static REPORTS: LazyLock<Cache> = LazyLock::new(Cache::in_memory);
///
/// #[cached(cache = REPORTS, key = "report:{month}", ttl_secs = 300)]
/// async fn monthly_total(month: &str) -> Result<u64, Error> {
///     // the slow query, run once per month per 5 minutes
///     Ok(month.len() as u64 * 1_000)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// assert_eq!(monthly_total("2019-05").await?, 7_000);
/// assert_eq!(REPORTS.get::<u64>("report:2019-05").await?, Some(7_000));
/// # Ok(())
/// # }
/// ```
///
/// # Arguments
/// | argument | | what it is |
/// |---|---|---|
/// | `cache = EXPR` | required | the [`Cache`]: `&(EXPR)` must be a `&Cache`, e.g. a field (`self.cache`), a `static` (`LazyLock<Cache>`), a function call |
/// | `key = "template"` | required | the key, in `format!` syntax whose placeholders name the function's arguments (`"report:{month}"`, `"sales:{shop}:{day:02}"`); each named argument must be `Display`. A placeholder that names no argument, or no name (`{}`), is a compile error. Values are written as they are: if two arguments may hold the separator between them, two calls can share a key (`"{a}:{b}"` for `("x:y", "z")` and `("x", "y:z")`); with arguments from requests, use a separator they cannot hold, or validate them |
/// | `ttl_secs = 300` or `ttl = EXPR` | one of them | how long a value stays fresh: seconds as a literal, or any `Duration` expression |
/// | `options = EXPR` | optional | the [`CallOptions`] of this function's calls (stale window, fail-safe, wait time-out...); without it, the cache's own |
///
/// # What the function may be
/// An `async fn` or method returning `Result<T, E>`, where `T` is a [`CacheValue`] and
/// `E: From<Error> + Send + 'static`: your application's error (an axum error enum as it is,
/// with no `Display` or `Debug` needed), `anyhow::Error`,
/// `Box<dyn std::error::Error + Send + Sync>`, or [`Error`] itself. Without `From<Error>`, the
/// compile error says so on the return type, and why: the cache's own failures come back
/// through it.
///
/// The body may run in a task of its own after the call returns (a refresh in the background,
/// with [`CallOptions::stale_for`]), so it owns what it uses; the expansion makes it so:
/// - arguments taken by value are moved into it;
/// - an argument taken by reference (`month: &str`, `filter: &Filter`) is copied with
///   `ToOwned` (a `String`, a clone) before the call and borrowed again inside the body, under
///   the same name and type;
/// - a method taking `&self` whose body uses `self` runs on a clone of `self`: `Self` must be
///   `Clone + Send + Sync + 'static`, a cheap handle (a [`Cache`], a pool, `Arc`s), as handler
///   state already is. `&mut self`, `self` by value and `&mut` arguments are refused with a
///   compile error (the body runs once for many callers).
///
/// ```
/// use stampede_guard::{cached, Cache, Error};
///
/// #[derive(Clone)]
/// struct Reports {
///     cache: Cache,
///     rows_per_month: u64,
/// }
///
/// impl Reports {
///     #[cached(cache = self.cache, key = "rows:{month}", ttl_secs = 60)]
///     async fn rows(&self, month: String) -> Result<u64, Error> {
///         Ok(self.rows_per_month)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let reports = Reports { cache: Cache::in_memory(), rows_per_month: 31 };
/// assert_eq!(reports.rows("2019-05".to_string()).await?, 31);
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// The function's own `E`, in three ways:
/// - **the body failed in this call**: its error comes back unchanged, by value. It is kept
///   for this caller alone, so `E` need not be `Clone`; nothing is cached (unless
///   [`CallOptions::negative_ttl`] remembers the failure) and the next call runs the body again;
/// - **the body failed in another call of this process that this one waited on**:
///   `E::from(Error::Compute(..))`, whose source's message is the failed body's error's
///   `Display` (else its `Debug`, else its type's name; its value went to the caller that ran
///   it: a shared [`ComputeError`] can give its error back only by reference, which for an `E`
///   that is not `Clone` is no `E`);
/// - **the cache failed** (Redis down, a wait time-out, an invalid key, a remembered failure):
///   `E::from` that [`Error`], exactly as [`Cache::get_or_compute`] returns it.
///
/// Callers in other processes never receive another process's error: they take the lock after
/// it is freed and run the body themselves.
///
/// # What it expands to
/// The function keeps its signature; its body becomes one call (see it with `cargo expand`):
///
/// ```text
/// async fn monthly_total(month: &str) -> Result<u64, Error> {
///     let __owned_month = ::std::borrow::ToOwned::to_owned(month);
///     ::stampede_guard::__cached::run(
///         &(REPORTS),
///         ::std::format!("report:{month}", month = month),
///         ::core::time::Duration::from_secs(300),
///         ::core::option::Option::None,
///         async move {
///             #[allow(unused_variables)]
///             let month: &str = ::std::borrow::Borrow::borrow(&__owned_month);
///             ::core::convert::identity::<Result<u64, Error>>({
///                 Ok(month.len() as u64 * 1_000)
///             })
///         },
///         // The error's text for the callers that waited (its `Display`, else its `Debug`,
///         // else its type's name), and `From<Error>`, both named on the return type.
///         (|error: &<Result<u64, Error> as Returns>::Error| /* ... */, from_error::<..>),
///     )
///     .await
/// }
/// ```
///
/// The body's `self` is renamed `__self` (the clone) inside the block, as `async-trait` does;
/// a `self` of an item nested in the body (an `impl` block inside the function) would be
/// renamed too, so define such items outside it.
#[cfg(feature = "macros")]
#[doc(inline)]
pub use stampede_guard_macros::cached;

/// Not part of the API: what `#[cached]` expands to (module `cached`).
#[cfg(feature = "macros")]
#[doc(hidden)]
pub mod __cached {
    pub use crate::cached::{from_error, run, text, CachedError, Describe, Returns};
    pub use crate::error::BodyFailed;
}

/// The guide's pages as doc tests: every `rust` block of `docs/*.md` compiles (and runs, unless
/// it is `no_run`), so a page cannot drift from the API. A block that is not Rust is fenced
/// with its language (`text`, `sh`, `toml`, `json`), which rustdoc leaves alone. Every page of
/// `docs/` is listed (tests/docs_compile.rs checks it), so a new page's blocks are tested too.
#[cfg(doctest)]
mod guide {
    macro_rules! pages {
        ($($(#[$cfg:meta])* $name:ident = $file:literal;)*) => {$(
            $(#[$cfg])*
            #[doc = include_str!(concat!("../docs/", $file))]
            struct $name;
        )*};
    }

    pages! {
        // Its block is a handler: it uses `stampede_guard::web`.
        #[cfg(feature = "axum")]
        AfterCommit = "after-commit.md";
        // It imports every public item, those of `web` and `cached` included.
        #[cfg(all(feature = "axum", feature = "macros"))]
        Api = "api.md";
        Architecture = "architecture.md";
        Batch = "batch.md";
        ChooseYourOptions = "choose-your-options.md";
        ClusterAndRedlock = "cluster-and-redlock.md";
        Configuration = "configuration.md";
        // Its block merges `web::probes`.
        #[cfg(feature = "axum")]
        HealthAndProbes = "health-and-probes.md";
        FailSafe = "fail-safe.md";
        Freshness = "freshness.md";
        Guarantees = "guarantees.md";
        HowItWorks = "how-it-works.md";
        LockAndLeader = "lock-and-leader.md";
        NearCache = "near-cache.md";
        Observability = "observability.md";
        Outages = "outages.md";
        PastOneRedis = "past-one-redis.md";
        Performance = "performance.md";
        Readme = "README.md";
        Security = "security.md";
        Servers = "servers.md";
        Tags = "tags.md";
        // Its handlers use `stampede_guard::web`.
        #[cfg(feature = "axum")]
        ServiceExample = "service-example.md";
        TestingUnderFaults = "testing-under-faults.md";
        // The response cache's layer.
        #[cfg(feature = "tower")]
        Web = "web.md";
    }
}

/// Not part of the API: the entry point of the `cargo fuzz` target in `fuzz/`, compiled only
/// with `--cfg fuzzing` (which `cargo fuzz` passes). The envelope decoder is crate-private, and a
/// fuzz target is a separate crate, so this is the smallest door to it: it reads `bytes` as the
/// cache reads whatever it finds under a key, and panics only if an accepted envelope does not
/// survive re-encoding.
#[cfg(fuzzing)]
#[doc(hidden)]
pub fn __fuzz_read_stored(bytes: &[u8]) {
    use wire::envelope::Envelope;
    use wire::shape::fingerprint;

    let Ok(envelope) = Envelope::decode(bytes, Bincode.id()) else {
        return;
    };
    let again = envelope.encode();
    // The flags byte keeps only the bits this version knows, so compare what decodes, not bytes.
    assert_eq!(again.len(), bytes.len(), "length changed on re-encoding");
    assert_eq!(Envelope::decode(&again, Bincode.id()), Ok(envelope.clone()));
    // The payload as the cache would decode it: only for the type whose shape the envelope
    // names (a miss otherwise), and then a value or a miss, never a panic or a huge allocation
    // (the codec is limited to MAX_VALUE_BYTES). The fuzzer finds the shapes by comparison.
    if envelope.shape == fingerprint::<Vec<String>>() {
        let _ = Bincode.decode::<Vec<String>>(envelope.payload);
    }
    if envelope.shape == fingerprint::<(String, u64, Option<Vec<u8>>)>() {
        let _ = Bincode.decode::<(String, u64, Option<Vec<u8>>)>(envelope.payload);
    }
}

/// Not part of the API: the crate's own readers of what it stores, for the chaos test's replay
/// (`tests/chaos/replay.rs`), which rebuilds the server's decisions from the commands it ran.
/// The envelope and the key layout are crate-private; a copy of their offsets and suffixes in
/// the test would go on reading an old format after a change (a failed read once silently
/// became fence 0). Through these, a format change changes the replay with it, and bytes the
/// crate cannot read are an error the checker reports.
#[doc(hidden)]
pub mod __private {
    use serde::de::DeserializeOwned;
    use serde::Serialize;

    use crate::wire::envelope::Envelope;
    use crate::wire::key::{clear_key, is_epoch_key, tag_key, user_key_of, EntryKeys};
    use crate::wire::shape::fingerprint;
    use crate::{Bincode, Codec};

    /// The deterministic simulation's hooks (`tests/sim/`, feature `simulation`): its server
    /// and network, a cache built over them, the seed of every random draw, planted bugs.
    #[cfg(feature = "simulation")]
    pub mod sim {
        use std::sync::Arc;

        pub use crate::store::simulated::{Applied, Connection, Network, Server, Skew};

        /// A cache builder whose backend is `connection` (a near tier needs its feed:
        /// [`Connection::with_feed`]).
        pub fn builder(connection: Connection) -> crate::CacheBuilder {
            crate::Cache::builder().simulated(Arc::new(connection))
        }

        /// Seeds every random draw of the crate on this thread (`None`: the OS's again).
        pub fn seed_thread(seed: Option<u64>) {
            crate::random::seed_thread(seed);
        }

        /// Runs `work`, and every task the crate spawns for it, on a monotonic clock that
        /// runs `ppm` parts per million fast (slow, below zero) from `base` on: one instance's
        /// clock (`crate::time`).
        pub async fn drifted<F: std::future::Future>(
            base: tokio::time::Instant,
            ppm: i32,
            work: F,
        ) -> F::Output {
            crate::time::drifted(base, ppm, work).await
        }

        /// Whether `fetched` was served from the near tier of the instance that asked (a
        /// [`Source::Hit`](crate::Source::Hit) says only that the call read it, from Redis or
        /// its near tier).
        pub fn from_near<T>(fetched: &crate::Fetched<T>) -> bool {
            fetched.via == crate::cache::freshness::Via::Near
        }

        /// The bugs the simulation must find (docs/testing-under-faults.md).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Bug {
            /// The store accepts a computation's write whatever its fencing counter says.
            FenceSkipped,
            /// A batch read serves a stored value without judging it by its epochs.
            EpochIgnoredInBatch,
            /// The heartbeat believes a renewal it never sent.
            LeaseNotRenewed,
            /// The near tier serves copies without a recent proof from its feed.
            NearWithoutProof,
            /// A read skips replaying the writes its instance queued for the key.
            QueuedReplayedAfterRead,
            /// A held near copy is served however long ago its feed was last proven current.
            HeldPastBound,
        }

        /// Switches `bug` on or off, on this thread only.
        pub fn plant(bug: Bug, on: bool) {
            use crate::planted::Bug as B;
            let bug = match bug {
                Bug::FenceSkipped => B::FenceSkipped,
                Bug::EpochIgnoredInBatch => B::EpochIgnoredInBatch,
                Bug::LeaseNotRenewed => B::LeaseNotRenewed,
                Bug::NearWithoutProof => B::NearWithoutProof,
                Bug::QueuedReplayedAfterRead => B::QueuedReplayedAfterRead,
                Bug::HeldPastBound => B::HeldPastBound,
            };
            crate::planted::plant(bug, on);
        }
    }

    /// The most entries one batch request (an `MGET`, a many-key script) carries on Redis, for
    /// the test that checks what a big batch hands the server.
    pub const REDIS_CHUNK_KEYS: usize = crate::store::redis::CHUNK_KEYS;

    /// Every Lua script the crate sends, by name, with the SHA1 it is sent by (`EVALSHA`), once
    /// for a single server's set and once for a cluster's: for the test that checks, on the
    /// server, that each script touches only the keys it declares.
    pub fn script_names() -> Vec<(&'static str, String)> {
        crate::store::redis::script_names()
    }

    /// A value read back from stored bytes as the cache reads it with the default codec.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Stored<T> {
        /// The fencing token of the writer (0 for an explicit `set`).
        pub fence: u64,
        /// A remembered failure: `value` is then `None` and `failure` holds its message.
        pub failure: Option<String>,
        /// A fail-safe copy of a kept value (served only as a fallback).
        pub fallback: bool,
        /// When its computation started (or the `set`), by the namespace's clock; 0 if unknown.
        pub born: u64,
        /// Its tags, in the order the envelope holds them.
        pub tags: Vec<String>,
        /// The value, when the bytes hold one.
        pub value: Option<T>,
    }

    /// Reads `bytes` as the cache reads a value of type `T` written with [`Bincode`]: the
    /// envelope, then the shape of `T`, then the payload. Any mismatch is an error naming it.
    pub fn read_stored<T: DeserializeOwned + 'static>(bytes: &[u8]) -> Result<Stored<T>, String> {
        let envelope = Envelope::decode(bytes, Bincode.id()).map_err(|e| e.to_string())?;
        let tags = envelope.tags.iter().map(|tag| (*tag).to_owned()).collect();
        if envelope.negative {
            return Ok(Stored {
                fence: envelope.fence,
                failure: Some(String::from_utf8_lossy(envelope.payload).into_owned()),
                fallback: envelope.fallback,
                born: envelope.born,
                tags,
                value: None,
            });
        }
        if envelope.shape != fingerprint::<T>() {
            return Err(format!(
                "written for another shape of type (fingerprint {:#x}, not {}'s {:#x})",
                envelope.shape,
                std::any::type_name::<T>(),
                fingerprint::<T>()
            ));
        }
        let value = Bincode
            .decode::<T>(envelope.payload)
            .map_err(|e| e.to_string())?;
        Ok(Stored {
            fence: envelope.fence,
            failure: None,
            fallback: envelope.fallback,
            born: envelope.born,
            tags,
            value: Some(value),
        })
    }

    /// The bytes the cache stores for `value` written under `fence` (fresh until
    /// `fresh_until_ms`, born at `born` with `tags`), so that a test's hand-made server log
    /// holds the real format.
    pub fn stored_bytes<T: Serialize + DeserializeOwned + 'static>(
        fence: u64,
        fresh_until_ms: u64,
        (born, tags): (u64, &[&str]),
        value: &T,
    ) -> Result<Vec<u8>, String> {
        let payload = Bincode.encode(value).map_err(|e| e.to_string())?;
        Ok(Envelope {
            codec: Bincode.id(),
            negative: false,
            fallback: false,
            fresh_until_ms,
            compute_ms: 0,
            fence,
            shape: fingerprint::<T>(),
            born,
            tags: tags.to_vec(),
            payload: &payload,
        }
        .encode())
    }

    /// One of a namespace's epochs (see `cache/tags.rs`): the one `Cache::clear` raises, or a
    /// tag's.
    #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum Epoch {
        /// `ns:{%c}`: the namespace's clear key (also the key its clock is read by).
        Clear,
        /// `ns:{%t:<escaped tag>}`: the tag's epoch.
        Tag(String),
    }

    /// The epoch `redis_key` is if it is one of `namespace`'s epoch keys, read by the crate's
    /// own key layout (a tag unescaped as a user key is); `None` for any other name.
    pub fn epoch_key(namespace: &str, redis_key: &str) -> Option<Epoch> {
        if !is_epoch_key(namespace, redis_key) {
            return None;
        }
        if redis_key == clear_key(namespace) {
            return Some(Epoch::Clear);
        }
        let escaped = redis_key
            .strip_prefix(namespace)?
            .strip_prefix(":{%t:")?
            .strip_suffix('}')?;
        // A tag is escaped as a user key is: the value key of the same text names it.
        let as_value_key = format!("{namespace}:{{{escaped}}}");
        let tag = user_key_of(namespace, &as_value_key)?.into_owned();
        // Only a name the crate itself builds for that tag.
        (tag_key(namespace, &tag).ok()? == redis_key).then_some(Epoch::Tag(tag))
    }

    /// Which of an entry's Redis keys a key is.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum KeyKind {
        /// `ns:{k}`: the value envelope.
        Value,
        /// The lock key: the owner's token while someone computes.
        Lock,
        /// The fencing counter.
        Fence,
        /// A leader's last run.
        LastRun,
        /// The wake-up channel.
        Channel,
    }

    /// The user's key and the kind of `redis_key` if it is one of the keys the cache builds for
    /// an entry (or a lock) in `namespace`, `None` for any other name.
    pub fn entry_key(namespace: &str, redis_key: &str) -> Option<(String, KeyKind)> {
        // The escaped user key never holds '}', nor does a namespace or a suffix: the last one
        // closes the hash tag, and the value key ends there.
        let value_key = redis_key.get(..=redis_key.rfind('}')?)?;
        let user = user_key_of(namespace, value_key)?;
        let keys = EntryKeys::new(namespace, &user).ok()?;
        let kind = if redis_key == keys.value {
            KeyKind::Value
        } else if redis_key == keys.lock() {
            KeyKind::Lock
        } else if redis_key == keys.fence() {
            KeyKind::Fence
        } else if redis_key == keys.last_run() {
            KeyKind::LastRun
        } else if redis_key == keys.channel() {
            KeyKind::Channel
        } else {
            return None;
        };
        Some((user.into_owned(), kind))
    }
}
