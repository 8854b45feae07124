//! VirtioNet against a virtio-net device built on virtio-queue (see `test_device`).
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use super::test_device::{pair, BASE, EVENT_IDX, MRG_RXBUF};
use super::*;
use crate::virtio_user::split_ring::RingError;
use virtio_queue::QueueT;

fn frame(n: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + n) as u8).collect()
}

fn recv_all(net: &mut VirtioNet) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    net.recv_frames(&mut out, usize::MAX).unwrap();
    out
}

#[test]
fn frames_go_both_ways_with_every_feature_set() {
    for features in [
        BASE,
        BASE | EVENT_IDX,
        BASE | MRG_RXBUF,
        BASE | EVENT_IDX | MRG_RXBUF,
    ] {
        let (mut net, mut dev) = pair(features, 16, 8);
        assert_eq!(net.mac(), super::test_device::MAC);
        // Every RX buffer was posted at setup.
        assert_eq!(dev.rx_available(), 16);
        let sent: Vec<Vec<u8>> = (0..10).map(|i| frame(i, 60 + i * 100)).collect();
        for f in &sent {
            assert!(net.send_frame(f).unwrap());
        }
        net.flush().unwrap();
        assert!(dev.kicked(TX_QUEUE));
        assert_eq!(dev.transmitted(), sent);
        for f in &sent {
            assert!(dev.deliver(f));
        }
        assert_eq!(recv_all(&mut net), sent, "features {features:#x}");
        // Buffers went back to the device.
        assert_eq!(dev.rx_available(), 16);
        assert_eq!(net.stats().tx_frames, 10);
        assert_eq!(net.stats().rx_frames, 10);
    }
}

#[test]
fn many_frames_cross_the_index_wrap() {
    let (mut net, mut dev) = pair(BASE | EVENT_IDX | MRG_RXBUF, 16, 8);
    let mut got = Vec::new();
    for round in 0..5000usize {
        let f = frame(round, 60 + round % 1400);
        while !net.send_frame(&f).unwrap() {
            net.flush().unwrap();
            dev.transmitted();
        }
        if round % 7 == 0 {
            net.flush().unwrap();
            for t in dev.transmitted() {
                assert!(dev.deliver(&t));
            }
            got.extend(recv_all(&mut net));
        }
    }
    net.flush().unwrap();
    for t in dev.transmitted() {
        assert!(dev.deliver(&t));
    }
    got.extend(recv_all(&mut net));
    assert_eq!(got.len(), 5000);
    for (round, f) in got.iter().enumerate() {
        assert_eq!(*f, frame(round, 60 + round % 1400));
    }
}

#[test]
fn recv_honours_max() {
    let (mut net, mut dev) = pair(BASE | EVENT_IDX, 16, 8);
    for i in 0..5 {
        assert!(dev.deliver(&frame(i, 100)));
    }
    let mut out = Vec::new();
    assert_eq!(net.recv_frames(&mut out, 2).unwrap(), 2);
    assert_eq!(net.recv_frames(&mut out, 10).unwrap(), 3);
    assert_eq!(out, (0..5).map(|i| frame(i, 100)).collect::<Vec<_>>());
}

#[test]
fn a_frame_spanning_buffers_is_reassembled_even_when_it_arrives_in_parts() {
    let (mut net, mut dev) = pair(BASE | EVENT_IDX | MRG_RXBUF, 16, 8);
    let big = frame(1, 5000); // 12 + 5000 bytes: three 2048-byte buffers
    let mut seen_partial = 0;
    assert!(dev.deliver_with(&big, |_| {
        let mut out = Vec::new();
        assert_eq!(net.recv_frames(&mut out, 10).unwrap(), 0);
        seen_partial += 1;
    }));
    assert_eq!(seen_partial, 2);
    assert_eq!(recv_all(&mut net), vec![big.clone()]);
    assert_eq!(net.stats().rx_merged, 1);
    // A small frame right after the big one is separate.
    assert!(dev.deliver(&frame(2, 64)));
    assert!(dev.deliver(&big));
    assert_eq!(recv_all(&mut net), vec![frame(2, 64), big]);
    assert_eq!(dev.rx_available(), 16);
}

#[test]
fn the_tx_ring_full_is_reported_and_a_waiter_wakes_when_room_appears() {
    let (mut net, mut dev) = pair(BASE | EVENT_IDX, 8, 8);
    for i in 0..8 {
        assert!(net.send_frame(&frame(i, 60)).unwrap());
    }
    net.flush().unwrap();
    assert!(!net.send_frame(&frame(8, 60)).unwrap());
    assert_eq!(net.stats().tx_ring_full, 1);
    // Nothing to do yet: the driver arms the TX notification.
    assert!(!net.prepare_wait().unwrap());
    assert_eq!(dev.transmitted().len(), 8);
    assert_eq!(dev.calls[TX_QUEUE], 1, "the device signals the room");
    let t = Instant::now();
    assert!(net.wait(Duration::from_secs(5)).unwrap());
    assert!(t.elapsed() < Duration::from_secs(1));
    assert!(net.send_frame(&frame(8, 60)).unwrap());
    net.flush().unwrap();
    // Room was found: TX notifications are off again.
    assert_eq!(dev.transmitted().len(), 1);
    assert_eq!(dev.calls[TX_QUEUE], 1);
}

#[test]
fn tx_completions_do_not_signal_unless_someone_waits_for_room() {
    let (mut net, mut dev) = pair(BASE | EVENT_IDX, 16, 8);
    for i in 0..40 {
        assert!(net.send_frame(&frame(i, 60)).unwrap());
        net.flush().unwrap();
        dev.transmitted();
    }
    assert_eq!(dev.calls[TX_QUEUE], 0);
}

#[test]
fn tx_kicks_follow_avail_event() {
    let (mut net, mut dev) = pair(BASE | EVENT_IDX, 16, 8);
    assert!(dev.kicked(RX_QUEUE) || !dev.kicked(RX_QUEUE)); // setup kicks are not counted here
    assert!(net.send_frame(&frame(0, 60)).unwrap());
    assert!(net.send_frame(&frame(1, 60)).unwrap());
    net.flush().unwrap();
    assert!(dev.kicked(TX_QUEUE), "first batch kicks");
    assert!(net.send_frame(&frame(2, 60)).unwrap());
    net.flush().unwrap();
    assert!(
        !dev.kicked(TX_QUEUE),
        "device has not re-armed (it is still processing): no kick"
    );
    assert_eq!(dev.transmitted().len(), 3);
    assert!(net.send_frame(&frame(3, 60)).unwrap());
    net.flush().unwrap();
    assert!(dev.kicked(TX_QUEUE), "device re-armed after draining: kick");
    // A flush with nothing new never kicks.
    dev.transmitted();
    net.flush().unwrap();
    assert!(!dev.kicked(TX_QUEUE));
}

#[test]
fn rx_notifications_follow_used_event() {
    let (mut net, mut dev) = pair(BASE | EVENT_IDX, 16, 8);
    let t = Instant::now();
    assert!(!net.wait(Duration::from_millis(20)).unwrap());
    assert!(t.elapsed() >= Duration::from_millis(15));
    // Armed by that wait: the first frame notifies, the second does not (not re-armed).
    assert!(dev.deliver(&frame(0, 60)));
    assert!(dev.deliver(&frame(1, 60)));
    assert_eq!(dev.calls[RX_QUEUE], 1);
    assert!(net.wait(Duration::from_secs(5)).unwrap());
    assert_eq!(recv_all(&mut net).len(), 2);
    // Re-armed by the next wait (which times out), the next frame notifies again.
    assert!(!net.wait(Duration::from_millis(1)).unwrap());
    assert!(dev.deliver(&frame(2, 60)));
    assert_eq!(dev.calls[RX_QUEUE], 2);
    // Work already pending: wait returns at once without sleeping.
    let t = Instant::now();
    assert!(net.wait(Duration::from_secs(5)).unwrap());
    assert!(t.elapsed() < Duration::from_secs(1));
}

#[test]
fn rx_refill_kicks_only_when_the_device_ran_dry_and_asked() {
    let (mut net, mut dev) = pair(BASE | EVENT_IDX, 16, 8);
    assert!(dev.deliver(&frame(0, 60)));
    // The device still holds 15 buffers and has not asked for a kick: the refill is silent.
    recv_all(&mut net);
    assert!(!dev.kicked(RX_QUEUE));
    // The device uses every buffer it has, then asks to be kicked (avail_event = its position).
    for i in 0..16 {
        assert!(dev.deliver(&frame(i, 60)));
    }
    assert!(!dev.deliver(&frame(99, 60)), "out of buffers");
    assert!(!dev.rx.enable_notification(dev.mem.as_ref()).unwrap());
    let mut out = Vec::new();
    assert_eq!(net.recv_frames(&mut out, 1).unwrap(), 1);
    assert!(dev.kicked(RX_QUEUE), "the first refill crosses avail_event");
    assert_eq!(net.recv_frames(&mut out, 100).unwrap(), 15);
    assert!(!dev.kicked(RX_QUEUE), "one kick per batch");
    assert_eq!(dev.rx_available(), 16);
}

#[test]
fn oversized_frames_are_refused() {
    let (mut net, _dev) = pair(BASE, 16, 8);
    assert!(matches!(
        net.send_frame(&vec![0; MAX_TX_FRAME + 1]),
        Err(VirtioUserError::FrameTooLarge { len, max: MAX_TX_FRAME }) if len == MAX_TX_FRAME + 1
    ));
    assert!(net.send_frame(&vec![0; MAX_TX_FRAME]).unwrap());
}

#[test]
fn a_short_rx_header_breaks_the_device() {
    let (mut net, mut dev) = pair(BASE | MRG_RXBUF, 16, 8);
    dev.deliver_raw(&[0; 5], 5);
    let err = net.recv_frames(&mut Vec::new(), 10).unwrap_err();
    assert!(matches!(
        err,
        VirtioUserError::Device(NetDeviceError::RxHeaderTooShort { len: 5, .. })
    ));
    // Sticky.
    assert!(matches!(
        net.send_frame(&frame(0, 60)),
        Err(VirtioUserError::Device(_))
    ));
    assert!(matches!(
        net.wait(Duration::ZERO),
        Err(VirtioUserError::Device(_))
    ));
}

#[test]
fn impossible_num_buffers_break_the_device() {
    for bad in [0u16, 17, u16::MAX] {
        let (mut net, mut dev) = pair(BASE | MRG_RXBUF, 16, 8);
        let mut hdr = [0u8; 20];
        hdr[10..12].copy_from_slice(&bad.to_le_bytes());
        dev.deliver_raw(&hdr, 20);
        assert!(matches!(
            net.recv_frames(&mut Vec::new(), 10),
            Err(VirtioUserError::Device(NetDeviceError::BadNumBuffers { num, max: 16 })) if num == bad
        ));
    }
    // Without MRG_RXBUF num_buffers is ignored (the frame is one buffer by definition).
    let (mut net, mut dev) = pair(BASE, 16, 8);
    let mut bytes = vec![0u8; 20];
    bytes[10] = 9;
    bytes[12..].copy_from_slice(b"abcdefgh");
    dev.deliver_raw(&bytes, 20);
    assert_eq!(recv_all(&mut net), vec![b"abcdefgh".to_vec()]);
}

#[test]
fn hostile_used_elements_are_errors() {
    let (mut net, mut dev) = pair(BASE | EVENT_IDX, 16, 8);
    dev.deliver_raw(&[0; 12], BUFFER_SIZE + 1);
    assert!(matches!(
        net.recv_frames(&mut Vec::new(), 10),
        Err(VirtioUserError::Ring(RingError::UsedLenTooLarge { len, .. })) if len == BUFFER_SIZE + 1
    ));

    let (mut net, mut dev) = pair(BASE | EVENT_IDX, 16, 8);
    dev.hostile_rx_used(16, 60);
    assert!(matches!(
        net.recv_frames(&mut Vec::new(), 10),
        Err(VirtioUserError::Ring(RingError::BadUsedId { id: 16, .. }))
    ));
    assert!(matches!(
        net.recv_frames(&mut Vec::new(), 10),
        Err(VirtioUserError::Ring(RingError::BadUsedId { .. }))
    ));
}

#[test]
fn bad_queue_sizes_are_refused() {
    use crate::virtio_user::memory::MemfdMemory;
    use crate::virtio_user::notifier::{CallWaiter, QueueEventFds};
    use crate::virtio_user::vhost_setup::Negotiated;
    for size in [0u16, 1, 3, 100] {
        let memory = Arc::new(MemfdMemory::new(8 << 20).unwrap());
        let fds = QueueEventFds::new().unwrap();
        let waiter = CallWaiter::new(&fds, None).unwrap();
        let neg = Negotiated {
            features: BASE,
            mac: super::test_device::MAC,
            link_up: None,
            protocol: vhost::vhost_user::VhostUserProtocolFeatures::empty(),
        };
        assert!(matches!(
            VirtioNet::assemble(memory, neg, size, fds, waiter),
            Err(VirtioUserError::BadQueueSize(s)) if s == size
        ));
    }
}
