//! The bounds of the `get_or_compute` family, named once: what a cached value must be
//! ([`CacheValue`]), what a computation's error must be ([`ComputeFailure`]) and, inside the
//! crate, what a computation's future is ([`ComputedFuture`]). Each has a blanket impl, so every
//! type that meets the bounds is one: nobody implements them by hand.

use std::fmt::{Debug, Display};
use std::future::Future;

use serde::{de::DeserializeOwned, Serialize};

use crate::Computed;

/// A value the cache can store, share and hand out: encoded by the codec (`Serialize +
/// DeserializeOwned`), cloned to every caller that shares one computation (`Clone`), and moved
/// between tasks (`Send + Sync + 'static`). Implemented for every such type.
///
/// ```
/// fn cacheable<T: stampede_guard::CacheValue>() {}
/// cacheable::<Vec<String>>();
/// cacheable::<(u64, Option<String>)>();
/// ```
pub trait CacheValue: Serialize + DeserializeOwned + Clone + Send + Sync + 'static {}

impl<T> CacheValue for T where T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static {}

/// An error a computation may fail with: shown in logs and remembered failures (`Display`),
/// kept whole inside [`Error::Compute`](crate::Error::Compute) for the caller (`Debug`), and
/// shared with every caller waiting on that computation (`Send + Sync + 'static`). Implemented
/// for every such type.
///
/// ```
/// fn failure<E: stampede_guard::ComputeFailure>() {}
/// failure::<std::io::Error>();
/// failure::<&'static str>();
/// ```
pub trait ComputeFailure: Display + Debug + Send + Sync + 'static {}

impl<E> ComputeFailure for E where E: Display + Debug + Send + Sync + 'static {}

/// The future a key's computation returns, as `Cache::fetch` bounds it (`Fut: Future<Output =
/// Result<Computed<T>, E>> + Send + 'static`), named once for the engine's steps (the single-key
/// path and the background refresh). Bounded beside `F: FnOnce(Lease) -> Fut + Send + 'static`,
/// never reached through a projection of `F` (an associated type of a trait on `F`): a future
/// that held such a projection across an `.await` would not be `Send` for an error type with a
/// lifetime (`&'static str`), a limit of rustc (rust-lang/rust#102211).
pub(crate) trait ComputedFuture<T, E>:
    Future<Output = Result<Computed<T>, E>> + Send + 'static
{
}

impl<T, E, Fut> ComputedFuture<T, E> for Fut where
    Fut: Future<Output = Result<Computed<T>, E>> + Send + 'static
{
}
