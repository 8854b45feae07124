//! A virtio-net frontend on [`RawFrontend`]: the vhost-user conversation QEMU 7.2 has with a
//! backend, one public step at a time, so that a test can follow it politely up to any point
//! and then deviate; plus sending and receiving frames through hand-written split rings.
//!
//! Memory layout (guest-physical, [`MEM_SIZE`] bytes of memfd): the RX ring at 0x1_0000, the TX
//! ring at 0x2_0000, RX buffers from [`RX_BUFS`], TX buffers from [`TX_BUFS`], and everything
//! from [`FREE`] on left to the test.

use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::raw_frontend::{
    flags, protocol, req, u64_body, vring_fd_body, vring_state, RawFrontend, Sealing, VringAddr,
    F_PROTOCOL_FEATURES,
};
use crate::virtqueue::{Desc, GuestMem, SplitQueue, DESC_F_WRITE};

/// The receive queue.
pub const RX: u16 = 0;
/// The transmit queue.
pub const TX: u16 = 1;
/// Slots per queue.
pub const QUEUE_SIZE: u16 = 256;
/// The frontend's memory.
pub const MEM_SIZE: u64 = 8 << 20;
/// Where each queue's rings start.
pub const RING_BASE: [u64; 2] = [0x1_0000, 0x2_0000];
/// RX buffer `i` is at `RX_BUFS + i * BUF_LEN`.
pub const RX_BUFS: u64 = 0x10_0000;
/// TX buffer `i` is at `TX_BUFS + i * BUF_LEN`.
pub const TX_BUFS: u64 = 0x20_0000;
/// Size of each buffer.
pub const BUF_LEN: u32 = 4096;
/// Memory from here on is the test's.
pub const FREE: u64 = 0x40_0000;
/// `struct virtio_net_hdr_v1` (VERSION_1 negotiated).
pub const NET_HDR_LEN: usize = 12;

/// VIRTIO_F_VERSION_1, VIRTIO_NET_F_MAC, VIRTIO_NET_F_STATUS, VIRTIO_RING_F_INDIRECT_DESC and
/// VHOST_USER_F_PROTOCOL_FEATURES: no EVENT_IDX (the device then signals every batch) and no
/// MRG_RXBUF (one chain per frame).
pub const WANTED_FEATURES: u64 = (1 << 32) | (1 << 5) | (1 << 16) | (1 << 28) | F_PROTOCOL_FEATURES;

/// A virtio-net frontend speaking raw vhost-user.
#[derive(Debug)]
pub struct NetFrontend {
    /// The connection.
    pub raw: RawFrontend,
    /// Its memory.
    pub mem: GuestMem,
    /// RX and TX rings.
    pub queues: [SplitQueue; 2],
    /// Kick eventfds (frontend -> backend).
    pub kick: [EventFd; 2],
    /// Call eventfds (backend -> frontend).
    pub call: [EventFd; 2],
    /// What GET_FEATURES answered.
    pub offered_features: u64,
    /// What GET_PROTOCOL_FEATURES answered.
    pub offered_protocol: u64,
    /// True once REPLY_ACK was acknowledged: requests then ask for acks.
    pub reply_ack: bool,
}

/// "`step`: `what`", as an error string.
fn step_err(step: &str, what: impl std::fmt::Display) -> String {
    format!("{step}: {what}")
}

impl NetFrontend {
    /// Connects to `socket` with fresh memory (sealed as QEMU seals it, or not).
    pub fn connect(socket: &Path, sealing: Sealing) -> Result<NetFrontend, String> {
        let raw = RawFrontend::connect(socket, Duration::from_secs(10))
            .map_err(|e| step_err("connect", e))?;
        let event = || EventFd::new(EFD_NONBLOCK).map_err(|e| step_err("eventfd", e));
        Ok(NetFrontend {
            raw,
            mem: GuestMem::new(MEM_SIZE, sealing)?,
            queues: [
                SplitQueue::new(RING_BASE[0], QUEUE_SIZE),
                SplitQueue::new(RING_BASE[1], QUEUE_SIZE),
            ],
            kick: [event()?, event()?],
            call: [event()?, event()?],
            offered_features: 0,
            offered_protocol: 0,
            reply_ack: false,
        })
    }

    /// What QEMU 7.2 does, in its order: [`Self::negotiate`], [`Self::early_enable`],
    /// [`Self::set_features`], [`Self::set_mem_table`], then [`Self::setup_vring`] for RX and TX.
    pub fn polite_setup(&mut self) -> Result<(), String> {
        self.negotiate()?;
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
    pub fn negotiate(&mut self) -> Result<(), String> {
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
                &vring_state(u32::from(q), 1),
                &[],
            )?;
        }
        Ok(())
    }

    /// SET_FEATURES.
    pub fn set_features(&self, features: u64) -> Result<(), String> {
        self.request("SET_FEATURES", req::SET_FEATURES, &u64_body(features), &[])
    }

    /// SET_MEM_TABLE: the whole memory as one region.
    pub fn set_mem_table(&self) -> Result<(), String> {
        let body = crate::raw_frontend::mem_table(&[self.mem.region()]);
        self.request(
            "SET_MEM_TABLE",
            req::SET_MEM_TABLE,
            &body,
            &[self.mem.memfd.fd()],
        )
    }

    /// The ring addresses of queue `q` as SET_VRING_ADDR announces them.
    pub fn vring_addr(&self, q: u16) -> VringAddr {
        let queue = &self.queues[usize::from(q)];
        VringAddr {
            index: u32::from(q),
            flags: 0,
            desc: self.mem.user_addr(queue.desc),
            used: self.mem.user_addr(queue.used),
            avail: self.mem.user_addr(queue.avail),
            log: 0,
        }
    }

    /// SET_VRING_NUM, SET_VRING_BASE 0, SET_VRING_ADDR, SET_VRING_KICK, SET_VRING_CALL.
    pub fn setup_vring(&self, q: u16) -> Result<(), String> {
        let index = u32::from(q);
        let size = u32::from(self.queues[usize::from(q)].size);
        let qi = u8::try_from(q).unwrap_or(u8::MAX);
        let kick = [self.kick[usize::from(q)].as_raw_fd()];
        let call = [self.call[usize::from(q)].as_raw_fd()];
        let steps: [(&str, u32, Vec<u8>, &[i32]); 5] = [
            (
                "SET_VRING_NUM",
                req::SET_VRING_NUM,
                vring_state(index, size),
                &[],
            ),
            (
                "SET_VRING_BASE",
                req::SET_VRING_BASE,
                vring_state(index, 0),
                &[],
            ),
            (
                "SET_VRING_ADDR",
                req::SET_VRING_ADDR,
                self.vring_addr(q).body(),
                &[],
            ),
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

    /// Notifies the device that queue `q` has new buffers.
    pub fn kick(&self, q: u16) -> Result<(), String> {
        self.kick[usize::from(q)]
            .write(1)
            .map_err(|e| step_err("kick", e))
    }

    /// Publishes a chain of `descs` (linked in order from slot `head`) on queue `q` and kicks.
    /// `NEXT` flags and `next` fields are the caller's: this writes them as given.
    pub fn publish_raw(&mut self, q: u16, head: u16, descs: &[Desc]) -> Result<(), String> {
        let queue = &mut self.queues[usize::from(q)];
        for (i, d) in descs.iter().enumerate() {
            let index = head.wrapping_add(u16::try_from(i).unwrap_or(u16::MAX));
            queue.write_desc(&self.mem, index, *d)?;
        }
        queue.publish(&self.mem, head)?;
        self.kick(q)
    }

    /// Sends one frame (Ethernet header onwards) in TX buffer `slot` and kicks.
    pub fn send_frame(&mut self, frame: &[u8]) -> Result<(), String> {
        let slot = self.queues[usize::from(TX)].avail_idx() % QUEUE_SIZE;
        let addr = TX_BUFS + u64::from(slot) * u64::from(BUF_LEN);
        let mut buf = vec![0u8; NET_HDR_LEN];
        buf.extend_from_slice(frame);
        self.mem.write(addr, &buf)?;
        let len = u32::try_from(buf.len()).map_err(|e| step_err("frame", e))?;
        self.publish_raw(
            TX,
            slot,
            &[Desc {
                addr,
                len,
                flags: 0,
                next: 0,
            }],
        )
    }

    /// Posts `n` RX buffers (slots from the current available index) and kicks RX.
    pub fn post_rx(&mut self, n: u16) -> Result<(), String> {
        for _ in 0..n {
            let slot = self.queues[usize::from(RX)].avail_idx() % QUEUE_SIZE;
            let addr = RX_BUFS + u64::from(slot) * u64::from(BUF_LEN);
            let d = Desc {
                addr,
                len: BUF_LEN,
                flags: DESC_F_WRITE,
                next: 0,
            };
            let queue = &mut self.queues[usize::from(RX)];
            queue.write_desc(&self.mem, slot, d)?;
            queue.publish(&self.mem, slot)?;
        }
        self.kick(RX)
    }

    /// Waits up to `timeout` for the device to use at least one more element of queue `q`; the
    /// elements used meanwhile (id, len).
    pub fn wait_used(&mut self, q: u16, timeout: Duration) -> Result<Vec<(u32, u32)>, String> {
        let deadline = Instant::now() + timeout;
        let mut used = Vec::new();
        loop {
            while let Some(e) = self.queues[usize::from(q)].pop_used(&self.mem)? {
                used.push(e);
            }
            if !used.is_empty() || Instant::now() >= deadline {
                return Ok(used);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}
