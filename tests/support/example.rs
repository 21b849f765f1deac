//! Where `cargo test` put an example's binary: `target/<profile>/examples/NAME`, beside the test
//! binaries' `target/<profile>/deps/`.

use std::path::PathBuf;

/// The built example `name`; a run that did not build it fails, saying `build` (the command
/// that builds it).
pub fn example_binary(name: &str, build: &str) -> PathBuf {
    let me = std::env::current_exe().expect("the test binary's path");
    let profile_dir = me
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary sits in target/<profile>/deps/");
    let exe = profile_dir
        .join("examples")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        exe.is_file(),
        "the example was not built at {}: {build}",
        exe.display()
    );
    exe
}
