//! Signals to processes a test started (servers, workers): SIGSTOP, SIGCONT, SIGKILL.

use std::process::Command;

/// Sends a signal to a process this test started (by pid).
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("the kill command");
    assert!(status.success(), "kill -{signal} {pid} failed");
}
