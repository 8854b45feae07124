//! virtio-net on split virtqueues, device side: features, config space, and moving one frame
//! out of a TX descriptor chain or into RX descriptor chains (VIRTIO 1.2, 5.1 "Network Device").
//!
//! Everything the guest wrote (descriptor addresses, lengths, flags, ring indices) is hostile:
//! chains are walked by virtio-queue's `DescriptorChain` (bounded by the queue size, checked
//! sums), every buffer is range-checked against guest memory before it is used, and every
//! failure is an error value, never a panic.

use log::debug;
use thiserror::Error;
use vhost::vhost_user::message::VhostUserVirtioFeatures;
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_net::{
    VIRTIO_NET_F_MAC, VIRTIO_NET_F_MRG_RXBUF, VIRTIO_NET_F_STATUS, VIRTIO_NET_S_LINK_UP,
};
use virtio_bindings::bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use virtio_queue::{DescriptorChain, Queue, QueueOwnedT, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use svnic_channels::MacAddr;

/// Index of the receive queue (device -> guest).
pub const RX_QUEUE: u16 = 0;
/// Index of the transmit queue (guest -> device).
pub const TX_QUEUE: u16 = 1;
/// Number of virtqueues (one queue pair; no control queue, no multiqueue).
pub const NUM_QUEUES: usize = 2;
/// Largest queue size a frontend may configure.
pub const MAX_QUEUE_SIZE: usize = 1024;
/// Queue size frontends are expected to use.
pub const DEFAULT_QUEUE_SIZE: u16 = 256;

/// Size of `struct virtio_net_hdr_v1` (with `num_buffers`): used with VERSION_1 or MRG_RXBUF.
pub const NET_HDR_LEN: usize = 12;
/// Size of the legacy header without `num_buffers` (neither VERSION_1 nor MRG_RXBUF).
pub const LEGACY_NET_HDR_LEN: usize = 10;
/// Offset of `num_buffers` in the header.
const NUM_BUFFERS_OFFSET: usize = 10;
/// Largest frame (Ethernet header onwards) accepted from or delivered to a guest: the largest
/// MTU a virtio-net driver allows without VIRTIO_NET_F_MTU (65535), an Ethernet header and a
/// VLAN tag. No segmentation offload is offered, so nothing larger is legitimate.
pub const MAX_FRAME_LEN: usize = 65_535 + 14 + 4;

/// Size of the config space we expose: `mac`, `status`, `max_virtqueue_pairs`.
const CONFIG_LEN: usize = 10;
/// The largest config space access we answer (the vhost-user maximum is 256 bytes).
const MAX_CONFIG_ACCESS: usize = 256;

/// The virtio features the device offers.
pub fn device_features() -> u64 {
    (1 << VIRTIO_F_VERSION_1)
        | (1 << VIRTIO_NET_F_MAC)
        | (1 << VIRTIO_NET_F_STATUS)
        | (1 << VIRTIO_NET_F_MRG_RXBUF)
        | (1 << VIRTIO_RING_F_EVENT_IDX)
        | (1 << VIRTIO_RING_F_INDIRECT_DESC)
        | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
}

/// What the negotiated features mean for the data path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetFeatures {
    /// Length of the virtio-net header in front of every frame.
    pub hdr_len: usize,
    /// VIRTIO_NET_F_MRG_RXBUF: a received frame may span several descriptor chains.
    pub mergeable: bool,
    /// VIRTIO_RING_F_EVENT_IDX.
    pub event_idx: bool,
}

impl NetFeatures {
    /// From the features the frontend acknowledged.
    pub fn from_acked(acked: u64) -> Self {
        let has = |bit: u32| acked & (1u64 << bit) != 0;
        let mergeable = has(VIRTIO_NET_F_MRG_RXBUF);
        NetFeatures {
            hdr_len: if has(VIRTIO_F_VERSION_1) || mergeable {
                NET_HDR_LEN
            } else {
                LEGACY_NET_HDR_LEN
            },
            mergeable,
            event_idx: has(VIRTIO_RING_F_EVENT_IDX),
        }
    }
}

impl Default for NetFeatures {
    fn default() -> Self {
        Self::from_acked(0)
    }
}

/// `size` bytes of the config space (`struct virtio_net_config`) from `offset`: the MAC, status
/// LINK_UP and one queue pair; bytes past those read as zero. Empty if the access is out of
/// range (the frontend then gets an error).
pub fn read_config(mac: MacAddr, offset: u32, size: u32) -> Vec<u8> {
    let (offset, size) = (offset as usize, size as usize);
    match offset.checked_add(size) {
        Some(end) if end <= MAX_CONFIG_ACCESS => {}
        _ => return Vec::new(),
    }
    let mut space = [0u8; MAX_CONFIG_ACCESS];
    space[..6].copy_from_slice(&mac.0);
    space[6..8].copy_from_slice(&(VIRTIO_NET_S_LINK_UP as u16).to_le_bytes());
    space[8..CONFIG_LEN].copy_from_slice(&1u16.to_le_bytes());
    space[offset..offset + size].to_vec()
}

/// Why a TX descriptor chain was not a frame.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TxError {
    /// Fewer bytes than the virtio-net header.
    #[error("TX chain of {len} bytes is shorter than the {hdr_len}-byte virtio-net header")]
    ShorterThanHeader {
        /// Bytes in the chain.
        len: usize,
        /// Header length.
        hdr_len: usize,
    },
    /// More bytes than the largest frame plus header.
    #[error(
        "TX chain of at least {len} bytes exceeds the largest frame ({max} bytes with header)"
    )]
    TooLong {
        /// Bytes seen so far.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A device-writable descriptor in a driver-to-device chain.
    #[error("TX chain has a device-writable descriptor at {addr:#x}")]
    WritableDescriptor {
        /// Its address.
        addr: u64,
    },
    /// A buffer outside guest memory.
    #[error("TX buffer {addr:#x}+{len} is outside guest memory")]
    OutsideMemory {
        /// Its address.
        addr: u64,
        /// Its length.
        len: usize,
    },
}

/// Copies the frame in a TX chain (after the `hdr_len`-byte virtio-net header, whose content is
/// ignored: no offload is offered) into `out`.
pub fn read_tx_frame(
    chain: DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
    hdr_len: usize,
    out: &mut Vec<u8>,
) -> Result<(), TxError> {
    out.clear();
    let max = hdr_len + MAX_FRAME_LEN;
    let mut total = 0usize;
    let mut skip = hdr_len;
    for desc in chain {
        if desc.is_write_only() {
            return Err(TxError::WritableDescriptor {
                addr: desc.addr().raw_value(),
            });
        }
        let len = desc.len() as usize;
        total = total.saturating_add(len);
        if total > max {
            return Err(TxError::TooLong { len: total, max });
        }
        let skipped = skip.min(len);
        skip -= skipped;
        let (addr, len) = (desc.addr().checked_add(skipped as u64), len - skipped);
        if len == 0 {
            continue;
        }
        let outside = || TxError::OutsideMemory {
            addr: desc.addr().raw_value(),
            len: desc.len() as usize,
        };
        let addr = addr.ok_or_else(outside)?;
        let at = out.len();
        out.resize(at + len, 0);
        mem.read_slice(&mut out[at..], addr)
            .map_err(|_| outside())?;
    }
    if total < hdr_len {
        return Err(TxError::ShorterThanHeader {
            len: total,
            hdr_len,
        });
    }
    Ok(())
}

/// What became of one frame offered to the RX queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxOutcome {
    /// Written into `buffers` descriptor chains (more than one only with MRG_RXBUF).
    Delivered {
        /// Chains used (the header's `num_buffers`).
        buffers: u16,
    },
    /// Not enough receive buffers; nothing consumed except bad chains. `avail_idx` is the
    /// driver's available index that was seen: only buffers added past it can help.
    NoBuffers {
        /// The available index seen.
        avail_idx: u16,
    },
    /// The frame does not fit a single chain and MRG_RXBUF was not negotiated: drop it.
    TooBig,
    /// Guest memory could not be written (it changed under us): the chains were returned with
    /// length 0 and the frame is lost.
    WriteFailed,
}

/// Result of [`write_rx_frame`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxWrite {
    /// What became of the frame.
    pub outcome: RxOutcome,
    /// Unusable chains found on the way, returned to the guest with length 0.
    pub bad_chains: u32,
}

/// A usable RX chain: its head and the guest buffers to fill, in order.
struct RxChain {
    head: u16,
    segments: Vec<(GuestAddress, usize)>,
    capacity: usize,
}

/// Collects the writable buffers of an RX chain, up to `wanted` bytes of capacity. `None` if the
/// chain is unusable: a device-readable descriptor, a buffer outside guest memory, or no
/// capacity at all.
fn collect_rx_chain(
    chain: DescriptorChain<&GuestMemoryMmap>,
    mem: &GuestMemoryMmap,
    wanted: usize,
) -> Option<RxChain> {
    let head = chain.head_index();
    let mut segments = Vec::new();
    let mut capacity = 0usize;
    for desc in chain {
        if !desc.is_write_only() {
            return None;
        }
        let len = desc.len() as usize;
        if len == 0 {
            continue;
        }
        if !GuestMemoryBackend::check_range(mem, desc.addr(), len) {
            return None;
        }
        segments.push((desc.addr(), len));
        capacity += len;
        if capacity >= wanted {
            break;
        }
    }
    (capacity > 0).then_some(RxChain {
        head,
        segments,
        capacity,
    })
}

/// Writes `frame` with its virtio-net header into the RX queue: one chain, or as many as needed
/// with MRG_RXBUF (`num_buffers` set to their number). Bad chains met on the way are returned
/// with length 0 before the frame's chains, so that a driver never mistakes them for part of
/// the frame. When the buffers do not suffice, the good chains taken are given back (the
/// queue's `next_avail` is rewound) and the frame stays with the caller.
///
/// The caller notifies the guest (per batch) and handles errors of the queue itself (ring
/// outside memory, a driver that published more chains than the ring holds).
pub fn write_rx_frame(
    q: &mut Queue,
    mem: &GuestMemoryMmap,
    frame: &[u8],
    net: &NetFeatures,
) -> Result<RxWrite, virtio_queue::Error> {
    let needed = net.hdr_len + frame.len();
    let start = q.next_avail();
    let mut chains: Vec<RxChain> = Vec::new();
    // Bad chains before the first good one are consumed even when the frame cannot be written
    // now (so a ring of only bad chains drains instead of being retried forever); bad chains
    // after it are consumed only with the frame.
    let mut leading_bad: Vec<u16> = Vec::new();
    let mut trailing_bad: Vec<u16> = Vec::new();
    let mut first_good = start;
    let mut capacity = 0usize;
    let mut shortfall = None;
    while capacity < needed {
        let next = match q.iter(mem) {
            Ok(mut iter) => iter.next(),
            Err(e) => {
                q.set_next_avail(start);
                return Err(e);
            }
        };
        let Some(chain) = next else {
            shortfall = Some(RxOutcome::NoBuffers {
                avail_idx: q.next_avail(),
            });
            break;
        };
        let position = q.next_avail().wrapping_sub(1);
        let head = chain.head_index();
        let usable = collect_rx_chain(chain, mem, needed - capacity)
            .filter(|c| !chains.is_empty() || c.capacity >= net.hdr_len);
        match usable {
            Some(c) => {
                if chains.is_empty() {
                    first_good = position;
                }
                capacity += c.capacity;
                chains.push(c);
                if !net.mergeable && capacity < needed {
                    shortfall = Some(RxOutcome::TooBig);
                    break;
                }
            }
            None if chains.is_empty() => leading_bad.push(head),
            None => trailing_bad.push(head),
        }
    }

    if let Some(outcome) = shortfall {
        // Give back the good chains (and any bad ones after them) for a later frame.
        q.set_next_avail(if chains.is_empty() {
            q.next_avail()
        } else {
            first_good
        });
        for &head in &leading_bad {
            q.add_used(mem, head, 0)?;
        }
        return Ok(RxWrite {
            outcome,
            bad_chains: leading_bad.len() as u32,
        });
    }
    for &head in leading_bad.iter().chain(&trailing_bad) {
        q.add_used(mem, head, 0)?;
    }
    let bad_chains = (leading_bad.len() + trailing_bad.len()) as u32;

    let buffers = chains.len() as u16;
    let mut header = [0u8; NET_HDR_LEN];
    if net.hdr_len == NET_HDR_LEN {
        header[NUM_BUFFERS_OFFSET..].copy_from_slice(&buffers.to_le_bytes());
    }
    let mut data = ScatterSource::new(&header[..net.hdr_len], frame);
    let mut written: Vec<u32> = Vec::with_capacity(chains.len());
    let mut failed = false;
    for chain in &chains {
        let mut in_chain = 0usize;
        for &(addr, len) in &chain.segments {
            match data.write_into(mem, addr, len) {
                Ok(n) => in_chain += n,
                Err(e) => {
                    debug!("RX write to {:#x}+{len} failed: {e}", addr.raw_value());
                    failed = true;
                }
            }
        }
        written.push(in_chain as u32);
    }
    for (chain, len) in chains.iter().zip(written) {
        q.add_used(mem, chain.head, if failed { 0 } else { len })?;
    }
    Ok(RxWrite {
        outcome: if failed {
            RxOutcome::WriteFailed
        } else {
            RxOutcome::Delivered { buffers }
        },
        bad_chains,
    })
}

/// The bytes of header then frame, written out piece by piece into guest buffers.
struct ScatterSource<'a> {
    pieces: [&'a [u8]; 2],
    piece: usize,
    offset: usize,
}

impl<'a> ScatterSource<'a> {
    fn new(header: &'a [u8], frame: &'a [u8]) -> Self {
        ScatterSource {
            pieces: [header, frame],
            piece: 0,
            offset: 0,
        }
    }

    /// Writes up to `len` further bytes at `addr`; returns how many were written.
    fn write_into(
        &mut self,
        mem: &GuestMemoryMmap,
        addr: GuestAddress,
        len: usize,
    ) -> Result<usize, vm_memory::GuestMemoryError> {
        let mut done = 0usize;
        while done < len {
            let Some(piece) = self.pieces.get(self.piece) else {
                break;
            };
            let rest = piece.get(self.offset..).unwrap_or_default();
            if rest.is_empty() {
                self.piece += 1;
                self.offset = 0;
                continue;
            }
            let n = rest.len().min(len - done);
            let at = addr
                .checked_add(done as u64)
                .ok_or(vm_memory::GuestMemoryError::InvalidGuestAddress(addr))?;
            mem.write_slice(&rest[..n], at)?;
            done += n;
            self.offset += n;
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests;
