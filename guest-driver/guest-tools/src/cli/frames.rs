//! The frame path of the tools: the host-process guest's virtio-net device, or (VM mode) a raw
//! packet socket on the guest kernel's svnic NIC.

use std::time::{Duration, Instant};

use svnic_channels::MacAddr;

use super::args::Common;
use super::transport::{Transport, DRAIN_TIMEOUT};
use super::CliError;
use crate::measure::{
    frame_echo, frame_ping, frame_probe, frame_stream_recv_within, frame_stream_send, FramePort,
    LatencyStats, Throughput, BENCH_ETHERTYPE,
};
use svnic_guestd::nic::{find_virtio_nic, PacketSocket};

/// The VM-mode frame port: a raw packet socket on the svnic NIC.
fn packet_port(c: &Common) -> Result<PacketSocket, CliError> {
    let iface = match &c.iface {
        Some(i) => i.clone(),
        None => find_virtio_nic(std::path::Path::new("/sys"))
            .map_err(|e| CliError::failed("find the svnic NIC", e))?,
    };
    PacketSocket::open(&iface, BENCH_ETHERTYPE)
        .map_err(|e| CliError::failed("open a packet socket (needs root)", e))
}

/// Runs `f` on the frame port of the chosen transport.
pub(super) fn with_frame_port<R>(
    c: &Common,
    f: impl FnOnce(&mut dyn FrameRunner) -> Result<R, CliError>,
) -> Result<R, CliError> {
    if c.socket.is_some() {
        let Transport::Host(mut g) = Transport::connect(c)? else {
            return Err(CliError::Usage("host-process mode expected".into()));
        };
        let r = f(&mut g);
        // Let the last frames leave the TX queue before the device goes away with this process.
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        while g.with_net(|n| n.tx_in_flight()).is_ok_and(|n| n > 0) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        r
    } else {
        let mut p = packet_port(c)?;
        f(&mut p)
    }
}

/// The error of a frame measurement over either kind of port: the port's own error.
pub(super) type FrameError = Box<dyn std::error::Error + Send + Sync>;

/// The frame measurements over either kind of port (object safe, unlike [`FramePort`]).
pub(super) trait FrameRunner {
    fn mac(&self) -> MacAddr;
    fn probe(&mut self, peer: MacAddr, within: Duration) -> Result<bool, FrameError>;
    fn ping(
        &mut self,
        peer: MacAddr,
        size: usize,
        count: usize,
    ) -> Result<Option<LatencyStats>, FrameError>;
    fn echo(&mut self, count: usize) -> Result<usize, FrameError>;
    fn send(&mut self, peer: MacAddr, size: usize, count: u64) -> Result<(), FrameError>;
    fn recv(
        &mut self,
        count: u64,
        first: Duration,
        idle: Duration,
    ) -> Result<Throughput, FrameError>;
}

impl<P: FramePort> FrameRunner for P {
    fn mac(&self) -> MacAddr {
        FramePort::mac(self)
    }
    fn probe(&mut self, peer: MacAddr, within: Duration) -> Result<bool, FrameError> {
        frame_probe(self, peer, within).map_err(FrameError::from)
    }
    fn ping(
        &mut self,
        peer: MacAddr,
        size: usize,
        count: usize,
    ) -> Result<Option<LatencyStats>, FrameError> {
        frame_ping(self, peer, size, count).map_err(FrameError::from)
    }
    fn echo(&mut self, count: usize) -> Result<usize, FrameError> {
        frame_echo(self, count).map_err(FrameError::from)
    }
    fn send(&mut self, peer: MacAddr, size: usize, count: u64) -> Result<(), FrameError> {
        frame_stream_send(self, peer, size, count).map_err(FrameError::from)
    }
    fn recv(
        &mut self,
        count: u64,
        first: Duration,
        idle: Duration,
    ) -> Result<Throughput, FrameError> {
        frame_stream_recv_within(self, count, first, idle).map_err(FrameError::from)
    }
}
