//! Fault injection: the injector of one service ([`Faults`]), which decides each call's fate
//! from its scripted outcomes and its seeded [`FaultPlan`], and counts what it injected.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::error::{LostReply, ServiceError};
use super::fault_plan::{FaultCounts, FaultPlan, Scripted};
use super::operation::{Operation, Service};

/// What the simulated remote does with one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Apply or replay, and answer.
    None,
    /// Fail transiently without applying.
    Transient(String),
    /// Apply or replay, then never answer.
    Hang,
    /// Fail permanently without applying.
    Permanent(String),
    /// Apply or replay, then lose the answer.
    LoseReply(LostReply),
    /// Refuse without applying (a conflict, or busy with a retry delay).
    Refuse(ServiceError),
}

struct State {
    /// Calls so far per operation and key: the n-th call of a key rolls its own dice.
    calls: HashMap<(Operation, String), u32>,
    scripts: HashMap<Operation, VecDeque<Scripted>>,
    counts: FaultCounts,
}

struct Inner {
    service: Service,
    plan: FaultPlan,
    state: Mutex<State>,
}

/// The fault injector of one service. Cheap to clone: clones share scripts, call counts and
/// counters.
#[derive(Clone)]
pub struct Faults {
    inner: Arc<Inner>,
}

impl fmt::Debug for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("Faults")
            .field("service", &self.inner.service)
            .field("plan", &self.inner.plan)
            .field("scripts", &state.scripts)
            .field("counts", &state.counts)
            .finish()
    }
}

impl Faults {
    /// The injector of `service`, following `plan`.
    pub fn new(service: Service, plan: FaultPlan) -> Self {
        let state = State {
            calls: HashMap::new(),
            scripts: HashMap::new(),
            counts: FaultCounts::default(),
        };
        Self {
            inner: Arc::new(Inner {
                service,
                plan,
                state: Mutex::new(state),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The service this injector belongs to.
    pub fn service(&self) -> Service {
        self.inner.service
    }

    /// The random plan.
    pub fn plan(&self) -> &FaultPlan {
        &self.inner.plan
    }

    /// Queue `outcomes` for the next calls of `op` (`"reserve"`, `"charge"`... or an
    /// [`Operation`]), one per call, in order, ahead of the random plan. Appends to
    /// anything already queued.
    ///
    /// # Panics
    /// If `op` is not an operation of this injector's service: a mistake in the test.
    pub fn script(&self, op: impl AsRef<str>, outcomes: Vec<Scripted>) {
        let name = op.as_ref();
        let op = match name.parse::<Operation>() {
            Ok(op) if op.service() == self.inner.service => op,
            _ => panic!(
                "cannot script {name:?} on the {} service",
                self.inner.service
            ),
        };
        self.lock().scripts.entry(op).or_default().extend(outcomes);
    }

    /// Scripted outcomes of `op` not consumed yet.
    pub fn scripted_left(&self, op: Operation) -> usize {
        self.lock().scripts.get(&op).map_or(0, VecDeque::len)
    }

    /// Drop every queued scripted outcome.
    pub fn clear_scripts(&self) {
        self.lock().scripts.clear();
    }

    /// Faults injected so far.
    pub fn counts(&self) -> FaultCounts {
        self.lock().counts
    }

    /// Decide the fate of one call about `subject` (the order it concerns) and count it.
    pub(crate) fn decide(&self, op: Operation, subject: &str) -> Fault {
        let key = subject;
        let plan = &self.inner.plan;
        let mut state = self.lock();
        let scripted = state.scripts.get_mut(&op).and_then(VecDeque::pop_front);
        let fault = match scripted {
            Some(scripted) => Fault::scripted(scripted, op.as_ref(), refusal(op)),
            None if !op.is_compensation()
                && unit_interval(key_hash(plan.seed, &format!("{op}\u{0}{key}")))
                    < plan.permanent =>
            {
                Fault::Permanent(refusal(op).to_owned())
            }
            None if plan.transient > 0.0 || plan.hang > 0.0 || plan.lose_reply > 0.0 => {
                // The dice of a call depend on the seed, the operation, the key and how many
                // times that key was called: not on the order in which concurrent calls
                // arrive, so one seed injects the same faults into the same calls every run.
                let n = state.calls.entry((op, key.to_owned())).or_insert(0);
                *n += 1;
                let mut rng =
                    StdRng::seed_from_u64(key_hash(plan.seed, &format!("{op}\u{0}{key}\u{0}{n}")));
                let roll: f64 = rng.random();
                if roll < plan.transient {
                    Fault::Transient(format!("{op} temporarily unavailable"))
                } else if roll < plan.transient + plan.hang {
                    Fault::Hang
                } else if roll < plan.transient + plan.hang + plan.lose_reply {
                    let how = [
                        LostReply::Reset,
                        LostReply::BadGateway,
                        LostReply::GatewayTimeout,
                    ];
                    Fault::LoseReply(how[rng.random_range(0..how.len())])
                } else {
                    Fault::None
                }
            }
            None => Fault::None,
        };
        fault.count_in(&mut state.counts);
        fault
    }
}

impl Fault {
    /// The fault a [`Scripted`] outcome injects into a call of `op`, whose business refusal
    /// reads `refusal`.
    pub(crate) fn scripted(scripted: Scripted, op: &str, refusal: &str) -> Self {
        match scripted {
            Scripted::Ok => Fault::None,
            Scripted::Transient => Fault::Transient(format!("scripted transient {op}")),
            Scripted::Hang => Fault::Hang,
            Scripted::Permanent => Fault::Permanent(format!("{refusal} (scripted)")),
            Scripted::ResetAfterApply => Fault::LoseReply(LostReply::Reset),
            Scripted::BadGatewayAfterApply => Fault::LoseReply(LostReply::BadGateway),
            Scripted::GatewayTimeoutAfterApply => Fault::LoseReply(LostReply::GatewayTimeout),
            Scripted::RefuseNotApplied => Fault::Refuse(ServiceError::Conflict(format!(
                "{op} conflicts with the remote's state (scripted)"
            ))),
            Scripted::BusyNotApplied => Fault::Refuse(ServiceError::Busy {
                message: format!("{op}: too many requests (scripted)"),
                retry_after_ms: Some(1000),
            }),
        }
    }

    /// Count this fault in `counts` (nothing for [`Fault::None`]).
    pub(crate) fn count_in(&self, counts: &mut FaultCounts) {
        match self {
            Fault::None => {}
            Fault::Transient(_) => counts.transient += 1,
            Fault::Hang => counts.hang += 1,
            Fault::Permanent(_) => counts.permanent += 1,
            Fault::LoseReply(_) => counts.lost_reply += 1,
            Fault::Refuse(_) => counts.refused += 1,
        }
    }
}

/// The business reason a remote gives for refusing `op`.
fn refusal(op: Operation) -> &'static str {
    match op {
        Operation::Reserve => "out of stock",
        Operation::Release => "release refused",
        Operation::Charge => "card declined",
        Operation::Refund => "refund refused",
        Operation::Ship => "address undeliverable",
        Operation::BookFlight => "flight full",
        Operation::BookHotel => "hotel sold out",
        Operation::CancelFlight | Operation::CancelHotel => "cancellation refused",
        Operation::SendItinerary => "mailbox rejected the itinerary",
    }
}

/// A stable hash of `(seed, key)`: FNV-1a over the bytes, then a SplitMix64 finalizer.
/// Independent of the Rust version, so a seed means the same thing everywhere.
fn key_hash(seed: u64, key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in seed.to_le_bytes().iter().chain(key.as_bytes()) {
        h ^= u64::from(*byte);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Map a hash to `[0, 1)`.
fn unit_interval(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_plan_injects_nothing() {
        let faults = Faults::new(Service::Payments, FaultPlan::default());
        for i in 0..100 {
            assert_eq!(
                faults.decide(Operation::Charge, &format!("k{i}")),
                Fault::None
            );
        }
        assert_eq!(faults.counts(), FaultCounts::default());
    }

    #[test]
    fn scripted_outcomes_come_first_and_in_order() {
        let faults = Faults::new(Service::Payments, FaultPlan::default());
        faults.script(
            "charge",
            vec![
                Scripted::Transient,
                Scripted::Hang,
                Scripted::Ok,
                Scripted::Permanent,
            ],
        );
        assert_eq!(faults.scripted_left(Operation::Charge), 4);
        assert!(matches!(faults.decide(Operation::Refund, "r"), Fault::None));
        assert!(matches!(
            faults.decide(Operation::Charge, "k"),
            Fault::Transient(_)
        ));
        assert_eq!(faults.decide(Operation::Charge, "k"), Fault::Hang);
        assert_eq!(faults.decide(Operation::Charge, "k"), Fault::None);
        assert_eq!(
            faults.decide(Operation::Charge, "k"),
            Fault::Permanent("card declined (scripted)".into())
        );
        assert_eq!(faults.decide(Operation::Charge, "k"), Fault::None);
        assert_eq!(
            faults.counts(),
            FaultCounts {
                transient: 1,
                hang: 1,
                permanent: 1,
                ..FaultCounts::default()
            }
        );
    }

    #[test]
    #[should_panic(expected = "cannot script \"ship\" on the payments service")]
    fn scripting_another_services_operation_panics() {
        Faults::new(Service::Payments, FaultPlan::default()).script("ship", vec![Scripted::Ok]);
    }

    #[test]
    fn permanent_faults_are_per_key_and_deterministic() {
        let plan = FaultPlan {
            permanent: 0.5,
            ..FaultPlan::seeded(7)
        };
        let a = Faults::new(Service::Payments, plan.clone());
        let b = Faults::new(Service::Payments, plan);
        let keys: Vec<String> = (0..200).map(|i| format!("order-{i}/charge")).collect();
        let first: Vec<bool> = keys
            .iter()
            .map(|k| matches!(a.decide(Operation::Charge, k), Fault::Permanent(_)))
            .collect();
        for (key, was) in keys.iter().zip(&first) {
            let again = matches!(a.decide(Operation::Charge, key), Fault::Permanent(_));
            let other = matches!(b.decide(Operation::Charge, key), Fault::Permanent(_));
            assert_eq!((again, other), (*was, *was), "key {key}");
        }
        let failing = first.iter().filter(|f| **f).count();
        assert!((60..140).contains(&failing), "{failing} of 200 failed");
    }

    #[test]
    fn compensations_get_no_random_permanent_faults() {
        let plan = FaultPlan {
            permanent: 1.0,
            ..FaultPlan::default()
        };
        let faults = Faults::new(Service::Payments, plan);
        assert!(matches!(
            faults.decide(Operation::Charge, "k"),
            Fault::Permanent(_)
        ));
        assert_eq!(faults.decide(Operation::Refund, "k"), Fault::None);
        faults.script(Operation::Refund, vec![Scripted::Permanent]);
        assert!(matches!(
            faults.decide(Operation::Refund, "k"),
            Fault::Permanent(_)
        ));
    }

    #[test]
    fn random_faults_are_reproducible_from_the_seed() {
        let plan = FaultPlan {
            transient: 0.3,
            hang: 0.2,
            ..FaultPlan::seeded(42)
        };
        let run = || {
            let faults = Faults::new(Service::Shipping, plan.clone());
            let outcomes: Vec<Fault> = (0..500)
                .map(|i| faults.decide(Operation::Ship, &format!("k{i}")))
                .collect();
            (outcomes, faults.counts())
        };
        let (first, counts) = run();
        assert_eq!(run().0, first);
        // The same calls in another order meet the same faults.
        let faults = Faults::new(Service::Shipping, plan.clone());
        let mut reversed: Vec<Fault> = (0..500)
            .rev()
            .map(|i| faults.decide(Operation::Ship, &format!("k{i}")))
            .collect();
        reversed.reverse();
        assert_eq!(reversed, first, "decisions do not depend on call order");
        assert!((100..200).contains(&counts.transient), "{counts:?}");
        assert!((50..150).contains(&counts.hang), "{counts:?}");
        assert_eq!(counts.permanent, 0);
    }
}
