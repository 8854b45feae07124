//! The L2 switch between guest ports.
//!
//! Frames from a port's TX queue ([`Switch::forward`]):
//! 1. svnic EtherType, directly or behind VLAN tags (`claims_svnic`): handed to
//!    [`PortEvents::svnic_frame`] with the port it came in on, never switched;
//! 2. shorter than an Ethernet header or longer than [`MAX_FRAME_LEN`]: dropped (malformed);
//! 3. source MAC not owned by the port: dropped (spoofed);
//! 4. broadcast / multicast: queued for every other port whose link is up (ports that are down
//!    are skipped, not counted), and the uplink;
//! 5. unicast to a MAC owned by another port: queued for that port (dropped if it is down);
//!    to one of the sender's own MACs: dropped (looped);
//! 6. unknown unicast: to the uplink if there is one, otherwise dropped.
//!
//! Every drop is counted on the port that caused it: the sender for 2, 3, 5 (looped) and 6, the
//! receiver for a full RX queue or a down link.
//!
//! Frames from the uplink ([`Switch::from_uplink`]) are as untrusted as guests' frames, and go
//! only to local ports: svnic frames are refused (the uplink hands them to the engine, never to
//! the switch); malformed ones, and those whose source MAC is a local guest's (spoofed) or a
//! group address, are dropped; broadcast / multicast go to every port whose link is up; unicast
//! to its owner; others (the wire carries every host's traffic) are not for this host. The
//! caller counts the outcome.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use log::debug;
use svnic_channels::frame::{claims_svnic, Frame, FrameBody};
use svnic_channels::MacAddr;
use thiserror::Error;

use super::frame_pool::{FramePool, PooledFrame};
use super::port::{EngineQueued, PortCounters, PortEvents, PortId, PortStats, SwitchPort};
use super::virtio_net::MAX_FRAME_LEN;
use crate::debug_fields::debug_fields;
use crate::uplink::{Ingress, LocalPorts};

/// Length of an Ethernet header (destination, source, EtherType).
const ETH_HEADER_LEN: usize = 14;

/// Where frames go that no local port takes (unknown unicast) and where broadcasts also go. Not
/// implemented yet; the daemon sets one with [`Switch::set_uplink`] when it has a wire.
pub trait Uplink: Send + Sync {
    /// Sends `frame` (from port `from`) on the wire. False if it was dropped.
    fn transmit(&self, from: PortId, frame: &[u8]) -> bool;
}

/// Tunables of a switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchConfig {
    /// Switched frames a port's RX queue holds while its guest has no receive buffers.
    pub rx_queue_frames: usize,
    /// Engine frames (control responses, wakes) a port's reserved queue holds; see
    /// [`Switch::inject`]. The default leaves room for a pending wake on each channel of the
    /// default quota, plus responses.
    pub engine_queue_frames: usize,
    /// Free frame buffers kept for reuse.
    pub pooled_buffers: usize,
}

impl Default for SwitchConfig {
    fn default() -> Self {
        SwitchConfig {
            rx_queue_frames: 1024,
            engine_queue_frames: 128,
            pooled_buffers: 4096,
        }
    }
}

/// Why a port could not be added.
#[derive(Debug, Error)]
pub enum SwitchError {
    /// The port id is taken.
    #[error("{0} already has a switch port")]
    DuplicatePort(PortId),
    /// A MAC is owned by another port.
    #[error("MAC {mac} requested for {port} is already owned by {owner}")]
    MacInUse {
        /// The MAC.
        mac: MacAddr,
        /// The port asking for it.
        port: PortId,
        /// Its owner.
        owner: PortId,
    },
    /// A port needs at least one MAC.
    #[error("{0}: a port needs at least one MAC address")]
    NoMac(PortId),
    /// Only individual, non-zero addresses can be owned.
    #[error("{port}: {mac} is not a unicast address and cannot be owned")]
    NotUnicast {
        /// The port.
        port: PortId,
        /// The MAC.
        mac: MacAddr,
    },
    /// The port's wake eventfd could not be created.
    #[error("{port}: cannot create the wake eventfd: {source}")]
    WakeFd {
        /// The port.
        port: PortId,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

#[derive(Default)]
struct Tables {
    ports: HashMap<PortId, Arc<SwitchPort>>,
    by_mac: HashMap<MacAddr, PortId>,
    uplink: Option<Arc<dyn Uplink>>,
}

/// The switch. Shared (`Arc`) by every port's device, the listeners and the daemon.
pub struct Switch {
    config: SwitchConfig,
    events: Arc<dyn PortEvents>,
    pool: Arc<FramePool>,
    tables: RwLock<Tables>,
}

debug_fields!(Switch, |s| config: s.config, ports: s.read().ports.len());

impl Switch {
    /// A switch with no ports. `events` receives every port's svnic frames, memory and link
    /// changes.
    pub fn new(events: Arc<dyn PortEvents>, config: SwitchConfig) -> Arc<Self> {
        Arc::new(Switch {
            config,
            events,
            pool: FramePool::new(config.pooled_buffers, 2048),
            tables: RwLock::new(Tables::default()),
        })
    }

    /// The daemon's event sink.
    pub fn events(&self) -> &Arc<dyn PortEvents> {
        &self.events
    }

    /// The tunables in force.
    pub fn config(&self) -> SwitchConfig {
        self.config
    }

    fn read(&self) -> RwLockReadGuard<'_, Tables> {
        self.tables.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Tables> {
        self.tables.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a port owning `macs` (from the guest's policy; the first is reported in the device's
    /// config space). Its link is down until a frontend connects and starts the device.
    pub fn add_port(&self, id: PortId, macs: &[MacAddr]) -> Result<Arc<SwitchPort>, SwitchError> {
        if macs.is_empty() {
            return Err(SwitchError::NoMac(id));
        }
        if let Some(&mac) = macs.iter().find(|m| !m.is_unicast()) {
            return Err(SwitchError::NotUnicast { port: id, mac });
        }
        let mut t = self.write();
        if t.ports.contains_key(&id) {
            return Err(SwitchError::DuplicatePort(id));
        }
        for &mac in macs {
            if let Some(&owner) = t.by_mac.get(&mac) {
                return Err(SwitchError::MacInUse {
                    mac,
                    port: id,
                    owner,
                });
            }
        }
        let mut owned = macs.to_vec();
        owned.dedup();
        let port = Arc::new(
            SwitchPort::new(
                id,
                owned,
                self.config.rx_queue_frames,
                self.config.engine_queue_frames,
            )
            .map_err(|source| SwitchError::WakeFd { port: id, source })?,
        );
        for &mac in macs {
            t.by_mac.insert(mac, id);
        }
        t.ports.insert(id, Arc::clone(&port));
        svnic_control_plane::log_limited!(
            log::Level::Info,
            "switch: {id} added with MAC(s) {macs:?}"
        );
        Ok(port)
    }

    /// Removes a port; its MACs become unknown. False if there was no such port. A device still
    /// serving it keeps working on its own queues but receives nothing more.
    pub fn remove_port(&self, id: PortId) -> bool {
        let mut t = self.write();
        let Some(port) = t.ports.remove(&id) else {
            return false;
        };
        for mac in port.macs() {
            t.by_mac.remove(mac);
        }
        port.set_up(false);
        svnic_control_plane::log_limited!(log::Level::Info, "switch: {id} removed");
        true
    }

    /// The port with this id.
    pub fn port(&self, id: PortId) -> Option<Arc<SwitchPort>> {
        self.read().ports.get(&id).cloned()
    }

    /// Sets (or clears) the uplink.
    pub fn set_uplink(&self, uplink: Option<Arc<dyn Uplink>>) {
        self.write().uplink = uplink;
    }

    /// Snapshots of every port, ordered by id.
    pub fn stats(&self) -> Vec<PortStats> {
        let mut v: Vec<PortStats> = self.read().ports.values().map(|p| p.stats()).collect();
        v.sort_by_key(|s| s.port);
        v
    }

    /// An empty pooled frame buffer, for a device to copy a TX frame into.
    pub fn alloc_frame(&self) -> PooledFrame {
        self.pool.take()
    }

    /// Sends `frame` into port `port`'s RX: engine-originated control responses and wake frames.
    /// They go to the port's reserved engine queue, which the device drains before switched
    /// traffic and which switched traffic cannot fill; a wake for a channel that already has one
    /// waiting is coalesced into it. True if queued or coalesced; false if there is no such port,
    /// its link is down or its reserved queue is full (the last two counted on the port), or the
    /// frame is not a plausible Ethernet frame.
    pub fn inject(&self, port: PortId, frame: &[u8]) -> bool {
        if frame.len() < ETH_HEADER_LEN || frame.len() > MAX_FRAME_LEN {
            debug!("switch: inject of a {}-byte frame refused", frame.len());
            return false;
        }
        let Some(target) = self.port(port) else {
            return false;
        };
        let wake = match Frame::decode(frame) {
            Ok(Frame {
                body: FrameBody::Wake { channel },
                ..
            }) => Some(channel),
            _ => None,
        };
        let mut buf = self.pool.take();
        buf.buf_mut().extend_from_slice(frame);
        target.enqueue_engine(Arc::new(buf), wake) != EngineQueued::Refused
    }

    /// True if a local guest's port owns `mac`.
    pub fn owns(&self, mac: MacAddr) -> bool {
        self.read().by_mac.contains_key(&mac)
    }

    /// Switches a frame that came in on the uplink (see the module documentation for the rules).
    pub fn from_uplink(&self, frame: &[u8]) -> Ingress {
        if frame.len() < ETH_HEADER_LEN || frame.len() > MAX_FRAME_LEN {
            return Ingress::Malformed;
        }
        if claims_svnic(frame) {
            return Ingress::Svnic;
        }
        let (dst, src) = (mac_at(frame, 0), mac_at(frame, 6));
        if src.is_multicast() {
            return Ingress::Malformed;
        }
        let t = self.read();
        if t.by_mac.contains_key(&src) {
            return Ingress::Spoofed;
        }
        let copy = || {
            let mut buf = self.pool.take();
            buf.buf_mut().extend_from_slice(frame);
            Arc::new(buf)
        };
        if dst.is_multicast() {
            let shared = copy();
            let mut n = 0;
            for port in t.ports.values().filter(|p| p.is_up()) {
                n += usize::from(port.enqueue(Arc::clone(&shared)));
            }
            return Ingress::Delivered(n);
        }
        match t.by_mac.get(&dst).and_then(|id| t.ports.get(id)) {
            Some(port) if port.enqueue(copy()) => Ingress::Delivered(1),
            Some(_) => Ingress::Refused,
            None => Ingress::NotLocal,
        }
    }

    /// Switches a frame the guest of `from` sent (see the module documentation for the rules).
    pub fn forward(&self, from: &SwitchPort, frame: PooledFrame) {
        let c = &from.counters;
        PortCounters::inc(&c.traffic.tx_frames);
        PortCounters::add(&c.traffic.tx_bytes, frame.len() as u64);

        if claims_svnic(&frame) {
            PortCounters::inc(&c.traffic.to_engine);
            self.events.svnic_frame(from.id(), &frame);
            return;
        }
        if frame.len() < ETH_HEADER_LEN || frame.len() > MAX_FRAME_LEN {
            PortCounters::inc(&c.drops.malformed);
            return;
        }
        let (dst, src) = (mac_at(&frame, 0), mac_at(&frame, 6));
        if !from.owns(src) {
            PortCounters::inc(&c.drops.spoofed);
            return;
        }

        let frame = Arc::new(frame);
        let t = self.read();
        if dst.is_multicast() {
            for port in t
                .ports
                .values()
                .filter(|p| p.id() != from.id() && p.is_up())
            {
                port.enqueue(Arc::clone(&frame));
            }
            if let Some(uplink) = &t.uplink {
                if uplink.transmit(from.id(), &frame) {
                    PortCounters::inc(&c.traffic.to_uplink);
                }
            }
            return;
        }
        match t.by_mac.get(&dst).and_then(|id| t.ports.get(id)) {
            Some(port) if port.id() == from.id() => PortCounters::inc(&c.drops.looped),
            Some(port) => {
                port.enqueue(frame);
            }
            None => match &t.uplink {
                Some(uplink) if uplink.transmit(from.id(), &frame) => {
                    PortCounters::inc(&c.traffic.to_uplink)
                }
                _ => PortCounters::inc(&c.drops.unknown_unicast),
            },
        }
    }
}

impl LocalPorts for Switch {
    fn deliver(&self, frame: &[u8]) -> Ingress {
        self.from_uplink(frame)
    }

    fn owns(&self, mac: MacAddr) -> bool {
        Switch::owns(self, mac)
    }
}

fn mac_at(frame: &[u8], at: usize) -> MacAddr {
    let mut mac = [0u8; 6];
    if let Some(bytes) = frame.get(at..at + 6) {
        mac.copy_from_slice(bytes);
    }
    MacAddr(mac)
}

#[cfg(test)]
mod tests;
