//! How values become bytes. The payload codec is a trait so that it can be swapped; the default is
//! bincode 2 through its serde support.
//!
//! Explained in the guide: `docs/guarantees.md` (Changing a cached type).

use serde::{de::DeserializeOwned, Serialize};

/// The error of a codec: any error, boxed.
pub type CodecError = Box<dyn std::error::Error + Send + Sync>;

/// Turns values into bytes and back.
///
/// The [`id`](Codec::id) is written into every stored envelope. Bytes written with another codec
/// (another id) are treated as a miss and recomputed, never decoded as garbage, so a fleet can move
/// from one codec to another by deploying the new one.
///
/// ```
/// use stampede_guard::{Cache, Codec, CodecError};
/// use serde::{de::DeserializeOwned, Serialize};
///
/// /// A codec of your own; this one wraps bincode under another id.
/// #[derive(Debug, Clone, Copy)]
/// struct MyCodec;
///
/// impl Codec for MyCodec {
///     fn id(&self) -> u8 {
///         200
///     }
///     fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, CodecError> {
///         stampede_guard::Bincode.encode(value)
///     }
///     fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, CodecError> {
///         stampede_guard::Bincode.decode(bytes)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// let cache = Cache::builder().codec(MyCodec).build().await?;
/// let _ = cache.set("k", &1u8, std::time::Duration::from_secs(1)).await?;
/// assert_eq!(cache.get::<u8>("k").await?, Some(1));
/// # Ok(())
/// # }
/// ```
///
/// # Type changes
///
/// Every stored value also records a 64-bit fingerprint of the *shape* of its type as serde
/// sees it, whatever the codec, and a reader whose type has another shape treats the value as a
/// miss: it logs a warning, recomputes, and overwrites it. So during a rolling deploy that
/// changes a cached type, old and new instances never decode each other's values as garbage (with
/// bincode, which is positional, a value written as `{ orders: 5, revenue_cents: 1000 }` would
/// otherwise read without error as `{ revenue_cents: 5, orders: 1000 }` once the fields are
/// reordered); each side recomputes what the other wrote.
///
/// The shape is traced once per type and process, from the type's `Deserialize` impl; a read
/// compares two numbers. It covers type, field and variant names, the order of fields and
/// variants, and the types of fields, recursively, as a compact format such as bincode sees them.
///
/// Detected, so a miss:
/// - a field reordered, renamed, added or removed (`#[serde(skip)]` removes one);
/// - a field's type changed (`u32` to `u64`, `Vec<T>` to `Option<T>`, a nested type changed);
/// - variants added, removed, renamed, reordered, or their fields changed;
/// - the type renamed (`#[serde(rename = "Old")]` keeps the old name, and the values).
///
/// Not detected, so read as before:
/// - a change of meaning with the same shape (cents become dollars, two fields of one type
///   swap meaning, a custom `Deserialize` that reads the same data differently);
/// - changes inside a type that decides its shape from the data (anything that asks for
///   `deserialize_any`: `serde_json::Value`, untagged and internally tagged enums): its shape is
///   recorded as "any";
/// - where a custom `Deserialize` refuses the tracer's placeholder values (zero, empty, `false`):
///   the types of the fields after it (their names and order are still covered);
/// - `String` and `Box<str>`, or a byte buffer and `&[u8]`-like bytes, which are stored alike.
///
/// Values written by a release before the shape was recorded (envelope format 1) are read as a
/// miss once after the upgrade, recomputed and overwritten.
pub trait Codec: Send + Sync + 'static {
    /// A number that identifies this codec's format; 0 to 15 are reserved for this crate.
    fn id(&self) -> u8;
    /// Encodes `value`.
    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, CodecError>;
    /// Decodes all of `bytes`; trailing bytes are an error.
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, CodecError>;
}

/// The largest encoded value accepted (64 MiB); larger ones are refused with
/// [`Error::ValueTooLarge`](crate::Error::ValueTooLarge) rather than sent to Redis. Decoding is
/// bounded by it too (see [`Bincode`]), so it lives beside the codec, as
/// [`MAX_KEY_BYTES`](crate::MAX_KEY_BYTES) lives beside the key layout.
pub const MAX_VALUE_BYTES: usize = 64 * 1024 * 1024;

/// The default codec: bincode 2 (standard configuration) through serde.
///
/// Every value within [`MAX_VALUE_BYTES`] encoded reads back; decoding
/// refuses to claim more memory than 16 times the bytes it is given (at least 1 MiB), so a corrupt
/// length prefix in a small value cannot make it reserve a large buffer.
///
/// ```
/// use stampede_guard::{Bincode, Codec};
///
/// let bytes = Bincode.encode(&("2019-05", 42u32)).unwrap();
/// let back: (String, u32) = Bincode.decode(&bytes).unwrap();
/// assert_eq!(back, ("2019-05".to_string(), 42));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Bincode;

/// How much memory decoding may claim per byte of payload. bincode counts every primitive it
/// decodes at its size in memory (8 bytes for a `u64` encoded in one, 16 for a `u128`), so a value
/// claims at most 16 times its encoded size. Limiting the claim to `MAX_VALUE_BYTES` itself made
/// values that were accepted on write unreadable (a 16 MiB `Vec<u64>`, or a string within 3 bytes
/// of the limit): every read was a miss and every caller recomputed. A limit of 16 times the
/// payload's own length reads back every value that may be written, while a corrupt length prefix
/// can make decoding reserve only that much (rounded up to the next tier below), not more.
const CLAIM_PER_BYTE: usize = 16;

/// Encoding ignores the limit: `MAX_VALUE_BYTES` is checked on the encoded bytes.
const BINCODE: bincode::config::Configuration = bincode::config::standard();

fn decode_within<const LIMIT: usize, T: DeserializeOwned>(
    bytes: &[u8],
) -> Result<(T, usize), bincode::error::DecodeError> {
    bincode::serde::decode_from_slice(bytes, BINCODE.with_limit::<LIMIT>())
}

impl Codec for Bincode {
    fn id(&self) -> u8 {
        1
    }

    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, CodecError> {
        Ok(bincode::serde::encode_to_vec(value, BINCODE)?)
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, CodecError> {
        // bincode's limit is a constant: pick the smallest tier that covers this payload.
        const MIB: usize = 1 << 20;
        let (value, read) = match bytes.len().saturating_mul(CLAIM_PER_BYTE) {
            n if n <= MIB => decode_within::<MIB, T>(bytes)?,
            n if n <= 16 * MIB => decode_within::<{ 16 * MIB }, T>(bytes)?,
            n if n <= 128 * MIB => decode_within::<{ 128 * MIB }, T>(bytes)?,
            _ => decode_within::<{ CLAIM_PER_BYTE * MAX_VALUE_BYTES }, T>(bytes)?,
        };
        if read != bytes.len() {
            return Err(format!("{} trailing bytes after the value", bytes.len() - read).into());
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: write-only values. The decoder's limit used to be the encoded-size limit, but
    /// it counts memory, not bytes, so these values were written and then never read.
    #[test]
    fn write_only_values_near_the_limit_are_readable() {
        // A string whose payload is exactly the limit (a 5-byte length prefix, then its bytes).
        let at_limit = "v".repeat(MAX_VALUE_BYTES - 5);
        let bytes = Bincode.encode(&at_limit).unwrap();
        assert_eq!(bytes.len(), MAX_VALUE_BYTES);
        let back: String = Bincode.decode(&bytes).unwrap();
        assert_eq!(back.len(), at_limit.len());
        // Wide integers encoded in one byte each: 4 MiB of payload, 64 MiB and more of memory.
        let wide = vec![1u128; MAX_VALUE_BYTES / 16 + 1];
        let bytes = Bincode.encode(&wide).unwrap();
        assert!(bytes.len() < MAX_VALUE_BYTES / 8);
        let back: Vec<u128> = Bincode.decode(&bytes).unwrap();
        assert_eq!(back.len(), wide.len());
    }

    #[test]
    fn a_corrupt_length_prefix_is_refused_not_reserved() {
        // Within the 1 MiB tier of a small payload, but far beyond its bytes: refused.
        let mut small = vec![252];
        small.extend_from_slice(&(2u32 << 20).to_le_bytes());
        small.extend_from_slice(b"abc");
        assert!(Bincode.decode::<String>(&small).is_err());
        // A string that claims 2^40 bytes (u64 varint marker 253), followed by three.
        let mut bytes = vec![253];
        bytes.extend_from_slice(&(1u64 << 40).to_le_bytes());
        bytes.extend_from_slice(b"abc");
        assert!(Bincode.decode::<String>(&bytes).is_err());
        assert!(Bincode.decode::<Vec<u8>>(&bytes).is_err());
    }
}
