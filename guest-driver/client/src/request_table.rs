//! The client's book of control requests and channel regions: which request is waiting for what,
//! which region belongs to which live channel, and — the one rule that matters for memory
//! safety — when a region may be freed:
//!
//! - a create the engine refused (Failure): at once (the engine allocated nothing);
//! - a channel's region: only when the engine answered its destroy with Destroyed;
//! - a destroy the engine refused: never (the region is quarantined; the engine may still use it).
//!
//! A request whose caller gave up (timeout, a dropped pending request) is "abandoned":
//! its answer is still processed when it comes, and a channel created for nobody is destroyed.
//! Pure bookkeeping, no I/O: the caller carries out the returned [`Action`]s.

use std::collections::HashMap;

use svnic_channels::frame::{ControlResponse, ControlStatus};
use svnic_channels::{ChannelId, FailureReason};

/// A channel region in the guest memory: guest-physical address and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionLease {
    /// Guest-physical address.
    pub gpa: u64,
    /// Length.
    pub len: u64,
}

/// Where a request stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Sent; no answer, or Pending.
    Pending,
    /// Create: the channel exists.
    Created {
        /// Channel id.
        channel: ChannelId,
        /// Serving worker.
        worker: u32,
        /// Host CPU of the worker, if pinned.
        cpu: Option<u32>,
    },
    /// Create: refused; the region was freed.
    Refused(FailureReason),
    /// Destroy: acknowledged; the region was freed.
    Destroyed,
    /// Destroy: refused; the region stays quarantined.
    DestroyRefused(FailureReason),
}

impl Outcome {
    fn is_final(&self) -> bool {
        !matches!(self, Outcome::Pending)
    }
}

/// What the caller must do after an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// The engine no longer uses this region: free it.
    Free(RegionLease),
    /// A channel was created for an abandoned request: destroy it (then free its region).
    Destroy(ChannelId),
    /// The engine refused to destroy a channel: its region must never be reused.
    Quarantine {
        /// The channel.
        channel: ChannelId,
        /// Its region.
        region: RegionLease,
        /// Why the engine refused.
        reason: FailureReason,
    },
}

/// Why a response was not applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ignored {
    /// No request with that id is outstanding.
    UnknownRequest(u32),
    /// A status that makes no sense for the request (or a second final answer).
    Unexpected {
        /// The request.
        request_id: u32,
        /// What was received.
        status: ControlStatus,
    },
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Create {
        region: RegionLease,
    },
    Destroy {
        channel: ChannelId,
        region: RegionLease,
    },
}

#[derive(Debug)]
struct Entry {
    op: Op,
    outcome: Outcome,
    abandoned: bool,
}

/// Outstanding requests and live channels' regions.
#[derive(Debug, Default)]
pub struct RequestTable {
    next_id: u32,
    entries: HashMap<u32, Entry>,
    live: HashMap<ChannelId, RegionLease>,
    quarantined: Vec<RegionLease>,
}

impl RequestTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    fn fresh_id(&mut self) -> u32 {
        loop {
            self.next_id = self.next_id.wrapping_add(1);
            if self.next_id != 0 && !self.entries.contains_key(&self.next_id) {
                return self.next_id;
            }
        }
    }

    /// Records a create request for `region`; returns its request id.
    pub fn begin_create(&mut self, region: RegionLease) -> u32 {
        let id = self.fresh_id();
        self.entries.insert(
            id,
            Entry {
                op: Op::Create { region },
                outcome: Outcome::Pending,
                abandoned: false,
            },
        );
        id
    }

    /// Records a destroy request for a live channel; `None` if the channel is not live here
    /// (unknown, or its destroy already began).
    pub fn begin_destroy(&mut self, channel: ChannelId) -> Option<u32> {
        let region = self.live.remove(&channel)?;
        let id = self.fresh_id();
        self.entries.insert(
            id,
            Entry {
                op: Op::Destroy { channel, region },
                outcome: Outcome::Pending,
                abandoned: false,
            },
        );
        Some(id)
    }

    /// Applies a control response; returns what the caller must do.
    pub fn on_response(&mut self, resp: &ControlResponse) -> Result<Vec<Action>, Ignored> {
        let id = resp.request_id;
        let entry = self
            .entries
            .get_mut(&id)
            .ok_or(Ignored::UnknownRequest(id))?;
        let unexpected = Ignored::Unexpected {
            request_id: id,
            status: resp.status,
        };
        if entry.outcome.is_final() {
            return Err(unexpected);
        }
        let mut actions = Vec::new();
        match (entry.op, resp.status) {
            (_, ControlStatus::Pending) => return Ok(actions),
            (Op::Create { region }, ControlStatus::Success { worker, cpu }) => {
                self.live.insert(resp.channel, region);
                entry.outcome = Outcome::Created {
                    channel: resp.channel,
                    worker,
                    cpu,
                };
                if entry.abandoned {
                    actions.push(Action::Destroy(resp.channel));
                }
            }
            (Op::Create { region }, ControlStatus::Failure(reason)) => {
                entry.outcome = Outcome::Refused(reason);
                actions.push(Action::Free(region));
            }
            (Op::Destroy { region, .. }, ControlStatus::Destroyed) => {
                entry.outcome = Outcome::Destroyed;
                actions.push(Action::Free(region));
            }
            (Op::Destroy { channel, region }, ControlStatus::Failure(reason)) => {
                entry.outcome = Outcome::DestroyRefused(reason);
                self.quarantined.push(region);
                actions.push(Action::Quarantine {
                    channel,
                    region,
                    reason,
                });
            }
            (Op::Create { .. }, ControlStatus::Destroyed)
            | (Op::Destroy { .. }, ControlStatus::Success { .. }) => return Err(unexpected),
        }
        if entry.abandoned {
            self.entries.remove(&id);
        }
        Ok(actions)
    }

    /// Where request `id` stands (`None`: unknown or already taken).
    pub fn outcome(&self, id: u32) -> Option<Outcome> {
        self.entries.get(&id).map(|e| e.outcome)
    }

    /// Removes and returns a final outcome; `None` while pending or unknown.
    pub fn take_final(&mut self, id: u32) -> Option<Outcome> {
        let outcome = self.entries.get(&id)?.outcome;
        if outcome.is_final() {
            self.entries.remove(&id);
            Some(outcome)
        } else {
            None
        }
    }

    /// The caller no longer waits for request `id`. A pending request is marked abandoned; a
    /// create that already succeeded but was never taken yields [`Action::Destroy`].
    pub fn abandon(&mut self, id: u32) -> Vec<Action> {
        let Some(entry) = self.entries.get_mut(&id) else {
            return Vec::new();
        };
        match entry.outcome {
            Outcome::Pending => {
                entry.abandoned = true;
                Vec::new()
            }
            Outcome::Created { channel, .. } => {
                self.entries.remove(&id);
                vec![Action::Destroy(channel)]
            }
            _ => {
                self.entries.remove(&id);
                Vec::new()
            }
        }
    }

    /// The region of a live channel.
    pub fn live_region(&self, channel: ChannelId) -> Option<RegionLease> {
        self.live.get(&channel).copied()
    }

    /// Number of live channels (created, destroy not begun).
    pub fn live_channels(&self) -> usize {
        self.live.len()
    }

    /// Requests not yet answered or not yet taken.
    pub fn outstanding(&self) -> usize {
        self.entries.len()
    }

    /// Regions that can never be reused (their destroy was refused).
    pub fn quarantined(&self) -> &[RegionLease] {
        &self.quarantined
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const R: RegionLease = RegionLease {
        gpa: 2 << 20,
        len: 2 << 20,
    };

    fn resp(request_id: u32, channel: u32, status: ControlStatus) -> ControlResponse {
        ControlResponse {
            request_id,
            channel: ChannelId(channel),
            status,
        }
    }

    fn success() -> ControlStatus {
        ControlStatus::Success {
            worker: 1,
            cpu: None,
        }
    }

    /// A table holding `channel`, created in region [`R`] and taken by its caller.
    fn holding(channel: u32) -> RequestTable {
        let mut t = RequestTable::new();
        let id = t.begin_create(R);
        t.on_response(&resp(id, channel, success())).unwrap();
        t.take_final(id);
        t
    }

    #[test]
    fn create_then_destroy_frees_only_on_destroyed() {
        let mut t = RequestTable::new();
        let id = t.begin_create(R);
        assert_eq!(
            t.on_response(&resp(id, 7, ControlStatus::Pending)),
            Ok(vec![])
        );
        assert_eq!(t.take_final(id), None);
        assert_eq!(t.on_response(&resp(id, 7, success())), Ok(vec![]));
        assert_eq!(
            t.take_final(id),
            Some(Outcome::Created {
                channel: ChannelId(7),
                worker: 1,
                cpu: None
            })
        );
        assert_eq!(t.live_region(ChannelId(7)), Some(R));
        let d = t.begin_destroy(ChannelId(7)).unwrap();
        assert_ne!(d, id);
        assert_eq!(t.begin_destroy(ChannelId(7)), None, "destroy already begun");
        assert_eq!(
            t.on_response(&resp(d, 7, ControlStatus::Destroyed)),
            Ok(vec![Action::Free(R)])
        );
        assert_eq!(t.take_final(d), Some(Outcome::Destroyed));
        assert_eq!(t.outstanding(), 0);
        assert_eq!(t.live_channels(), 0);
    }

    #[test]
    fn a_refused_create_frees_at_once() {
        let mut t = RequestTable::new();
        let id = t.begin_create(R);
        let failure = ControlStatus::Failure(FailureReason::QuotaExceeded);
        assert_eq!(
            t.on_response(&resp(id, 0, failure)),
            Ok(vec![Action::Free(R)])
        );
        assert_eq!(
            t.take_final(id),
            Some(Outcome::Refused(FailureReason::QuotaExceeded))
        );
        assert_eq!(t.live_channels(), 0);
    }

    #[test]
    fn a_refused_destroy_quarantines_the_region() {
        let mut t = holding(3);
        let d = t.begin_destroy(ChannelId(3)).unwrap();
        let failure = ControlStatus::Failure(FailureReason::NoSuchChannel);
        assert_eq!(
            t.on_response(&resp(d, 3, failure)),
            Ok(vec![Action::Quarantine {
                channel: ChannelId(3),
                region: R,
                reason: FailureReason::NoSuchChannel
            }])
        );
        assert_eq!(t.quarantined(), &[R]);
    }

    #[test]
    fn an_abandoned_create_that_succeeds_is_destroyed_and_one_that_fails_is_freed() {
        let mut t = RequestTable::new();
        let a = t.begin_create(R);
        assert_eq!(t.abandon(a), vec![]);
        assert_eq!(
            t.on_response(&resp(a, 9, success())),
            Ok(vec![Action::Destroy(ChannelId(9))])
        );
        assert_eq!(t.outcome(a), None, "abandoned entries go once answered");
        assert_eq!(t.live_region(ChannelId(9)), Some(R));
        assert!(t.begin_destroy(ChannelId(9)).is_some());

        let b = t.begin_create(R);
        t.abandon(b);
        let failure = ControlStatus::Failure(FailureReason::BadRingSize);
        assert_eq!(
            t.on_response(&resp(b, 0, failure)),
            Ok(vec![Action::Free(R)])
        );

        // Succeeded, but the caller dropped it before taking the channel.
        let c = t.begin_create(R);
        t.on_response(&resp(c, 11, success())).unwrap();
        assert_eq!(t.abandon(c), vec![Action::Destroy(ChannelId(11))]);
    }

    #[test]
    fn an_abandoned_destroy_still_frees_when_acknowledged() {
        let mut t = holding(4);
        let d = t.begin_destroy(ChannelId(4)).unwrap();
        t.abandon(d);
        assert_eq!(
            t.on_response(&resp(d, 4, ControlStatus::Destroyed)),
            Ok(vec![Action::Free(R)])
        );
        assert_eq!(t.outstanding(), 0);
    }

    #[test]
    fn nonsense_responses_are_ignored() {
        let mut t = RequestTable::new();
        assert_eq!(
            t.on_response(&resp(42, 0, success())),
            Err(Ignored::UnknownRequest(42))
        );
        let id = t.begin_create(R);
        assert!(matches!(
            t.on_response(&resp(id, 1, ControlStatus::Destroyed)),
            Err(Ignored::Unexpected { .. })
        ));
        t.on_response(&resp(id, 1, success())).unwrap();
        // A second final answer does not change the first.
        assert!(matches!(
            t.on_response(&resp(
                id,
                1,
                ControlStatus::Failure(FailureReason::BadRequest)
            )),
            Err(Ignored::Unexpected { .. })
        ));
        assert!(matches!(t.take_final(id), Some(Outcome::Created { .. })));
        let d = t.begin_destroy(ChannelId(1)).unwrap();
        assert!(matches!(
            t.on_response(&resp(d, 1, success())),
            Err(Ignored::Unexpected { .. })
        ));
        assert_eq!(t.outcome(d), Some(Outcome::Pending));
    }

    #[test]
    fn request_ids_are_never_zero_and_never_reused_while_outstanding() {
        let mut t = RequestTable::new();
        t.next_id = u32::MAX - 1;
        let a = t.begin_create(R);
        let b = t.begin_create(R);
        assert_eq!(a, u32::MAX);
        assert_eq!(b, 1);
        t.next_id = u32::MAX - 1;
        let c = t.begin_create(R);
        assert!(c != a && c != b && c != 0);
    }
}
