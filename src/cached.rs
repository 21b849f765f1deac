//! What `#[cached]` expands to: one call of [`run`] per call of the attributed function. The
//! attribute (crate `stampede-guard-macros`, feature `macros`) only writes the call; the
//! behaviour lives here, where it is tested and read like the rest of the crate.
//!
//! The error contract (documented on `stampede_guard::cached`): the function returns
//! `Result<T, E>` with `E: From<Error>` ([`CachedError`]), nothing more. The caller whose body
//! ran and failed gets the body's error back by value, unchanged: it is kept in this call's own
//! slot, never shared. The cache (and so the callers that waited on that run in this process,
//! and a remembered failure) gets a copy of its text ([`BodyFailed`]), because a shared
//! [`ComputeError`](crate::ComputeError) can give its error back only by reference
//! (`Error::compute_error`), and `E` need not be `Clone`. That text is `E`'s `Display` and
//! `Debug` where it has them (see [`text`]), so an error type without them (an axum error
//! enum) is taken as it is. Every other failure of the call (the backend, a wait time-out, a
//! waiter's shared failure) comes back as `E::from(error)`.

use std::any::type_name;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cache::Cache;
use crate::error::{BodyFailed, Error};
use crate::options::CallOptions;
use crate::sync::lock;
use crate::{CacheValue, Codec};

/// The bound on a `#[cached]` function's error type: the cache's own failures (Redis down, a
/// wait time-out, an invalid key) come back through `E::from`. Its compile error says so, on
/// the function's return type.
#[diagnostic::on_unimplemented(
    message = "the error type of a `#[cached]` function needs `From<stampede_guard::Error>`: `{Self}` has none (or is not `Send + 'static`)",
    label = "`{Self}` cannot carry the cache's own failures",
    note = "the cache's own failures (Redis down, a wait time-out, an invalid key) come back as `{Self}::from(error)`",
    note = "add `impl From<stampede_guard::Error> for {Self}` (a variant that wraps it), or return `Result<T, stampede_guard::Error>`"
)]
pub trait CachedError: From<Error> + Send + 'static {}

impl<E: From<Error> + Send + 'static> CachedError for E {}

/// The function's return type, `Result<T, E>`: the expansion names `E` through it.
#[diagnostic::on_unimplemented(
    message = "a `#[cached]` function returns `Result<T, E>`, not `{Self}`",
    note = "T is the cached value; E is the function's error, with `From<stampede_guard::Error>`"
)]
pub trait Returns {
    /// `E`.
    type Error;
}

impl<T, E> Returns for Result<T, E> {
    type Error = E;
}

/// How the cache's copy of a failed body's error is written: its `Display` and its `Debug`,
/// each falling back on the other, then on the type's name, for a type that lacks them. The
/// expansion picks the first that applies by auto-ref (`(&&&Text(error)).display_text()`): a
/// trait implemented on `&&Text` is found before one on `&Text`, which is found before one on
/// `Text`, and each applies only where its bound holds. Only the expansion calls them, where
/// `E` is a concrete type (in generic code the last would always win).
pub mod text {
    use super::{fmt, type_name};

    /// An error to be written, by reference.
    #[derive(Debug)]
    pub struct Text<'a, E>(pub &'a E);

    fn unnamed<E>() -> String {
        format!("the #[cached] body failed with a {}", type_name::<E>())
    }

    /// `Display`, first choice for the text.
    pub trait DisplayByDisplay {
        /// The text.
        fn display_text(&self) -> String;
    }
    impl<E: fmt::Display> DisplayByDisplay for &&Text<'_, E> {
        fn display_text(&self) -> String {
            self.0.to_string()
        }
    }

    /// `Debug`, second choice for the text.
    pub trait DisplayByDebug {
        /// The text.
        fn display_text(&self) -> String;
    }
    impl<E: fmt::Debug> DisplayByDebug for &Text<'_, E> {
        fn display_text(&self) -> String {
            format!("{:?}", self.0)
        }
    }

    /// The type's name, last choice for the text.
    pub trait DisplayByName {
        /// The text.
        fn display_text(&self) -> String;
    }
    impl<E> DisplayByName for Text<'_, E> {
        fn display_text(&self) -> String {
            unnamed::<E>()
        }
    }

    /// `Debug`, first choice for the debug text.
    pub trait DebugByDebug {
        /// The debug text.
        fn debug_text(&self) -> String;
    }
    impl<E: fmt::Debug> DebugByDebug for &&Text<'_, E> {
        fn debug_text(&self) -> String {
            format!("{:?}", self.0)
        }
    }

    /// `Display`, second choice for the debug text.
    pub trait DebugByDisplay {
        /// The debug text.
        fn debug_text(&self) -> String;
    }
    impl<E: fmt::Display> DebugByDisplay for &Text<'_, E> {
        fn debug_text(&self) -> String {
            self.0.to_string()
        }
    }

    /// The type's name, last choice for the debug text.
    pub trait DebugByName {
        /// The debug text.
        fn debug_text(&self) -> String;
    }
    impl<E> DebugByName for Text<'_, E> {
        fn debug_text(&self) -> String {
            unnamed::<E>()
        }
    }
}

/// A failed body's error written as text (`Display`, `Debug`): made by the expansion, where
/// `E` is known, with the [`text`] traits.
pub type Describe<E> = fn(&E) -> (String, String);

/// `E::from`, named by the expansion on the function's return type: the one place that asks
/// for [`CachedError`], so its compile error points there, once.
pub fn from_error<E: CachedError>(error: Error) -> E {
    E::from(error)
}

/// `cache.get_or_compute(&key, ttl, body)` with `options` for this call, returning the
/// function's own error type (see the module's docs for which error comes back how).
pub async fn run<C, T, E, Body>(
    cache: &Cache<C>,
    key: String,
    ttl: Duration,
    options: Option<CallOptions>,
    body: Body,
    (describe, from): (Describe<E>, fn(Error) -> E),
) -> Result<T, E>
where
    C: Codec,
    T: CacheValue,
    E: Send + 'static,
    Body: Future<Output = Result<T, E>> + Send + 'static,
{
    // Filled only if this call's body runs and fails; the cache never sees the `E` itself.
    let mine: Arc<Mutex<Option<E>>> = Arc::new(Mutex::new(None));
    let slot = Arc::clone(&mine);
    let compute = move || async move {
        body.await.map_err(|error| {
            let (display, debug) = describe(&error);
            let failed = BodyFailed::of(&error, display, debug);
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
            _ => from(error),
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
/// `From<stampede_guard::Error>`; the message says so, on the return type: see
/// [`CachedError`]):
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
