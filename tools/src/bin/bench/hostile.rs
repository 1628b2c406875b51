//! `--hostile N`: the cost of hostile callers. An engine serves its API on loopback with its
//! default limits; runs are started through the API and followed to their end twice, first
//! with no other traffic, then while N clients flood the server with requests refused at
//! once (wrong bearer tokens), forged callbacks, read-only event streams and wrong logins.
//! Prints both phases' run latencies side by side and how the flood was answered (how many
//! 429s). The clients run in this process, on the same cores as the engine, each sending
//! from its own loopback address (the operator's from 127.0.0.1), and none waits between
//! requests: the worst a local flood can do.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sagaflow::admin::{AdminConfig, AdminToken, Role};
use sagaflow::{Engine, RunState};
use sagaflow_tools::Error;
use sagaflow_tools::measure::{Latencies, ms};
use uuid::Uuid;

use super::workload::{Starts, workflow};

/// What one flooding client sends, by its index.
const KINDS: [&str; 4] = [
    "refused (wrong bearer token)",
    "forged callback",
    "read-only event stream",
    "wrong console login",
];

/// Answers of the flood: (kind, status) → count.
type Tally = Arc<Mutex<BTreeMap<(&'static str, u16), u64>>>;

fn secret() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs the measurement on the database at `url`.
pub(crate) async fn run(url: &str, runs: usize, clients: usize) -> Result<(), Error> {
    let (ops, view) = (secret(), secret());
    let token = |name: &str, s: &str, role| {
        AdminToken::new(name, s, role).map_err(|e| Error::Usage(e.to_string()))
    };
    let config = AdminConfig::new()
        .with_token(token("ops", &ops, Role::Operator)?)
        .with_token(token("viewer", &view, Role::ReadOnly)?);
    let starts: Starts = Arc::default();
    let engine = Engine::builder()
        .with_database_url(url.to_owned())
        .with_workflow(workflow(starts, false)?)
        .with_retention(None)
        .with_admin(
            "127.0.0.1:0"
                .parse()
                .map_err(|e| Error::Usage(format!("{e}")))?,
            config,
        )
        .start()
        .await?;
    let addr = engine
        .admin_addr()
        .ok_or_else(|| Error::Usage("the API is not listening".into()))?;
    let base = format!("http://{addr}");
    let limits = sagaflow::admin::AdminLimits::default();
    println!(
        "sagaflow-bench --hostile · machine: {}",
        sagaflow_tools::machine::describe()
    );
    println!("  database: {}", super::figures::durability(&engine).await);
    println!(
        "  API on {base} with the default limits: callbacks {}/s, reads {}/s, logins {}/s, \
         {} failed authentications a client a minute, {} streams a token",
        limits.callbacks.per_second,
        limits.reads.per_second,
        limits.login.per_second,
        limits.failures_per_client,
        limits.streams_per_token
    );
    println!(
        "  {runs} runs started through POST /api/v1/workflows/bench/runs by 4 submitters, \
         latency from the POST to the run's completion"
    );
    let http = reqwest::Client::new();
    // A first round, not measured: connections, statement caches, pages in memory.
    phase(&engine, &http, &base, &ops, runs).await?;
    let idle = phase(&engine, &http, &base, &ops, runs).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let tally: Tally = Arc::default();
    let sample_run = *idle.ids.first().unwrap_or(&Uuid::nil());
    let mut flood = Vec::new();
    for i in 0..clients {
        // Each flooding client from an address of its own (127.0.0.2, …: all of 127/8 is
        // this machine's loopback), as hostile clients come from other hosts than the
        // operator's: the limit on failed authentications is per client address.
        let octets = [
            127,
            0,
            u8::try_from((i + 2) / 250).unwrap_or(0),
            u8::try_from((i + 2) % 250).unwrap_or(2),
        ];
        let from = reqwest::Client::builder()
            .local_address(std::net::IpAddr::from(octets))
            .build()
            .map_err(|e| Error::Usage(format!("client: {e}")))?;
        flood.push(tokio::spawn(client(
            KINDS[i % KINDS.len()],
            from,
            base.clone(),
            view.clone(),
            sample_run,
            stop.clone(),
            tally.clone(),
        )));
    }
    // The flood is on before the runs start.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let flooded = phase(&engine, &http, &base, &ops, runs).await?;
    stop.store(true, Ordering::SeqCst);
    for f in flood {
        f.abort();
    }
    println!("\n  phase      runs   wall      p50        p95        p99        max");
    for (name, p) in [("idle", &idle), ("flooded", &flooded)] {
        println!(
            "  {name:<9} {:>5} {:>7.2} s {:>10} {:>10} {:>10} {:>10}",
            p.ids.len(),
            p.wall.as_secs_f64(),
            ms(p.latency.percentile(50.0)),
            ms(p.latency.percentile(95.0)),
            ms(p.latency.percentile(99.0)),
            ms(p.latency.percentile(100.0)),
        );
    }
    let ratio = flooded.latency.percentile(50.0).as_secs_f64()
        / idle.latency.percentile(50.0).as_secs_f64().max(1e-9);
    println!("  p50 flooded / idle: {ratio:.2}");
    println!(
        "\n  the flood: {clients} clients in this process ({} of each kind), during the \
         flooded phase ({:.1} s)",
        clients.div_ceil(KINDS.len()),
        flooded.wall.as_secs_f64() + 0.5
    );
    let tally = tally.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let mut total_429 = 0;
    for kind in KINDS {
        let answers: Vec<String> = tally
            .iter()
            .filter(|((k, _), _)| *k == kind)
            .map(|((_, s), n)| {
                if *s == 429 {
                    total_429 += n;
                }
                format!("{n} × {s}")
            })
            .collect();
        let sent: u64 = tally
            .iter()
            .filter(|((k, _), _)| *k == kind)
            .map(|(_, n)| n)
            .sum();
        println!("  {kind:<30} {sent:>8} requests: {}", answers.join(", "));
    }
    println!("  answered 429 (refused by a limit before the token or the database): {total_429}");
    engine.shutdown().await;
    Ok(())
}

/// One phase's figures.
struct Phase {
    ids: Vec<Uuid>,
    wall: Duration,
    latency: Latencies,
}

/// Starts `runs` runs through the API and waits for each to complete.
async fn phase(
    engine: &Engine,
    http: &reqwest::Client,
    base: &str,
    ops: &str,
    runs: usize,
) -> Result<Phase, Error> {
    let mut events = engine.subscribe();
    let submitted: Arc<Mutex<HashMap<Uuid, Instant>>> = Arc::default();
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for s in 0..4 {
        let n = runs / 4 + usize::from(s < runs % 4);
        let (http, submitted) = (http.clone(), submitted.clone());
        let (url, ops) = (
            format!("{base}/api/v1/workflows/bench/runs"),
            ops.to_owned(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..n {
                let at = Instant::now();
                // A 429 is retried after its Retry-After, as a client should.
                let id = loop {
                    let r = http
                        .post(&url)
                        .bearer_auth(&ops)
                        .json(&serde_json::json!({ "input": { "qty": 1 } }))
                        .send()
                        .await
                        .map_err(|e| Error::Usage(format!("start: {e}")))?;
                    if r.status() == 429 {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                    let body: serde_json::Value = r
                        .json()
                        .await
                        .map_err(|e| Error::Usage(format!("start: {e}")))?;
                    let id = body["id"]
                        .as_str()
                        .and_then(|s| Uuid::parse_str(s).ok())
                        .ok_or_else(|| Error::Usage(format!("start answered {body}")))?;
                    break id;
                };
                submitted
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(id, at);
            }
            Ok::<_, Error>(())
        }));
    }
    let mut done: HashMap<Uuid, Instant> = HashMap::new();
    let deadline = t0 + Duration::from_secs(600);
    while done.len() < runs {
        // A submitter that failed ends the measurement with its error.
        if let Some(i) = tasks.iter().position(tokio::task::JoinHandle::is_finished) {
            tasks
                .swap_remove(i)
                .await
                .map_err(|e| Error::Usage(format!("submitter: {e}")))??;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left.min(Duration::from_secs(1)), events.recv()).await {
            Ok(Ok(e)) if e.state == RunState::Completed => {
                done.insert(e.run_id, Instant::now());
            }
            Ok(Ok(_)) | Err(_) => {}
            Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => {}
            Ok(Err(_)) => return Err(Error::Usage("the engine stopped".into())),
        }
        if Instant::now() >= deadline {
            return Err(Error::Usage(format!(
                "only {} of {runs} runs completed in 600 s",
                done.len()
            )));
        }
    }
    for t in tasks {
        t.await
            .map_err(|e| Error::Usage(format!("submitter: {e}")))??;
    }
    let wall = t0.elapsed();
    let submitted = submitted.lock().unwrap_or_else(PoisonError::into_inner);
    let mut latency = Latencies::new();
    let mut ids = Vec::new();
    for (id, at) in submitted.iter() {
        if let Some(end) = done.get(id) {
            latency.record(end.saturating_duration_since(*at));
            ids.push(*id);
        }
    }
    Ok(Phase { ids, wall, latency })
}

/// One flooding client: sends requests of `kind` until `stop`, tallying the answers.
async fn client(
    kind: &'static str,
    http: reqwest::Client,
    base: String,
    view: String,
    run: Uuid,
    stop: Arc<AtomicBool>,
    tally: Tally,
) {
    let count = |status: u16| {
        *tally
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((kind, status))
            .or_default() += 1;
    };
    while !stop.load(Ordering::SeqCst) {
        let sent = match kind {
            k if k == KINDS[0] => {
                http.get(format!("{base}/api/v1/definitions"))
                    .bearer_auth("not-a-token-of-this-server")
                    .send()
                    .await
            }
            k if k == KINDS[1] => {
                let token = format!("{}.{}.{}", Uuid::new_v4().simple(), secret(), secret());
                http.post(format!("{base}/api/v1/callbacks"))
                    .header("Sagaflow-Callback-Token", token)
                    .json(&serde_json::json!({ "ok": true }))
                    .send()
                    .await
            }
            k if k == KINDS[2] => {
                http.get(format!("{base}/api/v1/runs/{run}/events"))
                    .bearer_auth(&view)
                    .send()
                    .await
            }
            _ => {
                http.post(format!("{base}/console/login"))
                    .header("content-type", "application/x-www-form-urlencoded")
                    .body("token=not-a-token-of-this-server")
                    .send()
                    .await
            }
        };
        let Ok(r) = sent else { continue };
        let status = r.status().as_u16();
        count(status);
        // An admitted stream is read to its end: the run it follows is finished, so it ends
        // after one read of the run, and the client opens another.
        let _ = r.bytes().await;
    }
}
