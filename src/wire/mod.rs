//! What goes over the wire and how it is named: the Redis key layout (`key.rs`), the envelope
//! around every stored value (`envelope.rs`), the payload codec (`codec.rs`), the codec that
//! compresses another's payloads (`compressed.rs`, feature `compression`) and the fingerprint
//! of the stored type's shape (`shape.rs`).
//!
//! Explained in the guide: `docs/how-it-works.md` (The keys) and `docs/guarantees.md` (Changing a cached type).

pub(crate) mod codec;
#[cfg(feature = "compression")]
pub(crate) mod compressed;
pub(crate) mod envelope;
pub(crate) mod key;
pub(crate) mod shape;
