//! Channel memory layout, computed by one function ([`ChannelLayout::new`]) that the engine and
//! every client use, so that the two sides cannot disagree.
//!
//! ```text
//! 0x0000  header line    magic, version, ring size, region length, ring/data offsets, fault word,
//!                        serving worker/CPU (engine-written at create)
//! 0x0040  tx_head        guest  -> engine  (guest is the producer of TX)
//! 0x0080  tx_tail        engine -> guest
//! 0x00c0  rx_head        engine -> guest   (engine is the producer of RX)
//! 0x0100  rx_tail        guest  -> engine
//! 0x0140  post_head      guest  -> engine  (guest is the producer of posted buffers)
//! 0x0180  post_tail      engine -> guest
//! 0x01c0  engine_sleeping   engine -> guest: 1 while the serving worker sleeps; ring the doorbell
//! 0x0200  guest_sleeping    guest -> engine: 1 while the guest sleeps; the engine sends a wake
//! 0x1000  TX ring        ring_size * 64 bytes
//!         RX ring        ring_size * 64 bytes
//!         post ring      ring_size * 64 bytes
//!         data area      4 KiB aligned, to the end of the region
//! ```
//!
//! Every index and flag has a 128-byte block (two cache lines) of its own, so that the two sides
//! never write the same line, nor lines that the hardware fetches together: x86 CPUs prefetch the
//! other line of a 128-byte pair along with the one that missed (AMD Zen 3 and Intel alike), and
//! an index sharing a pair with one the other side polls must be fetched back before each write.
//! docs/performance.md (History) has the measurement behind this layout (version 2).
//!
//! Indices are free-running `u32` counters (slot = index & (ring_size - 1)).

use crate::error::LayoutError;
use crate::message::MESSAGE_SIZE;

/// "SVNC" read as a little-endian u32.
pub const CHANNEL_MAGIC: u32 = u32::from_le_bytes(*b"SVNC");
/// Layout version written in the header.
pub const CHANNEL_VERSION: u16 = 2;
/// Smallest ring size.
pub const MIN_RING_SIZE: u32 = 16;
/// Largest ring size.
pub const MAX_RING_SIZE: u32 = 4096;
/// Default ring size (the NFE's 256 slots).
pub const DEFAULT_RING_SIZE: u32 = 256;
/// Default region length (the NFE's 2 MiB per channel; one 2 MiB hugepage in a VM guest).
pub const DEFAULT_REGION_LEN: u64 = 2 << 20;
/// Largest region the ABI allows (policy may allow less).
pub const MAX_REGION_LEN: u64 = 1 << 30;
/// Alignment of region addresses, lengths and of the data area.
pub const PAGE: u64 = 4096;

/// Header field offsets (bytes from the region start).
pub mod header {
    /// u32 magic, [`super::CHANNEL_MAGIC`].
    pub const MAGIC: usize = 0;
    /// u16 version, [`super::CHANNEL_VERSION`].
    pub const VERSION: usize = 4;
    /// u32 ring size (slots in each of the three rings).
    pub const RING_SIZE: usize = 8;
    /// u32 fault word: 0 while healthy, else a [`crate::FaultReason`] code (engine-written).
    pub const FAULT: usize = 12;
    /// u64 region length.
    pub const REGION_LEN: usize = 16;
    /// u64 offset of the data area.
    pub const DATA_OFFSET: usize = 24;
    /// u32 offset of the TX ring.
    pub const TX_RING: usize = 32;
    /// u32 offset of the RX ring.
    pub const RX_RING: usize = 36;
    /// u32 offset of the posted-buffer ring.
    pub const POST_RING: usize = 40;
    /// u32 channel id (engine-written at create).
    pub const CHANNEL_ID: usize = 44;
    /// u32 serving worker index (engine-written at create).
    pub const WORKER: usize = 48;
    /// i32 host CPU of the serving worker, -1 if the worker is not pinned (engine-written).
    pub const CPU: usize = 52;
    /// u32 state word, 1 once the engine has initialised the channel (engine-written, last).
    pub const READY: usize = 56;

    /// u32 TX producer index (guest-written).
    pub const TX_HEAD: usize = 0x80;
    /// u32 TX consumer index (engine-written).
    pub const TX_TAIL: usize = 0x100;
    /// u32 RX producer index (engine-written).
    pub const RX_HEAD: usize = 0x180;
    /// u32 RX consumer index (guest-written).
    pub const RX_TAIL: usize = 0x200;
    /// u32 posted-buffer producer index (guest-written).
    pub const POST_HEAD: usize = 0x280;
    /// u32 posted-buffer consumer index (engine-written).
    pub const POST_TAIL: usize = 0x300;
    /// u32, 1 while the serving worker sleeps (engine-written).
    pub const ENGINE_SLEEPING: usize = 0x380;
    /// u32, 1 while the guest sleeps waiting for RX (guest-written).
    pub const GUEST_SLEEPING: usize = 0x400;
    /// The eight index words, each in a 128-byte block of its own.
    pub const INDICES: [usize; 8] = [
        TX_HEAD,
        TX_TAIL,
        RX_HEAD,
        RX_TAIL,
        POST_HEAD,
        POST_TAIL,
        ENGINE_SLEEPING,
        GUEST_SLEEPING,
    ];
    /// End of the header block; the TX ring starts here.
    pub const END: usize = 0x1000;
}

/// Where each part of a channel region lies. Plain numbers, no memory: cheap to copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelLayout {
    /// Slots per ring (power of two, 16..=4096).
    pub ring_size: u32,
    /// Whole region length.
    pub region_len: u64,
    /// TX ring offset.
    pub tx_ring: usize,
    /// RX ring offset.
    pub rx_ring: usize,
    /// Posted-buffer ring offset.
    pub post_ring: usize,
    /// Data area offset (4 KiB aligned).
    pub data_offset: u64,
}

impl ChannelLayout {
    /// Computes the layout for `ring_size` slots in a region of `region_len` bytes, or says why
    /// that is impossible. The data area may be empty (a channel used only for user-data).
    pub fn new(ring_size: u32, region_len: u64) -> Result<Self, LayoutError> {
        if !ring_size.is_power_of_two() || !(MIN_RING_SIZE..=MAX_RING_SIZE).contains(&ring_size) {
            return Err(LayoutError::BadRingSize(ring_size));
        }
        if region_len % PAGE != 0 {
            return Err(LayoutError::Misaligned(region_len));
        }
        if region_len > MAX_REGION_LEN {
            return Err(LayoutError::RegionTooLarge {
                len: region_len,
                max: MAX_REGION_LEN,
            });
        }
        let ring_bytes = ring_size as usize * MESSAGE_SIZE;
        let tx_ring = header::END;
        let rx_ring = tx_ring + ring_bytes;
        let post_ring = rx_ring + ring_bytes;
        let rings_end = (post_ring + ring_bytes) as u64;
        let data_offset = rings_end.div_ceil(PAGE) * PAGE;
        if region_len < data_offset {
            return Err(LayoutError::RegionTooSmall {
                len: region_len,
                need: data_offset,
            });
        }
        Ok(ChannelLayout {
            ring_size,
            region_len,
            tx_ring,
            rx_ring,
            post_ring,
            data_offset,
        })
    }

    /// The default layout: 256 slots, 2 MiB.
    pub fn default_layout() -> Self {
        match Self::new(DEFAULT_RING_SIZE, DEFAULT_REGION_LEN) {
            Ok(l) => l,
            // The defaults are constants checked by a unit test.
            Err(_) => unreachable!("default layout is valid"),
        }
    }

    /// Smallest region that holds header and rings for `ring_size` slots.
    pub fn min_region_len(ring_size: u32) -> Result<u64, LayoutError> {
        let l = Self::new(ring_size, MAX_REGION_LEN)?;
        Ok(l.data_offset)
    }

    /// Length of the data area.
    pub fn data_len(&self) -> u64 {
        self.region_len - self.data_offset
    }

    /// True if `offset..offset+len` lies inside the data area (checked arithmetic; `len` may be 0
    /// only if `allow_empty`).
    pub fn data_range_ok(&self, offset: u64, len: u64, allow_empty: bool) -> bool {
        if len == 0 && !allow_empty {
            return false;
        }
        match offset.checked_add(len) {
            Some(end) => offset >= self.data_offset && end <= self.region_len,
            None => false,
        }
    }

    /// Ring size minus one: the slot mask.
    pub fn mask(&self) -> u32 {
        self.ring_size - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_layout_is_the_nfe_shape() {
        let l = ChannelLayout::default_layout();
        assert_eq!(l.ring_size, 256);
        assert_eq!(l.region_len, 2 << 20);
        assert_eq!(l.tx_ring, 0x1000);
        assert_eq!(l.rx_ring, 0x1000 + 256 * 64);
        assert_eq!(l.post_ring, 0x1000 + 2 * 256 * 64);
        assert_eq!(l.data_offset, 0x1000 + 3 * 256 * 64);
        assert_eq!(l.data_offset % PAGE, 0);
        assert_eq!(l.data_len(), (2 << 20) - l.data_offset);
    }

    #[test]
    fn ring_sizes_outside_the_range_are_refused() {
        for bad in [0, 1, 8, 15, 17, 100, 8192, u32::MAX] {
            assert_eq!(
                ChannelLayout::new(bad, 2 << 20),
                Err(LayoutError::BadRingSize(bad))
            );
        }
        for good in [16, 32, 64, 128, 256, 512, 1024, 2048, 4096] {
            assert!(ChannelLayout::new(good, 2 << 20).is_ok(), "{good}");
        }
    }

    #[test]
    fn region_length_is_checked() {
        assert!(matches!(
            ChannelLayout::new(256, 4097),
            Err(LayoutError::Misaligned(_))
        ));
        assert!(matches!(
            ChannelLayout::new(256, 4096),
            Err(LayoutError::RegionTooSmall { .. })
        ));
        assert!(matches!(
            ChannelLayout::new(256, MAX_REGION_LEN + PAGE),
            Err(LayoutError::RegionTooLarge { .. })
        ));
        let min = ChannelLayout::min_region_len(4096).unwrap();
        assert!(ChannelLayout::new(4096, min).is_ok());
        assert_eq!(ChannelLayout::new(4096, min).unwrap().data_len(), 0);
    }

    #[test]
    fn header_fields_have_their_own_128_byte_blocks_and_fit() {
        let idx = header::INDICES;
        // One block each (a pair of lines the CPU fetches together), none shared with another
        // field or with the header line at 0.
        let mut blocks: Vec<usize> = idx.iter().map(|o| o / 128).collect();
        blocks.sort_unstable();
        blocks.dedup();
        assert_eq!(blocks.len(), idx.len(), "two fields share a 128-byte block");
        assert!(!blocks.contains(&0), "a field shares the header's block");
        assert!(idx.iter().all(|o| o % 128 == 0 && *o + 128 <= header::END));
        const { assert!(header::READY + 4 <= 64) };
    }

    #[test]
    fn data_ranges_use_checked_arithmetic() {
        let l = ChannelLayout::default_layout();
        assert!(l.data_range_ok(l.data_offset, 64, false));
        assert!(!l.data_range_ok(l.data_offset - 1, 64, false));
        assert!(!l.data_range_ok(l.region_len - 10, 11, false));
        assert!(!l.data_range_ok(u64::MAX - 4, 10, false));
        assert!(!l.data_range_ok(l.data_offset, 0, false));
        assert!(l.data_range_ok(l.data_offset, 0, true));
    }
}
