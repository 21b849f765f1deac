//! The bytes written for a key (a value, a remembered failure, a fail-safe's throttled copy),
//! each in its envelope and stamped with its fresh-until by the store's clock. Every path that
//! writes a key goes through these few functions; the read side (`Engine::read_stored`, where
//! bytes that are not ours, or were written for another shape of `T`, are a miss) is a step of
//! the hit, in `fetch.rs`.

use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use serde::{de::DeserializeOwned, Serialize};

use crate::cache::engine::Engine;
use crate::store::StoreExt;
use crate::store::Write;
use crate::wire::codec::Codec;
use crate::wire::envelope::Envelope;
use crate::wire::shape;
use crate::{Error, MAX_VALUE_BYTES};

impl<C: Codec> Engine<C> {
    /// The stored bytes of a value fresh for `ttl` from now, marked with the shape of `T`, born
    /// at `born` with `tags` (checked by [`value_tags`](Self::value_tags)).
    pub(crate) fn encode_value<T: Serialize + DeserializeOwned + 'static>(
        &self,
        value: &T,
        ttl: Duration,
        compute: Duration,
        fence: u64,
        (born, tags): (u64, &[String]),
    ) -> Result<Vec<u8>, Error> {
        let codec = &self.core.codec;
        let payload = codec
            .encode(value)
            .map_err(|e| Error::Encode(Arc::from(e)))?;
        if payload.len() > MAX_VALUE_BYTES {
            return Err(Error::ValueTooLarge {
                size: payload.len(),
                limit: MAX_VALUE_BYTES,
            });
        }
        Ok(Envelope {
            codec: codec.id(),
            negative: false,
            fallback: false,
            fresh_until_ms: self.fresh_until(ttl),
            compute_ms: u32::try_from(compute.as_millis()).unwrap_or(u32::MAX),
            fence,
            shape: shape::fingerprint::<T>(),
            born,
            tags: tags.iter().map(String::as_str).collect(),
            payload: &payload,
        }
        .encode())
    }

    /// The stored bytes of a remembered failure: its message, for `ttl`. It is marked with the
    /// shape of `T` like a value, so that a caller of another type recomputes rather than
    /// take another type's failure for its own.
    pub(crate) fn encode_failure<T: DeserializeOwned + 'static, E: Display>(
        &self,
        error: &E,
        ttl: Duration,
        fence: u64,
        (born, tags): (u64, &[String]),
    ) -> Vec<u8> {
        let message = bounded(error.to_string());
        Envelope {
            codec: self.core.codec.id(),
            negative: true,
            fallback: false,
            fresh_until_ms: self.fresh_until(ttl),
            compute_ms: 0,
            fence,
            shape: shape::fingerprint::<T>(),
            born,
            tags: tags.iter().map(String::as_str).collect(),
            payload: message.as_bytes(),
        }
        .encode()
    }

    /// What a computation under `fence` that failed or timed out writes in place of the value
    /// it was to replace (`kept`, its stored bytes): the same payload marked as a fail-safe copy,
    /// served as the fallback until the throttle ends and kept at least that long. `None` if the
    /// bytes are no longer ours to read (they were, when kept).
    pub(crate) fn throttled_copy(&self, kept: &[u8], fence: u64) -> Option<Write> {
        let envelope = Envelope::decode(kept, self.core.codec.id()).ok()?;
        let throttle = self.options.fail_safe_throttle;
        let bytes = Envelope {
            fallback: true,
            fresh_until_ms: self.fresh_until(throttle),
            fence,
            ..envelope
        }
        .encode();
        Some(Write::Keep {
            bytes,
            at_least: throttle,
        })
    }

    /// The fresh-until stamp of an entry fresh for `ttl` from now, by the store's clock (which
    /// every process shares, so all judge freshness alike); saturated, as `ttl` may be huge.
    fn fresh_until(&self, ttl: Duration) -> u64 {
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        self.core.store.now_ms().saturating_add(ttl_ms)
    }
}

/// The most bytes of a failure's message that are remembered (negative caching): every reader
/// of the key, in every instance, gets it; an error that prints a whole response body or query
/// must not make each of them read that much.
pub(crate) const MAX_FAILURE_BYTES: usize = 1024;

/// `message`, cut to at most [`MAX_FAILURE_BYTES`] at a character boundary (marked with `…`).
fn bounded(mut message: String) -> String {
    const MARK: &str = "…";
    if message.len() <= MAX_FAILURE_BYTES {
        return message;
    }
    let mut end = MAX_FAILURE_BYTES - MARK.len();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message.truncate(end);
    message.push_str(MARK);
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_message_is_cut_at_a_character_boundary() {
        let short = "no such table: sales".to_string();
        assert_eq!(bounded(short.clone()), short);
        // Two-byte characters across the cut: never half of one.
        let long = "é".repeat(MAX_FAILURE_BYTES);
        let cut = bounded(long);
        assert!(cut.len() <= MAX_FAILURE_BYTES);
        assert!(cut.ends_with('…'));
        assert!(cut.trim_end_matches('…').chars().all(|c| c == 'é'));
    }
}
