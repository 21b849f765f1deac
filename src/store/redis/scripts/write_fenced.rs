//! Write-fenced: a write that holds no lock, accepted unless a newer fence was handed out (a
//! `set` over a Redlock, whose lock lives on other servers).

use std::time::Duration;

use super::{lua, retention_ms, Args, Key, Lua, ScriptCall, Told};
use crate::store::Write;
use crate::wire::key::EntryKeys;

/// KEYS: value, fence. ARGV: fence, fence retention ms, channel, near channel,
/// 'set' | 'keep' | 'del', value, ttl ms. Writes (or deletes) unless the counter is above `fence`
/// (a newer token or an invalidation came since), and records `fence`; the counter lives at least
/// as long as the value, so the rule holds for it. A write is always announced: its callers (a
/// `set` over a Redlock) make explicit changes. Returns 1 if written.
static WRITE_FENCED: Lua = lua(r"
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
local written = 0
if current <= tonumber(ARGV[1]) then
  set_keeping(KEYS[2], ARGV[1], ARGV[2])
  announce(ARGV[4], ARGV[1], KEYS[1])
  write_value(KEYS[1], KEYS[2], ARGV[5], ARGV[6], ARGV[7])
  written = 1
end
redis.call('PUBLISH', ARGV[3], '')
return written
");

/// A write under a fence taken elsewhere ([`WRITE_FENCED`]).
pub(crate) struct WriteFencedCall<'a> {
    /// The entry.
    pub(crate) keys: &'a EntryKeys,
    /// The writer's fence: refused if the counter is above it.
    pub(crate) fence: u64,
    /// What to write.
    pub(crate) write: Write,
    /// The writer's lease (the fence is kept for its retention).
    pub(crate) lease: Duration,
    /// Who hears of it.
    pub(crate) told: Told<'a>,
}

impl ScriptCall for WriteFencedCall<'_> {
    /// Whether it was written.
    type Reply = bool;
    const LUA: &'static Lua = &WRITE_FENCED;

    fn encode<'a>(&'a self, args: &mut Args<'a>) {
        args.entry(self.keys, [Key::Value, Key::Fence])
            .arg((
                self.fence,
                retention_ms(self.lease),
                self.told.channel,
                self.told.near_channel,
            ))
            .write(&self.write);
    }
}
