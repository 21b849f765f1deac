//! On a Redis Cluster, the namespace's clear epoch has a copy in every slot, so that a hit reads
//! its value and the epoch that judges it in one `MGET` on the value's own node.
//!
//! A value is alive only while it was born after the namespace's last `clear` (see
//! `cache/tags.rs`), so every read asks for the clear key `ns:{%c}` beside the value. On one
//! server that key is held in process under tracking (`held_epoch.rs`). On a cluster it lies in
//! one slot, on one master: every hit of the namespace cost a second request, to that master,
//! which served every hit of the namespace. Holding it in process does not work there: an
//! invalidation from that master is not ordered with a reply from the value's master, so a hit
//! begun after a `clear` returned could still serve a value from before it.
//!
//! So `clear` on a cluster raises a copy of the epoch in each of the 16,384 slots,
//! `ns:%c{<tag>}` with `<tag>` the shortest number whose slot is that slot, before it raises the
//! clear key itself, and a single-key read asks for the copy in its value's slot instead of the
//! clear key: one `MGET`, one node. Whoever reads the clear key (a batch, the epochs read
//! alone, a near tier learning it) finds it raised only after every copy was: a near tier that
//! drops its epoch on hearing of the clear key's change reads a copy already raised.
//!
//! The price: a `clear` on a cluster sends 16,384 more script calls, over a connection of their
//! own so that the data connection's requests do not queue behind them (about 0.3 s on the
//! test cluster of this 2-core machine), it fails if a master fails under it (the copies it
//! raised stay raised: run it again), and the copies take about 1.5 MB per cleared namespace. They lie outside the near tier's tracked
//! prefix (`ns:{`), so raising them reports nothing to the near tiers. Tags keep their own
//! epochs, read beside the value (paid only by tagged values). A copy lost on a failover of its
//! slot's master, like the clear key itself, brings back that slot's values from before the
//! clear (docs/guarantees.md, "When the cluster fails over").

use std::sync::{Arc, OnceLock};

use crate::wire::key::{clear_copy_key, clear_key_namespace};

/// Redis Cluster's number of slots.
const SLOTS: usize = 16_384;

/// How many copies are raised at once: the rest wait for them, so a `clear` keeps a bounded
/// number of requests out (about 170 tiny scripts queued per master, under a millisecond of its
/// time), and `join_all`, which polls all it holds on each wake-up, a short list. 4,096 at once
/// took as long (about 0.3 s): the time is the requests' own.
pub(crate) const RAISED_AT_ONCE: usize = 512;

/// The slot of `key` as Redis Cluster computes it: CRC16 (XMODEM) of its hash tag (what lies
/// between the first `{` and the first `}` after it, if not empty), else of the whole key,
/// modulo 16,384.
pub(crate) fn slot_of(key: &[u8]) -> usize {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    usize::from(crc16(tagged.unwrap_or(key))) % SLOTS
}

/// CRC16-CCITT (XMODEM), the checksum Redis Cluster hashes keys with.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Per slot, the smallest number whose decimal text hashes to it: the hash tag of that slot's
/// copy. The same table in every process (it depends on nothing but CRC16), found once, on the
/// first use (about 160,000 checksums of a few bytes).
fn tags() -> &'static [u32] {
    static TAGS: OnceLock<Vec<u32>> = OnceLock::new();
    TAGS.get_or_init(|| {
        let mut tags = vec![u32::MAX; SLOTS];
        let mut left = SLOTS;
        let mut n: u32 = 0;
        let mut digits = [0u8; 10];
        while left > 0 {
            let slot = usize::from(crc16(decimal(n, &mut digits))) % SLOTS;
            if tags[slot] == u32::MAX {
                tags[slot] = n;
                left -= 1;
            }
            n += 1;
        }
        tags
    })
}

/// `n` in decimal, written at the end of `buffer` (no allocation: the table is 160,000 of them).
fn decimal(mut n: u32, buffer: &mut [u8; 10]) -> &[u8] {
    let mut at = buffer.len();
    loop {
        at -= 1;
        buffer[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buffer[at..];
        }
    }
}

/// The names a single-key read of `value` asks for: `names` with the clear key, if it comes
/// first, replaced by its copy in the value's slot (positions kept: the epoch read there is the
/// clear key's for whoever judges the value).
pub(crate) fn in_slot_of(value: &str, names: &Arc<[String]>) -> Arc<[String]> {
    let Some(namespace) = names.first().and_then(|first| clear_key_namespace(first)) else {
        return Arc::clone(names);
    };
    let copy = clear_copy_key(namespace, tags()[slot_of(value.as_bytes())]);
    std::iter::once(copy)
        .chain(names.iter().skip(1).cloned())
        .collect()
}

/// Every copy of the clear key `name`, one per slot; none if `name` is not a clear key.
pub(crate) fn all_copies(name: &str) -> Vec<String> {
    match clear_key_namespace(name) {
        Some(namespace) => (tags().iter())
            .map(|&tag| clear_copy_key(namespace, tag))
            .collect(),
        None => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use redis::cluster_routing::Slot;

    use super::*;

    #[test]
    fn slots_are_computed_as_redis_cluster_computes_them() {
        for key in [
            "ns:{2019-05}",
            "ns:{2019-05}_lock",
            "ns:%c{17}",
            "plain",
            "a{}b",
            "{}{x}",
            "x{y}z{w}",
            "ns:{%c}",
            "",
        ] {
            let ours = u16::try_from(slot_of(key.as_bytes()))
                .ok()
                .and_then(Slot::new);
            assert_eq!(ours, Some(Slot::for_key(key)), "the slot of {key:?}");
        }
    }

    #[test]
    fn numbers_are_written_in_decimal() {
        let mut buffer = [0u8; 10];
        for n in [0, 7, 10, 16_383, u32::MAX] {
            assert_eq!(decimal(n, &mut buffer), n.to_string().as_bytes());
        }
    }

    #[test]
    fn every_slot_has_a_copy_and_each_copy_lies_in_its_slot() {
        let copies = all_copies("ns:{%c}");
        assert_eq!(copies.len(), SLOTS);
        for (slot, copy) in copies.iter().enumerate() {
            assert_eq!(slot_of(copy.as_bytes()), slot, "{copy}");
            assert!(copy.starts_with("ns:%c{"), "{copy}");
        }
        assert!(all_copies("ns:{%t:tag}").is_empty());
    }

    #[test]
    fn a_read_asks_for_the_copy_in_its_values_slot_in_the_clear_keys_place() {
        let names: Arc<[String]> = vec!["ns:{%c}".to_owned(), "ns:{%t:a}".to_owned()].into();
        let read = in_slot_of("ns:{2019-05}", &names);
        assert_eq!(read.len(), 2);
        assert_eq!(slot_of(read[0].as_bytes()), slot_of(b"ns:{2019-05}"));
        assert_eq!(read[1], "ns:{%t:a}");
        // Without the clear key first, the names are the caller's own.
        let tags: Arc<[String]> = vec!["ns:{%t:a}".to_owned()].into();
        assert!(Arc::ptr_eq(&in_slot_of("ns:{k}", &tags), &tags));
    }
}
