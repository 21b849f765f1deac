//! How values become bytes. The payload codec is a trait so that it can be swapped; the default is
//! bincode 2 through its serde support.

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
/// cache.set("k", &1u8, std::time::Duration::from_secs(1)).await?;
/// assert_eq!(cache.get::<u8>("k").await?, Some(1));
/// # Ok(())
/// # }
/// ```
pub trait Codec: Send + Sync + 'static {
    /// A number that identifies this codec's format; 0 to 15 are reserved for this crate.
    fn id(&self) -> u8;
    /// Encodes `value`.
    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, CodecError>;
    /// Decodes all of `bytes`; trailing bytes are an error.
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, CodecError>;
}

/// The default codec: bincode 2 (standard configuration) through serde.
///
/// Every value within [`MAX_VALUE_BYTES`](crate::MAX_VALUE_BYTES) encoded reads back; decoding
/// refuses to claim more than 16 times that in memory, so a corrupt length prefix cannot make it
/// reserve more than 1 GiB.
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

/// The most memory decoding may claim. bincode counts every primitive it decodes at its size in
/// memory (8 bytes for a `u64` that was encoded in one, 16 for a `u128`), so a value claims at
/// most 16 times its encoded size. Limiting the claim to `MAX_VALUE_BYTES` itself made values
/// that were accepted on write unreadable (a 16 MiB `Vec<u64>`, or a string within 3 bytes of the
/// limit): every read was a miss and every caller recomputed. 16 times the write limit lets every
/// value that may be written be read back, while a corrupt length prefix still cannot make
/// decoding reserve more than 1 GiB. (Encoding ignores the limit; `MAX_VALUE_BYTES` is checked
/// on the encoded bytes.)
const DECODE_LIMIT: usize = 16 * crate::MAX_VALUE_BYTES;

type BincodeConfig = bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<DECODE_LIMIT>,
>;

const BINCODE: BincodeConfig = bincode::config::standard().with_limit::<DECODE_LIMIT>();

impl Codec for Bincode {
    fn id(&self) -> u8 {
        1
    }

    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, CodecError> {
        Ok(bincode::serde::encode_to_vec(value, BINCODE)?)
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, CodecError> {
        let (value, read) = bincode::serde::decode_from_slice(bytes, BINCODE)?;
        if read != bytes.len() {
            return Err(format!("{} trailing bytes after the value", bytes.len() - read).into());
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_VALUE_BYTES;

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
        // A string that claims 2^40 bytes (u64 varint marker 253), followed by three.
        let mut bytes = vec![253];
        bytes.extend_from_slice(&(1u64 << 40).to_le_bytes());
        bytes.extend_from_slice(b"abc");
        assert!(Bincode.decode::<String>(&bytes).is_err());
        assert!(Bincode.decode::<Vec<u8>>(&bytes).is_err());
    }
}
