//! Waiting for work another task or process does: the in-process single flight (`flight.rs`),
//! and waiting for a lock holder with wake-ups and backoff (`waiting.rs`). The wake-ups themselves
//! come from the store (`store/wakeup.rs`), which produces them.
//!
//! Explained in the guide: `docs/how-it-works.md` (waiting and wake-ups).

pub(crate) mod flight;
pub(crate) mod waiting;
