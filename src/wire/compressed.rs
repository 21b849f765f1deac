//! A codec that compresses another codec's large payloads with LZ4 (feature `compression`).
//!
//! The payload it hands the envelope, whose codec id is this codec's own (so a cache with the
//! plain codec refuses it as another codec's bytes and reads a miss, and the other way round):
//!
//! ```text
//! 0x00 | the inner codec's payload                          stored as it is
//! 0x01 | its length, u32 big-endian | one LZ4 block          compressed
//! ```
//!
//! Invariants:
//! - a payload is compressed only when the inner codec's payload is at least the threshold long,
//!   at most [`MAX_VALUE_BYTES`], and the compressed form is smaller; otherwise it is stored as
//!   it is, one byte longer. So a value larger than the limit is refused by the cache as it
//!   would be without compression (the limit is on values, not on their compressed form), and
//!   every value written is read back: decompression never needs more than the limit.
//! - Decompression claims memory only after checking the declared length against the limit and
//!   against what the block can hold (an LZ4 block expands at most 255 times), so a corrupt or
//!   hostile length in a small payload claims little; the result must be exactly that length.
//! - Any bytes decode to a value or an error (which the cache reads as a miss), never a panic:
//!   the decoder is lz4_flex's safe one.
//!
//! Measured against zstd and against plain `Bincode`: `docs/performance.md` (Compressing large
//! values).

use serde::{de::DeserializeOwned, Serialize};

use super::codec::{Bincode, Codec, CodecError, MAX_VALUE_BYTES};

/// The marker of a payload stored as the inner codec wrote it.
const STORED: u8 = 0;
/// The marker of an LZ4 block, preceded by its decompressed length.
const LZ4: u8 = 1;
/// The bytes before an LZ4 block: the marker and the length.
const LZ4_HEADER: usize = 1 + 4;
/// An LZ4 block's largest expansion: a match's length grows by at most 255 per byte that
/// encodes it, and a literal not at all. A declared length beyond this is corrupt.
const LZ4_MAX_EXPANSION: usize = 255;
/// The id of [`Compressed`] over [`Bincode`]: one of the crate's reserved ids.
const COMPRESSED_BINCODE_ID: u8 = 2;
/// The first id that is not reserved for this crate (see [`Codec::id`]).
const FIRST_FREE_ID: u8 = 16;

/// A codec that compresses another codec's payloads with LZ4 when they are at least
/// [`threshold`](Compressed::threshold) bytes long (1 KiB by default); smaller ones, and those
/// that compression would not shrink, are stored as they are (one byte longer).
///
/// Turn it on with [`CacheBuilder::codec`](crate::CacheBuilder::codec) on every instance that
/// shares the namespace. It has a codec id of its own, which every stored value records, so
/// values written by the plain codec read as a miss once after the change (recomputed and
/// overwritten), and during a rolling deploy each side recomputes what the other wrote rather
/// than misread it. Whether it pays, with figures for 1 KiB and 100 KiB values:
/// [Compressing large values](https://github.com/stampede-guard/stampede-guard/blob/main/docs/performance.md#compressing-large-values).
///
/// Decompression is bounded: it never claims more than [`MAX_VALUE_BYTES`], nor more than the
/// stored bytes can expand to, and corrupt bytes are a decode error (a miss), never a panic.
///
/// ```
/// use stampede_guard::{Cache, Compressed};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), stampede_guard::Error> {
/// // Bincode underneath; payloads from 4 KiB on are compressed.
/// let cache = Cache::builder()
///     .codec(Compressed::new().threshold(4 * 1024))
///     .build()
///     .await?;
/// let rows: Vec<(String, u64)> = (0..1_000).map(|i| ("north-east".to_owned(), i)).collect();
/// let _ = cache.set("report:2019-05", &rows, Duration::from_secs(300)).await?;
/// assert_eq!(cache.get("report:2019-05").await?, Some(rows));
/// # Ok(())
/// # }
/// ```
///
/// Over another codec (a [`Codec`] of your own), under an id of your own (see
/// [`Compressed::wrap`]):
///
/// ```
/// use stampede_guard::{Bincode, Codec, Compressed};
///
/// let codec = Compressed::wrap(Bincode, 201); // your codec in place of Bincode
/// assert_eq!(codec.id(), 201);
/// let bytes = codec.encode(&vec![7u64; 10_000]).unwrap();
/// assert!(bytes.len() < 1_000); // 10,001 bytes before compression
/// assert_eq!(codec.decode::<Vec<u64>>(&bytes).unwrap(), vec![7u64; 10_000]);
/// ```
#[derive(Debug, Clone, Copy)]
#[must_use]
pub struct Compressed<C = Bincode> {
    /// The codec whose payloads are compressed.
    inner: C,
    /// Recorded in every envelope: never the inner codec's, so neither reads the other's bytes.
    id: u8,
    /// Payloads shorter than this are stored as they are: below about 1 KiB the bytes saved
    /// are few and a hit pays the decompression all the same.
    threshold: usize,
}

impl Compressed<Bincode> {
    /// The default threshold: payloads from 1 KiB on are compressed.
    pub const DEFAULT_THRESHOLD: usize = 1024;

    /// LZ4 over [`Bincode`], from [`DEFAULT_THRESHOLD`](Self::DEFAULT_THRESHOLD) bytes on.
    /// Its codec id is 2.
    pub const fn new() -> Self {
        Compressed {
            inner: Bincode,
            id: COMPRESSED_BINCODE_ID,
            threshold: Self::DEFAULT_THRESHOLD,
        }
    }
}

impl Default for Compressed<Bincode> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Codec> Compressed<C> {
    /// LZ4 over `inner`, under the codec id `id`, from
    /// [`DEFAULT_THRESHOLD`](Compressed::DEFAULT_THRESHOLD) bytes on.
    ///
    /// The id is recorded in every value written, and a reader with another id treats the value
    /// as a miss. So it must be yours alone: not `inner`'s (whose readers would otherwise take
    /// a compressed payload for their own), and not one of the ids 0 to 15, which this crate
    /// reserves (`Compressed::new()` is 2).
    ///
    /// # Panics
    /// If `id` is `inner`'s own id or below 16: both would let one codec decode another's bytes.
    pub fn wrap(inner: C, id: u8) -> Self {
        assert!(
            id >= FIRST_FREE_ID,
            "Compressed::wrap: codec id {id} is reserved for stampede-guard (0 to 15); choose one from 16 to 255"
        );
        assert!(
            id != inner.id(),
            "Compressed::wrap: codec id {id} is the inner codec's own; choose another, or its readers would take compressed bytes for plain ones"
        );
        Compressed {
            inner,
            id,
            threshold: Compressed::DEFAULT_THRESHOLD,
        }
    }

    /// Compress payloads from `bytes` bytes on (the inner codec's payload, before compression);
    /// 0 tries every payload. Changing it needs no migration: a reader decodes both forms,
    /// whatever its own threshold.
    pub const fn threshold(mut self, bytes: usize) -> Self {
        self.threshold = bytes;
        self
    }
}

impl<C: Codec> Codec for Compressed<C> {
    fn id(&self) -> u8 {
        self.id
    }

    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, CodecError> {
        let plain = self.inner.encode(value)?;
        if (self.threshold..=MAX_VALUE_BYTES).contains(&plain.len()) {
            if let Some(compressed) = compress(&plain) {
                return Ok(compressed);
            }
        }
        let mut stored = Vec::with_capacity(1 + plain.len());
        stored.push(STORED);
        stored.extend_from_slice(&plain);
        Ok(stored)
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, CodecError> {
        match bytes.split_first() {
            Some((&STORED, plain)) => self.inner.decode(plain),
            Some((&LZ4, rest)) => self.inner.decode(&decompress(rest)?),
            Some((marker, _)) => Err(format!(
                "unknown compression marker {marker} (0 stored, 1 LZ4): corrupt, or written by a newer release"
            )
            .into()),
            None => Err("an empty payload: a compressed codec's payload starts with a marker byte".into()),
        }
    }
}

/// `plain` as a marked LZ4 block, if that is smaller than storing it as it is.
fn compress(plain: &[u8]) -> Option<Vec<u8>> {
    // The caller keeps `plain` within MAX_VALUE_BYTES, which fits a u32.
    let length = u32::try_from(plain.len()).ok()?;
    let block = lz4_flex::block::compress(plain);
    // Stored as it is, the payload would take one byte more than `plain`.
    if LZ4_HEADER + block.len() > plain.len() {
        return None;
    }
    let mut out = Vec::with_capacity(LZ4_HEADER + block.len());
    out.push(LZ4);
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(&block);
    Some(out)
}

/// The inner payload of a marked LZ4 block (`rest` is what follows the marker).
fn decompress(rest: &[u8]) -> Result<Vec<u8>, CodecError> {
    let (length, block) = rest
        .split_first_chunk::<4>()
        .ok_or("a compressed payload cut short before its length")?;
    let length = usize::try_from(u32::from_be_bytes(*length)).unwrap_or(usize::MAX);
    // Checked before anything is allocated: a corrupt length must not claim memory.
    let bound = MAX_VALUE_BYTES.min(block.len().saturating_mul(LZ4_MAX_EXPANSION));
    if length > bound {
        return Err(format!(
            "a compressed payload claims {length} bytes from a {}-byte block (at most {bound})",
            block.len()
        )
        .into());
    }
    let plain = lz4_flex::block::decompress(block, length)?;
    if plain.len() != length {
        return Err(format!(
            "a compressed payload decompressed to {} bytes, not the {length} it claims",
            plain.len()
        )
        .into());
    }
    Ok(plain)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The inner payload of `bytes` as the reader sees it: the marker, and the bytes it decodes.
    fn unwrapped(bytes: &[u8]) -> (u8, Vec<u8>) {
        let (marker, rest) = bytes.split_first().expect("a marker");
        match *marker {
            STORED => (STORED, rest.to_vec()),
            LZ4 => (LZ4, decompress(rest).expect("a valid block")),
            other => panic!("marker {other}"),
        }
    }

    /// A value whose bincode payload is exactly `len` bytes and compresses well: a string of
    /// one repeated letter (a length prefix of 1, 3 or 5 bytes, then the bytes; a `String`
    /// rather than a `Vec<u8>`, which serde would encode, and the tests decode, byte by byte).
    fn payload_of(len: usize) -> String {
        let prefix = match len {
            0..=251 => 1,
            252..=65_538 => 3,
            _ => 5,
        };
        let value = "r".repeat(len - prefix);
        assert_eq!(Bincode.encode(&value).unwrap().len(), len);
        value
    }

    #[test]
    fn the_threshold_is_the_first_length_compressed() {
        let codec = Compressed::new();
        let below = codec.encode(&payload_of(1023)).unwrap();
        assert_eq!(below[0], STORED);
        assert_eq!(below.len(), 1024);
        let at = codec.encode(&payload_of(1024)).unwrap();
        assert_eq!(at[0], LZ4);
        assert!(at.len() < 100, "{} bytes", at.len());
        for len in [1023, 1024, 1025] {
            let value = payload_of(len);
            let bytes = codec.encode(&value).unwrap();
            assert_eq!(codec.decode::<String>(&bytes).unwrap(), value);
        }
        // Threshold 0: even a short payload is tried, and stored if LZ4 cannot shrink it.
        let eager = Compressed::new().threshold(0);
        assert_eq!(eager.encode(&payload_of(40)).unwrap()[0], LZ4);
        assert_eq!(eager.encode(&3u8).unwrap(), vec![STORED, 3]);
        // Off, in effect: nothing is compressed.
        let never = Compressed::new().threshold(usize::MAX);
        assert_eq!(never.encode(&payload_of(70_000)).unwrap()[0], STORED);
    }

    /// Compression that would not shrink the payload is skipped: random bytes stay stored,
    /// one byte longer than the plain codec's payload.
    #[test]
    fn incompressible_payloads_are_stored_as_they_are() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let noise: Vec<u8> = (0..8192)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()[0]
            })
            .collect();
        let bytes = Compressed::new().encode(&noise).unwrap();
        assert_eq!(unwrapped(&bytes).0, STORED);
        assert_eq!(bytes.len(), 1 + Bincode.encode(&noise).unwrap().len());
        assert_eq!(Compressed::new().decode::<Vec<u8>>(&bytes).unwrap(), noise);
    }

    /// A value above the limit is not compressed, so the cache refuses it as too large, as it
    /// would without compression; one at the limit after compression reads back.
    #[test]
    fn the_value_limit_applies_before_compression() {
        let codec = Compressed::new();
        let over = payload_of(MAX_VALUE_BYTES + 1);
        let bytes = codec.encode(&over).unwrap();
        assert_eq!(bytes[0], STORED);
        assert!(bytes.len() > MAX_VALUE_BYTES);
        // The most compressible value the limit allows: 64 MiB of one byte, about 255 times
        // smaller once compressed, still within the bound the decoder checks.
        let at = payload_of(MAX_VALUE_BYTES);
        let bytes = codec.encode(&at).unwrap();
        assert_eq!(bytes[0], LZ4);
        assert!(bytes.len() < MAX_VALUE_BYTES / 200, "{} bytes", bytes.len());
        assert_eq!(codec.decode::<String>(&bytes).unwrap().len(), at.len());
    }

    #[test]
    fn corrupt_payloads_are_errors() {
        let codec = Compressed::new();
        let good = codec.encode(&payload_of(4096)).unwrap();
        assert_eq!(good[0], LZ4);
        let bad = |bytes: &[u8]| codec.decode::<String>(bytes).unwrap_err().to_string();
        assert!(bad(&[]).contains("empty payload"));
        assert!(bad(&[7, 1, 2]).contains("unknown compression marker 7"));
        assert!(bad(&good[..3]).contains("cut short"));
        // Cut short inside the block.
        let _ = bad(&good[..good.len() - 1]);
        // A length the block cannot hold, or beyond the limit: refused before allocating.
        let mut claims_more = good.clone();
        claims_more[1..5].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(bad(&claims_more).contains("at most"));
        let mut beyond_block = good.clone();
        let block = good.len() - LZ4_HEADER;
        let length = u32::try_from(block * LZ4_MAX_EXPANSION + 1).unwrap();
        beyond_block[1..5].copy_from_slice(&length.to_be_bytes());
        assert!(bad(&beyond_block).contains("at most"));
        // A length shorter, or longer, than what the block holds.
        let mut shorter = good.clone();
        shorter[1..5].copy_from_slice(&4000u32.to_be_bytes());
        let _ = bad(&shorter);
        let mut longer = good.clone();
        longer[1..5].copy_from_slice(&5000u32.to_be_bytes());
        assert!(bad(&longer).contains("not the 5000"));
    }

    /// The plain codec never reads this codec's payloads: the ids differ, and the envelope
    /// refuses another codec's bytes.
    #[test]
    fn ids_are_never_the_inner_codecs() {
        assert_eq!(Compressed::new().id(), 2);
        assert_ne!(Compressed::new().id(), Bincode.id());
        assert_eq!(Compressed::wrap(Bincode, 16).id(), 16);
    }

    #[test]
    #[should_panic(expected = "reserved")]
    fn a_reserved_id_is_refused() {
        let _ = Compressed::wrap(Bincode, 2);
    }

    #[test]
    #[should_panic(expected = "the inner codec's own")]
    fn the_inner_codecs_id_is_refused() {
        let _ = Compressed::wrap(Compressed::wrap(Bincode, 20), 20);
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            /// Every value reads back, whatever the threshold; compressed exactly when it is
            /// at least the threshold long and compression shrinks it.
            #[test]
            fn round_trips(
                rows in proptest::collection::vec(("[a-c]{0,12}", 0u64..1_000, any::<bool>()), 0..200),
                threshold in 0usize..4096,
            ) {
                let codec = Compressed::new().threshold(threshold);
                let bytes = codec.encode(&rows).unwrap();
                let plain = Bincode.encode(&rows).unwrap();
                let (marker, inner) = super::unwrapped(&bytes);
                prop_assert_eq!(&inner, &plain);
                if plain.len() < threshold {
                    prop_assert_eq!(marker, STORED);
                }
                if marker == LZ4 {
                    prop_assert!(bytes.len() <= plain.len());
                }
                // At or above the threshold, stored only where compression would not shrink it.
                if plain.len() >= threshold {
                    prop_assert_eq!(marker == LZ4, compress(&plain).is_some());
                }
                prop_assert_eq!(codec.decode::<Vec<(String, u64, bool)>>(&bytes).unwrap(), rows);
            }

            /// Whatever sits in the payload, decoding answers without panicking.
            #[test]
            fn arbitrary_bytes_never_panic(
                marker in 0u8..3,
                length in prop_oneof![0u32..5_000, any::<u32>()],
                block in proptest::collection::vec(any::<u8>(), 0..200),
            ) {
                let mut bytes = vec![marker];
                bytes.extend_from_slice(&length.to_be_bytes());
                bytes.extend_from_slice(&block);
                let _ = Compressed::new().decode::<Vec<u8>>(&bytes);
                let _ = Compressed::new().decode::<(String, u64)>(&bytes[..bytes.len().min(3)]);
            }

            /// A compressed payload with one byte of its block changed: an error or some value,
            /// never a panic.
            #[test]
            fn damaged_blocks_never_panic(at in 0usize..10_000, to in any::<u8>()) {
                let good = Compressed::new().encode(&super::payload_of(9000)).unwrap();
                let mut bad = good.clone();
                let at = LZ4_HEADER + at % (good.len() - LZ4_HEADER);
                bad[at] = to;
                let _ = Compressed::new().decode::<String>(&bad);
            }
        }
    }
}
