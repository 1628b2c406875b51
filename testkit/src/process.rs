//! Real processes: the workspace's binaries, and the test binary re-run as a child engine
//! (to kill with SIGKILL, freeze with SIGSTOP, start several at once).

use std::time::Duration;

/// A binary of the workspace (`sagaflow-demo`, `sagaflow-chaos`, …) built for this test
/// profile: `cargo test` does not build the binaries of other packages, so build them first
/// (`cargo build --workspace --bins`, as `scripts/test.sh` does).
///
/// # Panics
/// When the binary is missing.
pub fn workspace_binary(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/suite-<hash> → target/<profile>/<name>
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binary lives in target/<profile>/deps");
    let bin = profile_dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} not found: build it first with `cargo build --workspace --bins` (add `--release` \
         when testing with --release)",
        bin.display()
    );
    bin
}

/// This test binary re-run as a child process: it runs one ignored test (`test`, its full
/// path) with the given environment, its stdout collected line by line and its stderr
/// passed through. The crash, failover and first-start scenarios drive child engines this
/// way (real processes, real SIGKILL).
#[derive(Debug)]
pub struct ChildTest {
    /// The process.
    pub child: tokio::process::Child,
    /// Its stdin, to drive it.
    pub stdin: tokio::process::ChildStdin,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl ChildTest {
    /// Starts the child. It is killed when dropped.
    ///
    /// # Panics
    /// When the process cannot be started.
    pub fn spawn(test: &str, env: &[(&str, String)]) -> Self {
        use tokio::io::AsyncBufReadExt;
        let exe = std::env::current_exe().expect("test binary path");
        let mut cmd = tokio::process::Command::new(exe);
        cmd.args([
            test,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        // A group of its own: while a child a test SIGSTOPped is in the test's group, an
        // exit that leaves that group orphaned (its launching shell's, say) has the kernel
        // send every member SIGHUP, the test included.
        .process_group(0)
        .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn child process");
        let stdin = child.stdin.take().expect("child stdin");
        let stdout = child.stdout.take().expect("child stdout");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = lines.clone();
        let reader = tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                sink.lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(line);
            }
        });
        Self {
            child,
            stdin,
            lines,
            reader,
        }
    }

    /// Everything it printed so far.
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether it printed a line starting with `prefix`.
    pub fn printed(&self, prefix: &str) -> bool {
        self.lines().iter().any(|l| l.starts_with(prefix))
    }

    /// Writes one line to its stdin.
    ///
    /// # Panics
    /// When the child's stdin is closed.
    pub async fn send(&mut self, line: &str) {
        use tokio::io::AsyncWriteExt;
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write to child");
        self.stdin.flush().await.expect("flush child stdin");
    }

    /// Waits for it to exit (at most `timeout`) and for the end of its stdout; returns its
    /// status and everything it printed.
    ///
    /// # Panics
    /// On timeout.
    pub async fn finish(mut self, timeout: Duration) -> (std::process::ExitStatus, String) {
        let status = tokio::time::timeout(timeout, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("child did not exit within {timeout:?}"))
            .expect("child status");
        tokio::time::timeout(Duration::from_secs(10), &mut self.reader)
            .await
            .expect("the child closes its stdout")
            .expect("stdout reader");
        (status, self.lines().join("\n"))
    }
}
