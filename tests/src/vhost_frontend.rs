//! The kit's one virtio-net test frontend, built on the real host-process driver
//! (`svnic_host_frontend::virtio_user`): its memory is a [`MemfdMemory`], every polite send and
//! receive goes through a real [`SplitRing`], and the polite start is `vhost_setup`'s
//! negotiation and queue start. Around that, what tests need to drive a device through its
//! vhost-user life and to attack it:
//!
//! - polite starts: [`TestFrontend::start`] (as the host-process driver starts) and
//!   [`TestFrontend::start_like_qemu_7_2`] (QEMU 7.2's message order);
//! - QEMU 7.2's conversation one public step at a time ([`TestFrontend::handshake`],
//!   [`TestFrontend::early_enable`], [`TestFrontend::set_features`],
//!   [`TestFrontend::set_mem_table`], [`TestFrontend::setup_vring`]; all of it:
//!   [`TestFrontend::polite_setup`]), so that a test can follow it up to any point and deviate;
//! - stop and restart rings from where the device stopped, reset, split memory tables;
//! - raw messages on the same socket ([`TestFrontend::raw`]: any message, any order, any fds);
//! - raw ring writes into the same rings' memory ([`TestFrontend::raw_ring`]).
//!
//! Memory layout (guest-physical, [`MEM_SIZE`] bytes; the kit places everything itself and does
//! not use the memory's allocator): the RX ring at 0x1_0000, the TX ring at 0x2_0000 (both
//! [`RingLayout::contiguous`]), RX buffer `id` at [`RX_BUFS`] + `id` * [`RX_BUF_LEN`], TX buffer
//! `id` at [`TX_BUFS`] + `id` * [`TX_BUF_LEN`], and everything from [`FREE`] on is the test's.
#![allow(clippy::unwrap_used)]

use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use svnic_channels::frame::{ControlOp, ControlStatus, Frame, FrameBody};
use svnic_channels::MacAddr;
use svnic_host_frontend::virtio_user::notifier::QueueEventFds;
use svnic_host_frontend::virtio_user::vhost_setup;
use svnic_host_frontend::virtio_user::{
    CallWaiter, ChainSegment, MemfdMemory, RingLayout, Sealing, SplitRing, UsedBuffer,
    VirtioUserError,
};
use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserHeaderFlag, VhostUserProtocolFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::virtio_net::{VIRTIO_NET_F_MAC, VIRTIO_NET_F_STATUS};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

use crate::raw_frontend::{
    encode, flags, mem_table, protocol, req, u64_body, vring_fd_body, vring_state, MemRegion,
    RawFrontend, VringAddr, F_PROTOCOL_FEATURES,
};
use crate::raw_ring::{Desc, RawRing};

/// The receive queue.
pub const RX: usize = 0;
/// The transmit queue.
pub const TX: usize = 1;
/// Slots per queue.
pub const QUEUE_SIZE: u16 = 256;
/// `struct virtio_net_hdr_v1` (VERSION_1 negotiated).
pub const HDR_LEN: usize = 12;
/// The frontend's memory.
pub const MEM_SIZE: u64 = 8 << 20;
/// Where each queue's rings start.
pub const RING_BASE: [u64; 2] = [0x1_0000, 0x2_0000];
/// RX buffer `id` is at `RX_BUFS + id * RX_BUF_LEN`.
pub const RX_BUFS: u64 = 0x10_0000;
/// Size of each RX buffer (a frame larger than one spans several with MRG_RXBUF).
pub const RX_BUF_LEN: u32 = 2048;
/// RX buffers posted by the polite starts (the rest of the ring stays empty).
pub const RX_BUFFERS: u16 = 128;
/// TX buffer `id` is at `TX_BUFS + id * TX_BUF_LEN`.
pub const TX_BUFS: u64 = 0x20_0000;
/// Size of each TX buffer.
pub const TX_BUF_LEN: u32 = 0x2000;
/// Memory from here on is the test's.
pub const FREE: u64 = 0x40_0000;
/// How long a step waits for the device.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// What [`TestFrontend::polite_setup`] acknowledges of the offered features: VERSION_1, MAC,
/// STATUS, INDIRECT_DESC and PROTOCOL_FEATURES; no EVENT_IDX (the device then signals every
/// batch) and no MRG_RXBUF (one chain per frame).
pub const WANTED_FEATURES: u64 = (1 << 32)
    | (1 << VIRTIO_NET_F_MAC)
    | (1 << VIRTIO_NET_F_STATUS)
    | (1 << 28)
    | F_PROTOCOL_FEATURES;

/// The rings of queue `q` (RX or TX) in the kit's layout.
pub fn ring_layout(q: usize) -> RingLayout {
    RingLayout::contiguous(RING_BASE[q], QUEUE_SIZE)
}

/// "`step`: `what`", as an error string.
fn step_err(step: &str, what: impl std::fmt::Display) -> String {
    format!("{step}: {what}")
}

/// A host process acting as the vhost-user frontend of one virtio-net device.
pub struct TestFrontend {
    /// The vhost crate's frontend (what `vhost_setup` speaks through).
    pub frontend: Frontend,
    /// The same socket, for messages the `Frontend` API would refuse to send.
    pub raw: RawFrontend,
    /// Its memory.
    pub memory: MemfdMemory,
    /// Kick and call eventfds of RX and TX.
    pub fds: QueueEventFds,
    /// Features acknowledged.
    pub acked_features: u64,
    /// What GET_FEATURES answered (step-by-step mode).
    pub offered_features: u64,
    /// What GET_PROTOCOL_FEATURES answered (step-by-step mode).
    pub offered_protocol: u64,
    /// True once REPLY_ACK was acknowledged: [`TestFrontend::request`] then waits for acks.
    pub reply_ack: bool,
    /// `num_buffers` of the last frame received.
    pub last_num_buffers: u16,
    rings: [Option<SplitRing>; 2],
    waiter: CallWaiter,
    /// Ring bases returned by the last `GET_VRING_BASE` (where the device stopped).
    vring_bases: [u16; 2],
}

impl std::fmt::Debug for TestFrontend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The vhost crate's Frontend has no Debug: the raw connection stands for it.
        write!(f, "TestFrontend {{ {:?}, .. }}", self.raw)
    }
}

impl TestFrontend {
    /// Connects to `socket` (retrying while the listener is busy with a previous connection),
    /// with fresh memory sealed as QEMU seals it, or not (then a test can truncate it).
    pub fn connect(socket: &Path, sealing: Sealing) -> Self {
        let raw = RawFrontend::connect(socket, 2 * TIMEOUT)
            .unwrap_or_else(|e| panic!("cannot connect to {socket:?}: {e}"));
        let stream: UnixStream = raw.stream().try_clone().unwrap();
        let frontend = Frontend::from_stream(stream, 2);
        frontend.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        let fds = QueueEventFds::new().unwrap();
        let waiter = CallWaiter::new(&fds, None).unwrap();
        TestFrontend {
            frontend,
            raw,
            memory: MemfdMemory::with_sealing(MEM_SIZE, sealing).unwrap(),
            fds,
            acked_features: 0,
            offered_features: 0,
            offered_protocol: 0,
            reply_ack: false,
            last_num_buffers: 0,
            rings: [None, None],
            waiter,
            vring_bases: [0; 2],
        }
    }

    /// Connects (unsealed memory) and starts the device as the host-process driver does
    /// (`vhost_setup`: owner, features, protocol features with RESET_DEVICE, config, memory
    /// table, then each vring); posts [`RX_BUFFERS`] RX buffers.
    pub fn start(socket: &Path) -> Self {
        let mut f = Self::connect(socket, Sealing::Unsealed);
        f.negotiate().unwrap();
        f.set_mem_table().unwrap();
        f.start_rings().unwrap();
        f
    }

    /// Starts the device in the order QEMU 7.2's vhost-user-net uses (measured): protocol
    /// features, owner, call fds, then `SET_VRING_ENABLE` for both rings *before*
    /// `SET_FEATURES` (virtio-net's `peer_attach`, version 1 without NEED_REPLY, as QEMU sends
    /// it), then features (all offered but MAC and STATUS), memory table and rings, and no
    /// `SET_VRING_ENABLE` afterwards. Posts [`RX_BUFFERS`] RX buffers.
    pub fn start_like_qemu_7_2(socket: &Path) -> Self {
        let mut f = Self::connect(socket, Sealing::Unsealed);
        let offered = f.frontend.get_features().unwrap();
        let proto = f.frontend.get_protocol_features().unwrap();
        let wanted = proto
            & (VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::RESET_DEVICE);
        f.frontend.set_protocol_features(wanted).unwrap();
        f.frontend.set_owner().unwrap();
        for q in [RX, TX] {
            f.frontend.set_vring_call(q, &f.fds.call[q]).unwrap();
        }
        for q in [RX as u32, TX as u32] {
            let m = encode(req::SET_VRING_ENABLE, flags::VERSION_1, &vring_state(q, 1));
            f.raw.send_bytes(&m, &[]).unwrap();
        }
        let acked = offered & !((1 << VIRTIO_NET_F_MAC) | (1 << VIRTIO_NET_F_STATUS));
        f.frontend.set_features(acked).unwrap();
        f.acked_features = acked;
        f.reply_ack = wanted.contains(VhostUserProtocolFeatures::REPLY_ACK);
        f.set_mem_table().unwrap();
        for q in [RX, TX] {
            f.frontend.set_vring_num(q, QUEUE_SIZE).unwrap();
            f.frontend.set_vring_base(q, 0).unwrap();
            f.frontend
                .set_vring_addr(q, &f.vring_config(ring_layout(q)))
                .unwrap();
            f.frontend.set_vring_kick(q, &f.fds.kick[q]).unwrap();
            f.frontend.set_vring_call(q, &f.fds.call[q]).unwrap();
        }
        f.post_rx(RX_BUFFERS).unwrap();
        f
    }

    /// `vhost_setup`'s negotiation (owner, features, protocol features REPLY_ACK and CONFIG,
    /// plus RESET_DEVICE, config space), as the host-process driver does it.
    pub fn negotiate(&mut self) -> Result<(), VirtioUserError> {
        let extra = VhostUserProtocolFeatures::RESET_DEVICE;
        let n = vhost_setup::negotiate_with(&mut self.frontend, extra)?;
        self.acked_features = n.features;
        // The raw requests of this frontend ask for acks when the Frontend's do.
        self.reply_ack = n.protocol.contains(VhostUserProtocolFeatures::REPLY_ACK);
        Ok(())
    }

    // ---- QEMU 7.2's conversation, one step at a time (raw messages) ----

    /// What QEMU 7.2 does, in its order: [`Self::handshake`], [`Self::early_enable`],
    /// [`Self::set_features`] ([`WANTED_FEATURES`] of those offered), [`Self::set_mem_table`],
    /// then [`Self::setup_vring`] for RX and TX. Posts no RX buffers.
    pub fn polite_setup(&mut self) -> Result<(), String> {
        self.handshake()?;
        self.early_enable()?;
        self.set_features(self.offered_features & WANTED_FEATURES)?;
        self.set_mem_table()?;
        self.setup_vring(RX)?;
        self.setup_vring(TX)
    }

    /// Sends `request` and, once REPLY_ACK is on, waits for its ack and checks it is 0.
    pub fn request(
        &self,
        step: &str,
        request: u32,
        body: &[u8],
        fds: &[i32],
    ) -> Result<(), String> {
        if self.reply_ack {
            match self.raw.ack(request, body, fds) {
                Ok(0) => Ok(()),
                Ok(v) => Err(step_err(step, format!("refused (ack {v})"))),
                Err(e) => Err(step_err(step, e)),
            }
        } else {
            self.raw
                .send(request, flags::VERSION_1, body, fds)
                .map_err(|e| step_err(step, e))
        }
    }

    /// SET_OWNER, GET_FEATURES, GET_PROTOCOL_FEATURES, SET_PROTOCOL_FEATURES (REPLY_ACK and
    /// CONFIG, of those offered).
    pub fn handshake(&mut self) -> Result<(), String> {
        self.request("SET_OWNER", req::SET_OWNER, &[], &[])?;
        self.offered_features = self.get_u64("GET_FEATURES", req::GET_FEATURES)?;
        self.offered_protocol =
            self.get_u64("GET_PROTOCOL_FEATURES", req::GET_PROTOCOL_FEATURES)?;
        let ack = self.offered_protocol & (protocol::REPLY_ACK | protocol::CONFIG);
        self.set_protocol_features(ack)
    }

    /// SET_PROTOCOL_FEATURES with any bits (offered or not).
    pub fn set_protocol_features(&mut self, bits: u64) -> Result<(), String> {
        let with_ack = bits & protocol::REPLY_ACK != 0;
        if with_ack {
            self.reply_ack = true;
        }
        let r = self.request(
            "SET_PROTOCOL_FEATURES",
            req::SET_PROTOCOL_FEATURES,
            &u64_body(bits),
            &[],
        );
        self.reply_ack = with_ack;
        r
    }

    fn get_u64(&self, step: &str, request: u32) -> Result<u64, String> {
        let reply = self
            .raw
            .request_reply(request, 0, &[], &[])
            .map_err(|e| step_err(step, e))?;
        reply
            .u64()
            .ok_or_else(|| step_err(step, format!("a {}-byte reply", reply.body.len())))
    }

    /// QEMU 7.2's SET_VRING_ENABLE of both rings right after the handshake, before SET_FEATURES.
    pub fn early_enable(&self) -> Result<(), String> {
        for q in [RX, TX] {
            self.request(
                "early SET_VRING_ENABLE",
                req::SET_VRING_ENABLE,
                &vring_state(q as u32, 1),
                &[],
            )?;
        }
        Ok(())
    }

    /// SET_FEATURES (any bits).
    pub fn set_features(&mut self, features: u64) -> Result<(), String> {
        self.request("SET_FEATURES", req::SET_FEATURES, &u64_body(features), &[])?;
        self.acked_features = features;
        Ok(())
    }

    /// SET_MEM_TABLE: the whole memory as one region.
    pub fn set_mem_table(&self) -> Result<(), String> {
        let body = mem_table(&[self.mem_region()]);
        self.request("SET_MEM_TABLE", req::SET_MEM_TABLE, &body, &[self.memfd()])
    }

    /// SET_VRING_NUM, SET_VRING_BASE 0, SET_VRING_ADDR, SET_VRING_KICK, SET_VRING_CALL of ring
    /// `q` in the kit's layout.
    pub fn setup_vring(&self, q: usize) -> Result<(), String> {
        self.setup_vring_at(q, ring_layout(q))
    }

    /// [`Self::setup_vring`] announcing any ring addresses (inside memory or not) and size.
    pub fn setup_vring_at(&self, q: usize, layout: RingLayout) -> Result<(), String> {
        let index = q as u32;
        let qi = u8::try_from(q).unwrap_or(u8::MAX);
        let kick = [self.fds.kick[q].as_raw_fd()];
        let call = [self.fds.call[q].as_raw_fd()];
        let addr = VringAddr {
            index,
            flags: 0,
            desc: self.user_addr(layout.desc),
            used: self.user_addr(layout.used),
            avail: self.user_addr(layout.avail),
            log: 0,
        };
        let steps: [(&str, u32, Vec<u8>, &[i32]); 5] = [
            (
                "SET_VRING_NUM",
                req::SET_VRING_NUM,
                vring_state(index, u32::from(layout.size)),
                &[],
            ),
            (
                "SET_VRING_BASE",
                req::SET_VRING_BASE,
                vring_state(index, 0),
                &[],
            ),
            ("SET_VRING_ADDR", req::SET_VRING_ADDR, addr.body(), &[]),
            (
                "SET_VRING_KICK",
                req::SET_VRING_KICK,
                vring_fd_body(qi, false),
                &kick,
            ),
            (
                "SET_VRING_CALL",
                req::SET_VRING_CALL,
                vring_fd_body(qi, false),
                &call,
            ),
        ];
        for (step, request, body, fds) in steps {
            self.request(step, request, &body, fds)?;
        }
        Ok(())
    }

    // ---- memory ----

    /// The memfd's descriptor (what memory tables send).
    pub fn memfd(&self) -> RawFd {
        self.memory.file().as_raw_fd()
    }

    /// This process's address of guest-physical `gpa` (also past the end: the vhost-user
    /// frontend address of a range a test wants to lie about).
    pub fn user_addr(&self, gpa: u64) -> u64 {
        self.memory.host_address(0).unwrap().wrapping_add(gpa)
    }

    /// The whole memory as one region of a raw memory table.
    pub fn mem_region(&self) -> MemRegion {
        MemRegion {
            gpa: 0,
            size: MEM_SIZE,
            user_addr: self.user_addr(0),
            mmap_offset: 0,
        }
    }

    /// The whole memory as one region of the vhost crate's memory table.
    pub fn region(&self) -> VhostUserMemoryRegionInfo {
        self.memory.vhost_region().unwrap()
    }

    /// Writes `data` at `gpa`.
    pub fn write(&self, gpa: u64, data: &[u8]) -> Result<(), String> {
        use vm_memory::Bytes;
        self.memory
            .guest_memory()
            .write_slice(data, vm_memory::GuestAddress(gpa))
            .map_err(|e| format!("write at {gpa:#x}: {e}"))
    }

    fn read(&self, gpa: u64, out: &mut [u8]) -> Result<(), String> {
        use vm_memory::Bytes;
        self.memory
            .guest_memory()
            .read_slice(out, vm_memory::GuestAddress(gpa))
            .map_err(|e| format!("read at {gpa:#x}: {e}"))
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

    // ---- rings ----

    /// Raw access to ring `q`'s memory (the same memory its [`SplitRing`] uses).
    pub fn raw_ring(&self, q: usize) -> RawRing<'_> {
        RawRing {
            mem: self.memory.guest_memory(),
            layout: ring_layout(q),
        }
    }

    /// Writes the chain `descs` at descriptor `head` onwards of queue `q` as given, publishes
    /// `head` at the avail index in memory, and kicks.
    pub fn publish_raw(&self, q: usize, head: u16, descs: &[Desc]) -> Result<(), String> {
        self.raw_ring(q).publish_chain(head, descs)?;
        self.kick(q)
    }

    /// The driver side of ring `q`, set up (and zeroed) the first time.
    fn ring(&mut self, q: usize) -> Result<&mut SplitRing, String> {
        let event_idx = self.acked_features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0;
        let name = ["RX", "TX"][q];
        let mem = self.memory.guest_memory().clone();
        let slot = &mut self.rings[q];
        if slot.is_none() {
            let ring =
                SplitRing::new(name, mem, ring_layout(q), event_idx).map_err(|e| e.to_string())?;
            *slot = Some(ring);
        }
        slot.as_mut().ok_or_else(|| "no ring".to_string())
    }

    fn vring_config(&self, layout: RingLayout) -> VringConfigData {
        VringConfigData {
            queue_max_size: layout.size,
            queue_size: layout.size,
            flags: 0,
            desc_table_addr: self.user_addr(layout.desc),
            used_ring_addr: self.user_addr(layout.used),
            avail_ring_addr: self.user_addr(layout.avail),
            log_addr: None,
        }
    }

    /// Starts both rings with `vhost_setup::start_queue`, from where they stopped (the bases
    /// of the last `GET_VRING_BASE`, 0 at first); posts [`RX_BUFFERS`] RX buffers the first
    /// time.
    pub fn start_rings(&mut self) -> Result<(), VirtioUserError> {
        self.start_rings_blind()?;
        if self.rings[RX].as_ref().is_none_or(|r| r.avail_idx() == 0) {
            self.post_rx(RX_BUFFERS).unwrap();
        }
        Ok(())
    }

    /// Starts both rings like [`Self::start_rings`] without touching the frontend's own memory
    /// (only addresses are computed): for a test whose memory is gone.
    pub fn start_rings_blind(&mut self) -> Result<(), VirtioUserError> {
        for q in [RX, TX] {
            vhost_setup::start_queue(
                &mut self.frontend,
                &self.memory,
                q,
                ring_layout(q),
                self.vring_bases[q],
                &self.fds,
            )?;
        }
        Ok(())
    }

    /// Stops both rings (disable, then `GET_VRING_BASE`), as QEMU does when the guest driver
    /// resets.
    pub fn stop_rings(&mut self) -> vhost::Result<()> {
        for q in [RX, TX] {
            self.frontend.set_vring_enable(q, false)?;
        }
        for q in [RX, TX] {
            self.stop_ring(q)?;
        }
        Ok(())
    }

    /// Stops one ring (`GET_VRING_BASE` only) and keeps the base to restart from.
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

    /// Notifies the device that queue `q` has new buffers.
    pub fn kick(&self, q: usize) -> Result<(), String> {
        self.fds.kick(q).map_err(|e| step_err("kick", e))
    }

    /// Posts `n` RX buffers (one descriptor each, through the ring) and kicks RX.
    pub fn post_rx(&mut self, n: u16) -> Result<(), String> {
        let ring = self.ring(RX)?;
        for _ in 0..n {
            let id = ring.claim().ok_or("no free RX descriptor")?;
            push_rx(ring, id)?;
        }
        ring.publish().map_err(|e| e.to_string())?;
        self.kick(RX)
    }

    /// Gives back every TX buffer the device returned.
    fn reap_tx(&mut self) -> Result<(), String> {
        let ring = self.ring(TX)?;
        while let Some(used) = ring.pop_used().map_err(|e| e.to_string())? {
            ring.unclaim(used.id).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Makes `segments` (address, length, device-writable) available on TX as one chain and
    /// kicks; returns its head.
    fn push_tx(&mut self, segments: &[(u64, u32, bool)]) -> Result<u16, String> {
        self.reap_tx()?;
        let ring = self.ring(TX)?;
        let mut chain: Vec<ChainSegment> = Vec::with_capacity(segments.len());
        for &(addr, len, writable) in segments {
            let Some(id) = ring.claim() else {
                for s in &chain {
                    let _ = ring.unclaim(s.id);
                }
                return Err("no free TX descriptor".into());
            };
            chain.push(ChainSegment {
                id,
                addr,
                len,
                writable,
            });
        }
        ring.push_chain(&chain).map_err(|e| e.to_string())?;
        ring.publish().map_err(|e| e.to_string())?;
        self.kick(TX)?;
        Ok(chain[0].id)
    }

    /// The head the next TX chain will get, and its buffer.
    fn next_tx_buffer(&mut self) -> Result<(u16, u64), String> {
        self.reap_tx()?;
        let ring = self.ring(TX)?;
        let id = ring.claim().ok_or("no free TX descriptor")?;
        ring.unclaim(id).map_err(|e| e.to_string())?;
        Ok((id, TX_BUFS + u64::from(id) * u64::from(TX_BUF_LEN)))
    }

    /// Sends one frame (virtio-net header added) in one descriptor and kicks; does not wait.
    pub fn send_frame(&mut self, frame: &[u8]) -> Result<(), String> {
        let (_, addr) = self.next_tx_buffer()?;
        let len = HDR_LEN + frame.len();
        if len > TX_BUF_LEN as usize {
            return Err(format!("a {len}-byte TX buffer"));
        }
        self.write(addr, &[0u8; HDR_LEN])?;
        self.write(addr + HDR_LEN as u64, frame)?;
        self.push_tx(&[(addr, len as u32, false)]).map(|_| ())
    }

    /// Sends one frame (virtio-net header added) and waits until the device returned it.
    pub fn send(&mut self, frame: &[u8]) {
        let (_, addr) = self.next_tx_buffer().unwrap();
        assert!(HDR_LEN + frame.len() <= TX_BUF_LEN as usize);
        self.write(addr, &[0u8; HDR_LEN]).unwrap();
        self.write(addr + HDR_LEN as u64, frame).unwrap();
        // Header and frame in separate descriptors, as Linux does with a linear skb.
        let segments = [
            (addr, HDR_LEN as u32, false),
            (addr + HDR_LEN as u64, frame.len() as u32, false),
        ];
        self.send_chain(&segments);
    }

    /// Sends an arbitrary TX chain (address, length, device-writable) and waits for the device
    /// to return it: (head, used length).
    pub fn send_chain(&mut self, segments: &[(u64, u32, bool)]) -> (u32, u32) {
        let head = self.push_tx(segments).unwrap();
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let used = self
                .next_used(TX, left)
                .unwrap()
                .expect("the device did not return a TX chain");
            self.ring(TX).unwrap().unclaim(used.id).unwrap();
            if used.id == head {
                return (u32::from(used.id), used.len);
            }
        }
    }

    /// The next used buffer of queue `q` (claimed by the caller), waiting up to `timeout` on the
    /// call eventfds.
    fn next_used(&mut self, q: usize, timeout: Duration) -> Result<Option<UsedBuffer>, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let ring = self.ring(q)?;
            if let Some(used) = ring.pop_used().map_err(|e| e.to_string())? {
                return Ok(Some(used));
            }
            if ring.enable_used_notification().map_err(|e| e.to_string())? {
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let wait = (deadline - now).min(Duration::from_millis(20));
            self.waiter.block(wait).map_err(|e| e.to_string())?;
        }
    }

    /// Waits up to `timeout` for the device to use at least one more buffer of queue `q`; the
    /// buffers used meanwhile (given back to the free list, not reposted).
    pub fn wait_used(&mut self, q: usize, timeout: Duration) -> Result<Vec<UsedBuffer>, String> {
        let mut used = Vec::new();
        if let Some(first) = self.next_used(q, timeout)? {
            used.push(first);
            while let Some(more) = self.next_used(q, Duration::ZERO)? {
                used.push(more);
            }
        }
        let ring = self.ring(q)?;
        for u in &used {
            ring.unclaim(u.id).map_err(|e| e.to_string())?;
        }
        Ok(used)
    }

    /// The next received frame (virtio-net header removed), reassembled from `num_buffers`
    /// buffers; the buffers are posted again.
    pub fn recv(&mut self, timeout: Duration) -> Option<Vec<u8>> {
        let used = self.next_used(RX, timeout).unwrap()?;
        let mut bytes = self.read_rx_buffer(used);
        assert!(bytes.len() >= HDR_LEN, "short RX buffer: {}", used.len);
        let num_buffers = u16::from_le_bytes([bytes[10], bytes[11]]);
        assert!(num_buffers >= 1);
        self.last_num_buffers = num_buffers;
        for _ in 1..num_buffers {
            let used = self
                .next_used(RX, TIMEOUT)
                .unwrap()
                .expect("missing merged RX buffer");
            bytes.extend(self.read_rx_buffer(used));
        }
        self.ring(RX).unwrap().publish().unwrap();
        self.kick(RX).unwrap();
        Some(bytes.split_off(HDR_LEN))
    }

    /// The bytes of a used RX buffer; the buffer is pushed again (published by the caller).
    fn read_rx_buffer(&mut self, used: UsedBuffer) -> Vec<u8> {
        let mut buf = vec![0u8; used.len as usize];
        self.read(rx_buffer(used.id), &mut buf).unwrap();
        push_rx(self.ring(RX).unwrap(), used.id).unwrap();
        buf
    }

    /// Every frame that arrives until nothing more comes for `quiet`.
    pub fn recv_all(&mut self, quiet: Duration) -> Vec<Vec<u8>> {
        std::iter::from_fn(|| self.recv(quiet)).collect()
    }

    /// Sends a control request frame from `me` to the engine and collects the engine's answers
    /// to it (status, channel) until a final one, or a quiet 300 ms before any answer, or the
    /// deadline once Pending came (the final answer may take its time).
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
            let quiet = if answers.is_empty() {
                Duration::from_millis(300)
            } else {
                deadline.saturating_duration_since(Instant::now())
            };
            let Some(bytes) = self.recv(quiet) else {
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

/// Guest-physical address of RX buffer `id`.
fn rx_buffer(id: u16) -> u64 {
    RX_BUFS + u64::from(id) * u64::from(RX_BUF_LEN)
}

/// Pushes claimed RX descriptor `id` with its buffer (not published).
fn push_rx(ring: &mut SplitRing, id: u16) -> Result<(), String> {
    ring.push(id, rx_buffer(id), RX_BUF_LEN, true)
        .map_err(|e| e.to_string())
}
