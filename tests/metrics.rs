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
    // Each counter by its name and its `answer` label, if it has one.
    let counters: std::collections::HashMap<(String, Option<String>), u64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) => {
                let key = key.key();
                let answer = (key.labels())
                    .find(|label| label.key() == "answer")
                    .map(|label| label.value().to_owned());
                Some(((key.name().to_owned(), answer), n))
            }
            _ => None,
        })
        .collect();
    let named = |name: &str| counters.get(&(name.to_owned(), None));
    // Each call once, by its answer: one computed, two hits; nothing else.
    let calls = |answer: &str| {
        counters.get(&(
            "stampede_guard_calls_total".to_owned(),
            Some(answer.to_owned()),
        ))
    };
    assert_eq!(calls("hit"), Some(&2));
    assert_eq!(calls("computed"), Some(&1));
    let all: u64 = (counters.iter())
        .filter(|((name, _), _)| name == "stampede_guard_calls_total")
        .map(|(_, n)| n)
        .sum();
    assert_eq!(all, 3, "three calls, each counted once: {counters:?}");
    assert_eq!(named("stampede_guard_computes_total"), Some(&1));
    // The names that counted a call a second time are gone.
    for gone in ["hits_total", "misses_total", "waits_total"] {
        assert!(named(&format!("stampede_guard_{gone}")).is_none());
    }
}
