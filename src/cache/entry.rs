//! The stored entry: what a key's bytes decode to ([`StoredEntry`]). The bytes are read and
//! written by `encoding.rs`.

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
