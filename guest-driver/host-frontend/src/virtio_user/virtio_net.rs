//! [`VirtioNet`]: a virtio-net driver over a vhost-user backend, for a host process that is its
//! own "guest" (virtio-user). One RX and one TX queue, the 12-byte virtio 1.x header, MRG_RXBUF
//! reassembly, EVENT_IDX notification suppression both ways.
//!
//! Buffers: every descriptor owns one fixed [`BUFFER_SIZE`]-byte buffer in the memfd memory
//! (descriptor `i` of a queue always points at buffer `i` of that queue). A transmitted frame is
//! copied into one buffer behind its header (one device-readable descriptor; virtio 1.x devices
//! must not assume any framing, 2.7.4 "Message Framing"). Every RX buffer is one device-writable
//! descriptor; a frame larger than one buffer needs MRG_RXBUF.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use log::info;
use svnic_channels::MacAddr;
use vhost::vhost_user::Frontend;
use virtio_bindings::virtio_net::VIRTIO_NET_F_MRG_RXBUF;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use vm_memory::{Bytes, GuestAddress};

use super::error::{NetDeviceError, VirtioUserError};
use super::memory::MemfdMemory;
use super::net_header::{num_buffers, NET_HDR_LEN, TX_HEADER};
use super::notifier::{CallWaiter, QueueEventFds, WaitOutcome, RX_QUEUE, TX_QUEUE};
use super::split_ring::{RingLayout, SplitRing};
use super::vhost_setup::{self, Negotiated};

/// Bytes per packet buffer (header included): holds a 1514-byte frame (plus a VLAN tag) behind
/// the 12-byte header, more than the 1526 bytes virtio-net asks for without MRG_RXBUF (5.1.6.3.1).
pub const BUFFER_SIZE: u32 = 2048;
/// Default queue size.
pub const DEFAULT_QUEUE_SIZE: u16 = 256;
/// Largest frame [`VirtioNet::send_frame`] accepts.
pub const MAX_TX_FRAME: usize = BUFFER_SIZE as usize - NET_HDR_LEN;

/// Counters of a [`VirtioNet`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Frames queued for transmission.
    pub tx_frames: u64,
    /// Times `send_frame` found the TX ring full.
    pub tx_ring_full: u64,
    /// Frames received.
    pub rx_frames: u64,
    /// Received frames that spanned more than one buffer (MRG_RXBUF).
    pub rx_merged: u64,
    /// Kicks written (both queues).
    pub kicks: u64,
}

/// A frame being reassembled from several RX buffers.
#[derive(Debug)]
struct PartialFrame {
    data: Vec<u8>,
    remaining: u16,
}

/// A virtio-net device driven from this process. Single-threaded (`&mut self`); share it behind a
/// mutex (as the control client does) and block with a [`CallWaiter`] outside the lock.
pub struct VirtioNet {
    memory: Arc<MemfdMemory>,
    /// The vhost-user connection; dropping it tells the backend the device is gone.
    frontend: Option<Frontend>,
    negotiated: Negotiated,
    rx: SplitRing,
    tx: SplitRing,
    rx_buffers: u64,
    tx_buffers: u64,
    fds: QueueEventFds,
    waiter: CallWaiter,
    partial: Option<PartialFrame>,
    tx_wants_space: bool,
    failed: Option<NetDeviceError>,
    stats: NetStats,
}

impl std::fmt::Debug for VirtioNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtioNet")
            .field("mac", &self.negotiated.mac)
            .field("features", &format_args!("{:#x}", self.negotiated.features))
            .field("connected", &self.frontend.is_some())
            .field("rx", &self.rx)
            .field("tx", &self.tx)
            .field("failed", &self.failed)
            .field("stats", &self.stats)
            .finish()
    }
}

/// Guest-physical addresses of everything one queue needs, allocated in the memfd memory.
fn alloc_queue(memory: &MemfdMemory, size: u16) -> Result<(RingLayout, u64), VirtioUserError> {
    let page = 4096;
    let desc = memory.alloc(RingLayout::desc_bytes(size), page)?;
    let avail = memory.alloc(RingLayout::avail_bytes(size), page)?;
    let used = memory.alloc(RingLayout::used_bytes(size), page)?;
    let buffers = memory.alloc(u64::from(size) * u64::from(BUFFER_SIZE), page)?;
    Ok((
        RingLayout {
            size,
            desc,
            avail,
            used,
        },
        buffers,
    ))
}

impl VirtioNet {
    /// Connects to the vhost-user backend listening on `socket_path` and brings the device up:
    /// negotiation, memory table (the memfd of `memory`), both queues with `queue_size`
    /// descriptors (a power of two in 2..=32768; the backend must accept it), RX buffers posted.
    pub fn connect(
        socket_path: impl AsRef<Path>,
        memory: Arc<MemfdMemory>,
        queue_size: u16,
    ) -> Result<Self, VirtioUserError> {
        let path = socket_path.as_ref();
        let mut fe = vhost_setup::connect(path)?;
        let negotiated = vhost_setup::negotiate(&mut fe)?;
        let fds = QueueEventFds::new()?;
        let waiter = CallWaiter::new(&fds, Some(std::os::fd::AsRawFd::as_raw_fd(&fe)))?;
        let mut net = Self::assemble(memory, negotiated, queue_size, fds, waiter)?;
        vhost_setup::start_queues(
            &mut fe,
            &net.memory,
            net.rx.layout(),
            net.tx.layout(),
            &net.fds,
        )?;
        net.frontend = Some(fe);
        // The RX buffers were published before the queues started; tell the device now.
        net.fds.kick(RX_QUEUE)?;
        net.stats.kicks += 1;
        info!(
            "virtio-user: connected to {} as {}, features {:#x}, {} descriptors per queue",
            path.display(),
            net.negotiated.mac,
            net.negotiated.features,
            queue_size
        );
        Ok(net)
    }

    /// Builds the driver over already negotiated features: rings and buffers in `memory`, every
    /// RX buffer made available (published, not kicked). The caller starts the device.
    pub(crate) fn assemble(
        memory: Arc<MemfdMemory>,
        negotiated: Negotiated,
        queue_size: u16,
        fds: QueueEventFds,
        waiter: CallWaiter,
    ) -> Result<Self, VirtioUserError> {
        if queue_size < 2 || !queue_size.is_power_of_two() {
            return Err(VirtioUserError::BadQueueSize(queue_size));
        }
        let event_idx = negotiated.has(VIRTIO_RING_F_EVENT_IDX);
        let (rx_layout, rx_buffers) = alloc_queue(&memory, queue_size)?;
        let (tx_layout, tx_buffers) = alloc_queue(&memory, queue_size)?;
        let mem = memory.guest_memory().clone();
        let rx = SplitRing::new("RX", mem.clone(), rx_layout, event_idx)?;
        let tx = SplitRing::new("TX", mem, tx_layout, event_idx)?;
        let mut net = VirtioNet {
            memory,
            frontend: None,
            negotiated,
            rx,
            tx,
            rx_buffers,
            tx_buffers,
            fds,
            waiter,
            partial: None,
            tx_wants_space: false,
            failed: None,
            stats: NetStats::default(),
        };
        while let Some(id) = net.rx.claim() {
            let addr = net.rx_buffer(id);
            net.rx.push(id, addr, BUFFER_SIZE, true)?;
        }
        net.rx.publish()?;
        // The kick for these goes out when the device is started (connect); record that the
        // device has been told about them.
        net.rx.kick_needed()?;
        // No TX completion notifications until the TX ring fills up (see send_frame).
        net.tx.disable_used_notification()?;
        Ok(net)
    }

    /// The RX and TX ring layouts (for the test device).
    #[cfg(test)]
    pub(crate) fn ring_layouts(&self) -> (RingLayout, RingLayout) {
        (self.rx.layout(), self.tx.layout())
    }

    fn rx_buffer(&self, id: u16) -> u64 {
        self.rx_buffers + u64::from(id) * u64::from(BUFFER_SIZE)
    }

    fn tx_buffer(&self, id: u16) -> u64 {
        self.tx_buffers + u64::from(id) * u64::from(BUFFER_SIZE)
    }

    /// The device's MAC address (from its config space).
    pub fn mac(&self) -> MacAddr {
        self.negotiated.mac
    }

    /// The negotiated virtio features.
    pub fn features(&self) -> u64 {
        self.negotiated.features
    }

    /// The link state, if the device reports one (VIRTIO_NET_F_STATUS), as read at connect.
    pub fn link_up(&self) -> Option<bool> {
        self.negotiated.link_up
    }

    /// The guest memory the rings, buffers and channel regions live in.
    pub fn memory(&self) -> &Arc<MemfdMemory> {
        &self.memory
    }

    /// Counters.
    pub fn stats(&self) -> NetStats {
        self.stats
    }

    /// A handle to block on the call eventfds without holding `self` (see [`CallWaiter`]).
    pub fn call_waiter(&self) -> CallWaiter {
        self.waiter.clone()
    }

    fn check(&self) -> Result<(), VirtioUserError> {
        match &self.failed {
            Some(e) => Err(e.clone().into()),
            None => Ok(()),
        }
    }

    fn fail<T>(&mut self, e: NetDeviceError) -> Result<T, VirtioUserError> {
        self.failed = Some(e.clone());
        Err(e.into())
    }

    /// Takes back every transmit buffer the device has finished with.
    fn reclaim_tx(&mut self) -> Result<(), VirtioUserError> {
        while let Some(done) = self.tx.pop_used()? {
            self.tx.unclaim(done.id)?;
        }
        Ok(())
    }

    /// Transmit buffers the device has not finished with yet (after taking back the ones it
    /// has): 0 means every frame sent so far has left the TX queue.
    pub fn tx_in_flight(&mut self) -> Result<u16, VirtioUserError> {
        self.check()?;
        self.reclaim_tx()?;
        Ok(self.tx.in_flight())
    }

    /// Queues `frame` (a whole Ethernet frame, no FCS) for transmission and makes it available
    /// to the device. `Ok(false)`: the TX ring is full — call [`VirtioNet::flush`], wait, and
    /// retry. Call `flush` after a batch so the device is notified (once, if it wants to be).
    pub fn send_frame(&mut self, frame: &[u8]) -> Result<bool, VirtioUserError> {
        self.check()?;
        if frame.len() > MAX_TX_FRAME {
            return Err(VirtioUserError::FrameTooLarge {
                len: frame.len(),
                max: MAX_TX_FRAME,
            });
        }
        let id = match self.tx.claim() {
            Some(id) => id,
            None => {
                self.reclaim_tx()?;
                match self.tx.claim() {
                    Some(id) => id,
                    None => {
                        self.stats.tx_ring_full += 1;
                        // Ask for a notification when the device returns a buffer, so that a
                        // waiter wakes up when there is room again.
                        self.tx_wants_space = true;
                        return Ok(false);
                    }
                }
            }
        };
        let addr = self.tx_buffer(id);
        let mem = self.memory.guest_memory();
        let written = mem
            .write_slice(&TX_HEADER, GuestAddress(addr))
            .and_then(|()| mem.write_slice(frame, GuestAddress(addr + NET_HDR_LEN as u64)));
        if let Err(e) = written {
            self.tx.unclaim(id)?;
            return Err(super::memory::MemoryError::Access {
                addr,
                len: BUFFER_SIZE.into(),
                why: e.to_string(),
            }
            .into());
        }
        // The length fits in a u32: frame.len() <= MAX_TX_FRAME.
        let len = (NET_HDR_LEN + frame.len()) as u32;
        self.tx.push(id, addr, len, false)?;
        // Publishing per frame lets a polling device start at once; the kick waits for flush.
        self.tx.publish()?;
        self.stats.tx_frames += 1;
        Ok(true)
    }

    /// Notifies the device about the frames sent since the last flush, if it asked to be
    /// notified (EVENT_IDX or VIRTQ_USED_F_NO_NOTIFY); at most one kick per batch.
    pub fn flush(&mut self) -> Result<(), VirtioUserError> {
        self.check()?;
        if self.tx.kick_needed()? {
            self.fds.kick(TX_QUEUE)?;
            self.stats.kicks += 1;
        }
        self.reclaim_tx()
    }

    /// Appends up to `max` received frames (Ethernet frames without the virtio-net header) to
    /// `out`, gives their buffers back to the device, and notifies it if it wants that. Returns
    /// the number of frames appended. A frame spanning several buffers (MRG_RXBUF) counts once;
    /// if only part of it has arrived, it is kept and completed by a later call.
    pub fn recv_frames(
        &mut self,
        out: &mut Vec<Vec<u8>>,
        max: usize,
    ) -> Result<usize, VirtioUserError> {
        self.check()?;
        let mut frames = 0;
        let mut recycled = false;
        let result = self.recv_into(out, max, &mut frames, &mut recycled);
        if recycled {
            self.rx.publish()?;
            if self.rx.kick_needed()? {
                self.fds.kick(RX_QUEUE)?;
                self.stats.kicks += 1;
            }
        }
        result.map(|()| frames)
    }

    fn recv_into(
        &mut self,
        out: &mut Vec<Vec<u8>>,
        max: usize,
        frames: &mut usize,
        recycled: &mut bool,
    ) -> Result<(), VirtioUserError> {
        let mrg = self.negotiated.has(VIRTIO_NET_F_MRG_RXBUF);
        while *frames < max || self.partial.is_some() {
            let Some(used) = self.rx.pop_used()? else {
                break;
            };
            let addr = self.rx_buffer(used.id);
            // The ring checked used.len <= BUFFER_SIZE for this device-writable buffer.
            let mut data = vec![0u8; used.len as usize];
            let read = self
                .memory
                .guest_memory()
                .read_slice(&mut data, GuestAddress(addr));
            // Give the buffer back before anything can fail, so the ring keeps its buffers.
            self.rx.push(used.id, addr, BUFFER_SIZE, true)?;
            *recycled = true;
            if let Err(e) = read {
                return Err(super::memory::MemoryError::Access {
                    addr,
                    len: used.len.into(),
                    why: e.to_string(),
                }
                .into());
            }
            if let Some(mut p) = self.partial.take() {
                p.data.extend_from_slice(&data);
                p.remaining -= 1;
                if p.remaining == 0 {
                    out.push(p.data);
                    *frames += 1;
                    self.stats.rx_frames += 1;
                    self.stats.rx_merged += 1;
                } else {
                    self.partial = Some(p);
                }
                continue;
            }
            if data.len() < NET_HDR_LEN {
                return self.fail(NetDeviceError::RxHeaderTooShort {
                    len: used.len,
                    hdr: NET_HDR_LEN,
                });
            }
            // Without MRG_RXBUF the device must use exactly one buffer (5.1.6.4); whatever it
            // wrote in num_buffers is ignored then.
            let buffers = if mrg { num_buffers(&data) } else { 1 };
            if buffers == 0 || buffers > self.rx.size() {
                return self.fail(NetDeviceError::BadNumBuffers {
                    num: buffers,
                    max: self.rx.size(),
                });
            }
            data.drain(..NET_HDR_LEN);
            if buffers == 1 {
                out.push(data);
                *frames += 1;
                self.stats.rx_frames += 1;
            } else {
                self.partial = Some(PartialFrame {
                    data,
                    remaining: buffers - 1,
                });
            }
        }
        Ok(())
    }

    /// Arms the used-buffer notifications this driver waits for — RX always, TX while a sender
    /// waits for room — and re-checks the rings. Returns true if there is already something to
    /// do (received buffers, or returned TX buffers someone waits for): do not block then.
    pub fn prepare_wait(&mut self) -> Result<bool, VirtioUserError> {
        self.check()?;
        // Forget notifications about what the rings already show: anything that matters is
        // found by the re-checks below, and a stale count would end the next block at once.
        self.waiter.drain();
        let mut ready = self.rx.enable_used_notification()?;
        if self.tx_wants_space {
            self.reclaim_tx()?;
            if self.tx.free_count() > 0 {
                self.tx_wants_space = false;
                self.tx.disable_used_notification()?;
                ready = true;
            } else if self.tx.enable_used_notification()? {
                ready = true;
            }
        }
        Ok(ready)
    }

    /// Blocks until the device signals a used buffer (a frame arrived, or TX room appeared for a
    /// sender that found the ring full) or `timeout` passes. Returns true if woken (or work was
    /// already pending), false on timeout. Spurious wake-ups are possible.
    pub fn wait(&mut self, timeout: Duration) -> Result<bool, VirtioUserError> {
        if self.prepare_wait()? {
            return Ok(true);
        }
        Ok(self.waiter.block(timeout)? == WaitOutcome::Notified)
    }

    /// True if the backend has closed the vhost-user socket.
    pub fn backend_gone(&self) -> bool {
        self.waiter.backend_gone()
    }
}

#[cfg(test)]
pub(crate) mod test_device;
#[cfg(test)]
mod tests;
