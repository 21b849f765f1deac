//! Waiting for work another task or process does: the in-process single flight (`flight.rs`),
//! waiting for a lock holder with wake-ups and backoff (`waiting.rs`), and the fan-out of
//! wake-up notifications inside a process (`wakeup.rs`).
//!
//! Explained in the guide: `docs/how-it-works.md` (waiting and wake-ups).

pub(crate) mod flight;
mod join;
pub(crate) mod waiting;
pub(crate) mod wakeup;

pub(crate) use join::join_all;
