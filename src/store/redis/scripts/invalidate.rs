//! Invalidate, one entry or many: deletes the value and bumps the fence, so a computation that
//! started before cannot write back what it read.

use std::borrow::Cow;
use std::time::Duration;

use redis::{Script, ScriptInvocation, Value};

use super::{parse, retention_ms, ScriptCall, Scripts};
use crate::store::StoreResult;
use crate::wire::key::EntryKeys;

/// KEYS: value, fence. ARGV: fence retention ms, channel, near channel. Always announced, even
/// when no value is there: near copies of a value Redis evicted must go too.
pub(super) const INVALIDATE: &str = r"
invalidate(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
return 1
";

/// The batch form of [`INVALIDATE`], each entry as there. KEYS: value, fence of entry 1, of
/// entry 2, ... ARGV: fence retention ms, near channel, then the wake-up channel of each entry.
pub(super) const INVALIDATE_MANY: &str = r"
for i = 0, #KEYS / 2 - 1 do
  invalidate(KEYS[2 * i + 1], KEYS[2 * i + 2], ARGV[1], ARGV[i + 3], ARGV[2])
end
return 1
";

/// One entry's invalidation ([`INVALIDATE`]).
pub(crate) struct InvalidateCall<'a> {
    /// The entry.
    pub(crate) keys: &'a EntryKeys,
    /// The lease whose retention the bumped fence is kept for.
    pub(crate) lease: Duration,
    /// The entry's wake-up channel.
    pub(crate) channel: &'a str,
    /// The namespace's near channel, or `""`.
    pub(crate) near_channel: &'a str,
}

impl ScriptCall for InvalidateCall<'_> {
    type Reply = ();

    fn key(&self) -> Option<&str> {
        Some(&self.keys.value)
    }

    fn script(scripts: &Scripts) -> &Script {
        &scripts.invalidate
    }

    fn encode(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation
            .key(&self.keys.value)
            .key(self.keys.fence())
            .arg(retention_ms(self.lease))
            .arg(self.channel)
            .arg(self.near_channel);
    }

    fn decode(&self, reply: Value) -> StoreResult<()> {
        parse::<i64>(reply).map(drop)
    }
}

/// The invalidation of several entries of one slot, in one step ([`INVALIDATE_MANY`]).
pub(crate) struct InvalidateManyCall<'a> {
    /// Each entry with its wake-up channel.
    pub(crate) entries: Vec<(&'a EntryKeys, Cow<'a, str>)>,
    /// The lease whose retention the bumped fences are kept for.
    pub(crate) lease: Duration,
    /// The namespace's near channel, or `""`.
    pub(crate) near_channel: &'a str,
}

impl ScriptCall for InvalidateManyCall<'_> {
    type Reply = ();

    fn key(&self) -> Option<&str> {
        self.entries.first().map(|entry| entry.0.value.as_str())
    }

    fn script(scripts: &Scripts) -> &Script {
        &scripts.invalidate_many
    }

    fn encode(&self, invocation: &mut ScriptInvocation<'_>) {
        invocation
            .arg(retention_ms(self.lease))
            .arg(self.near_channel);
        for (keys, channel) in &self.entries {
            invocation
                .key(&keys.value)
                .key(keys.fence())
                .arg(channel.as_ref());
        }
    }

    fn decode(&self, reply: Value) -> StoreResult<()> {
        parse::<i64>(reply).map(drop)
    }
}
