//! Messages between a local channel and a channel of another host's engine (docs/wire.md): what a
//! sender's message becomes while it crosses the uplink, and how a message from the wire is
//! placed into a local channel.
//!
//! - **Outbound**: a message taken from a TX ring for a remote destination is kept as an
//!   [`Outbound`]: user-data with its inline bytes, DMA-data as a range of the sender's data area
//!   (read again for each transmission of a fragment: the sender owns the buffer until its
//!   completion, so a retransmission sends what the first transmission sent).
//! - **Inbound user-data** goes into the destination's RX ring as a local delivery would put it,
//!   with the remote channel as peer.
//! - **Inbound DMA-data** is placed fragment by fragment, in order, straight into the
//!   destination's next posted buffer: the buffer is reserved from the first fragment on (it
//!   stays at the head of the post ring, as for a local message copied in pieces, so buffers are
//!   still filled in post order) and its RX message is written and published after the last
//!   fragment. Every fragment is copied under the destination's RX lock with `open` checked.
//!   A [`Placement`] dropped before its last fragment gives the reservation back; the buffer stays
//!   posted and gets no RX message.

use std::sync::Arc;

use svnic_channels::frame::DataKind;
use svnic_channels::message::{FLAG_COMPLETE, INLINE_CAPACITY};
use svnic_channels::{
    ChannelAddr, ChannelMem, CompletionStatus, DataRef, DmaData, FaultReason, Message, PostBuffer,
    UserData,
};

use vm_memory::VolatileMemory;

use super::channel::{EngineChannel, RxSide};
use super::deliver::{closed_status, Outcome, Tx};
use crate::debug_fields::debug_fields;

/// A message taken from a sender's TX ring for a remote destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Outbound {
    /// The destination.
    pub peer: ChannelAddr,
    /// The sender's message flags.
    pub flags: u8,
    /// The sender's cookie, echoed in its completion.
    pub cookie: u64,
    /// What to send.
    pub body: OutboundBody,
}

/// The bytes of an [`Outbound`] message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OutboundBody {
    /// User-data: its inline bytes.
    Inline {
        len: u8,
        bytes: [u8; INLINE_CAPACITY],
    },
    /// DMA-data: a range of the sender's data area (checked against its layout when taken).
    Dma(DataRef),
}

impl Outbound {
    /// The message of `tx`, addressed to `peer`.
    pub fn from_tx(tx: &Tx<'_>, peer: ChannelAddr) -> Option<Self> {
        match tx {
            Tx::User { raw, flags } => match raw.decode().ok()? {
                Message::UserData(u) => Some(Outbound {
                    peer,
                    flags: *flags,
                    cookie: u.cookie,
                    body: OutboundBody::Inline {
                        len: u.len,
                        bytes: u.payload,
                    },
                }),
                _ => None,
            },
            Tx::Dma(d) => Some(Outbound {
                peer,
                flags: d.flags,
                cookie: d.cookie,
                body: OutboundBody::Dma(d.data),
            }),
        }
    }

    /// User-data or DMA-data.
    pub fn kind(&self) -> DataKind {
        match self.body {
            OutboundBody::Inline { .. } => DataKind::UserData,
            OutboundBody::Dma(_) => DataKind::DmaData,
        }
    }

    /// User-data's inline bytes; `None` for DMA-data.
    pub fn inline(&self) -> Option<&[u8]> {
        match &self.body {
            OutboundBody::Inline { len, bytes } => bytes.get(..usize::from(*len)),
            OutboundBody::Dma(_) => None,
        }
    }

    /// The message's length in bytes.
    pub fn len(&self) -> u32 {
        match self.body {
            OutboundBody::Inline { len, .. } => u32::from(len),
            OutboundBody::Dma(d) => d.len,
        }
    }

    /// Copies the message's bytes `offset..offset + out.len()` into `out`, from the sender's
    /// memory for DMA-data. False if the range is outside the message or the memory.
    pub fn read(&self, src_mem: &ChannelMem<'_>, offset: u32, out: &mut [u8]) -> bool {
        let Some(end) = u32::try_from(out.len())
            .ok()
            .and_then(|n| offset.checked_add(n))
        else {
            return false;
        };
        if end > self.len() {
            return false;
        }
        match &self.body {
            OutboundBody::Inline { bytes, .. } => match bytes.get(offset as usize..end as usize) {
                Some(b) => {
                    out.copy_from_slice(b);
                    true
                }
                None => false,
            },
            OutboundBody::Dma(d) => {
                let Some(at) = d
                    .offset
                    .checked_add(u64::from(offset))
                    .and_then(|a| usize::try_from(a).ok())
                else {
                    return false;
                };
                src_mem
                    .slice()
                    .get_slice(at, out.len())
                    .map(|s| s.copy_to(out) == out.len())
                    .unwrap_or(false)
            }
        }
    }
}

/// Places remote user-data from `peer` into `dest`'s RX ring (COMPLETE, as a local delivery
/// writes it) and publishes it. `Delivered` with
/// no completion (the sender's completion travels back in an acknowledgement).
pub(crate) fn place_user(
    dest: &EngineChannel,
    peer: ChannelAddr,
    cookie: u64,
    payload: &[u8],
) -> Outcome {
    let Ok(len) = u8::try_from(payload.len()) else {
        return Outcome::Failed(CompletionStatus::BadMessage);
    };
    let mut bytes = [0u8; INLINE_CAPACITY];
    match bytes.get_mut(..payload.len()) {
        Some(b) => b.copy_from_slice(payload),
        None => return Outcome::Failed(CompletionStatus::BadMessage),
    }
    let msg = Message::UserData(UserData {
        peer,
        flags: FLAG_COMPLETE,
        cookie,
        len,
        payload: bytes,
    })
    .encode();
    let mem = dest.mem();
    let mut rx = dest.lock_rx();
    match rx.accepts(dest, &mem) {
        Ok(()) => {}
        Err(Outcome::DestinationBroken(reason, e)) => return broken(dest, rx, reason, e),
        Err(outcome) => return outcome,
    }
    if let Err(e) = rx.rx.push(&mem, &msg).and_then(|_| rx.rx.publish(&mem)) {
        return broken(dest, rx, FaultReason::RxIndex, e);
    }
    dest.counters.add_rx(1, 0);
    drop(rx);
    dest.wake_if_sleeping(&mem);
    Outcome::Delivered {
        completion: None,
        bytes: 0,
    }
}

/// Unlocks `dest` and faults it; the message fails `DestinationFaulted`.
fn broken(
    dest: &EngineChannel,
    rx: super::rx_lock::RxGuard<'_, RxSide>,
    reason: FaultReason,
    e: svnic_channels::RingError,
) -> Outcome {
    drop(rx);
    dest.fault(reason, &e);
    Outcome::Failed(CompletionStatus::DestinationFaulted)
}

/// Remote DMA-data being placed into a local channel's posted buffer, fragment by fragment.
pub(crate) struct Placement {
    dest: Arc<EngineChannel>,
    buf: PostBuffer,
    total: u32,
    placed: u32,
    reserved: bool,
}

debug_fields!(Placement, |p| dest: p.dest.id, buf: p.buf, total: p.total, placed: p.placed);

impl Placement {
    /// Reserves `dest`'s next posted buffer for a message of `total` bytes (the checks of a local
    /// delivery: open, RX room, a posted buffer large enough), or the outcome for the message.
    pub fn begin(dest: &Arc<EngineChannel>, total: u32) -> Result<Self, Outcome> {
        let mem = dest.mem();
        let mut rx = dest.lock_rx();
        let mut wrote = false;
        let found = rx.reserve_post(dest, &mem, &mut wrote, total);
        if let Err(Outcome::DestinationBroken(reason, e)) = found {
            return Err(broken(dest, rx, reason, e));
        }
        if wrote {
            // Refused posted buffers were reported on the destination's own RX ring.
            if let Err(e) = rx.rx.publish(&mem) {
                // The reservation goes with the channel, which the fault closes.
                return Err(broken(dest, rx, FaultReason::RxIndex, e));
            }
        }
        let placement = found.map(|buf| Placement {
            dest: Arc::clone(dest),
            buf,
            total,
            placed: 0,
            reserved: true,
        });
        drop(rx);
        if wrote {
            dest.wake_if_sleeping(&mem);
        }
        placement
    }

    /// Bytes placed so far.
    pub fn placed(&self) -> u32 {
        self.placed
    }

    /// Copies the next fragment (`bytes`, at offset `placed()` of the message) into the buffer.
    /// On failure the message is over (the reservation is given back when this is dropped).
    pub fn copy(&mut self, bytes: &[u8]) -> Result<(), Outcome> {
        let n = u32::try_from(bytes.len()).map_err(|_| bad())?;
        let end = self.placed.checked_add(n).ok_or_else(bad)?;
        if end > self.total {
            return Err(bad());
        }
        let at = self
            .buf
            .buf
            .offset
            .checked_add(u64::from(self.placed))
            .and_then(|a| usize::try_from(a).ok())
            .ok_or_else(bad)?;
        let mem = self.dest.mem();
        let rx = self.dest.lock_rx();
        if !rx.open {
            return Err(Outcome::Failed(closed_status(&self.dest)));
        }
        let written = mem
            .slice()
            .get_slice(at, bytes.len())
            .map(|s| s.copy_from(bytes))
            .is_ok();
        drop(rx);
        if !written {
            return Err(bad());
        }
        self.placed = end;
        Ok(())
    }

    /// After the last fragment: consumes the buffer, writes the RX message (from `peer`) and
    /// publishes it. `Blocked(RingFull)` if the RX ring has no room yet (try again later; the
    /// data stays in place).
    pub fn finish(&mut self, peer: ChannelAddr) -> Outcome {
        if self.placed != self.total {
            return bad();
        }
        let dest = Arc::clone(&self.dest);
        let mem = dest.mem();
        let mut rx = dest.lock_rx();
        match rx.accepts(&dest, &mem) {
            Ok(()) => {}
            Err(Outcome::DestinationBroken(reason, e)) => return broken(&dest, rx, reason, e),
            Err(outcome) => return outcome,
        }
        let out = Message::DmaData(DmaData {
            peer,
            flags: FLAG_COMPLETE,
            cookie: self.buf.cookie,
            data: DataRef {
                offset: self.buf.buf.offset,
                len: self.total,
            },
        });
        rx.post.skip();
        rx.post_reserved = false;
        self.reserved = false;
        let published = rx
            .rx
            .push(&mem, &out.encode())
            .and_then(|_| rx.rx.publish(&mem));
        if let Err(e) = published {
            return broken(&dest, rx, FaultReason::RxIndex, e);
        }
        if let Err(e) = rx.post.release(&mem) {
            return broken(&dest, rx, FaultReason::PostIndex, e);
        }
        dest.counters.add_rx(1, u64::from(self.total));
        drop(rx);
        dest.wake_if_sleeping(&mem);
        Outcome::Delivered {
            completion: None,
            bytes: u64::from(self.total),
        }
    }
}

fn bad() -> Outcome {
    Outcome::Failed(CompletionStatus::BadMessage)
}

impl Drop for Placement {
    fn drop(&mut self) {
        if self.reserved {
            self.dest.lock_rx().post_reserved = false;
        }
    }
}

/// A remote message being received into a local channel: what the receiving side of the
/// protocol keeps between its fragments.
#[derive(Debug)]
pub(crate) enum Incoming {
    /// User-data: its bytes so far (written into the RX ring with the last fragment).
    User {
        len: usize,
        bytes: [u8; INLINE_CAPACITY],
    },
    /// DMA-data: placed into a reserved posted buffer as it arrives.
    Dma(Placement),
}

impl Incoming {
    /// Takes the fragment `bytes` at `offset` of its message; a fragment placed already (a
    /// retransmission of one whose message could not be published yet) is passed over.
    pub fn take(&mut self, offset: u32, bytes: &[u8]) -> Result<(), Outcome> {
        match self {
            Incoming::User { len, bytes: buf } => {
                let at = offset as usize;
                if at < *len {
                    return Ok(());
                }
                let end = at.checked_add(bytes.len()).ok_or_else(bad)?;
                if at != *len {
                    return Err(bad());
                }
                buf.get_mut(at..end).ok_or_else(bad)?.copy_from_slice(bytes);
                *len = end;
                Ok(())
            }
            Incoming::Dma(p) => {
                if offset < p.placed() {
                    return Ok(());
                }
                if offset != p.placed() {
                    return Err(bad());
                }
                p.copy(bytes)
            }
        }
    }

    /// After the last fragment: writes the message from `peer` into `dest`'s RX ring.
    pub fn finish(&mut self, dest: &EngineChannel, peer: ChannelAddr, cookie: u64) -> Outcome {
        match self {
            Incoming::User { len, bytes } => match bytes.get(..*len) {
                Some(b) => place_user(dest, peer, cookie, b),
                None => bad(),
            },
            Incoming::Dma(p) => p.finish(peer),
        }
    }
}
