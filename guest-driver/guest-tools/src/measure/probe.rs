//! Finding out that the peer is there before measuring: the two halves of a measurement start
//! independently (two processes, two VMs), so the initiator probes until the responder answers.
//!
//! A channel probe is user-data with cookie [`PROBE_COOKIE`] that asks for a completion: while
//! the responder's channel does not exist the engine completes it with `NoRoute` and the probe
//! is sent again; once it is delivered (completion `Ok`) it is never repeated, so the responder
//! sees exactly one. Responders answer probes and never count them.

use std::time::{Duration, Instant};
use svnic_client::Completions;

use svnic_channels::{ChannelAddr, CompletionStatus, Message, UserData};

use super::MeasureError;
use svnic_client::channel::{Channel, Waiter};

/// Cookie of probe messages.
pub const PROBE_COOKIE: u64 = u64::MAX;
/// Payload of probe messages.
pub const PROBE_PAYLOAD: &[u8] = b"svnic-probe";

/// True if `u` is a probe (or a probe's answer).
pub fn is_probe(u: &UserData) -> bool {
    u.cookie == PROBE_COOKIE && u.data() == PROBE_PAYLOAD
}

/// Answers a probe that arrived from `peer`.
pub fn answer_probe(ch: &mut Channel, peer: ChannelAddr) -> Result<(), MeasureError> {
    if !ch.send_user(peer, PROBE_COOKIE, PROBE_PAYLOAD, Completions::OnError)? {
        return Err(MeasureError::RingFull {
            ring: "TX",
            during: "answering a probe",
        });
    }
    Ok(ch.flush()?)
}

/// Probes `peer` until it answers or `within` passes (then an error naming the last reason).
/// Returns when both the probe's completion and the answer arrived, so that nothing of the
/// probe is left to confuse the measurement that follows.
pub fn channel_probe(
    ch: &mut Channel,
    peer: ChannelAddr,
    within: Duration,
    waiter: &dyn Waiter,
) -> Result<(), MeasureError> {
    let deadline = Instant::now() + within;
    let mut last = None;
    let mut buf = Vec::new();
    loop {
        if !ch.send_user(peer, PROBE_COOKIE, PROBE_PAYLOAD, Completions::Always)? {
            return Err(MeasureError::RingFull {
                ring: "TX",
                during: "sending a probe",
            });
        }
        ch.flush()?;
        let (mut delivered, mut answered, mut refused) = (false, false, false);
        let settled = |d: bool, a: bool, r: bool| r || (d && a);
        while !settled(delivered, answered, refused) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(MeasureError::NoAnswer { peer, within, last });
            }
            buf.clear();
            ch.wait_poll(&mut buf, 64, left.min(Duration::from_millis(200)), waiter)?;
            for m in &buf {
                match m {
                    Message::Completion(c) if c.cookie == PROBE_COOKIE => {
                        if c.status == CompletionStatus::Ok {
                            delivered = true;
                        } else {
                            last = Some(c.status);
                            refused = true;
                        }
                    }
                    Message::UserData(u) if is_probe(u) && u.peer == peer => answered = true,
                    _ => {}
                }
            }
        }
        if delivered && answered {
            return Ok(());
        }
        // Not delivered (no channel at the peer yet): try again a little later.
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits up to `within` for a probe, answers it and returns who sent it. Other messages that
/// arrive first are dropped.
pub fn channel_await_probe(
    ch: &mut Channel,
    within: Duration,
    waiter: &dyn Waiter,
) -> Result<ChannelAddr, MeasureError> {
    let deadline = Instant::now() + within;
    let mut buf = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(MeasureError::TimedOut {
                during: "waiting for a peer's probe",
                waited: within,
                progress: "no probe".into(),
            });
        }
        buf.clear();
        ch.wait_poll(&mut buf, 64, left, waiter)?;
        let probe = buf.iter().find_map(|m| match m {
            Message::UserData(u) if is_probe(u) => Some(u.peer),
            _ => None,
        });
        if let Some(peer) = probe {
            answer_probe(ch, peer)?;
            return Ok(peer);
        }
    }
}
