//! The stored form of a value: a fixed header, then the codec's payload.
//!
//! ```text
//! magic "SG" | version u8 | codec id u8 | fresh_until ms u64 | compute ms u32 | fence u64 | payload
//! ```
//! All integers are big-endian. Anything that does not parse as this, or that was written by
//! another codec or format version, is not ours: the reader treats it as a miss.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

const MAGIC: &[u8; 2] = b"SG";
const VERSION: u8 = 1;
const HEADER_LEN: usize = 2 + 1 + 1 + 8 + 4 + 8;

/// A decoded header and a borrowed payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Envelope<'a> {
    pub codec: u8,
    /// Milliseconds since the Unix epoch until which the value is fresh.
    pub fresh_until_ms: u64,
    /// How long the computation that produced this value took.
    pub compute_ms: u32,
    /// The fencing token of the lock holder that wrote it (0 for an explicit `set`).
    pub fence: u64,
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
            Foreign::Version(v) => write!(f, "envelope format version {v} is not {VERSION}"),
            Foreign::Codec(c) => write!(f, "written by codec {c}, not by this cache's codec"),
        }
    }
}

impl<'a> Envelope<'a> {
    pub(crate) fn encode(
        codec: u8,
        ttl: Duration,
        compute: Duration,
        fence: u64,
        payload: &[u8],
    ) -> Vec<u8> {
        let fresh_until = now_ms().saturating_add(ttl.as_millis().try_into().unwrap_or(u64::MAX));
        let compute_ms: u32 = compute.as_millis().try_into().unwrap_or(u32::MAX);
        let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(codec);
        out.extend_from_slice(&fresh_until.to_be_bytes());
        out.extend_from_slice(&compute_ms.to_be_bytes());
        out.extend_from_slice(&fence.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    /// Parses `bytes`, accepting only this format version and the given codec.
    pub(crate) fn decode(bytes: &'a [u8], codec: u8) -> Result<Self, Foreign> {
        let Some((header, payload)) = bytes.split_at_checked(HEADER_LEN) else {
            return Err(Foreign::TooShort);
        };
        if &header[0..2] != MAGIC {
            return Err(Foreign::BadMagic);
        }
        if header[2] != VERSION {
            return Err(Foreign::Version(header[2]));
        }
        if header[3] != codec {
            return Err(Foreign::Codec(header[3]));
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&header[at..at + 8]);
            u64::from_be_bytes(b)
        };
        let mut compute = [0u8; 4];
        compute.copy_from_slice(&header[12..16]);
        Ok(Envelope {
            codec,
            fresh_until_ms: u64_at(4),
            compute_ms: u32::from_be_bytes(compute),
            fence: u64_at(16),
            payload,
        })
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis().try_into().unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let bytes = Envelope::encode(
            1,
            Duration::from_secs(60),
            Duration::from_millis(7),
            42,
            b"hi",
        );
        let env = Envelope::decode(&bytes, 1).unwrap();
        assert_eq!(
            (env.codec, env.compute_ms, env.fence, env.payload),
            (1, 7, 42, &b"hi"[..])
        );
        assert!(env.fresh_until_ms >= now_ms() + 59_000);
    }

    #[test]
    fn foreign_bytes_are_named() {
        assert_eq!(Envelope::decode(b"hello", 1), Err(Foreign::TooShort));
        assert_eq!(Envelope::decode(&[b'x'; 40], 1), Err(Foreign::BadMagic));
        let other = Envelope::encode(9, Duration::ZERO, Duration::ZERO, 0, b"");
        assert_eq!(Envelope::decode(&other, 1), Err(Foreign::Codec(9)));
        let mut future = Envelope::encode(1, Duration::ZERO, Duration::ZERO, 0, b"");
        future[2] = 2;
        assert_eq!(Envelope::decode(&future, 1), Err(Foreign::Version(2)));
    }
}
