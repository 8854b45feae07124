//! The vhost-user conversation that turns a backend socket into a running virtio-net device:
//! ownership, feature negotiation, config space, memory table, and the two vrings.
//!
//! Every request names itself in the error when it fails. When the backend offers REPLY_ACK,
//! every request is sent with NEED_REPLY, so that a request the backend refuses fails at that
//! step instead of silently.

use std::path::Path;

use svnic_channels::MacAddr;
use vhost::vhost_user::message::{VhostUserConfigFlags, VhostUserHeaderFlag};
use vhost::vhost_user::{Frontend, VhostUserFrontend, VhostUserProtocolFeatures};
use vhost::{VhostBackend, VringConfigData};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_MAC, VIRTIO_NET_F_MRG_RXBUF, VIRTIO_NET_F_STATUS, VIRTIO_NET_S_LINK_UP,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

use super::error::VirtioUserError;
use super::memory::MemfdMemory;
use super::notifier::{QueueEventFds, RX_QUEUE, TX_QUEUE};
use super::split_ring::RingLayout;

/// VHOST_USER_F_PROTOCOL_FEATURES (bit 30): the backend speaks the protocol-feature extensions
/// (and rings start disabled until SET_VRING_ENABLE).
pub const VHOST_USER_F_PROTOCOL_FEATURES: u64 = 1 << 30;

/// Virtio features this driver asks for, by name, when the backend offers them.
pub const WANTED_FEATURES: [(&str, u64); 6] = [
    ("VIRTIO_F_VERSION_1", 1 << VIRTIO_F_VERSION_1),
    ("VIRTIO_NET_F_MAC", 1 << VIRTIO_NET_F_MAC),
    ("VIRTIO_NET_F_STATUS", 1 << VIRTIO_NET_F_STATUS),
    ("VIRTIO_RING_F_EVENT_IDX", 1 << VIRTIO_RING_F_EVENT_IDX),
    ("VIRTIO_NET_F_MRG_RXBUF", 1 << VIRTIO_NET_F_MRG_RXBUF),
    (
        "VHOST_USER_F_PROTOCOL_FEATURES",
        VHOST_USER_F_PROTOCOL_FEATURES,
    ),
];

/// Features without which this driver cannot work: the 1.x header layout, a MAC to source
/// control frames from, and the protocol features (for GET_CONFIG and SET_VRING_ENABLE).
pub const REQUIRED_FEATURES: u64 =
    (1 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_NET_F_MAC) | VHOST_USER_F_PROTOCOL_FEATURES;

/// What was agreed with the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// Acknowledged virtio features (a subset of [`WANTED_FEATURES`]).
    pub features: u64,
    /// The device's MAC address (from config space).
    pub mac: MacAddr,
    /// Link state from config space, if VIRTIO_NET_F_STATUS was negotiated.
    pub link_up: Option<bool>,
    /// Acknowledged vhost-user protocol features.
    pub protocol: VhostUserProtocolFeatures,
}

impl Negotiated {
    /// True if `bit` (a feature bit number) was negotiated.
    pub fn has(&self, bit: u32) -> bool {
        self.features & (1u64 << bit) != 0
    }
}

fn step(step: &'static str) -> impl FnOnce(vhost::Error) -> VirtioUserError {
    move |source| VirtioUserError::Setup { step, source }
}

/// Connects to the backend's vhost-user socket (two queues: RX and TX).
pub fn connect(socket_path: &Path) -> Result<Frontend, VirtioUserError> {
    Frontend::connect(socket_path, 2).map_err(step("connect"))
}

/// SET_OWNER, feature and protocol-feature negotiation, and the MAC (and link state) from
/// config space (virtio 1.2, 5.1.4 "Device configuration layout": mac at 0, status at 6).
pub fn negotiate(fe: &mut Frontend) -> Result<Negotiated, VirtioUserError> {
    negotiate_with(fe, VhostUserProtocolFeatures::empty())
}

/// [`negotiate`], also acknowledging those of `extra_protocol` the backend offers (protocol
/// features this driver does not use itself, such as RESET_DEVICE for a caller that resets).
pub fn negotiate_with(
    fe: &mut Frontend,
    extra_protocol: VhostUserProtocolFeatures,
) -> Result<Negotiated, VirtioUserError> {
    fe.set_owner().map_err(step("SET_OWNER"))?;
    let offered = fe.get_features().map_err(step("GET_FEATURES"))?;
    let missing: Vec<&str> = WANTED_FEATURES
        .iter()
        .filter(|(_, bit)| REQUIRED_FEATURES & bit != 0 && offered & bit == 0)
        .map(|(name, _)| *name)
        .collect();
    if !missing.is_empty() {
        return Err(VirtioUserError::MissingFeatures {
            missing: missing.join(", "),
            offered,
        });
    }
    let proto_offered = fe
        .get_protocol_features()
        .map_err(step("GET_PROTOCOL_FEATURES"))?;
    if !proto_offered.contains(VhostUserProtocolFeatures::CONFIG) {
        return Err(VirtioUserError::MissingProtocolFeature {
            name: "CONFIG",
            offered: proto_offered.bits(),
        });
    }
    let proto = proto_offered
        & (VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::REPLY_ACK
            | extra_protocol);
    fe.set_protocol_features(proto)
        .map_err(step("SET_PROTOCOL_FEATURES"))?;
    if proto.contains(VhostUserProtocolFeatures::REPLY_ACK) {
        fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    }
    let wanted: u64 = WANTED_FEATURES.iter().map(|(_, bit)| bit).sum();
    let features = offered & wanted;
    fe.set_features(features).map_err(step("SET_FEATURES"))?;

    let status = features & (1 << VIRTIO_NET_F_STATUS) != 0;
    let size: u32 = if status { 8 } else { 6 };
    let (_, config) = fe
        .get_config(
            0,
            size,
            VhostUserConfigFlags::empty(),
            &vec![0u8; size as usize],
        )
        .map_err(step("GET_CONFIG"))?;
    let (Some(mac_bytes), status_word) = (config.get(0..6), config.get(6..8)) else {
        return Err(VirtioUserError::BadConfig(format!(
            "{} bytes of config space, expected at least 6",
            config.len()
        )));
    };
    let mut mac = [0u8; 6];
    mac.copy_from_slice(mac_bytes);
    let mac = MacAddr(mac);
    if !mac.is_unicast() {
        return Err(VirtioUserError::BadMac(mac));
    }
    let link_up = match (status, status_word) {
        (true, Some(s)) => {
            Some(u16::from_le_bytes([s[0], s[1]]) & VIRTIO_NET_S_LINK_UP as u16 != 0)
        }
        _ => None,
    };
    Ok(Negotiated {
        features,
        mac,
        link_up,
        protocol: proto,
    })
}

/// SET_MEM_TABLE with the memfd, then [`start_queue`] for RX and TX from index 0.
pub fn start_queues(
    fe: &mut Frontend,
    memory: &MemfdMemory,
    rx: RingLayout,
    tx: RingLayout,
    fds: &QueueEventFds,
) -> Result<(), VirtioUserError> {
    set_mem_table(fe, memory)?;
    for (index, layout) in [(RX_QUEUE, rx), (TX_QUEUE, tx)] {
        start_queue(fe, memory, index, layout, 0, fds)?;
    }
    Ok(())
}

/// SET_MEM_TABLE: the whole memfd as one region.
pub fn set_mem_table(fe: &mut Frontend, memory: &MemfdMemory) -> Result<(), VirtioUserError> {
    let region = memory.vhost_region()?;
    fe.set_mem_table(&[region]).map_err(step("SET_MEM_TABLE"))?;
    Ok(())
}

/// Names of the requests of [`start_queue`], per queue index, for errors.
const QUEUE_STEPS: [[&str; 6]; 2] = [
    [
        "SET_VRING_NUM (RX)",
        "SET_VRING_BASE (RX)",
        "SET_VRING_ADDR (RX)",
        "SET_VRING_KICK (RX)",
        "SET_VRING_CALL (RX)",
        "SET_VRING_ENABLE (RX)",
    ],
    [
        "SET_VRING_NUM (TX)",
        "SET_VRING_BASE (TX)",
        "SET_VRING_ADDR (TX)",
        "SET_VRING_KICK (TX)",
        "SET_VRING_CALL (TX)",
        "SET_VRING_ENABLE (TX)",
    ],
];

/// Starts queue `index` (RX or TX) at `base`: SET_VRING_NUM, SET_VRING_BASE(`base`),
/// SET_VRING_ADDR (addresses in this process's mapping, as vhost-user wants), SET_VRING_KICK,
/// SET_VRING_CALL, SET_VRING_ENABLE(1). `base` is 0 for a fresh ring, or what GET_VRING_BASE
/// returned when the device stopped it: the device then goes on from that avail index, over the
/// same ring memory and the same [`SplitRing`](super::SplitRing) state. The memory table must
/// have been sent.
pub fn start_queue(
    fe: &mut Frontend,
    memory: &MemfdMemory,
    index: usize,
    layout: RingLayout,
    base: u16,
    fds: &QueueEventFds,
) -> Result<(), VirtioUserError> {
    let (Some(steps), Some(kick_fd), Some(call_fd)) = (
        QUEUE_STEPS.get(index),
        fds.kick.get(index),
        fds.call.get(index),
    ) else {
        return Err(VirtioUserError::BadQueueIndex(index));
    };
    let [num, base_step, addr, kick, call, enable] = *steps;
    fe.set_vring_num(index, layout.size).map_err(step(num))?;
    fe.set_vring_base(index, base).map_err(step(base_step))?;
    let config = VringConfigData {
        queue_max_size: layout.size,
        queue_size: layout.size,
        flags: 0,
        desc_table_addr: memory.host_address(layout.desc)?,
        used_ring_addr: memory.host_address(layout.used)?,
        avail_ring_addr: memory.host_address(layout.avail)?,
        log_addr: None,
    };
    fe.set_vring_addr(index, &config).map_err(step(addr))?;
    fe.set_vring_kick(index, kick_fd).map_err(step(kick))?;
    fe.set_vring_call(index, call_fd).map_err(step(call))?;
    fe.set_vring_enable(index, true).map_err(step(enable))?;
    Ok(())
}
