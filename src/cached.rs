//! What `#[cached]` expands to: one call of [`run`] per call of the attributed function. The
//! attribute (crate `stampede-guard-macros`, feature `macros`) only writes the call; the
//! behaviour lives here, where it is tested and read like the rest of the crate.
//!
//! The error contract (documented on `stampede_guard::cached`): the function returns
//! `Result<T, E>` with `E: From<Error>`. The caller whose body ran and failed gets the body's
//! error back by value, unchanged: it is kept in this call's own slot, never shared. The cache
//! (and so the callers that waited on that run in this process, and a remembered failure) gets
//! a copy of its message ([`BodyFailed`]), because a shared [`ComputeError`](crate::ComputeError)
//! can give its error back only by reference (`Error::compute_error`), and `E` need not be
//! `Clone`. Every other failure of the call (the backend, a wait time-out, a waiter's shared
//! failure) comes back as `E::from(error)`.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cache::Cache;
use crate::error::{BodyFailed, Error};
use crate::options::CallOptions;
use crate::sync::lock;
use crate::{CacheValue, Codec};

/// `cache.get_or_compute(&key, ttl, body)` with `options` for this call, returning the
/// function's own error type (see the module's docs for which error comes back how).
pub async fn run<C, T, E, Body>(
    cache: &Cache<C>,
    key: String,
    ttl: Duration,
    options: Option<CallOptions>,
    body: Body,
) -> Result<T, E>
where
    C: Codec,
    T: CacheValue,
    E: From<Error> + fmt::Display + fmt::Debug + Send + 'static,
    Body: Future<Output = Result<T, E>> + Send + 'static,
{
    // Filled only if this call's body runs and fails; the cache never sees the `E` itself.
    let mine: Arc<Mutex<Option<E>>> = Arc::new(Mutex::new(None));
    let slot = Arc::clone(&mine);
    let compute = move || async move {
        body.await.map_err(|error| {
            let failed = BodyFailed::of(&error);
            *lock(&slot) = Some(error);
            failed
        })
    };
    let outcome = match options {
        Some(options) => {
            let cache = cache.with_options(options);
            cache.get_or_compute(&key, ttl, compute).await
        }
        None => cache.get_or_compute(&key, ttl, compute).await,
    };
    outcome.map_err(|error| {
        let own = lock(&mine).take();
        match own {
            // `Error::Compute` after this body failed is this body's failure: give it back.
            Some(own) if error.is_compute() => own,
            _ => E::from(error),
        }
    })
}

/// The attribute's misuses are compile errors (their messages are tested in the macro crate;
/// each block here is a correct use but for the one mistake its comment names).
///
/// A placeholder that names no argument:
/// ```compile_fail
/// # use stampede_guard::{cached, Cache, Error};
/// # static C: std::sync::LazyLock<Cache> = std::sync::LazyLock::new(Cache::in_memory);
/// #[cached(cache = C, key = "report:{mnth}", ttl_secs = 60)]
/// async fn report(month: String) -> Result<u64, Error> { Ok(1) }
/// ```
/// No TTL:
/// ```compile_fail
/// # use stampede_guard::{cached, Cache, Error};
/// # static C: std::sync::LazyLock<Cache> = std::sync::LazyLock::new(Cache::in_memory);
/// #[cached(cache = C, key = "report:{month}")]
/// async fn report(month: String) -> Result<u64, Error> { Ok(1) }
/// ```
/// Not `async`:
/// ```compile_fail
/// # use stampede_guard::{cached, Cache, Error};
/// # static C: std::sync::LazyLock<Cache> = std::sync::LazyLock::new(Cache::in_memory);
/// #[cached(cache = C, key = "report:{month}", ttl_secs = 60)]
/// fn report(month: String) -> Result<u64, Error> { Ok(1) }
/// ```
/// `&mut self`:
/// ```compile_fail
/// # use stampede_guard::{cached, Cache, Error};
/// #[derive(Clone)]
/// struct Reports { cache: Cache, n: u64 }
/// impl Reports {
///     #[cached(cache = self.cache, key = "report:{month}", ttl_secs = 60)]
///     async fn report(&mut self, month: String) -> Result<u64, Error> { Ok(self.n) }
/// }
/// ```
/// An error type the cache's [`Error`](crate::Error) cannot become (`std::io::Error` has no
/// `From<stampede_guard::Error>`):
/// ```compile_fail,E0277
/// # use stampede_guard::{cached, Cache};
/// # static C: std::sync::LazyLock<Cache> = std::sync::LazyLock::new(Cache::in_memory);
/// #[cached(cache = C, key = "report:{month}", ttl_secs = 60)]
/// async fn report(month: String) -> Result<u64, std::io::Error> { Ok(1) }
/// ```
/// A body that borrows from a `&self` whose type is not `Clone`:
/// ```compile_fail,E0277
/// # use stampede_guard::{cached, Cache, Error};
/// struct Reports { cache: Cache, n: u64 }
/// impl Reports {
///     #[cached(cache = self.cache, key = "report:{month}", ttl_secs = 60)]
///     async fn report(&self, month: String) -> Result<u64, Error> { Ok(self.n) }
/// }
/// ```
#[cfg(doctest)]
pub struct CompileErrors;
