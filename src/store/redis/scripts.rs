//! The Lua scripts behind every compare-and-set in Redis, one file per script: its Lua text, and
//! beside it the typed call ([`ScriptCall`]) that builds its KEYS and ARGV and reads its reply,
//! so each script's contract is written once. Shared here: the prelude of Lua helpers every
//! script starts with, how a call is run, the builder of its KEYS and ARGV ([`Args`], which also
//! encodes a fenced write), and what the replies several scripts give mean ([`FromReply`]).
//!
//! Each script takes data only through KEYS and ARGV, and every key it touches shares the entry's
//! hash tag, so it runs on one Redis Cluster slot. Wake-up channels are not keys; they travel in
//! ARGV. Scripts are sent by SHA (`EVALSHA`), loaded once on `NOSCRIPT` (see `run`). The order of
//! KEYS and ARGV is part of the contract beyond the Lua text: the chaos test's checker replays
//! the scripts' commands as the server's `MONITOR` prints them.
//!
//! Explained in the guide: `docs/how-it-works.md` (The scripts).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{
    ErrorKind, FromRedisValue, RedisError, Script, ScriptInvocation, ServerErrorKind, ToRedisArgs,
    Value,
};

use crate::store::{expiry_ms, retention, StoreError, StoreResult, Write};
use crate::wire::key::EntryKeys;

mod epoch;
mod extend;
mod invalidate;
mod next_fence;
mod peek;
mod raise_fence;
mod read_or_lock;
mod record_run;
mod set;
mod since_last_run;
mod store_and_unlock;
mod unlock;
mod wake;
mod write_fenced;

pub(crate) use epoch::{ClockCall, RaiseEpochCall};
pub(crate) use extend::ExtendCall;
pub(crate) use invalidate::{InvalidateCall, InvalidateManyCall};
pub(crate) use next_fence::NextFenceCall;
pub(crate) use peek::PeekCall;
pub(crate) use raise_fence::RaiseFenceCall;
pub(crate) use read_or_lock::{ReadOrLockCall, ReadOrLockManyCall};
pub(crate) use record_run::RecordRunCall;
pub(crate) use set::SetCall;
pub(crate) use since_last_run::SinceLastRunCall;
pub(crate) use store_and_unlock::StoreAndUnlockCall;
pub(crate) use unlock::UnlockCall;
pub(crate) use wake::WakeCall;
pub(crate) use write_fenced::WriteFencedCall;

/// The helpers every script starts with.
///
/// Expiry arguments are milliseconds, and `0` means no expiry: a duration of
/// [`FOREVER`](crate::FOREVER) (the Rust side sends it as 0, see `expiry_ms`), so a key kept for
/// ever is written without `PX` and shows `PTTL` -1.
///
/// `keep_at_least` never shortens a key's life: the fencing counter must live at least as long
/// as every value and lock it guards (the fencing guarantee, `FENCE_RETENTION_LEASES`). One
/// command where it can: `PERSIST` (a no-op on a key without expiry or no key), and on Redis 7+
/// `PEXPIRE ... GT` (a key without expiry counts as living for ever, so it is left alone);
/// before 7 (no `GT`, no `redis.REDIS_VERSION_NUM`), `PTTL` first.
///
/// `bump_fence` hands out max(counter + 1, the server clock in microseconds) and stores it as the
/// counter (`SET ... KEEPTTL`: the counter keeps its life, then `keep_at_least` as for any
/// bump). The clock is `seconds .. zero-padded micros`, built as a string because Lua's number
/// formatting would round it, and so would some servers' own writing of a number argument
/// (Redis 7.2.0-7.2.4 write a round clock as `1.7e+15`), and compared with `tonumber` (exact:
/// µs tokens are far below 2^53). A counter that did not exist (INCR made it 1) is the clock,
/// with the retention as its life. The clock is why a failover cannot hand a token out twice:
/// replication is asynchronous, so the new master may lack the old one's last bumps, but every
/// token the old master handed out was at most its clock then, and a failover takes longer than
/// the nodes' clocks disagree (NTP), so the new master's next token is above them all. Within one
/// µs the counter + 1 keeps tokens strictly increasing. It also returns the clock it read (as text),
/// which `read_or_lock` sends back with a granted lock: on one server that is the namespace's
/// clock, the new value's birth, read without a request of its own.
///
/// `write_value` carries out an accepted fenced write: `'set'` for `ms`, `'keep'` (the
/// fail-safe's throttled copy: new bytes, a life never shortened and at least `ms`), or a delete.
/// The fencing counter is kept at least as long as the value.
///
/// No number goes to `redis.call` as a Lua number: every one is text (`ARGV`, or `%d`).
/// Redis 7.2.0-7.2.4 and Valkey 7.2.5 write a Lua number argument with `fpconv_dtoa` alone,
/// which writes one ending in eight zeros in exponent form: a `'keep'` of exactly 100,000 s
/// reads its `PTTL` back as 100000000 (the script's clock stands still), and `1e+08` would
/// fail the `PEXPIRE`, and with it the write.
///
/// `announce` tells the near tiers of other instances that an entry changed: `"<fence> <value
/// key>"` on the namespace's near channel, or nothing when the channel is `''` (a lock's own
/// store, which holds no values). It says `"PUBLISH"` in double
/// quotes on purpose: the sharded scripts replace `'PUBLISH'` by `SPUBLISH` for wake-ups, but
/// the near channel is one for the whole namespace, so it must reach every node's subscribers
/// (a cluster's near-tier feed listens to every master; see `store/redis/feed.rs`).
/// Fences are formatted with `%d`: Lua's `..` would print a 16-digit seeded fence as `1.7e+15`.
const PRELUDE: &str = r#"
local function set_expiring(key, value, ms, ...)
  if tonumber(ms) == 0 then
    return redis.call('SET', key, value, ...)
  end
  return redis.call('SET', key, value, 'PX', ms, ...)
end
local expire_gt = (tonumber(redis.REDIS_VERSION_NUM) or 0) >= 0x070000
local function keep_at_least(key, ms)
  if tonumber(ms) == 0 then
    redis.call('PERSIST', key)
    return
  end
  if expire_gt then
    redis.call('PEXPIRE', key, ms, 'GT')
    return
  end
  local pttl = redis.call('PTTL', key)
  if pttl >= 0 and pttl < tonumber(ms) then
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
    redis.call('PEXPIRE', key, string.format('%d', pttl))
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
      keep_at_least(fence, string.format('%d', pttl))
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
  local t = redis.call('TIME')
  local now = t[1] .. string.format('%06d', tonumber(t[2]))
  if n == 1 then
    set_expiring(fence, now, retention_ms)
    return tonumber(now), now
  end
  if tonumber(now) > n then
    redis.call('SET', fence, now, 'KEEPTTL')
    n = tonumber(now)
  end
  keep_at_least(fence, retention_ms)
  return n, now
end
local function read_or_lock(value, lock, fence, token, lease_ms, read_value, retention_ms)
  if read_value == '1' then
    local v = redis.pcall('GET', value)
    if type(v) == 'string' then
      return {1, v}
    end
  end
  if set_expiring(lock, token, lease_ms, 'NX') then
    local n, now = bump_fence(fence, retention_ms)
    return {2, n, now}
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

/// One call of one script, typed: which script, its KEYS and ARGV in the order its Lua text reads
/// them, and what its reply means. Implemented once per script, beside its Lua text.
pub(crate) trait ScriptCall {
    /// What the reply means: read as its type says ([`FromReply`]), unless the call overrides
    /// [`decode`](Self::decode).
    type Reply: FromReply;

    /// The script.
    const LUA: &'static Lua;

    /// Adds this call's KEYS and ARGV, and with them the key its error names.
    fn encode<'a>(&'a self, args: &mut Args<'a>);

    /// Reads the script's reply; one that breaks the script's contract is an error.
    fn decode(&self, reply: Value) -> StoreResult<Self::Reply> {
        Self::Reply::from_reply(reply)
    }
}

/// Runs `call` over `conn` by SHA. A server that does not know the script (`NOSCRIPT`: new,
/// restarted, failed over, flushed) has it loaded once for all the calls that met that together
/// ([`Lua::load`]), then the call is sent again; its `EVALSHA` ran nothing.
pub(crate) async fn run<S, C>(scripts: Scripts, call: S, conn: &mut C) -> StoreResult<S::Reply>
where
    S: ScriptCall,
    C: ConnectionLike,
{
    let args = Args::of(&call, scripts);
    let mut pipe = redis::pipe();
    pipe.invoke_script(args.invocation());
    let Some(evalsha) = pipe.cmd_iter().next() else {
        return Err(unexpected("a script call without its EVALSHA", &Value::Nil));
    };
    let mut loading = S::LUA.loading(scripts);
    let mut reply = send(evalsha, conn).await;
    while matches!(&reply, Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)) {
        match S::LUA.reload(&mut loading, args.invocation(), conn).await {
            Ok(true) => reply = send(evalsha, conn).await,
            Ok(false) => break,
            Err(e) => return Err(args.name(e.into())),
        }
    }
    match reply {
        Ok(reply) => call.decode(reply),
        Err(e) => Err(args.name(e.into())),
    }
}

/// One command's reply, a server's error in it as the error (as `query_async` reads it).
async fn send<C: ConnectionLike>(cmd: &redis::Cmd, conn: &mut C) -> Result<Value, RedisError> {
    conn.req_packed_command(cmd).await?.extract_error()
}

/// One call's loads of its script after `NOSCRIPT` (see [`Lua::reload`]).
pub(super) struct Loading {
    scripts: Scripts,
    /// The loads this process had finished before the call was sent.
    seen: Option<u64>,
    tries: u8,
}

/// The loads of one script in one set of [`Scripts`] by this process: one at a time, counted.
struct Loads {
    gate: tokio::sync::Mutex<()>,
    done: AtomicU64,
}

impl Loads {
    const fn new() -> Self {
        Loads {
            gate: tokio::sync::Mutex::const_new(()),
            done: AtomicU64::new(0),
        }
    }
}

/// A script's Lua text (after the prelude), hashed on first use for each set of [`Scripts`].
/// Declared as a `static` beside its call, so each is hashed once per process.
pub(crate) struct Lua {
    body: &'static str,
    plain: OnceLock<Script>,
    sharded: OnceLock<Script>,
    plain_loads: Loads,
    sharded_loads: Loads,
}

/// The script whose text is the prelude, then `body`.
const fn lua(body: &'static str) -> Lua {
    Lua {
        body,
        plain: OnceLock::new(),
        sharded: OnceLock::new(),
        plain_loads: Loads::new(),
        sharded_loads: Loads::new(),
    }
}

impl Lua {
    /// A call's leave to load the script after `NOSCRIPT` ([`reload`](Self::reload)), taken
    /// before the call is sent: a load that ends after it is the one the call needs.
    pub(super) fn loading(&self, scripts: Scripts) -> Loading {
        Loading {
            scripts,
            seen: Some(self.loads(scripts).done.load(Ordering::Acquire)),
            tries: 0,
        }
    }

    /// After a call of the script met `NOSCRIPT`: loads it, first through the load the calls
    /// that met it together share ([`load`](Self::load)), then, if the server still lacks it
    /// (that load was for another server), with a load of this call's own. `Ok(true)`: send
    /// the call again; `Ok(false)`: both tries are spent, the `NOSCRIPT` stands.
    pub(super) async fn reload<C: ConnectionLike>(
        &self,
        loading: &mut Loading,
        invocation: &ScriptInvocation<'_>,
        conn: &mut C,
    ) -> Result<bool, RedisError> {
        if loading.tries == 2 {
            return Ok(false);
        }
        let seen = if loading.tries == 0 {
            loading.seen
        } else {
            None
        };
        loading.tries += 1;
        self.load(loading.scripts, seen, invocation, conn).await?;
        Ok(true)
    }

    fn loads(&self, scripts: Scripts) -> &Loads {
        match scripts {
            Scripts::Plain => &self.plain_loads,
            Scripts::Sharded => &self.sharded_loads,
        }
    }

    /// Loads the script over `conn` for a call that met `NOSCRIPT`, one load at a time: the
    /// calls that met it together (a batch's chunks, every caller after a restart) wait for one
    /// load rather than each sending their own (`SCRIPT LOAD` compiles the script: the server's
    /// costliest command here). `seen`: how many loads the call had seen before it was sent; if
    /// one ended since, it is taken as the load the call needs and none is sent.
    async fn load<C: ConnectionLike>(
        &self,
        scripts: Scripts,
        seen: Option<u64>,
        invocation: &ScriptInvocation<'_>,
        conn: &mut C,
    ) -> Result<(), RedisError> {
        let loads = self.loads(scripts);
        let _turn = loads.gate.lock().await;
        if seen.is_some_and(|seen| loads.done.load(Ordering::Acquire) != seen) {
            return Ok(());
        }
        invocation.load_async(conn).await?;
        loads.done.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// The script as the set `scripts` sends it: prefixed with the prelude, with its wake-up
    /// command.
    fn script(&self, scripts: Scripts) -> &Script {
        let (cell, publish) = match scripts {
            Scripts::Plain => (&self.plain, "'PUBLISH'"),
            Scripts::Sharded => (&self.sharded, "'SPUBLISH'"),
        };
        cell.get_or_init(|| {
            let text = format!("{}{}", prelude_for(self.body), self.body);
            Script::new(&text.replace("'PUBLISH'", publish))
        })
    }
}

/// The helpers of [`PRELUDE`] that `body` calls, with those they call, in the prelude's order.
/// Lua builds every `local function` of a script on each run (a closure each): a script that
/// carried them all would pay for the ones it never calls, on every call. A helper only calls
/// helpers above it, so one pass from the last up finds them all; a name that merely appears
/// in a longer one includes a helper too many, never one too few.
fn prelude_for(body: &str) -> String {
    let mut helpers: Vec<&str> = Vec::new();
    let mut rest = PRELUDE;
    while let Some(at) = rest[1..].find("\nlocal ") {
        helpers.push(&rest[..=at]);
        rest = &rest[at + 1..];
    }
    helpers.push(rest);
    let mut needed = body.to_owned();
    let mut kept = vec![false; helpers.len()];
    for (i, helper) in helpers.iter().enumerate().rev() {
        let name = helper
            .trim_start()
            .trim_start_matches("local ")
            .trim_start_matches("function ")
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .next()
            .unwrap_or_default();
        if !name.is_empty() && needed.contains(name) {
            kept[i] = true;
            needed.push_str(helper);
        }
    }
    helpers
        .iter()
        .zip(kept)
        .filter_map(|(helper, kept)| kept.then_some(*helper))
        .collect()
}

/// Every script by name, with its SHA1 as each set ([`Scripts`]) sends it: for the test that
/// reads on the server which keys each script touches (`tests/script_keys.rs`), through
/// `__private::script_names`.
pub(crate) fn named_shas() -> Vec<(&'static str, String)> {
    let every: [(&'static str, &'static Lua); 17] = [
        ("clock", ClockCall::LUA),
        ("raise_epoch", RaiseEpochCall::LUA),
        ("extend", ExtendCall::LUA),
        ("invalidate", InvalidateCall::LUA),
        ("invalidate_many", InvalidateManyCall::LUA),
        ("next_fence", NextFenceCall::LUA),
        ("peek", PeekCall::LUA),
        ("raise_fence", RaiseFenceCall::LUA),
        ("read_or_lock", ReadOrLockCall::LUA),
        ("read_or_lock_many", ReadOrLockManyCall::LUA),
        ("record_run", RecordRunCall::LUA),
        ("set", SetCall::LUA),
        ("since_last_run", SinceLastRunCall::LUA),
        ("store_and_unlock", StoreAndUnlockCall::LUA),
        ("unlock", UnlockCall::LUA),
        ("wake", WakeCall::LUA),
        ("write_fenced", WriteFencedCall::LUA),
    ];
    every
        .into_iter()
        .flat_map(|(name, lua)| {
            [Scripts::Plain, Scripts::Sharded]
                .map(|scripts| (name, lua.script(scripts).get_hash().to_owned()))
        })
        .collect()
}

/// Who hears of a write: the entry's waiters, on its wake-up channel, and the near tiers of the
/// namespace's other instances, on its near channel. Sent as two ARGV, in that order.
#[derive(Clone, Copy)]
pub(crate) struct Told<'a> {
    /// The entry's wake-up channel.
    pub(crate) channel: &'a str,
    /// The namespace's near channel, or `""`: nobody (a lock's own store).
    pub(crate) near_channel: &'a str,
}

/// An entry's key, as a script's KEYS name it.
#[derive(Clone, Copy)]
pub(crate) enum Key {
    /// The value.
    Value,
    /// The lock.
    Lock,
    /// The fencing counter.
    Fence,
    /// A leader's last recorded run.
    LastRun,
    /// The lock holder's trace context (the `opentelemetry` feature).
    Trace,
}

/// One call's KEYS and ARGV, as its [`ScriptCall::encode`] adds them, and the key its error
/// names.
pub(crate) struct Args<'a> {
    invocation: ScriptInvocation<'static>,
    /// The value key the call is about (a batch's first entry's).
    about: Option<&'a str>,
}

impl<'a> Args<'a> {
    /// `call`'s arguments, for its script in the set `scripts`.
    pub(super) fn of<S: ScriptCall>(call: &'a S, scripts: Scripts) -> Self {
        let mut args = Args {
            invocation: S::LUA.script(scripts).prepare_invoke(),
            about: None,
        };
        call.encode(&mut args);
        args
    }

    /// The keys `roles` of `entry`, in order, as KEYS; the call is about the entry's value key
    /// (a batch's: its first entry's).
    fn entry<const N: usize>(&mut self, entry: &'a EntryKeys, roles: [Key; N]) -> &mut Self {
        self.about.get_or_insert(&entry.value);
        for role in roles {
            match role {
                Key::Value => self.invocation.key(&entry.value),
                Key::Lock => self.invocation.key(entry.lock()),
                Key::Fence => self.invocation.key(entry.fence()),
                Key::LastRun => self.invocation.key(entry.last_run()),
                Key::Trace => self.invocation.key(entry.trace()),
            };
        }
        self
    }

    /// `key` as KEYS, for a call about no entry (an epoch): its error names it.
    fn named(&mut self, key: &'a str) -> &mut Self {
        self.about.get_or_insert(key);
        self.invocation.key(key);
        self
    }

    /// `arg` as ARGV (a tuple: each of its items, in order).
    fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.invocation.arg(arg);
        self
    }

    /// The ARGV of a fenced write, which the prelude's `write_value` reads: `'set', bytes, ttl
    /// ms`, `'keep', bytes, at least ms` or `'del'`.
    fn write(&mut self, write: &Write) -> &mut Self {
        match write {
            Write::Value { bytes, ttl } => self.arg(("set", bytes, expiry_ms(*ttl))),
            Write::Delete => self.arg("del"),
            Write::Keep { bytes, at_least } => self.arg(("keep", bytes, expiry_ms(*at_least))),
        }
    }

    /// The script and its arguments, to send.
    pub(super) fn invocation(&self) -> &ScriptInvocation<'static> {
        &self.invocation
    }

    /// The key the call is about, if any.
    pub(super) fn about(&self) -> Option<&'a str> {
        self.about
    }

    /// `error`, naming the key the call is about.
    pub(super) fn name(&self, error: StoreError) -> StoreError {
        match self.about {
            Some(key) => error.about(key),
            None => error,
        }
    }
}

/// What a script's reply means, by the type it is read as: said once for each reply several
/// scripts share here, and for a script's own answer beside it.
pub(crate) trait FromReply: Sized {
    /// Reads `reply`; one that breaks the script's contract is an error.
    fn from_reply(reply: Value) -> StoreResult<Self>;
}

/// A script that answers only that it ran (an integer, 1).
impl FromReply for () {
    fn from_reply(reply: Value) -> StoreResult<()> {
        parse::<i64>(reply).map(drop)
    }
}

/// A yes or no: 1 is yes, any other integer no.
impl FromReply for bool {
    fn from_reply(reply: Value) -> StoreResult<bool> {
        Ok(parse::<i64>(reply)? == 1)
    }
}

/// A number the script returns as an integer (a fencing token).
impl FromReply for u64 {
    fn from_reply(reply: Value) -> StoreResult<u64> {
        parse(reply)
    }
}

/// Reads a reply as `T`, as `invoke_async::<T>` would have.
fn parse<T: FromRedisValue>(reply: Value) -> StoreResult<T> {
    Ok(redis::from_redis_value(reply).map_err(RedisError::from)?)
}

/// A reply that breaks a command's contract, as a store error naming `what` and showing `got`.
pub(crate) fn unexpected(what: &'static str, got: &Value) -> StoreError {
    StoreError::from(RedisError::from((
        ErrorKind::UnexpectedReturnType,
        what,
        format!("{got:?}"),
    )))
}

/// The fence retention argument of a script run under `lease`.
fn retention_ms(lease: Duration) -> u64 {
    expiry_ms(retention(lease))
}

/// A yes/no argument, as the scripts compare it (`'1'`).
fn flag(yes: bool) -> &'static str {
    if yes {
        "1"
    } else {
        "0"
    }
}

/// The set of scripts for one way of publishing wake-ups: `PUBLISH` on a single server,
/// `SPUBLISH` (sharded pub/sub, Redis 7) on a cluster, where the channel shares the entry's hash
/// tag and so stays on the slot's node instead of being broadcast to every node. A script is run
/// only through its [`ScriptCall`], so its arguments are built in one place.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Scripts {
    /// A single server.
    Plain,
    /// Redis Cluster: wake-ups by sharded pub/sub.
    Sharded,
}

#[cfg(test)]
mod tests {
    use super::prelude_for;

    #[test]
    fn a_script_carries_the_helpers_it_calls_and_theirs_only() {
        let prelude = prelude_for("return read_or_lock(KEYS[1])");
        for used in [
            "function set_expiring",
            "expire_gt =",
            "function keep_at_least",
            "function bump_fence",
            "function read_or_lock",
        ] {
            assert!(prelude.contains(used), "{used} missing from {prelude}");
        }
        for unused in [
            "function write_value",
            "function announce",
            "function invalidate",
        ] {
            assert!(!prelude.contains(unused), "{unused} carried in {prelude}");
        }
        assert!(prelude_for("return 1").is_empty());
    }
}
