//! A tiny virtio-net vhost-user backend for tests, on rust-vmm's vhost-user-backend (the library
//! the real svnic backend uses): a hub of ports, one daemon per port socket, where every frame a
//! guest transmits is delivered to every other port. Enough to run the virtio-user frontend
//! against a real daemon over a real Unix socket; it is not the svnic switch.
// Test kit: a failed step is a failed test, so it panics with the error.
#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use svnic_channels::MacAddr;
use vhost::vhost_user::{Listener, VhostUserProtocolFeatures};
use vhost_user_backend::{ShutdownHandle, VhostUserBackend, VhostUserDaemon, VringRwLock, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_MAC, VIRTIO_NET_F_MRG_RXBUF, VIRTIO_NET_F_STATUS, VIRTIO_NET_S_LINK_UP,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

const HDR: usize = 12;
const RX: u16 = 0;
const TX: u16 = 1;

/// Every feature the frontend asks for.
pub const ALL_FEATURES: u64 = (1 << VIRTIO_F_VERSION_1)
    | (1 << VIRTIO_NET_F_MAC)
    | (1 << VIRTIO_NET_F_STATUS)
    | (1 << VIRTIO_RING_F_EVENT_IDX)
    | (1 << VIRTIO_NET_F_MRG_RXBUF)
    | (1 << 30);
/// The features without EVENT_IDX, MRG_RXBUF and STATUS.
pub const MINIMAL_FEATURES: u64 = (1 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_NET_F_MAC) | (1 << 30);

#[derive(Default)]
struct PortState {
    mem: Option<GuestMemoryAtomic<GuestMemoryMmap>>,
    vrings: Vec<VringRwLock>,
    backlog: VecDeque<Vec<u8>>,
    delivered: u64,
}

/// One guest's device.
pub struct Port {
    mac: MacAddr,
    features: u64,
    protocol: VhostUserProtocolFeatures,
    state: Mutex<PortState>,
    hub: Weak<Mutex<Vec<Arc<Port>>>>,
    exit: (EventConsumer, EventNotifier),
}

#[derive(Clone)]
struct Device(Arc<Port>);

impl Port {
    fn deliver(&self, frame: &[u8]) {
        let mut st = self.state.lock().unwrap();
        st.backlog.push_back(frame.to_vec());
        self.flush_backlog(&mut st);
    }

    /// Writes waiting frames into RX buffers (one buffer each; test frames are small).
    fn flush_backlog(&self, st: &mut PortState) {
        let (Some(mem), Some(rx)) = (st.mem.clone(), st.vrings.first().cloned()) else {
            return;
        };
        let mut used_any = false;
        while let Some(frame) = st.backlog.front() {
            let m = mem.memory();
            let delivered = {
                let mut guard = rx.get_mut();
                let q = guard.get_queue_mut();
                match q.pop_descriptor_chain(m.clone()) {
                    Some(c) => {
                        let head = c.head_index();
                        let d = c.clone().next().unwrap();
                        assert!(d.is_write_only() && d.len() as usize >= HDR + frame.len());
                        let mut bytes = vec![0u8; HDR];
                        bytes[10] = 1; // num_buffers
                        bytes.extend_from_slice(frame);
                        m.write_slice(&bytes, d.addr()).unwrap();
                        q.add_used(&*m, head, bytes.len() as u32).unwrap();
                        Some(true)
                    }
                    // No buffer: ask for a kick when buffers come (EVENT_IDX: avail_event);
                    // if some came in the meantime, try again.
                    None if q.enable_notification(&*m).unwrap() => Some(false),
                    None => None,
                }
            };
            match delivered {
                Some(true) => {
                    st.backlog.pop_front();
                    st.delivered += 1;
                    used_any = true;
                }
                Some(false) => continue,
                None => break,
            }
        }
        if used_any && rx.needs_notification().unwrap() {
            rx.signal_used_queue().unwrap();
        }
    }

    fn transmit(&self, vrings: &[VringRwLock]) -> Vec<Vec<u8>> {
        let st = self.state.lock().unwrap();
        let Some(mem) = st.mem.clone() else {
            return Vec::new();
        };
        drop(st);
        let tx = &vrings[usize::from(TX)];
        let mut frames = Vec::new();
        loop {
            tx.disable_notification().unwrap();
            loop {
                let m = mem.memory();
                let mut guard = tx.get_mut();
                let q = guard.get_queue_mut();
                let Some(chain) = q.pop_descriptor_chain(m.clone()) else {
                    break;
                };
                let head = chain.head_index();
                let mut bytes = Vec::new();
                for d in chain {
                    let mut b = vec![0u8; d.len() as usize];
                    m.read_slice(&mut b, d.addr()).unwrap();
                    bytes.extend_from_slice(&b);
                }
                q.add_used(&*m, head, 0).unwrap();
                frames.push(bytes.split_off(HDR));
            }
            if !tx.enable_notification().unwrap() {
                break;
            }
        }
        if !frames.is_empty() && tx.needs_notification().unwrap() {
            tx.signal_used_queue().unwrap();
        }
        frames
    }
}

impl VhostUserBackend for Device {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        2
    }

    fn max_queue_size(&self) -> usize {
        1024
    }

    fn features(&self) -> u64 {
        self.0.features
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        self.0.protocol
    }

    fn set_event_idx(&self, _enabled: bool) {}

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let mut config = self.0.mac.0.to_vec();
        config.extend_from_slice(&(VIRTIO_NET_S_LINK_UP as u16).to_le_bytes());
        let (o, s) = (offset as usize, size as usize);
        config.get(o..o + s).map(<[u8]>::to_vec).unwrap_or_default()
    }

    fn update_memory(&self, mem: GuestMemoryAtomic<GuestMemoryMmap>) -> std::io::Result<()> {
        self.0.state.lock().unwrap().mem = Some(mem);
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        Some((
            self.0.exit.0.try_clone().unwrap(),
            self.0.exit.1.try_clone().unwrap(),
        ))
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> std::io::Result<()> {
        {
            let mut st = self.0.state.lock().unwrap();
            if st.vrings.is_empty() {
                st.vrings = vrings.to_vec();
            }
        }
        match device_event {
            RX => {
                let mut st = self.0.state.lock().unwrap();
                self.0.flush_backlog(&mut st);
            }
            TX => {
                let frames = self.0.transmit(vrings);
                let Some(hub) = self.0.hub.upgrade() else {
                    return Ok(());
                };
                let ports: Vec<Arc<Port>> = hub.lock().unwrap().clone();
                for p in ports.iter().filter(|p| !Arc::ptr_eq(p, &self.0)) {
                    for f in &frames {
                        p.deliver(f);
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// A running port: its socket and the thread serving it.
pub struct PortHandle {
    pub socket: PathBuf,
    pub port: Arc<Port>,
    shutdown: Arc<Mutex<Option<ShutdownHandle>>>,
    thread: Option<JoinHandle<()>>,
}

/// A hub of ports.
#[derive(Debug)]
pub struct Hub {
    ports: Arc<Mutex<Vec<Arc<Port>>>>,
    dir: PathBuf,
}

impl Hub {
    /// A hub whose sockets live in a fresh directory.
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("svnic-guest-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Hub {
            ports: Arc::new(Mutex::new(Vec::new())),
            dir,
        }
    }

    /// Adds a port with `mac` offering `features` (and `protocol`), serving one connection on
    /// its socket.
    pub fn add_port(
        &self,
        mac: MacAddr,
        features: u64,
        protocol: VhostUserProtocolFeatures,
    ) -> PortHandle {
        let port = Arc::new(Port {
            mac,
            features,
            protocol,
            state: Mutex::new(PortState::default()),
            hub: Arc::downgrade(&self.ports),
            exit: new_event_consumer_and_notifier(EventFlag::NONBLOCK).unwrap(),
        });
        self.ports.lock().unwrap().push(port.clone());
        let socket = self.dir.join(format!("{mac}.sock").replace(':', ""));
        let mut listener = Listener::new(&socket, true).unwrap();
        let shutdown = Arc::new(Mutex::new(None));
        let shutdown2 = shutdown.clone();
        let device = Device(port.clone());
        let thread = std::thread::spawn(move || {
            let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
            let mut daemon = VhostUserDaemon::new("test-port".into(), device, mem).unwrap();
            if daemon.start(&mut listener).is_err() {
                return;
            }
            *shutdown2.lock().unwrap() = daemon.shutdown_handle();
            let _ = daemon.wait();
        });
        PortHandle {
            socket,
            port,
            shutdown,
            thread: Some(thread),
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl PortHandle {
    /// Closes the connection from the backend side (as a backend that goes away would).
    pub fn hang_up(&self) {
        let t = Instant::now();
        loop {
            if let Some(h) = self.shutdown.lock().unwrap().as_ref() {
                h.shutdown();
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "no connection to hang up"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Frames delivered into this port's RX queue so far.
    pub fn delivered(&self) -> u64 {
        self.port.state.lock().unwrap().delivered
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.socket
    }
}

impl Drop for PortHandle {
    fn drop(&mut self) {
        if let Some(h) = self.shutdown.lock().unwrap().as_ref() {
            h.shutdown();
        }
        // A daemon still waiting for its connection gets one that closes at once.
        let _ = std::os::unix::net::UnixStream::connect(&self.socket);
        let _ = self.port.exit.1.notify();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Port")
            .field("mac", &self.mac)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for PortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortHandle")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}
