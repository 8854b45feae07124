//! The control path, frames in and frames out: Pending then Success or Failure, destroy, doorbells,
//! wakes, and the frames a guest must not be able to use.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};

use support::*;
use svnic_backend::control_path::{ControlPath, FrameOut};
use svnic_channels::frame::{
    ControlOp, ControlRequest, ControlStatus, CreateRequest, Frame, FrameBody,
};
use svnic_channels::{ChannelId, FailureReason, MacAddr};
use svnic_control::GuestId;

#[derive(Default)]
struct Recorder(Mutex<Vec<(GuestId, Vec<u8>)>>);

impl FrameOut for Recorder {
    fn send(&self, port: GuestId, frame: &[u8]) -> bool {
        self.0.lock().unwrap().push((port, frame.to_vec()));
        true
    }
}

impl Recorder {
    fn take(&self) -> Vec<(GuestId, Frame<'static>)> {
        self.0
            .lock()
            .unwrap()
            .drain(..)
            .map(|(p, b)| {
                let leaked: &'static [u8] = Box::leak(b.into_boxed_slice());
                (p, Frame::decode(leaked).unwrap())
            })
            .collect()
    }
    fn statuses(&self) -> Vec<(u32, ControlStatus)> {
        self.take()
            .into_iter()
            .map(|(_, f)| match f.body {
                FrameBody::ControlResponse(r) => (r.request_id, r.status),
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    }
}

fn request(src: MacAddr, request_id: u32, op: ControlOp) -> Vec<u8> {
    Frame {
        dst: MacAddr::ENGINE,
        src,
        body: FrameBody::ControlRequest(ControlRequest { request_id, op }),
    }
    .encode()
    .unwrap()
}

fn create(
    mac: MacAddr,
    endpoint: u32,
    ring_size: u32,
    region_addr: u64,
    region_len: u64,
) -> ControlOp {
    ControlOp::Create(CreateRequest {
        mac,
        endpoint,
        ring_size,
        region_addr,
        region_len,
    })
}

#[test]
fn create_answers_pending_then_success_from_the_engine_mac() {
    let engine = engine(1);
    let out = Arc::new(Recorder::default());
    let cp = ControlPath::new(engine.clone(), out.clone());
    let g = FakeGuest::new(&engine, 1, 8);
    cp.handle(g.id, &request(g.mac, 7, create(g.mac, 3, 256, 0, 2 << 20)));
    let frames = out.take();
    assert_eq!(frames.len(), 2);
    for (port, f) in &frames {
        assert_eq!(*port, g.id);
        assert_eq!((f.src, f.dst), (MacAddr::ENGINE, g.mac));
    }
    let FrameBody::ControlResponse(p) = frames[0].1.body else {
        panic!()
    };
    let FrameBody::ControlResponse(s) = frames[1].1.body else {
        panic!()
    };
    assert_eq!((p.request_id, p.status), (7, ControlStatus::Pending));
    assert!(matches!(
        s.status,
        ControlStatus::Success {
            worker: 0,
            cpu: None
        }
    ));
    assert_eq!(p.channel, s.channel);
    // The channel works: attach to the region the request named.
    let ch = g.attach(0, 2 << 20, 3);
    assert_eq!(ch.id(), s.channel.0);
}

#[test]
fn each_refusal_is_a_failure_with_its_reason() {
    let engine = engine(1);
    let out = Arc::new(Recorder::default());
    let cp = ControlPath::new(engine.clone(), out.clone());
    let g = FakeGuest::with_policy(&engine, 1, 8, |p| p.max_channels = 1);
    let mb = 1u64 << 20;
    cp.handle(g.id, &request(g.mac, 1, create(g.mac, 1, 100, 0, mb)));
    assert_eq!(
        out.statuses(),
        vec![(1, ControlStatus::Failure(FailureReason::BadRingSize))]
    );
    cp.handle(g.id, &request(g.mac, 2, create(g.mac, 1, 64, 64 * mb, mb)));
    let st = out.statuses();
    assert_eq!(
        st.last(),
        Some(&(
            2,
            ControlStatus::Failure(FailureReason::RegionOutsideMemory)
        ))
    );
    cp.handle(
        g.id,
        &request(g.mac, 3, create(MacAddr([2, 0, 0, 0, 0, 9]), 1, 64, 0, mb)),
    );
    assert_eq!(
        out.statuses(),
        vec![(3, ControlStatus::Failure(FailureReason::MacNotOwned))]
    );
    cp.handle(g.id, &request(g.mac, 4, create(g.mac, 1, 64, 0, mb)));
    assert!(matches!(
        out.statuses().last(),
        Some((4, ControlStatus::Success { .. }))
    ));
    cp.handle(g.id, &request(g.mac, 5, create(g.mac, 2, 64, mb, mb)));
    assert_eq!(
        out.statuses(),
        vec![(5, ControlStatus::Failure(FailureReason::QuotaExceeded))]
    );
}

#[test]
fn a_malformed_request_is_answered_bad_request_and_garbage_is_dropped() {
    let engine = engine(1);
    let out = Arc::new(Recorder::default());
    let cp = ControlPath::new(engine.clone(), out.clone());
    let g = FakeGuest::new(&engine, 1, 8);
    let mut bytes = request(g.mac, 9, create(g.mac, 1, 64, 0, 1 << 20));
    bytes[18 + 5] = 0x7f; // an unknown op
    cp.handle(g.id, &bytes);
    assert_eq!(
        out.statuses(),
        vec![(9, ControlStatus::Failure(FailureReason::BadRequest))]
    );
    for garbage in [&[][..], &[0u8; 13][..], &[0xffu8; 200][..]] {
        cp.handle(g.id, garbage);
    }
    assert!(out.take().is_empty());
    assert_eq!(
        cp.counters()
            .dropped
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
}

#[test]
fn a_guest_cannot_speak_for_another_guest() {
    let engine = engine(1);
    let out = Arc::new(Recorder::default());
    let cp = ControlPath::new(engine.clone(), out.clone());
    let ga = FakeGuest::new(&engine, 1, 8);
    let gb = FakeGuest::new(&engine, 2, 8);
    // A spoofs B's MAC as source: dropped, nothing created, nothing answered.
    cp.handle(
        ga.id,
        &request(gb.mac, 1, create(gb.mac, 1, 64, 0, 1 << 20)),
    );
    assert!(out.take().is_empty());
    assert!(engine.channel_records().is_empty());
    // B creates a channel; A can neither destroy it nor ring its doorbell.
    cp.handle(
        gb.id,
        &request(gb.mac, 2, create(gb.mac, 1, 64, 0, 1 << 20)),
    );
    let ch = match out.statuses().last() {
        Some((2, ControlStatus::Success { .. })) => engine.channel_records()[0].id,
        other => panic!("{other:?}"),
    };
    cp.handle(
        ga.id,
        &request(ga.mac, 3, ControlOp::Destroy { channel: ch }),
    );
    assert_eq!(
        out.statuses(),
        vec![(3, ControlStatus::Failure(FailureReason::NoSuchChannel))]
    );
    let bell = Frame {
        dst: MacAddr::ENGINE,
        src: ga.mac,
        body: FrameBody::Doorbell { channel: ch },
    }
    .encode()
    .unwrap();
    cp.handle(ga.id, &bell);
    assert_eq!(
        cp.counters()
            .doorbells
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    // B can.
    cp.handle(
        gb.id,
        &request(gb.mac, 4, ControlOp::Destroy { channel: ch }),
    );
    assert_eq!(out.statuses(), vec![(4, ControlStatus::Destroyed)]);
}

#[test]
fn the_waker_sends_wake_frames_to_the_guest() {
    let engine = engine(1);
    let out = Arc::new(Recorder::default());
    let cp = ControlPath::new(engine.clone(), out.clone());
    let g = FakeGuest::new(&engine, 1, 8);
    cp.waker(g.id, g.mac).wake(ChannelId(5));
    let frames = out.take();
    assert_eq!(frames.len(), 1);
    assert_eq!((frames[0].1.src, frames[0].1.dst), (MacAddr::ENGINE, g.mac));
    assert!(matches!(
        frames[0].1.body,
        FrameBody::Wake {
            channel: ChannelId(5)
        }
    ));
}
