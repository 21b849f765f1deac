//! Stops cache stampedes: when many tasks, processes or machines miss the same key at once,
//! exactly one computes it and the others wait for its value.
//!
//! ```
//! use stampede_guard::Cache;
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), stampede_guard::Error<std::io::Error>> {
//! let cache = Cache::in_memory(); // or Cache::builder().redis_url("redis://...").build().await?
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
//!
//! # Backends
//! - The embedded in-memory store ([`Cache::in_memory`]): one process, no server; the default.
//! - Redis ([`CacheBuilder::redis_url`]), for many processes and machines.
//!
//! # Feature flags
//! No feature is on by default; each one adds an integration and nothing else (they are additive).
//! (The items of a feature are not linked below, so that these docs build with or without it.)
//!
//! | feature | what it adds | extra dependencies |
//! |---|---|---|
//! | `axum` | [`Error`] implements axum's `IntoResponse` (503 for backend errors and wait timeouts, 500 for failed computations, 400 for invalid keys), and `web::status` gives the mapping to handlers with their own error type; see the module `stampede_guard::web` | `axum` (no default features) |
//!
//! # Examples
//! In `examples/`, each runnable with `cargo run --example NAME`:
//! - `monthly_report`: 10 concurrent dashboard requests × 12 months on a cold cache.
//! - `sqlx_query`: a slow aggregate query on a real database (SQLite in memory, or PostgreSQL
//!   with `DATABASE_URL`), naive cache-aside against `get_or_compute`.
//! - `axum_report` (`--features axum`): an HTTP service, `GET /report/{month}`, computed from the
//!   database through the cache.
//! - `leader_sync`: leader election with hand-over.
#![deny(missing_docs, missing_debug_implementations)]
#![warn(rust_2018_idioms, unreachable_pub)]

mod builder;
mod cache;
mod codec;
mod compute;
mod connect;
mod envelope;
mod error;
mod flight;
mod freshness;
mod key;
pub mod leader;
mod lease;
mod lock;
mod options;
mod redlock;
mod refresh;
mod store;
mod waiting;
mod wakeup;
#[cfg(feature = "axum")]
pub mod web;

pub use builder::CacheBuilder;
pub use cache::Cache;
pub use codec::{Bincode, Codec, CodecError};
pub use error::Error;
pub use freshness::{Computed, Fetched, Source};
pub use key::MAX_KEY_BYTES;
pub use lease::Lease;
pub use lock::{Lock, LockBuilder, LockGuard};
pub use options::{Backoff, CallOptions, Fallback};
pub use redlock::{Redlock, RedlockBuilder};

/// The largest encoded value accepted (64 MiB); larger ones are refused with
/// [`Error::ValueTooLarge`] rather than sent to Redis.
pub const MAX_VALUE_BYTES: usize = 64 * 1024 * 1024;
