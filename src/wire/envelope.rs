//! The stored form of a value: a fixed header, then the codec's payload.
//!
//! ```text
//! magic "SG" | version u8 | codec id u8 | flags u8 | fresh_until ms u64 | compute ms u32 | fence u64 | shape u64 | payload
//! ```
//! All integers are big-endian. `fresh_until` is wall-clock milliseconds since the Unix epoch
//! (the store's clock: see `Store::now_ms`); after it the value is stale until Redis expires it.
//! Flag bit 0 marks a remembered failure, whose payload is the error's message in UTF-8.
//! Flag bit 1 marks a fail-safe copy: a kept value rewritten after a failed (or timed-out)
//! computation, whose `fresh_until` is the end of its throttle; it is served only as a fallback,
//! never as fresh (see `docs/fail-safe.md`). A release before the flag reads such a copy as a
//! value fresh until the throttle's end (a few seconds), as it reads any unknown flag.
//! `shape` is the fingerprint of the shape of the type the value was written for (`shape.rs`);
//! the reader compares it with its own type's.
//! Anything that does not parse as this, or that was written by another codec or format version,
//! is not ours: the reader treats it as a miss.
//!
//! Format versions: 1 had no `shape` (its values read as a miss since 2, once, then are
//! overwritten); 2 added it after `fence`, so the fence stays at bytes 17..25.
//!
//! Explained in the guide: `docs/guarantees.md` (Changing a cached type).

const MAGIC: &[u8; 2] = b"SG";
const VERSION: u8 = 2;
const HEADER_LEN: usize = 2 + 1 + 1 + 1 + 8 + 4 + 8 + 8;
const NEGATIVE: u8 = 1;
const FALLBACK: u8 = 2;

/// A decoded header and a borrowed payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Envelope<'a> {
    pub codec: u8,
    /// A remembered failure (negative caching) rather than a value.
    pub negative: bool,
    /// A fail-safe copy of a kept value, throttled until `fresh_until_ms`: a fallback only.
    pub fallback: bool,
    /// Milliseconds since the Unix epoch until which the value is fresh.
    pub fresh_until_ms: u64,
    /// How long the computation that produced this value took (XFetch's delta).
    pub compute_ms: u32,
    /// The fencing token of the lock holder that wrote it (0 for an explicit `set`).
    pub fence: u64,
    /// The fingerprint of the shape of the type it was written for.
    pub shape: u64,
    pub payload: &'a [u8],
}

/// Why bytes were not accepted as an envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Foreign {
    TooShort,
    BadMagic,
    Version(u8),
    Codec(u8),
}

impl std::fmt::Display for Foreign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Foreign::TooShort => write!(f, "shorter than an envelope header"),
            Foreign::BadMagic => write!(f, "no stampede-guard envelope"),
            Foreign::Version(v) if *v < VERSION => write!(
                f,
                "envelope format version {v}, written by an older release, is not {VERSION}"
            ),
            Foreign::Version(v) => write!(f, "envelope format version {v} is not {VERSION}"),
            Foreign::Codec(c) => write!(f, "written by codec {c}, not by this cache's codec"),
        }
    }
}

impl<'a> Envelope<'a> {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.payload.len());
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(self.codec);
        let mut flags = 0;
        if self.negative {
            flags |= NEGATIVE;
        }
        if self.fallback {
            flags |= FALLBACK;
        }
        out.push(flags);
        out.extend_from_slice(&self.fresh_until_ms.to_be_bytes());
        out.extend_from_slice(&self.compute_ms.to_be_bytes());
        out.extend_from_slice(&self.fence.to_be_bytes());
        out.extend_from_slice(&self.shape.to_be_bytes());
        out.extend_from_slice(self.payload);
        out
    }

    /// Parses `bytes`, accepting only this format version and the given codec.
    pub(crate) fn decode(bytes: &'a [u8], codec: u8) -> Result<Self, Foreign> {
        // Magic and version first: another format's header may be shorter than ours (format
        // 1's was), and its reader's log should say which format it found.
        match bytes {
            [m0, m1, ..] if [*m0, *m1] != *MAGIC => return Err(Foreign::BadMagic),
            [_, _, version, ..] if *version != VERSION => return Err(Foreign::Version(*version)),
            _ => {}
        }
        let Some((header, payload)) = bytes.split_at_checked(HEADER_LEN) else {
            return Err(Foreign::TooShort);
        };
        if header[3] != codec {
            return Err(Foreign::Codec(header[3]));
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&header[at..at + 8]);
            u64::from_be_bytes(b)
        };
        let mut compute = [0u8; 4];
        compute.copy_from_slice(&header[13..17]);
        Ok(Envelope {
            codec,
            negative: header[4] & NEGATIVE != 0,
            fallback: header[4] & FALLBACK != 0,
            fresh_until_ms: u64_at(5),
            compute_ms: u32::from_be_bytes(compute),
            fence: u64_at(17),
            shape: u64_at(25),
            payload,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(payload: &[u8]) -> Envelope<'_> {
        Envelope {
            codec: 1,
            negative: false,
            fallback: false,
            fresh_until_ms: 1_700_000_000_000,
            compute_ms: 7,
            fence: 42,
            shape: 0x5eed,
            payload,
        }
    }

    #[test]
    fn round_trips() {
        let env = sample(b"hi");
        let bytes = env.encode();
        assert_eq!(Envelope::decode(&bytes, 1), Ok(env));
        let negative = Envelope {
            negative: true,
            ..sample(b"db down")
        };
        assert_eq!(Envelope::decode(&negative.encode(), 1), Ok(negative));
        let fallback = Envelope {
            fallback: true,
            ..sample(b"kept")
        };
        assert_eq!(Envelope::decode(&fallback.encode(), 1), Ok(fallback));
    }

    #[test]
    fn foreign_bytes_are_named() {
        assert_eq!(Envelope::decode(b"SG", 1), Err(Foreign::TooShort));
        assert_eq!(Envelope::decode(b"SG\x02\x01", 1), Err(Foreign::TooShort));
        assert_eq!(Envelope::decode(b"hello", 1), Err(Foreign::BadMagic));
        assert_eq!(Envelope::decode(&[b'x'; 40], 1), Err(Foreign::BadMagic));
        let other = Envelope {
            codec: 9,
            ..sample(b"")
        }
        .encode();
        assert_eq!(Envelope::decode(&other, 1), Err(Foreign::Codec(9)));
        let mut future = sample(b"").encode();
        future[2] = 3;
        assert_eq!(Envelope::decode(&future, 1), Err(Foreign::Version(3)));
    }

    /// Format 1 (no shape) as the previous release wrote it: refused by its version, so a value
    /// written before the upgrade is a miss, never read with its payload's first bytes taken
    /// for a shape.
    #[test]
    fn the_previous_format_is_refused() {
        let mut old = b"SG\x01\x01\x00".to_vec();
        old.extend_from_slice(&1_700_000_000_000u64.to_be_bytes());
        old.extend_from_slice(&7u32.to_be_bytes());
        old.extend_from_slice(&42u64.to_be_bytes());
        // A payload shorter than the new header's extra 8 bytes: still named by its version.
        assert_eq!(Envelope::decode(&old, 1), Err(Foreign::Version(1)));
        old.extend_from_slice(&[0x55; 16]);
        assert_eq!(Envelope::decode(&old, 1), Err(Foreign::Version(1)));
    }

    #[test]
    fn the_shape_sits_after_the_fence() {
        let bytes = sample(b"p").encode();
        assert_eq!(bytes[2], 2);
        assert_eq!(&bytes[17..25], &42u64.to_be_bytes());
        assert_eq!(&bytes[25..33], &0x5eedu64.to_be_bytes());
        assert_eq!(&bytes[33..], b"p");
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            /// Whatever sits under a key (another program's bytes, a truncated write), decoding
            /// answers without panicking, and what it accepts re-encodes to the same bytes.
            #[test]
            fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64), codec in 0u8..4) {
                if let Ok(envelope) = Envelope::decode(&bytes, codec) {
                    prop_assert_eq!(envelope.codec, codec);
                    let again = envelope.encode();
                    // Flag bits other than NEGATIVE are not kept: compare all but that byte.
                    prop_assert_eq!(&again[..4], &bytes[..4]);
                    prop_assert_eq!(&again[5..], &bytes[5..]);
                }
            }

            /// Bytes that start like an envelope (the magic and version) and then go astray.
            #[test]
            fn near_misses_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..40)) {
                let mut bytes = b"SG\x02\x01".to_vec();
                bytes.extend_from_slice(&tail);
                let decoded = Envelope::decode(&bytes, 1);
                prop_assert_eq!(decoded.is_ok(), bytes.len() >= HEADER_LEN);
            }

            #[test]
            fn encode_then_decode_round_trips(
                codec in any::<u8>(),
                negative in any::<bool>(),
                fallback in any::<bool>(),
                fresh_until_ms in any::<u64>(),
                compute_ms in any::<u32>(),
                fence in any::<u64>(),
                shape in any::<u64>(),
                payload in proptest::collection::vec(any::<u8>(), 0..256),
            ) {
                let envelope = Envelope { codec, negative, fallback, fresh_until_ms, compute_ms, fence, shape, payload: &payload };
                let bytes = envelope.encode();
                prop_assert_eq!(bytes.len(), HEADER_LEN + payload.len());
                prop_assert_eq!(Envelope::decode(&bytes, codec), Ok(envelope.clone()));
                // Another codec's reader never takes it for its own.
                prop_assert_eq!(Envelope::decode(&bytes, codec.wrapping_add(1)), Err(Foreign::Codec(codec)));
                // Every truncation of the header is refused, never misread.
                for cut in 0..HEADER_LEN {
                    prop_assert_eq!(Envelope::decode(&bytes[..cut], codec), Err(Foreign::TooShort));
                }
            }
        }
    }
}
