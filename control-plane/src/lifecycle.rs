//! The channel lifecycle as a pure state machine: which event moves a channel from which state to
//! which, and nothing else. The registry applies it; it never changes a state by hand.
//!
//! ```text
//!             Established            Destroy
//!   Pending ──────────────► Success ─────────► Destroyed
//!      │  └──────────────────────────────────►    ▲
//!      │ Refused(reason)        Destroy
//!      ▼
//!   Failure(reason)
//! ```
//!
//! `Failure` and `Destroyed` are terminal: no event leaves them.

use std::fmt;

use svnic_channels::FailureReason;
use thiserror::Error;

/// Where a channel is in its life.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ChannelState {
    /// Admitted by the control plane; the engine is still setting it up. Its endpoint and quota
    /// are reserved, but no route is bound yet.
    Pending,
    /// Set up and routed; the guest may use it.
    Success,
    /// Refused after admission (the engine's own checks failed). Terminal; holds nothing.
    Failure(FailureReason),
    /// Torn down. Terminal; holds nothing.
    Destroyed,
}

/// Something that happens to a channel.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum LifecycleEvent {
    /// The engine finished setting the channel up.
    Established,
    /// The engine refused the channel after admission, for this reason.
    Refused(FailureReason),
    /// The channel's teardown finished.
    Destroy,
}

impl ChannelState {
    /// The state after `event`, or an error if `event` cannot happen in this state.
    pub fn next(self, event: LifecycleEvent) -> Result<ChannelState, TransitionError> {
        use ChannelState::*;
        use LifecycleEvent::*;
        match (self, event) {
            (Pending, Established) => Ok(Success),
            (Pending, Refused(reason)) => Ok(Failure(reason)),
            (Pending | Success, Destroy) => Ok(Destroyed),
            (from, event) => Err(TransitionError { from, event }),
        }
    }

    /// True while the channel holds resources: Pending or Success.
    pub fn is_live(self) -> bool {
        matches!(self, ChannelState::Pending | ChannelState::Success)
    }

    /// True for Failure and Destroyed, which no event leaves.
    pub fn is_terminal(self) -> bool {
        !self.is_live()
    }
}

impl fmt::Display for ChannelState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChannelState::Pending => f.write_str("pending"),
            ChannelState::Success => f.write_str("success"),
            ChannelState::Failure(reason) => write!(f, "failure ({reason})"),
            ChannelState::Destroyed => f.write_str("destroyed"),
        }
    }
}

impl fmt::Display for LifecycleEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LifecycleEvent::Established => f.write_str("established"),
            LifecycleEvent::Refused(reason) => write!(f, "refused ({reason})"),
            LifecycleEvent::Destroy => f.write_str("destroy"),
        }
    }
}

/// An event that cannot happen in the channel's current state.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
#[error("a channel in state {from} cannot take event {event}")]
pub struct TransitionError {
    /// The state the channel was in.
    pub from: ChannelState,
    /// The event refused.
    pub event: LifecycleEvent,
}

#[cfg(test)]
mod tests {
    use super::*;
    use ChannelState::*;
    use LifecycleEvent::*;

    const R: FailureReason = FailureReason::RegionOutsideMemory;

    fn states() -> Vec<ChannelState> {
        let mut v = vec![Pending, Success, Destroyed];
        v.extend(FailureReason::ALL.iter().map(|r| Failure(*r)));
        v
    }

    fn events() -> Vec<LifecycleEvent> {
        let mut v = vec![Established, Destroy];
        v.extend(FailureReason::ALL.iter().map(|r| Refused(*r)));
        v
    }

    /// The allowed transitions, written out as a table independent of `next`.
    fn expected(from: ChannelState, event: LifecycleEvent) -> Option<ChannelState> {
        let allowed: &[(ChannelState, LifecycleEvent, ChannelState)] = &[
            (Pending, Established, Success),
            (Pending, Destroy, Destroyed),
            (Success, Destroy, Destroyed),
        ];
        if let (Pending, Refused(r)) = (from, event) {
            return Some(Failure(r));
        }
        allowed
            .iter()
            .find(|(f, e, _)| *f == from && *e == event)
            .map(|(_, _, to)| *to)
    }

    #[test]
    fn every_state_event_pair_matches_the_table() {
        let mut allowed = 0;
        for from in states() {
            for event in events() {
                let got = from.next(event);
                match expected(from, event) {
                    Some(to) => {
                        allowed += 1;
                        assert_eq!(got, Ok(to), "{from} + {event}");
                    }
                    None => assert_eq!(
                        got,
                        Err(TransitionError { from, event }),
                        "{from} + {event}"
                    ),
                }
            }
        }
        // Established, Destroy and one Refused per reason from Pending; Destroy from Success.
        assert_eq!(allowed, 3 + FailureReason::ALL.len());
    }

    #[test]
    fn the_named_transitions() {
        assert_eq!(Pending.next(Established), Ok(Success));
        assert_eq!(Pending.next(Refused(R)), Ok(Failure(R)));
        assert_eq!(Pending.next(Destroy), Ok(Destroyed));
        assert_eq!(Success.next(Destroy), Ok(Destroyed));
        assert!(Success.next(Established).is_err());
        assert!(Success.next(Refused(R)).is_err());
    }

    #[test]
    fn terminal_states_take_no_event() {
        for from in states().into_iter().filter(|s| s.is_terminal()) {
            for event in events() {
                assert!(from.next(event).is_err(), "{from} + {event}");
            }
        }
        assert!(Pending.is_live() && Success.is_live());
        assert!(Destroyed.is_terminal() && Failure(R).is_terminal());
    }

    #[test]
    fn errors_name_state_and_event() {
        let msg = Destroyed.next(Established).err().map(|e| e.to_string());
        assert_eq!(
            msg.as_deref(),
            Some("a channel in state destroyed cannot take event established")
        );
    }
}
