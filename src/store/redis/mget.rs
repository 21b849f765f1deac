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

/// An epoch as `MGET` read it (see `RedisStore::mget` and the coalescer).
pub(crate) fn parse_epoch(name: &str, bytes: Option<&[u8]>) -> u64 {
    let Some(bytes) = bytes else { return 0 };
    match std::str::from_utf8(bytes)
        .ok()
        .and_then(|text| text.parse().ok())
    {
        Some(epoch) => epoch,
        None => {
            tracing::warn!(epoch = %name, "the epoch holds bytes that are not a number (another program's?); every value it judges counts as gone until it is raised again");
            u64::MAX
        }
    }
}
