//! The control client against a fake engine: a thread that drives the device side of the NIC
//! (virtio-queue, see `virtio_user::test_device`), answers control requests the way the
//! engine's control path does, initialises channel headers, and sends wakes and raw frames.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use svnic_client::{Completions, OwnedChannelError};

use svnic_channels::frame::{
    ControlOp, ControlResponse, ControlStatus, CreateRequest, Frame, FrameBody,
};
use svnic_channels::layout::{header, DEFAULT_REGION_LEN};
use svnic_channels::{ChannelId, ChannelLayout, FailureReason, MacAddr, SharedRegion};

use super::*;
use crate::virtio_user::virtio_net::test_device::{
    pair, TestDevice, BASE, EVENT_IDX, MAC, MRG_RXBUF,
};
use svnic_client::channel::Waiter;

const SECOND: Duration = Duration::from_secs(1);
const LONG: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Log {
    creates: Vec<CreateRequest>,
    destroys: Vec<ChannelId>,
    doorbells: Vec<ChannelId>,
    raw: Vec<Vec<u8>>,
    regions: HashMap<ChannelId, SharedRegion>,
}

#[derive(Clone, Default)]
struct Behaviour {
    refuse: HashMap<u32, FailureReason>,
    hold_answers: bool,
    refuse_destroy: bool,
    paused: bool,
}

/// Answers held until released.
fn holding_answers() -> Behaviour {
    Behaviour {
        hold_answers: true,
        ..Behaviour::default()
    }
}

enum Cmd {
    Deliver(Vec<u8>),
    Behave(Behaviour),
    Release,
    Stop,
}

struct FakeEngine {
    cmds: Sender<Cmd>,
    log: Arc<Mutex<Log>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeEngine {
    fn start(dev: TestDevice, behaviour: Behaviour) -> Self {
        let (cmds, rx) = channel();
        let log = Arc::new(Mutex::new(Log::default()));
        let log2 = log.clone();
        let thread = std::thread::spawn(move || engine_loop(dev, behaviour, rx, log2));
        FakeEngine {
            cmds,
            log,
            thread: Some(thread),
        }
    }

    fn behave(&self, b: Behaviour) {
        self.cmds.send(Cmd::Behave(b)).unwrap();
    }

    fn release(&self) {
        self.cmds.send(Cmd::Release).unwrap();
    }

    fn deliver(&self, frame: Vec<u8>) {
        self.cmds.send(Cmd::Deliver(frame)).unwrap();
    }

    fn wake(&self, channel: u32) {
        self.deliver(
            Frame {
                dst: MAC,
                src: MacAddr::ENGINE,
                body: FrameBody::Wake {
                    channel: ChannelId(channel),
                },
            }
            .encode()
            .unwrap(),
        );
    }

    fn log<R>(&self, f: impl FnOnce(&Log) -> R) -> R {
        f(&self.log.lock().unwrap())
    }
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        let _ = self.cmds.send(Cmd::Stop);
        if let Some(t) = self.thread.take() {
            let failed = t.join().is_err();
            if failed && !std::thread::panicking() {
                panic!("the fake engine thread panicked");
            }
        }
    }
}

fn response(request_id: u32, channel: ChannelId, status: ControlStatus) -> Vec<u8> {
    Frame {
        dst: MAC,
        src: MacAddr::ENGINE,
        body: FrameBody::ControlResponse(ControlResponse {
            request_id,
            channel,
            status,
        }),
    }
    .encode()
    .unwrap()
}

fn engine_loop(mut dev: TestDevice, mut b: Behaviour, rx: Receiver<Cmd>, log: Arc<Mutex<Log>>) {
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut next_channel = 100u32;
    loop {
        while let Ok(cmd) = rx.try_recv() {
            match cmd {
                Cmd::Deliver(f) => out.push(f),
                Cmd::Behave(nb) => b = nb,
                Cmd::Release => out.append(&mut held),
                Cmd::Stop => return,
            }
        }
        if !b.paused {
            for bytes in dev.transmitted() {
                assert_eq!(
                    &bytes[6..12],
                    &MAC.0,
                    "guest frames come from the NIC's MAC"
                );
                let mut log = log.lock().unwrap();
                let Ok(frame) = Frame::decode(&bytes) else {
                    log.raw.push(bytes);
                    continue;
                };
                match frame.body {
                    FrameBody::ControlRequest(req) => {
                        assert_eq!(frame.dst, MacAddr::ENGINE);
                        let mut answers = Vec::new();
                        match req.op {
                            ControlOp::Create(c) => {
                                log.creates.push(c);
                                if let Some(reason) = b.refuse.get(&c.endpoint) {
                                    out.push(response(
                                        req.request_id,
                                        ChannelId(0),
                                        ControlStatus::Failure(*reason),
                                    ));
                                    continue;
                                }
                                next_channel += 1;
                                let ch = ChannelId(next_channel);
                                out.push(response(req.request_id, ch, ControlStatus::Pending));
                                let region = SharedRegion::from_guest_memory(
                                    dev.mem.clone(),
                                    c.region_addr,
                                    c.region_len,
                                )
                                .unwrap();
                                let layout = ChannelLayout::new(c.ring_size, c.region_len).unwrap();
                                region
                                    .channel(layout)
                                    .unwrap()
                                    .init_header(ch.0, 0, Some(1))
                                    .unwrap();
                                log.regions.insert(ch, region);
                                answers.push(response(
                                    req.request_id,
                                    ch,
                                    ControlStatus::Success {
                                        worker: 0,
                                        cpu: Some(1),
                                    },
                                ));
                            }
                            ControlOp::Destroy { channel } => {
                                log.destroys.push(channel);
                                let status = if b.refuse_destroy {
                                    ControlStatus::Failure(FailureReason::NoSuchChannel)
                                } else {
                                    log.regions.remove(&channel);
                                    ControlStatus::Destroyed
                                };
                                answers.push(response(req.request_id, channel, status));
                            }
                        }
                        if b.hold_answers {
                            held.append(&mut answers);
                        } else {
                            out.append(&mut answers);
                        }
                    }
                    FrameBody::Doorbell { channel } => log.doorbells.push(channel),
                    _ => {}
                }
            }
        }
        out.retain(|f| !dev.deliver(f));
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn setup(b: Behaviour) -> (HostGuest, FakeEngine) {
    let (net, dev) = pair(BASE | EVENT_IDX | MRG_RXBUF, 64, 32);
    (HostGuest::new(net), FakeEngine::start(dev, b))
}

fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < LONG, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn create_then_destroy_and_the_region_comes_back() {
    let (client, engine) = setup(Behaviour::default());
    let free = client.memory().free_bytes();
    let ch = client.create_channel(7, 256, LONG).unwrap();
    assert_eq!(ch.addr().mac, MAC);
    assert_eq!(ch.addr().endpoint, 7);
    assert_eq!(ch.served_by(), (0, Some(1)));
    assert_eq!(client.memory().free_bytes(), free - DEFAULT_REGION_LEN);
    let created = engine.log(|l| l.creates.clone());
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].mac, MAC);
    assert_eq!(created[0].endpoint, 7);
    assert_eq!(created[0].ring_size, 256);
    assert_eq!(created[0].region_addr % (2 << 20), 0);
    assert_eq!(created[0].region_len, DEFAULT_REGION_LEN);
    assert_eq!(client.channel_counts(), (1, 0, 0));

    let id = ch.id();
    client.destroy_channel(ch, LONG).unwrap();
    assert_eq!(engine.log(|l| l.destroys.clone()), vec![ChannelId(id)]);
    assert_eq!(client.memory().free_bytes(), free);
    assert_eq!(client.channel_counts(), (0, 0, 0));
    assert!(client.stats().responses >= 3, "pending, success, destroyed");
}

#[test]
fn a_refused_create_reports_the_reason_and_frees_the_region() {
    let mut b = Behaviour::default();
    b.refuse.insert(13, FailureReason::EndpointTaken);
    let (client, _engine) = setup(b);
    let free = client.memory().free_bytes();
    assert!(matches!(
        client.create_channel(13, 64, LONG),
        Err(ClientError::Refused(FailureReason::EndpointTaken))
    ));
    assert_eq!(client.memory().free_bytes(), free);
    assert_eq!(client.channel_counts(), (0, 0, 0));
}

#[test]
fn parameters_are_checked_before_asking_the_engine() {
    let (client, engine) = setup(Behaviour::default());
    assert!(matches!(
        client.begin_create(1, 100, DEFAULT_REGION_LEN),
        Err(ClientError::BadParameters(_))
    ));
    assert!(matches!(
        client.begin_create(1, 256, 4096),
        Err(ClientError::BadParameters(_))
    ));
    assert!(matches!(
        client.begin_create(1, 256, 1 << 30),
        Err(ClientError::Memory(_))
    ));
    client.poll_control().unwrap();
    assert!(engine.log(|l| l.creates.is_empty()));
}

#[test]
fn begin_create_is_non_blocking_and_state_follows_the_answers() {
    let b = holding_answers();
    let (client, engine) = setup(b);
    let mut pending = client.begin_create(5, 64, DEFAULT_REGION_LEN).unwrap();
    // The engine saw the request and answered Pending; the final answer is held.
    eventually("the create request", || {
        engine.log(|l| l.creates.len() == 1)
    });
    for _ in 0..20 {
        pending = match pending.state().unwrap() {
            CreateState::Pending(p) => p,
            other => panic!("expected pending, got {other:?}"),
        };
        std::thread::sleep(Duration::from_millis(1));
    }
    engine.release();
    let ch = loop {
        match pending.state().unwrap() {
            CreateState::Pending(p) => pending = p,
            CreateState::Success(ch) => break ch,
            CreateState::Failure(r) => panic!("refused: {r}"),
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(ch.addr().endpoint, 5);
}

#[test]
fn a_timed_out_create_is_destroyed_when_the_engine_finally_answers() {
    let b = holding_answers();
    let (client, engine) = setup(b);
    let free = client.memory().free_bytes();
    assert!(matches!(
        client.create_channel(9, 64, Duration::from_millis(50)),
        Err(ClientError::Timeout {
            what: "channel create",
            ..
        })
    ));
    // Not freed: the engine may still create the channel.
    assert_eq!(client.memory().free_bytes(), free - DEFAULT_REGION_LEN);
    engine.behave(Behaviour::default());
    engine.release();
    eventually("the automatic destroy", || {
        client.poll_control().unwrap();
        client.memory().free_bytes() == free
    });
    assert_eq!(engine.log(|l| l.destroys.len()), 1);
    assert_eq!(client.channel_counts(), (0, 0, 0));
}

#[test]
fn a_destroy_frees_the_region_only_when_acknowledged() {
    let (client, engine) = setup(Behaviour::default());
    let free = client.memory().free_bytes();
    let ch = client.create_channel(3, 64, LONG).unwrap();
    engine.behave(holding_answers());
    assert!(matches!(
        client.destroy_channel(ch, Duration::from_millis(50)),
        Err(ClientError::Timeout {
            what: "channel destroy",
            ..
        })
    ));
    client.poll_control().unwrap();
    assert_eq!(client.memory().free_bytes(), free - DEFAULT_REGION_LEN);
    engine.release();
    eventually("the late Destroyed", || {
        client.poll_control().unwrap();
        client.memory().free_bytes() == free
    });
}

#[test]
fn a_refused_destroy_quarantines_the_region() {
    let (client, engine) = setup(Behaviour::default());
    let free = client.memory().free_bytes();
    let ch = client.create_channel(3, 64, LONG).unwrap();
    let id = ch.id();
    engine.behave(Behaviour {
        refuse_destroy: true,
        ..Behaviour::default()
    });
    assert!(matches!(
        client.destroy_channel(ch, LONG),
        Err(ClientError::DestroyRefused { channel, reason: FailureReason::NoSuchChannel })
            if channel == ChannelId(id)
    ));
    assert_eq!(client.memory().free_bytes(), free - DEFAULT_REGION_LEN);
    assert_eq!(client.channel_counts(), (0, 0, 1));
}

#[test]
fn destroying_an_unknown_channel_is_refused_locally() {
    let (client, _engine) = setup(Behaviour::default());
    let ch = client.create_channel(3, 64, LONG).unwrap();
    let id = ch.id();
    let (client2, _engine2) = setup(Behaviour::default());
    assert!(matches!(
        client2.destroy_channel(ch, LONG),
        Err(ClientError::Channel(OwnedChannelError::Unknown(c))) if c == ChannelId(id)
    ));
}

#[test]
fn frames_are_demultiplexed() {
    let (client, engine) = setup(Behaviour::default());
    let raw1 = vec![0xabu8; 80];
    let mut raw2 = vec![0u8; 64];
    raw2[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    engine.deliver(raw1.clone());
    engine.wake(55);
    // An svnic frame that does not decode, and a well-formed one not from the engine.
    let mut garbage = vec![0u8; 60];
    garbage[12..14].copy_from_slice(&0x88B5u16.to_be_bytes());
    engine.deliver(garbage);
    let forged = Frame {
        dst: MAC,
        src: MacAddr([2, 0, 0, 0, 0, 9]),
        body: FrameBody::Wake {
            channel: ChannelId(56),
        },
    }
    .encode()
    .unwrap();
    engine.deliver(forged);
    // A response nobody asked for.
    engine.deliver(response(999, ChannelId(1), ControlStatus::Destroyed));
    engine.deliver(raw2.clone());
    let mut got = Vec::new();
    eventually("two raw frames", || {
        client.recv_raw(&mut got, 10).unwrap();
        got.len() == 2
    });
    assert_eq!(got, vec![raw1, raw2]);
    let stats = client.stats();
    assert_eq!(stats.raw_received, 2);
    assert_eq!(stats.wakes, 1);
    assert_eq!(stats.svnic_dropped, 2);
    assert_eq!(stats.ignored_responses, 1);
    // The wake is kept for its channel's waiter.
    let w = ChannelWaiter::new(client.shared.clone(), 55);
    assert!(w.wait_for_wake(Duration::ZERO).unwrap());
    assert!(!w.wait_for_wake(Duration::from_millis(5)).unwrap());
}

#[test]
fn wait_raw_blocks_until_a_frame_arrives() {
    let (client, engine) = setup(Behaviour::default());
    let t = Instant::now();
    assert!(!client.wait_raw(Duration::from_millis(30)).unwrap());
    assert!(t.elapsed() >= Duration::from_millis(25));
    let c2 = client.clone();
    let waiter = std::thread::spawn(move || c2.wait_raw(LONG).unwrap());
    std::thread::sleep(Duration::from_millis(20));
    engine.deliver(vec![1u8; 60]);
    assert!(waiter.join().unwrap());
    let mut got = Vec::new();
    assert_eq!(client.recv_raw(&mut got, 10).unwrap(), 1);
}

#[test]
fn raw_frames_go_out_through_the_nic() {
    let (client, engine) = setup(Behaviour::default());
    let mut frame = vec![7u8; 100];
    frame[6..12].copy_from_slice(&MAC.0);
    assert!(client.send_raw(&frame).unwrap());
    eventually("the raw frame", || {
        engine.log(|l| l.raw == vec![frame.clone()])
    });
}

#[test]
fn doorbells_reach_the_engine_when_its_worker_sleeps() {
    let (client, engine) = setup(Behaviour::default());
    let mut ch = client.create_channel(4, 64, LONG).unwrap();
    let id = ChannelId(ch.id());
    let dest = ch.addr();
    // Worker awake: no doorbell.
    assert!(ch.send_user(dest, 1, b"hi", Completions::OnError).unwrap());
    ch.flush().unwrap();
    // Worker asleep: one doorbell per flush.
    engine.log(|l| {
        let region = &l.regions[&id];
        let layout = *ch.layout();
        region
            .channel(layout)
            .unwrap()
            .set_sleeping(header::ENGINE_SLEEPING, true);
    });
    assert!(ch.send_user(dest, 2, b"a", Completions::OnError).unwrap());
    assert!(ch.send_user(dest, 3, b"b", Completions::OnError).unwrap());
    ch.flush().unwrap();
    eventually("the doorbell", || engine.log(|l| l.doorbells == vec![id]));
    assert_eq!(client.stats().doorbells, 1);
}

#[test]
fn deferred_doorbells_go_out_when_the_tx_ring_has_room() {
    let (client, engine) = setup(Behaviour::default());
    let ch = client.create_channel(4, 64, LONG).unwrap();
    engine.behave(Behaviour {
        paused: true,
        ..Behaviour::default()
    });
    let mut frame = vec![0u8; 60];
    frame[6..12].copy_from_slice(&MAC.0);
    while client.send_raw(&frame).unwrap() {}
    let bell = client.doorbell();
    bell.ring(ch.id());
    bell.ring(ch.id());
    assert!(client.stats().doorbells_deferred >= 1);
    assert_eq!(client.stats().doorbells, 0);
    engine.behave(Behaviour::default());
    eventually("the deferred doorbell", || {
        client.poll_control().unwrap();
        engine.log(|l| l.doorbells.len()) == 1
    });
}

#[test]
fn a_waiter_returns_when_its_wake_arrives_and_keeps_early_wakes() {
    let (client, engine) = setup(Behaviour::default());
    let ch = client.create_channel(4, 64, LONG).unwrap();
    let waiter = client.waiter(&ch);
    let t = Instant::now();
    waiter.wait(Duration::from_millis(30));
    assert!(
        t.elapsed() >= Duration::from_millis(25),
        "no wake: full timeout"
    );
    // A wake that arrives before the wait is not lost.
    engine.wake(ch.id());
    eventually("the wake", || {
        client.poll_control().unwrap();
        client.stats().wakes == 1
    });
    let t = Instant::now();
    waiter.wait(LONG);
    assert!(t.elapsed() < SECOND);
    // A wake during the wait ends it.
    let w2 = waiter.clone();
    let th = std::thread::spawn(move || {
        let t = Instant::now();
        assert!(w2.wait_for_wake(LONG).unwrap());
        t.elapsed()
    });
    std::thread::sleep(Duration::from_millis(20));
    engine.wake(ch.id());
    assert!(th.join().unwrap() < Duration::from_secs(5));
}

#[test]
fn many_threads_wait_at_once_and_each_gets_its_wake() {
    let (client, engine) = setup(Behaviour::default());
    let channels: Vec<Channel> = (0..4)
        .map(|e| client.create_channel(e, 64, LONG).unwrap())
        .collect();
    for round in 0..20 {
        let threads: Vec<_> = channels
            .iter()
            .map(|ch| {
                let w = client.waiter(ch);
                std::thread::spawn(move || w.wait_for_wake(LONG).unwrap())
            })
            .collect();
        std::thread::sleep(Duration::from_millis(2));
        // Wake them in an order that differs per round.
        for i in 0..channels.len() {
            engine.wake(channels[(i + round) % channels.len()].id());
        }
        for t in threads {
            assert!(t.join().unwrap(), "round {round}: a waiter timed out");
        }
    }
}
