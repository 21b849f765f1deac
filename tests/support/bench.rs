//! For the benches with their own `main`.

/// The filters `cargo bench` passed to a bench with its own `main` (`harness = false`): its
/// arguments that are not flags (`--bench` is one).
pub fn bench_filters() -> Vec<String> {
    std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect()
}

/// For a bench with its own `main` (`harness = false`): whether the filters `cargo bench` was
/// given leave out the bench called `name` (with filters, only the benches they name run).
pub fn bench_filtered_out(name: &str) -> bool {
    let filters = bench_filters();
    !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str()))
}
