//! `sagaflow-demo`: runs a batch of order sagas against simulated, fault-injecting remote
//! services on an embedded SQLite file (or the database you point it at), lets an operator
//! rescue the run that needs one, and proves from the services' ledger that no effect was
//! applied twice and every saga ended net-consistent.
//!
//! ```text
//! cargo run --release -p sagaflow-workflows --bin sagaflow-demo -- --orders 200
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use sagaflow::{
    AlertRow, DeadlinePolicy, Engine, Error as EngineError, HistoryRow, RunState, StartOptions,
    StepError,
};
use sagaflow_workflows::order::{ORDER_WORKFLOW, Order, OrderApis, OrderSettings, order_saga};
use sagaflow_workflows::services::{
    FaultCounts, FaultPlan, Operation, OrderStatus, Scripted, Service, ServicePlans, Services,
};
use tokio::sync::{broadcast, mpsc};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use uuid::Uuid;

type AnyError = Box<dyn std::error::Error + Send + Sync>;
type AnyResult<T> = Result<T, AnyError>;

/// Runs N order sagas (reserve stock → charge card → ship) through injected transient
/// errors, hung calls and permanent refusals, then shows what the engine did about them.
#[derive(Debug, Parser)]
#[command(name = "sagaflow-demo", version)]
struct Args {
    /// Number of orders (one saga run each).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    orders: u32,

    /// Database URL. Default: a fresh SQLite file, ./.sagaflow/sagaflow-demo.db.
    /// A URL you give is used as is (nothing is deleted).
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,

    /// Share of calls (every service) that fail transiently without applying.
    #[arg(long, default_value_t = 0.10, value_parser = rate)]
    transient: f64,

    /// Share of calls (every service) that apply their effect and then never answer.
    #[arg(long, default_value_t = 0.02, value_parser = rate)]
    hang: f64,

    /// Share of forward calls (reserve, charge, ship) refused for good.
    #[arg(long, default_value_t = 0.03, value_parser = rate)]
    permanent: f64,

    /// Seed of the random fault decisions.
    #[arg(long, default_value_t = 42)]
    seed: u64,

    /// Deadline of a step attempt in milliseconds; the supervisor extends it up to 4x.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    deadline_ms: u64,

    /// Simulated processing time of every remote call, in milliseconds.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    latency_ms: u64,

    /// Steps in flight at most.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    concurrency: u32,

    /// Skip the operator act (runs needing an operator stay in error).
    #[arg(long)]
    no_operator: bool,

    /// Silence the engine's own log lines (otherwise RUST_LOG, default `warn`).
    #[arg(long)]
    quiet_logs: bool,

    /// Give up waiting for the runs after this many seconds (default: 120 + 1 per 10 orders).
    #[arg(long, hide = true)]
    timeout_secs: Option<u64>,
}

fn rate(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not a share between 0 and 1"))
    }
}

// ---------------------------------------------------------------------------------------------
// Logging that does not tear the progress bar apart.

/// Hands every formatted log line to the progress bar (printed above it) while one is shown.
#[derive(Debug, Clone, Default)]
struct LogWriter {
    bar: Arc<Mutex<Option<ProgressBar>>>,
}

impl LogWriter {
    fn set_bar(&self, bar: Option<ProgressBar>) {
        *self.bar.lock().unwrap_or_else(PoisonError::into_inner) = bar;
    }
}

impl<'a> MakeWriter<'a> for LogWriter {
    type Writer = LogLine;

    fn make_writer(&'a self) -> LogLine {
        LogLine {
            buf: Vec::new(),
            bar: self
                .bar
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        }
    }
}

#[derive(Debug)]
struct LogLine {
    buf: Vec<u8>,
    bar: Option<ProgressBar>,
}

impl std::io::Write for LogLine {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogLine {
    fn drop(&mut self) {
        let write = || {
            let _ = std::io::stderr().lock().write_all(&self.buf);
        };
        match &self.bar {
            Some(bar) => bar.suspend(write),
            None => write(),
        }
    }
}

fn init_logging(args: &Args, writer: LogWriter) {
    // Alerts are printed by the demo itself (from `subscribe_alerts`), so the tracing alert
    // sink is muted by default; everything else at `warn` and above still shows.
    let filter = if args.quiet_logs {
        EnvFilter::new("off")
    } else {
        EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| EnvFilter::new("warn,sagaflow_engine::hub=off"))
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}

// ---------------------------------------------------------------------------------------------
// Database.

struct Database {
    url: String,
    label: String,
    /// Whether this is the demo's own throwaway file.
    own: bool,
}

fn prepare_database(arg: Option<&str>) -> AnyResult<Database> {
    if let Some(url) = arg.filter(|u| !u.trim().is_empty()) {
        let kind = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            "PostgreSQL"
        } else if url.starts_with("sqlite:") {
            "SQLite"
        } else {
            "database"
        };
        return Ok(Database {
            url: url.to_owned(),
            label: format!(
                "{kind} {} (used as is; only this demo's runs are counted)",
                redact(url)
            ),
            own: false,
        });
    }
    let dir = std::env::current_dir()?.join(".sagaflow");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let file: PathBuf = dir.join("sagaflow-demo.db");
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut p = file.clone().into_os_string();
        p.push(suffix);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(format!(
                    "cannot delete the old demo database {}: {e}",
                    PathBuf::from(p).display()
                )
                .into());
            }
        }
    }
    Ok(Database {
        url: format!("sqlite://{}?mode=rwc", file.display()),
        label: "SQLite ./.sagaflow/sagaflow-demo.db (fresh file)".to_owned(),
        own: true,
    })
}

/// Hides the password of `scheme://user:password@host/...`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host)) = rest.split_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

// ---------------------------------------------------------------------------------------------
// Small formatting helpers.

fn pct(x: f64) -> String {
    let p = x * 100.0;
    if (p - p.round()).abs() < 1e-9 {
        format!("{p:.0}%")
    } else {
        format!("{p}%")
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

fn plural(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

fn rule(title: &str) -> String {
    let width: usize = 72;
    let head = format!("── {title} ");
    let fill = width.saturating_sub(head.chars().count());
    format!("{head}{}", "─".repeat(fill))
}

fn short_id(id: Uuid) -> String {
    let s = id.simple().to_string();
    format!("{}…", &s[s.len().saturating_sub(8)..])
}

/// Splits an alert reason into its headline and the last step error, nicely formatted.
fn split_reason(reason: &str) -> (String, Option<String>) {
    match reason.split_once("; last error: ") {
        Some((head, err)) => {
            let err = match serde_json::from_str::<StepError>(err) {
                Ok(e) => describe_error(&e),
                Err(_) => err.to_owned(),
            };
            (head.to_owned(), Some(err))
        }
        None => (reason.to_owned(), None),
    }
}

/// `code: message`, without repeating the code when the message already starts with it.
fn describe_error(e: &StepError) -> String {
    if e.message.starts_with(&e.code) {
        e.message.clone()
    } else {
        format!("{}: {}", e.code, e.message)
    }
}

/// How long ago, readable at any scale.
fn since(t: Instant) -> String {
    let d = t.elapsed();
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        secs(d)
    }
}

/// The business operation a step's compensation calls.
fn undo_of(step: &str) -> &str {
    match step {
        "reserve_stock" => "release",
        "charge_card" => "refund",
        other => other,
    }
}

// ---------------------------------------------------------------------------------------------
// Tracking runs while they execute.

#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    completed: usize,
    compensated: usize,
    error: usize,
}

impl Tally {
    fn done(&self) -> usize {
        self.completed + self.compensated + self.error
    }

    fn add(&mut self, s: RunState) {
        match s {
            RunState::Completed => self.completed += 1,
            RunState::Compensated => self.compensated += 1,
            RunState::Error => self.error += 1,
            _ => {}
        }
    }

    /// Fits next to the progress bar on an 80-column terminal.
    fn compact(&self) -> String {
        format!(
            "✔ {} completed  ↺ {} compensated  ✘ {} error",
            self.completed, self.compensated, self.error
        )
    }

    fn line(&self) -> String {
        format!(
            "✔ {} completed   ↺ {} compensated   ✘ {} error",
            self.completed, self.compensated, self.error
        )
    }
}

struct Tracker {
    /// Accepted runs in submission order, with their order.
    runs: Vec<(Order, Uuid)>,
    by_id: HashMap<Uuid, usize>,
    /// Latest state seen per run id (from events or polling); may precede `runs`.
    latest: HashMap<Uuid, RunState>,
    rejected: Vec<(Order, String)>,
    submitted_all: bool,
}

impl Tracker {
    fn new() -> Self {
        Self {
            runs: Vec::new(),
            by_id: HashMap::new(),
            latest: HashMap::new(),
            rejected: Vec::new(),
            submitted_all: false,
        }
    }

    fn tally(&self) -> Tally {
        let mut t = Tally::default();
        for (_, id) in &self.runs {
            if let Some(s) = self.latest.get(id) {
                t.add(*s);
            }
        }
        t
    }

    fn unfinished(&self) -> Vec<Uuid> {
        self.runs
            .iter()
            .map(|(_, id)| *id)
            .filter(|id| !self.latest.get(id).is_some_and(|s| s.is_terminal()))
            .collect()
    }

    fn order_of(&self, id: Uuid) -> Option<&str> {
        self.by_id
            .get(&id)
            .map(|&i| self.runs[i].0.order_id.as_str())
    }

    fn name(&self, id: Uuid) -> String {
        self.order_of(id)
            .map_or_else(|| format!("run {id}"), str::to_owned)
    }

    fn see(&mut self, id: Uuid, state: RunState) {
        self.latest.insert(id, state);
    }

    /// Re-reads the state of every unfinished run from the database.
    async fn reconcile(&mut self, engine: &Engine) -> AnyResult<()> {
        for id in self.unfinished() {
            if let Some(run) = engine.run(id).await? {
                self.see(id, run.state);
            }
        }
        Ok(())
    }
}

enum Submission {
    Accepted(Order, Uuid),
    Rejected(Order, String),
    Done,
}

/// Shows progress: a bar on a terminal, a line every ~10% otherwise.
struct Progress {
    bar: Option<ProgressBar>,
    total: usize,
    next_decile: usize,
    started: Instant,
}

impl Progress {
    fn new(total: usize, logs: &LogWriter) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total as u64);
            let style = ProgressStyle::with_template(
                "  {spinner:.green} [{bar:16.cyan/blue}] {pos:>4}/{len} {wide_msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("█▉▊▋▌▍▎▏ ");
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        logs.set_bar(bar.clone());
        Self {
            bar,
            total,
            next_decile: 1,
            started: Instant::now(),
        }
    }

    fn update(&mut self, t: &Tracker) {
        let tally = t.tally();
        let done = tally.done();
        match &self.bar {
            Some(bar) => {
                bar.set_position(done as u64);
                let waiting = if t.submitted_all {
                    String::new()
                } else {
                    format!(
                        "  · submitted {}/{}",
                        t.runs.len() + t.rejected.len(),
                        self.total
                    )
                };
                bar.set_message(format!("{}{waiting}", tally.compact()));
            }
            None => {
                while self.next_decile <= 10 && done * 10 >= self.next_decile * self.total {
                    println!(
                        "  {:>4}  {:>6}/{} finished   {}   ({})",
                        format!("{}%", self.next_decile * 10),
                        done,
                        self.total,
                        tally.line(),
                        secs(self.started.elapsed())
                    );
                    self.next_decile += 1;
                }
            }
        }
    }

    /// Prints a line above the bar (or plainly).
    fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => println!("{line}"),
        }
    }

    fn finish(&self, logs: &LogWriter) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        logs.set_bar(None);
    }
}

fn alert_line(t: &Tracker, a: &AlertRow) -> String {
    let who = a
        .run_id
        .map_or_else(|| "engine".to_owned(), |id| t.name(id));
    let (head, err) = split_reason(&a.reason);
    let why = err.map(|e| format!(" ({e})")).unwrap_or_default();
    format!("  ⚠ alert: {who}: {head}{why}; it waits for an operator")
}

enum PhaseEnd {
    AllTerminal,
    TimedOut,
    Interrupted,
}

async fn run_orders(
    engine: &Engine,
    orders: Vec<Order>,
    timeout: Duration,
    logs: &LogWriter,
    tracker: &mut Tracker,
) -> AnyResult<PhaseEnd> {
    let total = orders.len();
    let mut events = engine.subscribe();
    let mut alerts = engine.subscribe_alerts();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let submitter = {
        let engine = engine.clone();
        tokio::spawn(async move {
            for order in orders {
                let opts = StartOptions::keyed(order.order_id.clone());
                let msg = match engine.start_with(ORDER_WORKFLOW, &order, opts).await {
                    Ok(s) => Submission::Accepted(order, s.id),
                    Err(e @ EngineError::DuplicateActive { .. }) => {
                        Submission::Rejected(order, e.to_string())
                    }
                    Err(e) => {
                        let _ = tx.send(Submission::Rejected(order, e.to_string()));
                        return Err(e);
                    }
                };
                if tx.send(msg).is_err() {
                    break;
                }
            }
            let _ = tx.send(Submission::Done);
            Ok(())
        })
    };

    let mut progress = Progress::new(total, logs);
    let deadline = tokio::time::Instant::now() + timeout;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut last_change = Instant::now();
    let mut last_done = 0;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);

    let end = loop {
        if tracker.submitted_all && tracker.unfinished().is_empty() {
            break PhaseEnd::AllTerminal;
        }
        tokio::select! {
            msg = rx.recv(), if !tracker.submitted_all => match msg {
                Some(Submission::Accepted(order, id)) => {
                    tracker.by_id.insert(id, tracker.runs.len());
                    tracker.runs.push((order, id));
                }
                Some(Submission::Rejected(order, why)) => {
                    progress.println(&format!("  ✘ {} not started: {why}", order.order_id));
                    tracker.rejected.push((order, why));
                }
                Some(Submission::Done) | None => tracker.submitted_all = true,
            },
            ev = events.recv() => match ev {
                Ok(e) => tracker.see(e.run_id, e.state),
                Err(broadcast::error::RecvError::Lagged(_)) => tracker.reconcile(engine).await?,
                Err(broadcast::error::RecvError::Closed) => return Err("the engine stopped publishing events".into()),
            },
            a = alerts.recv() => if let Ok(a) = a {
                progress.println(&alert_line(tracker, &a));
            },
            _ = tick.tick() => {
                // Events are the fast path; after 2 s without progress, ask the database.
                if last_change.elapsed() > Duration::from_secs(2) {
                    tracker.reconcile(engine).await?;
                    last_change = Instant::now();
                }
            },
            () = tokio::time::sleep_until(deadline) => break PhaseEnd::TimedOut,
            _ = &mut ctrl_c => break PhaseEnd::Interrupted,
        }
        let done = tracker.tally().done();
        if done != last_done {
            last_done = done;
            last_change = Instant::now();
        }
        progress.update(tracker);
    };
    progress.update(tracker);
    progress.finish(logs);
    if !matches!(end, PhaseEnd::AllTerminal) {
        submitter.abort();
    }
    if let Ok(Err(e)) = submitter.await {
        return Err(format!("submitting orders failed: {e}").into());
    }
    Ok(end)
}

// ---------------------------------------------------------------------------------------------
// The operator act.

async fn operator_act(
    engine: &Engine,
    services: &Services,
    tracker: &mut Tracker,
    deadline_cap: Duration,
) -> AnyResult<()> {
    println!();
    println!("{}", rule("Operator"));
    let mine: Vec<AlertRow> = engine
        .open_alerts()
        .await?
        .into_iter()
        .filter(|a| a.run_id.is_some_and(|id| tracker.by_id.contains_key(&id)))
        .collect();
    let refund_script_left = services
        .faults(Service::Payments)
        .scripted_left(Operation::Refund);
    if mine.is_empty() {
        if refund_script_left > 0 {
            println!(
                "  No open alerts: no shipment failed, so no refund was needed and the refund"
            );
            println!(
                "  refusal planted for this act never fired. Try more orders or --permanent 0.05."
            );
        } else {
            println!("  No open alerts: every saga finished on its own.");
        }
        return Ok(());
    }
    println!(
        "  {}:",
        plural(mine.len() as u64, "open alert", "open alerts")
    );
    const DETAILED: usize = 5;
    for a in mine.iter().take(DETAILED) {
        let (head, err) = split_reason(&a.reason);
        let run = a.run_id.map_or_else(String::new, |id| {
            format!("{} · run {}", tracker.name(id), short_id(id))
        });
        println!();
        println!("  ⚠ #{:<3} {run}", a.id);
        if let Some(step) = &a.step {
            println!("        step        {step}");
        }
        println!("        reason      {head}");
        if let Some(err) = err {
            println!("        last error  {err}");
        }
        println!("        attempts    {}", a.attempts);
        println!("        actions     {}", a.actions.join(" · "));
    }
    if mine.len() > DETAILED {
        println!();
        for a in mine.iter().skip(DETAILED) {
            println!(
                "{}",
                alert_line(tracker, a).replace("  ⚠ alert: ", &format!("  ⚠ #{:<3} ", a.id))
            );
        }
    }
    println!();
    if refund_script_left == 0 {
        println!(
            "  → Fixing the cause: the payments team turns refunds back on (refusal cleared)."
        );
    } else {
        println!("  → Fixing the cause: clearing every scripted refusal.");
    }
    for s in Service::ALL {
        services.faults(s).clear_scripts();
    }

    let mut runs: Vec<Uuid> = mine.iter().filter_map(|a| a.run_id).collect();
    runs.dedup();
    // The run whose story is told: the one hit by the planted refusal, else the first.
    let showcase = mine
        .iter()
        .find(|a| a.reason.contains("(scripted)"))
        .or_else(|| mine.first())
        .and_then(|a| a.run_id);
    let mut told = None;
    for id in runs {
        let name = tracker.name(id);
        let started = Instant::now();
        let history_len = engine.history(id).await?.len();
        match engine.operator().resume(id).await {
            Ok(state) => println!("  → operator resume {name}: the run is {state} again"),
            Err(e) => {
                println!("  ✘ operator resume {name} refused: {e}");
                continue;
            }
        }
        let wait_for = Duration::from_secs(30) + deadline_cap * 4;
        match engine.wait(id, wait_for).await {
            Ok(run) => {
                tracker.see(id, run.state);
                let history = engine.history(id).await?;
                let after: Vec<String> = history
                    .iter()
                    .skip(history_len)
                    .filter(|h| {
                        h.event == "completed" && h.to_state.as_deref() == Some("compensated")
                    })
                    .filter_map(|h| h.step.as_deref().map(|s| format!("{} ({s})", undo_of(s))))
                    .collect();
                let mark = if run.state == RunState::Error {
                    "✘"
                } else {
                    "✔"
                };
                let did = if after.is_empty() {
                    String::new()
                } else {
                    format!(" after {}", after.join(", then "))
                };
                println!(
                    "  {mark} {name} is {}{did}, {} after the fix",
                    run.state,
                    since(started)
                );
                if Some(id) == showcase {
                    told = Some((name, history));
                }
            }
            Err(e) => println!("  ✘ {name} did not settle after the resume: {e}"),
        }
    }
    if let Some((name, history)) = told {
        println!();
        println!("  The story of {name}:");
        for line in story(&history) {
            println!("    {line}");
        }
    }
    Ok(())
}

/// A compact, readable timeline of one run's history.
fn story(history: &[HistoryRow]) -> Vec<String> {
    let t0 = history.first().map_or(0, |h| h.at);
    let mut out = Vec::new();
    for h in history {
        let at = format!("{:>7.2} s", (h.at - t0) as f64 / 1000.0);
        let step = h.step.as_deref().unwrap_or("run");
        let err = h
            .detail
            .as_deref()
            .and_then(|d| serde_json::from_str::<StepError>(d).ok())
            .map(|e| format!(" — {}", describe_error(&e)))
            .unwrap_or_default();
        let from = h.from_state.as_deref().unwrap_or("");
        let to = h.to_state.as_deref().unwrap_or("");
        let undo = undo_of(step);
        let attempt = h.attempt.unwrap_or(0);
        let what = match (h.event.as_str(), to) {
            ("submitted", _) => "submitted".to_owned(),
            ("state", _) if h.step.is_none() => format!("→ {to}"),
            ("state", "ready") => "queued".to_owned(),
            ("state", "compensation_ready") => format!("compensation queued: {undo}"),
            ("state", other) => other.to_owned(),
            ("completed", "compensated") => format!("compensated: {undo} done"),
            ("completed", _) => format!("completed (attempt {attempt})"),
            ("retry", _) if from == "compensating" => {
                format!("{undo} attempt {attempt} failed, retry scheduled{err}")
            }
            ("retry", _) => format!("attempt {attempt} failed, retry scheduled{err}"),
            ("timeout", "failed" | "compensation_failed") => {
                format!("attempt {attempt} timed out; the supervisor failed it at the threshold")
            }
            ("timeout", _) => format!(
                "attempt {attempt} timed out; the supervisor re-queued it with a longer deadline"
            ),
            ("failed", "compensation_failed") => {
                format!("compensation failed: {undo} refused{err}")
            }
            ("failed", _) => format!("failed{err}"),
            (e, _) if e.starts_with("operator_") => {
                format!("operator: {}", e.trim_start_matches("operator_"))
            }
            (other, _) => format!("{other} {from} → {to}"),
        };
        out.push(format!("{at}  {step:<14} {what}"));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Summary.

#[derive(Debug, Default)]
struct Figures {
    states: BTreeMap<&'static str, usize>,
    retries: u64,
    timeouts: u64,
    compensations: BTreeMap<String, u64>,
    operator_actions: u64,
    alerts: usize,
    not_terminal: Vec<(String, Uuid, RunState)>,
}

async fn gather(
    engine: &Engine,
    tracker: &Tracker,
) -> AnyResult<(Figures, HashMap<Uuid, RunState>)> {
    let mut f = Figures::default();
    let mut finals = HashMap::new();
    for (order, id) in &tracker.runs {
        let state = engine
            .run(*id)
            .await?
            .map_or(RunState::Pending, |r| r.state);
        finals.insert(*id, state);
        f.alerts += engine.run_alerts(*id).await?.len();
        *f.states.entry(state.as_str()).or_default() += 1;
        if !state.is_terminal() {
            f.not_terminal.push((order.order_id.clone(), *id, state));
        }
        for h in engine.history(*id).await? {
            match h.event.as_str() {
                "retry" => f.retries += 1,
                "timeout" => f.timeouts += 1,
                "completed" if h.to_state.as_deref() == Some("compensated") => {
                    let op = h.step.as_deref().map_or("?", undo_of).to_owned();
                    *f.compensations.entry(op).or_default() += 1;
                }
                e if e.starts_with("operator_") => f.operator_actions += 1,
                _ => {}
            }
        }
    }
    Ok((f, finals))
}

struct Table {
    rows: Vec<(String, String, String)>,
}

impl Table {
    fn new() -> Self {
        Self { rows: Vec::new() }
    }

    fn row(&mut self, label: impl Into<String>, value: impl ToString, note: impl Into<String>) {
        self.rows
            .push((label.into(), value.to_string(), note.into()));
    }

    fn print(&self) {
        let lw = self
            .rows
            .iter()
            .map(|r| r.0.chars().count())
            .max()
            .unwrap_or(0);
        let vw = self
            .rows
            .iter()
            .map(|r| r.1.chars().count())
            .max()
            .unwrap_or(0);
        for (l, v, n) in &self.rows {
            let mut line = format!("  {l:<lw$}  {v:>vw$}");
            if !n.is_empty() {
                let _ = write!(line, "   {n}");
            }
            println!("{}", line.trim_end());
        }
    }
}

fn faults_note(c: FaultCounts) -> String {
    format!(
        "{} transient · {} hung · {} permanent",
        c.transient, c.hang, c.permanent
    )
}

/// Prints the summary; returns whether everything checked out.
fn print_summary(
    f: &Figures,
    finals: &HashMap<Uuid, RunState>,
    tracker: &Tracker,
    engine: &Engine,
    services: &Services,
    elapsed: Duration,
) -> bool {
    let mut ok = true;
    let accepted = tracker.runs.len();
    println!();
    println!("{}", rule("Summary"));
    let mut t = Table::new();
    let rate = accepted as f64 / elapsed.as_secs_f64().max(1e-3);
    t.row(
        "Runs",
        accepted,
        format!("in {} · {rate:.1} runs/s", secs(elapsed)),
    );
    let get = |s: RunState| f.states.get(s.as_str()).copied().unwrap_or(0);
    t.row(
        "  ✔ completed",
        get(RunState::Completed),
        "reserved, charged and shipped",
    );
    t.row(
        "  ↺ compensated",
        get(RunState::Compensated),
        "failed before shipping, undone",
    );
    let errors = get(RunState::Error);
    t.row(
        "  ✘ error",
        errors,
        if errors > 0 {
            "waiting for an operator"
        } else {
            ""
        },
    );
    let others = accepted - get(RunState::Completed) - get(RunState::Compensated) - errors;
    if others > 0 {
        t.row("  … not finished", others, "");
    }
    if !tracker.rejected.is_empty() {
        t.row(
            "Not started",
            tracker.rejected.len(),
            "an active run already had the order's key",
        );
    }
    t.row("Retries", f.retries, "failed attempts retried with backoff");
    match engine.supervisor().map(sagaflow::Supervisor::stats) {
        Some(s) => t.row(
            "Supervisor rescues",
            s.requeued + s.failed,
            format!(
                "{} re-queued with a longer deadline · {} failed at the threshold",
                s.requeued, s.failed
            ),
        ),
        None => t.row("Supervisor rescues", "-", "no supervisor in this instance"),
    }
    let comp_total: u64 = f.compensations.values().sum();
    let comp_note = f
        .compensations
        .iter()
        .map(|(op, n)| format!("{n} {op}"))
        .collect::<Vec<_>>()
        .join(" · ");
    t.row("Compensations run", comp_total, comp_note);
    t.row(
        "Alerts raised",
        f.alerts,
        if f.operator_actions > 0 {
            format!(
                "resolved by {}",
                plural(f.operator_actions, "operator action", "operator actions")
            )
        } else {
            String::new()
        },
    );
    let faults = services.fault_counts();
    t.row("Injected faults", faults.total(), faults_note(faults));
    t.print();

    // The ledger of the simulated services: the ground truth of what happened remotely.
    let ids: Vec<String> = tracker
        .runs
        .iter()
        .map(|(o, _)| o.order_id.clone())
        .collect();
    let all = services.ledger().check_orders(&ids);
    let settled: Vec<String> = tracker
        .runs
        .iter()
        .filter(|(_, id)| finals.get(id).is_some_and(|s| s.is_final()))
        .map(|(o, _)| o.order_id.clone())
        .collect();
    let waiting = ids.len() - settled.len();
    let net = services.ledger().check_orders(&settled);
    let twice: Vec<&String> = all
        .violations
        .iter()
        .filter(|v| v.starts_with("key ") || v.contains("times under different keys"))
        .collect();
    let net_violations: Vec<&String> = net
        .violations
        .iter()
        .filter(|v| !(v.starts_with("key ") || v.contains("times under different keys")))
        .collect();
    // The ledger must agree with the engine: completed ⇒ shipped; compensated ⇒ nothing left.
    let mut disagree = Vec::new();
    for (order, id) in &tracker.runs {
        let status = net.orders.get(&order.order_id).copied();
        let expected = match finals.get(id) {
            // Already reported among the net-consistency violations.
            _ if status == Some(OrderStatus::Inconsistent) => true,
            Some(RunState::Completed) => matches!(status, Some(OrderStatus::Shipped)),
            Some(RunState::Compensated) => {
                matches!(
                    status,
                    Some(OrderStatus::Compensated | OrderStatus::Untouched)
                )
            }
            _ => true,
        };
        if !expected {
            let state = finals.get(id).map_or("?", |s| s.as_str());
            let says = match status {
                Some(OrderStatus::Shipped) => "it shipped",
                Some(OrderStatus::Compensated) => "it was undone",
                Some(OrderStatus::Untouched) => "nothing was applied",
                Some(OrderStatus::Inconsistent) => "it is inconsistent",
                None => "nothing about it",
            };
            disagree.push(format!(
                "{} is {state} but the ledger says {says}",
                order.order_id
            ));
        }
    }

    println!();
    println!("{}", rule("Ledger of the remote services"));
    let a = &all.applied;
    let mut t = Table::new();
    t.row(
        "Effects applied",
        a.reserve + a.charge + a.ship + a.release + a.refund,
        format!(
            "reserve {} · charge {} · ship {} · refund {} · release {}",
            a.reserve, a.charge, a.ship, a.refund, a.release
        ),
    );
    t.row(
        "Replays absorbed",
        all.replays,
        "repeated calls answered from the idempotency key, not applied",
    );
    t.print();
    println!();
    let check = |problems: &[&String], text: &str| {
        println!("  {} {text}", if problems.is_empty() { "✔" } else { "✘" });
        const SHOWN: usize = 10;
        for v in problems.iter().take(SHOWN) {
            println!("      - {v}");
        }
        if problems.len() > SHOWN {
            println!("      … and {} more", problems.len() - SHOWN);
        }
    };
    check(&twice, "no effect applied twice");
    let mut net_text =
        "every saga net-consistent (reserved ⇒ shipped or released; charged ⇒ shipped or refunded)"
            .to_owned();
    if waiting > 0 {
        let _ = write!(
            net_text,
            "\n      ({} waiting for an operator not checked)",
            plural(waiting as u64, "run", "runs")
        );
    }
    check(&net_violations, &net_text);
    let disagree: Vec<&String> = disagree.iter().collect();
    check(&disagree, "ledger agrees with every run's final state");
    if !twice.is_empty() || !net_violations.is_empty() || !disagree.is_empty() {
        ok = false;
    }
    if !f.not_terminal.is_empty() {
        ok = false;
        println!();
        println!(
            "  ✘ {} did not reach a terminal state:",
            plural(f.not_terminal.len() as u64, "run", "runs")
        );
        for (order, id, state) in f.not_terminal.iter().take(20) {
            println!("      - {order} (run {id}) is {state}");
        }
    }
    ok
}

// ---------------------------------------------------------------------------------------------

async fn demo(
    args: &Args,
    engine: &Engine,
    services: &Services,
    logs: &LogWriter,
) -> AnyResult<ExitCode> {
    let n = args.orders as usize;
    let orders: Vec<Order> = (1..=n).map(Order::sample).collect();
    let timeout = Duration::from_secs(args.timeout_secs.unwrap_or(120 + n as u64 / 10));
    let mut tracker = Tracker::new();

    println!();
    println!("{}", rule("Running"));
    let started = Instant::now();
    let end = run_orders(engine, orders, timeout, logs, &mut tracker).await?;
    let elapsed = started.elapsed();
    match end {
        PhaseEnd::AllTerminal => {
            println!(
                "  All {} runs reached a terminal state in {}.   {}",
                tracker.runs.len(),
                secs(elapsed),
                tracker.tally().line()
            );
        }
        PhaseEnd::TimedOut | PhaseEnd::Interrupted => {
            let unfinished = tracker.unfinished();
            if matches!(end, PhaseEnd::TimedOut) {
                println!(
                    "  ✘ Timed out after {}: {} not finished.",
                    secs(elapsed),
                    plural(unfinished.len() as u64, "run", "runs")
                );
            } else {
                println!(
                    "  ✘ Interrupted after {}: {} not finished.",
                    secs(elapsed),
                    plural(unfinished.len() as u64, "run", "runs")
                );
            }
            for id in unfinished.iter().take(30) {
                let state = engine
                    .run(*id)
                    .await
                    .ok()
                    .flatten()
                    .map_or_else(|| "unknown".to_owned(), |r| r.state.to_string());
                let steps = engine
                    .steps(*id)
                    .await
                    .map(|s| {
                        s.iter()
                            .map(|s| format!("{}={}", s.name, s.state))
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .unwrap_or_default();
                println!(
                    "      - {} (run {id}) is {state}: {steps}",
                    tracker.name(*id)
                );
            }
            if unfinished.len() > 30 {
                println!("      … and {} more", unfinished.len() - 30);
            }
            if !tracker.submitted_all {
                println!(
                    "      ({} orders were never submitted)",
                    n - tracker.runs.len() - tracker.rejected.len()
                );
            }
            return Ok(ExitCode::from(if matches!(end, PhaseEnd::Interrupted) {
                130
            } else {
                1
            }));
        }
    }

    if args.no_operator {
        let waiting = tracker.tally().error;
        if waiting > 0 {
            println!();
            println!(
                "  (--no-operator: {} left in error)",
                plural(waiting as u64, "run", "runs")
            );
        }
    } else {
        operator_act(
            engine,
            services,
            &mut tracker,
            Duration::from_millis(args.deadline_ms * 4),
        )
        .await?;
    }

    let (figures, finals) = gather(engine, &tracker).await?;
    let ok = print_summary(&figures, &finals, &tracker, engine, services, elapsed);
    println!();
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if args.transient + args.hang > 1.0 {
        eprintln!("error: --transient plus --hang must not exceed 1");
        return ExitCode::from(2);
    }
    let logs = LogWriter::default();
    init_logging(&args, logs.clone());

    let db = match prepare_database(args.database_url.as_deref()) {
        Ok(db) => db,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let deadline = Duration::from_millis(args.deadline_ms);
    let plan = FaultPlan {
        transient: args.transient,
        hang: args.hang,
        permanent: args.permanent,
        seed: args.seed,
        latency: Duration::from_millis(args.latency_ms),
    };
    let services = Services::new(ServicePlans::uniform(plan));
    // Guarantee the operator act has something to show: the first refund is refused once.
    services.script("refund", vec![Scripted::Permanent]);
    let settings = OrderSettings {
        deadline: DeadlinePolicy::new(deadline, deadline * 4),
        ..OrderSettings::default()
    };
    let max_failures = settings
        .retry
        .max_failures
        .map_or_else(|| "unlimited".to_owned(), |n| n.to_string());

    println!(
        "sagaflow demo · {} order sagas: reserve stock → charge card → ship",
        args.orders
    );
    println!("  database   {}", db.label);
    println!(
        "  faults     {} transient · {} hung · {} permanent (forward calls only), on every service · seed {}",
        pct(args.transient),
        pct(args.hang),
        pct(args.permanent),
        args.seed
    );
    println!(
        "  steps      deadline {} ms (up to {} ms after timeouts) · {max_failures} failures max · {} in flight",
        args.deadline_ms,
        args.deadline_ms * 4,
        args.concurrency
    );
    if args.no_operator {
        println!("  operator   off: the refund refused on purpose stays refused");
    } else {
        println!(
            "  operator   the first refund is refused on purpose; the operator fixes it at the end"
        );
    }

    let workflow = match order_saga(OrderApis::from(&services), settings) {
        Ok(wf) => wf,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let engine = Engine::builder()
        .with_database_url(db.url.clone())
        .with_workflow(workflow)
        .with_max_in_flight(args.concurrency as usize)
        .with_poll_interval(Duration::from_millis(50))
        .with_sweep_interval(Duration::from_millis(200))
        .with_lease(Duration::from_secs(3), Duration::from_secs(1))
        .with_retention(None)
        .start()
        .await;
    let engine = match engine {
        Ok(e) => e,
        Err(e) => {
            eprintln!(
                "error: cannot start the engine on {}: {e}",
                if db.own {
                    "the demo database"
                } else {
                    "that database"
                }
            );
            return ExitCode::FAILURE;
        }
    };

    let code = match demo(&args, &engine, &services, &logs).await {
        Ok(code) => code,
        Err(e) => {
            logs.set_bar(None);
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    };
    engine.shutdown().await;
    code
}
