//! The ledger of an [`EffectServer`](super::EffectServer): every effect applied, once per
//! operation and idempotency key, and the checks tests assert on.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::refusal::Refusal;
use crate::services::ServiceError;

/// One applied effect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Effect {
    /// Position in the ledger, starting at 1, in order of application.
    pub seq: u64,
    /// The operation applied.
    pub operation: String,
    /// The idempotency key it was applied under.
    pub key: String,
    /// The request body of the applying call.
    pub request: Value,
    /// The handler's response, replayed to every later call with the same key.
    pub response: Value,
    /// How many later calls with the same key got the stored response back.
    pub replays: u32,
}

#[derive(Debug, Default)]
struct Entries {
    effects: Vec<Effect>,
    /// Index in `effects` per (operation, key).
    index: HashMap<(String, String), usize>,
    /// Calls the handler refused, per operation.
    refusals: BTreeMap<String, usize>,
}

/// Every effect an [`EffectServer`](super::EffectServer) applied. Cheap to clone: clones
/// share the same entries, so a ledger taken before the run sees the effects of the run.
#[derive(Debug, Clone)]
pub struct EffectLedger {
    entries: Arc<Mutex<Entries>>,
}

impl EffectLedger {
    pub(crate) fn new() -> Self {
        Self {
            entries: Arc::new(Mutex::new(Entries::default())),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        // Every update is a single push or increment: a panic elsewhere cannot leave the
        // entries half-written, so a poisoned lock still holds consistent data.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The first call of `operation` under `key` runs `handler` and records what it answered;
    /// a repeat gets the stored response and counts a replay. A repeat with another request
    /// is refused (HTTP 422), as an idempotent API refuses a reused key. The handler runs
    /// under the ledger's lock, so two concurrent first calls apply once.
    pub(crate) fn apply_or_replay(
        &self,
        operation: &str,
        key: &str,
        request: &Value,
        handler: impl FnOnce(&Value) -> Result<Value, Refusal>,
    ) -> Result<Value, ServiceError> {
        let mut entries = self.lock();
        let slot = (operation.to_owned(), key.to_owned());
        if let Some(&i) = entries.index.get(&slot) {
            let effect = &mut entries.effects[i];
            if effect.request != *request {
                return Err(ServiceError::Permanent(format!(
                    "idempotency key {key:?} of {operation} was used with another request: {}",
                    effect.request
                )));
            }
            effect.replays += 1;
            return Ok(effect.response.clone());
        }
        let response = match handler(request) {
            Ok(response) => response,
            Err(refusal) => {
                *entries.refusals.entry(slot.0).or_default() += 1;
                return Err(refusal.into());
            }
        };
        let at = entries.effects.len();
        let seq = at as u64 + 1;
        entries.effects.push(Effect {
            seq,
            operation: slot.0.clone(),
            key: slot.1.clone(),
            request: request.clone(),
            response: response.clone(),
            replays: 0,
        });
        entries.index.insert(slot, at);
        Ok(response)
    }

    /// Every applied effect, in order of application.
    pub fn records(&self) -> Vec<Effect> {
        self.lock().effects.clone()
    }

    /// The applied effects of `operation`, in order of application.
    pub fn effects_of(&self, operation: &str) -> Vec<Effect> {
        let entries = self.lock();
        let of_op = entries.effects.iter().filter(|e| e.operation == operation);
        of_op.cloned().collect()
    }

    /// The effect of `operation` applied under `key`, if any.
    pub fn get(&self, operation: &str, key: &str) -> Option<Effect> {
        let entries = self.lock();
        let slot = (operation.to_owned(), key.to_owned());
        entries
            .index
            .get(&slot)
            .map(|&i| entries.effects[i].clone())
    }

    /// How many effects of `operation` were applied: one per idempotency key, replays not
    /// counted.
    pub fn applied(&self, operation: &str) -> usize {
        self.effects_of(operation).len()
    }

    /// How many calls of `operation` got a stored response back instead of applying.
    pub fn replays(&self, operation: &str) -> u64 {
        let effects = self.effects_of(operation);
        effects.iter().map(|e| u64::from(e.replays)).sum()
    }

    /// How many calls of `operation` its handler refused (scripted faults not counted: see
    /// [`EffectServer::fault_counts`](super::EffectServer::fault_counts)).
    pub fn refused(&self, operation: &str) -> usize {
        self.lock().refusals.get(operation).copied().unwrap_or(0)
    }

    /// Number of applied effects.
    pub fn len(&self) -> usize {
        self.lock().effects.len()
    }

    /// Whether nothing was applied.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Net the effects of `forward` against those of `undo` (`book_flight` against
    /// `cancel_flight`, say): an undo matches the first unmatched forward effect whose
    /// response or request has the same, non-null value in the top-level field `on` as the
    /// undo's request. Meaningful once no run is in flight; in a ledger of compensated runs,
    /// every forward effect should be undone exactly once ([`Pairs::is_net`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn check(ledger: &sagaflow_testkit::effects::EffectLedger) {
    /// let pairs = ledger.pairs("book_flight", "cancel_flight", "booking");
    /// assert!(pairs.is_net(), "{pairs:?}");
    /// # }
    /// ```
    pub fn pairs(&self, forward: &str, undo: &str, on: &str) -> Pairs {
        let mut not_undone = self.effects_of(forward);
        let mut pairs = Pairs::default();
        for undo in self.effects_of(undo) {
            let link = undo.request.get(on).filter(|v| !v.is_null());
            let found = not_undone.iter().position(|f| {
                link.is_some_and(|v| f.response.get(on) == Some(v) || f.request.get(on) == Some(v))
            });
            match found {
                Some(i) => pairs.matched.push((not_undone.remove(i), undo)),
                None => pairs.undoes_nothing.push(undo),
            }
        }
        pairs.not_undone = not_undone;
        pairs
    }
}

/// What [`EffectLedger::pairs`] found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pairs {
    /// Each forward effect with the undo that netted it.
    pub matched: Vec<(Effect, Effect)>,
    /// Forward effects nothing undid.
    pub not_undone: Vec<Effect>,
    /// Undo effects that match no forward effect (an undo of something never applied, or a
    /// second undo of the same effect).
    pub undoes_nothing: Vec<Effect>,
}

impl Pairs {
    /// Whether every forward effect was undone exactly once and every undo undid one.
    pub fn is_net(&self) -> bool {
        self.not_undone.is_empty() && self.undoes_nothing.is_empty()
    }
}
