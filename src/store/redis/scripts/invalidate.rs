//! Invalidate, one entry or many: deletes the value and bumps the fence, so a computation that
//! started before cannot write back what it read.

use std::borrow::Cow;
use std::time::Duration;

use super::{lua, retention_ms, Args, Key, Lua, ScriptCall, Told};
use crate::wire::key::EntryKeys;

/// KEYS: value, fence. ARGV: fence retention ms, channel, near channel. Always announced, even
/// when no value is there: near copies of a value Redis evicted must go too.
static INVALIDATE: Lua = lua(r"
invalidate(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
return 1
");

/// The batch form of [`INVALIDATE`], each entry as there. KEYS: value, fence of entry 1, of
/// entry 2, ... ARGV: fence retention ms, near channel, then the wake-up channel of each entry.
static INVALIDATE_MANY: Lua = lua(r"
for i = 0, #KEYS / 2 - 1 do
  invalidate(KEYS[2 * i + 1], KEYS[2 * i + 2], ARGV[1], ARGV[i + 3], ARGV[2])
end
return 1
");

/// One entry's invalidation ([`INVALIDATE`]).
pub(crate) struct InvalidateCall<'a> {
    /// The entry.
    pub(crate) keys: &'a EntryKeys,
    /// The lease whose retention the bumped fence is kept for.
    pub(crate) lease: Duration,
    /// Who hears of it.
    pub(crate) told: Told<'a>,
}

impl ScriptCall for InvalidateCall<'_> {
    type Reply = ();
    const LUA: &'static Lua = &INVALIDATE;

    fn encode<'a>(&'a self, args: &mut Args<'a>) {
        args.entry(self.keys, [Key::Value, Key::Fence]).arg((
            retention_ms(self.lease),
            self.told.channel,
            self.told.near_channel,
        ));
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
    const LUA: &'static Lua = &INVALIDATE_MANY;

    fn encode<'a>(&'a self, args: &mut Args<'a>) {
        args.arg((retention_ms(self.lease), self.near_channel));
        for (keys, channel) in &self.entries {
            args.entry(keys, [Key::Value, Key::Fence])
                .arg(channel.as_ref());
        }
    }
}
