//! The ledger: every remote effect, recorded once per idempotency key.
//!
//! The ledger is the proof that retries, timeouts and re-runs never applied an effect
//! twice. The first call with a key that reaches "apply" runs the effect and stores
//! its response; every later call with the same key gets the stored response back
//! (a *replay*) and the record's `replays` counter goes up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::error::ServiceError;
use super::operation::{Operation, Service};
use super::report::LedgerReport;

/// One applied remote effect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EffectRecord {
    /// Position in the ledger, starting at 1, in order of application.
    pub seq: u64,
    /// The idempotency key the effect was applied under.
    pub key: String,
    /// The service that applied it.
    pub service: Service,
    /// The operation applied.
    pub operation: Operation,
    /// The order the effect belongs to.
    pub order_id: String,
    /// Wall-clock time of application.
    pub applied_at: SystemTime,
    /// How many later calls with the same key got the stored response back.
    pub replays: u32,
    /// The request body of the applying call, as JSON.
    pub request: serde_json::Value,
    /// The stored response, as JSON.
    pub response: serde_json::Value,
}

/// Whether a successful call applied its effect or replayed a stored response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// First call with this key: the effect was applied now.
    Applied,
    /// The key was seen before: the stored response was returned, nothing applied.
    Replayed,
}

#[derive(Debug, Default)]
struct Inner {
    records: Vec<EffectRecord>,
    by_key: HashMap<String, usize>,
}

/// Shared record of every applied effect, keyed by idempotency key.
///
/// Cheap to clone: clones share the same records.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    inner: Arc<Mutex<Inner>>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave `Inner` half-updated in a way
        // that matters here, so keep going with the data.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Apply `make` under `key` unless the key was seen before, in which case return
    /// the stored response and count a replay.
    ///
    /// Reusing a key for a different operation or with a different request body is
    /// refused with [`ServiceError::Permanent`], as a real idempotent API would.
    /// Synchronous on purpose: callers do it before any `.await`, so a cancelled call
    /// either applied completely or not at all.
    pub(crate) fn apply_or_replay<Req, Resp>(
        &self,
        key: &str,
        operation: Operation,
        order_id: &str,
        request: &Req,
        make: impl FnOnce(u64) -> Resp,
    ) -> Result<(Resp, Delivery), ServiceError>
    where
        Req: Serialize,
        Resp: Serialize + DeserializeOwned,
    {
        let request = to_json(request)?;
        let mut inner = self.lock();
        if let Some(&index) = inner.by_key.get(key) {
            let record = &mut inner.records[index];
            if record.operation != operation || record.request != request {
                return Err(ServiceError::Permanent(format!(
                    "idempotency key {key:?} was already used for {} {} with a different request",
                    record.operation, record.request
                )));
            }
            record.replays += 1;
            let stored = record.response.clone();
            drop(inner);
            let response = serde_json::from_value(stored).map_err(|e| {
                ServiceError::Permanent(format!("stored response for key {key:?} unreadable: {e}"))
            })?;
            return Ok((response, Delivery::Replayed));
        }
        let seq = inner.records.len() as u64 + 1;
        let response = make(seq);
        let record = EffectRecord {
            seq,
            key: key.to_owned(),
            service: operation.service(),
            operation,
            order_id: order_id.to_owned(),
            applied_at: SystemTime::now(),
            replays: 0,
            request,
            response: to_json(&response)?,
        };
        let index = inner.records.len();
        inner.records.push(record);
        inner.by_key.insert(key.to_owned(), index);
        Ok((response, Delivery::Applied))
    }

    /// All records, in order of application.
    pub fn records(&self) -> Vec<EffectRecord> {
        self.lock().records.clone()
    }

    /// The record applied under `key`, if any.
    pub fn get(&self, key: &str) -> Option<EffectRecord> {
        let inner = self.lock();
        inner.by_key.get(key).map(|&i| inner.records[i].clone())
    }

    /// The records of one order, in order of application.
    pub fn records_for_order(&self, order_id: &str) -> Vec<EffectRecord> {
        self.lock()
            .records
            .iter()
            .filter(|r| r.order_id == order_id)
            .cloned()
            .collect()
    }

    /// How many effects of `operation` were applied (replays not counted).
    pub fn applied_count(&self, operation: Operation) -> usize {
        self.lock()
            .records
            .iter()
            .filter(|r| r.operation == operation)
            .count()
    }

    /// Total replays over all keys.
    pub fn total_replays(&self) -> u64 {
        self.lock()
            .records
            .iter()
            .map(|r| u64::from(r.replays))
            .sum()
    }

    /// Number of applied effects.
    pub fn len(&self) -> usize {
        self.lock().records.len()
    }

    /// Whether nothing was applied yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Check every order that appears in the ledger. Meaningful once no saga is in
    /// flight: a half-way order (reserved, not yet shipped) is reported as a violation.
    pub fn report(&self) -> LedgerReport {
        LedgerReport::from_records(&self.records())
    }

    /// Check exactly these orders; an order with no effect at all is fine.
    pub fn check_orders(&self, order_ids: &[String]) -> LedgerReport {
        LedgerReport::for_orders(&self.records(), order_ids)
    }
}

fn to_json<T: Serialize>(value: &T) -> Result<serde_json::Value, ServiceError> {
    serde_json::to_value(value)
        .map_err(|e| ServiceError::Permanent(format!("cannot encode as JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn apply(
        ledger: &Ledger,
        key: &str,
        op: Operation,
        body: serde_json::Value,
    ) -> Result<(String, Delivery), ServiceError> {
        ledger.apply_or_replay(key, op, "o1", &body, |seq| format!("id-{seq}"))
    }

    #[test]
    fn first_call_applies_and_repeat_replays() -> Result<(), ServiceError> {
        let ledger = Ledger::new();
        let (first, d1) = apply(&ledger, "k1", Operation::Charge, json!({"a": 1}))?;
        let (second, d2) = apply(&ledger, "k1", Operation::Charge, json!({"a": 1}))?;
        assert_eq!((first.as_str(), d1), ("id-1", Delivery::Applied));
        assert_eq!((second.as_str(), d2), ("id-1", Delivery::Replayed));
        let record = ledger
            .get("k1")
            .ok_or(ServiceError::Permanent("missing".into()))?;
        assert_eq!(record.replays, 1);
        assert_eq!(record.service, Service::Payments);
        assert_eq!(ledger.len(), 1);
        assert_eq!(ledger.applied_count(Operation::Charge), 1);
        assert_eq!(ledger.total_replays(), 1);
        Ok(())
    }

    #[test]
    fn key_reuse_with_other_request_or_operation_is_refused() -> Result<(), ServiceError> {
        let ledger = Ledger::new();
        apply(&ledger, "k1", Operation::Charge, json!({"a": 1}))?;
        let other_body = apply(&ledger, "k1", Operation::Charge, json!({"a": 2}));
        assert!(matches!(other_body, Err(ServiceError::Permanent(_))));
        let other_op = apply(&ledger, "k1", Operation::Refund, json!({"a": 1}));
        assert!(matches!(other_op, Err(ServiceError::Permanent(_))));
        assert_eq!(ledger.len(), 1);
        assert_eq!(ledger.total_replays(), 0);
        Ok(())
    }
}
