//! The virtio-net switch with real listeners on Unix sockets in a temporary directory
//! ([`Net`]), and a `PortEvents` that records what the ports report ([`Recorder`]); test
//! frontends ([`crate::vhost_frontend`]) connect to its ports.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use svnic_backend::net::{serve_port, PortEvents, PortId, StopSignal, Switch, SwitchConfig};
use svnic_channels::MacAddr;
use svnic_control_plane::GuestId;
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::tempdir::TempDir;

use crate::vhost_frontend::{TestFrontend, TIMEOUT};

/// The MAC address of port `last`.
pub fn mac(last: u8) -> MacAddr {
    MacAddr([0x52, 0x54, 0, 0x12, 0x34, last])
}

/// What the device reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// `memory_changed`: Some (with its size) or None.
    Memory(PortId, Option<u64>),
    /// `svnic_frame`: a frame for the engine.
    Svnic(PortId, Vec<u8>),
    /// `connection`: connected or not.
    Link(PortId, bool),
}

/// A `PortEvents` that records, and answers nothing.
#[derive(Debug, Default)]
pub struct Recorder {
    events: Mutex<Vec<Event>>,
    changed: Condvar,
}

impl Recorder {
    fn push(&self, e: Event) {
        self.events.lock().unwrap().push(e);
        self.changed.notify_all();
    }

    /// Every event so far.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    /// The events of `port` so far.
    pub fn of(&self, port: PortId) -> Vec<Event> {
        self.events()
            .into_iter()
            .filter(|e| match e {
                Event::Memory(p, _) | Event::Svnic(p, _) | Event::Link(p, _) => *p == port,
            })
            .collect()
    }

    /// Waits until `pred` holds for the events so far.
    pub fn wait_for(&self, what: &str, pred: impl Fn(&[Event]) -> bool) {
        let deadline = Instant::now() + TIMEOUT;
        let mut events = self.events.lock().unwrap();
        while !pred(&events) {
            let now = Instant::now();
            assert!(now < deadline, "timed out waiting for {what}: {events:?}");
            events = self.changed.wait_timeout(events, deadline - now).unwrap().0;
        }
    }

    /// Waits until `count` events equal to `event` were reported.
    pub fn wait_count(&self, event: &Event, count: usize) {
        self.wait_for(&format!("{count} x {event:?}"), |evs| {
            evs.iter().filter(|e| *e == event).count() >= count
        });
    }
}

impl PortEvents for Recorder {
    fn memory_changed(&self, port: PortId, mem: Option<Arc<GuestMemoryMmap>>) {
        let size = mem.map(|m| m.iter().map(vm_memory::GuestMemoryRegion::len).sum());
        self.push(Event::Memory(port, size));
    }
    fn svnic_frame(&self, port: PortId, frame: &[u8]) {
        self.push(Event::Svnic(port, frame.to_vec()));
    }
    fn connection(&self, port: PortId, connected: bool) {
        self.push(Event::Link(port, connected));
    }
}

/// A switch with real listeners in a temporary directory.
pub struct Net {
    /// The switch.
    pub switch: Arc<Switch>,
    /// What its ports reported.
    pub events: Arc<Recorder>,
    /// Stops the listeners.
    pub stop: StopSignal,
    /// Where the sockets are.
    pub dir: TempDir,
    threads: Vec<JoinHandle<()>>,
}

impl Net {
    /// A switch without ports; captures the library's log lines from info up ([`crate::logs`]).
    pub fn new() -> Self {
        crate::logs::capture(log::LevelFilter::Info);
        let events = Arc::new(Recorder::default());
        Net {
            switch: Switch::new(events.clone(), SwitchConfig::default()),
            events,
            stop: StopSignal::new().unwrap(),
            dir: TempDir::new_with_prefix("/tmp/svnic-net-test-").unwrap(),
            threads: Vec::new(),
        }
    }

    /// Adds port `id` owning `mac(id)` and serves it; returns its socket path.
    pub fn add_port(&mut self, id: u8) -> PathBuf {
        let port = GuestId(id.into());
        self.switch.add_port(port, &[mac(id)]).unwrap();
        let path = self.socket(id);
        self.threads
            .push(serve_port(self.switch.clone(), port, &path, &self.stop).unwrap());
        path
    }

    /// Ports 1 and 2 with a [`TestFrontend`] each, started as QEMU does; returns once both
    /// links are up.
    pub fn with_two_frontends() -> (Net, TestFrontend, TestFrontend) {
        let mut net = Net::new();
        let (sa, sb) = (net.add_port(1), net.add_port(2));
        let a = TestFrontend::start(&sa);
        let b = TestFrontend::start(&sb);
        for port in [1, 2] {
            net.events.wait_count(&Event::Link(GuestId(port), true), 1);
        }
        (net, a, b)
    }

    /// The socket of port `id` (see [`Net::add_port`]).
    pub fn socket(&self, id: u8) -> PathBuf {
        self.dir.as_path().join(format!("port{id}.sock"))
    }

    /// Raises the stop signal and waits for every listener.
    pub fn shutdown(&mut self) {
        self.stop.stop();
        for t in self.threads.drain(..) {
            t.join().unwrap();
        }
    }
}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Net")
            .field("dir", &self.dir.as_path())
            .field("listeners", &self.threads.len())
            .finish_non_exhaustive()
    }
}

impl Default for Net {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.shutdown();
    }
}
