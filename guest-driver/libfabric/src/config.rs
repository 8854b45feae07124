//! The provider's environment variables (read when an object is created; getinfo reads only
//! the sizes, never connects).

use std::path::PathBuf;

/// Largest message (`ep_attr->max_msg_size`), and the size of every receive bounce buffer.
pub const DEFAULT_MAX_MSG_SIZE: usize = 64 << 10;
/// Largest `FI_SVNIC_MAX_MSG_SIZE`.
pub const LARGEST_MAX_MSG_SIZE: usize = 1 << 20;
/// Receive bounce buffers posted in every channel.
pub const DEFAULT_RX_BUFFERS: usize = 16;
/// Send staging slots in every channel (one per DMA-data send in flight).
pub const DEFAULT_TX_BUFFERS: usize = 15;
/// Slots per ring of every channel.
pub const RING_SIZE: u32 = 256;
/// Guest memory of the host-process guest, in MiB.
pub const DEFAULT_MEMORY_MIB: u64 = 64;
/// Empty CQ reads in a row after which each empty read yields the CPU.
pub const DEFAULT_YIELD_AFTER: u32 = 16;
/// How long receives may wait with nothing arriving before the endpoint probes its peers.
pub const DEFAULT_PEER_TIMEOUT_MS: u64 = 1000;
/// Endpoint ids tried, from 1, when `FI_SVNIC_ENDPOINT` is not set.
pub const ENDPOINT_SEARCH: u32 = 64;

/// The configuration of one process.
#[derive(Debug, Clone)]
pub struct Config {
    /// `FI_SVNIC_SOCKET`: the vhost-user socket of the host-process guest.
    pub socket: Option<PathBuf>,
    /// `FI_SVNIC_AGENT`: the guest agent's socket (VM mode).
    pub agent: Option<PathBuf>,
    /// `FI_SVNIC_ENDPOINT`: the endpoint id of the (first) endpoint; else the first free one.
    pub endpoint: Option<u32>,
    /// `FI_SVNIC_MAX_MSG_SIZE` (bytes, 41..=1 MiB).
    pub max_msg_size: usize,
    /// `FI_SVNIC_RX_BUFFERS` (1..=256).
    pub rx_buffers: usize,
    /// `FI_SVNIC_TX_BUFFERS` (1..=256).
    pub tx_buffers: usize,
    /// `FI_SVNIC_MEMORY_MIB` (16..=4096).
    pub memory_mib: u64,
    /// `FI_SVNIC_YIELD_AFTER`: empty CQ reads in a row before each further one yields the CPU
    /// (0: never yield).
    pub yield_after: u32,
    /// `FI_SVNIC_PEER_TIMEOUT_MS`: receives waiting this long with nothing arriving make the
    /// endpoint probe the peers it sent to (0: never).
    pub peer_timeout_ms: u64,
    /// `FI_SVNIC_RXD` (0 or 1): offer the DGRAM core to libfabric's ofi_rxd utility provider,
    /// which then lists `svnic;ofi_rxd` (ahead of the native RDM endpoint: libfabric orders
    /// built-in providers before external ones).
    pub rxd: bool,
}

fn var<T: std::str::FromStr + PartialOrd>(name: &str, default: T, lo: T, hi: T) -> T {
    match std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<T>().ok())
    {
        Some(v) if v >= lo && v <= hi => v,
        Some(_) => {
            log::warn!("svnic provider: {name} out of range; using the default");
            default
        }
        None => default,
    }
}

impl Config {
    /// Bytes of each bounce buffer and staging slot: `max_msg_size`, plus room for the RDM
    /// header.
    pub fn slot_len(&self, rdm: bool) -> usize {
        self.max_msg_size + if rdm { crate::rdm::SLOT_EXTRA } else { 0 }
    }

    /// The bounce buffers and staging slots an endpoint has in a data area of `data_len`
    /// bytes: as many of the configured ones as fit, bounce buffers first (and room for one
    /// staging slot).
    pub fn buffers(&self, rdm: bool, data_len: u64) -> (u64, u64) {
        let slots = data_len / self.slot_len(rdm) as u64;
        let rx = (self.rx_buffers as u64).min(slots.saturating_sub(1));
        let tx = (self.tx_buffers as u64).min(slots.saturating_sub(rx));
        (rx, tx)
    }

    /// The RDM `max_msg_size`, which `fi_getinfo` advertises and every RDM endpoint offers: a
    /// part of `max_msg_size` bytes per staging slot, at most `rdm::MAX_PARTS`, with the
    /// staging slots that fit in the channel region this configuration asks for.
    pub fn rdm_max_msg_size(&self) -> usize {
        let data_len = svnic_channels::layout::ChannelLayout::new(RING_SIZE, self.region_len())
            .map_or(0, |l| l.data_len());
        let (_, tx) = self.buffers(true, data_len);
        self.max_msg_size * crate::rdm::MAX_PARTS.min(tx as usize).max(1)
    }

    /// Reads the environment.
    pub fn from_env() -> Config {
        Config {
            rxd: var("FI_SVNIC_RXD", 0u8, 0, 1) == 1,
            socket: std::env::var_os("FI_SVNIC_SOCKET")
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
            agent: std::env::var_os("FI_SVNIC_AGENT")
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
            endpoint: std::env::var("FI_SVNIC_ENDPOINT")
                .ok()
                .and_then(|v| v.trim().parse().ok()),
            max_msg_size: var(
                "FI_SVNIC_MAX_MSG_SIZE",
                DEFAULT_MAX_MSG_SIZE,
                41,
                LARGEST_MAX_MSG_SIZE,
            ),
            rx_buffers: var("FI_SVNIC_RX_BUFFERS", DEFAULT_RX_BUFFERS, 1, 256),
            tx_buffers: var("FI_SVNIC_TX_BUFFERS", DEFAULT_TX_BUFFERS, 1, 256),
            memory_mib: var("FI_SVNIC_MEMORY_MIB", DEFAULT_MEMORY_MIB, 16, 4096),
            yield_after: var("FI_SVNIC_YIELD_AFTER", DEFAULT_YIELD_AFTER, 0, u32::MAX),
            peer_timeout_ms: var(
                "FI_SVNIC_PEER_TIMEOUT_MS",
                DEFAULT_PEER_TIMEOUT_MS,
                0,
                3_600_000,
            ),
        }
    }

    /// The channel region: room for the header and rings (64 KiB is more than 256-slot rings
    /// need) plus every bounce buffer and staging slot, rounded up to 2 MiB.
    pub fn region_len(&self) -> u64 {
        let data = (self.rx_buffers + self.tx_buffers) as u64 * self.max_msg_size as u64;
        let need = data + (64 << 10);
        need.div_ceil(2 << 20) * (2 << 20)
    }
}
