//! The peer the bypass program talks to: a host-process guest that echoes user-data.
//!
//! Each user-data message goes back to its sender with its cookie and payload, which is what
//! the bypass program checks. (`svnic-guest echo` answers the same way but first waits for the
//! measurement tools' probe, which the bypass program does not send.)

use std::time::{Duration, Instant};

use svnic_channels::{Message, UserData};
use svnic_client::{Channel, Completions};
use svnic_host_frontend::HostGuest;

use crate::error::MicroVmError;

/// Echoes user-data on `ch` (a channel of `guest`) until `count` messages were answered, or
/// nothing arrived for `idle` (an error). `seen` is called with each message, in arrival order,
/// before its answer is sent. Any other message (a completion: an answer could not be
/// delivered) is an error. Returns once the engine has taken every answer from the TX ring, so
/// closing the channel then loses none.
pub fn echo(
    guest: &HostGuest,
    ch: &mut Channel,
    count: u64,
    idle: Duration,
    mut seen: impl FnMut(&UserData),
) -> Result<(), MicroVmError> {
    let waiter = guest.waiter(ch);
    let mut buf = Vec::new();
    let mut answered = 0u64;
    let mut last = Instant::now();
    while answered < count {
        buf.clear();
        let want = usize::try_from(count - answered)
            .unwrap_or(usize::MAX)
            .min(64);
        ch.wait_poll(&mut buf, want, Duration::from_millis(200), &waiter)?;
        if buf.is_empty() {
            if last.elapsed() >= idle {
                return Err(MicroVmError::Peer(format!(
                    "nothing arrived for {idle:?} after {answered} of {count} messages"
                )));
            }
            continue;
        }
        last = Instant::now();
        for m in &buf {
            let Message::UserData(u) = m else {
                return Err(MicroVmError::Peer(format!(
                    "after {answered} answers, not user-data: {m:?}"
                )));
            };
            seen(u);
            if !ch.send_user(u.peer, u.cookie, u.data(), Completions::OnError)? {
                return Err(MicroVmError::Peer(
                    "TX ring full: the sender has more than a ring in flight".into(),
                ));
            }
            answered += 1;
        }
        ch.flush()?;
    }
    let start = Instant::now();
    while ch.tx_free()? < ch.layout().ring_size {
        if start.elapsed() >= idle {
            return Err(MicroVmError::Peer(format!(
                "the engine did not take the last answers within {idle:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}
