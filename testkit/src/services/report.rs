//! The result of checking a ledger for orders ([`LedgerReport`]): effect counts per
//! operation, each order's status and every violation found by the order checks.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use super::ledger::EffectRecord;
use super::operation::Operation;
use super::order_checks::{check_keys_applied_once, check_order};

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
        check_keys_applied_once(&records, &mut report.violations);
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

    /// No violations.
    pub fn is_consistent(&self) -> bool {
        self.violations.is_empty()
    }

    /// How many checked orders have `status`.
    pub fn count(&self, status: OrderStatus) -> usize {
        self.orders.values().filter(|s| **s == status).count()
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
