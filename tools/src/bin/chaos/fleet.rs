//! The engine processes: spawn, SIGKILL, restart, and notice exits nobody asked for.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What an engine process needs to know.
#[derive(Debug, Clone)]
pub(crate) struct WorkerSpec {
    /// This binary.
    pub(crate) exe: PathBuf,
    /// The chaos database.
    pub(crate) database_url: String,
    /// The simulated services.
    pub(crate) services_url: String,
    /// Retention window of the engine processes, in ms (0: off).
    pub(crate) retention_ms: u64,
    /// Where each slot's log goes (`worker-<slot>.log`, appended across restarts).
    pub(crate) log_dir: PathBuf,
}

/// One running engine process.
#[derive(Debug)]
struct Worker {
    instance_id: String,
    child: Child,
    /// Closing it asks the worker to shut down.
    stdin: Option<ChildStdin>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Never leave an engine process behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The fleet: one slot per engine process.
#[derive(Debug)]
pub(crate) struct Fleet {
    spec: WorkerSpec,
    slots: Vec<Option<Worker>>,
    generation: Vec<u32>,
    /// SIGKILLs sent.
    pub(crate) kills: u64,
    /// Processes started after the first start of their slot.
    pub(crate) restarts: u64,
    /// Exits nobody asked for: `instance id: status`.
    pub(crate) unexpected_exits: Vec<String>,
}

impl Fleet {
    /// Starts `n` engine processes.
    pub(crate) fn start(spec: WorkerSpec, n: usize) -> io::Result<Self> {
        let mut fleet = Self {
            spec,
            slots: (0..n).map(|_| None).collect(),
            generation: vec![0; n],
            kills: 0,
            restarts: 0,
            unexpected_exits: Vec::new(),
        };
        for slot in 0..n {
            fleet.spawn(slot)?;
        }
        Ok(fleet)
    }

    /// Number of slots.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    fn log_file(&self, slot: usize) -> io::Result<File> {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.spec.log_dir.join(format!("worker-{slot}.log")))
    }

    fn spawn(&mut self, slot: usize) -> io::Result<()> {
        let generation = self.generation[slot];
        // A fresh instance id per process, as a new pod or container would get.
        let instance_id = format!("chaos-w{slot}-g{generation}");
        let log = self.log_file(slot)?;
        let mut child = Command::new(&self.spec.exe)
            .args([
                "--worker",
                "--instance-id",
                &instance_id,
                "--database-url",
                &self.spec.database_url,
                "--services-url",
                &self.spec.services_url,
                "--retention-ms",
                &self.spec.retention_ms.to_string(),
            ])
            // The worker reads nothing else from its environment.
            .env_remove("DATABASE_URL")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            // A group of its own: while a SIGSTOPped engine is in the coordinator's group,
            // an exit that leaves that group orphaned (its launching shell's, say) has the
            // kernel send every member SIGHUP (a chaos run lost an engine so).
            .process_group(0)
            .spawn()?;
        let stdin = child.stdin.take();
        if generation > 0 {
            self.restarts += 1;
        }
        self.generation[slot] = generation + 1;
        self.slots[slot] = Some(Worker {
            instance_id,
            child,
            stdin,
        });
        Ok(())
    }

    /// The process id of the engine process in `slot`.
    pub(crate) fn pid(&self, slot: usize) -> Option<u32> {
        self.slots[slot].as_ref().map(|w| w.child.id())
    }

    /// The slot of the process whose instance id is `instance_id`, if it runs.
    pub(crate) fn slot_of(&self, instance_id: &str) -> Option<usize> {
        self.slots
            .iter()
            .position(|w| w.as_ref().is_some_and(|w| w.instance_id == instance_id))
    }

    /// SIGKILLs the process in `slot` (no shutdown hook runs) and starts a new one.
    pub(crate) fn kill_and_restart(&mut self, slot: usize) -> io::Result<String> {
        let mut killed = String::new();
        if let Some(mut w) = self.slots[slot].take() {
            w.child.kill()?;
            w.child.wait()?;
            self.kills += 1;
            killed = std::mem::take(&mut w.instance_id);
        }
        self.spawn(slot)?;
        Ok(killed)
    }

    /// Restarts every process that exited on its own, recording why.
    pub(crate) fn reap(&mut self) -> io::Result<()> {
        for slot in 0..self.slots.len() {
            let exited: Option<ExitStatus> = match self.slots[slot].as_mut() {
                Some(w) => w.child.try_wait()?,
                None => None,
            };
            if let Some(status) = exited {
                if let Some(mut w) = self.slots[slot].take() {
                    self.unexpected_exits
                        .push(format!("{}: {status}", std::mem::take(&mut w.instance_id)));
                }
                self.spawn(slot)?;
            }
        }
        Ok(())
    }

    /// Asks every process to shut down (closes its stdin), waits up to `grace`, then
    /// SIGKILLs what is left. Returns how many had to be killed.
    pub(crate) async fn stop(&mut self, grace: Duration) -> usize {
        for w in self.slots.iter_mut().flatten() {
            w.stdin = None;
        }
        let until = Instant::now() + grace;
        let mut forced = 0;
        for w in self.slots.iter_mut().flatten() {
            loop {
                match w.child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() >= until => {
                        forced += 1;
                        break;
                    }
                    Ok(None) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }
        // Dropping a worker kills and reaps it (a no-op for those that exited).
        self.slots.clear();
        forced
    }
}

/// The directory for worker logs: `dir`, or a new one under the temp directory.
pub(crate) fn log_dir(dir: Option<&Path>) -> io::Result<PathBuf> {
    let dir = match dir {
        Some(d) => d.to_path_buf(),
        None => {
            std::env::temp_dir().join(format!("sagaflow-chaos-{}", uuid::Uuid::now_v7().simple()))
        }
    };
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
