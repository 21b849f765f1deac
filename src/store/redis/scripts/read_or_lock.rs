//! Read-or-lock, for one entry and for many: the miss path's single round trip, which returns the
//! value if there is one, or takes the lock and a new fence, or says how long the holder has left.

use std::time::Duration;

use redis::Value;

use super::{flag, lua, parse, retention_ms, unexpected, Args, FromReply, Key, Lua, ScriptCall};
use crate::store::{expiry_ms, HolderTrace, ReadOrLock, StoreResult, MAX_HOLDER_TRACE};
use crate::wire::key::EntryKeys;

/// KEYS: value, lock, fence[, trace]. ARGV: token, lease ms, read value (1/0), fence retention
/// ms[, traceparent, most trace bytes]. Returns {1, value} | {2, fence, server clock in µs as
/// text} (lock taken) | {3, lock pttl[, holder's trace]} (held by another).
/// A value of another Redis type (a list...) reads as a miss, so it gets replaced.
///
/// With the trace key (the `opentelemetry` feature, a caller with a trace context): a lock
/// taken stores `"<fence> <traceparent>"` under it, kept as long as the fence; a lock found
/// held returns what is stored there only if it starts with the fence the counter holds now,
/// so a trace left by an earlier holder (any acquisition, by any script, bumps the fence) or
/// from before an invalidation is never taken for the holder's. `pcall`: another type under
/// the key reads as nothing; and what is longer than the bound is not sent back.
static READ_OR_LOCK: Lua = lua(r"
local answer = read_or_lock(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
if #KEYS == 3 then
  return answer
end
local fence = redis.call('GET', KEYS[3])
if answer[1] == 2 then
  set_expiring(KEYS[4], fence .. ' ' .. ARGV[5], ARGV[4])
elseif answer[1] == 3 and fence then
  local trace = redis.pcall('GET', KEYS[4])
  if type(trace) == 'string' and #trace <= tonumber(ARGV[6])
      and string.sub(trace, 1, #fence + 1) == fence .. ' ' then
    answer[3] = trace
  end
end
return answer
");

/// The batch form of [`READ_OR_LOCK`]: the same rule for each entry, in one atomic step.
/// KEYS: value, lock, fence of entry 1, then of entry 2, ... ARGV: lease ms, fence retention ms,
/// then token and read value (1/0) of entry 1, of entry 2, ... Returns one reply of
/// `READ_OR_LOCK` per entry, in order.
static READ_OR_LOCK_MANY: Lua = lua(r"
local replies = {}
for i = 0, #KEYS / 3 - 1 do
  replies[i + 1] = read_or_lock(KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3],
    ARGV[2 * i + 3], ARGV[1], ARGV[2 * i + 4], ARGV[2])
end
return replies
");

/// One entry's read-or-lock ([`READ_OR_LOCK`]).
pub(crate) struct ReadOrLockCall<'a> {
    /// The entry.
    pub(crate) keys: &'a EntryKeys,
    /// The caller's token, which the lock holds if taken.
    pub(crate) token: &'a str,
    /// The lock's lease (the fence is kept for its retention).
    pub(crate) lease: Duration,
    /// Whether a value there is returned; a plain lock attempt does not read it.
    pub(crate) read_value: bool,
    /// The caller's `traceparent`, stored beside a lock it takes; with it the holder's is read
    /// back. `None`: the script touches no trace key.
    pub(crate) trace: Option<&'a str>,
}

impl ScriptCall for ReadOrLockCall<'_> {
    type Reply = (ReadOrLock, Option<HolderTrace>);
    const LUA: &'static Lua = &READ_OR_LOCK;

    fn encode<'a>(&'a self, args: &mut Args<'a>) {
        match self.trace {
            None => args.entry(self.keys, [Key::Value, Key::Lock, Key::Fence]),
            Some(_) => args.entry(self.keys, [Key::Value, Key::Lock, Key::Fence, Key::Trace]),
        }
        .arg((
            self.token,
            expiry_ms(self.lease),
            flag(self.read_value),
            retention_ms(self.lease),
        ));
        if let Some(trace) = self.trace {
            args.arg((trace, MAX_HOLDER_TRACE));
        }
    }
}

/// The read-or-lock of several entries of one slot, in one atomic step ([`READ_OR_LOCK_MANY`]).
pub(crate) struct ReadOrLockManyCall<'a> {
    /// Each entry with its token and whether to read its value, as in [`ReadOrLockCall`].
    pub(crate) entries: Vec<(&'a EntryKeys, &'a str, bool)>,
    /// The lease of every lock taken.
    pub(crate) lease: Duration,
}

impl ScriptCall for ReadOrLockManyCall<'_> {
    /// One answer per entry, in order.
    type Reply = Vec<StoreResult<ReadOrLock>>;
    const LUA: &'static Lua = &READ_OR_LOCK_MANY;

    fn encode<'a>(&'a self, args: &mut Args<'a>) {
        args.arg((expiry_ms(self.lease), retention_ms(self.lease)));
        for &(keys, token, read_value) in &self.entries {
            args.entry(keys, [Key::Value, Key::Lock, Key::Fence])
                .arg((token, flag(read_value)));
        }
    }

    /// A reply of the wrong length fails the whole call.
    fn decode(&self, reply: Value) -> StoreResult<Self::Reply> {
        let replies: Vec<Value> = parse(reply)?;
        if replies.len() != self.entries.len() {
            return Err(unexpected(
                "read-or-lock-many: wrong number of replies",
                &Value::Array(replies),
            ));
        }
        Self::Reply::from_reply(Value::Array(replies))
    }
}

/// `{1, value}`, `{2, fence}` or `{3, lock pttl[, holder's trace]}`.
impl FromReply for (ReadOrLock, Option<HolderTrace>) {
    fn from_reply(reply: Value) -> StoreResult<Self> {
        let mut reply: Vec<Value> = parse(reply)?;
        let holder = match reply.as_slice() {
            [Value::Int(3), _, Value::BulkString(_)] => match reply.pop() {
                Some(Value::BulkString(trace)) => holder_trace(trace),
                _ => None,
            },
            _ => None,
        };
        Ok((entry_reply(reply)?, holder))
    }
}

/// `"<fence> <traceparent>"` as the script stored it (and checked its fence); anything else
/// is no trace.
fn holder_trace(mut stored: Vec<u8>) -> Option<HolderTrace> {
    let space = stored.iter().position(|b| *b == b' ')?;
    let fence = std::str::from_utf8(&stored[..space]).ok()?.parse().ok()?;
    let traceparent = stored.split_off(space + 1);
    Some(HolderTrace { fence, traceparent })
}

/// One entry's answer in a batch's reply, each as [`READ_OR_LOCK`]'s.
impl FromReply for Vec<StoreResult<ReadOrLock>> {
    fn from_reply(reply: Value) -> StoreResult<Self> {
        let replies: Vec<Value> = parse(reply)?;
        Ok(replies
            .into_iter()
            .map(|reply| match reply {
                Value::Array(reply) => entry_reply(reply),
                other => Err(unexpected("read-or-lock-many: unexpected reply", &other)),
            })
            .collect())
    }
}

/// One entry's answer: `{1, value}`, `{2, fence, clock}` or `{3, lock pttl}`. The clock is
/// the value's birth (see [`ReadOrLock::Acquired`]); a store whose clock is elsewhere drops it.
fn entry_reply(reply: Vec<Value>) -> StoreResult<ReadOrLock> {
    match reply.as_slice() {
        [Value::Int(1), Value::BulkString(v)] => Ok(ReadOrLock::Value(v.clone())),
        [Value::Int(2), fence, clock] => match (int(fence), clock_text(clock)) {
            (Some(n), Some(born)) if n > 0 => Ok(ReadOrLock::Acquired {
                fence: n as u64,
                born: Some(born),
            }),
            _ => Err(unexpected(
                "read-or-lock: bad fencing token or clock",
                &Value::Array(reply.clone()),
            )),
        },
        [Value::Int(3), pttl] => Ok(ReadOrLock::Held {
            expires_in: int(pttl)
                .filter(|ms| *ms >= 0)
                .map(|ms| Duration::from_millis(ms as u64)),
        }),
        _ => Err(unexpected(
            "read-or-lock: unexpected reply",
            &Value::Array(reply),
        )),
    }
}

/// An integer reply, or nothing for any other type.
fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

/// The server clock the script sends as text (Lua's numbers would round it), in µs.
fn clock_text(v: &Value) -> Option<u64> {
    match v {
        Value::BulkString(text) => std::str::from_utf8(text).ok()?.parse().ok(),
        _ => None,
    }
}
