//! What goes over the wire and how it is named: the Redis key layout (`key.rs`), the envelope
//! around every stored value (`envelope.rs`) and the payload codec (`codec.rs`).

pub(crate) mod codec;
pub(crate) mod envelope;
pub(crate) mod key;
