//! Set: the user's explicit write, which takes a new fence so that any computation running under
//! an older one cannot overwrite it.

use std::time::Duration;

use super::{lua, retention_ms, Args, Key, Lua, ScriptCall, Told};
use crate::store::expiry_ms;
use crate::wire::key::EntryKeys;

/// KEYS: value, fence. ARGV: value, ttl ms, fence retention ms, channel, near channel.
/// Always announced: a `set` is the user's explicit change.
static SET: Lua = lua(r"
local fence = bump_fence(KEYS[2], ARGV[3])
set_expiring(KEYS[1], ARGV[1], ARGV[2])
keep_at_least(KEYS[2], ARGV[2])
announce(ARGV[5], string.format('%d', fence), KEYS[1])
redis.call('PUBLISH', ARGV[4], '')
return 1
");

/// An explicit write ([`SET`]).
pub(crate) struct SetCall<'a> {
    /// The entry.
    pub(crate) keys: &'a EntryKeys,
    /// The bytes to store.
    pub(crate) value: Vec<u8>,
    /// How long the value lives.
    pub(crate) ttl: Duration,
    /// The lease whose retention the new fence is kept for.
    pub(crate) lease: Duration,
    /// Who hears of it.
    pub(crate) told: Told<'a>,
}

impl ScriptCall for SetCall<'_> {
    type Reply = ();
    const LUA: &'static Lua = &SET;

    fn encode<'a>(&'a self, args: &mut Args<'a>) {
        args.entry(self.keys, [Key::Value, Key::Fence]).arg((
            &self.value,
            expiry_ms(self.ttl),
            retention_ms(self.lease),
            self.told.channel,
            self.told.near_channel,
        ));
    }
}
