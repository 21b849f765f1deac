//! The `main` of a test binary with `harness = false` (it re-executes itself as child
//! processes, or has its own checks): runs its tests by name, libtest-style, or one child role.

/// The `main` of a test binary with `harness = false` that re-executes itself as child processes:
/// run as a child (`STAMPEDE_CHILD` names its role), it runs `child` and exits with its outcome;
/// otherwise it runs the tests as [`run_tests`] does.
pub fn run_child_or_tests(
    binary: &str,
    tests: &[(&str, fn())],
    child: fn(&str) -> Result<(), String>,
) {
    if let Ok(role) = std::env::var("STAMPEDE_CHILD") {
        if let Err(e) = child(&role) {
            eprintln!("{binary}: child {role} failed: {e}");
            std::process::exit(1);
        }
        std::process::exit(0);
    }
    run_tests(binary, tests);
}

/// The `main` of a test binary with `harness = false`: runs the tests whose names contain one of
/// the command-line filters (all without filters), prints libtest-like lines and a summary, and
/// exits non-zero if any failed.
pub fn run_tests(binary: &str, tests: &[(&str, fn())]) {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let (mut passed, mut failed) = (0, 0);
    for (name, test) in tests {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        match std::panic::catch_unwind(test) {
            Ok(()) => {
                println!("test {name} ... ok");
                passed += 1;
            }
            Err(_) => {
                println!("test {name} ... FAILED");
                failed += 1;
            }
        }
    }
    println!("\n{binary}: {passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}
