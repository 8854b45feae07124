//! A virtio-net frontend on the `vhost` crate's `Frontend` (the one the host-process driver's
//! `vhost_setup` speaks through), over the kit's memfd memory and hand-written split rings
//! ([`crate::virtqueue`]), for tests that drive a device through its vhost-user life: start it
//! the way QEMU does or in QEMU 7.2's order ([`TestFrontend::start_like_qemu_7_2`]), stop and
//! restart rings, reset, swap memory tables, and send raw messages on the same socket
//! ([`TestFrontend::raw`]).
//!
//! Memory layout (guest-physical, [`MEM_SIZE`] bytes): the RX ring at 0x1_0000, the TX ring at
//! 0x2_0000, RX buffers from 0x10_0000, TX buffers from 0x40_0000, 3..4 MiB free for the test.
#![allow(clippy::unwrap_used)]

use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use svnic_channels::frame::{ControlOp, ControlStatus, Frame, FrameBody};
use svnic_channels::MacAddr;
use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserHeaderFlag, VhostUserProtocolFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::raw_frontend::{encode, flags, req, vring_state, RawFrontend, Sealing};
use crate::virtqueue::{Desc, GuestMem, SplitQueue, DESC_F_NEXT, DESC_F_WRITE};

/// The receive queue.
pub const RX: usize = 0;
/// The transmit queue.
pub const TX: usize = 1;
/// Slots per queue.
pub const QUEUE_SIZE: u16 = 256;
/// `struct virtio_net_hdr_v1`.
pub const HDR_LEN: usize = 12;
/// The frontend's memory.
pub const MEM_SIZE: u64 = 8 << 20;
/// Where each queue's rings start.
pub const RING_BASE: [u64; 2] = [0x1_0000, 0x2_0000];
const RX_BUF_BASE: u64 = 0x10_0000;
const RX_BUF_LEN: u32 = 2048;
/// RX buffers posted at start (the rest of the ring stays empty).
pub const RX_BUFFERS: u16 = 128;
const TX_BUF_BASE: u64 = 0x40_0000;
const TX_BUF_LEN: u32 = 0x1_0000;
const TX_SLOTS: u16 = 64;
/// How long a step waits for the device.
pub const TIMEOUT: Duration = Duration::from_secs(5);
const VIRTIO_NET_F_MAC: u32 = 5;
const VIRTIO_NET_F_STATUS: u32 = 16;

/// One split virtqueue, driver side, with its kick and call eventfds. Descriptor `i` always
/// points at buffer slot `i`.
#[derive(Debug)]
pub struct DriverQueue {
    /// The rings.
    pub ring: SplitQueue,
    /// Frontend -> device notification.
    pub kick: EventFd,
    /// Device -> frontend notification.
    pub call: EventFd,
}

impl DriverQueue {
    fn new(base: u64, size: u16) -> Self {
        DriverQueue {
            ring: SplitQueue::new(base, size),
            kick: EventFd::new(EFD_NONBLOCK).unwrap(),
            call: EventFd::new(EFD_NONBLOCK).unwrap(),
        }
    }

    /// The ring addresses as `SET_VRING_ADDR` announces them (this process's addresses).
    pub fn config(&self, mem: &GuestMem) -> VringConfigData {
        VringConfigData {
            queue_max_size: self.ring.size,
            queue_size: self.ring.size,
            flags: 0,
            desc_table_addr: mem.user_addr(self.ring.desc),
            used_ring_addr: mem.user_addr(self.ring.used),
            avail_ring_addr: mem.user_addr(self.ring.avail),
            log_addr: None,
        }
    }

    /// Writes descriptor `id` (`segments`: address, length, writable; chained `id, id+1, ..`)
    /// and publishes it.
    pub fn post(&mut self, mem: &GuestMem, id: u16, segments: &[(u64, u32, bool)]) {
        for (i, &(addr, len, writable)) in segments.iter().enumerate() {
            let index = id + i as u16;
            let mut flags = if writable { DESC_F_WRITE } else { 0 };
            if i + 1 < segments.len() {
                flags |= DESC_F_NEXT;
            }
            let desc = Desc {
                addr,
                len,
                flags,
                next: index + 1,
            };
            self.ring.write_desc(mem, index, desc).unwrap();
        }
        self.ring.publish(mem, id).unwrap();
    }

    /// Notifies the device.
    pub fn kick(&self) {
        self.kick.write(1).unwrap();
    }

    /// The next used element, if the device published one. Keeps `used_event` (EVENT_IDX) at
    /// the next index to read, so that the device signals the next completion.
    pub fn pop_used(&mut self, mem: &GuestMem) -> Option<(u32, u32)> {
        let used = self.ring.pop_used(mem).unwrap()?;
        self.ring
            .set_used_event(mem, self.ring.last_used())
            .unwrap();
        Some(used)
    }

    /// Waits for the next used element: polls the ring, sleeping on the call eventfd.
    pub fn wait_used(&mut self, mem: &GuestMem, timeout: Duration) -> Option<(u32, u32)> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.pop_used(mem) {
                return Some(e);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            let wait = (deadline - now).min(Duration::from_millis(20));
            let mut pfd = libc::pollfd {
                fd: self.call.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, living across the call.
            unsafe { libc::poll(&mut pfd, 1, wait.as_millis() as i32) };
            let _ = self.call.read();
        }
    }
}

/// A host process acting as the vhost-user frontend of one virtio-net device.
pub struct TestFrontend {
    /// The vhost-user conversation.
    pub frontend: Frontend,
    /// The same socket, to write messages the `Frontend` API would refuse to send.
    pub raw: RawFrontend,
    /// Its memory (an unsealed memfd).
    pub mem: GuestMem,
    /// RX and TX.
    pub queues: [DriverQueue; 2],
    /// Features acknowledged.
    pub acked_features: u64,
    /// Protocol features acknowledged.
    pub protocol_features: VhostUserProtocolFeatures,
    /// `num_buffers` of the last frame received.
    pub last_num_buffers: u16,
    /// Ring bases returned by the last `GET_VRING_BASE` (where the device stopped).
    vring_bases: [u16; 2],
    next_tx: u16,
}

impl std::fmt::Debug for TestFrontend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestFrontend")
            .field("raw", &self.raw)
            .field("acked_features", &self.acked_features)
            .field("protocol_features", &self.protocol_features)
            .finish_non_exhaustive()
    }
}

impl TestFrontend {
    /// Connects to `socket` (retrying while the listener is busy with a previous connection).
    pub fn connect(socket: &Path) -> Self {
        let raw = RawFrontend::connect(socket, TIMEOUT)
            .unwrap_or_else(|e| panic!("cannot connect to {socket:?}: {e}"));
        let stream: UnixStream = raw.stream().try_clone().unwrap();
        let frontend = Frontend::from_stream(stream, 2);
        frontend.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        TestFrontend {
            frontend,
            raw,
            mem: GuestMem::new(MEM_SIZE, Sealing::Unsealed).unwrap(),
            queues: [
                DriverQueue::new(RING_BASE[RX], QUEUE_SIZE),
                DriverQueue::new(RING_BASE[TX], QUEUE_SIZE),
            ],
            acked_features: 0,
            protocol_features: VhostUserProtocolFeatures::empty(),
            last_num_buffers: 0,
            vring_bases: [0; 2],
            next_tx: 0,
        }
    }

    /// Connects and starts the device the way QEMU does: owner, features, protocol features,
    /// memory table, then each vring (num, addr, base, call, kick, enable); posts RX buffers.
    pub fn start(socket: &Path) -> Self {
        let mut f = Self::connect(socket);
        f.negotiate().unwrap();
        f.set_mem_table().unwrap();
        f.start_rings().unwrap();
        f
    }

    /// Starts the device in the order QEMU 7.2's vhost-user-net uses (measured): protocol
    /// features, owner, call/err fds, then `SET_VRING_ENABLE` for both rings *before*
    /// `SET_FEATURES` (virtio-net's `peer_attach`), then features, memory table and rings, and
    /// no `SET_VRING_ENABLE` afterwards.
    pub fn start_like_qemu_7_2(socket: &Path) -> Self {
        let mut f = Self::connect(socket);
        let offered = f.frontend.get_features().unwrap();
        let proto = f.frontend.get_protocol_features().unwrap();
        let wanted = proto
            & (VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::RESET_DEVICE);
        f.frontend.set_protocol_features(wanted).unwrap();
        f.frontend.set_owner().unwrap();
        for q in [RX, TX] {
            f.frontend.set_vring_call(q, &f.queues[q].call).unwrap();
        }
        for q in [RX as u32, TX as u32] {
            // Version 1 without NEED_REPLY, as QEMU sends it.
            let m = encode(req::SET_VRING_ENABLE, flags::VERSION_1, &vring_state(q, 1));
            f.raw.send_bytes(&m, &[]).unwrap();
        }
        let acked = offered & !((1 << VIRTIO_NET_F_MAC) | (1 << VIRTIO_NET_F_STATUS));
        f.frontend.set_features(acked).unwrap();
        f.acked_features = acked;
        f.protocol_features = wanted;
        f.set_mem_table().unwrap();
        for q in [RX, TX] {
            let queue = &f.queues[q];
            f.frontend.set_vring_num(q, QUEUE_SIZE).unwrap();
            f.frontend.set_vring_base(q, 0).unwrap();
            f.frontend.set_vring_addr(q, &queue.config(&f.mem)).unwrap();
            f.frontend.set_vring_kick(q, &queue.kick).unwrap();
            f.frontend.set_vring_call(q, &queue.call).unwrap();
        }
        for id in 0..RX_BUFFERS {
            f.post_rx_buffer(id);
        }
        f.queues[RX].kick();
        f
    }

    /// Owner, features (all offered), protocol features (REPLY_ACK, CONFIG and RESET_DEVICE of
    /// those offered).
    pub fn negotiate(&mut self) -> vhost::Result<()> {
        self.frontend.set_owner()?;
        let offered = self.frontend.get_features()?;
        self.frontend.set_features(offered)?;
        self.acked_features = offered;
        let proto = self.frontend.get_protocol_features()?;
        let wanted = proto
            & (VhostUserProtocolFeatures::REPLY_ACK
                | VhostUserProtocolFeatures::CONFIG
                | VhostUserProtocolFeatures::RESET_DEVICE);
        self.frontend.set_protocol_features(wanted)?;
        self.protocol_features = wanted;
        Ok(())
    }

    /// The whole memory as one memory-table region.
    pub fn region(&self) -> VhostUserMemoryRegionInfo {
        VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: MEM_SIZE,
            userspace_addr: self.mem.user_addr(0),
            mmap_offset: 0,
            mmap_handle: self.mem.memfd.fd(),
        }
    }

    /// `SET_MEM_TABLE` of [`Self::region`].
    pub fn set_mem_table(&mut self) -> vhost::Result<()> {
        self.frontend.set_mem_table(&[self.region()]).map(|_| ())
    }

    /// Sets up and enables both rings (from where they stopped); posts RX buffers the first time.
    pub fn start_rings(&mut self) -> vhost::Result<()> {
        for q in [RX, TX] {
            let queue = &self.queues[q];
            self.frontend.set_vring_num(q, QUEUE_SIZE)?;
            self.frontend.set_vring_addr(q, &queue.config(&self.mem))?;
            self.frontend.set_vring_base(q, self.vring_bases[q])?;
            self.frontend.set_vring_call(q, &queue.call)?;
            self.frontend.set_vring_kick(q, &queue.kick)?;
            self.frontend.set_vring_enable(q, true)?;
        }
        if self.queues[RX].ring.avail_idx() == 0 {
            for id in 0..RX_BUFFERS {
                self.post_rx_buffer(id);
            }
            self.queues[RX].kick();
        }
        Ok(())
    }

    /// Stops both rings (`GET_VRING_BASE`), as QEMU does when the guest driver resets.
    pub fn stop_rings(&mut self) -> vhost::Result<()> {
        for q in [RX, TX] {
            self.frontend.set_vring_enable(q, false)?;
        }
        for q in [RX, TX] {
            self.stop_ring(q)?;
        }
        Ok(())
    }

    /// Stops one ring (`GET_VRING_BASE` only).
    pub fn stop_ring(&mut self, q: usize) -> vhost::Result<()> {
        self.vring_bases[q] = self.frontend.get_vring_base(q)? as u16;
        Ok(())
    }

    /// `RESET_DEVICE`.
    pub fn reset_device(&mut self) -> vhost::Result<()> {
        self.frontend.reset_device()
    }

    /// The first 10 bytes of the device's config space.
    pub fn config_space(&mut self) -> Vec<u8> {
        let (_, data) = self
            .frontend
            .get_config(0, 10, VhostUserConfigFlags::empty(), &[0u8; 10])
            .unwrap();
        data
    }

    fn post_rx_buffer(&mut self, id: u16) {
        let addr = RX_BUF_BASE + u64::from(id) * u64::from(RX_BUF_LEN);
        self.queues[RX].post(&self.mem, id, &[(addr, RX_BUF_LEN, true)]);
    }

    /// Sends one frame (virtio-net header added) and waits until the device returned it.
    pub fn send(&mut self, frame: &[u8]) {
        assert!(HDR_LEN + frame.len() <= TX_BUF_LEN as usize);
        let id = self.next_tx;
        self.next_tx = (self.next_tx + 1) % TX_SLOTS;
        let addr = TX_BUF_BASE + u64::from(id) * u64::from(TX_BUF_LEN);
        self.mem.write(addr, &[0u8; HDR_LEN]).unwrap();
        self.mem.write(addr + HDR_LEN as u64, frame).unwrap();
        // Header and frame in separate descriptors, as Linux does with a linear skb.
        let segments = [
            (addr, HDR_LEN as u32, false),
            (addr + HDR_LEN as u64, frame.len() as u32, false),
        ];
        self.send_chain(id * 2, &segments);
    }

    /// Posts an arbitrary TX chain at descriptor `id` and waits for the device to return it.
    pub fn send_chain(&mut self, id: u16, segments: &[(u64, u32, bool)]) -> (u32, u32) {
        let mem = &self.mem;
        let tx = &mut self.queues[TX];
        tx.post(mem, id, segments);
        tx.kick();
        tx.wait_used(mem, TIMEOUT)
            .expect("the device did not return a TX chain")
    }

    /// The next received frame (virtio-net header removed), reassembled from `num_buffers`
    /// buffers; the buffers are posted again.
    pub fn recv(&mut self, timeout: Duration) -> Option<Vec<u8>> {
        let (id, len) = self.queues[RX].wait_used(&self.mem, timeout)?;
        let mut bytes = self.read_rx_buffer(id, len);
        assert!(bytes.len() >= HDR_LEN, "short RX buffer: {len}");
        let num_buffers = u16::from_le_bytes([bytes[10], bytes[11]]);
        assert!(num_buffers >= 1);
        self.last_num_buffers = num_buffers;
        for _ in 1..num_buffers {
            let (id, len) = self.queues[RX]
                .wait_used(&self.mem, TIMEOUT)
                .expect("missing merged RX buffer");
            bytes.extend(self.read_rx_buffer(id, len));
        }
        self.queues[RX].kick();
        Some(bytes.split_off(HDR_LEN))
    }

    fn read_rx_buffer(&mut self, id: u32, len: u32) -> Vec<u8> {
        assert!(id < u32::from(QUEUE_SIZE) && len <= RX_BUF_LEN);
        let addr = RX_BUF_BASE + u64::from(id) * u64::from(RX_BUF_LEN);
        let mut buf = vec![0u8; len as usize];
        self.mem.read(addr, &mut buf).unwrap();
        self.post_rx_buffer(id as u16);
        buf
    }

    /// Every frame that arrives until nothing more comes for `quiet`.
    pub fn recv_all(&mut self, quiet: Duration) -> Vec<Vec<u8>> {
        std::iter::from_fn(|| self.recv(quiet)).collect()
    }

    /// The same memfd presented as two memory-table regions split at `at`.
    pub fn set_split_mem_table(&mut self, at: u64) {
        let whole = self.region();
        let first = VhostUserMemoryRegionInfo {
            memory_size: at,
            ..whole
        };
        let second = VhostUserMemoryRegionInfo {
            guest_phys_addr: at,
            memory_size: whole.memory_size - at,
            userspace_addr: whole.userspace_addr + at,
            mmap_offset: at,
            ..whole
        };
        self.frontend.set_mem_table(&[first, second]).unwrap();
    }

    /// Sends a control request frame from `me` to the engine and collects the engine's answers
    /// to it (status, channel) until a final one or a quiet 300 ms.
    pub fn control(
        &mut self,
        me: MacAddr,
        request_id: u32,
        op: ControlOp,
    ) -> Vec<(ControlStatus, u32)> {
        self.send(&crate::frames::control_request(me, request_id, op));
        let mut answers = Vec::new();
        let deadline = Instant::now() + 2 * TIMEOUT;
        while Instant::now() < deadline {
            let Some(bytes) = self.recv(Duration::from_millis(300)) else {
                break;
            };
            if let Ok(Frame {
                src,
                body: FrameBody::ControlResponse(r),
                ..
            }) = Frame::decode(&bytes)
            {
                assert_eq!(src, MacAddr::ENGINE);
                if r.request_id == request_id {
                    answers.push((r.status, r.channel.0));
                    if !matches!(r.status, ControlStatus::Pending) {
                        break;
                    }
                }
            }
        }
        answers
    }
}
