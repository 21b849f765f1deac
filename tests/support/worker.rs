//! A child process of a test binary, re-executed in a role, with its output collected.

use std::process::{Child, Command, Stdio};
use std::time::Instant;

/// A worker process started from this test binary, with its stdout lines collected (with the
/// moment each arrived) as it runs.
pub struct Worker {
    pub child: Child,
    #[allow(dead_code, reason = "read only by the methods some binaries call")]
    lines: std::sync::Arc<std::sync::Mutex<Vec<(Instant, String)>>>,
    /// The thread collecting `lines`; it ends at the child's end of output.
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    /// Re-executes this test binary with `STAMPEDE_CHILD=role` and the given variables, its
    /// stderr going to `stderr`.
    fn start(role: &str, vars: &[(&str, String)], stderr: Stdio) -> Self {
        use std::io::BufRead;
        let mut cmd = Command::new(std::env::current_exe().expect("the test binary's path"));
        cmd.env("STAMPEDE_CHILD", role)
            .stdout(Stdio::piped())
            .stderr(stderr);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("a worker process");
        let stdout = child.stdout.take().expect("piped stdout");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                sink.lock().unwrap().push((Instant::now(), line));
            }
        });
        Worker {
            child,
            lines,
            reader: Some(reader),
        }
    }

    /// Whether it still runs.
    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for the process to end; true if it exited with success. Its output is then
    /// collected whole: the reader is joined, so a line printed just before the exit is in
    /// `lines` (a test once read the lines before the reader had taken the last one).
    pub fn wait_success(&mut self) -> bool {
        let success = self.child.wait().map(|s| s.success()).unwrap_or(false);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        success
    }
}

/// What only some binaries read of their workers (rustc checks dead code per test binary).
#[allow(
    dead_code,
    reason = "each harness = false binary reads a different part of its workers"
)]
impl Worker {
    /// Re-executes this test binary with `STAMPEDE_CHILD=role` and the given variables; its
    /// stderr is the test's.
    pub fn spawn(role: &str, vars: &[(&str, String)]) -> Self {
        Self::start(role, vars, Stdio::inherit())
    }

    /// As [`Worker::spawn`], with its stderr written to `log` (to count its log lines: the
    /// file has every line written so far, in order, while the worker runs).
    pub fn spawn_logging_to(role: &str, vars: &[(&str, String)], log: std::fs::File) -> Self {
        Self::start(role, vars, Stdio::from(log))
    }

    /// The lines printed so far.
    pub fn lines(&self) -> Vec<(Instant, String)> {
        self.lines.lock().unwrap().clone()
    }

    /// The last line starting with `prefix`, if any.
    pub fn last(&self, prefix: &str) -> Option<(Instant, String)> {
        self.lines()
            .into_iter()
            .rev()
            .find(|(_, l)| l.starts_with(prefix))
    }

    /// Its process id (for SIGSTOP and SIGKILL).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.is_alive() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
