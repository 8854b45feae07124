//! Delivery of one message from a sender channel into a destination channel whose RX side the
//! caller has locked. Pure decisions plus the copy; no waiting, no locking, no completions
//! written for the sender (the caller batches those).
//!
//! - user-data: the 64 bytes are rewritten with the sender's address as peer and published
//!   COMPLETE in the destination's RX ring;
//! - DMA-data: the data is copied once, from the sender's data area into the next buffer the
//!   destination posted, and only then is the RX message written with COMPLETE (the RX index is
//!   published later, after the copy, so the receiver can never see the message before the data).

use svnic_channels::message::{FLAG_COMPLETE, FLAG_WANT_COMPLETION};
use svnic_channels::{
    ChannelMem, CompletionStatus, DataRef, DmaData, FaultReason, Message, RawMessage, RingError,
    UserData,
};
use vm_memory::VolatileMemory;

use super::channel::{completion, EngineChannel, RxSide};

/// What happened to one message.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Written into the destination's RX ring; with a success completion for the sender if one
    /// is due.
    Delivered {
        completion: Option<RawMessage>,
        bytes: u64,
    },
    /// Refused for good: the sender gets an error completion with this status.
    Failed(CompletionStatus),
    /// No room yet (RX ring full, or no posted buffer): try again later; this status is what the
    /// sender gets if the wait runs out.
    Blocked(CompletionStatus),
    /// The destination's own rings are broken: fault it (after unlocking), fail the message.
    DestinationBroken(FaultReason, RingError),
}

/// Delivers `msg` (already validated as user-data or DMA-data from `src`) into `dest`.
/// `wrote` is set when anything was written into the destination's RX ring (needs a publish).
pub(crate) fn deliver_locked(
    src: &EngineChannel,
    src_mem: &ChannelMem<'_>,
    msg: &Message,
    dest: &EngineChannel,
    dest_mem: &ChannelMem<'_>,
    rx: &mut RxSide,
    wrote: &mut bool,
) -> Outcome {
    if !rx.open {
        return Outcome::Failed(if dest.is_live() {
            CompletionStatus::DestinationGone
        } else if matches!(dest.run_state(), super::channel::RunState::Faulted) {
            CompletionStatus::DestinationFaulted
        } else {
            CompletionStatus::DestinationGone
        });
    }
    match rx_room(rx, dest_mem) {
        Ok(true) => {}
        Ok(false) => return Outcome::Blocked(CompletionStatus::RingFull),
        Err(e) => return Outcome::DestinationBroken(FaultReason::RxIndex, e),
    }
    match msg {
        Message::UserData(u) => {
            let out = UserData {
                peer: src.addr,
                flags: FLAG_COMPLETE,
                ..*u
            };
            match rx.rx.push(dest_mem, &Message::UserData(out).encode()) {
                Ok(_) => *wrote = true,
                Err(e) => return Outcome::DestinationBroken(FaultReason::RxIndex, e),
            }
            let completion = (u.flags & FLAG_WANT_COMPLETION != 0)
                .then(|| completion(u.peer, u.cookie, CompletionStatus::Ok, 0));
            Outcome::Delivered {
                completion,
                bytes: 0,
            }
        }
        Message::DmaData(d) => deliver_dma(src, src_mem, d, dest, dest_mem, rx, wrote),
        // The caller only passes user-data and DMA-data.
        Message::PostBuffer(_) | Message::Completion(_) => {
            Outcome::Failed(CompletionStatus::BadMessage)
        }
    }
}

/// True if the RX ring has a free slot (re-reading the guest's consumer index only when the
/// cached view says full).
fn rx_room(rx: &mut RxSide, mem: &ChannelMem<'_>) -> Result<bool, RingError> {
    if rx.rx.cached_free() > 0 {
        return Ok(true);
    }
    Ok(rx.rx.free(mem)? > 0)
}

fn deliver_dma(
    src: &EngineChannel,
    src_mem: &ChannelMem<'_>,
    d: &DmaData,
    dest: &EngineChannel,
    dest_mem: &ChannelMem<'_>,
    rx: &mut RxSide,
    wrote: &mut bool,
) -> Outcome {
    loop {
        let post = match next_post(rx, dest_mem) {
            Ok(Some(p)) => p,
            Ok(None) => return Outcome::Blocked(CompletionStatus::NoBuffer),
            Err(e) => return Outcome::DestinationBroken(FaultReason::PostIndex, e),
        };
        let usable = match post.decode() {
            Ok(Message::PostBuffer(p))
                if dest
                    .layout
                    .data_range_ok(p.buf.offset, p.buf.len.into(), false) =>
            {
                Some(p)
            }
            _ => None,
        };
        let Some(p) = usable else {
            // A posted buffer outside the data area (or not a post at all): refuse it with a
            // completion on the destination's own RX ring, and look at the next one.
            rx.post.skip();
            dest.counters.bad_post();
            let c = completion(
                Default::default(),
                post.cookie(),
                CompletionStatus::BadPostBuffer,
                0,
            );
            match rx.rx.push(dest_mem, &c) {
                Ok(true) => *wrote = true,
                Ok(false) => rx.backlog.push_back(c),
                Err(e) => return Outcome::DestinationBroken(FaultReason::RxIndex, e),
            }
            match rx_room(rx, dest_mem) {
                Ok(true) => continue,
                Ok(false) => return Outcome::Blocked(CompletionStatus::RingFull),
                Err(e) => return Outcome::DestinationBroken(FaultReason::RxIndex, e),
            }
        };
        if p.buf.len < d.data.len {
            // The buffer stays posted: a later, smaller message may fit it.
            return Outcome::Failed(CompletionStatus::BufferTooSmall);
        }
        let len = d.data.len as usize;
        let copied = src_mem
            .slice()
            .get_slice(d.data.offset as usize, len)
            .and_then(|from| {
                dest_mem
                    .slice()
                    .get_slice(p.buf.offset as usize, len)
                    .map(|to| (from, to))
            });
        let Ok((from, to)) = copied else {
            // Both ranges were checked against the layouts; this cannot happen, but a failure
            // must not be silent.
            return Outcome::Failed(CompletionStatus::AddressOutOfRange);
        };
        from.copy_to_volatile_slice(to);
        rx.post.skip();
        let out = Message::DmaData(DmaData {
            peer: src.addr,
            flags: FLAG_COMPLETE,
            cookie: p.cookie,
            data: DataRef {
                offset: p.buf.offset,
                len: d.data.len,
            },
        });
        if let Err(e) = rx.rx.push(dest_mem, &out.encode()) {
            return Outcome::DestinationBroken(FaultReason::RxIndex, e);
        }
        *wrote = true;
        if let Err(e) = rx.post.release(dest_mem) {
            return Outcome::DestinationBroken(FaultReason::PostIndex, e);
        }
        return Outcome::Delivered {
            completion: Some(completion(
                d.peer,
                d.cookie,
                CompletionStatus::Ok,
                d.data.len,
            )),
            bytes: len as u64,
        };
    }
}

/// The next posted buffer, undecoded, without consuming it.
fn next_post(rx: &mut RxSide, mem: &ChannelMem<'_>) -> Result<Option<RawMessage>, RingError> {
    if rx.post.cached_available() == 0 {
        // Give consumed slots back before asking for more.
        rx.post.release(mem)?;
        if rx.post.available(mem)? == 0 {
            return Ok(None);
        }
    }
    rx.post.peek(mem)
}
