//! The application-facing channel API: one [`Channel`] per created channel, identical in
//! host-process and VM mode (only the [`Doorbell`] and [`Waiter`] behind it differ).
//!
//! Non-blocking post/test style (after BMI): `send_*` and `post_buffer` only queue into the rings;
//! [`Channel::flush`] publishes a batch and rings the doorbell at most once, and only if the
//! serving worker advertised that it sleeps; [`Channel::poll`] returns received messages and
//! completions in batches, each carrying the cookie the application chose.

use std::time::{Duration, Instant};

use svnic_channels::layout::header;
use svnic_channels::message::FLAG_WANT_COMPLETION;
use svnic_channels::{
    ChannelAddr, ChannelId, ChannelLayout, ChannelMem, Consumer, DataRef, DecodeError, DmaData,
    FaultReason, LayoutError, Message, PostBuffer, Producer, RingError, RingKind, SharedRegion,
    UserData,
};
use thiserror::Error;
use vm_memory::{Bytes, VolatileMemory};

/// How many ring slots ahead the client asks the CPU to load. Every slot's cache line goes back
/// and forth between the guest's core and the engine worker's, and loading lines this far ahead
/// overlaps those transfers instead of waiting for each one (the engine does the same). How much
/// it gains on a host whose cross-core latency varies is in docs/performance.md (History).
const PREFETCH_AHEAD: u32 = 8;

/// Something that tells the engine "this channel has new work" (a doorbell frame through the NIC,
/// or an eventfd in-process).
pub trait Doorbell: Send + Sync {
    /// Rings the doorbell for `channel_id`.
    fn ring(&self, channel_id: u32);
}

/// Something a sleeping client blocks on until the engine wakes it (or the timeout passes).
pub trait Waiter: Send + Sync {
    /// Blocks until woken or `timeout` passes.
    fn wait(&self, timeout: Duration);
}

/// Which outcomes of a user-data message the engine reports back as a completion (same
/// cookie). DMA-data is always completed: its buffer is the sender's until then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completions {
    /// Only a failed delivery (the usual case: a stream reads no completions until one fails).
    OnError,
    /// A successful delivery too (the message asks for it with `FLAG_WANT_COMPLETION`).
    Always,
}

/// Why the engine faulted a channel: the fault word of its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Fault {
    /// A reason of the ABI.
    #[error("{0}")]
    Reason(FaultReason),
    /// A code this client does not know (written by a newer engine, or by a broken one).
    #[error("fault code {0}")]
    UnknownCode(u32),
}

impl Fault {
    /// The fault a non-zero fault word stands for.
    pub fn from_code(code: u32) -> Self {
        FaultReason::from_code(code).map_or(Fault::UnknownCode(code), Fault::Reason)
    }
}

/// Errors of the channel API.
#[derive(Debug, Error)]
pub enum ChannelError {
    /// The channel memory does not hold a valid, initialised channel.
    #[error("channel memory invalid: {0}")]
    Layout(#[from] LayoutError),
    /// The engine wrote an impossible index (or memory failed): the channel is unusable.
    #[error("channel ring broken: {0}")]
    Ring(#[from] RingError),
    /// A message that does not fit the ABI (e.g. user-data over 40 bytes).
    #[error("invalid message: {0}")]
    Message(#[from] DecodeError),
    /// The engine faulted this channel.
    #[error("channel faulted by the engine: {0}")]
    Faulted(Fault),
    /// The channel header names another channel than the create answer did.
    #[error("the channel header names channel {header}, the create answer channel {answer}")]
    WrongChannel {
        /// The id in the channel header (written by the engine).
        header: u32,
        /// The id in the answer to the create request.
        answer: u32,
    },
    /// A buffer outside the channel's data area.
    #[error("buffer {offset:#x}+{len} is outside the data area {start:#x}..{end:#x}")]
    OutOfDataArea {
        /// Buffer offset.
        offset: u64,
        /// Buffer length.
        len: u64,
        /// Data area start.
        start: u64,
        /// Data area end.
        end: u64,
    },
}

/// Errors about a channel a client created, the same for the VM transport and the host-process
/// control client.
#[derive(Debug, Error)]
pub enum OwnedChannelError {
    /// The engine said Success but the channel memory is not a usable channel.
    #[error("the engine created {channel}, but it is not a usable channel: {source}; it is being destroyed")]
    Attach {
        /// The channel.
        channel: ChannelId,
        /// What attaching found.
        #[source]
        source: ChannelError,
    },
    /// The channel was not created by this client, or its destroy already began.
    #[error("{0} is not a live channel of this client")]
    Unknown(ChannelId),
}

/// How long [`Channel::wait_poll`] polls before it sleeps: `spins` busy polls, then `yields`
/// polls with a `sched_yield` between them, then it advertises sleeping and blocks. Polling
/// lowers latency and burns a CPU; zero for both sleeps at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    /// Busy polls before yielding.
    pub spins: u32,
    /// Yielding polls before sleeping.
    pub yields: u32,
}

impl Default for WaitPolicy {
    fn default() -> Self {
        WaitPolicy {
            spins: 200,
            yields: 200,
        }
    }
}

/// Client-side counters.
#[derive(Debug, Default, Clone, Copy)]
pub struct ClientStats {
    /// Messages queued on TX.
    pub sent: u64,
    /// Messages received (RX user-data and DMA-data).
    pub received: u64,
    /// Completions received.
    pub completions: u64,
    /// Doorbells rung.
    pub doorbells: u64,
    /// Times the client slept waiting for RX.
    pub sleeps: u64,
}

/// One channel, as an application sees it.
pub struct Channel {
    region: SharedRegion,
    layout: ChannelLayout,
    addr: ChannelAddr,
    id: u32,
    worker: u32,
    cpu: Option<u32>,
    tx: Producer,
    rx: Consumer,
    post: Producer,
    doorbell: std::sync::Arc<dyn Doorbell>,
    stats: ClientStats,
    wait_policy: WaitPolicy,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("id", &self.id)
            .field("addr", &self.addr)
            .field("worker", &self.worker)
            .finish()
    }
}

/// The channel view of `region`; borrows only the region so the ring ends can be borrowed mutably.
fn view(region: &SharedRegion, layout: ChannelLayout) -> ChannelMem<'_> {
    // The region was validated against this layout in attach; its length cannot change.
    match ChannelMem::new(region.slice(), layout) {
        Ok(m) => m,
        Err(_) => unreachable!("region length checked at attach"),
    }
}

impl Channel {
    /// Attaches to a channel region the engine has initialised (after the create request
    /// succeeded). `addr` is the channel's own address (its MAC and endpoint).
    pub fn attach(
        region: SharedRegion,
        addr: ChannelAddr,
        doorbell: std::sync::Arc<dyn Doorbell>,
    ) -> Result<Self, ChannelError> {
        let (layout, (id, worker, cpu)) = {
            let mem = ChannelMem::from_header(region.slice())?;
            (*mem.layout(), mem.served_by())
        };
        Ok(Channel {
            tx: Producer::new(RingKind::Tx, &layout),
            rx: Consumer::new(RingKind::Rx, &layout),
            post: Producer::new(RingKind::Post, &layout),
            region,
            layout,
            addr,
            id,
            worker,
            cpu,
            doorbell,
            stats: ClientStats::default(),
            wait_policy: WaitPolicy::default(),
        })
    }

    fn mem(&self) -> ChannelMem<'_> {
        view(&self.region, self.layout)
    }

    /// The engine's channel id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// This channel's own address (MAC, endpoint).
    pub fn addr(&self) -> ChannelAddr {
        self.addr
    }

    /// The engine worker serving this channel and the host CPU it runs on (if pinned): run the
    /// application next to it (Open-MX).
    pub fn served_by(&self) -> (u32, Option<u32>) {
        (self.worker, self.cpu)
    }

    /// The channel region (header, rings and data area) this client drives.
    pub fn region(&self) -> &SharedRegion {
        &self.region
    }

    /// The layout (ring size, data area).
    pub fn layout(&self) -> &ChannelLayout {
        &self.layout
    }

    /// Sets how long [`Channel::wait_poll`] polls before sleeping.
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.wait_policy = policy;
    }

    /// Counters.
    pub fn stats(&self) -> ClientStats {
        self.stats
    }

    /// The engine's fault, if it faulted this channel.
    pub fn fault(&self) -> Option<Fault> {
        self.mem().fault().map(Fault::from_code)
    }

    fn check_fault(&self) -> Result<(), ChannelError> {
        match self.fault() {
            Some(why) => Err(ChannelError::Faulted(why)),
            None => Ok(()),
        }
    }

    fn check_data(&self, buf: DataRef) -> Result<(), ChannelError> {
        if self.layout.data_range_ok(buf.offset, buf.len.into(), false) {
            Ok(())
        } else {
            Err(ChannelError::OutOfDataArea {
                offset: buf.offset,
                len: buf.len.into(),
                start: self.layout.data_offset,
                end: self.layout.region_len,
            })
        }
    }

    /// Free TX slots right now.
    pub fn tx_free(&mut self) -> Result<u32, ChannelError> {
        let mem = view(&self.region, self.layout);
        Ok(self.tx.free(&mem)?)
    }

    fn push_tx(&mut self, msg: Message) -> Result<bool, ChannelError> {
        let mem = view(&self.region, self.layout);
        if self.tx.cached_free() == 0 && self.tx.free(&mem)? == 0 {
            return Ok(false);
        }
        // Take the line of the slot a few messages on now, so that writing it later does not
        // wait for the engine's core to give it up.
        self.tx.prefetch(&mem, PREFETCH_AHEAD);
        let pushed = self.tx.push(&mem, &msg.encode())?;
        if pushed {
            self.stats.sent += 1;
        }
        Ok(pushed)
    }

    /// Queues user-data (at most 40 bytes) for `dest`. `Ok(false)`: TX ring full, try again after
    /// a flush/poll. A completion comes back as `completions` asks.
    pub fn send_user(
        &mut self,
        dest: ChannelAddr,
        cookie: u64,
        data: &[u8],
        completions: Completions,
    ) -> Result<bool, ChannelError> {
        let mut u = UserData::new(dest, cookie, data)?;
        if completions == Completions::Always {
            u.flags |= FLAG_WANT_COMPLETION;
        }
        self.push_tx(Message::UserData(u))
    }

    /// Queues DMA-data: `buf` (in this channel's data area) is copied by the engine into a buffer
    /// the destination posted. Do not modify `buf` before its completion (same cookie) arrives.
    pub fn send_dma(
        &mut self,
        dest: ChannelAddr,
        cookie: u64,
        buf: DataRef,
    ) -> Result<bool, ChannelError> {
        self.check_data(buf)?;
        self.push_tx(Message::DmaData(DmaData {
            peer: dest,
            flags: 0,
            cookie,
            data: buf,
        }))
    }

    /// Offers `buf` (in this channel's data area) for incoming DMA-data; `cookie` comes back in
    /// the RX message that fills it. `Ok(false)`: posted-buffer ring full.
    pub fn post_buffer(&mut self, cookie: u64, buf: DataRef) -> Result<bool, ChannelError> {
        self.check_data(buf)?;
        let mem = view(&self.region, self.layout);
        if self.post.cached_free() == 0 && self.post.free(&mem)? == 0 {
            return Ok(false);
        }
        Ok(self.post.push(
            &mem,
            &Message::PostBuffer(PostBuffer { cookie, buf }).encode(),
        )?)
    }

    /// Publishes everything queued and rings the doorbell once if the serving worker sleeps.
    pub fn flush(&mut self) -> Result<(), ChannelError> {
        let mem = view(&self.region, self.layout);
        let had_work = self.tx.unpublished() + self.post.unpublished() > 0;
        self.tx.publish(&mem)?;
        self.post.publish(&mem)?;
        if had_work && mem.peer_sleeping(header::ENGINE_SLEEPING) {
            self.stats.doorbells += 1;
            self.doorbell.ring(self.id);
        }
        Ok(())
    }

    /// Appends up to `max` received messages (user-data, DMA-data, completions) to `out`, in
    /// order, and gives their slots back. Returns how many were appended. A message the engine
    /// wrote that does not decode is a broken channel (the engine never writes one).
    pub fn poll(&mut self, out: &mut Vec<Message>, max: usize) -> Result<usize, ChannelError> {
        let mem = view(&self.region, self.layout);
        let avail = self.rx.available(&mem)? as usize;
        let n = avail.min(max);
        for _ in 0..n {
            // Start loading the slot a few messages on while these are decoded, whether or not
            // the engine has published it yet (when streaming, it usually has by the time we
            // read it).
            self.rx.prefetch(&mem, PREFETCH_AHEAD);
            let Some(raw) = self.rx.pop(&mem)? else { break };
            let msg = raw.decode()?;
            match msg {
                Message::Completion(_) => self.stats.completions += 1,
                _ => self.stats.received += 1,
            }
            out.push(msg);
        }
        self.rx.release(&mem)?;
        if n == 0 {
            self.check_fault()?;
        }
        Ok(n)
    }

    /// Waits until at least one message is received or `timeout` passes, then polls like
    /// [`Channel::poll`]. Adaptive: spins briefly, then yields, then advertises sleeping in the
    /// channel header, re-checks (so no wake is lost), and blocks on `waiter`.
    pub fn wait_poll(
        &mut self,
        out: &mut Vec<Message>,
        max: usize,
        timeout: Duration,
        waiter: &dyn Waiter,
    ) -> Result<usize, ChannelError> {
        let start = Instant::now();
        let mut idle = 0u32;
        loop {
            let n = self.poll(out, max)?;
            if n > 0 {
                return Ok(n);
            }
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                return Ok(0);
            }
            idle = idle.saturating_add(1);
            let policy = self.wait_policy;
            if idle <= policy.spins {
                std::hint::spin_loop();
                continue;
            }
            if idle <= policy.spins.saturating_add(policy.yields) {
                std::thread::yield_now();
                continue;
            }
            let mem = view(&self.region, self.layout);
            mem.set_sleeping(header::GUEST_SLEEPING, true);
            let pending = self.rx.available(&mem)?;
            if pending == 0 {
                self.stats.sleeps += 1;
                // Block for the whole remaining time: the engine wakes us when it publishes
                // into our RX ring while GUEST_SLEEPING is set, so no periodic re-poll is
                // needed (and none would hide a lost wake).
                waiter.wait(timeout - elapsed);
            }
            mem.set_sleeping(header::GUEST_SLEEPING, false);
        }
    }

    /// Writes `data` into the data area at `offset` (checked against the data area).
    pub fn write_data(&self, offset: u64, data: &[u8]) -> Result<(), ChannelError> {
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        self.check_data(DataRef { offset, len })?;
        let off = offset as usize;
        self.region
            .slice()
            .write_slice(data, off)
            .map_err(|_| ChannelError::OutOfDataArea {
                offset,
                len: len.into(),
                start: 0,
                end: 0,
            })
    }

    /// Reads `out.len()` bytes of the data area at `offset` (checked against the data area).
    pub fn read_data(&self, offset: u64, out: &mut [u8]) -> Result<(), ChannelError> {
        let len = u32::try_from(out.len()).unwrap_or(u32::MAX);
        self.check_data(DataRef { offset, len })?;
        let slice = self.region.slice();
        let sub = slice.get_slice(offset as usize, out.len()).map_err(|_| {
            ChannelError::OutOfDataArea {
                offset,
                len: len.into(),
                start: 0,
                end: 0,
            }
        })?;
        sub.copy_to(out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_word_reads_as_its_reason_or_its_unknown_code() {
        assert_eq!(Fault::from_code(1), Fault::Reason(FaultReason::TxIndex));
        assert_eq!(Fault::from_code(4), Fault::Reason(FaultReason::MemoryGone));
        assert_eq!(Fault::from_code(99), Fault::UnknownCode(99));
        assert_eq!(
            ChannelError::Faulted(Fault::from_code(1)).to_string(),
            "channel faulted by the engine: impossible TX producer index"
        );
        assert_eq!(
            ChannelError::Faulted(Fault::from_code(99)).to_string(),
            "channel faulted by the engine: fault code 99"
        );
    }
}
