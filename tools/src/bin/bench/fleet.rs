//! Several engine processes: the worker processes (copies of this command) and the
//! coordinating process that submits and watches the database.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sagaflow::Engine;
use sagaflow::sea_orm::{ConnectionTrait, Statement};
use sagaflow_tools::Error;
use sagaflow_tools::cost::jain;
use sagaflow_tools::measure::Latencies;
use uuid::Uuid;

use super::ceiling::Ceiling;
use super::cli::Args;
use super::figures::{count_completed, print_throughput};
use super::workload::workflow;

/// A worker process: an engine running the bench workflow until killed.
pub(crate) async fn worker(args: &Args, id: &str) -> Result<(), Error> {
    let url = args
        .database_url
        .clone()
        .ok_or_else(|| Error::Usage("--worker needs --database-url".into()))?;
    let mut builder = Engine::builder()
        .with_database_url(url)
        .with_instance_id(id)
        .with_workflow(workflow(Arc::default(), args.resource_limit.is_some())?)
        .with_max_in_flight(args.max_in_flight)
        .with_claim_batch(args.claim_batch)
        .with_completion_writers(
            args.completion_writers
                .unwrap_or_else(sagaflow::internals::scheduler::completion_writers_default),
        )
        .with_pool_size(8)
        .with_retention(None);
    if let Some(r) = super::workload::resource(args.resource_limit) {
        builder = builder.with_resource(r);
    }
    let engine = builder.start().await?;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    engine.shutdown().await;
    Ok(())
}

/// The network namespaces `scripts/netns.sh up N` makes: `sfhost1..N`.
pub(crate) fn host_name(k: usize) -> String {
    format!("sfhost{k}")
}

/// The address of the root namespace's end of host `k`'s link (`scripts/netns.sh`'s
/// 10.231.K.1/30): where a worker in that host reaches PostgreSQL.
fn host_gateway(k: usize) -> String {
    format!("10.231.{k}.1")
}

/// `url` with its host replaced by `host`. Only a PostgreSQL URL naming one server can be
/// pointed elsewhere this way.
fn with_host(url: &str, host: &str) -> Result<String, Error> {
    let refuse = |why: &str| Error::Usage(format!("--netns-hosts: {why}"));
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| refuse("the database URL has no scheme"))?;
    if scheme != "postgres" && scheme != "postgresql" {
        return Err(refuse("it needs a PostgreSQL URL"));
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    if hostport.contains(',') {
        return Err(refuse("the URL names several servers; give it one"));
    }
    let port = if hostport.starts_with('[') {
        hostport
            .split_once(']')
            .map(|(_, p)| p)
            .ok_or_else(|| refuse("the URL's IPv6 host has no closing ']'"))?
    } else {
        hostport.find(':').map_or("", |i| &hostport[i..])
    };
    let userinfo = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    Ok(format!("{scheme}://{userinfo}{host}{port}{tail}"))
}

/// The database URL each worker process uses, by process: `url` itself, or with
/// `--netns-hosts N`, that of its host (checking that the hosts exist).
pub(crate) fn worker_urls(args: &Args, url: &str) -> Result<Vec<String>, Error> {
    let processes = args.processes.max(1);
    let Some(hosts) = args.netns_hosts.map(usize::from) else {
        return Ok(vec![url.to_owned(); processes]);
    };
    if processes < hosts {
        return Err(Error::Usage(format!(
            "--netns-hosts {hosts} needs at least as many --processes (got {processes})"
        )));
    }
    for k in 1..=hosts {
        if !std::path::Path::new("/run/netns")
            .join(host_name(k))
            .exists()
        {
            return Err(Error::Usage(format!(
                "no network namespace {}: run `scripts/netns.sh up {hosts} \"$SAGAFLOW_PG_DIR\"` first",
                host_name(k)
            )));
        }
    }
    (0..processes)
        .map(|p| with_host(url, &host_gateway(p % hosts + 1)))
        .collect()
}

/// Steps each worker process ended (one history row per attempt it finished), by instance.
async fn steps_by_instance(engine: &Engine) -> Result<BTreeMap<String, i64>, Error> {
    let conn = engine.connection();
    let rows = conn
        .query_all_raw(Statement::from_string(
            conn.get_database_backend(),
            "SELECT actor, COUNT(*) FROM sagaflow_history WHERE step IS NOT NULL \
             AND actor LIKE 'bench-worker-%' GROUP BY actor",
        ))
        .await
        .map_err(Error::db("counting the steps of each worker"))?;
    let mut by = BTreeMap::new();
    for r in rows {
        let actor: String = r
            .try_get_by_index(0)
            .map_err(Error::db("reading a history actor"))?;
        let n: i64 = r
            .try_get_by_index(1)
            .map_err(Error::db("reading a step count"))?;
        by.insert(actor, n);
    }
    Ok(by)
}

/// Prints each group's share of the steps over `secs`, and Jain's index of the shares.
fn print_shares(what: &str, groups: &[(String, i64)], secs: f64) {
    let total: i64 = groups.iter().map(|(_, n)| n).sum();
    println!("  steps by {what}:");
    for (name, n) in groups {
        println!(
            "    {name:<16} {n:>7} steps · {:>5.1}% · {:>6.0} steps/s",
            *n as f64 * 100.0 / total.max(1) as f64,
            *n as f64 / secs
        );
    }
    let shares: Vec<f64> = groups.iter().map(|(_, n)| *n as f64).collect();
    match jain(&shares) {
        Some(j) => println!(
            "  Jain's index     {j:.3} over these {n} shares (1 = even; 1/{n} = one took all)",
            n = groups.len()
        ),
        None => println!("  Jain's index     not defined (no steps counted)"),
    }
}

/// Throughput with several worker processes; this process submits and watches the database.
pub(crate) async fn multi_process(
    args: &Args,
    urls: &[String],
    engine: &Engine,
    ceilings: &[Ceiling],
) -> Result<(), Error> {
    let exe = std::env::current_exe().map_err(Error::io("cannot find this binary"))?;
    let mut workers = Vec::new();
    for (p, url) in urls.iter().enumerate() {
        let mut cmd = match args.netns_hosts.map(usize::from) {
            Some(hosts) => {
                // `ip netns exec` enters the namespace and execs the command: the child's
                // pid stays the worker's own, for its CPU time and for killing it.
                let mut c = tokio::process::Command::new("ip");
                c.args(["netns", "exec", &host_name(p % hosts + 1)])
                    .arg(&exe);
                c
            }
            None => tokio::process::Command::new(&exe),
        };
        workers.push(
            cmd.args([
                "--worker",
                &format!("bench-worker-{p}"),
                "--database-url",
                url,
            ])
            .args(["--max-in-flight", &args.max_in_flight.to_string()])
            .args(["--claim-batch", &args.claim_batch.to_string()])
            .args(
                args.completion_writers
                    .map(|n| format!("--completion-writers={n}")),
            )
            .kill_on_drop(true)
            .spawn()
            .map_err(Error::io(format!("cannot start worker process {p}")))?,
        );
    }
    // Let every worker connect and start polling before the clock starts.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (p, w) in workers.iter_mut().enumerate() {
        if let Some(status) = w
            .try_wait()
            .map_err(Error::io(format!("cannot watch worker process {p}")))?
        {
            return Err(Error::Usage(format!(
                "worker process {p} ended before the run began ({status}); \
                 with --netns-hosts, is PostgreSQL listening on the hosts' addresses?"
            )));
        }
    }
    let writes_before = super::writes::now(engine).await;
    let server = super::cpu::Server::of(engine).await;
    let pids: Vec<Option<u32>> = workers.iter().map(tokio::process::Child::id).collect();
    let cpu_before = super::cpu::mark(&server, &pids);
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    let ids: Arc<Mutex<Vec<Uuid>>> = Arc::default();
    for s in 0..args.submitters {
        let (engine, ids) = (engine.clone(), ids.clone());
        let n = args.runs / args.submitters + usize::from(s < args.runs % args.submitters);
        tasks.push(tokio::spawn(async move {
            for _ in 0..n {
                let id = engine
                    .start("bench", &serde_json::json!({ "qty": 1 }))
                    .await?;
                ids.lock().unwrap_or_else(PoisonError::into_inner).push(id);
            }
            Ok::<_, sagaflow::Error>(())
        }));
    }
    for t in tasks {
        t.await.map_err(Error::task("submitter"))??;
    }
    let submitted = t0.elapsed();
    let deadline = t0 + Duration::from_secs(600);
    while count_completed(engine).await < args.runs {
        if Instant::now() > deadline {
            return Err(Error::TimedOut {
                done: count_completed(engine).await,
                expected: args.runs,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let total = t0.elapsed();
    let cpu_after = super::cpu::mark(&server, &pids);
    let by_instance = steps_by_instance(engine).await?;
    for mut w in workers {
        let _ = w.kill().await;
    }
    let ids = ids.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let mut e2e = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(r) = engine.run(id).await?
            && let Some(f) = r.finished_at
        {
            e2e.push((f - r.created_at).to_std().unwrap_or_default());
        }
    }
    println!(
        "\nthroughput · {} runs × 3 steps · {} worker processes{}",
        args.runs,
        urls.len(),
        args.netns_hosts
            .map(|h| format!(" in {h} network namespace(s)"))
            .unwrap_or_default()
    );
    print_throughput(
        args.runs,
        submitted,
        total,
        &Latencies::of(e2e),
        "database clock, under full load",
        ceilings,
    );
    let secs = total.as_secs_f64();
    let per_process: Vec<(String, i64)> = (0..urls.len())
        .map(|p| {
            let id = format!("bench-worker-{p}");
            let n = by_instance.get(&id).copied().unwrap_or(0);
            (id, n)
        })
        .collect();
    if let (Some(before), Some(after)) = (writes_before, super::writes::now(engine).await) {
        super::writes::print(&before, &after, args.runs);
    }
    print_shares("process", &per_process, secs);
    if let Some(hosts) = args.netns_hosts.map(usize::from) {
        let per_host: Vec<(String, i64)> = (1..=hosts)
            .map(|k| {
                let n = per_process
                    .iter()
                    .enumerate()
                    .filter(|(p, _)| p % hosts + 1 == k)
                    .map(|(_, (_, n))| n)
                    .sum();
                (format!("{} ({})", host_name(k), host_gateway(k)), n)
            })
            .collect();
        print_shares("host", &per_host, secs);
    }
    super::cpu::print(&cpu_before, &cpu_after, args.runs, total, &server);
    engine.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::with_host;

    #[test]
    fn a_url_is_pointed_at_another_host_keeping_user_port_and_path() {
        let to = |u: &str| with_host(u, "10.231.2.1").map_err(|e| e.to_string());
        assert_eq!(
            to("postgres://postgres@127.0.0.1:54329/bench?sslmode=disable"),
            Ok("postgres://postgres@10.231.2.1:54329/bench?sslmode=disable".into())
        );
        assert_eq!(
            to("postgresql://u:p@w@localhost/db"),
            Ok("postgresql://u:p@w@10.231.2.1/db".into())
        );
        assert_eq!(
            to("postgres://[::1]:5432/db"),
            Ok("postgres://10.231.2.1:5432/db".into())
        );
        assert!(to("postgres://a:5432,b:5432/db").is_err());
        assert!(to("sqlite://x.db").is_err());
        assert!(to("no scheme").is_err());
    }
}
