//! A private throwaway PostgreSQL cluster (through `scripts/pg.sh`): for tests and tools
//! that restart the server mid-run, or need settings no other test may see.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sagaflow::sea_orm::{ConnectionTrait, Database, DbErr};

/// What went wrong with a private cluster.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// A program could not be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A program ran and failed.
    #[error("{command} failed ({status}): {stderr}")]
    Failed {
        /// What was run.
        command: &'static str,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed on stderr.
        stderr: String,
    },
    /// A statement failed on the server (the URL is shown without its password).
    #[error("{sql} on {target}: {source}")]
    Sql {
        /// The statement (or `connect`).
        sql: String,
        /// The server.
        target: String,
        /// The database's error.
        #[source]
        source: DbErr,
    },
}

/// A cluster started by `pg_start` of `scripts/pg.sh`; stopped and deleted on drop unless
/// kept.
#[derive(Debug)]
pub struct PgCluster {
    script: PathBuf,
    /// The cluster's temp dir (`SAGAFLOW_PG_DIR`): data in `data/`, log in `server.log`.
    pub dir: PathBuf,
    /// Superuser URL of the `postgres` database.
    pub url: String,
    /// Directory of the server binaries.
    pub bin: PathBuf,
    /// Leave the cluster running at the end.
    pub keep: bool,
}

impl PgCluster {
    /// Starts a cluster with `pg_start`.
    ///
    /// # Errors
    /// [`ClusterError`] when `bash` cannot run or `pg_start` fails.
    pub fn start(script: &Path) -> Result<Self, ClusterError> {
        Self::start_from(script, None)
    }

    /// Starts a streaming standby of this cluster (`pg_start PORT`: a `pg_basebackup` of it,
    /// following its WAL) with the same script.
    ///
    /// # Errors
    /// As [`PgCluster::start`].
    pub fn start_standby(&self) -> Result<Self, ClusterError> {
        Self::start_from(&self.script, Some(self.port()))
    }

    /// The TCP port the server listens on (127.0.0.1).
    ///
    /// # Panics
    /// When the URL `pg_start` printed has no port (it always has).
    pub fn port(&self) -> u16 {
        let authority = self.url.rsplit_once('@').map_or(&*self.url, |(_, a)| a);
        let hostport = authority.split_once('/').map_or(authority, |(h, _)| h);
        hostport
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .expect("pg_start prints a URL with a port")
    }

    /// `host:port` of the server, for a URL that lists several servers.
    pub fn host_port(&self) -> String {
        format!("127.0.0.1:{}", self.port())
    }

    /// SIGKILLs the server and every process it started at once, as a host that dies would
    /// (`pg_kill`). Blocking.
    ///
    /// # Errors
    /// [`ClusterError::Failed`] when no server was running.
    pub fn kill(&self) -> Result<(), ClusterError> {
        self.script_fn("pg_kill")
    }

    /// Promotes this standby to a primary and waits until it accepts writes (`pg_promote`).
    /// Blocking.
    ///
    /// # Errors
    /// [`ClusterError::Failed`] when `pg_ctl promote` fails.
    pub fn promote(&self) -> Result<(), ClusterError> {
        self.script_fn("pg_promote")
    }

    fn script_fn(&self, function: &'static str) -> Result<(), ClusterError> {
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!(r#"source "$1" && {function} "$2""#))
            .arg("bash")
            .arg(&self.script)
            .arg(&self.dir)
            .env("SAGAFLOW_PG_BIN", &self.bin)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| ClusterError::Spawn {
                program: format!("bash {}", self.script.display()),
                source,
            })?;
        if out.status.success() {
            Ok(())
        } else {
            Err(ClusterError::Failed {
                command: function,
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            })
        }
    }

    fn start_from(script: &Path, primary_port: Option<u16>) -> Result<Self, ClusterError> {
        let out = Command::new("bash")
            .arg("-c")
            .arg(
                r#"source "$1" && pg_start $2 && printf '%s\n%s\n%s\n' "$SAGAFLOW_PG_URL" "$SAGAFLOW_PG_DIR" "$SAGAFLOW_PG_BIN""#,
            )
            .arg("bash")
            .arg(script)
            .arg(primary_port.map(|p| p.to_string()).unwrap_or_default())
            .stdin(Stdio::null())
            .output()
            .map_err(|source| ClusterError::Spawn {
                program: format!("bash {}", script.display()),
                source,
            })?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = stdout.lines().collect();
        if !out.status.success() || lines.len() < 3 {
            return Err(ClusterError::Failed {
                command: "pg_start",
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(Self {
            script: script.to_path_buf(),
            url: lines[0].to_owned(),
            dir: PathBuf::from(lines[1]),
            bin: PathBuf::from(lines[2]),
            keep: false,
        })
    }

    /// Starts a cluster with the `scripts/pg.sh` of this source tree.
    ///
    /// # Errors
    /// As [`PgCluster::start`].
    pub fn start_private() -> Result<Self, ClusterError> {
        Self::start(&script_path(None))
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Restarts the server in immediate mode (a crash, for every client; crash recovery on
    /// start). Returns how long it took. Blocking.
    ///
    /// # Errors
    /// As [`restart_immediate`].
    pub fn restart(&self) -> Result<Duration, ClusterError> {
        restart_immediate(
            Some(&self.bin),
            &self.data_dir(),
            Some(&self.dir.join("server.log")),
        )
    }

    fn stop(&self) {
        let status = Command::new("bash")
            .arg("-c")
            .arg(r#"source "$1" && pg_stop "$2""#)
            .arg("bash")
            .arg(&self.script)
            .arg(&self.dir)
            .env("SAGAFLOW_PG_BIN", &self.bin)
            .stdin(Stdio::null())
            .status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!(
                "warning: pg_stop {} failed; stop it with: bash {} stop {}",
                self.dir.display(),
                self.script.display(),
                self.dir.display()
            );
        }
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if self.keep {
            println!(
                "  kept the cluster: psql {} · stop with: bash {} stop {}",
                self.url,
                self.script.display(),
                self.dir.display()
            );
        } else {
            self.stop();
        }
    }
}

/// `scripts/pg.sh`: the given path, else the one of this source tree, else `./scripts/pg.sh`.
pub fn script_path(given: Option<&Path>) -> PathBuf {
    if let Some(p) = given {
        return p.to_path_buf();
    }
    let tree = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/pg.sh");
    if tree.exists() {
        tree
    } else {
        PathBuf::from("scripts/pg.sh")
    }
}

/// The directory holding `pg_ctl`: `given`, else the newest `/usr/lib/postgresql/*/bin`,
/// else `None` (use `pg_ctl` from `PATH`).
pub fn pg_bin(given: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = given {
        return Some(p.to_path_buf());
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("pg_ctl").exists().then_some((major, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, b)| b)
}

/// Whether this process runs as root (the server then runs as the `postgres` OS user).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// `pg_ctl restart -m immediate -D data_dir -w`: the server is killed without a checkpoint
/// (a crash, for every client) and started again. Returns how long it took. Blocking.
pub fn restart_immediate(
    bin: Option<&Path>,
    data_dir: &Path,
    log: Option<&Path>,
) -> Result<Duration, ClusterError> {
    let pg_ctl = bin.map_or_else(|| PathBuf::from("pg_ctl"), |b| b.join("pg_ctl"));
    let mut cmd = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(&pg_ctl);
        c
    } else {
        Command::new(&pg_ctl)
    };
    cmd.arg("restart")
        .args(["-m", "immediate", "-w", "-t", "60", "-D"])
        .arg(data_dir);
    if let Some(log) = log {
        cmd.arg("-l").arg(log);
    }
    // The server's own output goes to `log` (or nowhere); run from a directory the postgres
    // user can read.
    let out = cmd
        .current_dir(data_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|c| {
            let t = Instant::now();
            c.wait_with_output().map(|o| (o, t.elapsed()))
        })
        .map_err(|source| ClusterError::Spawn {
            program: pg_ctl.display().to_string(),
            source,
        })?;
    let (out, took) = out;
    if out.status.success() {
        Ok(took)
    } else {
        Err(ClusterError::Failed {
            command: "pg_ctl restart",
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// Switches a throwaway cluster (started with the test settings of scripts/pg.sh, which
/// turn durability off) to full durability: `fsync`, `synchronous_commit` and
/// `full_page_writes` on, as a production server runs. All three take effect on reload.
///
/// # Errors
/// [`ClusterError::Sql`] naming the statement that failed.
pub async fn make_durable(admin_url: &str) -> Result<(), ClusterError> {
    let target = sagaflow::redact_url(admin_url);
    let sql_err = |sql: &str, source| ClusterError::Sql {
        sql: sql.to_owned(),
        target: target.clone(),
        source,
    };
    let conn = Database::connect(admin_url)
        .await
        .map_err(|e| sql_err("connect", e))?;
    for sql in [
        "ALTER SYSTEM SET fsync = on",
        "ALTER SYSTEM SET synchronous_commit = on",
        "ALTER SYSTEM SET full_page_writes = on",
        "SELECT pg_reload_conf()",
    ] {
        conn.execute_unprepared(sql)
            .await
            .map_err(|e| sql_err(sql, e))?;
    }
    let _ = conn.close().await;
    Ok(())
}
