//! End to end: two host-process guests (virtio-user frontends on memfd memory) connected over
//! real vhost-user sockets to the svnic backend — its switch (`svnic_backend::net`), engine and
//! control path, wired as the daemon wires them — exchange raw frames through the switch, then
//! create channels through the control path and exchange messages through the engine, sleeping
//! and being woken by wake frames, and destroy them.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};
use svnic_client::Completions;

use svnic_backend::frame_handler::{FrameHandler, FrameOut};
use svnic_backend::net::{serve_port, PortEvents, PortId, StopSignal, Switch, SwitchConfig};
use svnic_backend::Engine;
use svnic_channels::layout::DEFAULT_REGION_LEN;
use svnic_channels::{MacAddr, Message};
use svnic_control_plane::GuestPolicy;
use svnic_host_frontend::HostGuest;
use vm_memory::GuestMemoryMmap;

const A: MacAddr = MacAddr([0x52, 0x54, 0, 0x5e, 0, 0xa]);
const B: MacAddr = MacAddr([0x52, 0x54, 0, 0x5e, 0, 0xb]);
const LONG: Duration = Duration::from_secs(20);

/// The daemon's glue, minimal: memory tables to the engine, svnic frames to the control path,
/// control responses and wakes back through the switch.
struct Glue {
    engine: Engine,
    control: OnceLock<Arc<FrameHandler>>,
    switch: OnceLock<Weak<Switch>>,
}

impl PortEvents for Glue {
    fn memory_changed(&self, port: PortId, mem: Option<Arc<GuestMemoryMmap>>) {
        self.engine.set_guest_memory(port, mem).unwrap();
    }

    fn svnic_frame(&self, port: PortId, frame: &[u8]) {
        if let Some(c) = self.control.get() {
            c.handle(port, frame);
        }
    }

    fn connection(&self, _port: PortId, _connected: bool) {}
}

struct ThroughSwitch(Arc<Glue>);

impl FrameOut for ThroughSwitch {
    fn send(&self, port: PortId, frame: &[u8]) -> bool {
        match self.0.switch.get().and_then(Weak::upgrade) {
            Some(s) => s.inject(port, frame),
            None => false,
        }
    }
}

struct Backend {
    stop: StopSignal,
    threads: Vec<std::thread::JoinHandle<()>>,
    dir: PathBuf,
    _switch: Arc<Switch>,
}

impl Backend {
    /// A backend serving guest A and guest B, each on its own socket.
    fn start(name: &str) -> Self {
        let engine = svnic_tests::fake_guest::engine(2);
        let ga = engine
            .register_guest(GuestPolicy::new("guest-a", A), None)
            .unwrap();
        let gb = engine
            .register_guest(GuestPolicy::new("guest-b", B), None)
            .unwrap();
        let glue = Arc::new(Glue {
            engine: engine.clone(),
            control: OnceLock::new(),
            switch: OnceLock::new(),
        });
        let switch = Switch::new(glue.clone(), SwitchConfig::default());
        let _ = glue.switch.set(Arc::downgrade(&switch));
        let control = FrameHandler::new(engine.clone(), Arc::new(ThroughSwitch(glue.clone())));
        let _ = glue.control.set(control.clone());
        engine
            .set_guest_waker(ga, Some(control.waker(ga, A)))
            .unwrap();
        engine
            .set_guest_waker(gb, Some(control.waker(gb, B)))
            .unwrap();
        switch.add_port(ga, &[A]).unwrap();
        switch.add_port(gb, &[B]).unwrap();

        let dir = std::env::temp_dir().join(format!("svnic-e2e-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let stop = StopSignal::new().unwrap();
        let threads = vec![
            serve_port(switch.clone(), ga, dir.join("a.sock"), &stop).unwrap(),
            serve_port(switch.clone(), gb, dir.join("b.sock"), &stop).unwrap(),
        ];
        Backend {
            stop,
            threads,
            dir,
            _switch: switch,
        }
    }

    fn socket(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.stop();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn frame(src: MacAddr, dst: MacAddr, n: u32) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    f.extend_from_slice(&n.to_le_bytes());
    f.resize(64 + (n as usize * 11) % 1400, n as u8);
    f
}

fn send_all(guest: &HostGuest, frames: &[Vec<u8>]) {
    for f in frames {
        let t = Instant::now();
        while !guest.send_raw(f).unwrap() {
            assert!(t.elapsed() < LONG, "TX ring stays full");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn recv_n(guest: &HostGuest, n: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let t = Instant::now();
    while got.len() < n {
        assert!(t.elapsed() < LONG, "received {} of {n} frames", got.len());
        guest.wait_raw(Duration::from_millis(100)).unwrap();
        guest.recv_raw(&mut got, usize::MAX).unwrap();
    }
    got
}

#[test]
fn two_host_process_guests_talk_through_the_svnic_backend() {
    let backend = Backend::start("talk");
    let guest_a = HostGuest::connect(backend.socket("a.sock"), 64 << 20).unwrap();
    let guest_b = HostGuest::connect(backend.socket("b.sock"), 64 << 20).unwrap();
    assert_eq!(guest_a.mac(), A);
    assert_eq!(guest_b.mac(), B);

    // Ordinary frames through the switch, both ways (more than a ring's worth).
    let a_to_b: Vec<Vec<u8>> = (0..400).map(|n| frame(A, B, n)).collect();
    let b_to_a: Vec<Vec<u8>> = (0..400).map(|n| frame(B, A, n)).collect();
    let ga = guest_a.clone();
    let sent = a_to_b.clone();
    let sender = std::thread::spawn(move || send_all(&ga, &sent));
    assert_eq!(recv_n(&guest_b, 400), a_to_b);
    sender.join().unwrap();
    send_all(&guest_b, &b_to_a);
    assert_eq!(recv_n(&guest_a, 400), b_to_a);

    // Channels through the control path; messages through the engine.
    let free_a = guest_a.memory().free_bytes();
    let mut ch_a = guest_a.create_channel(1, 256, LONG).unwrap();
    let mut ch_b = guest_b.create_channel(2, 256, LONG).unwrap();
    assert_eq!(ch_a.addr().mac, A);
    assert_eq!(ch_b.addr().mac, B);
    assert_eq!(guest_a.memory().free_bytes(), free_a - DEFAULT_REGION_LEN);
    let (dest, src) = (ch_b.addr(), ch_a.addr());
    let waiter_b = guest_b.waiter(&ch_b);

    // B waits first (it goes to sleep and must be woken by a wake frame), A sends later.
    let receiver = std::thread::spawn(move || {
        let mut got = Vec::new();
        let t = Instant::now();
        while got.len() < 100 {
            assert!(t.elapsed() < LONG, "B got {} of 100 messages", got.len());
            ch_b.wait_poll(&mut got, 256, Duration::from_secs(2), &waiter_b)
                .unwrap();
        }
        (ch_b, got)
    });
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..100u64 {
        let t = Instant::now();
        while !ch_a
            .send_user(
                dest,
                i,
                format!("message {i}").as_bytes(),
                Completions::OnError,
            )
            .unwrap()
        {
            ch_a.flush().unwrap();
            assert!(t.elapsed() < LONG, "A's channel TX ring stays full");
        }
        if i % 10 == 9 {
            ch_a.flush().unwrap();
        }
    }
    ch_a.flush().unwrap();
    let (ch_b, got) = receiver.join().unwrap();
    for (i, m) in got.iter().enumerate() {
        match m {
            Message::UserData(u) => {
                assert_eq!(u.peer, src);
                assert_eq!(u.cookie, i as u64);
                assert_eq!(u.data(), format!("message {i}").as_bytes());
            }
            other => panic!("unexpected message {other:?}"),
        }
    }
    assert!(
        guest_b.stats().wakes >= 1,
        "B slept and was woken by a wake frame"
    );

    // Destroy: acknowledged, and only then is the region free again.
    guest_a.destroy_channel(ch_a, LONG).unwrap();
    guest_b.destroy_channel(ch_b, LONG).unwrap();
    assert_eq!(guest_a.memory().free_bytes(), free_a);
    assert_eq!(guest_a.channel_counts(), (0, 0, 0));
    assert_eq!(guest_b.channel_counts(), (0, 0, 0));
}

#[test]
fn the_engine_refuses_what_the_policy_forbids() {
    let backend = Backend::start("policy");
    let guest_a = HostGuest::connect(backend.socket("a.sock"), 64 << 20).unwrap();
    let free = guest_a.memory().free_bytes();
    let ch = guest_a.create_channel(1, 64, LONG).unwrap();
    // The same endpoint twice: refused, and the second region goes straight back.
    match guest_a.create_channel(1, 64, LONG) {
        Err(svnic_host_frontend::host_guest::ClientError::Refused(reason)) => {
            assert_eq!(reason, svnic_channels::FailureReason::EndpointTaken)
        }
        other => panic!("expected EndpointTaken, got {other:?}"),
    }
    assert_eq!(guest_a.memory().free_bytes(), free - DEFAULT_REGION_LEN);
    guest_a.destroy_channel(ch, LONG).unwrap();
    assert_eq!(guest_a.memory().free_bytes(), free);
}
