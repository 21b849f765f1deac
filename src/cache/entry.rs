//! The stored entry: what a key's bytes decode to ([`StoredEntry`]), and the bytes the cache
//! writes (a value, a remembered failure, a fail-safe's throttled copy), each stamped with its
//! fresh-until by the store's clock.
//!
//! Every path that reads or writes a key (the single-key path, the batch, the plain `get` and
//! `set`, the fail-safe) goes through these few functions, so the envelope's rules are applied
//! in one place: bytes that are not ours, or that were written for another shape of `T`, are a
//! miss, never a value.

/// A stored entry, decoded: a value, or a remembered failure's message.
pub(crate) struct StoredEntry<T> {
    /// The value, or the message of a remembered failure (negative caching).
    pub value: Result<T, String>,
    /// Until when (store clock, ms) the entry is fresh; stale, then expired, after.
    pub fresh_until_ms: u64,
    /// How long the computation took, for XFetch's early-refresh draw.
    pub compute_ms: u32,
    /// The fencing token of the write, to tell whether it was replaced since it was read.
    pub fence: u64,
    /// A fail-safe copy, throttled until `fresh_until_ms`: a fallback only.
    pub throttled: bool,
    /// When its computation started, by the namespace's clock (see `cache/tags.rs`).
    pub born: u64,
    /// Its tags.
    pub tags: Vec<String>,
}
