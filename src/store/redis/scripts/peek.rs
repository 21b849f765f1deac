//! Peek: who holds an entry's lock, for how long more, and its fencing counter, read without
//! changing anything (`Cache::inspect`).

use std::time::Duration;

use redis::Value;

use super::{lua, parse, unexpected, Args, FromReply, Key, Lua, ScriptCall};
use crate::store::{LockPeek, StoreResult};
use crate::wire::key::EntryKeys;

/// KEYS: lock, fence. Returns {holder token or '', lock pttl, fence or ''}. Read-only: a script
/// rather than a pipeline so that the three are read at one instant (a holder seen with the
/// counter of another acquisition would mislead whoever reads it). A key of another Redis
/// type reads as absent.
static PEEK: Lua = lua(r"
local holder = redis.pcall('GET', KEYS[1])
if type(holder) ~= 'string' then
  holder = ''
end
local fence = redis.pcall('GET', KEYS[2])
if type(fence) ~= 'string' then
  fence = ''
end
return {holder, redis.call('PTTL', KEYS[1]), fence}
");

/// A look at one entry's lock ([`PEEK`]).
pub(crate) struct PeekCall<'a> {
    /// The entry.
    pub(crate) keys: &'a EntryKeys,
}

impl ScriptCall for PeekCall<'_> {
    type Reply = LockPeek;
    const LUA: &'static Lua = &PEEK;

    fn encode<'a>(&'a self, args: &mut Args<'a>) {
        args.entry(self.keys, [Key::Lock, Key::Fence]);
    }
}

/// `{holder, pttl, fence}`; an empty holder or fence: none.
impl FromReply for LockPeek {
    fn from_reply(reply: Value) -> StoreResult<Self> {
        let (holder, pttl, fence): (String, i64, String) = parse(reply)?;
        let fence = match fence.as_str() {
            "" => None,
            text => Some(text.parse::<u64>().map_err(|_| {
                let got = Value::BulkString(text.as_bytes().to_vec());
                unexpected("peek: the fencing counter is not a number", &got)
            })?),
        };
        let left = u64::try_from(pttl).ok().map(Duration::from_millis);
        Ok(LockPeek {
            holder: (!holder.is_empty()).then_some((holder, left)),
            fence,
        })
    }
}
