//! The hit benches' baseline: a raw redis-rs `GET` + bincode decode of the load generator's
//! value, on a `ConnectionManager` with the library's time-outs, so that only the library's own
//! work differs between the two sides. Needs `server` and `load` declared beside it.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::load::value;
use super::server::RedisServer;

/// The library's codec configuration (bincode 2 standard, 64 MiB limit).
const BINCODE: bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<{ stampede_guard::MAX_VALUE_BYTES }>,
> = bincode::config::standard().with_limit::<{ stampede_guard::MAX_VALUE_BYTES }>();

/// A connection to `server` as the library's data connection is set up, with the value written
/// under `key` as bincode.
pub async fn raw_connection(server: &RedisServer, key: &str) -> ConnectionManager {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(5)));
    let client = redis::Client::open(server.url()).expect("the URL");
    let mut conn = ConnectionManager::new_with_config(client, config)
        .await
        .expect("a raw connection");
    let bytes = bincode::serde::encode_to_vec(value(), BINCODE).expect("encode");
    redis::cmd("SET")
        .arg(key)
        .arg(bytes)
        .exec_async(&mut conn)
        .await
        .expect("SET the raw key");
    conn
}

/// One raw hit: `GET key` and the bytes decoded.
pub async fn raw_hit(conn: &ConnectionManager, key: &str) -> String {
    let bytes: Option<Vec<u8>> = redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn.clone())
        .await
        .expect("GET");
    let bytes = bytes.expect("the raw key is warm");
    bincode::serde::decode_from_slice(&bytes, BINCODE)
        .expect("decode")
        .0
}
