//! Waiting for a fleet's near tiers to come up, before a bench counts what they cost.

use std::time::{Duration, Instant};

use stampede_guard::{Cache, TrackingState};

/// Waits until every cache's near-tier feed is proven current (and tracking, if `tracking`):
/// until then a tier serves nothing and its connections are still being set up, which a
/// measurement would count. Panics after 60 s, with the health report of the first cache
/// whose feed did not come up.
pub async fn wait_for_near_feeds(fleet: &[Cache], tracking: bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    for cache in fleet {
        loop {
            let health = cache.health().await;
            let tracked = !tracking || health.near_tracking == Some(TrackingState::On);
            if health.near_feed_proven == Some(true) && tracked {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "a feed never came up: {health:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
