//! PostgreSQL for a chaos run: a private throwaway cluster (through `scripts/pg.sh`), the
//! mid-run immediate restart, and the fresh database each run works in.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sagaflow::sea_orm::{ConnectionTrait, Database};

/// A cluster started by `pg_start` of `scripts/pg.sh`; stopped and deleted on drop unless
/// kept.
#[derive(Debug)]
pub(crate) struct OwnCluster {
    script: PathBuf,
    /// The cluster's temp dir (`SAGAFLOW_PG_DIR`): data in `data/`, log in `server.log`.
    pub(crate) dir: PathBuf,
    /// Superuser URL of the `postgres` database.
    pub(crate) url: String,
    /// Directory of the server binaries.
    pub(crate) bin: PathBuf,
    /// Leave the cluster running at the end.
    pub(crate) keep: bool,
}

impl OwnCluster {
    /// Starts a cluster with `pg_start`.
    pub(crate) fn start(script: &Path) -> Result<Self, String> {
        let out = Command::new("bash")
            .arg("-c")
            .arg(
                r#"source "$1" && pg_start && printf '%s\n%s\n%s\n' "$SAGAFLOW_PG_URL" "$SAGAFLOW_PG_DIR" "$SAGAFLOW_PG_BIN""#,
            )
            .arg("bash")
            .arg(script)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run bash {}: {e}", script.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = stdout.lines().collect();
        if !out.status.success() || lines.len() < 3 {
            return Err(format!(
                "pg_start failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(Self {
            script: script.to_path_buf(),
            url: lines[0].to_owned(),
            dir: PathBuf::from(lines[1]),
            bin: PathBuf::from(lines[2]),
            keep: false,
        })
    }

    /// The data directory.
    pub(crate) fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
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

impl Drop for OwnCluster {
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
pub(crate) fn script_path(given: Option<&Path>) -> PathBuf {
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
pub(crate) fn pg_bin(given: Option<&Path>) -> Option<PathBuf> {
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
pub(crate) fn restart_immediate(
    bin: Option<&Path>,
    data_dir: &Path,
    log: Option<&Path>,
) -> Result<Duration, String> {
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
        .map_err(|e| format!("cannot run {}: {e}", pg_ctl.display()))?;
    let (out, took) = out;
    if out.status.success() {
        Ok(took)
    } else {
        Err(format!(
            "pg_ctl restart failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Switches a throwaway cluster (started with the test settings of scripts/pg.sh, which
/// turn durability off) to full durability: `fsync`, `synchronous_commit` and
/// `full_page_writes` on, as a production server runs. All three take effect on reload.
pub(crate) async fn make_durable(admin_url: &str) -> Result<(), String> {
    let conn = Database::connect(admin_url)
        .await
        .map_err(|e| format!("cannot connect to {admin_url}: {e}"))?;
    for sql in [
        "ALTER SYSTEM SET fsync = on",
        "ALTER SYSTEM SET synchronous_commit = on",
        "ALTER SYSTEM SET full_page_writes = on",
        "SELECT pg_reload_conf()",
    ] {
        conn.execute_unprepared(sql)
            .await
            .map_err(|e| format!("{sql} failed: {e}"))?;
    }
    let _ = conn.close().await;
    Ok(())
}

/// A database created for one chaos run.
#[derive(Debug)]
pub(crate) struct ChaosDb {
    admin_url: String,
    /// Its name.
    pub(crate) name: String,
    /// Its URL.
    pub(crate) url: String,
}

impl ChaosDb {
    /// Creates `sagaflow_chaos_<id>` on the server of `admin_url`. With `sync_commit`, the
    /// database gets `synchronous_commit = on` whatever the server's default: an immediate
    /// restart (a crash, for PostgreSQL) loses the commits that were acknowledged but not yet
    /// written when `synchronous_commit` is `off` (as on scripts/pg.sh clusters), and an
    /// engine that acted on a lost commit (dispatched the next step) cannot be consistent.
    /// `fsync = off` does no harm here: the written WAL survives in the OS page cache.
    pub(crate) async fn create(admin_url: &str, sync_commit: bool) -> Result<Self, String> {
        let name = format!(
            "sagaflow_chaos_{}",
            &uuid::Uuid::now_v7().simple().to_string()[20..]
        );
        let (base, query) = match admin_url.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (admin_url, None),
        };
        let Some((server, _)) = base.rsplit_once('/').filter(|(s, _)| s.contains("://")) else {
            return Err(format!(
                "database URL {admin_url} must name a database: postgres://user@host:port/db"
            ));
        };
        let url = match query {
            Some(q) => format!("{server}/{name}?{q}"),
            None => format!("{server}/{name}"),
        };
        let conn = Database::connect(admin_url)
            .await
            .map_err(|e| format!("cannot connect to {admin_url}: {e}"))?;
        let mut created = conn
            .execute_unprepared(&format!("CREATE DATABASE {name}"))
            .await
            .map(|_| ())
            .map_err(|e| format!("CREATE DATABASE {name} failed: {e}"));
        if created.is_ok() && sync_commit {
            created = conn
                .execute_unprepared(&format!(
                    "ALTER DATABASE {name} SET synchronous_commit = on"
                ))
                .await
                .map(|_| ())
                .map_err(|e| format!("ALTER DATABASE {name} SET synchronous_commit failed: {e}"));
        }
        let _ = conn.close().await;
        created?;
        Ok(Self {
            admin_url: admin_url.to_owned(),
            name,
            url,
        })
    }

    /// Drops the database (every connection to it must be gone, or is forced off).
    pub(crate) async fn drop_db(&self) -> Result<(), String> {
        let conn = Database::connect(self.admin_url.as_str())
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", self.admin_url))?;
        let mut res = conn
            .execute_unprepared(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .await;
        if res.is_err() {
            // Before PostgreSQL 13 there is no FORCE.
            res = conn
                .execute_unprepared(&format!("DROP DATABASE IF EXISTS {}", self.name))
                .await;
        }
        let _ = conn.close().await;
        res.map(|_| ())
            .map_err(|e| format!("DROP DATABASE {} failed: {e}", self.name))
    }
}
