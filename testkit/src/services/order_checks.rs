//! The rules a ledger must satisfy for orders: (a) no idempotency key applied twice, (b)
//! every order net-consistent (shipped, or every effect compensated) and (c) each operation
//! applied at most once per order, with every compensation naming what it undoes.

use std::collections::{BTreeMap, BTreeSet};

use super::ledger::EffectRecord;
use super::operation::Operation;

/// (a) No idempotency key may have been applied more than once.
pub(super) fn check_keys_applied_once(records: &[&EffectRecord], violations: &mut Vec<String>) {
    let mut by_key: BTreeMap<&str, Vec<&EffectRecord>> = BTreeMap::new();
    for record in records {
        by_key.entry(record.key.as_str()).or_default().push(record);
    }
    for (key, applied) in by_key.into_iter().filter(|(_, v)| v.len() > 1) {
        let seqs: Vec<String> = applied
            .iter()
            .map(|r| format!("#{} {} {}", r.seq, r.operation, r.order_id))
            .collect();
        violations.push(format!(
            "key {key:?} applied {} times: {}",
            applied.len(),
            seqs.join(", ")
        ));
    }
}

/// (b) net consistency and (c) one application per operation for one order.
pub(super) fn check_order(order_id: &str, records: &[&EffectRecord], violations: &mut Vec<String>) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::operation::Service;
    use crate::services::report::{LedgerReport, OrderStatus};
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
