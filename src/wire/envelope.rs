//! The stored form of a value: a fixed header, then the codec's payload.
//!
//! ```text
//! magic "SG" | version u8 | codec id u8 | flags u8 | fresh_until ms u64 | compute ms u32 | fence u64 | shape u64
//!   | born u64 | tag count u8 | (tag length u16 | tag bytes)* | payload
//! ```
//! All integers are big-endian. `fresh_until` is wall-clock milliseconds since the Unix epoch
//! (the store's clock: see `store::Clock`); after it the value is stale until Redis expires it.
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
//! `born` is when the computation that produced the value started (or the `set` was made), by
//! the namespace's clock (see `Op::Born`); the tags are the user's strings, UTF-8. A value is
//! gone once its namespace was cleared, or one of its tags invalidated, at or after `born`
//! (see `cache/tags.rs`).
//!
//! Format versions: 1 had no `shape` (its values read as a miss since 2, once, then are
//! overwritten); 2 added it after `fence`, so the fence stays at bytes 17..25; 3 added `born`
//! and the tags after `shape`. A format-2 value is still read, as born at 0 with no tags (so
//! it is gone after any `clear`), so that values written before an upgrade stay hits; a
//! release before 3 reads a format-3 value as a miss and overwrites it (during a rolling
//! upgrade, a key may be recomputed once per version).
//!
//! Explained in the guide: `docs/guarantees.md` (Changing a cached type).

const MAGIC: &[u8; 2] = b"SG";
const VERSION: u8 = 3;
/// The previous format, still read (see the module docs).
const VERSION_2: u8 = 2;
const HEADER_LEN_2: usize = 2 + 1 + 1 + 1 + 8 + 4 + 8 + 8;
/// The fixed part of a format-3 header: format 2's, `born` and the tag count.
const HEADER_LEN: usize = HEADER_LEN_2 + 8 + 1;
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
    /// When its computation started (or the `set`), by the namespace's clock; 0 if unknown.
    pub born: u64,
    /// Its tags (at most [`MAX_TAGS`](crate::MAX_TAGS)).
    pub tags: Vec<&'a str>,
    pub payload: &'a [u8],
}

/// Why bytes were not accepted as an envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Foreign {
    TooShort,
    BadMagic,
    Version(u8),
    Codec(u8),
    /// The tag list is cut short, too long, or not UTF-8.
    Tags,
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
            Foreign::Tags => write!(f, "the envelope's tag list is malformed"),
        }
    }
}

impl<'a> Envelope<'a> {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let tags: usize = self.tags.iter().map(|t| 2 + t.len()).sum();
        let mut out = Vec::with_capacity(HEADER_LEN + tags + self.payload.len());
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
        out.extend_from_slice(&self.born.to_be_bytes());
        // The caller checked the count and each tag's length (`MAX_TAGS`, `MAX_KEY_BYTES`).
        out.push(u8::try_from(self.tags.len()).unwrap_or(u8::MAX));
        for tag in &self.tags {
            out.extend_from_slice(&u16::try_from(tag.len()).unwrap_or(u16::MAX).to_be_bytes());
            out.extend_from_slice(tag.as_bytes());
        }
        out.extend_from_slice(self.payload);
        out
    }

    /// Parses `bytes`, accepting only this format version and the given codec.
    pub(crate) fn decode(bytes: &'a [u8], codec: u8) -> Result<Self, Foreign> {
        // Magic and version first: another format's header may be shorter than ours (format
        // 1's was), and its reader's log should say which format it found.
        let version = match bytes {
            [m0, m1, ..] if [*m0, *m1] != *MAGIC => return Err(Foreign::BadMagic),
            [_, _, version, ..] if ![VERSION, VERSION_2].contains(version) => {
                return Err(Foreign::Version(*version))
            }
            [_, _, version, ..] => *version,
            _ => VERSION,
        };
        let fixed = if version == VERSION {
            HEADER_LEN
        } else {
            HEADER_LEN_2
        };
        let Some((header, mut payload)) = bytes.split_at_checked(fixed) else {
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
        let (born, tags) = if version == VERSION {
            let (tags, rest) = read_tags(header[HEADER_LEN - 1], payload)?;
            payload = rest;
            (u64_at(HEADER_LEN_2), tags)
        } else {
            (0, Vec::new())
        };
        Ok(Envelope {
            codec,
            negative: header[4] & NEGATIVE != 0,
            fallback: header[4] & FALLBACK != 0,
            fresh_until_ms: u64_at(5),
            compute_ms: u32::from_be_bytes(compute),
            fence: u64_at(17),
            shape: u64_at(25),
            born,
            tags,
            payload,
        })
    }
}

/// `count` tags from the start of `bytes`, and what follows them.
fn read_tags(count: u8, mut bytes: &[u8]) -> Result<(Vec<&str>, &[u8]), Foreign> {
    if usize::from(count) > crate::wire::key::MAX_TAGS {
        return Err(Foreign::Tags);
    }
    let mut tags = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let (len, rest) = bytes.split_at_checked(2).ok_or(Foreign::Tags)?;
        let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
        let (tag, rest) = rest.split_at_checked(len).ok_or(Foreign::Tags)?;
        tags.push(std::str::from_utf8(tag).map_err(|_| Foreign::Tags)?);
        bytes = rest;
    }
    Ok((tags, bytes))
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
            born: 1_700_000_000_000_123,
            tags: vec!["tenant:42", "2019"],
            payload,
        }
    }

    /// The header every earlier format opens with, as [`sample`]'s fields fill it: magic,
    /// `version`, codec 1, no flags, fresh-until, compute time, fence.
    fn previous_header(version: u8) -> Vec<u8> {
        let mut header = vec![b'S', b'G', version, 1, 0];
        header.extend_from_slice(&1_700_000_000_000u64.to_be_bytes());
        header.extend_from_slice(&7u32.to_be_bytes());
        header.extend_from_slice(&42u64.to_be_bytes());
        header
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
        future[2] = 4;
        assert_eq!(Envelope::decode(&future, 1), Err(Foreign::Version(4)));
        // A tag list cut short, or not UTF-8.
        let whole = sample(b"").encode();
        assert_eq!(
            Envelope::decode(&whole[..whole.len() - 1], 1),
            Err(Foreign::Tags)
        );
        let mut bad = whole.clone();
        let last = bad.len() - 1;
        bad[last] = 0xff;
        assert_eq!(Envelope::decode(&bad, 1), Err(Foreign::Tags));
        let mut many = sample(b"").encode();
        many[HEADER_LEN - 1] = 17;
        assert_eq!(Envelope::decode(&many, 1), Err(Foreign::Tags));
    }

    /// Format 1 (no shape) as the previous release wrote it: refused by its version, so a value
    /// written before the upgrade is a miss, never read with its payload's first bytes taken
    /// for a shape.
    #[test]
    fn the_previous_format_is_refused() {
        let mut old = previous_header(1);
        // A payload shorter than the new header's extra 8 bytes: still named by its version.
        assert_eq!(Envelope::decode(&old, 1), Err(Foreign::Version(1)));
        old.extend_from_slice(&[0x55; 16]);
        assert_eq!(Envelope::decode(&old, 1), Err(Foreign::Version(1)));
    }

    #[test]
    fn the_shape_sits_after_the_fence_and_born_and_tags_after_it() {
        let bytes = sample(b"p").encode();
        assert_eq!(bytes[2], 3);
        assert_eq!(&bytes[17..25], &42u64.to_be_bytes());
        assert_eq!(&bytes[25..33], &0x5eedu64.to_be_bytes());
        assert_eq!(&bytes[33..41], &1_700_000_000_000_123u64.to_be_bytes());
        assert_eq!(bytes[41], 2);
        assert_eq!(&bytes[42..44], &9u16.to_be_bytes());
        assert_eq!(&bytes[44..53], b"tenant:42");
        assert_eq!(&bytes[bytes.len() - 1..], b"p");
    }

    /// A value written by the previous release (format 2) stays a hit: born at 0, no tags.
    #[test]
    fn the_previous_format_is_read_as_born_at_zero_without_tags() {
        let mut old = previous_header(2);
        old.extend_from_slice(&0x5eedu64.to_be_bytes());
        old.extend_from_slice(b"payload");
        let read = Envelope::decode(&old, 1).unwrap();
        assert_eq!((read.born, read.tags.len(), read.fence), (0, 0, 42));
        assert_eq!(read.payload, b"payload");
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            /// Whatever sits under a key (another program's bytes, a truncated write), decoding
            /// answers without panicking, and what it accepts re-encodes to the same bytes.
            #[test]
            fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64), codec in 0u8..4) {
                if let Some(envelope) = Envelope::decode(&bytes, codec).ok().filter(|_| bytes[2] == VERSION) {
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
                prop_assert_eq!(decoded.is_ok(), bytes.len() >= HEADER_LEN_2);
                let mut bytes = b"SG\x03\x01".to_vec();
                bytes.extend_from_slice(&tail);
                // Whatever the tag list says, never a panic.
                let _ = Envelope::decode(&bytes, 1);
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
                born in any::<u64>(),
                tags in proptest::collection::vec("[a-z0-9:ü ]{1,12}", 0..4),
                payload in proptest::collection::vec(any::<u8>(), 0..256),
            ) {
                let tags: Vec<&str> = tags.iter().map(String::as_str).collect();
                let tag_bytes: usize = tags.iter().map(|t| 2 + t.len()).sum();
                let envelope = Envelope { codec, negative, fallback, fresh_until_ms, compute_ms, fence, shape, born, tags, payload: &payload };
                let bytes = envelope.encode();
                prop_assert_eq!(bytes.len(), HEADER_LEN + tag_bytes + payload.len());
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
