//! Checking a ledger for trips: each effect applied at most once, and every trip either
//! paid for with both bookings standing or with every booking cancelled and nothing paid.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ledger::{EffectRecord, Ledger};
use super::operation::Operation;

/// The two undoable bookings of a trip: (booking, its cancellation, what it is).
const BOOKINGS: [(Operation, Operation, &str); 2] = [
    (Operation::BookFlight, Operation::CancelFlight, "flight"),
    (Operation::BookHotel, Operation::CancelHotel, "hotel"),
];

/// Where a trip stands according to the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TripStatus {
    /// No effect was ever applied for the trip.
    Untouched,
    /// Flight and hotel booked, payment captured, nothing cancelled.
    Paid,
    /// Nothing paid, and every booking made was cancelled.
    Cancelled,
    /// At least one violation concerns this trip.
    Inconsistent,
}

/// The result of checking trips in a ledger (effect counts: [`Ledger::applied_count`],
/// [`Ledger::total_replays`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TripReport {
    /// Status of every checked trip.
    pub trips: BTreeMap<String, TripStatus>,
    /// Human-readable descriptions of everything wrong; empty when consistent.
    pub violations: Vec<String>,
}

impl TripReport {
    /// Check exactly the trips in `trip_ids`. Meaningful once none of them is in flight.
    pub fn for_trips(records: &[EffectRecord], trip_ids: &[String]) -> Self {
        let mut report = Self::default();
        for trip_id in trip_ids {
            let mine: Vec<&EffectRecord> =
                records.iter().filter(|r| &r.order_id == trip_id).collect();
            let before = report.violations.len();
            check_trip(trip_id, &mine, &mut report.violations);
            let paid = mine.iter().any(|r| r.operation == Operation::Charge);
            let status = if report.violations.len() > before {
                TripStatus::Inconsistent
            } else if mine.is_empty() {
                TripStatus::Untouched
            } else if paid {
                TripStatus::Paid
            } else {
                TripStatus::Cancelled
            };
            report.trips.insert(trip_id.clone(), status);
        }
        report
    }

    /// No violations.
    pub fn is_consistent(&self) -> bool {
        self.violations.is_empty()
    }

    /// How many checked trips have `status`.
    pub fn count(&self, status: TripStatus) -> usize {
        self.trips.values().filter(|s| **s == status).count()
    }
}

impl Ledger {
    /// Check the travel sagas of these trips; a trip with no effect at all is fine.
    pub fn check_trips(&self, trip_ids: &[String]) -> TripReport {
        TripReport::for_trips(&self.records(), trip_ids)
    }
}

fn check_trip(trip_id: &str, records: &[&EffectRecord], violations: &mut Vec<String>) {
    let mut by_op: BTreeMap<Operation, Vec<&EffectRecord>> = BTreeMap::new();
    for r in records {
        by_op.entry(r.operation).or_default().push(r);
    }
    let of = |op: Operation| by_op.get(&op).map_or(&[][..], Vec::as_slice);
    let mut flag = |what: String| violations.push(format!("trip {trip_id:?}: {what}"));
    for op in Operation::ALL {
        let applied = of(op);
        if applied.len() > 1 {
            let keys: Vec<&str> = applied.iter().map(|r| r.key.as_str()).collect();
            flag(format!(
                "{op} applied {} times under keys {keys:?}",
                applied.len()
            ));
        } else if applied.len() == 1 && !Operation::TRAVEL.contains(&op) {
            flag(format!("{op} is not a travel operation"));
        }
    }
    let paid = !of(Operation::Charge).is_empty();
    if !of(Operation::SendItinerary).is_empty() && !paid {
        flag("itinerary sent although nothing was paid".into());
    }
    for (book, cancel, what) in BOOKINGS {
        let (booked, cancelled) = (of(book), of(cancel));
        match (booked.first(), cancelled.first()) {
            (None, Some(_)) => flag(format!("{what} cancelled but never booked")),
            (None, None) if paid => flag(format!("paid without a {what} booking")),
            (Some(_), None) if !paid => {
                flag(format!("{what} booked but neither paid for nor cancelled"));
            }
            (Some(_), Some(_)) if paid => {
                flag(format!("paid although the {what} booking was cancelled"));
            }
            (Some(b), Some(c)) if b.response.get("booking_id") != c.request.get("booking_id") => {
                flag(format!(
                    "{cancel} (key {:?}) names booking {}, which is not the trip's {what}",
                    c.key, c.request["booking_id"]
                ));
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::SystemTime;

    fn rec(seq: u64, op: Operation, trip: &str) -> EffectRecord {
        let id = json!({"booking_id": format!("b-{trip}-{}", op.service())});
        let (request, response) = if op.is_compensation() {
            (id, json!({}))
        } else {
            (json!({}), id)
        };
        EffectRecord {
            seq,
            key: format!("{trip}/{op}"),
            service: op.service(),
            operation: op,
            order_id: trip.into(),
            applied_at: SystemTime::UNIX_EPOCH,
            replays: 0,
            request,
            response,
        }
    }

    fn trip(name: &str, ops: &[Operation]) -> Vec<EffectRecord> {
        (1..)
            .zip(ops)
            .map(|(seq, op)| rec(seq, *op, name))
            .collect()
    }

    fn check(records: &[EffectRecord], name: &str) -> TripReport {
        TripReport::for_trips(records, &[name.to_owned()])
    }

    use Operation::{BookFlight, BookHotel, CancelFlight, CancelHotel, Charge, SendItinerary};

    #[test]
    fn paid_cancelled_and_untouched_trips_are_consistent() {
        let paid = trip("a", &[BookFlight, BookHotel, Charge, SendItinerary]);
        let cancelled = trip("b", &[BookFlight, CancelFlight]);
        let mut all = paid.clone();
        all.extend(cancelled);
        let ids = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
        let report = TripReport::for_trips(&all, &ids);
        assert!(report.is_consistent(), "{report:?}");
        assert_eq!(report.trips["a"], TripStatus::Paid);
        assert_eq!(report.trips["b"], TripStatus::Cancelled);
        assert_eq!(report.trips["c"], TripStatus::Untouched);
        assert_eq!(report.count(TripStatus::Paid), 1);
    }

    #[test]
    fn violations_are_named() {
        let cases: Vec<(Vec<EffectRecord>, &str)> = vec![
            (
                trip("t", &[BookFlight, BookHotel, CancelHotel]),
                "flight booked but neither paid for nor cancelled",
            ),
            (
                trip("t", &[CancelHotel]),
                "hotel cancelled but never booked",
            ),
            (
                trip("t", &[BookHotel, Charge, SendItinerary]),
                "paid without a flight booking",
            ),
            (
                trip("t", &[BookFlight, BookHotel, CancelFlight, Charge]),
                "paid although the flight booking was cancelled",
            ),
            (
                trip("t", &[SendItinerary]),
                "itinerary sent although nothing was paid",
            ),
            (
                trip("t", &[BookFlight, BookFlight, CancelFlight]),
                "book_flight applied 2 times",
            ),
            (
                trip("t", &[Operation::Ship]),
                "ship is not a travel operation",
            ),
            (
                {
                    let mut r = trip("t", &[BookHotel, CancelHotel]);
                    r[1].request = json!({"booking_id": "ht-other"});
                    r
                },
                "which is not the trip's hotel",
            ),
        ];
        for (records, expected) in cases {
            let report = check(&records, "t");
            assert!(
                report.violations.iter().any(|v| v.contains(expected)),
                "expected {expected:?} in {report:?}"
            );
            assert_eq!(report.trips["t"], TripStatus::Inconsistent);
        }
    }
}
