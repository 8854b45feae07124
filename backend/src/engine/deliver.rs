//! Delivery of one message from a sender channel into a destination channel whose RX side the
//! caller has locked. Pure decisions plus the copy; no waiting, no locking, no completions
//! written for the sender (the caller batches those).
//!
//! - user-data: the 64 bytes are copied with the sender's address as peer and COMPLETE as flags
//!   (nothing else changes, so the message is not decoded and re-encoded) into the destination's
//!   RX ring;
//! - DMA-data: the data is copied once, from the sender's data area into the next buffer the
//!   destination posted, and only then is the RX message written with COMPLETE (the RX index is
//!   published later, after the copy, so the receiver can never see the message before the data).
//!
//! [`DestRun`] keeps a destination locked across consecutive messages to it and publishes its RX
//! ring once at the end of the run (and, for bulk DMA-data, every so many bytes on the way).
//! DMA-data longer than the per-pass byte budget is copied in pieces instead (`large_copy`).

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use svnic_channels::message::{FLAG_COMPLETE, FLAG_WANT_COMPLETION};
use svnic_channels::{
    ChannelAddr, ChannelMem, CompletionStatus, DataRef, DmaData, FaultReason, Message, PostBuffer,
    RawMessage, RingError,
};
use vm_memory::{VolatileMemory, VolatileMemoryError, VolatileSlice};

use super::channel::{completion, EngineChannel, RxSide};
use super::rx_lock::RxGuard;
use super::vector_copy;

/// How many RX slots ahead delivery of user-data fetches lines for writing.
const RX_PREFETCH_AHEAD: u32 = 8;

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
    /// Taken for a remote destination: its completion follows the peer's acknowledgement.
    Forwarded,
    /// Its remote destination's session is full: it waits at the head of the TX ring, without
    /// a deadline (the session's peer timeout bounds the wait).
    Held,
}

/// A TX message, validated, ready to deliver.
pub(crate) enum Tx<'m> {
    /// User-data, still in its ring form (see [`RawMessage::user_data_peer`]).
    User { raw: &'m RawMessage, flags: u8 },
    /// DMA-data whose source range lies in the sender's data area.
    Dma(DmaData),
}

/// Validates a message taken from `src`'s TX ring. Returns it with the peer it is addressed to,
/// or the status of its error completion (with the peer, when it could be read).
pub(crate) fn parse_tx<'m>(
    src: &EngineChannel,
    raw: &'m RawMessage,
) -> Result<(Tx<'m>, ChannelAddr), (CompletionStatus, ChannelAddr)> {
    if let Some((peer, flags)) = raw.user_data_peer() {
        return Ok((Tx::User { raw, flags }, peer));
    }
    // User-data is taken by the fast path above whenever it is valid; anything else that is
    // not valid DMA-data is refused.
    match raw.dma_data() {
        Some(d) => {
            if src
                .layout
                .data_range_ok(d.data.offset, d.data.len.into(), false)
            {
                Ok((Tx::Dma(d), d.peer))
            } else {
                Err((CompletionStatus::AddressOutOfRange, d.peer))
            }
        }
        None => Err((CompletionStatus::BadMessage, ChannelAddr::default())),
    }
}

impl DestRun<'_> {
    /// Delivers `tx` (from `src`, addressed to `peer`) into the locked destination; sets
    /// `wrote` when anything was written into its RX ring (it needs a publish) and counts what
    /// was delivered.
    pub fn deliver(
        &mut self,
        src: &EngineChannel,
        src_mem: &ChannelMem<'_>,
        tx: &Tx<'_>,
        peer: ChannelAddr,
    ) -> Outcome {
        let (dest, dest_mem, rx, wrote) = (self.dest, &self.mem, &mut *self.rx, &mut self.wrote);
        if let Err(outcome) = rx.accepts(dest, dest_mem) {
            return outcome;
        }
        match tx {
            Tx::User { raw, flags } => {
                // Take the line of the RX slot a few messages on from the receiver's core now, so
                // that writing it later does not wait (the client does the same on its side).
                rx.rx.prefetch(dest_mem, RX_PREFETCH_AHEAD);
                match rx
                    .rx
                    .push(dest_mem, &raw.with_peer_and_flags(src.addr, FLAG_COMPLETE))
                {
                    Ok(_) => *wrote = true,
                    Err(e) => return Outcome::DestinationBroken(FaultReason::RxIndex, e),
                }
                self.messages += 1;
                let completion = (flags & FLAG_WANT_COMPLETION != 0)
                    .then(|| completion(peer, raw.cookie(), CompletionStatus::Ok, 0));
                Outcome::Delivered {
                    completion,
                    bytes: 0,
                }
            }
            Tx::Dma(d) => {
                let outcome = deliver_dma(src, src_mem, d, dest, dest_mem, rx, wrote);
                if let Outcome::Delivered { bytes, .. } = &outcome {
                    self.messages += 1;
                    self.bytes += bytes;
                }
                outcome
            }
        }
    }
}

/// A destination locked for a run of consecutive messages to it: one lock, one publish, one
/// wake check per run instead of per message.
pub(crate) struct DestRun<'d> {
    pub dest: &'d Arc<EngineChannel>,
    pub(super) mem: ChannelMem<'d>,
    pub(super) rx: RxGuard<'d, RxSide>,
    /// Something was written into the RX ring since the last publish.
    pub(super) wrote: bool,
    /// Messages and DMA-data bytes delivered since the last publish (counted at the publish).
    pub(super) messages: u64,
    pub(super) bytes: u64,
}

impl<'d> DestRun<'d> {
    /// Locks `dest`'s RX side.
    pub fn open(dest: &'d Arc<EngineChannel>) -> Self {
        DestRun {
            dest,
            mem: dest.mem(),
            rx: dest.lock_rx(),
            wrote: false,
            messages: 0,
            bytes: 0,
        }
    }

    /// True if this run is for `dest`.
    pub fn is(&self, dest: &Arc<EngineChannel>) -> bool {
        Arc::ptr_eq(self.dest, dest)
    }

    /// DMA-data bytes copied in this run so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Publishes what the run wrote so far without unlocking (bulk DMA-data, so that the
    /// receiver sees each copy while the next one runs), and adds the destination to `wakes`.
    /// False if the RX index is broken: the caller then ends the run with [`DestRun::finish`],
    /// which faults the destination.
    pub fn publish(&mut self, wakes: &mut PendingWakes<'d>) -> bool {
        match self.publish_written() {
            Ok(published) => {
                if published {
                    wakes.add(self.dest);
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Publishes what the run wrote (if the channel is still open), unlocks, and adds the
    /// destination to `wakes`. A broken RX index faults the destination.
    pub fn finish(mut self, wakes: &mut PendingWakes<'d>) {
        let result = self.publish_written();
        let dest = self.dest;
        // Unlock before the wake check or the fault (which takes the lock).
        drop(self);
        match result {
            Ok(true) => wakes.add(dest),
            Ok(false) => {}
            Err(e) => dest.fault(FaultReason::RxIndex, &e),
        }
    }

    /// Counts and publishes what the run wrote since its last publish; true if it published
    /// anything. On an error the messages stay unpublished (counted once), so that
    /// [`DestRun::finish`] meets the error again and faults the destination.
    fn publish_written(&mut self) -> Result<bool, RingError> {
        if !self.wrote {
            return Ok(false);
        }
        self.dest.counters.add_rx(
            std::mem::take(&mut self.messages),
            std::mem::take(&mut self.bytes),
        );
        if !self.rx.open {
            return Ok(false);
        }
        // The receiver re-posts and the sender re-sends as soon as they see this: have their
        // lines on the way while the publish waits for the cache.
        self.rx.post.prefetch_incoming(&self.mem);
        self.rx.rx.publish(&self.mem)?;
        self.wrote = false;
        Ok(true)
    }
}

/// Channels published to during a pass whose guests may sleep: each one's flag is checked once
/// at the end of the pass rather than after every publish, all after a single SeqCst fence (see
/// [`svnic_channels::ChannelMem::peer_sleeping`]), so that a pass of many small runs, or of bulk
/// DMA-data published per copy, does not stall on a fence each time. A wake is at most one pass
/// late, and a guest only sleeps after it has been idle for a while.
pub(crate) struct PendingWakes<'d> {
    list: [Option<&'d EngineChannel>; 4],
}

impl<'d> PendingWakes<'d> {
    pub fn new() -> Self {
        PendingWakes { list: [None; 4] }
    }

    /// Notes that `ch`'s guest is due a wake check (at once if the list is full).
    pub fn add(&mut self, ch: &'d EngineChannel) {
        for slot in &mut self.list {
            match slot {
                Some(d) if std::ptr::eq(*d, ch) => return,
                Some(_) => {}
                None => {
                    *slot = Some(ch);
                    return;
                }
            }
        }
        ch.wake_if_sleeping(&ch.mem());
    }

    /// Makes the checks: one fence, then each channel's flag.
    pub fn flush(&mut self) {
        if self.list[0].is_none() {
            return;
        }
        // SeqCst: the publishes above are ordered before the flag loads below (the guest sets
        // its flag, fences, then re-reads our index: one of the two sides sees the other).
        fence(Ordering::SeqCst);
        for ch in self.list.iter_mut().filter_map(Option::take) {
            ch.wake_if_flagged(&ch.mem());
        }
    }
}

/// The status of a message for a destination whose RX side is closed.
pub(super) fn closed_status(dest: &EngineChannel) -> CompletionStatus {
    if matches!(dest.run_state(), super::channel::RunState::Faulted) {
        CompletionStatus::DestinationFaulted
    } else {
        CompletionStatus::DestinationGone
    }
}

impl RxSide {
    /// The checks of a delivery into this (locked) RX side of `dest` before anything is
    /// written: the channel is open and its RX ring has room. Otherwise the outcome for the
    /// message.
    #[inline]
    pub(super) fn accepts(
        &mut self,
        dest: &EngineChannel,
        dest_mem: &ChannelMem<'_>,
    ) -> Result<(), Outcome> {
        if !self.open {
            return Err(Outcome::Failed(closed_status(dest)));
        }
        match rx_room(self, dest_mem) {
            Ok(true) => Ok(()),
            Ok(false) => Err(Outcome::Blocked(CompletionStatus::RingFull)),
            Err(e) => Err(Outcome::DestinationBroken(FaultReason::RxIndex, e)),
        }
    }

    /// Reserves `dest`'s next posted buffer for a message of `len` bytes placed in pieces,
    /// after the checks of a whole delivery ([`RxSide::accepts`]): the buffer stays at the head
    /// of the post ring, and no other message takes a buffer, until the reservation is given
    /// back. Otherwise the outcome for the message.
    pub(super) fn reserve_post(
        &mut self,
        dest: &EngineChannel,
        dest_mem: &ChannelMem<'_>,
        wrote: &mut bool,
        len: u32,
    ) -> Result<PostBuffer, Outcome> {
        self.accepts(dest, dest_mem)?;
        let buf = next_usable_post(dest, dest_mem, self, wrote, len)?;
        self.post_reserved = true;
        Ok(buf)
    }
}

/// True if the RX ring has a free slot (re-reading the guest's consumer index only when the
/// cached view says full).
pub(super) fn rx_room(rx: &mut RxSide, mem: &ChannelMem<'_>) -> Result<bool, RingError> {
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
    let p = match next_usable_post(dest, dest_mem, rx, wrote, d.data.len) {
        Ok(p) => p,
        Err(outcome) => return outcome,
    };
    // While the copy runs, the cache can bring in the next posted buffer, and take from the
    // receiver's core the RX slot this message is written to after the copy.
    rx.post.prefetch(dest_mem, 1);
    rx.rx.prefetch(dest_mem, 0);
    if !copy_range(src_mem, d.data.offset, dest_mem, p.buf.offset, d.data.len) {
        return Outcome::Failed(CompletionStatus::AddressOutOfRange);
    }
    write_dma_rx(src, d, &p, dest_mem, rx, wrote)
}

/// The destination's next posted buffer, if it can take `len` bytes; it stays at the head of
/// the post ring. Refused posted buffers before it are consumed and reported to their owner.
/// Otherwise the outcome for the message: it waits while there is no buffer, or while the head
/// buffer is reserved for a message being copied in pieces (buffers are used in post order).
#[inline]
pub(super) fn next_usable_post(
    dest: &EngineChannel,
    dest_mem: &ChannelMem<'_>,
    rx: &mut RxSide,
    wrote: &mut bool,
    len: u32,
) -> Result<PostBuffer, Outcome> {
    if rx.post_reserved {
        return Err(Outcome::Blocked(CompletionStatus::NoBuffer));
    }
    loop {
        let post = match next_post(rx, dest_mem) {
            Ok(Some(p)) => p,
            Ok(None) => return Err(Outcome::Blocked(CompletionStatus::NoBuffer)),
            Err(e) => return Err(Outcome::DestinationBroken(FaultReason::PostIndex, e)),
        };
        let usable = post.post_buffer().filter(|p| {
            dest.layout
                .data_range_ok(p.buf.offset, p.buf.len.into(), false)
        });
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
                Ok(false) => {
                    rx.backlog.push_back(c);
                    dest.note_backlog(rx);
                }
                Err(e) => return Err(Outcome::DestinationBroken(FaultReason::RxIndex, e)),
            }
            match rx_room(rx, dest_mem) {
                Ok(true) => continue,
                Ok(false) => return Err(Outcome::Blocked(CompletionStatus::RingFull)),
                Err(e) => return Err(Outcome::DestinationBroken(FaultReason::RxIndex, e)),
            }
        };
        if p.buf.len < len {
            // The buffer stays posted: a later, smaller message may fit it.
            return Err(Outcome::Failed(CompletionStatus::BufferTooSmall));
        }
        return Ok(p);
    }
}

/// Consumes the posted buffer `p` (the head of the post ring), now holding the data of `d`, and
/// writes the RX message for it (not published yet): the last step of a DMA-data delivery. The
/// caller has checked that the RX ring has room.
#[inline]
pub(super) fn write_dma_rx(
    src: &EngineChannel,
    d: &DmaData,
    p: &PostBuffer,
    dest_mem: &ChannelMem<'_>,
    rx: &mut RxSide,
    wrote: &mut bool,
) -> Outcome {
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
    Outcome::Delivered {
        completion: Some(completion(
            d.peer,
            d.cookie,
            CompletionStatus::Ok,
            d.data.len,
        )),
        bytes: u64::from(d.data.len),
    }
}

/// Copies `len` bytes at `from` in the sender's region to `to` in the destination's. False if
/// either range leaves its region, which cannot happen (the caller checked both against the
/// layouts), but a failure must not be silent.
#[inline]
pub(super) fn copy_range(
    src_mem: &ChannelMem<'_>,
    from: u64,
    dest_mem: &ChannelMem<'_>,
    to: u64,
    len: u32,
) -> bool {
    let (Ok(from), Ok(to), Ok(len)) = (
        usize::try_from(from),
        usize::try_from(to),
        usize::try_from(len),
    ) else {
        return false;
    };
    let slices = src_mem
        .slice()
        .get_slice(from, len)
        .and_then(|from| dest_mem.slice().get_slice(to, len).map(|to| (from, to)));
    let Ok((from, to)) = slices else {
        return false;
    };
    #[cfg(feature = "dma-timing")]
    let started = super::dma_timing::now();
    // `from` and `to` have the same length, so no piece of the copy can be out of range.
    let copied = copy_data(&from, &to);
    #[cfg(feature = "dma-timing")]
    super::dma_timing::record_copy(started, super::dma_timing::now());
    copied.is_ok()
}

/// Largest piece [`copy_data`] hands to `memcpy` when it splits a copy: below the size from
/// which glibc copies with `rep movsb` (2112 bytes on CPUs with FSRM, more without).
const SPLIT_PIECE: usize = 2048;

/// Copies `from` into `to` (the same length; the DMA-data copy).
///
/// Copies of more than [`SPLIT_PIECE`] bytes between ranges that do not overlap go through
/// [`vector_copy`] where the CPU has AVX2: `rep movsb` is also slow at some page placements (see
/// that module). Otherwise:
///
/// `memcpy` through `rep movsb` (glibc on x86-64 CPUs with ERMS/FSRM, such as AMD EPYC) is an
/// order of magnitude slower when the destination lies 1 to 63 bytes after the source modulo
/// 4 KiB (figures in docs/performance.md, History). Both offsets are chosen by guests, so
/// without this a sender could make its copies, and the worker that serves every channel, that
/// much slower. In that case the copy is made in pieces of at most [`SPLIT_PIECE`] bytes, which
/// glibc copies with vector loads and stores. Any other distance takes the single `memcpy`.
fn copy_data(from: &VolatileSlice<'_>, to: &VolatileSlice<'_>) -> Result<(), VolatileMemoryError> {
    let (from_guard, to_guard) = (from.ptr_guard(), to.ptr_guard_mut());
    let src = from_guard.as_ptr() as usize;
    let dst = to_guard.as_ptr() as usize;
    let len = from.len().min(to.len());
    // Disjoint unless one starts inside the other (a channel may send from its own data area
    // into a buffer it posted itself: memmove semantics then, through the paths below).
    let disjoint = src.abs_diff(dst) >= len;
    if len > SPLIT_PIECE && disjoint {
        // SAFETY: `from` and `to` are bounds-checked slices of mapped guest memory of at least
        // `len` bytes, kept mapped while their guards live (to the end of this function); the
        // ranges do not overlap (checked above).
        let copied = unsafe { vector_copy::copy(src as *const u8, dst as *mut u8, len) };
        if copied {
            return Ok(());
        }
    }
    let distance = dst.wrapping_sub(src) % 4096;
    if !(1..64).contains(&distance) || len <= SPLIT_PIECE {
        from.copy_to_volatile_slice(*to);
        return Ok(());
    }
    let mut off = 0;
    while off < len {
        let n = (len - off).min(SPLIT_PIECE);
        from.get_slice(off, n)?
            .copy_to_volatile_slice(to.get_slice(off, n)?);
        off += n;
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

    #[test]
    fn copy_data_between_overlapping_ranges_is_a_memmove() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let pattern: Vec<u8> = (0..70_000u32).map(|i| (i * 13 + i / 97) as u8).collect();
        let len = 65_536usize;
        // Destination after the source and before it, by less than the length.
        for (src, dst) in [(4096usize, 4096 + 1000), (8192 + 3000, 8192)] {
            mem.write_slice(&pattern[..len], GuestAddress(src as u64))
                .unwrap();
            let from = mem.get_slice(GuestAddress(src as u64), len).unwrap();
            let to = mem.get_slice(GuestAddress(dst as u64), len).unwrap();
            copy_data(&from, &to).unwrap();
            let mut out = vec![0u8; len];
            mem.read_slice(&mut out, GuestAddress(dst as u64)).unwrap();
            assert!(out == pattern[..len], "src {src}, dst {dst}");
        }
    }

    #[test]
    fn copy_data_is_exact_at_every_distance_and_length() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let pattern: Vec<u8> = (0..70_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        for distance in [0usize, 1, 16, 31, 32, 63, 64, 2048] {
            for len in [1usize, 63, 2048, 2049, 4096, 5000, 65_536, 70_000] {
                let (src, dst) = (4096 * 3, 4096 * 40 + distance);
                mem.write_slice(&pattern[..len], GuestAddress(src as u64))
                    .unwrap();
                mem.write_slice(&vec![0xee; len + 64], GuestAddress(dst as u64))
                    .unwrap();
                let from = mem.get_slice(GuestAddress(src as u64), len).unwrap();
                let to = mem.get_slice(GuestAddress(dst as u64), len).unwrap();
                copy_data(&from, &to).unwrap();
                let mut out = vec![0u8; len + 64];
                mem.read_slice(&mut out, GuestAddress(dst as u64)).unwrap();
                assert!(
                    out[..len] == pattern[..len],
                    "distance {distance}, len {len}"
                );
                assert!(out[len..].iter().all(|b| *b == 0xee), "wrote past the end");
            }
        }
    }
}
