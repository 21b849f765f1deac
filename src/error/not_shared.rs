//! [`NotShared`]: a computation's error that belongs to its own caller, so it is never handed to
//! another one (a follower of this process's flight, or another instance through the failure
//! remembered by [`negative_ttl`](crate::CallOptions::negative_ttl)).

use std::any::Any;
use std::fmt;

use super::{std_error_of, ComputeError, MAX_CHAIN};

/// Marks a computation's error as its caller's alone: not shared with the callers that waited
/// on the same computation in this process (each of them computes for itself instead), and
/// never remembered for other instances by negative caching
/// ([`CallOptions::negative_ttl`](crate::CallOptions::negative_ttl)).
///
/// For an error that says something about the caller rather than the data: a permission
/// refused to this user, a request that failed validation, a quota of this tenant. An error
/// of the source itself (a timeout, a missing table) is best shared: that is what keeps a
/// failing query from running once per caller.
///
/// Found as [`SourceUnavailable`](crate::SourceUnavailable) is: return it as the computation's
/// error, or a `Box<dyn Error + Send + Sync>` (or the crate's own [`Error`](crate::Error))
/// whose chain of `source()`s reaches it. An error type of your own is not looked into (the
/// computation's error is only `Display + Debug`): box it.
///
/// ```
/// use stampede_guard::{Cache, CallOptions, Error, NotShared};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let cache = Cache::in_memory()
///     .with_options(CallOptions::default().negative_ttl(Some(Duration::from_secs(5))));
/// let denied: Result<u32, Error> = cache
///     .get_or_compute("report:42", Duration::from_secs(60), || async {
///         Err(NotShared::new("user 7 may not see report 42"))
///     })
///     .await;
/// assert!(matches!(denied, Err(Error::Compute(_))));
///
/// // Not remembered: the next caller computes for itself.
/// let allowed: Result<u32, Error> = cache
///     .get_or_compute("report:42", Duration::from_secs(60), || async {
///         Ok::<_, NotShared>(42)
///     })
///     .await;
/// assert_eq!(allowed.unwrap(), 42);
/// # }
/// ```
#[derive(Debug)]
pub struct NotShared {
    /// The caller's error, kept whole for logs and downcasts.
    error: Box<dyn std::error::Error + Send + Sync>,
}

impl NotShared {
    /// Marks `error` as its caller's alone. Anything that converts into a boxed error works: an
    /// error type, a `String`, a `&str`.
    ///
    /// ```
    /// let mine = stampede_guard::NotShared::new("quota of tenant 3 exceeded");
    /// assert_eq!(mine.to_string(), "quota of tenant 3 exceeded");
    /// ```
    pub fn new(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        NotShared {
            error: error.into(),
        }
    }

    /// The error it wraps.
    ///
    /// ```
    /// use std::io;
    /// let mine = stampede_guard::NotShared::new(io::Error::from(io::ErrorKind::PermissionDenied));
    /// let io = mine.get_ref().downcast_ref::<io::Error>().unwrap();
    /// assert_eq!(io.kind(), io::ErrorKind::PermissionDenied);
    /// ```
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.error
    }
}

/// The wrapped error's text: the mark does not change what it says.
impl fmt::Display for NotShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

/// The next link is the wrapped error itself, so what it says (an unavailable source) is
/// still found behind the mark.
impl std::error::Error for NotShared {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.error)
    }
}

/// Whether a computation's error (of any type the crate can see into) is marked
/// [`NotShared`] anywhere in its chain.
pub(crate) fn marked_not_shared(error: &dyn Any) -> bool {
    // A `#[cached]` body's error, copied when it failed, says so itself.
    #[cfg(feature = "macros")]
    if let Some(copy) = error.downcast_ref::<super::BodyFailed>() {
        return copy.not_shared();
    }
    let mut link = std_error_of(error);
    for _ in 0..MAX_CHAIN {
        let Some(current) = link else {
            return false;
        };
        if current.is::<NotShared>() {
            return true;
        }
        // The crate's own error (a nested cache call's) passes its `source()` on from the error
        // it wraps, skipping that error itself: look at the wrapped one.
        link = match current.downcast_ref::<ComputeError>() {
            Some(wrapped) => wrapped.as_std_error(),
            None => current.source(),
        };
    }
    false
}
