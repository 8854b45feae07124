//! Measurement tools shared by `svnic-guest ping/perf` and `svnic demo`: round trips and
//! streaming over a bypass channel (user-data or DMA-data) and over plain virtio-net frames.
//!
//! Each measurement has two halves (initiator and echo / sender and receiver) that run in
//! different guests (threads of one process in host-process mode, or two VMs).

mod channel_bench;
mod frame_bench;
mod stats;

pub use channel_bench::{
    channel_echo, channel_ping, channel_ping_local, channel_stream_local, channel_stream_recv,
    channel_stream_send, PingKind,
};
pub use frame_bench::{
    frame_echo, frame_ping, frame_stream_recv, frame_stream_send, FramePort, BENCH_ETHERTYPE,
};
pub use stats::{LatencyStats, Throughput};

impl FramePort for crate::control_client::ControlClient {
    type Error = crate::control_client::ClientError;

    fn mac(&self) -> svnic_channels::MacAddr {
        crate::control_client::ControlClient::mac(self)
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
