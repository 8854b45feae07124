//! TX reading and RX writing over virtio-queue's driver-side mock.

use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::GuestAddress;

use super::*;

const BUF_BASE: u64 = 0x10_0000;
const NEXT: u16 = VRING_DESC_F_NEXT as u16;
const WRITE: u16 = VRING_DESC_F_WRITE as u16;

fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x20_0000)]).unwrap()
}

fn desc(addr: u64, len: u32, flags: u16, next: u16) -> RawDescriptor {
    RawDescriptor::from(SplitDescriptor::new(addr, len, flags, next))
}

fn mergeable() -> NetFeatures {
    NetFeatures {
        hdr_len: NET_HDR_LEN,
        mergeable: true,
        event_idx: false,
    }
}

fn frame(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

fn used(vq: &MockSplitQueue<'_, GuestMemoryMmap>) -> Vec<(u32, u32)> {
    let n = vq.used().idx().load();
    (0..n)
        .map(|i| {
            let e = vq.used().ring().ref_at(i.into()).unwrap().load();
            (e.id(), e.len())
        })
        .collect()
}

/// A 16-entry queue in `mem` whose driver offered `descs` (chained by their flags), and the
/// device's [`Queue`] over it.
fn queue_with<'a>(
    mem: &'a GuestMemoryMmap,
    descs: &[RawDescriptor],
) -> (MockSplitQueue<'a, GuestMemoryMmap>, Queue) {
    let vq = MockSplitQueue::new(mem, 16);
    vq.add_desc_chains(descs, 0).unwrap();
    let q = vq.create_queue().unwrap();
    (vq, q)
}

fn read_tx(mem: &GuestMemoryMmap, descs: &[RawDescriptor]) -> Result<Vec<u8>, TxError> {
    let (_vq, mut q) = queue_with(mem, descs);
    let chain = q.iter(mem).unwrap().next().unwrap();
    let mut out = Vec::new();
    read_tx_frame(chain, mem, NET_HDR_LEN, &mut out).map(|()| out)
}

#[test]
fn tx_skips_the_header_wherever_the_descriptors_split_it() {
    let mem = memory();
    let f = frame(100);
    let mut bytes = vec![0xeeu8; NET_HDR_LEN];
    bytes.extend_from_slice(&f);
    mem.write_slice(&bytes, GuestAddress(BUF_BASE)).unwrap();

    let single = [desc(BUF_BASE, bytes.len() as u32, 0, 0)];
    assert_eq!(read_tx(&mem, &single).unwrap(), f);

    // 5 header bytes, then 7 header bytes + 20 frame bytes, then the rest.
    let split = [
        desc(BUF_BASE, 5, NEXT, 1),
        desc(BUF_BASE + 5, 27, NEXT, 2),
        desc(BUF_BASE + 32, bytes.len() as u32 - 32, 0, 0),
    ];
    assert_eq!(read_tx(&mem, &split).unwrap(), f);
}

#[test]
fn tx_rejects_bad_chains() {
    let mem = memory();
    assert_eq!(
        read_tx(&mem, &[desc(BUF_BASE, 11, 0, 0)]),
        Err(TxError::ShorterThanHeader {
            len: 11,
            hdr_len: NET_HDR_LEN
        })
    );
    assert!(matches!(
        read_tx(&mem, &[desc(BUF_BASE, 64, WRITE, 0)]),
        Err(TxError::WritableDescriptor { .. })
    ));
    assert!(matches!(
        read_tx(&mem, &[desc(0x1000_0000, 64, 0, 0)]),
        Err(TxError::OutsideMemory { .. })
    ));
    assert!(matches!(
        read_tx(
            &mem,
            &[
                desc(BUF_BASE, 0x1_0000, NEXT, 1),
                desc(BUF_BASE, 0x1_0000, 0, 0)
            ]
        ),
        Err(TxError::TooLong { .. })
    ));
}

#[test]
fn rx_spans_mergeable_buffers_and_sets_num_buffers() {
    let mem = memory();
    let descs: Vec<_> = (0..4)
        .map(|i| desc(BUF_BASE + i * 0x1000, 1500, WRITE, 0))
        .collect();
    let (vq, mut q) = queue_with(&mem, &descs);

    let f = frame(3000);
    let w = write_rx_frame(&mut q, &mem, &f, &mergeable()).unwrap();
    assert_eq!(w.outcome, RxOutcome::Delivered { buffers: 3 });
    assert_eq!(w.bad_chains, 0);
    assert_eq!(used(&vq), vec![(0, 1500), (1, 1500), (2, 12)]);

    let mut got = Vec::new();
    for (i, len) in [1500u64, 1500, 12].into_iter().enumerate() {
        let mut b = vec![0u8; len as usize];
        mem.read_slice(&mut b, GuestAddress(BUF_BASE + i as u64 * 0x1000))
            .unwrap();
        got.extend_from_slice(&b);
    }
    assert_eq!(u16::from_le_bytes([got[10], got[11]]), 3, "num_buffers");
    assert_eq!(&got[NET_HDR_LEN..], &f[..]);
}

#[test]
fn rx_without_enough_buffers_gives_them_back() {
    let mem = memory();
    let (vq, mut q) = queue_with(&mem, &[desc(BUF_BASE, 1500, WRITE, 0)]);

    let w = write_rx_frame(&mut q, &mem, &frame(3000), &mergeable()).unwrap();
    assert_eq!(w.outcome, RxOutcome::NoBuffers { avail_idx: 1 });
    assert_eq!(q.next_avail(), 0, "the lone buffer stays available");
    assert!(used(&vq).is_empty());

    let w = write_rx_frame(&mut q, &mem, &frame(100), &mergeable()).unwrap();
    assert_eq!(w.outcome, RxOutcome::Delivered { buffers: 1 });
    assert_eq!(used(&vq), vec![(0, 112)]);
}

#[test]
fn rx_bad_chains_are_returned_empty_before_the_frame() {
    let mem = memory();
    let (vq, mut q) = queue_with(
        &mem,
        &[
            desc(BUF_BASE, 1500, 0, 0),           // device-readable: bad
            desc(0x1000_0000, 1500, WRITE, 0),    // outside memory: bad
            desc(BUF_BASE + 0x1000, 8, WRITE, 0), // smaller than the header: bad
            desc(BUF_BASE + 0x2000, 1500, WRITE, 0),
        ],
    );
    let w = write_rx_frame(&mut q, &mem, &frame(60), &mergeable()).unwrap();
    assert_eq!(w.outcome, RxOutcome::Delivered { buffers: 1 });
    assert_eq!(w.bad_chains, 3);
    assert_eq!(used(&vq), vec![(0, 0), (1, 0), (2, 0), (3, 72)]);
}

#[test]
fn rx_ring_of_only_bad_chains_drains() {
    let mem = memory();
    let (vq, mut q) = queue_with(&mem, &[desc(BUF_BASE, 1500, 0, 0)]);
    let w = write_rx_frame(&mut q, &mem, &frame(60), &mergeable()).unwrap();
    assert_eq!(w.outcome, RxOutcome::NoBuffers { avail_idx: 1 });
    assert_eq!(w.bad_chains, 1);
    assert_eq!(q.next_avail(), 1);
    assert_eq!(used(&vq), vec![(0, 0)]);
}

#[test]
fn rx_without_mrg_rxbuf_drops_frames_larger_than_one_chain() {
    let mem = memory();
    let (vq, mut q) = queue_with(
        &mem,
        &[
            desc(BUF_BASE, 1000, WRITE | NEXT, 1),
            desc(BUF_BASE + 0x1000, 1000, WRITE, 0),
        ],
    );
    let net = NetFeatures::from_acked(1 << VIRTIO_F_VERSION_1);
    assert!(!net.mergeable);
    let w = write_rx_frame(&mut q, &mem, &frame(2500), &net).unwrap();
    assert_eq!(w.outcome, RxOutcome::TooBig);
    assert_eq!(q.next_avail(), 0);

    // A frame that fits uses both descriptors of the one chain; num_buffers is 1.
    let f = frame(1500);
    let w = write_rx_frame(&mut q, &mem, &f, &net).unwrap();
    assert_eq!(w.outcome, RxOutcome::Delivered { buffers: 1 });
    assert_eq!(used(&vq), vec![(0, 1512)]);
    let mut hdr = [0u8; NET_HDR_LEN];
    mem.read_slice(&mut hdr, GuestAddress(BUF_BASE)).unwrap();
    assert_eq!(u16::from_le_bytes([hdr[10], hdr[11]]), 1);
}

#[test]
fn header_length_follows_the_negotiated_features() {
    assert_eq!(NetFeatures::from_acked(0).hdr_len, LEGACY_NET_HDR_LEN);
    assert_eq!(
        NetFeatures::from_acked(1 << VIRTIO_NET_F_MRG_RXBUF).hdr_len,
        NET_HDR_LEN
    );
    let all = NetFeatures::from_acked(device_features());
    assert_eq!(
        all,
        NetFeatures {
            hdr_len: NET_HDR_LEN,
            mergeable: true,
            event_idx: true
        }
    );
}

#[test]
fn config_space_has_mac_and_link_up() {
    let mac = MacAddr([0x52, 0x54, 0, 1, 2, 3]);
    let c = read_config(mac, 0, 10);
    assert_eq!(&c[..6], &mac.0);
    assert_eq!(
        u16::from_le_bytes([c[6], c[7]]),
        VIRTIO_NET_S_LINK_UP as u16
    );
    assert_eq!(read_config(mac, 6, 2), vec![1, 0]);
    assert_eq!(read_config(mac, 20, 4), vec![0; 4]);
    assert!(read_config(mac, 250, 10).is_empty());
    assert!(read_config(mac, u32::MAX, 2).is_empty());
}
