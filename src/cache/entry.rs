//! The stored entry: what a key's bytes decode to ([`StoredEntry`]). The bytes are read and
//! written by `encoding.rs`.

use crate::wire::envelope::Envelope;

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

impl<T> StoredEntry<T> {
    /// The entry `envelope` holds, with `value` decoded from its payload (or the failure's
    /// message).
    pub(crate) fn of(envelope: &Envelope<'_>, value: Result<T, String>) -> Self {
        StoredEntry {
            value,
            fresh_until_ms: envelope.fresh_until_ms,
            compute_ms: envelope.compute_ms,
            fence: envelope.fence,
            throttled: envelope.fallback,
            born: envelope.born,
            tags: envelope.tags.iter().map(|tag| (*tag).to_owned()).collect(),
        }
    }
}
