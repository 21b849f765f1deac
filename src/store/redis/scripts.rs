//! The Lua scripts behind every compare-and-set in Redis.
//!
//! Each script takes data only through KEYS and ARGV, and every key it touches shares the entry's
//! hash tag, so it runs on one Redis Cluster slot. Wake-up channels are not keys; they travel in
//! ARGV. Scripts are sent by SHA (`EVALSHA`); redis-rs reloads one on `NOSCRIPT`.
//!
//! Explained in the guide: `docs/how-it-works.md` (The scripts).

use std::sync::LazyLock;

use redis::Script;

/// The helpers every script starts with.
///
/// Expiry arguments are milliseconds, and `0` means no expiry: a duration of
/// [`FOREVER`](crate::FOREVER) (the Rust side sends it as 0, see `expiry_ms`), so a key kept for
/// ever is written without `PX` and shows `PTTL` -1.
///
/// `keep_at_least` never shortens a key's life: the fencing counter must live at least as long
/// as every value and lock it guards (the fencing guarantee, `FENCE_RETENTION_LEASES`).
///
/// `bump_fence` bumps the fencing counter. A counter that did not exist (INCR made it 1) is
/// seeded from the server clock in microseconds (`seconds .. zero-padded micros`, built as a
/// string because Lua's number formatting would round it), so that tokens keep rising even
/// after the counter was lost.
///
/// `write_value` carries out an accepted fenced write: `'set'` for `ms`, `'keep'` (the
/// fail-safe's throttled copy: new bytes, a life never shortened and at least `ms`), or a delete.
/// The fencing counter is kept at least as long as the value.
///
/// `announce` tells the near tiers of other instances that an entry changed: `"<fence> <value
/// key>"` on the namespace's near channel, or nothing when the channel is `''` (a lock's own
/// store, which holds no values). It says `"PUBLISH"` in double
/// quotes on purpose: the sharded scripts replace `'PUBLISH'` by `SPUBLISH` for wake-ups, but
/// the near channel is one for the whole namespace, so it must reach every node's subscribers
/// (a cluster's near-tier feed listens to every master; see `store/feed.rs`).
/// Fences are formatted with `%d`: Lua's `..` would print a 16-digit seeded fence as `1.7e+15`.
const PRELUDE: &str = r#"
local function set_expiring(key, value, ms, ...)
  if tonumber(ms) == 0 then
    return redis.call('SET', key, value, ...)
  end
  return redis.call('SET', key, value, 'PX', ms, ...)
end
local function keep_at_least(key, ms)
  local pttl = redis.call('PTTL', key)
  if pttl == -1 or pttl == -2 then
    return
  end
  if tonumber(ms) == 0 then
    redis.call('PERSIST', key)
  elseif pttl < tonumber(ms) then
    redis.call('PEXPIRE', key, ms)
  end
end
local function set_keeping(key, value, ms)
  local pttl = redis.call('PTTL', key)
  if pttl == -2 then
    return set_expiring(key, value, ms)
  end
  redis.call('SET', key, value)
  if pttl > 0 then
    redis.call('PEXPIRE', key, pttl)
    keep_at_least(key, ms)
  end
end
local function write_value(key, fence, how, value, ms)
  if how == 'set' then
    set_expiring(key, value, ms)
    keep_at_least(fence, ms)
  elseif how == 'keep' then
    set_keeping(key, value, ms)
    local pttl = redis.call('PTTL', key)
    if pttl == -1 then
      keep_at_least(fence, 0)
    else
      keep_at_least(fence, pttl)
    end
  else
    redis.call('DEL', key)
  end
end
local function announce(channel, fence, key)
  if channel ~= '' then
    redis.call("PUBLISH", channel, fence .. ' ' .. key)
  end
end
local function bump_fence(fence, retention_ms)
  local n = redis.call('INCR', fence)
  if n == 1 then
    local t = redis.call('TIME')
    local seeded = t[1] .. string.format('%06d', tonumber(t[2]))
    set_expiring(fence, seeded, retention_ms)
    return tonumber(seeded)
  end
  keep_at_least(fence, retention_ms)
  return n
end
local function read_or_lock(value, lock, fence, token, lease_ms, read_value, retention_ms)
  if read_value == '1' then
    local v = redis.pcall('GET', value)
    if type(v) == 'string' then
      return {1, v}
    end
  end
  if set_expiring(lock, token, lease_ms, 'NX') then
    return {2, bump_fence(fence, retention_ms)}
  end
  return {3, redis.call('PTTL', lock)}
end
local function invalidate(value, fence, retention_ms, channel, near_channel)
  local n = bump_fence(fence, retention_ms)
  redis.call('DEL', value)
  announce(near_channel, string.format('%d', n), value)
  redis.call('PUBLISH', channel, '')
end
"#;

/// KEYS: value, lock, fence. ARGV: token, lease ms, read value (1/0), fence retention ms.
/// Returns {1, value} | {2, fence} (lock taken) | {3, lock pttl} (held by another).
/// A value of another Redis type (a list...) reads as a miss, so it gets replaced.
const READ_OR_LOCK: &str = r"
return read_or_lock(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
";

/// The batch form of [`READ_OR_LOCK`]: the same rule for each entry, in one atomic step.
/// KEYS: value, lock, fence of entry 1, then of entry 2, ... ARGV: lease ms, fence retention ms,
/// then token and read value (1/0) of entry 1, of entry 2, ... Returns one reply of
/// `READ_OR_LOCK` per entry, in order.
const READ_OR_LOCK_MANY: &str = r"
local replies = {}
for i = 0, #KEYS / 3 - 1 do
  replies[i + 1] = read_or_lock(KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3],
    ARGV[2 * i + 3], ARGV[1], ARGV[2 * i + 4], ARGV[2])
end
return replies
";

/// KEYS: value, lock, fence. ARGV: token, fence, channel, near channel, 'set' | 'keep' | 'del',
/// value, ttl ms (for 'keep': the least it then lives). Writes (or deletes) only if the fencing counter is still ours: nobody acquired, set
/// or invalidated since. A written value keeps the counter alive at least as long as itself.
/// A write that replaces or deletes a value is announced to the near tiers; a fill of an empty
/// key is not (no near tier can hold a copy of a value that is not there, and announcing every
/// fill is the broadcast storm of JetCache #972). Returns {written, released}.
const STORE_AND_UNLOCK: &str = r"
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
";

/// KEYS: lock, fence. ARGV: token, lease ms, fence retention ms. Returns 1 if extended.
const EXTEND: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if tonumber(ARGV[2]) == 0 then
  redis.call('PERSIST', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
keep_at_least(KEYS[2], ARGV[3])
return 1
";

/// KEYS: lock. ARGV: token, channel. Returns 1 if the lock was ours and is now free.
const UNLOCK: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], '')
return 1
";

/// KEYS: value, fence. ARGV: value, ttl ms, fence retention ms, channel, near channel.
/// Always announced: a `set` is the user's explicit change.
const SET: &str = r"
local fence = bump_fence(KEYS[2], ARGV[3])
set_expiring(KEYS[1], ARGV[1], ARGV[2])
keep_at_least(KEYS[2], ARGV[2])
announce(ARGV[5], string.format('%d', fence), KEYS[1])
redis.call('PUBLISH', ARGV[4], '')
return 1
";

/// KEYS: value, fence. ARGV: fence retention ms, channel, near channel. Always announced, even
/// when no value is there: near copies of a value Redis evicted must go too.
const INVALIDATE: &str = r"
invalidate(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
return 1
";

/// The batch form of [`INVALIDATE`], each entry as there. KEYS: value, fence of entry 1, of
/// entry 2, ... ARGV: fence retention ms, near channel, then the wake-up channel of each entry.
const INVALIDATE_MANY: &str = r"
for i = 0, #KEYS / 2 - 1 do
  invalidate(KEYS[2 * i + 1], KEYS[2 * i + 2], ARGV[1], ARGV[i + 3], ARGV[2])
end
return 1
";

/// KEYS: value (only so that Redis Cluster routes it to the entry's node). ARGV: channel.
/// Wakes the waiters without touching any key: the value store of a split store publishes this
/// when a lock held elsewhere (a Redlock) was freed without a value.
const WAKE: &str = r"
redis.call('PUBLISH', ARGV[1], '')
return 1
";

/// KEYS: last-run. ARGV: fence, keep ms. Records the server's clock as the start of a leader's
/// run under `fence` ("fence ms"), unless a run of a newer term (a higher fence) is recorded:
/// a paused old leader cannot move the schedule back. Returns 1 if recorded.
const RECORD_RUN: &str = r"
local current = redis.call('GET', KEYS[1])
if current then
  local fence = tonumber(string.match(current, '^(%d+) '))
  if fence and fence > tonumber(ARGV[1]) then
    return 0
  end
end
local t = redis.call('TIME')
local ms = t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000))
set_expiring(KEYS[1], ARGV[1] .. ' ' .. ms, ARGV[2])
return 1
";

/// KEYS: last-run. Returns how many milliseconds ago, by the server's clock, the last recorded
/// run started, or -1 if none is recorded.
const SINCE_LAST_RUN: &str = r"
local current = redis.call('GET', KEYS[1])
local ran = current and tonumber(string.match(current, ' (%d+)$'))
if not ran then
  return -1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return math.max(0, now - ran)
";

/// KEYS: fence. ARGV: floor, fence retention ms. Raises the counter to at least `floor`.
const RAISE_FENCE: &str = r"
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then
  set_keeping(KEYS[1], ARGV[1], ARGV[2])
else
  keep_at_least(KEYS[1], ARGV[2])
end
return 1
";

/// KEYS: fence. ARGV: fence retention ms. Returns the bumped counter.
const NEXT_FENCE: &str = r"
return bump_fence(KEYS[1], ARGV[1])
";

/// KEYS: value, fence. ARGV: fence, fence retention ms, channel, near channel,
/// 'set' | 'keep' | 'del', value, ttl ms. Writes (or deletes) unless the counter is above `fence`
/// (a newer token or an invalidation came since), and records `fence`; the counter lives at least
/// as long as the value, so the rule holds for it. A write is always announced: its callers (a
/// `set` over a Redlock) make explicit changes. Returns 1 if written.
const WRITE_FENCED: &str = r"
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
";

/// The scripts for one way of publishing wake-ups: `PUBLISH` on a single server, `SPUBLISH`
/// (sharded pub/sub, Redis 7) on a cluster, where the channel shares the entry's hash tag and so
/// stays on the slot's node instead of being broadcast to every node.
pub(crate) struct Scripts {
    pub read_or_lock: Script,
    pub read_or_lock_many: Script,
    pub store_and_unlock: Script,
    pub extend: Script,
    pub unlock: Script,
    pub set: Script,
    pub invalidate: Script,
    pub invalidate_many: Script,
    pub raise_fence: Script,
    pub next_fence: Script,
    pub write_fenced: Script,
    pub wake: Script,
    pub record_run: Script,
    pub since_last_run: Script,
}

impl Scripts {
    fn new(publish: &str) -> Self {
        let script =
            |body: &str| Script::new(&format!("{PRELUDE}{body}").replace("'PUBLISH'", publish));
        Scripts {
            read_or_lock: script(READ_OR_LOCK),
            read_or_lock_many: script(READ_OR_LOCK_MANY),
            store_and_unlock: script(STORE_AND_UNLOCK),
            extend: script(EXTEND),
            unlock: script(UNLOCK),
            set: script(SET),
            invalidate: script(INVALIDATE),
            invalidate_many: script(INVALIDATE_MANY),
            raise_fence: script(RAISE_FENCE),
            next_fence: script(NEXT_FENCE),
            write_fenced: script(WRITE_FENCED),
            wake: script(WAKE),
            record_run: script(RECORD_RUN),
            since_last_run: script(SINCE_LAST_RUN),
        }
    }
}

/// Hashed once per process: for a single server.
pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts::new("'PUBLISH'"));

/// For Redis Cluster: wake-ups by sharded pub/sub.
pub(crate) static SHARDED_SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts::new("'SPUBLISH'"));
