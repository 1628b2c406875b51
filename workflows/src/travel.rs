//! The travel-booking saga: book a flight and a hotel in parallel → capture the payment →
//! send the itinerary.
//!
//! ```text
//! book_flight ─┐
//!              ├─▶ capture_payment (pivot) ─▶ send_itinerary (retriable)
//! book_hotel  ─┘
//! ```
//!
//! * `book_flight` and `book_hotel` are roots: both start with the run and run in parallel.
//!   Both are compensatable (cancel the flight, cancel the hotel). If either fails for good,
//!   the other is cancelled once it has settled, and nothing is paid.
//! * `capture_payment` joins them and is the pivot: once the money is taken, the trip only
//!   goes forward. If the capture is refused, both bookings are cancelled.
//! * `send_itinerary` is retriable: retried until the mailer takes it, never compensated.
//!
//! Every remote call carries the step's idempotency key, so a retried or re-run step never
//! books, pays or mails twice; a cancellation whose booking's outcome is unknown replays the
//! booking under the forward key to learn what to cancel, as the order saga's compensations
//! do.

use std::sync::Arc;

use sagaflow::{StepContext, Workflow, WorkflowBuilder};
use serde::{Deserialize, Serialize};

use crate::order::OrderSettings;
use crate::remote_step::{forward_output, step_error};
use sagaflow_testkit::services::{
    BookRequest, Booking, BookingApi, Charge, ChargeRequest, ItineraryRequest, MailerApi,
    PaymentsApi, Services,
};

/// The workflow's name.
pub const TRAVEL_WORKFLOW: &str = "travel";

/// A trip to book, the saga's input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Trip {
    /// Business id of the trip (also the run's business key).
    pub trip_id: String,
    /// Who travels.
    pub traveller: String,
    /// Departure airport.
    pub from: String,
    /// Destination airport (and the hotel's city).
    pub to: String,
    /// Nights at the hotel.
    pub nights: u32,
    /// Price of the whole trip, in cents.
    pub amount_cents: u64,
}

impl Trip {
    /// A sample trip with the given number.
    pub fn sample(n: usize) -> Self {
        const TRAVELLERS: [&str; 8] = [
            "Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Leslie",
        ];
        const AIRPORTS: [&str; 6] = ["LIS", "OSL", "NRT", "YUL", "CPT", "AKL"];
        let nights = u32::try_from(n % 5 + 2).unwrap_or(2);
        Self {
            trip_id: format!("trip-{n:04}"),
            traveller: TRAVELLERS[n % TRAVELLERS.len()].to_owned(),
            from: AIRPORTS[n % AIRPORTS.len()].to_owned(),
            to: AIRPORTS[(n + 1 + n / AIRPORTS.len()) % AIRPORTS.len()].to_owned(),
            nights,
            amount_cents: 30_000 + u64::from(nights) * 9_500 + (n as u64 % 7) * 1_250,
        }
    }

    /// The flight `book_flight` asks for.
    fn flight(&self) -> BookRequest {
        self.booking(format!("{} → {}", self.from, self.to))
    }

    /// The room `book_hotel` asks for.
    fn hotel(&self) -> BookRequest {
        self.booking(format!("{} nights in {}", self.nights, self.to))
    }

    /// The payment `capture_payment` takes.
    fn payment(self) -> ChargeRequest {
        ChargeRequest {
            order_id: self.trip_id,
            amount_cents: self.amount_cents,
        }
    }

    fn booking(&self, item: String) -> BookRequest {
        BookRequest {
            trip_id: self.trip_id.clone(),
            traveller: self.traveller.clone(),
            item,
        }
    }
}

/// The remote services the saga talks to.
#[derive(Debug, Clone)]
pub struct TravelApis {
    /// Flight bookings.
    pub flights: Arc<dyn BookingApi>,
    /// Hotel bookings.
    pub hotels: Arc<dyn BookingApi>,
    /// Payments (a capture is a charge).
    pub payments: Arc<dyn PaymentsApi>,
    /// The itinerary mailer.
    pub mailer: Arc<dyn MailerApi>,
}

impl From<&Services> for TravelApis {
    fn from(s: &Services) -> Self {
        Self {
            flights: s.flights(),
            hotels: s.hotels(),
            payments: s.payments(),
            mailer: s.mailer(),
        }
    }
}

/// Tunables of the saga: version, retry policy and deadline policy of every step, as for
/// the order saga. `send_itinerary` keeps the retry policy's backoff but has no failure
/// threshold: a retriable step is retried until it succeeds.
pub type TravelSettings = OrderSettings;

/// Builds the travel saga over `apis`.
///
/// # Errors
/// Never for these settings unless they are inconsistent (e.g. a zero deadline):
/// [`sagaflow::Error::InvalidDefinition`].
pub fn travel_saga(apis: TravelApis, settings: TravelSettings) -> sagaflow::Result<Workflow> {
    let builder = Workflow::builder(TRAVEL_WORKFLOW, settings.version)
        .input::<Trip>()
        .default_retry(settings.retry)
        .default_deadline(settings.deadline);
    let builder = bookable(builder, "book_flight", apis.flights, Trip::flight);
    let builder = bookable(builder, "book_hotel", apis.hotels, Trip::hotel);
    let (pay, mailer) = (apis.payments, apis.mailer);
    builder
        .step("capture_payment", move |ctx: StepContext| {
            let pay = pay.clone();
            async move {
                let trip: Trip = ctx.input()?;
                let _flight: Booking = ctx.dep("book_flight")?;
                let _hotel: Booking = ctx.dep("book_hotel")?;
                let captured = pay.charge(ctx.idempotency_key(), trip.payment()).await;
                captured.map_err(step_error)
            }
        })
        .after(["book_flight", "book_hotel"])
        .pivot()
        .step("send_itinerary", move |ctx: StepContext| {
            let mailer = mailer.clone();
            async move {
                let trip: Trip = ctx.input()?;
                let paid: Charge = ctx.dep("capture_payment")?;
                let req = ItineraryRequest {
                    body: format!(
                        "{} → {}, {} nights; paid {} ({})",
                        trip.from, trip.to, trip.nights, paid.amount_cents, paid.charge_id
                    ),
                    trip_id: trip.trip_id,
                    traveller: trip.traveller,
                };
                mailer
                    .send_itinerary(ctx.idempotency_key(), req)
                    .await
                    .map_err(step_error)
            }
        })
        .after(["capture_payment"])
        .retriable()
        .build()
}

/// Adds the root step `name`, which books `request(trip)` with `api`, and its compensation,
/// which cancels that booking.
fn bookable(
    builder: WorkflowBuilder,
    name: &str,
    api: Arc<dyn BookingApi>,
    request: fn(&Trip) -> BookRequest,
) -> WorkflowBuilder {
    let undo = api.clone();
    builder
        .step(name, move |ctx: StepContext| {
            let api = api.clone();
            async move {
                let req = request(&ctx.input()?);
                api.book(ctx.idempotency_key(), req)
                    .await
                    .map_err(step_error)
            }
        })
        .compensate(move |ctx: StepContext| {
            let (api, again) = (undo.clone(), undo.clone());
            async move {
                let req = request(&ctx.input()?);
                let replay = |key: String| async move { again.book(&key, req).await };
                let Some(booking) = forward_output::<Booking, _, _>(&ctx, replay).await? else {
                    return Ok(None);
                };
                let cancelled = api.cancel(ctx.idempotency_key(), booking.cancellation());
                cancelled.await.map(Some).map_err(step_error)
            }
        })
}
