//! The Redis key layout of one cache entry (or one lock), and the escaping that keeps it sound.
//!
//! Invariants this module guarantees for every name it accepts:
//! - all keys of one entry share one hash tag `{...}`, so Redis Cluster puts them on one slot and
//!   one Lua script may touch them all;
//! - the escaped user key never contains `{`, `}`, `%`, spaces, control characters or non-ASCII
//!   bytes, so the tag is well formed and visible as-is in `redis-cli`;
//! - escaping is injective: two different user keys never share a Redis key, and no user key can
//!   reach outside its namespace.
//!
//! Explained in the guide: `docs/how-it-works.md` (The keys) and `docs/security.md` (namespaces).

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::OnceLock;

use crate::error::Error;

/// The longest user key accepted, in bytes before escaping.
pub const MAX_KEY_BYTES: usize = 512;

/// The longest namespace accepted, in bytes.
const MAX_NAMESPACE_BYTES: usize = 64;

/// The Redis names that belong to one entry.
///
/// Only the value key is built up front: a hit needs nothing else, and it is the hot path. The
/// others are built on first use, on a miss. The key as the user gave it is the value key's
/// braced part whenever escaping left it as it was (nearly always), so a hit builds one string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EntryKeys {
    /// `ns:{k}`: the value envelope.
    pub value: String,
    /// Where the escaped key starts in `value` (after `ns:{`).
    braced_at: usize,
    /// The key as the user gave it, kept only when escaping changed it.
    escaped_from: Option<Box<str>>,
    lock: OnceLock<String>,
    fence: OnceLock<String>,
    channel: OnceLock<String>,
}

impl EntryKeys {
    pub(crate) fn new(namespace: &str, key: &str) -> Result<Self, Error> {
        check_length(
            key,
            "a key must not be empty",
            "a key must be at most MAX_KEY_BYTES (512) bytes long",
        )?;
        // Room for the prefix, the braces and a little escaping, so one allocation usually does.
        let mut value = String::with_capacity(namespace.len() + key.len() + 8);
        value_key_into(namespace, key, &mut value);
        let braced_at = namespace.len() + 2;
        let escaped = value.get(braced_at..value.len() - 1) != Some(key);
        Ok(EntryKeys {
            value,
            braced_at,
            escaped_from: escaped.then(|| key.into()),
            lock: OnceLock::new(),
            fence: OnceLock::new(),
            channel: OnceLock::new(),
        })
    }

    /// The key as the user gave it, for messages and logs.
    pub(crate) fn user(&self) -> &str {
        match &self.escaped_from {
            Some(key) => key,
            None => (self.value.get(self.braced_at..self.value.len() - 1)).unwrap_or_default(),
        }
    }

    /// `ns:{k}_lock`: the owner's token while someone computes.
    pub(crate) fn lock(&self) -> &str {
        self.lock.get_or_init(|| format!("{}_lock", self.value))
    }

    /// `ns:{k}_fence`: the fencing counter, bumped on every acquisition, `set` and invalidation.
    pub(crate) fn fence(&self) -> &str {
        self.fence.get_or_init(|| format!("{}_fence", self.value))
    }

    /// `ns:{k}_ran`: a leader's last run ("fence ms"), so that a new leader keeps the schedule.
    /// Built on demand: only a leader's term start and its runs use it.
    pub(crate) fn last_run(&self) -> String {
        format!("{}_ran", self.value)
    }

    /// `ns:{k}_trace`: the lock holder's trace context, `"<fence> <traceparent>"` (the
    /// `opentelemetry` feature). Built on demand: only a traced lock request uses it.
    pub(crate) fn trace(&self) -> String {
        format!("{}_trace", self.value)
    }

    /// `ns:{k}_done`: the wake-up channel, published when the value lands or the lock is freed.
    pub(crate) fn channel(&self) -> &str {
        self.channel.get_or_init(|| format!("{}_done", self.value))
    }
}

/// Checks a namespace: it prefixes every key verbatim, so it must not hold a hash tag of its own.
pub(crate) fn validate_namespace(namespace: &str) -> Result<(), Error> {
    if namespace.is_empty() || namespace.len() > MAX_NAMESPACE_BYTES {
        return Err(invalid(namespace, "a namespace must be 1 to 64 bytes long"));
    }
    if !namespace.bytes().all(is_plain) {
        return Err(invalid(
            namespace,
            "a namespace may hold only printable ASCII without '{', '}', '%' or spaces",
        ));
    }
    Ok(())
}

/// Refuses an empty `name` (a key or a tag) with `empty`, and one over [`MAX_KEY_BYTES`] with
/// `too_long`: one rule for both, since both become Redis keys.
fn check_length(name: &str, empty: &'static str, too_long: &'static str) -> Result<(), Error> {
    if name.is_empty() {
        return Err(invalid(name, empty));
    }
    if name.len() > MAX_KEY_BYTES {
        return Err(invalid(name, too_long));
    }
    Ok(())
}

fn invalid(key: &str, reason: &'static str) -> Error {
    Error::invalid_key(key, reason)
}

/// Bytes that stand for themselves; every other byte is written `%XX`.
fn is_plain(b: u8) -> bool {
    b.is_ascii_graphic() && !matches!(b, b'{' | b'}' | b'%')
}

/// Appends the value key `ns:{k}` of `key` to `out`, without checking the key: the near tier's
/// look-up builds it in a reused buffer, so that a near hit allocates nothing for it.
pub(crate) fn value_key_into(namespace: &str, key: &str, out: &mut String) {
    out.reserve(namespace.len() + key.len() + 3);
    out.push_str(namespace);
    out.push_str(":{");
    escape_into(key, out);
    out.push('}');
}

/// The most tags one value may carry: every read of it reads that many epochs.
pub const MAX_TAGS: usize = 16;

/// The namespace's epoch, `ns:{%c}`: raised by `Cache::clear`; a value born before it is gone.
/// Also the key whose server keeps the namespace's clock (see `Op::Born`). `%` followed by
/// a letter that is no hex digit never comes out of escaping a user key, so no user key (nor
/// its lock, fence or channel) can share this name, and it lies under the value-key prefix
/// the near tier's tracking watches.
pub(crate) fn clear_key(namespace: &str) -> String {
    format!("{namespace}:{{%c}}")
}

/// The epoch of `tag`, `ns:{%t:<escaped tag>}`: raised by `Cache::invalidate_tag`. Its own hash
/// tag, so the tags of a namespace spread over a cluster's slots. Checked like a key: an empty
/// tag or one over [`MAX_KEY_BYTES`] is [`Error::InvalidKey`].
pub(crate) fn tag_key(namespace: &str, tag: &str) -> Result<String, Error> {
    check_length(
        tag,
        "a tag must not be empty",
        "a tag must be at most MAX_KEY_BYTES (512) bytes long",
    )?;
    let mut out = String::with_capacity(namespace.len() + tag.len() + 8);
    out.push_str(namespace);
    out.push_str(":{%t:");
    escape_into(tag, &mut out);
    out.push('}');
    Ok(out)
}

/// Whether `name` is an epoch of `namespace` (its [`clear_key`] or a [`tag_key`]): what a near
/// tier holds besides copies, and drops when Redis reports it changed.
pub(crate) fn is_epoch_key(namespace: &str, name: &str) -> bool {
    name.strip_prefix(namespace)
        .and_then(|rest| rest.strip_prefix(":{%"))
        .is_some_and(|rest| rest == "c}" || (rest.starts_with("t:") && rest.ends_with('}')))
}

/// The prefixes of the namespace's epochs, for `CLIENT TRACKING ... PREFIX` when the tracked
/// value keys are narrowed: neither covers nor is covered by an escaped user-key prefix.
pub(crate) fn epoch_key_prefixes(namespace: &str) -> [String; 2] {
    [format!("{namespace}:{{%c}}"), format!("{namespace}:{{%t:")]
}

/// The prefixes of value keys that cover every user key starting with one of `prefixes` (all of
/// the namespace's value keys for an empty list), and the namespace's epochs (tags and clear),
/// for `CLIENT TRACKING ... BCAST PREFIX`:
/// escaping works byte by byte, so the escaped prefix of a key is a prefix of its escaped key.
/// A prefix that another one covers is left out: Redis refuses overlapping prefixes.
pub(crate) fn value_key_prefixes(namespace: &str, prefixes: &[String]) -> Vec<String> {
    let mut escaped: Vec<String> = if prefixes.is_empty() {
        vec![format!("{namespace}:{{")]
    } else {
        // The namespace's epochs judge every value, whatever its key: always tracked.
        prefixes
            .iter()
            .map(|prefix| {
                let mut out = format!("{namespace}:{{");
                escape_into(prefix, &mut out);
                out
            })
            .chain(epoch_key_prefixes(namespace))
            .collect()
    };
    // Sorted, a prefix comes right before the names it covers.
    escaped.sort();
    let mut kept: Vec<String> = Vec::with_capacity(escaped.len());
    for prefix in escaped {
        if !kept
            .last()
            .is_some_and(|last| prefix.starts_with(last.as_str()))
        {
            kept.push(prefix);
        }
    }
    kept
}

/// The user's key whose value key in `namespace` is `value_key` (the inverse of
/// [`value_key_into`]), or `None` if `value_key` is not one of that namespace's value keys: the
/// near tier holds copies by the user's key and hears of changes by value key.
pub(crate) fn user_key_of<'v>(namespace: &str, value_key: &'v str) -> Option<Cow<'v, str>> {
    let escaped = value_key
        .strip_prefix(namespace)?
        .strip_prefix(":{")?
        .strip_suffix('}')?;
    if !escaped.contains('%') {
        return Some(Cow::Borrowed(escaped));
    }
    let mut bytes = Vec::with_capacity(escaped.len());
    let mut rest = escaped.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = tail
                .get(..2)
                .filter(|h| h.iter().all(u8::is_ascii_hexdigit))?;
            bytes.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok().map(Cow::Owned)
}

fn escape_into(key: &str, out: &mut String) {
    // Runs of plain bytes are copied whole: most keys are one run, and every hit builds its key.
    // A run is ASCII and follows an ASCII byte or a char's last byte, so both of its ends are
    // char boundaries (`get` cannot miss).
    if key.bytes().all(is_plain) {
        out.push_str(key);
        return;
    }
    let mut run = 0;
    for (i, b) in key.bytes().enumerate() {
        if is_plain(b) {
            continue;
        }
        out.push_str(key.get(run..i).unwrap_or_default());
        // Writing to a String cannot fail.
        let _ = write!(out, "%{b:02X}");
        run = i + 1;
    }
    out.push_str(key.get(run..).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn month_keys_follow_the_documented_layout() {
        let keys = EntryKeys::new("reports", "2019-05").unwrap();
        assert_eq!(keys.value, "reports:{2019-05}");
        assert_eq!(keys.lock(), "reports:{2019-05}_lock");
        assert_eq!(keys.fence(), "reports:{2019-05}_fence");
        assert_eq!(keys.channel(), "reports:{2019-05}_done");
    }

    #[test]
    fn braces_newlines_and_non_ascii_are_escaped_injectively() {
        let odd = [
            "a{b}",
            "a%7Bb%7D",
            "line\nbreak",
            "zürich",
            "a b",
            "%",
            "%25",
        ];
        let mut seen = std::collections::HashSet::new();
        for k in odd {
            let keys = EntryKeys::new("ns", k).unwrap();
            let inner = &keys.value["ns:{".len()..keys.value.len() - 1];
            assert!(!inner.contains(['{', '}', '\n', ' ']), "{inner}");
            assert!(inner.is_ascii());
            assert!(seen.insert(keys.value.clone()), "collision for {k:?}");
            assert_eq!(keys.user(), k, "messages name the key as given");
        }
        assert_eq!(EntryKeys::new("ns", "2019-05").unwrap().user(), "2019-05");
    }

    #[test]
    fn epoch_keys_are_no_user_key_and_are_recognised() {
        let clear = clear_key("reports");
        assert_eq!(clear, "reports:{%c}");
        let tag = tag_key("reports", "tenant 42/{x}").unwrap();
        assert_eq!(tag, "reports:{%t:tenant%2042/%7Bx%7D}");
        for name in [&clear, &tag] {
            assert_eq!(user_key_of("reports", name), None, "{name}");
            assert!(is_epoch_key("reports", name), "{name}");
            assert!(!is_epoch_key("other", name), "{name}");
        }
        // Keys whose escaped form starts with `%` are values, not epochs.
        for key in ["%c", "%t:x", "{"] {
            let keys = EntryKeys::new("reports", key).unwrap();
            assert!(!is_epoch_key("reports", &keys.value), "{key}");
            assert!(user_key_of("reports", &keys.value).is_some());
            assert!(!keys.value.starts_with(&epoch_key_prefixes("reports")[1]));
            assert!(!keys.value.starts_with(&epoch_key_prefixes("reports")[0]));
        }
        assert!(matches!(
            tag_key("reports", ""),
            Err(Error::InvalidKey { .. })
        ));
        let long = "t".repeat(MAX_KEY_BYTES + 1);
        assert!(matches!(
            tag_key("reports", &long),
            Err(Error::InvalidKey { .. })
        ));
        assert!(tag_key("reports", &long[1..]).is_ok());
    }

    #[test]
    fn value_keys_lead_back_to_user_keys_and_other_names_to_none() {
        let keys = EntryKeys::new("reports", "2019 05 {x}").unwrap();
        assert_eq!(
            user_key_of("reports", &keys.value).as_deref(),
            Some("2019 05 {x}")
        );
        assert_eq!(user_key_of("other", &keys.value), None);
        assert_eq!(user_key_of("reports", keys.lock()), None);
        assert_eq!(user_key_of("reports", "reports:{bad%4}"), None);
        assert_eq!(
            user_key_of("reports", "reports:{%+1}"),
            None,
            "a sign is no hex digit"
        );
        assert_eq!(user_key_of("reports", "reports:{%FF}"), None, "not UTF-8");
    }

    #[test]
    fn tracking_prefixes_cover_their_keys_and_never_overlap() {
        let all = value_key_prefixes("ns", &[]);
        assert_eq!(all, ["ns:{"]);
        let some = value_key_prefixes(
            "ns",
            &[
                "report:".into(),
                "rep".into(),
                "a b".into(),
                "report:2019".into(),
            ],
        );
        assert_eq!(some, ["ns:{%c}", "ns:{%t:", "ns:{a%20b", "ns:{rep"]);
        // A user prefix starting with `%` neither covers nor is covered by the epochs'.
        let odd = value_key_prefixes("ns", &["%".into()]);
        assert_eq!(odd, ["ns:{%25", "ns:{%c}", "ns:{%t:"]);
        for key in ["a b c", "report:2019-05"] {
            let keys = EntryKeys::new("ns", key).unwrap();
            assert!(
                some.iter().any(|p| keys.value.starts_with(p.as_str())),
                "{key}"
            );
        }
        let other = EntryKeys::new("ns", "x").unwrap();
        assert!(!some.iter().any(|p| other.value.starts_with(p.as_str())));
    }

    #[test]
    fn empty_and_oversize_keys_are_refused() {
        assert!(matches!(
            EntryKeys::new("ns", ""),
            Err(Error::InvalidKey { .. })
        ));
        assert!(EntryKeys::new("ns", &"x".repeat(MAX_KEY_BYTES)).is_ok());
        assert!(matches!(
            EntryKeys::new("ns", &"x".repeat(MAX_KEY_BYTES + 1)),
            Err(Error::InvalidKey { .. })
        ));
    }

    #[test]
    fn namespaces_cannot_carry_their_own_tag() {
        assert!(validate_namespace("reports").is_ok());
        assert!(validate_namespace("a{b}").is_err());
        assert!(validate_namespace("").is_err());
        assert!(validate_namespace("with space").is_err());
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        /// The hash tag Redis Cluster uses: between the first `{` and the first `}` after it.
        fn hash_tag(key: &str) -> Option<&str> {
            let open = key.find('{')?;
            let close = open + 1 + key[open + 1..].find('}')?;
            Some(&key[open + 1..close]).filter(|tag| !tag.is_empty())
        }

        /// User keys that lean on the escaping: braces, percent signs, separators, suffix
        /// look-alikes, controls and non-ASCII.
        fn tricky_key() -> impl Strategy<Value = String> {
            // Each piece as likely as the others, any char as likely as one of them.
            const PIECES: &[&str] = &[
                "{", "}", "%", "%7B", "_lock", "_fence", "_done", ":", " ", "\n", "é", "a",
            ];
            let pieces = prop_oneof![
                PIECES.len() as u32 => prop::sample::select(PIECES).prop_map(str::to_owned),
                1 => any::<char>().prop_map(String::from),
            ];
            proptest::collection::vec(pieces, 1..12).prop_map(|p| p.concat())
        }

        fn all_keys(keys: &EntryKeys) -> [&str; 4] {
            [&keys.value, keys.lock(), keys.fence(), keys.channel()]
        }

        proptest! {
            #[test]
            fn distinct_keys_never_share_a_redis_key(a in tricky_key(), b in tricky_key()) {
                prop_assume!(a != b);
                let (ka, kb) = (EntryKeys::new("ns", &a).unwrap(), EntryKeys::new("ns", &b).unwrap());
                for x in all_keys(&ka) {
                    for y in all_keys(&kb) {
                        prop_assert_ne!(x, y, "{:?} and {:?}", a, b);
                    }
                }
            }

            #[test]
            fn the_tag_is_well_formed_and_nothing_leaves_the_namespace(key in tricky_key(), ns in "[a-z][a-z0-9:._-]{0,20}") {
                let keys = EntryKeys::new(&ns, &key).unwrap();
                let prefix = format!("{ns}:{{");
                let tag = hash_tag(&keys.value).expect("a hash tag");
                // Every key of the entry starts with the namespace and carries the same tag, and
                // the tag is exactly the escaped key, which holds only plain characters.
                for k in all_keys(&keys) {
                    prop_assert!(k.starts_with(&prefix), "{}", k);
                    prop_assert_eq!(hash_tag(k), Some(tag));
                }
                prop_assert!(tag.bytes().all(|b| is_plain(b) || b == b'%'));
                // Nothing is lost: the value key leads back to the user's key.
                let back = user_key_of(&ns, &keys.value);
                prop_assert_eq!(back.as_deref(), Some(key.as_str()));
                prop_assert_eq!(&keys.value, &format!("{prefix}{tag}}}"));
            }

            #[test]
            fn keys_over_the_limit_are_refused_at_exactly_the_limit(len in 1usize..=(MAX_KEY_BYTES + 64)) {
                let result = EntryKeys::new("ns", &"k".repeat(len));
                prop_assert_eq!(result.is_ok(), len <= MAX_KEY_BYTES);
            }
        }
    }
}
