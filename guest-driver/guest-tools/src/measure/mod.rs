//! Measurement tools shared by `svnic-guest ping/perf` and `svnic demo`: round trips and
//! streaming over a bypass channel (user-data or DMA-data) and over plain virtio-net frames.
//!
//! Each measurement has two halves (initiator and echo / sender and receiver) that run in
//! different guests (threads of one process in host-process mode, or two VMs). Since the halves
//! start independently, initiators probe first ([`channel_probe`], [`frame_probe`],
//! [`udp_probe`]); responders answer probes and never count them.
//!
//! Paths: a channel (user-data or DMA-data: [`channel_ping`], [`channel_stream_send`],
//! [`channel_dma_stream_send`]), virtio-net frames ([`frame_ping`]: the host-process NIC, or a
//! raw packet socket on the guest kernel's NIC), and kernel UDP sockets ([`udp_ping`], for the
//! VM comparison).

mod channel_bench;
mod dma_stream;
mod error;
mod frame_bench;
mod probe;
mod stats;
mod udp_bench;

pub use channel_bench::{
    channel_echo, channel_ping, channel_ping_local, channel_stream_local, channel_stream_recv,
    channel_stream_send, PingKind,
};
pub use dma_stream::{channel_dma_stream_recv, channel_dma_stream_send};
pub use error::MeasureError;
pub use frame_bench::{
    frame_echo, frame_ping, frame_probe, frame_stream_recv, frame_stream_recv_within,
    frame_stream_send, FramePort, BENCH_ETHERTYPE, PROBE_SEQ,
};
pub use probe::{
    answer_probe, channel_await_probe, channel_probe, is_probe, PROBE_COOKIE, PROBE_PAYLOAD,
};
pub use stats::{LatencyStats, Throughput};
pub use udp_bench::{
    udp_echo, udp_ping, udp_probe, udp_stream_recv, udp_stream_send, MAX_UDP_SIZE, UDP_PROBE_SEQ,
};

impl FramePort for svnic_host_frontend::host_guest::HostGuest {
    type Error = svnic_host_frontend::host_guest::ClientError;

    fn mac(&self) -> svnic_channels::MacAddr {
        svnic_host_frontend::host_guest::HostGuest::mac(self)
    }
    fn send(&mut self, frame: &[u8]) -> Result<bool, Self::Error> {
        self.send_raw(frame)
    }
    fn flush(&mut self) -> Result<(), Self::Error> {
        // send_raw notifies the device itself.
        Ok(())
    }
    fn recv(&mut self, out: &mut Vec<Vec<u8>>) -> Result<usize, Self::Error> {
        self.recv_raw(out, 256)
    }
    fn wait(&mut self, timeout: std::time::Duration) -> Result<(), Self::Error> {
        self.wait_raw(timeout).map(|_| ())
    }
}

/// The guest kernel's NIC through a raw packet socket bound to [`BENCH_ETHERTYPE`]: the
/// virtio-net frame path in a VM (root or CAP_NET_RAW).
impl FramePort for svnic_guestd::nic::PacketSocket {
    type Error = std::io::Error;

    fn mac(&self) -> svnic_channels::MacAddr {
        svnic_guestd::nic::Nic::mac(self)
    }
    fn send(&mut self, frame: &[u8]) -> Result<bool, Self::Error> {
        match svnic_guestd::nic::Nic::send(self, frame) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }
    fn flush(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
    fn recv(&mut self, out: &mut Vec<Vec<u8>>) -> Result<usize, Self::Error> {
        let mut buf = [0u8; 2048];
        let mut n = 0;
        while n < 256 {
            match svnic_guestd::nic::Nic::recv(self, &mut buf)? {
                Some(len) => {
                    out.push(buf[..len].to_vec());
                    n += 1;
                }
                None => break,
            }
        }
        Ok(n)
    }
    fn wait(&mut self, timeout: std::time::Duration) -> Result<(), Self::Error> {
        svnic_client::vm::seqpacket::poll_readable(svnic_guestd::nic::Nic::fd(self), timeout)
            .map(|_| ())
    }
}
