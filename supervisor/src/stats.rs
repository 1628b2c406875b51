//! What a supervisor instance did: the public [`SupervisorStats`] snapshot and the shared
//! counters the leader loop and the maintenance services add to.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of what this supervisor instance did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SupervisorStats {
    /// Expired steps re-queued with an extended deadline.
    pub requeued: u64,
    /// Steps of dead or stopped instances re-queued (interruptions).
    pub interrupted: u64,
    /// Expired steps failed at their threshold.
    pub failed: u64,
    /// Terms won.
    pub terms_won: u64,
    /// Sweeps run as leader.
    pub sweeps: u64,
    /// Terms given up because no sweep completed within the stall threshold (LE-3).
    pub stalls: u64,
    /// Queued steps whose priority aging raised (each raise counted once, whatever the
    /// levels gained).
    pub aged: u64,
}

/// The live counters behind [`SupervisorStats`], shared by every term of one instance.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) requeued: AtomicU64,
    pub(crate) interrupted: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) terms_won: AtomicU64,
    pub(crate) sweeps: AtomicU64,
    pub(crate) stalls: AtomicU64,
    pub(crate) aged: AtomicU64,
}

impl Counters {
    /// Adds `n` to `counter`.
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// A consistent-enough copy for reporting.
    pub(crate) fn snapshot(&self) -> SupervisorStats {
        SupervisorStats {
            requeued: self.requeued.load(Ordering::Relaxed),
            interrupted: self.interrupted.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            terms_won: self.terms_won.load(Ordering::Relaxed),
            sweeps: self.sweeps.load(Ordering::Relaxed),
            stalls: self.stalls.load(Ordering::Relaxed),
            aged: self.aged.load(Ordering::Relaxed),
        }
    }
}
