//! The payload of a wake-up notification on [`READY_CHANNEL`](super::READY_CHANNEL): which loop
//! it concerns and which engine sent it.
//!
//! A payload reads `v1:<kinds>:<sender>`: `kinds` is `c` (steps became ready: claimers), `e`
//! (runs were marked for evaluation: evaluators) or both, and `sender` the instance id of the
//! engine whose transaction sent it. An engine ignores what it sent itself (it woke its own
//! loops already, in process) and wakes only the loop a notification concerns. Anything else,
//! the empty payload of a plain `NOTIFY sagaflow_ready` included, wakes both loops: a payload
//! from a newer release, or from an operator's session, is never ignored.

/// Which of an engine's loops a notification wakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wake {
    /// The claim loop: steps became ready.
    pub claim: bool,
    /// The evaluation loop: runs were marked for evaluation.
    pub evaluate: bool,
}

/// The payload format this release writes and reads.
const FORMAT: &str = "v1";

impl Wake {
    /// Nothing to wake.
    pub const NONE: Self = Self {
        claim: false,
        evaluate: false,
    };
    /// Only the claim loop.
    pub const CLAIM: Self = Self {
        claim: true,
        evaluate: false,
    };
    /// Only the evaluation loop.
    pub const EVALUATE: Self = Self {
        claim: false,
        evaluate: true,
    };
    /// Both loops.
    pub const ALL: Self = Self {
        claim: true,
        evaluate: true,
    };

    /// Whether nothing is to be woken.
    pub const fn is_none(self) -> bool {
        !self.claim && !self.evaluate
    }

    /// Both wake-ups of `self` and `other` (notifications coalesced).
    #[must_use]
    pub const fn or(self, other: Self) -> Self {
        Self {
            claim: self.claim || other.claim,
            evaluate: self.evaluate || other.evaluate,
        }
    }

    /// The payload announcing this wake-up from `sender` (an instance id).
    pub fn payload(self, sender: &str) -> String {
        let kinds = match (self.claim, self.evaluate) {
            (true, false) => "c",
            (false, true) => "e",
            _ => "ce",
        };
        format!("{FORMAT}:{kinds}:{sender}")
    }

    /// What a notification with `payload` asks of the engine `own` (its instance id):
    /// nothing when it sent it itself, the loops it names when it names them in a form this
    /// release knows, and both loops otherwise.
    pub fn heard(payload: &str, own: &str) -> Self {
        let mut parts = payload.splitn(3, ':');
        let (Some(FORMAT), Some(kinds), Some(sender)) = (parts.next(), parts.next(), parts.next())
        else {
            return Self::ALL;
        };
        let mut wake = Self::NONE;
        for k in kinds.chars() {
            match k {
                'c' => wake.claim = true,
                'e' => wake.evaluate = true,
                // A kind this release does not know: a newer engine asks for something.
                _ => return Self::ALL,
            }
        }
        if wake.is_none() {
            return Self::ALL;
        }
        if sender == own {
            return Self::NONE;
        }
        wake
    }
}

#[cfg(test)]
mod tests {
    use super::Wake;

    #[test]
    fn a_payload_names_its_loops_and_sender() {
        assert_eq!(Wake::CLAIM.payload("w1"), "v1:c:w1");
        assert_eq!(Wake::EVALUATE.payload("w1"), "v1:e:w1");
        assert_eq!(Wake::ALL.payload("a:b"), "v1:ce:a:b");
    }

    #[test]
    fn an_engine_ignores_its_own_notifications() {
        for w in [Wake::CLAIM, Wake::EVALUATE, Wake::ALL] {
            assert_eq!(Wake::heard(&w.payload("w1"), "w1"), Wake::NONE);
            // An instance id may hold the separator.
            assert_eq!(Wake::heard(&w.payload("a:b"), "a:b"), Wake::NONE);
        }
    }

    #[test]
    fn another_engines_notification_wakes_the_loop_it_names() {
        assert_eq!(Wake::heard(&Wake::CLAIM.payload("w2"), "w1"), Wake::CLAIM);
        assert_eq!(
            Wake::heard(&Wake::EVALUATE.payload("w2"), "w1"),
            Wake::EVALUATE
        );
        assert_eq!(Wake::heard(&Wake::ALL.payload("w2"), "w1"), Wake::ALL);
        assert_eq!(Wake::heard(&Wake::CLAIM.payload("w1"), "w1:x"), Wake::CLAIM);
    }

    #[test]
    fn a_payload_not_understood_wakes_every_loop() {
        for p in [
            "", "v1", "v1:c", "v1::w2", "v1:cx:w2", "v1:x:w1", "v2:c:w1", "hello", "V1:c:w1",
        ] {
            assert_eq!(Wake::heard(p, "w1"), Wake::ALL, "{p:?}");
        }
    }

    #[test]
    fn coalesced_notifications_wake_each_loop_named() {
        assert_eq!(Wake::CLAIM.or(Wake::EVALUATE), Wake::ALL);
        assert_eq!(Wake::NONE.or(Wake::CLAIM), Wake::CLAIM);
        assert!(Wake::NONE.is_none());
    }
}
