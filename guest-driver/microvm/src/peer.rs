//! The peer the bypass program talks to: a host-process guest that echoes.
//!
//! User-data goes back to its sender with its cookie and payload; DMA-data goes back as DMA-data
//! with the same bytes, into the next buffer the sender posted. That is what the bypass program
//! checks. (`svnic-guest echo` answers the same way but first waits for the measurement tools'
//! probe, which the bypass program does not send.)
//!
//! For DMA-data the echo keeps [`POSTED`] receive buffers posted in the first half of its data
//! area, and answers from the buffer of the same index in the second half; a buffer is used
//! again only after the completion of the send from it arrived.

use std::time::{Duration, Instant};

use svnic_channels::{CompletionStatus, DataRef, Message};
use svnic_client::{Channel, Completions};
use svnic_host_frontend::HostGuest;

use crate::error::MicroVmError;

/// Receive buffers kept posted (and send buffers) for DMA-data: a quarter of half the data area
/// each (about 249 KiB in the default 2 MiB region).
pub const POSTED: u64 = 4;

/// The echo's buffers in the data area of one channel.
#[derive(Debug)]
struct Buffers {
    data_offset: u64,
    len: u64,
    half: u64,
    /// Send buffer `k` is in use until the completion with cookie `k` arrives.
    sending: Vec<bool>,
}

impl Buffers {
    fn new(ch: &Channel) -> Self {
        let half = ch.layout().data_len() / 2;
        Buffers {
            data_offset: ch.layout().data_offset,
            len: (half / POSTED).min(u64::from(u32::MAX)),
            half,
            sending: vec![false; POSTED as usize],
        }
    }

    fn rx(&self, k: u64) -> DataRef {
        DataRef {
            offset: self.data_offset + k * self.len,
            len: self.len as u32,
        }
    }

    fn tx(&self, k: u64, len: u32) -> DataRef {
        DataRef {
            offset: self.data_offset + self.half + k * self.len,
            len,
        }
    }

    fn post(&self, ch: &mut Channel, k: u64) -> Result<(), MicroVmError> {
        if !ch.post_buffer(k, self.rx(k))? {
            return Err(MicroVmError::Peer("post ring full".into()));
        }
        Ok(())
    }
}

/// Echoes user-data and DMA-data on `ch` (a channel of `guest`) until `count` messages were
/// answered, or nothing arrived for `idle` (an error). `seen` is called with each message and
/// its bytes (the inline payload, or the DMA-data read from the data area), in arrival order,
/// before its answer is sent. A completion other than `Ok` for one of the echo's DMA-data sends,
/// or any error completion, is an error. Returns once the engine has taken every answer (and
/// completed every DMA-data send), so closing the channel then loses none.
pub fn echo(
    guest: &HostGuest,
    ch: &mut Channel,
    count: u64,
    idle: Duration,
    mut seen: impl FnMut(&Message, &[u8]),
) -> Result<(), MicroVmError> {
    let waiter = guest.waiter(ch);
    let mut bufs = Buffers::new(ch);
    for k in 0..POSTED {
        bufs.post(ch, k)?;
    }
    ch.flush()?;
    let mut batch = Vec::new();
    let mut bytes = Vec::new();
    let mut answered = 0u64;
    let mut last = Instant::now();
    loop {
        let done = answered >= count;
        if done && ch.tx_free()? == ch.layout().ring_size && !bufs.sending.contains(&true) {
            return Ok(());
        }
        if last.elapsed() >= idle {
            return Err(MicroVmError::Peer(format!(
                "nothing arrived for {idle:?} after {answered} of {count} messages"
            )));
        }
        batch.clear();
        let wait = if done {
            Duration::from_millis(1)
        } else {
            Duration::from_millis(200)
        };
        ch.wait_poll(&mut batch, 64, wait, &waiter)?;
        if !batch.is_empty() {
            last = Instant::now();
        }
        for m in &batch {
            match m {
                Message::UserData(u) => {
                    seen(m, u.data());
                    if !ch.send_user(u.peer, u.cookie, u.data(), Completions::OnError)? {
                        return Err(MicroVmError::Peer("TX ring full".into()));
                    }
                }
                Message::DmaData(d) => {
                    // The cookie is the index of the posted buffer it filled.
                    let k = d.cookie;
                    if k >= POSTED {
                        return Err(MicroVmError::Peer(format!(
                            "DMA-data into unknown buffer {k}"
                        )));
                    }
                    // The engine filled posted buffer k: the data must be exactly there.
                    let posted = bufs.rx(k);
                    if d.data.offset != posted.offset || d.data.len > posted.len {
                        return Err(MicroVmError::Peer(format!(
                            "DMA-data at {:#x}+{} is not inside posted buffer {k}",
                            d.data.offset, d.data.len
                        )));
                    }
                    let busy = bufs.sending.get_mut(k as usize).ok_or_else(|| {
                        MicroVmError::Peer(format!("DMA-data into unknown buffer {k}"))
                    })?;
                    if *busy {
                        return Err(MicroVmError::Peer(format!(
                            "more than {POSTED} DMA-data messages in flight"
                        )));
                    }
                    *busy = true;
                    bytes.resize(d.data.len as usize, 0);
                    ch.read_data(d.data.offset, &mut bytes)?;
                    seen(m, &bytes);
                    let tx = bufs.tx(k, d.data.len);
                    ch.write_data(tx.offset, &bytes)?;
                    if !ch.send_dma(d.peer, k, tx)? {
                        return Err(MicroVmError::Peer("TX ring full".into()));
                    }
                    bufs.post(ch, k)?;
                }
                Message::Completion(c) if c.status == CompletionStatus::Ok => {
                    if let Some(busy) = bufs.sending.get_mut(c.cookie as usize) {
                        *busy = false;
                    }
                    continue;
                }
                other => {
                    return Err(MicroVmError::Peer(format!(
                        "after {answered} answers: {other:?}"
                    )))
                }
            }
            answered += 1;
        }
        ch.flush()?;
    }
}
