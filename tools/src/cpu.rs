//! CPU time of processes, read from `/proc`: the benchmark's own process, its worker
//! processes, and a PostgreSQL server running on the same machine (its postmaster and every
//! backend). CPU-seconds repeat from run to run where wall-clock times do not: on a machine
//! other work shares, a process's CPU time still counts only what that process did.

use std::path::Path;
use std::time::Duration;

/// `n` clock ticks: Linux reports `/proc` times in ticks of 1/100 s (`USER_HZ`) on every
/// architecture this runs on.
fn ticks(n: u64) -> Duration {
    Duration::from_millis(n.saturating_mul(10))
}

/// One process's CPU times so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcCpu {
    /// The process's own parent pid.
    pub ppid: u32,
    /// User plus system time of the process itself (all its threads).
    pub own: Duration,
    /// User plus system time of its children that have exited and been waited for.
    pub reaped_children: Duration,
}

/// Parses a `/proc/<pid>/stat` line: the parent pid, utime + stime and cutime + cstime.
/// `None` when the line is not one.
pub fn parse_stat(line: &str) -> Option<ProcCpu> {
    // The command name (field 2) is in parentheses and may hold spaces or parentheses: the
    // fields after it start at the last ')'.
    let rest = line.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state is field 3 of the line, so field n of the line is f[n - 3].
    let num = |n: usize| f.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    Some(ProcCpu {
        ppid: u32::try_from(num(4)?).ok()?,
        own: ticks(num(14)?.saturating_add(num(15)?)),
        reaped_children: ticks(num(16)?.saturating_add(num(17)?)),
    })
}

/// The CPU times of process `pid`; `None` when it is gone or `/proc` cannot be read.
pub fn of_pid(pid: u32) -> Option<ProcCpu> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// This process's CPU time so far (user + system, all threads).
pub fn this_process() -> Option<Duration> {
    parse_stat(&std::fs::read_to_string("/proc/self/stat").ok()?).map(|c| c.own)
}

/// Every live process's CPU times, by pid.
fn all_processes() -> Vec<(u32, ProcCpu)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        Some((pid, of_pid(pid)?))
    })
    .collect()
}

/// Why a PostgreSQL server's CPU cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServerCpuError {
    /// Its `postmaster.pid` is not readable here (another machine, or no permission).
    #[error("no readable {0}/postmaster.pid")]
    NoPidFile(String),
    /// The pid file names no live PostgreSQL process on this machine.
    #[error("postmaster pid {0} is not a live postgres process here")]
    NotRunningHere(u32),
}

/// The CPU a PostgreSQL server has used so far: its postmaster's own time, the time of its
/// children that exited (backends of closed sessions, reaped by the postmaster) and the time
/// of its live children (backends, checkpointer, WAL writer, autovacuum, …). Taken before and
/// after an interval, the difference is what the server spent in it, whether or not
/// sessions ended meanwhile: an exiting backend's time moves from the live sum to the
/// postmaster's reaped sum.
///
/// # Errors
/// [`ServerCpuError`] when `data_directory` holds no pid file readable here or its pid is
/// not a postgres process on this machine.
pub fn postgres_server(data_directory: &str) -> Result<Duration, ServerCpuError> {
    let pid_file = Path::new(data_directory).join("postmaster.pid");
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .ok()
        .and_then(|s| s.lines().next().and_then(|l| l.trim().parse().ok()))
        .ok_or_else(|| ServerCpuError::NoPidFile(data_directory.to_owned()))?;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let Some(postmaster) = of_pid(pid).filter(|_| comm.trim().starts_with("postgres")) else {
        return Err(ServerCpuError::NotRunningHere(pid));
    };
    let children: Duration = all_processes()
        .into_iter()
        .filter(|(_, c)| c.ppid == pid)
        .map(|(_, c)| c.own + c.reaped_children)
        .sum();
    Ok(postmaster.own + postmaster.reaped_children + children)
}

/// The whole machine's CPU time so far, from the first line of `/proc/stat`: (busy, all),
/// busy being everything but idle and I/O wait, summed over every core.
pub fn machine() -> Option<(Duration, Duration)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    let all: u64 = v.iter().sum();
    let idle = v.get(3)? + v.get(4)?;
    Some((ticks(all.saturating_sub(idle)), ticks(all)))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{ProcCpu, parse_stat};

    #[test]
    fn a_stat_line_gives_the_parent_and_both_sums_even_with_odd_command_names() {
        let line = "4242 (post gres: (x)) S 17 4242 4242 0 -1 4194560 900 0 0 0 \
                    150 25 7 3 20 0 1 0 123 0 0";
        assert_eq!(
            parse_stat(line),
            Some(ProcCpu {
                ppid: 17,
                own: Duration::from_millis(1750),
                reaped_children: Duration::from_millis(100),
            })
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 0 1"), None);
    }
}
