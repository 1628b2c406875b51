//! The travel saga: parallel bookings joined by a pivot, and a retriable last step. Flight
//! and hotel are booked at the same time; a refused booking cancels the other one and
//! nothing is paid; a flaky mailer is retried past the failure threshold without undoing
//! anything (SAS-2, SAS-4).

use sagaflow::EntityState;
use sagaflow::HistoryKind;
use sagaflow::StepState;
use std::convert::identity;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sagaflow::{Engine, RunState, StartOptions};
use sagaflow_testkit::services::{
    BookRequest, Booking, BookingApi, CancelRequest, Cancelled, Operation, Scripted, ServiceError,
    Services, TripStatus,
};
use sagaflow_testkit::{TestDb, backends, expect_state};
use sagaflow_workflows::travel::{TRAVEL_WORKFLOW, TravelApis, Trip, travel_saga};
use tokio::sync::Barrier;
use uuid::Uuid;

use crate::fixtures::order_settings;

/// Failure threshold of every step: the flaky mailer fails more often than this.
const MAX_FAILURES: u32 = 3;

/// An engine running the travel saga over fresh in-process services, as `wrap` wraps them.
async fn travel_rig(
    db: &TestDb,
    wrap: impl FnOnce(TravelApis) -> TravelApis,
) -> (Services, Engine) {
    let services = Services::default();
    let apis = wrap(TravelApis::from(&services));
    let wf = travel_saga(apis, order_settings(5000, MAX_FAILURES)).expect("saga");
    (
        services.clone(),
        sagaflow_testkit::engine(db, vec![wf]).await,
    )
}

async fn book_trip(engine: &Engine, n: usize) -> (Uuid, Trip) {
    let trip = Trip::sample(n);
    let key = StartOptions::keyed(trip.trip_id.clone());
    let started = engine
        .start_with(TRAVEL_WORKFLOW, &trip, key)
        .await
        .expect("start trip");
    (started.id, trip)
}

/// How many effects of `op` the ledger holds for `trip`.
fn applied(services: &Services, trip: &Trip, op: Operation) -> usize {
    let records = services.ledger().records_for_order(&trip.trip_id);
    records.iter().filter(|r| r.operation == op).count()
}

/// The ledger check of `trip` finds no violation and the trip in `status`.
fn assert_ledger(services: &Services, trip: &Trip, status: TripStatus, backend: &str) {
    let report = services
        .ledger()
        .check_trips(std::slice::from_ref(&trip.trip_id));
    assert!(
        report.is_consistent(),
        "[{backend}] {:?}",
        report.violations
    );
    assert_eq!(report.trips[&trip.trip_id], status, "[{backend}]");
}

/// A booking service whose first booking waits until the other service's first booking
/// arrives too (at most 10 s): both `met` only if the two were in flight at once.
#[derive(Debug)]
struct Rendezvous {
    inner: Arc<dyn BookingApi>,
    barrier: Arc<Barrier>,
    first: AtomicBool,
    met: Arc<AtomicUsize>,
}

#[async_trait]
impl BookingApi for Rendezvous {
    async fn book(&self, key: &str, req: BookRequest) -> Result<Booking, ServiceError> {
        if self.first.swap(false, Ordering::SeqCst) {
            let wait = self.barrier.wait();
            if tokio::time::timeout(Duration::from_secs(10), wait)
                .await
                .is_ok()
            {
                self.met.fetch_add(1, Ordering::SeqCst);
            }
        }
        self.inner.book(key, req).await
    }

    async fn cancel(&self, key: &str, req: CancelRequest) -> Result<Cancelled, ServiceError> {
        self.inner.cancel(key, req).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flight_and_hotel_are_booked_in_parallel_then_paid_and_mailed() {
    for db in backends().await {
        let barrier = Arc::new(Barrier::new(2));
        let met = Arc::new(AtomicUsize::new(0));
        let meet = |inner: Arc<dyn BookingApi>| -> Arc<dyn BookingApi> {
            Arc::new(Rendezvous {
                inner,
                barrier: barrier.clone(),
                first: AtomicBool::new(true),
                met: met.clone(),
            })
        };
        let (services, engine) = travel_rig(&db, |apis| TravelApis {
            flights: meet(apis.flights.clone()),
            hotels: meet(apis.hotels.clone()),
            ..apis
        })
        .await;
        let (id, trip) = book_trip(&engine, 1).await;
        expect_state(&engine, id, RunState::Completed, db.backend).await;

        assert_eq!(
            met.load(Ordering::SeqCst),
            2,
            "[{}] both bookings were in flight at once",
            db.backend
        );
        let records = services.ledger().records_for_order(&trip.trip_id);
        let seq = |op: Operation| {
            records
                .iter()
                .find(|r| r.operation == op)
                .map(|r| r.seq)
                .unwrap_or_else(|| panic!("[{}] no {op} in {records:?}", db.backend))
        };
        assert!(seq(Operation::Charge) > seq(Operation::BookFlight));
        assert!(seq(Operation::Charge) > seq(Operation::BookHotel));
        assert!(seq(Operation::SendItinerary) > seq(Operation::Charge));
        assert_eq!(records.len(), 4, "[{}] {records:?}", db.backend);
        assert_ledger(&services, &trip, TripStatus::Paid, db.backend);
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sold_out_hotel_cancels_the_flight_and_nothing_is_paid() {
    for db in backends().await {
        let (services, engine) = travel_rig(&db, identity).await;
        services.script("book_hotel", vec![Scripted::Permanent]);
        let (id, trip) = book_trip(&engine, 2).await;
        expect_state(&engine, id, RunState::Compensated, db.backend).await;

        let history = engine.history(id).await.expect("history");
        let events = |step: &str| -> Vec<(HistoryKind, Option<StepState>)> {
            history
                .iter()
                .filter(|h| h.step.as_deref() == Some(step))
                .map(|h| (h.kind.clone(), h.to.and_then(EntityState::step)))
                .collect()
        };
        let hotel = events("book_hotel");
        assert_eq!(
            hotel,
            [(HistoryKind::Failed, Some(StepState::Failed))],
            "[{}] refused once: not retried, nothing to undo",
            db.backend
        );
        assert!(
            events("book_flight")
                .iter()
                .any(|(_, to)| *to == Some(StepState::Compensated)),
            "[{}] the flight was compensated",
            db.backend
        );

        assert_eq!(applied(&services, &trip, Operation::BookFlight), 1);
        assert_eq!(applied(&services, &trip, Operation::CancelFlight), 1);
        for nothing in [
            Operation::BookHotel,
            Operation::CancelHotel,
            Operation::Charge,
            Operation::SendItinerary,
        ] {
            assert_eq!(
                applied(&services, &trip, nothing),
                0,
                "[{}] {nothing}",
                db.backend
            );
        }
        assert_ledger(&services, &trip, TripStatus::Cancelled, db.backend);
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flaky_mailer_is_retried_past_the_threshold_and_nothing_is_undone() {
    for db in backends().await {
        let (services, engine) = travel_rig(&db, identity).await;
        // Five failures, more than the threshold of 3; the third one sends the mail and
        // loses the answer, so a later attempt replays it instead of mailing twice.
        services.script(
            "send_itinerary",
            vec![
                Scripted::Transient,
                Scripted::Transient,
                Scripted::ResetAfterApply,
                Scripted::Transient,
                Scripted::Transient,
            ],
        );
        let (id, trip) = book_trip(&engine, 3).await;
        expect_state(&engine, id, RunState::Completed, db.backend).await;

        let history = engine.history(id).await.expect("history");
        let retries = history
            .iter()
            .filter(|h| h.kind == HistoryKind::Retry && h.step.as_deref() == Some("send_itinerary"))
            .count();
        assert_eq!(retries, 5, "[{}] every failure was retried", db.backend);
        let sent = history
            .iter()
            .find(|h| {
                h.kind == HistoryKind::Completed && h.step.as_deref() == Some("send_itinerary")
            })
            .expect("send_itinerary completed");
        assert_eq!(sent.attempt, Some(6), "[{}]", db.backend);

        assert_eq!(applied(&services, &trip, Operation::Charge), 1);
        assert_eq!(applied(&services, &trip, Operation::SendItinerary), 1);
        for undo in [Operation::CancelFlight, Operation::CancelHotel] {
            assert_eq!(applied(&services, &trip, undo), 0, "[{}]", db.backend);
        }
        let mail = services
            .ledger()
            .records_for_order(&trip.trip_id)
            .into_iter()
            .find(|r| r.operation == Operation::SendItinerary)
            .expect("mail record");
        assert_eq!(
            mail.replays, 1,
            "[{}] mailed once, replayed once",
            db.backend
        );
        assert_ledger(&services, &trip, TripStatus::Paid, db.backend);
        engine.shutdown().await;
    }
}
