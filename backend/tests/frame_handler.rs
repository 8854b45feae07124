//! The frame handler, frames in and frames out: Pending then Success or Failure, destroy, doorbells,
//! wakes, and the frames a guest must not be able to use.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use svnic_backend::frame_handler::{FrameHandler, FrameOut};
use svnic_backend::Engine;
use svnic_channels::frame::{ControlOp, ControlStatus, Frame, FrameBody};
use svnic_channels::{ChannelId, FailureReason, MacAddr};
use svnic_control_plane::GuestId;
use svnic_tests::fake_guest::*;
use svnic_tests::frames::{control_request as request, create_op as create};
use svnic_tests::logs;

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

/// An engine of one worker and a control path in front of it that records what it answers.
fn frame_handler() -> (Engine, Arc<Recorder>, Arc<FrameHandler>) {
    let engine = engine(1);
    let out = Arc::new(Recorder::default());
    let cp = FrameHandler::new(engine.clone(), out.clone());
    (engine, out, cp)
}

#[test]
fn create_answers_pending_then_success_from_the_engine_mac() {
    let (engine, out, cp) = frame_handler();
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
    let (engine, out, cp) = frame_handler();
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
    let (engine, out, cp) = frame_handler();
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
    let (engine, out, cp) = frame_handler();
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
    let (engine, out, cp) = frame_handler();
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

/// Log lines written on the current test's thread, captured at every level.
fn lines_of_this_test() -> Vec<(log::Level, String)> {
    logs::of_this_thread()
        .into_iter()
        .map(|l| (l.level, l.text))
        .collect()
}

fn capture_logs() {
    logs::capture(log::LevelFilter::Trace);
}

#[test]
fn a_create_fail_loop_is_rate_limited_counted_and_kept_out_of_the_info_log() {
    capture_logs();
    let (engine, out, cp) = frame_handler();
    let g = FakeGuest::with_policy(&engine, 1, 8, |p| {
        p.create_burst = 4;
        p.creates_per_sec = 1;
    });
    let setup_lines = lines_of_this_test().len();
    // A region past the guest's 8 MiB: admitted, then failed by the engine, again and again.
    let outside = create(g.mac, 1, 256, 64 << 20, 2 << 20);
    for id in 0..5 {
        cp.handle(g.id, &request(g.mac, id, outside));
    }
    let failed = ControlStatus::Failure(FailureReason::RegionOutsideMemory);
    let mut expected = Vec::new();
    for id in 0..4 {
        expected.extend([(id, ControlStatus::Pending), (id, failed)]);
    }
    expected.push((4, ControlStatus::Failure(FailureReason::RateLimited)));
    assert_eq!(out.statuses(), expected);

    let c = cp.counters();
    let read = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(read(&c.requests), 9);
    assert_eq!(
        (read(&c.creates_failed), read(&c.creates_succeeded)),
        (4, 0)
    );
    assert_eq!(
        (read(&c.creates_refused), read(&c.creates_rate_limited)),
        (1, 1)
    );

    // Every line about these requests is still written, at debug: none at info or above.
    let lines = lines_of_this_test().split_off(setup_lines);
    assert!(
        lines.iter().any(|(level, msg)| *level == log::Level::Debug
            && msg.contains("failed")
            && msg.contains("region outside guest memory")),
        "{lines:?}"
    );
    let loud: Vec<_> = lines
        .iter()
        .filter(|(level, _)| *level <= log::Level::Info)
        .collect();
    assert!(loud.is_empty(), "{loud:?}");
}

/// A `FrameOut` whose guest never drains its RX queue.
struct Full;

impl FrameOut for Full {
    fn send(&self, _port: GuestId, _frame: &[u8]) -> bool {
        false
    }
}

#[test]
fn undeliverable_engine_frames_are_counted_and_their_warnings_limited() {
    capture_logs();
    let engine = engine(1);
    let cp = FrameHandler::new(engine.clone(), Arc::new(Full));
    let g = FakeGuest::new(&engine, 1, 8);
    let waker = cp.waker(g.id, g.mac);
    for i in 0..1000 {
        waker.wake(ChannelId(i));
    }
    let undeliverable = cp
        .counters()
        .undeliverable
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(undeliverable, 1000);
    let warnings = lines_of_this_test()
        .into_iter()
        .filter(|(level, msg)| *level == log::Level::Warn && msg.contains("could not be queued"))
        .count();
    // One budget per second of the call site; the loop takes far less than a few seconds.
    let per_window = svnic_control_plane::log_limit::LINES_PER_WINDOW as usize;
    assert!(
        (1..=3 * per_window).contains(&warnings),
        "{warnings} warnings for 1000 undeliverable frames"
    );
}
