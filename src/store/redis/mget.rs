//! `MGET` of keys that may lie on several slots of a Redis Cluster: one `MGET` per slot, all sent
//! at once, the answers put back in the order asked.
//!
//! The Redis client can split a multi-slot `MGET` by itself, but after a failover (two slots now
//! on one node, a redirection) it failed every such request with "Mismatch in the number of
//! multi-slot results" until the process restarted (redis-rs 1.8.1; found by
//! `tests/cluster.rs`, `a_killed_master_fails_over_and_calls_recover_without_wrong_values`, once
//! every read asked for the namespace's epoch beside its value). A request per slot is routed
//! and redirected like any single-slot command.

use std::collections::HashMap;

use redis::aio::ConnectionLike;
use redis::cluster_routing::Slot;
use redis::Value;

use super::scripts::unexpected;
use crate::join::join_all;
use crate::store::{StoreError, StoreResult};

/// The values of `keys`, in order (`None` for a missing key or one of another type); one
/// request per slot when `per_slot` (a cluster), one request otherwise.
pub(crate) async fn mget<C>(
    conn: &C,
    keys: &[&str],
    per_slot: bool,
) -> StoreResult<Vec<Option<Vec<u8>>>>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    if !per_slot {
        return mget_one_slot(conn, keys).await;
    }
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut group_of: HashMap<Slot, usize> = HashMap::new();
    for (at, key) in keys.iter().enumerate() {
        let group = *group_of.entry(Slot::for_key(key)).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[group].push(at);
    }
    if groups.len() == 1 {
        return mget_one_slot(conn, keys).await;
    }
    let requests = groups.iter().map(|group| {
        let keys: Vec<&str> = group.iter().map(|&at| keys[at]).collect();
        async move { mget_one_slot(conn, &keys).await }
    });
    let mut values: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
    for (group, answer) in groups.iter().zip(join_all(requests.collect()).await) {
        for (&at, value) in group.iter().zip(answer?) {
            values[at] = value;
        }
    }
    Ok(values)
}

/// The values of `values` in order, then each epoch of `names` read as a number (0 when
/// absent; bytes that are not a number are another program's: read as the highest epoch, so
/// every value it judges is gone, until `raise_epochs` repairs it), in one `MGET` (per slot
/// on a cluster).
pub(crate) async fn values_and_epochs<C>(
    conn: &C,
    values: &[&str],
    names: &[String],
    per_slot: bool,
) -> StoreResult<(Vec<Option<Vec<u8>>>, Vec<u64>)>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let keys: Vec<&str> = (values.iter().copied())
        .chain(names.iter().map(String::as_str))
        .collect();
    let mut found = mget(conn, &keys, per_slot).await?;
    let epochs = (found.split_off(values.len()).iter())
        .zip(names)
        .map(|(epoch, name)| parse_epoch(name, epoch.as_deref()))
        .collect();
    Ok((found, epochs))
}

/// One `MGET` (the keys share a slot, or the server is not a cluster).
async fn mget_one_slot<C>(conn: &C, keys: &[&str]) -> StoreResult<Vec<Option<Vec<u8>>>>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut mget = redis::cmd("MGET");
    for key in keys {
        mget.arg(*key);
    }
    // MGET answers nil for a key of another Redis type: a miss, as for `GET`.
    let values: Vec<Option<Vec<u8>>> = mget
        .query_async(&mut conn.clone())
        .await
        .map_err(|e| StoreError::from(e).about(keys.first().copied().unwrap_or("")))?;
    if values.len() != keys.len() {
        return Err(unexpected("mget: wrong number of values", &Value::Nil));
    }
    Ok(values)
}

/// One read of a value and its epochs on one server (not a cluster: the keys may lie on other
/// slots): `MGET value names...`, the command sized up front and its reply taken apart in
/// place, so that a hit allocates nothing beyond what it returns (the value's bytes and its
/// epochs). Errors and odd replies go through [`mget_one_slot`]'s conversion, as before.
pub(crate) async fn value_with_epochs<C>(
    conn: &C,
    value: &str,
    names: &[String],
) -> StoreResult<(Option<Vec<u8>>, Vec<u64>)>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let data = 4 + value.len() + names.iter().map(String::len).sum::<usize>();
    let mut mget = redis::Cmd::with_capacity(2 + names.len(), data);
    mget.arg("MGET").arg(value);
    for name in names {
        mget.arg(name.as_str());
    }
    let reply = conn
        .clone()
        .req_packed_command(&mget)
        .await
        .map_err(|e| StoreError::from(e).about(value))?;
    let mut items = match reply {
        Value::Array(items) if items.len() == names.len() + 1 => items.into_iter(),
        // An error reply, or one of another shape: judged as `mget_one_slot` judges it.
        other => {
            let values = converted(other).map_err(|e| StoreError::from(e).about(value))?;
            if values.len() != names.len() + 1 {
                return Err(unexpected("mget: wrong number of values", &Value::Nil));
            }
            return Ok(split(values, names));
        }
    };
    let found = items.next().and_then(bytes);
    let epochs = names
        .iter()
        .zip(items)
        .map(|(name, item)| parse_epoch(name, bytes(item).as_deref()))
        .collect();
    Ok((found, epochs))
}

/// A value as `MGET` answers it: bytes, or `None` for a missing key (or one of another type).
fn bytes(item: Value) -> Option<Vec<u8>> {
    match item {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.into_bytes()),
        _ => None,
    }
}

/// A reply as `query_async` converts it: an error reply as its error.
fn converted(reply: Value) -> redis::RedisResult<Vec<Option<Vec<u8>>>> {
    Ok(redis::from_redis_value(reply.extract_error()?)?)
}

/// The value and the epochs out of a converted `MGET` reply.
fn split(mut values: Vec<Option<Vec<u8>>>, names: &[String]) -> (Option<Vec<u8>>, Vec<u64>) {
    let epochs = values
        .split_off(1)
        .iter()
        .zip(names)
        .map(|(epoch, name)| parse_epoch(name, epoch.as_deref()))
        .collect();
    (values.pop().flatten(), epochs)
}

/// An epoch as `MGET` read it (see `RedisStore::mget` and the coalescer).
pub(crate) fn parse_epoch(name: &str, bytes: Option<&[u8]>) -> u64 {
    let Some(bytes) = bytes else { return 0 };
    match std::str::from_utf8(bytes)
        .ok()
        .and_then(|text| text.parse().ok())
    {
        Some(epoch) => epoch,
        None => {
            crate::log::throttled!(warn, epoch = %name, "the epoch holds bytes that are not a number (another program's?); every value it judges counts as gone until it is raised again");
            u64::MAX
        }
    }
}
