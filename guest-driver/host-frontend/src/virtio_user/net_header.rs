//! The 12-byte `struct virtio_net_hdr` (virtio 1.2, 5.1.6 "Device Operation"): with
//! VIRTIO_F_VERSION_1 it always includes `num_buffers`, whether or not MRG_RXBUF is negotiated.
//!
//! ```text
//! 0 flags u8 | 1 gso_type u8 | 2 hdr_len le16 | 4 gso_size le16 | 6 csum_start le16
//! 8 csum_offset le16 | 10 num_buffers le16
//! ```

/// Length of the header that precedes every frame in a virtio-net buffer.
pub const NET_HDR_LEN: usize = 12;

/// Offset of `num_buffers`.
const NUM_BUFFERS: usize = 10;

/// The header of a transmitted frame (5.1.6.2 "Packet Transmission"): no checksum offload
/// (flags 0), VIRTIO_NET_HDR_GSO_NONE, and `num_buffers` 0 as the driver must set it.
pub const TX_HEADER: [u8; NET_HDR_LEN] = [0; NET_HDR_LEN];

/// `num_buffers` of a received header (5.1.6.4 "Processing of Incoming Packets"): how many
/// descriptors the frame spans with MRG_RXBUF. `hdr` must hold at least [`NET_HDR_LEN`] bytes;
/// a shorter slice reads as 0 (which callers reject).
pub fn num_buffers(hdr: &[u8]) -> u16 {
    match hdr.get(NUM_BUFFERS..NUM_BUFFERS + 2) {
        Some(b) => u16::from_le_bytes([b[0], b[1]]),
        None => 0,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn num_buffers_is_little_endian_at_offset_10() {
        let mut h = [0u8; NET_HDR_LEN];
        h[10] = 3;
        h[11] = 1;
        assert_eq!(num_buffers(&h), 259);
        assert_eq!(num_buffers(&h[..11]), 0);
    }
}
