//! One log policy for the whole crate. Every WARN and ERROR line says its cause once, names the
//! fix where there is one, and says what the crate does about it; and every one that can repeat
//! (an outage makes every call fail alike) is written at most once a minute per kind, the kind
//! being the place in the code that writes it, with `count`: how many times it happened since
//! the line before (the first time included). An outage of any length writes a handful of
//! lines per process, not one per call or per retry.
//!
//! Explained in the guide: `docs/observability.md` (Logs).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often one kind of line may be written.
pub(crate) const EVERY: Duration = Duration::from_secs(60);

/// Writes a `tracing` event at `level` (`warn` or `error`) with the fields and message given,
/// at most once per [`EVERY`] from this place in the code, with the field `count` added.
macro_rules! throttled {
    ($level:ident, $($event:tt)+) => {{
        static THROTTLE: $crate::log::LogThrottle = $crate::log::LogThrottle::new();
        if let Some(count) = THROTTLE.due($crate::log::EVERY) {
            tracing::$level!(count, $($event)+);
        }
    }};
}
pub(crate) use throttled;

/// A log line written at most once per period, with the count of the events since the last
/// one: an outage must not write a line per call.
#[derive(Debug)]
pub(crate) struct LogThrottle {
    /// Events since the last line.
    pending: AtomicU64,
    /// When the last line was written; `None` before the first.
    last: Mutex<Option<Instant>>,
}

impl Default for LogThrottle {
    fn default() -> Self {
        Self::new()
    }
}

impl LogThrottle {
    /// A throttle whose first event is logged at once (`const`, for a `static`).
    pub(crate) const fn new() -> Self {
        LogThrottle {
            pending: AtomicU64::new(0),
            last: Mutex::new(None),
        }
    }

    /// Counts one event; `Some(events since the last line, this one included)` when a line is
    /// due (the first event, then at most once per `every`), `None` otherwise.
    pub(crate) fn due(&self, every: Duration) -> Option<u64> {
        self.pending.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut last = crate::sync::lock(&self.last);
        if last.is_some_and(|at| now.duration_since(at) < every) {
            return None;
        }
        *last = Some(now);
        drop(last);
        Some(self.pending.swap(0, Ordering::Relaxed))
    }

    /// Events counted since the last line.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> u64 {
        self.pending.load(Ordering::Relaxed)
    }
}
