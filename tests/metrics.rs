//! With the `metrics` feature, a cache's events reach the `metrics` facade. In a test binary of
//! its own: the recorder is global to the process, so no other test may run beside it.
#![cfg(feature = "metrics")]

use std::time::Duration;

use stampede_guard::Cache;

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test(start_paused = true)]
async fn with_the_metrics_feature_events_reach_the_metrics_facade() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // Installed for this test binary, which runs this one test.
    recorder
        .install()
        .expect("the only recorder of this test binary");
    let cache = Cache::in_memory();
    for _ in 0..3 {
        let _: u8 = cache
            .get_or_compute("k", 60 * SECOND, || async { Ok::<_, String>(1) })
            .await
            .unwrap();
    }
    let counters: std::collections::HashMap<String, u64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) => Some((key.key().name().to_string(), n)),
            _ => None,
        })
        .collect();
    assert_eq!(counters.get("stampede_guard_hits_total"), Some(&2));
    assert_eq!(counters.get("stampede_guard_misses_total"), Some(&1));
    assert_eq!(counters.get("stampede_guard_computes_total"), Some(&1));
}
