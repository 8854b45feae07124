//! An attacker channel as the attacker writes it: its header words and ring slots, whatever the
//! script says, and the offsets, lengths and values of the script made concrete for it.

use std::sync::atomic::Ordering;

use svnic_channels::layout::header;
use svnic_channels::message::MESSAGE_SIZE;
use svnic_channels::{ChannelAddr, ChannelId, ChannelLayout, DataRef, RawMessage, SharedRegion};
use vm_memory::Bytes;

use super::harness::{ATTACKER_RING, POST_LEN, VICTIM_AT};
use super::input::{HeaderWord, Length, Offset, Ring, Span, Value};

/// One attacker channel as the attacker sees it: raw memory and its own idea of its heads.
pub(super) struct Hostile {
    pub(super) id: ChannelId,
    pub(super) addr: ChannelAddr,
    pub(super) region: SharedRegion,
    pub(super) layout: ChannelLayout,
    pub(super) heads: Heads,
}

/// The heads of the rings the attacker writes (TX and posted buffers), as it counts them; what
/// it stores in the header may differ.
#[derive(Debug, Default)]
pub(super) struct Heads {
    pub(super) tx: u32,
    pub(super) post: u32,
}

impl Hostile {
    pub(super) fn store(&self, off: usize, v: u32) {
        // Offsets lie inside the header block; a failed store is just a lost write.
        let _ = self.region.slice().store(v, off, Ordering::Release);
    }

    pub(super) fn write_slot(&self, ring: Ring, slot: u32, raw: &RawMessage) {
        let l = &self.layout;
        let base = match ring {
            Ring::Tx => l.tx_ring,
            Ring::Rx => l.rx_ring,
            Ring::Post => l.post_ring,
        };
        let off = base + (slot & l.mask()) as usize * MESSAGE_SIZE;
        let _ = self.region.slice().write_obj(*raw, off);
    }

    /// Writes `raw` at the TX head, which only [`Hostile::publish`] makes visible.
    pub(super) fn push_tx(&mut self, raw: &RawMessage) {
        self.write_slot(Ring::Tx, self.heads.tx, raw);
        self.heads.tx = self.heads.tx.wrapping_add(1);
    }

    pub(super) fn publish(&self) {
        self.store(header::TX_HEAD, self.heads.tx);
        self.store(header::POST_HEAD, self.heads.post);
    }

    fn offset(&self, o: &Offset) -> u64 {
        let l = &self.layout;
        let small = |n: &u8| u64::from(*n) * 64;
        match o {
            Offset::Data(n) => l.data_offset + small(n),
            Offset::RegionEnd(n) => l.region_len.wrapping_sub(small(n)),
            Offset::Start(n) => small(n),
            Offset::BeforeData(n) => l.data_offset.wrapping_sub(small(n) + 1),
            Offset::Victim(n) => VICTIM_AT + small(n),
            Offset::NearMax(n) => u64::MAX - small(n),
            Offset::InData(n) => l.data_offset + u64::from(*n) % l.data_len().max(1),
            Offset::Any(v) => *v,
        }
    }

    pub(super) fn data(&self, span: &Span) -> DataRef {
        let len = match span.len {
            Length::Zero => 0,
            Length::Small(n) => u32::from(n) + 1,
            Length::Post => POST_LEN,
            Length::Kib(n) => u32::from(n) << 10,
            Length::NearMax(n) => u32::MAX - u32::from(n),
            Length::Any(n) => n,
        };
        DataRef {
            offset: self.offset(&span.offset),
            len,
        }
    }

    pub(super) fn header_word(w: &HeaderWord) -> usize {
        match w {
            HeaderWord::TxHead => header::TX_HEAD,
            HeaderWord::RxTail => header::RX_TAIL,
            HeaderWord::PostHead => header::POST_HEAD,
            HeaderWord::GuestSleeping => header::GUEST_SLEEPING,
            HeaderWord::TxTail => header::TX_TAIL,
            HeaderWord::RxHead => header::RX_HEAD,
            HeaderWord::PostTail => header::POST_TAIL,
            HeaderWord::EngineSleeping => header::ENGINE_SLEEPING,
            HeaderWord::Fault => header::FAULT,
            HeaderWord::Ready => header::READY,
            HeaderWord::ChannelId => header::CHANNEL_ID,
            HeaderWord::Worker => header::WORKER,
            HeaderWord::Cpu => header::CPU,
            HeaderWord::Magic => header::MAGIC,
            HeaderWord::Version => header::VERSION,
            HeaderWord::RingSize => header::RING_SIZE,
            HeaderWord::RegionLen => header::REGION_LEN,
            HeaderWord::DataOffset => header::DATA_OFFSET,
            HeaderWord::TxRing => header::TX_RING,
            HeaderWord::RxRing => header::RX_RING,
            HeaderWord::PostRing => header::POST_RING,
            HeaderWord::Any(n) => (*n as usize % header::END) & !3,
        }
    }

    pub(super) fn value(&self, v: &Value) -> u32 {
        match v {
            Value::TxHeadPlus(n) => self.heads.tx.wrapping_add(u32::from(*n)),
            Value::PostHeadPlus(n) => self.heads.post.wrapping_add(u32::from(*n)),
            Value::RingTimes(n) => ATTACKER_RING.wrapping_mul(u32::from(*n)),
            Value::NearMax(n) => u32::MAX - u32::from(*n),
            Value::Small(n) => u32::from(*n),
            Value::Any(n) => *n,
        }
    }
}
