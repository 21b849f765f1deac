//! Store-and-unlock: the computing caller's write under its fence, and the release of its lock,
//! in one step.

use redis::Value;

use super::{lua, parse, Args, FromReply, Key, Lua, ScriptCall, Told};
use crate::store::{StoreResult, Stored, Write};
use crate::wire::key::EntryKeys;

/// KEYS: value, lock, fence. ARGV: token, fence, channel, near channel, 'set' | 'keep' | 'del',
/// value, ttl ms (for 'keep': the least it then lives). Writes (or deletes) only if the fencing counter is still ours: nobody acquired, set
/// or invalidated since. A written value keeps the counter alive at least as long as itself.
/// A write that replaces or deletes a value is announced to the near tiers; a fill of an empty
/// key is not (no near tier can hold a copy of a value that is not there, and announcing every
/// fill is the broadcast storm of JetCache #972). Returns {written, released}.
static STORE_AND_UNLOCK: Lua = lua(r"
local written = 0
if redis.call('GET', KEYS[3]) == ARGV[2] then
  -- Where no near tier can listen (no channel) nothing is announced: spare the EXISTS too.
  if ARGV[4] ~= '' and redis.call('EXISTS', KEYS[1]) == 1 then
    announce(ARGV[4], ARGV[2], KEYS[1])
  end
  write_value(KEYS[1], KEYS[3], ARGV[5], ARGV[6], ARGV[7])
  written = 1
end
local released = 0
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  released = 1
end
redis.call('PUBLISH', ARGV[3], '')
return {written, released}
");

/// A lock holder's write and release ([`STORE_AND_UNLOCK`]).
pub(crate) struct StoreAndUnlockCall<'a> {
    /// The entry.
    pub(crate) keys: &'a EntryKeys,
    /// The holder's token: the lock is released only if it still holds it.
    pub(crate) token: &'a str,
    /// The fence the lock was taken with: the write happens only if it is still the newest.
    pub(crate) fence: u64,
    /// What to write.
    pub(crate) write: Write,
    /// Who hears of it.
    pub(crate) told: Told<'a>,
}

impl ScriptCall for StoreAndUnlockCall<'_> {
    type Reply = Stored;
    const LUA: &'static Lua = &STORE_AND_UNLOCK;

    fn encode<'a>(&'a self, args: &mut Args<'a>) {
        args.entry(self.keys, [Key::Value, Key::Lock, Key::Fence])
            .arg((
                self.token,
                self.fence,
                self.told.channel,
                self.told.near_channel,
            ))
            .write(&self.write);
    }
}

/// `{written, released}`, each 1 or 0.
impl FromReply for Stored {
    fn from_reply(reply: Value) -> StoreResult<Self> {
        let (written, released): (i64, i64) = parse(reply)?;
        Ok(Stored {
            written: written == 1,
            released: released == 1,
        })
    }
}
