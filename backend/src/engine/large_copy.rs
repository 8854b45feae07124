//! DMA-data messages longer than the per-pass byte budget (`EngineConfig::byte_budget`), copied
//! one piece per pass so that the worker serves its other channels between pieces.
//!
//! The rules, and why they are enough:
//! - **The message stays at the head of its sender's TX ring** (it is not taken) until its RX
//!   message is written: the sender's later messages wait behind it, so order is kept; and a
//!   sender that goes away first (destroyed, faulted) had nothing taken, so nothing is owed to
//!   it and its counters balance as they are.
//! - **The destination's next posted buffer is reserved**: it stays at the head of the post ring
//!   and is consumed only with the RX message. While it is reserved, every other DMA-data message
//!   to that destination waits as for a missing buffer (backpressure, then `NoBuffer`): buffers
//!   are filled in post order (docs/abi.md §5), so a later message may not take the next one, and
//!   the destination's DMA-data RX messages stay in buffer order. User-data and completions still
//!   go through: their order relative to another sender's DMA-data is not defined anyway (they
//!   come from other TX rings), so no RX slot needs reserving; the RX message takes the next slot
//!   free when the copy ends, and waits for one (backpressure, then `RingFull`) if there is none.
//! - **The RX message is written and published only after the last piece**, under the lock held
//!   for that piece: a receiver never sees it before all its data is in place.
//! - **Every piece is copied under the destination's RX lock, after checking `open`**: nothing is
//!   written into a closed channel. A destination closed mid-message (destroyed, faulted, memory
//!   gone) fails the message as any delivery would (`DestinationGone`, `DestinationFaulted`); its
//!   reserved buffer stays posted, holding part of the data, which it never got an RX message for.
//! - A job dropped before its end (its sender detached or faulted, the worker stopping) gives the
//!   reservation back when dropped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use svnic_channels::{ChannelMem, CompletionStatus, DmaData, FaultReason, PostBuffer, RawMessage};

use super::channel::{completion, EngineChannel, RxSide};
use super::counters::TxTally;
use super::deliver::{
    closed_status, copy_range, rx_room, write_dma_rx, DestRun, Outcome, PendingWakes,
};

/// A DMA-data message being copied in pieces, held by the worker that serves its sender.
///
/// Never dropped by a thread holding its destination's RX lock (dropping it may take that lock
/// to give the reservation back).
pub(crate) struct LargeCopy {
    /// The destination (kept alive here; its `open` flag says whether it may still be written).
    dest: Arc<EngineChannel>,
    progress: Progress,
}

/// Where a [`LargeCopy`] stands.
struct Progress {
    /// The sender's message as validated when it began (its TX slot is not read again).
    msg: DmaData,
    /// The destination's posted buffer it is copied into, at the head of its post ring.
    buf: PostBuffer,
    /// Bytes copied so far.
    copied: u32,
    /// Whether this job still holds the reservation of `buf`.
    reserved: bool,
}

/// What one step of a [`LargeCopy`] came to.
#[derive(Debug)]
enum LargeStep {
    /// A piece was copied; more remain.
    Copied,
    /// Every byte is in place; the destination's RX ring has no room for the message yet.
    WaitingForRoom,
    /// The message is over: delivered, or failed (the reservation is given back either way).
    Done(Outcome),
}

impl Progress {
    /// Copies the next piece of at most `piece` bytes; the bytes copied, or None if a range left
    /// its region (cannot happen: both were checked against the layouts).
    fn copy_piece(
        &mut self,
        src_mem: &ChannelMem<'_>,
        dest_mem: &ChannelMem<'_>,
        piece: u32,
    ) -> Option<u64> {
        let n = piece.min(self.msg.data.len.checked_sub(self.copied)?);
        let from = self.msg.data.offset.checked_add(u64::from(self.copied))?;
        let to = self.buf.buf.offset.checked_add(u64::from(self.copied))?;
        if !copy_range(src_mem, from, dest_mem, to, n) {
            return None;
        }
        self.copied = self.copied.checked_add(n)?;
        Some(u64::from(n))
    }

    /// Gives the reservation back (`rx`: the destination's RX side, locked by the caller).
    fn release(&mut self, rx: &mut RxSide) {
        if self.reserved {
            rx.post_reserved = false;
            self.reserved = false;
        }
    }

    fn done(&mut self, rx: &mut RxSide, outcome: Outcome) -> LargeStep {
        self.release(rx);
        LargeStep::Done(outcome)
    }
}

impl Drop for LargeCopy {
    fn drop(&mut self) {
        if self.progress.reserved {
            let mut rx = self.dest.lock_rx();
            self.progress.release(&mut rx);
        }
    }
}

impl DestRun<'_> {
    /// Begins delivering `d` (longer than `piece`, from `src_mem`) into this run's destination:
    /// the checks of a whole delivery (open, RX room, a posted buffer large enough), then the
    /// posted buffer is reserved and the first `piece` bytes copied. Otherwise the outcome for
    /// the message, as a whole delivery would give it.
    pub fn begin_large(
        &mut self,
        d: &DmaData,
        src_mem: &ChannelMem<'_>,
        piece: u32,
    ) -> Result<LargeCopy, Outcome> {
        let rx = &mut *self.rx;
        let buf = rx.reserve_post(self.dest, &self.mem, &mut self.wrote, d.data.len)?;
        let mut progress = Progress {
            msg: *d,
            buf,
            copied: 0,
            reserved: true,
        };
        if progress.copy_piece(src_mem, &self.mem, piece).is_none() {
            progress.release(rx);
            return Err(Outcome::Failed(CompletionStatus::AddressOutOfRange));
        }
        Ok(LargeCopy {
            dest: Arc::clone(self.dest),
            progress,
        })
    }

    /// The next step of `job`, whose destination is this run's: its next piece of at most
    /// `piece` bytes, and after the last one its RX message (published by the run). `give_up`:
    /// the message has already waited the whole backpressure wait for RX room. Also returns the
    /// bytes copied.
    fn continue_large(
        &mut self,
        job: &mut Progress,
        src: &EngineChannel,
        src_mem: &ChannelMem<'_>,
        piece: u32,
        give_up: bool,
    ) -> (LargeStep, u64) {
        let rx = &mut *self.rx;
        if !rx.open {
            return (job.done(rx, Outcome::Failed(closed_status(self.dest))), 0);
        }
        let mut copied = 0;
        if job.copied < job.msg.data.len {
            let Some(n) = job.copy_piece(src_mem, &self.mem, piece) else {
                let failed = Outcome::Failed(CompletionStatus::AddressOutOfRange);
                return (job.done(rx, failed), 0);
            };
            copied = n;
            if job.copied < job.msg.data.len {
                return (LargeStep::Copied, copied);
            }
        }
        match rx_room(rx, &self.mem) {
            Ok(true) => {}
            Ok(false) if give_up => {
                let failed = Outcome::Failed(CompletionStatus::RingFull);
                return (job.done(rx, failed), copied);
            }
            Ok(false) => return (LargeStep::WaitingForRoom, copied),
            Err(e) => {
                let broken = Outcome::DestinationBroken(FaultReason::RxIndex, e);
                return (job.done(rx, broken), copied);
            }
        }
        // The reserved buffer is still the head of the post ring: nothing else consumed it.
        job.release(rx);
        let outcome = write_dma_rx(src, &job.msg, &job.buf, &self.mem, rx, &mut self.wrote);
        if let Outcome::Delivered { bytes, .. } = &outcome {
            self.messages += 1;
            self.bytes += bytes;
        }
        (LargeStep::Done(outcome), copied)
    }
}

/// What the serving worker does next with a channel after a [`step`] of its large message.
pub(crate) enum Next {
    /// The message is still at the head of the TX ring: the channel's share of this pass is
    /// over. `blocked`: it waits for RX room; `busy`: a piece was copied.
    ShareOver { blocked: bool, busy: bool },
    /// The message is over (counted in the tally, its completion queued): the caller takes it
    /// from the TX ring and goes on with the channel's next messages. `bytes`: copied just now;
    /// `faulted`: its destination's rings were broken, and it was faulted.
    Taken { bytes: u64, faulted: bool },
}

/// One step of the large message `slot` holds (the head of `src`'s TX ring): its next piece of
/// at most `piece` bytes, or its RX message. Its destination is locked, published and
/// wake-checked apart from the worker's runs. Once the message is over, `slot` is emptied, the
/// message counted in `tally` and its completion pushed onto `completions`; a destination whose
/// rings turned out broken is faulted. `held_since`: since when the message waits for RX room;
/// it fails with `RingFull` once that has lasted `wait`.
pub(crate) fn step(
    slot: &mut Option<LargeCopy>,
    src: &EngineChannel,
    src_mem: &ChannelMem<'_>,
    (piece, wait): (u32, Duration),
    held_since: &mut Option<Instant>,
    tally: &mut TxTally,
    completions: &mut Vec<RawMessage>,
) -> Next {
    let Some(job) = slot.as_mut() else {
        return Next::Taken {
            bytes: 0,
            faulted: false,
        };
    };
    let give_up = held_since.is_some_and(|since| since.elapsed() >= wait);
    let (step, bytes) = {
        let mut run = DestRun::open(&job.dest);
        let step = run.continue_large(&mut job.progress, src, src_mem, piece, give_up);
        let mut published = PendingWakes::new();
        run.finish(&mut published);
        published.flush();
        step
    };
    let mut faulted = false;
    let failed = match step {
        LargeStep::Copied => {
            return Next::ShareOver {
                blocked: false,
                busy: true,
            }
        }
        LargeStep::WaitingForRoom => {
            held_since.get_or_insert_with(|| {
                tally.holds += 1;
                Instant::now()
            });
            return Next::ShareOver {
                blocked: true,
                busy: bytes > 0,
            };
        }
        LargeStep::Done(Outcome::Delivered { completion, .. }) => {
            tally.delivered();
            completions.extend(completion);
            None
        }
        LargeStep::Done(Outcome::Failed(status) | Outcome::Blocked(status)) => Some(status),
        LargeStep::Done(Outcome::DestinationBroken(reason, err)) => {
            faulted = true;
            job.dest.fault(reason, &err);
            Some(CompletionStatus::DestinationFaulted)
        }
        // A local copy is never forwarded nor held by a session.
        LargeStep::Done(Outcome::Forwarded | Outcome::Held) => None,
    };
    if let Some(status) = failed {
        let msg = job.progress.msg;
        tally.error(status);
        completions.push(completion(msg.peer, msg.cookie, status, 0));
    }
    *slot = None;
    *held_since = None;
    Next::Taken { bytes, faulted }
}
