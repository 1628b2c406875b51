//! Checking a ledger: exactly-once per key, and net consistency per order.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use super::ledger::EffectRecord;
use super::operation::Operation;

/// Applied effects per operation (replays not counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationCounts {
    /// Stock reservations applied.
    pub reserve: u64,
    /// Reservations released.
    pub release: u64,
    /// Charges applied.
    pub charge: u64,
    /// Refunds applied.
    pub refund: u64,
    /// Shipments dispatched.
    pub ship: u64,
    /// Flights booked.
    #[serde(default)]
    pub book_flight: u64,
    /// Flight bookings cancelled.
    #[serde(default)]
    pub cancel_flight: u64,
    /// Hotels booked.
    #[serde(default)]
    pub book_hotel: u64,
    /// Hotel bookings cancelled.
    #[serde(default)]
    pub cancel_hotel: u64,
    /// Itineraries sent.
    #[serde(default)]
    pub send_itinerary: u64,
}

impl OperationCounts {
    /// The count for one operation.
    pub fn get(&self, operation: Operation) -> u64 {
        let mut counts = *self;
        *counts.slot(operation)
    }

    fn bump(&mut self, operation: Operation) {
        *self.slot(operation) += 1;
    }

    fn slot(&mut self, operation: Operation) -> &mut u64 {
        match operation {
            Operation::Reserve => &mut self.reserve,
            Operation::Release => &mut self.release,
            Operation::Charge => &mut self.charge,
            Operation::Refund => &mut self.refund,
            Operation::Ship => &mut self.ship,
            Operation::BookFlight => &mut self.book_flight,
            Operation::CancelFlight => &mut self.cancel_flight,
            Operation::BookHotel => &mut self.book_hotel,
            Operation::CancelHotel => &mut self.cancel_hotel,
            Operation::SendItinerary => &mut self.send_itinerary,
        }
    }
}

/// Where an order stands according to the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    /// No effect was ever applied for the order.
    Untouched,
    /// Reserved, charged and shipped, nothing compensated.
    Shipped,
    /// Every applied effect was compensated and nothing shipped.
    Compensated,
    /// At least one violation concerns this order.
    Inconsistent,
}

/// The result of checking a ledger.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LedgerReport {
    /// Applied effects per operation, over the checked orders.
    pub applied: OperationCounts,
    /// Calls answered from a stored response instead of applying again.
    pub replays: u64,
    /// Status of every checked order.
    pub orders: BTreeMap<String, OrderStatus>,
    /// Human-readable descriptions of everything wrong; empty when consistent.
    pub violations: Vec<String>,
}

impl LedgerReport {
    /// Check every order that appears in `records`.
    pub fn from_records(records: &[EffectRecord]) -> Self {
        let order_ids: BTreeSet<&str> = records.iter().map(|r| r.order_id.as_str()).collect();
        Self::build(records, order_ids)
    }

    /// Check exactly the orders in `order_ids`, ignoring records of other orders.
    /// An order with no record at all is [`OrderStatus::Untouched`], which is fine.
    pub fn for_orders(records: &[EffectRecord], order_ids: &[String]) -> Self {
        Self::build(records, order_ids.iter().map(String::as_str).collect())
    }

    fn build(records: &[EffectRecord], order_ids: BTreeSet<&str>) -> Self {
        let records: Vec<&EffectRecord> = records
            .iter()
            .filter(|r| order_ids.contains(r.order_id.as_str()))
            .collect();
        let mut report = LedgerReport::default();
        for record in &records {
            report.applied.bump(record.operation);
            report.replays += u64::from(record.replays);
        }
        report.check_keys_applied_once(&records);
        for order_id in order_ids {
            let mine: Vec<&EffectRecord> = records
                .iter()
                .copied()
                .filter(|r| r.order_id == order_id)
                .collect();
            let before = report.violations.len();
            check_order(order_id, &mine, &mut report.violations);
            let status = if report.violations.len() > before {
                OrderStatus::Inconsistent
            } else if mine.is_empty() {
                OrderStatus::Untouched
            } else if mine.iter().any(|r| r.operation == Operation::Ship) {
                OrderStatus::Shipped
            } else {
                OrderStatus::Compensated
            };
            report.orders.insert(order_id.to_owned(), status);
        }
        report
    }

    /// (a) No idempotency key may have been applied more than once.
    fn check_keys_applied_once(&mut self, records: &[&EffectRecord]) {
        let mut by_key: BTreeMap<&str, Vec<&EffectRecord>> = BTreeMap::new();
        for record in records {
            by_key.entry(record.key.as_str()).or_default().push(record);
        }
        for (key, applied) in by_key.into_iter().filter(|(_, v)| v.len() > 1) {
            let seqs: Vec<String> = applied
                .iter()
                .map(|r| format!("#{} {} {}", r.seq, r.operation, r.order_id))
                .collect();
            self.violations.push(format!(
                "key {key:?} applied {} times: {}",
                applied.len(),
                seqs.join(", ")
            ));
        }
    }

    /// No violations.
    pub fn is_consistent(&self) -> bool {
        self.violations.is_empty()
    }

    /// How many checked orders have `status`.
    pub fn count(&self, status: OrderStatus) -> usize {
        self.orders.values().filter(|s| **s == status).count()
    }
}

/// (b) net consistency and (c) one application per operation for one order.
fn check_order(order_id: &str, records: &[&EffectRecord], violations: &mut Vec<String>) {
    let of = |op: Operation| -> Vec<&EffectRecord> {
        records
            .iter()
            .copied()
            .filter(|r| r.operation == op)
            .collect()
    };
    let (reserved, released, charged, refunded, shipped) = (
        of(Operation::Reserve),
        of(Operation::Release),
        of(Operation::Charge),
        of(Operation::Refund),
        of(Operation::Ship),
    );
    let mut flag = |what: String| violations.push(format!("order {order_id:?}: {what}"));

    for (op, applied) in [
        (Operation::Reserve, &reserved),
        (Operation::Release, &released),
        (Operation::Charge, &charged),
        (Operation::Refund, &refunded),
        (Operation::Ship, &shipped),
    ] {
        if applied.len() > 1 {
            let keys: Vec<&str> = applied.iter().map(|r| r.key.as_str()).collect();
            flag(format!(
                "{op} applied {} times under different keys {keys:?}",
                applied.len()
            ));
        }
    }

    let (r, rl, c, rf, s) = (
        !reserved.is_empty(),
        !released.is_empty(),
        !charged.is_empty(),
        !refunded.is_empty(),
        !shipped.is_empty(),
    );
    if r && !s && !rl {
        flag("stock reserved but neither shipped nor released".into());
    }
    if c && !s && !rf {
        flag("charged but neither shipped nor refunded".into());
    }
    if rl && !r {
        flag("released but never reserved".into());
    }
    if rf && !c {
        flag("refunded but never charged".into());
    }
    if s && !r {
        flag("shipped but never reserved".into());
    }
    if s && !c {
        flag("shipped but never charged".into());
    }
    if s && rl {
        flag("shipped although its reservation was released".into());
    }
    if s && rf {
        flag("shipped although its charge was refunded".into());
    }
    if r && rl {
        undo_matches(&reserved, &released, "reservation_id", "release", &mut flag);
    }
    if c && rf {
        undo_matches(&charged, &refunded, "charge_id", "refund", &mut flag);
    }
}

/// Every compensation must name an id the compensated operation actually returned.
fn undo_matches(
    done: &[&EffectRecord],
    undone: &[&EffectRecord],
    id_field: &str,
    undo: &str,
    flag: &mut impl FnMut(String),
) {
    let known: BTreeSet<&str> = done
        .iter()
        .filter_map(|r| r.response.get(id_field).and_then(|v| v.as_str()))
        .collect();
    for record in undone {
        let id = record.request.get(id_field).and_then(|v| v.as_str());
        if !id.is_some_and(|id| known.contains(id)) {
            flag(format!(
                "{undo} (key {:?}) names {id_field} {id:?}, which was never issued for this order",
                record.key
            ));
        }
    }
}

impl fmt::Display for LedgerReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = &self.applied;
        writeln!(
            f,
            "applied: reserve={} release={} charge={} refund={} ship={}; replays={}",
            a.reserve, a.release, a.charge, a.refund, a.ship, self.replays
        )?;
        writeln!(
            f,
            "orders: {} shipped, {} compensated, {} untouched, {} inconsistent",
            self.count(OrderStatus::Shipped),
            self.count(OrderStatus::Compensated),
            self.count(OrderStatus::Untouched),
            self.count(OrderStatus::Inconsistent)
        )?;
        if self.violations.is_empty() {
            write!(f, "violations: none")
        } else {
            write!(f, "violations ({}):", self.violations.len())?;
            for v in &self.violations {
                write!(f, "\n  - {v}")?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::operation::Service;
    use serde_json::json;
    use std::time::SystemTime;

    fn rec(seq: u64, key: &str, op: Operation, order: &str) -> EffectRecord {
        let (request, response) = match op {
            Operation::Reserve => (json!({}), json!({"reservation_id": format!("rsv-{order}")})),
            Operation::Release => (json!({"reservation_id": format!("rsv-{order}")}), json!({})),
            Operation::Charge => (json!({}), json!({"charge_id": format!("ch-{order}")})),
            Operation::Refund => (json!({"charge_id": format!("ch-{order}")}), json!({})),
            _ => (json!({}), json!({})),
        };
        EffectRecord {
            seq,
            key: key.into(),
            service: op.service(),
            operation: op,
            order_id: order.into(),
            applied_at: SystemTime::UNIX_EPOCH,
            replays: 0,
            request,
            response,
        }
    }

    fn happy(order: &str) -> Vec<EffectRecord> {
        vec![
            rec(1, &format!("{order}/reserve"), Operation::Reserve, order),
            rec(2, &format!("{order}/charge"), Operation::Charge, order),
            rec(3, &format!("{order}/ship"), Operation::Ship, order),
        ]
    }

    fn compensated(order: &str) -> Vec<EffectRecord> {
        vec![
            rec(1, &format!("{order}/reserve"), Operation::Reserve, order),
            rec(2, &format!("{order}/charge"), Operation::Charge, order),
            rec(3, &format!("{order}/refund"), Operation::Refund, order),
            rec(4, &format!("{order}/release"), Operation::Release, order),
        ]
    }

    #[test]
    fn shipped_and_compensated_orders_are_consistent() {
        let mut records = happy("a");
        records.extend(compensated("b"));
        records[0].replays = 2;
        let report = LedgerReport::from_records(&records);
        assert!(report.is_consistent(), "{report}");
        assert_eq!(report.orders["a"], OrderStatus::Shipped);
        assert_eq!(report.orders["b"], OrderStatus::Compensated);
        assert_eq!(report.applied.get(Operation::Reserve), 2);
        assert_eq!(report.applied.ship, 1);
        assert_eq!(report.replays, 2);
        assert_eq!(records[0].service, Service::Inventory);
    }

    #[test]
    fn key_applied_twice_is_flagged() {
        let mut records = happy("a");
        records.push(rec(4, "a/ship", Operation::Ship, "a"));
        let report = LedgerReport::from_records(&records);
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("key \"a/ship\" applied 2 times")),
            "{report}"
        );
        assert_eq!(report.orders["a"], OrderStatus::Inconsistent);
    }

    #[test]
    fn double_charge_with_two_keys_is_flagged() {
        let mut records = happy("a");
        records.push(rec(4, "a/charge-retry", Operation::Charge, "a"));
        let report = LedgerReport::from_records(&records);
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.contains("charge applied 2 times")),
            "{report}"
        );
        assert!(
            !report.violations.iter().any(|v| v.contains("key ")),
            "{report}"
        );
    }

    #[test]
    fn reserved_but_neither_shipped_nor_released_is_flagged() {
        let records = vec![rec(1, "a/reserve", Operation::Reserve, "a")];
        let report = LedgerReport::from_records(&records);
        assert_eq!(
            report.violations,
            vec!["order \"a\": stock reserved but neither shipped nor released".to_owned()]
        );
        assert_eq!(report.orders["a"], OrderStatus::Inconsistent);
    }

    #[test]
    fn net_consistency_rules() {
        let cases: Vec<(Vec<EffectRecord>, &str)> = vec![
            (
                vec![rec(1, "a/charge", Operation::Charge, "a")],
                "charged but neither shipped nor refunded",
            ),
            (
                vec![rec(1, "a/release", Operation::Release, "a")],
                "released but never reserved",
            ),
            (
                vec![rec(1, "a/refund", Operation::Refund, "a")],
                "refunded but never charged",
            ),
            (
                vec![
                    rec(1, "a/reserve", Operation::Reserve, "a"),
                    rec(2, "a/ship", Operation::Ship, "a"),
                ],
                "shipped but never charged",
            ),
            (
                vec![
                    rec(1, "a/charge", Operation::Charge, "a"),
                    rec(2, "a/ship", Operation::Ship, "a"),
                ],
                "shipped but never reserved",
            ),
            (
                {
                    let mut r = happy("a");
                    r.insert(2, rec(9, "a/release", Operation::Release, "a"));
                    r
                },
                "shipped although its reservation was released",
            ),
            (
                {
                    let mut r = happy("a");
                    r.push(rec(9, "a/refund", Operation::Refund, "a"));
                    r
                },
                "shipped although its charge was refunded",
            ),
            (
                {
                    let mut r = compensated("a");
                    r[3].request = json!({"reservation_id": "rsv-other"});
                    r
                },
                "never issued for this order",
            ),
        ];
        for (records, expected) in cases {
            let report = LedgerReport::from_records(&records);
            assert!(
                report.violations.iter().any(|v| v.contains(expected)),
                "expected {expected:?} in {report}"
            );
        }
    }

    #[test]
    fn check_selected_orders_only() {
        let mut records = happy("a");
        records.push(rec(4, "b/reserve", Operation::Reserve, "b"));
        let report = LedgerReport::for_orders(&records, &["a".into(), "never".into()]);
        assert!(report.is_consistent(), "{report}");
        assert_eq!(report.orders["never"], OrderStatus::Untouched);
        assert!(!report.orders.contains_key("b"));
        assert_eq!(report.applied.reserve, 1);
        let all = LedgerReport::from_records(&records);
        assert!(!all.is_consistent());
    }
}
