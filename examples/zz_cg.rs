// scratch: callgrind per-hit client instructions (not committed)
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use stampede_guard::Cache;
use std::time::Duration;
const BINCODE: bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<{ stampede_guard::MAX_VALUE_BYTES }>,
> = bincode::config::standard().with_limit::<{ stampede_guard::MAX_VALUE_BYTES }>();
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url = &args[1];
    let side = &args[2];
    let n: u64 = args[3].parse().unwrap();
    let inflight: u64 = args[4].parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let value = "x".repeat(1024);
        if side == "g" {
            let cache = Cache::builder()
                .redis_url(url.as_str())
                .namespace("cg")
                .build()
                .await
                .unwrap();
            let _ = cache
                .set("k", &value, Duration::from_secs(3600))
                .await
                .unwrap();
            let mut set = tokio::task::JoinSet::new();
            for _ in 0..inflight {
                let c = cache.clone();
                set.spawn(async move {
                    for _ in 0..n / inflight {
                        let v: String = c
                            .get_or_compute("k", Duration::from_secs(3600), || async {
                                Err::<String, _>("no")
                            })
                            .await
                            .unwrap();
                        std::hint::black_box(v);
                    }
                });
            }
            while set.join_next().await.is_some() {}
        } else {
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(2)))
                .set_response_timeout(Some(Duration::from_secs(5)));
            let client = redis::Client::open(url.as_str()).unwrap();
            let mut raw = ConnectionManager::new_with_config(client, config)
                .await
                .unwrap();
            let bytes = bincode::serde::encode_to_vec(&value, BINCODE).unwrap();
            redis::cmd("SET")
                .arg("raw")
                .arg(bytes)
                .exec_async(&mut raw)
                .await
                .unwrap();
            let mut set = tokio::task::JoinSet::new();
            for _ in 0..inflight {
                let mut r = raw.clone();
                set.spawn(async move {
                    for _ in 0..n / inflight {
                        let b: Option<Vec<u8>> = redis::cmd("GET")
                            .arg("raw")
                            .query_async(&mut r)
                            .await
                            .unwrap();
                        let (v, _): (String, usize) =
                            bincode::serde::decode_from_slice(&b.unwrap(), BINCODE).unwrap();
                        std::hint::black_box(v);
                    }
                });
            }
            while set.join_next().await.is_some() {}
        }
    });
}
