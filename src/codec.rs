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
/// Decoding refuses to allocate more than the value limit, so a corrupt length prefix cannot
/// make it reserve gigabytes.
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

type BincodeConfig = bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<{ crate::MAX_VALUE_BYTES }>,
>;

const BINCODE: BincodeConfig =
    bincode::config::standard().with_limit::<{ crate::MAX_VALUE_BYTES }>();

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
