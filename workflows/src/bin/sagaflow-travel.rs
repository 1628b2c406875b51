//! `sagaflow-travel`: books a handful of trips with the travel saga (flight ‖ hotel →
//! capture payment → send itinerary) against simulated services with a few injected faults,
//! prints what happened to each trip, and checks the services' ledger: every effect applied
//! at most once, every paid trip fully booked, every compensated trip netted out. Exits
//! non-zero when the check fails.
//!
//! ```text
//! cargo run --release --bin sagaflow-travel
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use clap::Parser;
use sagaflow::{Engine, HistoryKind, Run, RunState, StartOptions};
use sagaflow_testkit::services::{
    EffectRecord, FaultPlan, ItineraryRequest, ItinerarySent, MailerApi, Operation, Scripted,
    ServiceError, ServicePlans, Services, TripStatus,
};
use sagaflow_workflows::Error;
use sagaflow_workflows::database::{Database, prepare};
use sagaflow_workflows::travel::{TRAVEL_WORKFLOW, TravelApis, TravelSettings, Trip, travel_saga};
use uuid::Uuid;

/// Books N trips with the travel saga through injected faults (a sold-out hotel, a full
/// flight, a declined card, a flaky itinerary mailer, a lost reply, random transient
/// errors), then shows what the engine did about them.
#[derive(Debug, Parser)]
#[command(name = "sagaflow-travel", version)]
struct Args {
    /// Number of trips (one saga run each).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    trips: u32,

    /// Database URL. Default: a fresh SQLite file, ./.sagaflow/sagaflow-travel.db.
    /// A URL you give is used as is (nothing is deleted).
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,

    /// Seed of the random transient faults.
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

/// The faults every run meets: a random share of transient errors on every call, plus a few
/// scripted outcomes that hit the n-th call of an operation, whichever trip makes it.
fn services(seed: u64) -> Services {
    let services = Services::new(ServicePlans::uniform(FaultPlan {
        transient: 0.05,
        latency: Duration::from_millis(10),
        ..FaultPlan::seeded(seed)
    }));
    // The n-th call of an operation (retries included) meets the outcome given for n.
    let calls = |faults: &[(usize, Scripted)]| -> Vec<Scripted> {
        let last = faults.iter().map(|(n, _)| *n).max().unwrap_or(0);
        (1..=last)
            .map(|i| {
                faults
                    .iter()
                    .find(|(n, _)| *n == i)
                    .map_or(Scripted::Ok, |f| f.1)
            })
            .collect()
    };
    services.script(
        "book_flight",
        calls(&[(2, Scripted::ResetAfterApply), (7, Scripted::Permanent)]),
    );
    services.script("book_hotel", calls(&[(3, Scripted::Permanent)]));
    services.script("charge", calls(&[(9, Scripted::Permanent)]));
    services
}

/// The trip whose itinerary mail keeps bouncing, and how many times.
const FLAKY_TRIP: &str = "trip-0005";
const FLAKY_TIMES: u32 = 5;

/// A mailer whose first [`FLAKY_TIMES`] calls for [`FLAKY_TRIP`] fail transiently (the mail
/// server greylists the address), more than the saga's failure threshold: a retriable step
/// is retried anyway.
#[derive(Debug)]
struct FlakyMailer {
    inner: Arc<dyn MailerApi>,
    left: AtomicU32,
}

#[async_trait]
impl MailerApi for FlakyMailer {
    async fn send_itinerary(
        &self,
        key: &str,
        req: ItineraryRequest,
    ) -> Result<ItinerarySent, ServiceError> {
        let bounce = req.trip_id == FLAKY_TRIP
            && self
                .left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if bounce {
            return Err(ServiceError::Transient("address greylisted".into()));
        }
        self.inner.send_itinerary(key, req).await
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let db = match prepare(args.database_url.as_deref(), "sagaflow-travel") {
        Ok(db) => db,
        Err(e) => return fail(e),
    };
    let services = services(args.seed);
    let engine = match start(&db, &services).await {
        Ok(engine) => engine,
        Err(e) => return fail(e),
    };
    println!(
        "sagaflow travel · {} trips: book flight ‖ book hotel → capture payment (pivot) → send itinerary (retriable)",
        args.trips
    );
    println!("  database  {}", db.label);
    println!("  faults    5% transient errors on every call · flight request 2 loses its reply");
    println!(
        "            hotel request 3: sold out · flight request 7: full · payment 9: declined"
    );
    println!(
        "            {FLAKY_TRIP}'s itinerary mail bounces {FLAKY_TIMES} times (the threshold is 4 failures)"
    );
    println!();
    let code = tokio::select! {
        r = book(&engine, &services, args.trips as usize) => r.unwrap_or_else(fail),
        e = engine.fatal_error() => fail(e),
    };
    engine.shutdown().await;
    code
}

/// Starts the engine on `db` with the travel saga.
async fn start(db: &Database, services: &Services) -> Result<Engine, Error> {
    let mailer = Arc::new(FlakyMailer {
        inner: services.mailer(),
        left: AtomicU32::new(FLAKY_TIMES),
    });
    let apis = TravelApis {
        mailer,
        ..TravelApis::from(services)
    };
    let workflow = travel_saga(apis, TravelSettings::default())
        .map_err(|e| Error::engine("the travel saga does not build", e))?;
    Engine::builder()
        .with_database_url(db.url.clone())
        .with_workflow(workflow)
        .with_poll_interval(Duration::from_millis(50))
        .with_sweep_interval(Duration::from_millis(200))
        .start()
        .await
        .map_err(|e| Error::engine("cannot start the engine", e))
}

/// Prints `error: …` and gives the failure exit code.
fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::FAILURE
}

/// Books the trips, prints one line per trip, then checks the ledger.
async fn book(engine: &Engine, services: &Services, n: usize) -> Result<ExitCode, Error> {
    let trips: Vec<Trip> = (1..=n).map(Trip::sample).collect();
    let mut ids: Vec<Uuid> = Vec::with_capacity(n);
    for trip in &trips {
        let key = StartOptions::keyed(trip.trip_id.clone());
        let started = engine
            .start_with(TRAVEL_WORKFLOW, trip, key)
            .await
            .map_err(|e| Error::engine(format!("cannot start {}", trip.trip_id), e))?;
        ids.push(started.id);
    }
    let mut runs = Vec::with_capacity(n);
    for (trip, id) in trips.iter().zip(ids) {
        let run = engine
            .wait(id, Duration::from_secs(120))
            .await
            .map_err(|e| Error::engine(format!("waiting for {}", trip.trip_id), e))?;
        runs.push((run, retries(engine, id).await?));
    }
    let trip_ids: Vec<String> = trips.iter().map(|t| t.trip_id.clone()).collect();
    let report = services.ledger().check_trips(&trip_ids);
    let mut mismatches = Vec::new();
    for (trip, (run, retried)) in trips.iter().zip(&runs) {
        let records = services.ledger().records_for_order(&trip.trip_id);
        println!(
            "  {}  {:<8} {} → {}  {} nights  €{:>7}  {:<11}  {}",
            trip.trip_id,
            trip.traveller,
            trip.from,
            trip.to,
            trip.nights,
            euros(trip.amount_cents),
            run.state.to_string(),
            story(run, &records, retried)
        );
        let status = report.trips[&trip.trip_id];
        let agrees = match run.state {
            RunState::Completed => {
                status == TripStatus::Paid
                    && records
                        .iter()
                        .any(|r| r.operation == Operation::SendItinerary)
            }
            RunState::Compensated => {
                matches!(status, TripStatus::Cancelled | TripStatus::Untouched)
            }
            _ => false,
        };
        if !agrees {
            mismatches.push(format!(
                "{} ended {} but the ledger says {status:?}",
                trip.trip_id, run.state
            ));
        }
    }
    println!();
    println!("Ledger check");
    let ledger = services.ledger();
    println!(
        "  effects   {} applied, each under its own idempotency key; {} repeated call(s) answered from the ledger",
        ledger.len(),
        ledger.total_replays()
    );
    println!(
        "  trips     {} paid and booked, {} compensated with every booking cancelled, {} untouched",
        report.count(TripStatus::Paid),
        report.count(TripStatus::Cancelled),
        report.count(TripStatus::Untouched)
    );
    let problems: Vec<&String> = report.violations.iter().chain(&mismatches).collect();
    if problems.is_empty() {
        println!("  verdict   ✓ no effect applied twice, every compensated trip nets out");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("  verdict   ✗ {} problem(s):", problems.len());
        for p in problems {
            println!("            - {p}");
        }
        Ok(ExitCode::FAILURE)
    }
}

/// Retries per step of a run, from its history.
async fn retries(engine: &Engine, id: Uuid) -> Result<Vec<(String, usize)>, Error> {
    let history = engine
        .history(id)
        .await
        .map_err(|e| Error::engine("reading a history", e))?;
    let mut counts: Vec<(String, usize)> = Vec::new();
    for step in history
        .iter()
        .filter(|h| h.kind == HistoryKind::Retry)
        .filter_map(|h| h.step.clone())
    {
        match counts.iter_mut().find(|(s, _)| *s == step) {
            Some((_, n)) => *n += 1,
            None => counts.push((step, 1)),
        }
    }
    Ok(counts)
}

/// What happened to one trip: what was booked (and cancelled), paid and sent, why it
/// unwound if it did, and which steps needed retries.
fn story(run: &Run, records: &[EffectRecord], retried: &[(String, usize)]) -> String {
    let done = |op: Operation| records.iter().any(|r| r.operation == op);
    let mut parts = Vec::new();
    for r in records {
        let field = |name: &str| r.response.get(name).and_then(|v| v.as_str()).unwrap_or("?");
        let (what, cancel) = match r.operation {
            Operation::BookFlight => ("flight", Operation::CancelFlight),
            Operation::BookHotel => ("hotel", Operation::CancelHotel),
            Operation::Charge => {
                parts.push(format!("paid {}", field("charge_id")));
                continue;
            }
            Operation::SendItinerary => {
                parts.push(format!("itinerary {}", field("message_id")));
                continue;
            }
            _ => continue,
        };
        let replayed = if r.replays > 0 { " (replayed)" } else { "" };
        let cancelled = if done(cancel) { " cancelled" } else { "" };
        parts.push(format!(
            "{what} {}{replayed}{cancelled}",
            field("booking_id")
        ));
    }
    if run.state == RunState::Compensated {
        if let Some(why) = run.error.as_ref().and_then(reason) {
            parts.push(format!("✗ {why}"));
        }
        if !done(Operation::Charge) {
            parts.push("nothing paid".into());
        }
    }
    for (step, n) in retried {
        parts.push(format!("{step} retried {n}×"));
    }
    parts.join(" · ")
}

/// The business reason in a stored step error: `"permanent remote failure: hotel sold out
/// (scripted)"` → `"hotel sold out (scripted)"`.
fn reason(error: &serde_json::Value) -> Option<String> {
    let message = error.get("message")?.as_str()?;
    Some(message.rsplit(": ").next().unwrap_or(message).to_owned())
}

/// `123456` cents → `"1234.56"`.
fn euros(cents: u64) -> String {
    format!("{}.{:02}", cents / 100, cents % 100)
}
