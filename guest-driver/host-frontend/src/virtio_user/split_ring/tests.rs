//! The driver-side split ring against the device side of the real virtio-queue library (its
//! `Queue`, reading and writing the same memory), plus a device that writes hostile used
//! elements by hand.
#![allow(clippy::unwrap_used)]

use super::*;
use virtio_queue::{Queue, QueueT};

const SIZE: u16 = 8;
const BUF: u64 = 256;
const BUFFERS: u64 = 0x10000;

fn memory() -> Arc<GuestMemoryMmap> {
    Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap())
}

fn layout(size: u16) -> RingLayout {
    RingLayout {
        size,
        desc: 0x1000,
        avail: 0x3000,
        used: 0x5000,
    }
}

fn buffer(id: u16) -> u64 {
    BUFFERS + u64::from(id) * BUF
}

/// virtio-queue's device side over the same rings (also the device of `virtio_net`'s tests).
pub(crate) fn device(l: RingLayout, event_idx: bool) -> Queue {
    let mut q = Queue::new(l.size).unwrap();
    q.set_size(l.size);
    q.set_desc_table_address(Some(l.desc as u32), Some((l.desc >> 32) as u32));
    q.set_avail_ring_address(Some(l.avail as u32), Some((l.avail >> 32) as u32));
    q.set_used_ring_address(Some(l.used as u32), Some((l.used >> 32) as u32));
    q.set_event_idx(event_idx);
    q.set_ready(true);
    q
}

fn setup(event_idx: bool) -> (Arc<GuestMemoryMmap>, SplitRing, Queue) {
    let mem = memory();
    let ring = SplitRing::new("TEST", mem.clone(), layout(SIZE), event_idx).unwrap();
    let q = device(layout(SIZE), event_idx);
    assert!(q.is_valid(mem.as_ref()));
    (mem, ring, q)
}

/// Claims a descriptor and makes its buffer available.
fn offer(ring: &mut SplitRing, len: u32, writable: bool) -> u16 {
    let id = ring.claim().unwrap();
    ring.push(id, buffer(id), len, writable).unwrap();
    id
}

/// Driver: offers one 64-byte device-writable buffer and publishes it; returns its head.
fn publish_one(ring: &mut SplitRing) -> u16 {
    let id = offer(ring, 64, true);
    ring.publish().unwrap();
    id
}

/// Device: takes the next chain, checks it is one descriptor, returns (head, addr, len, writable).
fn take(q: &mut Queue, mem: &GuestMemoryMmap) -> Option<(u16, u64, u32, bool)> {
    let chain = q.pop_descriptor_chain(mem)?;
    let head = chain.head_index();
    let descs: Vec<_> = chain.collect();
    assert_eq!(descs.len(), 1, "one descriptor per buffer");
    let d = descs[0];
    Some((head, d.addr().0, d.len(), d.is_write_only()))
}

/// Device: writes a used element and bumps used.idx by hand (to play a hostile device).
fn hostile_used(mem: &GuestMemoryMmap, l: RingLayout, used_idx: u16, id: u32, len: u32) {
    let slot = u64::from(used_idx.wrapping_sub(1) & (l.size - 1));
    let addr = l.used + 4 + 8 * slot;
    mem.write_obj(id.to_le(), GuestAddress(addr)).unwrap();
    mem.write_obj(len.to_le(), GuestAddress(addr + 4)).unwrap();
    mem.store(
        used_idx.to_le(),
        GuestAddress(l.used + 2),
        Ordering::Release,
    )
    .unwrap();
}

#[test]
fn readable_buffers_reach_the_device_and_come_back() {
    let (mem, mut ring, mut q) = setup(true);
    for i in 0..3u8 {
        let id = ring.claim().unwrap();
        mem.write_slice(&[i; 40], GuestAddress(buffer(id))).unwrap();
        ring.push(id, buffer(id), 40, false).unwrap();
    }
    // Nothing is visible before publish.
    assert!(take(&mut q, &mem).is_none());
    ring.publish().unwrap();
    assert_eq!(ring.in_flight(), 3);
    let mut heads = Vec::new();
    while let Some((head, addr, len, writable)) = take(&mut q, &mem) {
        assert_eq!((addr, len, writable), (buffer(head), 40, false));
        let mut data = [0u8; 40];
        mem.read_slice(&mut data, GuestAddress(addr)).unwrap();
        assert_eq!(data, [heads.len() as u8; 40]);
        heads.push(head);
    }
    assert_eq!(heads.len(), 3);
    for h in &heads {
        // A device may report any length for a device-readable buffer: it is ignored.
        q.add_used(mem.as_ref(), *h, 4000).unwrap();
    }
    for h in &heads {
        let used = ring.pop_used().unwrap().unwrap();
        assert_eq!(used.id, *h);
        ring.unclaim(used.id).unwrap();
    }
    assert_eq!(ring.pop_used().unwrap(), None);
    assert_eq!(ring.in_flight(), 0);
    assert_eq!(ring.free_count(), usize::from(SIZE));
}

#[test]
fn writable_buffers_report_what_the_device_wrote() {
    let (mem, mut ring, mut q) = setup(false);
    let id = offer(&mut ring, BUF as u32, true);
    ring.publish().unwrap();
    let (head, addr, len, writable) = take(&mut q, &mem).unwrap();
    assert_eq!((head, len, writable), (id, BUF as u32, true));
    mem.write_slice(b"hello", GuestAddress(addr)).unwrap();
    q.add_used(mem.as_ref(), head, 5).unwrap();
    assert_eq!(ring.pop_used().unwrap(), Some(UsedBuffer { id, len: 5 }));
    // The id is claimed again: it can be pushed straight back (RX recycling).
    ring.push(id, buffer(id), BUF as u32, true).unwrap();
    ring.publish().unwrap();
    assert_eq!(take(&mut q, &mem).unwrap().0, id);
}

#[test]
fn event_idx_used_event_controls_device_notifications() {
    let (mem, mut ring, mut q) = setup(true);
    for _ in 0..6 {
        offer(&mut ring, 64, true);
    }
    ring.publish().unwrap();
    let heads: Vec<u16> = std::iter::from_fn(|| take(&mut q, &mem).map(|t| t.0)).collect();

    // Armed at used idx 0: the first completion notifies, the next ones do not.
    assert!(!ring.enable_used_notification().unwrap());
    q.add_used(mem.as_ref(), heads[0], 1).unwrap();
    assert!(q.needs_notification(mem.as_ref()).unwrap());
    q.add_used(mem.as_ref(), heads[1], 1).unwrap();
    assert!(!q.needs_notification(mem.as_ref()).unwrap());

    // Re-arming while buffers wait says so (do not sleep), and the device stays quiet
    // until a buffer beyond our position is used.
    assert!(ring.enable_used_notification().unwrap());
    ring.pop_used().unwrap().unwrap();
    ring.pop_used().unwrap().unwrap();
    assert!(!ring.enable_used_notification().unwrap());
    q.add_used(mem.as_ref(), heads[2], 1).unwrap();
    assert!(q.needs_notification(mem.as_ref()).unwrap());

    // Disabled: no notification for further completions.
    ring.pop_used().unwrap().unwrap();
    ring.disable_used_notification().unwrap();
    q.add_used(mem.as_ref(), heads[3], 1).unwrap();
    assert!(!q.needs_notification(mem.as_ref()).unwrap());
    q.add_used(mem.as_ref(), heads[4], 1).unwrap();
    assert!(!q.needs_notification(mem.as_ref()).unwrap());
    // A batch added before needs_notification still notifies once if it crosses used_event.
    ring.pop_used().unwrap().unwrap();
    ring.pop_used().unwrap().unwrap();
    assert!(!ring.enable_used_notification().unwrap());
    q.add_used(mem.as_ref(), heads[5], 1).unwrap();
    assert!(q.needs_notification(mem.as_ref()).unwrap());
}

#[test]
fn event_idx_avail_event_controls_driver_kicks() {
    let (mem, mut ring, mut q) = setup(true);
    // avail_event starts at 0: the first buffer needs a kick.
    publish_one(&mut ring);
    assert!(ring.kick_needed().unwrap());
    // Nothing new: no kick.
    assert!(!ring.kick_needed().unwrap());
    // The device has not asked again (avail_event still 0): more buffers, no kick.
    publish_one(&mut ring);
    assert!(!ring.kick_needed().unwrap());
    // The device drains the ring and re-enables notifications (avail_event = 2).
    assert!(take(&mut q, &mem).is_some());
    assert!(take(&mut q, &mem).is_some());
    assert!(!q.enable_notification(mem.as_ref()).unwrap());
    offer(&mut ring, 64, true);
    offer(&mut ring, 64, true);
    ring.publish().unwrap();
    // One kick for the batch of two.
    assert!(ring.kick_needed().unwrap());
    assert!(!ring.kick_needed().unwrap());
}

#[test]
fn without_event_idx_the_flags_are_used() {
    let (mem, mut ring, mut q) = setup(false);
    publish_one(&mut ring);
    assert!(ring.kick_needed().unwrap());
    q.disable_notification(mem.as_ref()).unwrap();
    publish_one(&mut ring);
    assert!(!ring.kick_needed().unwrap());
    q.enable_notification(mem.as_ref()).unwrap();
    publish_one(&mut ring);
    assert!(ring.kick_needed().unwrap());

    let avail_flags = || {
        mem.load::<u16>(GuestAddress(layout(SIZE).avail), Ordering::Relaxed)
            .unwrap()
    };
    ring.disable_used_notification().unwrap();
    assert_eq!(avail_flags(), VRING_AVAIL_F_NO_INTERRUPT as u16);
    assert!(!ring.enable_used_notification().unwrap());
    assert_eq!(avail_flags(), 0);
}

#[test]
fn indices_wrap_around_u16() {
    let (mem, mut ring, mut q) = setup(true);
    let mut kicks = 0;
    let mut notifications = 0;
    for round in 0..70_000u32 {
        let id = publish_one(&mut ring);
        if ring.kick_needed().unwrap() {
            kicks += 1;
        }
        let (head, ..) = take(&mut q, &mem).unwrap();
        assert_eq!(head, id);
        // The device re-arms after every buffer, so every buffer needs a kick.
        assert!(!q.enable_notification(mem.as_ref()).unwrap());
        assert!(!ring.enable_used_notification().unwrap());
        q.add_used(mem.as_ref(), head, round % 64).unwrap();
        if q.needs_notification(mem.as_ref()).unwrap() {
            notifications += 1;
        }
        let used = ring.pop_used().unwrap().unwrap();
        assert_eq!(
            used,
            UsedBuffer {
                id,
                len: round % 64
            }
        );
        ring.unclaim(id).unwrap();
    }
    assert_eq!(kicks, 70_000);
    assert_eq!(notifications, 70_000);
}

#[test]
fn a_used_id_outside_the_queue_breaks_the_ring() {
    let (mem, mut ring, _q) = setup(true);
    publish_one(&mut ring);
    for bad in [u32::from(SIZE), 0x1_0000 + 1, u32::MAX] {
        let (mem2, mut ring2, _) = setup(true);
        offer(&mut ring2, 64, true);
        ring2.publish().unwrap();
        hostile_used(&mem2, layout(SIZE), 1, bad, 0);
        assert!(matches!(
            ring2.pop_used(),
            Err(RingError::BadUsedId { id, size: SIZE, .. }) if id == bad
        ));
    }
    hostile_used(&mem, layout(SIZE), 1, 99, 0);
    let err = ring.pop_used().unwrap_err();
    // Sticky: every later operation reports the same error, nothing more is handed out.
    assert_eq!(ring.pop_used().unwrap_err(), err);
    assert_eq!(ring.publish().unwrap_err(), err);
    assert_eq!(ring.kick_needed().unwrap_err(), err);
    assert_eq!(ring.enable_used_notification().unwrap_err(), err);
    assert_eq!(ring.claim(), None);
    assert_eq!(ring.broken(), Some(&err));
}

#[test]
fn a_descriptor_the_device_does_not_own_breaks_the_ring() {
    // Never made available.
    let (mem, mut ring, _q) = setup(true);
    let id = publish_one(&mut ring);
    hostile_used(&mem, layout(SIZE), 1, u32::from(id) + 1, 0);
    assert!(matches!(
        ring.pop_used(),
        Err(RingError::NotOutstanding { .. })
    ));

    // Returned twice (through the real device side, which does not check).
    let (mem, mut ring, mut q) = setup(true);
    offer(&mut ring, 64, true);
    offer(&mut ring, 64, true);
    ring.publish().unwrap();
    let (head, ..) = take(&mut q, &mem).unwrap();
    q.add_used(mem.as_ref(), head, 1).unwrap();
    q.add_used(mem.as_ref(), head, 1).unwrap();
    assert_eq!(ring.pop_used().unwrap().unwrap().id, head);
    assert!(matches!(
        ring.pop_used(),
        Err(RingError::NotOutstanding { id, .. }) if id == u32::from(head)
    ));
}

#[test]
fn a_used_length_larger_than_the_buffer_breaks_the_ring() {
    let (mem, mut ring, mut q) = setup(true);
    let id = offer(&mut ring, 100, true);
    ring.publish().unwrap();
    let (head, ..) = take(&mut q, &mem).unwrap();
    q.add_used(mem.as_ref(), head, 101).unwrap();
    assert_eq!(
        ring.pop_used(),
        Err(RingError::UsedLenTooLarge {
            queue: "TEST",
            id,
            len: 101,
            buffer_len: 100
        })
    );
}

#[test]
fn a_used_idx_jump_breaks_the_ring() {
    for jump_to in [3u16, 200, u16::MAX] {
        let (mem, mut ring, _q) = setup(true);
        let a = offer(&mut ring, 64, true);
        offer(&mut ring, 64, true);
        ring.publish().unwrap();
        // Two buffers held; the device claims 3 (or more, or went backwards).
        hostile_used(&mem, layout(SIZE), jump_to, u32::from(a), 0);
        assert_eq!(
            ring.pop_used(),
            Err(RingError::UsedIdxJump {
                queue: "TEST",
                used_idx: jump_to,
                last_used: 0,
                in_flight: 2
            })
        );
    }
}

#[test]
fn driver_misuse_is_an_error_not_a_panic() {
    let (_mem, mut ring, _q) = setup(true);
    assert!(matches!(
        ring.push(3, 0, 1, true),
        Err(RingError::Misuse { .. })
    ));
    assert!(matches!(ring.unclaim(3), Err(RingError::Misuse { .. })));
    assert!(matches!(
        ring.unclaim(SIZE + 10),
        Err(RingError::Misuse { .. })
    ));
    let id = offer(&mut ring, 1, true);
    // Already owned by the device.
    assert!(matches!(
        ring.push(id, 0, 1, true),
        Err(RingError::Misuse { .. })
    ));
    assert!(matches!(ring.unclaim(id), Err(RingError::Misuse { .. })));
}

#[test]
fn bad_layouts_are_refused() {
    let mem = memory();
    let bad = |l: RingLayout| SplitRing::new("TEST", mem.clone(), l, true).unwrap_err();
    for size in [0, 3, 100] {
        assert!(matches!(bad(layout(size)), RingError::BadLayout { .. }));
    }
    let mut l = layout(SIZE);
    l.desc += 8;
    assert!(matches!(bad(l), RingError::BadLayout { .. }));
    let mut l = layout(SIZE);
    l.used += 2;
    assert!(matches!(bad(l), RingError::BadLayout { .. }));
    let mut l = layout(SIZE);
    l.avail = (1 << 20) - 4;
    assert!(matches!(bad(l), RingError::BadLayout { .. }));
    // The largest size works when it fits.
    let big = Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap());
    let l = RingLayout {
        size: MAX_QUEUE_SIZE,
        desc: 0,
        avail: 1 << 20,
        used: 2 << 20,
    };
    assert!(SplitRing::new("TEST", big, l, true).is_ok());
}

#[test]
fn need_event_matches_the_spec_formula_across_wrap() {
    // Crossing the event index (event in [old, new)) notifies; otherwise not.
    assert!(need_event(5, 6, 5));
    assert!(need_event(5, 10, 2));
    assert!(!need_event(5, 5, 2));
    assert!(!need_event(10, 9, 2));
    assert!(need_event(u16::MAX, 1, u16::MAX - 1));
    assert!(!need_event(3, 1, u16::MAX - 1));
}

fn seg(id: u16, len: u32, writable: bool) -> ChainSegment {
    ChainSegment {
        id,
        addr: buffer(id),
        len,
        writable,
    }
}

/// Claims `n` ids and pushes them as one chain: the first `readable` device-readable, the rest
/// device-writable, each `len` bytes. Returns the ids.
fn offer_chain(ring: &mut SplitRing, n: usize, readable: usize, len: u32) -> Vec<u16> {
    let ids: Vec<u16> = (0..n).map(|_| ring.claim().unwrap()).collect();
    let chain: Vec<ChainSegment> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| seg(*id, len, i >= readable))
        .collect();
    ring.push_chain(&chain).unwrap();
    ids
}

#[test]
fn a_chain_reaches_the_device_linked_and_comes_back_by_its_head() {
    let (mem, mut ring, mut q) = setup(true);
    let ids = offer_chain(&mut ring, 3, 1, 50);
    ring.publish().unwrap();
    assert_eq!((ring.in_flight(), ring.avail_idx()), (1, 1));
    assert_eq!(ring.free_count(), usize::from(SIZE) - 3);
    let chain = q.pop_descriptor_chain(mem.as_ref()).unwrap();
    let head = chain.head_index();
    let descs: Vec<_> = chain
        .map(|d| (d.addr().0, d.len(), d.is_write_only()))
        .collect();
    assert_eq!(head, ids[0]);
    assert_eq!(
        descs,
        vec![
            (buffer(ids[0]), 50, false),
            (buffer(ids[1]), 50, true),
            (buffer(ids[2]), 50, true)
        ]
    );
    // The writable part is 100 bytes: all of it may be reported.
    q.add_used(mem.as_ref(), head, 100).unwrap();
    assert_eq!(
        ring.pop_used().unwrap(),
        Some(UsedBuffer {
            id: ids[0],
            len: 100
        })
    );
    assert_eq!(ring.last_used(), 1);
    // The head is the caller's; the tail went back to the free list.
    assert_eq!(ring.free_count(), usize::from(SIZE) - 1);
    for id in &ids[1..] {
        assert!(matches!(ring.unclaim(*id), Err(RingError::Misuse { .. })));
    }
    ring.unclaim(ids[0]).unwrap();
    assert_eq!(ring.free_count(), usize::from(SIZE));
    assert_eq!(ring.in_flight(), 0);
}

/// A chain of three 50-byte descriptors, the first `readable` of them device-readable, that the
/// device returns saying it wrote `used_len` bytes: its head, and what pop_used makes of it.
fn return_chain(readable: usize, used_len: u32) -> (u16, Result<Option<UsedBuffer>, RingError>) {
    let (mem, mut ring, mut q) = setup(false);
    let ids = offer_chain(&mut ring, 3, readable, 50);
    ring.publish().unwrap();
    let head = q.pop_descriptor_chain(mem.as_ref()).unwrap().head_index();
    q.add_used(mem.as_ref(), head, used_len).unwrap();
    (ids[0], ring.pop_used())
}

#[test]
fn a_chains_used_length_is_checked_against_its_writable_part_only() {
    // One readable and two writable descriptors: 100 writable bytes.
    let (id, got) = return_chain(1, 100);
    assert_eq!(got, Ok(Some(UsedBuffer { id, len: 100 })));
    let (id, got) = return_chain(1, 101);
    assert_eq!(
        got,
        Err(RingError::UsedLenTooLarge {
            queue: "TEST",
            id,
            len: 101,
            buffer_len: 100
        })
    );
    // All readable: the device wrote nothing, whatever length it reports.
    let (id, got) = return_chain(3, 4000);
    assert_eq!(got, Ok(Some(UsedBuffer { id, len: 4000 })));
}

#[test]
fn the_tail_of_a_chain_is_not_a_valid_used_id() {
    let (mem, mut ring, _q) = setup(true);
    let ids = offer_chain(&mut ring, 2, 0, 64);
    ring.publish().unwrap();
    hostile_used(&mem, layout(SIZE), 1, u32::from(ids[1]), 0);
    assert!(matches!(
        ring.pop_used(),
        Err(RingError::NotOutstanding { id, .. }) if id == u32::from(ids[1])
    ));
}

#[test]
fn chains_that_break_the_rules_are_refused_and_leave_their_ids_claimed() {
    let (_mem, mut ring, _q) = setup(true);
    let a = ring.claim().unwrap();
    let b = ring.claim().unwrap();
    let unclaimed = ring.free.last().copied().unwrap();
    let too_long: Vec<ChainSegment> = (0..=SIZE).map(|_| seg(a, 1, false)).collect();
    for chain in [
        vec![],
        vec![seg(a, 1, false), seg(a, 1, false)],
        vec![seg(a, 1, false), seg(unclaimed, 1, false)],
        vec![seg(a, 1, true), seg(b, 1, false)],
        too_long,
    ] {
        assert!(
            matches!(ring.push_chain(&chain), Err(RingError::Misuse { .. })),
            "{chain:?}"
        );
        assert_eq!((ring.in_flight(), ring.avail_idx()), (0, 0));
    }
    ring.unclaim(a).unwrap();
    ring.unclaim(b).unwrap();
    assert_eq!(ring.free_count(), usize::from(SIZE));
}

#[test]
fn single_buffers_and_chains_share_the_ring() {
    let (mem, mut ring, mut q) = setup(true);
    for round in 0..20 {
        let single = offer(&mut ring, 64, true);
        let chain = offer_chain(&mut ring, 3, 1, 64);
        ring.publish().unwrap();
        let mut heads = Vec::new();
        while let Some(c) = q.pop_descriptor_chain(mem.as_ref()) {
            heads.push(c.head_index());
        }
        assert_eq!(heads, vec![single, chain[0]], "round {round}");
        for h in heads {
            q.add_used(mem.as_ref(), h, 10).unwrap();
            let used = ring.pop_used().unwrap().unwrap();
            ring.unclaim(used.id).unwrap();
        }
        assert_eq!(ring.free_count(), usize::from(SIZE));
    }
}

#[test]
fn a_contiguous_layout_is_aligned_and_its_parts_do_not_overlap() {
    let mem = memory();
    for size in [1u16, 2, 8, 256, 1024] {
        let l = RingLayout::contiguous(0x1_0000, size);
        assert_eq!(l.desc, 0x1_0000);
        assert_eq!(l.avail, l.desc + RingLayout::desc_bytes(size));
        assert!(l.used >= l.avail + RingLayout::avail_bytes(size));
        assert!(l.used - (l.avail + RingLayout::avail_bytes(size)) < 4);
        SplitRing::new("TEST", mem.clone(), l, true).unwrap();
        assert!(device(l, true).is_valid(mem.as_ref()));
        assert_eq!(l.desc_addr(3), l.desc + 48);
        assert_eq!(l.avail_idx_addr(), l.avail + 2);
        assert_eq!(l.avail_entry_addr(1), l.avail + 6);
        assert_eq!(l.used_idx_addr(), l.used + 2);
        assert_eq!(l.used_elem_addr(1), l.used + 12);
    }
}

#[test]
fn a_descriptor_is_little_endian_in_table_order() {
    let d = Descriptor {
        addr: 0x0102_0304_0506_0708,
        len: 0x090a_0b0c,
        flags: 0x0d0e,
        next: 0x0f10,
    };
    assert_eq!(
        d.to_le_bytes(),
        [8, 7, 6, 5, 4, 3, 2, 1, 0x0c, 0x0b, 0x0a, 0x09, 0x0e, 0x0d, 0x10, 0x0f]
    );
}
