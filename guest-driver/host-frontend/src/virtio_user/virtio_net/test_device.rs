//! Test support: the device side of a virtio-net device built on the real virtio-queue library
//! (its `Queue` over the same memory as the driver), wired to a [`VirtioNet`] without a
//! vhost-user socket. Behaves like a vhost-user backend would: honours EVENT_IDX both ways,
//! merges RX buffers when MRG_RXBUF is negotiated, signals the call eventfds.
#![allow(clippy::unwrap_used)]

use std::num::Wrapping;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use svnic_channels::MacAddr;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{VIRTIO_NET_F_MAC, VIRTIO_NET_F_MRG_RXBUF};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use crate::virtio_user::memory::MemfdMemory;
use crate::virtio_user::net_header::NET_HDR_LEN;
use crate::virtio_user::notifier::{CallWaiter, QueueEventFds, RX_QUEUE, TX_QUEUE};
use crate::virtio_user::split_ring::tests::device as queue;
use crate::virtio_user::vhost_setup::{Negotiated, VHOST_USER_F_PROTOCOL_FEATURES};
use crate::virtio_user::virtio_net::VirtioNet;

/// VERSION_1 | MAC | PROTOCOL_FEATURES.
pub const BASE: u64 =
    (1 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_NET_F_MAC) | VHOST_USER_F_PROTOCOL_FEATURES;
/// EVENT_IDX.
pub const EVENT_IDX: u64 = 1 << VIRTIO_RING_F_EVENT_IDX;
/// MRG_RXBUF.
pub const MRG_RXBUF: u64 = 1 << VIRTIO_NET_F_MRG_RXBUF;
/// The MAC the test device reports.
pub const MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x56]);

/// The device side.
pub struct TestDevice {
    pub mem: Arc<GuestMemoryMmap>,
    pub rx: Queue,
    pub tx: Queue,
    kick: [EventFd; 2],
    call: [Arc<EventFd>; 2],
    mrg: bool,
    /// Call notifications sent, by queue.
    pub calls: [u64; 2],
}

/// A driver and a device over one memfd memory of `mem_mib` MiB.
pub fn pair(features: u64, queue_size: u16, mem_mib: u64) -> (VirtioNet, TestDevice) {
    let memory = Arc::new(MemfdMemory::new(mem_mib << 20).unwrap());
    let fds = QueueEventFds::new().unwrap();
    let kick = [
        fds.kick[RX_QUEUE].try_clone().unwrap(),
        fds.kick[TX_QUEUE].try_clone().unwrap(),
    ];
    let call = fds.call.clone();
    let waiter = CallWaiter::new(&fds, None).unwrap();
    let negotiated = Negotiated {
        features,
        mac: MAC,
        link_up: None,
        protocol: vhost::vhost_user::VhostUserProtocolFeatures::empty(),
    };
    let net = VirtioNet::assemble(memory.clone(), negotiated, queue_size, fds, waiter).unwrap();
    let (rx, tx) = net.ring_layouts();
    let event_idx = features & EVENT_IDX != 0;
    let dev = TestDevice {
        mem: memory.guest_memory().clone(),
        rx: queue(rx, event_idx),
        tx: queue(tx, event_idx),
        kick,
        call,
        mrg: features & MRG_RXBUF != 0,
        calls: [0; 2],
    };
    (net, dev)
}

impl TestDevice {
    fn notify(&mut self, index: usize) {
        let q = if index == RX_QUEUE {
            &mut self.rx
        } else {
            &mut self.tx
        };
        if q.needs_notification(self.mem.as_ref()).unwrap() {
            self.call[index].write(1).unwrap();
            self.calls[index] += 1;
        }
    }

    /// Reads (and resets) the kick eventfd of queue `index`.
    pub fn kicked(&self, index: usize) -> bool {
        self.kick[index].read().is_ok()
    }

    /// RX buffers the driver has made available and the device has not taken.
    pub fn rx_available(&self) -> u16 {
        let avail = self
            .rx
            .avail_idx(self.mem.as_ref(), Ordering::Acquire)
            .unwrap();
        (avail - Wrapping(self.rx.next_avail())).0
    }

    /// Writes `frame` into RX buffers (several with MRG_RXBUF) and returns them used, one
    /// element at a time (so a driver can see part of a merged frame). False if there are not
    /// enough buffers (nothing is consumed then).
    pub fn deliver(&mut self, frame: &[u8]) -> bool {
        self.deliver_with(frame, |_| {})
    }

    /// Like [`TestDevice::deliver`], calling `between(k)` after the k-th used element of a
    /// frame that spans several buffers (before the next one is returned).
    pub fn deliver_with(&mut self, frame: &[u8], mut between: impl FnMut(usize)) -> bool {
        let mem = self.mem.clone();
        let mut bytes = vec![0u8; NET_HDR_LEN];
        bytes.extend_from_slice(frame);
        // All driver buffers have the same size; peek at the next one for it.
        let Some(chain) = self.rx.pop_descriptor_chain(mem.as_ref()) else {
            return false;
        };
        self.rx.go_to_previous_position();
        let buf_len = chain.clone().next().unwrap().len() as usize;
        let needed = bytes.len().div_ceil(buf_len);
        if needed > usize::from(self.rx_available()) || (!self.mrg && needed > 1) {
            return false;
        }
        bytes[10..12].copy_from_slice(&(needed as u16).to_le_bytes());
        for (k, chunk) in bytes.chunks(buf_len).enumerate() {
            if k > 0 {
                between(k);
            }
            let chain = self.rx.pop_descriptor_chain(mem.as_ref()).unwrap();
            let head = chain.head_index();
            let d = chain.clone().next().unwrap();
            assert!(d.is_write_only());
            mem.write_slice(chunk, d.addr()).unwrap();
            self.rx
                .add_used(mem.as_ref(), head, chunk.len() as u32)
                .unwrap();
        }
        self.notify(RX_QUEUE);
        true
    }

    /// Takes every frame the driver made available on TX (headers stripped), returns the
    /// buffers, re-arms kicks, and signals the driver if it asked.
    pub fn transmitted(&mut self) -> Vec<Vec<u8>> {
        let mem = self.mem.clone();
        let mut frames = Vec::new();
        loop {
            while let Some(chain) = self.tx.pop_descriptor_chain(mem.as_ref()) {
                let head = chain.head_index();
                let mut bytes = Vec::new();
                for d in chain {
                    assert!(!d.is_write_only());
                    let mut b = vec![0u8; d.len() as usize];
                    mem.read_slice(&mut b, d.addr()).unwrap();
                    bytes.extend_from_slice(&b);
                }
                assert!(bytes.len() >= NET_HDR_LEN);
                assert_eq!(bytes[..NET_HDR_LEN], [0u8; NET_HDR_LEN]);
                frames.push(bytes.split_off(NET_HDR_LEN));
                self.tx.add_used(mem.as_ref(), head, 0).unwrap();
            }
            if !self.tx.enable_notification(mem.as_ref()).unwrap() {
                break;
            }
        }
        if !frames.is_empty() {
            self.notify(TX_QUEUE);
        }
        frames
    }

    /// Writes `bytes` as they are (header included) into the next RX buffer and reports
    /// `len` bytes written.
    pub fn deliver_raw(&mut self, bytes: &[u8], len: u32) {
        let mem = self.mem.clone();
        let chain = self.rx.pop_descriptor_chain(mem.as_ref()).unwrap();
        let head = chain.head_index();
        let d = chain.clone().next().unwrap();
        mem.write_slice(bytes, d.addr()).unwrap();
        self.rx.add_used(mem.as_ref(), head, len).unwrap();
        self.notify(RX_QUEUE);
    }

    /// Writes a raw used element into the RX used ring and bumps its idx (a hostile device).
    pub fn hostile_rx_used(&mut self, id: u32, len: u32) {
        let l = self.rx.used_ring();
        let next = self.rx.next_used();
        let addr = l + 4 + 8 * u64::from(next & (self.rx.size() - 1));
        self.mem.write_obj(id.to_le(), GuestAddress(addr)).unwrap();
        self.mem
            .write_obj(len.to_le(), GuestAddress(addr + 4))
            .unwrap();
        let next = next.wrapping_add(1);
        self.rx.set_next_used(next);
        self.mem
            .store(next.to_le(), GuestAddress(l + 2), Ordering::Release)
            .unwrap();
    }
}
