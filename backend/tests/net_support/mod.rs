//! A minimal vhost-user virtio-net frontend for tests: the `vhost` crate's `Frontend` over a
//! real Unix socket, memfd-backed "guest" memory, and driver-side split rings written by hand.
//! Plus a recording `PortEvents`, a fixture running real listeners, and a log capture.
#![allow(dead_code)]
#![allow(clippy::unwrap_used)]

use std::fs::File;
use std::io;
use std::io::Write;
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use svnic_backend::net::{serve_port, PortEvents, PortId, StopSignal, Switch, SwitchConfig};
use svnic_channels::MacAddr;
use svnic_control_plane::GuestId;
use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserHeaderFlag, VhostUserProtocolFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{Address, Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::tempdir::TempDir;

pub const RX: usize = 0;
pub const TX: usize = 1;
pub const QUEUE_SIZE: u16 = 256;
pub const HDR_LEN: usize = 12;
pub const MEM_SIZE: u64 = 8 << 20;
const RING_BASE: [u64; 2] = [0x1_0000, 0x2_0000];
const RX_BUF_BASE: u64 = 0x10_0000;
const RX_BUF_LEN: u32 = 2048;
/// RX buffers posted at start (the rest of the ring stays empty).
pub const RX_BUFFERS: u16 = 128;
const TX_BUF_BASE: u64 = 0x40_0000;
const TX_BUF_LEN: u32 = 0x1_0000;
const TX_SLOTS: u16 = 64;
const VRING_DESC_F_NEXT: u16 = 1;
const VRING_DESC_F_WRITE: u16 = 2;
pub const TIMEOUT: Duration = Duration::from_secs(5);
const VIRTIO_NET_F_MAC: u32 = 5;
const VIRTIO_NET_F_STATUS: u32 = 16;

pub fn mac(last: u8) -> MacAddr {
    MacAddr([0x52, 0x54, 0, 0x12, 0x34, last])
}

pub fn eth(dst: MacAddr, src: MacAddr, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + payload.len());
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A payload whose bytes depend on `seed` and position, to check frames arrive intact.
pub fn payload(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A memfd of `size` bytes mapped as guest memory at guest-physical 0.
pub fn memfd_memory(size: u64) -> GuestMemoryMmap {
    // SAFETY: the name is a NUL-terminated C string literal; flags are valid.
    let fd = unsafe { libc::memfd_create(c"svnic-test-guest".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
    // SAFETY: `fd` was just created and is owned by nobody else.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size).unwrap();
    GuestMemoryMmap::from_ranges_with_files(&[(
        GuestAddress(0),
        size as usize,
        Some(FileOffset::new(file, 0)),
    )])
    .unwrap()
}

/// One split virtqueue, driver side. Descriptor `i` always points at buffer slot `i`.
pub struct DriverQueue {
    size: u16,
    desc: GuestAddress,
    avail: GuestAddress,
    used: GuestAddress,
    next_avail: u16,
    last_used: u16,
    pub kick: EventFd,
    pub call: EventFd,
}

impl DriverQueue {
    fn new(base: u64, size: u16) -> Self {
        let desc = GuestAddress(base);
        let avail = desc.unchecked_add(16 * u64::from(size));
        let used_unaligned = avail.raw_value() + 6 + 2 * u64::from(size);
        let used = GuestAddress((used_unaligned + 3) & !3);
        DriverQueue {
            size,
            desc,
            avail,
            used,
            next_avail: 0,
            last_used: 0,
            kick: EventFd::new(EFD_NONBLOCK).unwrap(),
            call: EventFd::new(EFD_NONBLOCK).unwrap(),
        }
    }

    fn config(&self, mem: &GuestMemoryMmap) -> VringConfigData {
        let host = |a: GuestAddress| mem.get_host_address(a).unwrap() as u64;
        VringConfigData {
            queue_max_size: self.size,
            queue_size: self.size,
            flags: 0,
            desc_table_addr: host(self.desc),
            used_ring_addr: host(self.used),
            avail_ring_addr: host(self.avail),
            log_addr: None,
        }
    }

    /// Writes descriptor `id` (`segments`: address, length, writable; chained `id, id+1, ..`)
    /// and publishes it.
    pub fn post(&mut self, mem: &GuestMemoryMmap, id: u16, segments: &[(u64, u32, bool)]) {
        for (i, &(addr, len, writable)) in segments.iter().enumerate() {
            let index = id + i as u16;
            let mut flags = if writable { VRING_DESC_F_WRITE } else { 0 };
            if i + 1 < segments.len() {
                flags |= VRING_DESC_F_NEXT;
            }
            let at = self.desc.unchecked_add(16 * u64::from(index));
            mem.write_obj(addr.to_le(), at).unwrap();
            mem.write_obj(len.to_le(), at.unchecked_add(8)).unwrap();
            mem.write_obj(flags.to_le(), at.unchecked_add(12)).unwrap();
            mem.write_obj((index + 1).to_le(), at.unchecked_add(14))
                .unwrap();
        }
        let slot = u64::from(self.next_avail % self.size);
        mem.write_obj(id.to_le(), self.avail.unchecked_add(4 + 2 * slot))
            .unwrap();
        self.next_avail = self.next_avail.wrapping_add(1);
        // Release: the descriptor and ring entry are visible before the index.
        mem.store(
            self.next_avail.to_le(),
            self.avail.unchecked_add(2),
            Ordering::Release,
        )
        .unwrap();
    }

    pub fn kick(&self) {
        self.kick.write(1).unwrap();
    }

    /// The next used element, if the device published one. Keeps `used_event` (EVENT_IDX) at
    /// the next index we will read, so that the device signals the next completion.
    pub fn pop_used(&mut self, mem: &GuestMemoryMmap) -> Option<(u32, u32)> {
        let used_idx: u16 = mem
            .load(self.used.unchecked_add(2), Ordering::Acquire)
            .unwrap();
        if u16::from_le(used_idx) == self.last_used {
            return None;
        }
        let slot = u64::from(self.last_used % self.size);
        let elem = self.used.unchecked_add(4 + 8 * slot);
        let id: u32 = mem.read_obj(elem).unwrap();
        let len: u32 = mem.read_obj(elem.unchecked_add(4)).unwrap();
        self.last_used = self.last_used.wrapping_add(1);
        let used_event = self.avail.unchecked_add(4 + 2 * u64::from(self.size));
        mem.store(self.last_used.to_le(), used_event, Ordering::Release)
            .unwrap();
        Some((u32::from_le(id), u32::from_le(len)))
    }

    /// Waits for the next used element: polls the ring, sleeping on the call eventfd.
    pub fn wait_used(&mut self, mem: &GuestMemoryMmap, timeout: Duration) -> Option<(u32, u32)> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.pop_used(mem) {
                return Some(e);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            let wait = (deadline - now).min(Duration::from_millis(20));
            let mut pfd = libc::pollfd {
                fd: self.call.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, living across the call.
            unsafe { libc::poll(&mut pfd, 1, wait.as_millis() as i32) };
            let _ = self.call.read();
        }
    }
}

/// A host process acting as the vhost-user frontend of one virtio-net device.
pub struct TestFrontend {
    pub frontend: Frontend,
    /// The same socket, to write messages the `Frontend` API would refuse to send.
    pub raw: UnixStream,
    pub mem: GuestMemoryMmap,
    pub queues: [DriverQueue; 2],
    pub acked_features: u64,
    pub protocol_features: VhostUserProtocolFeatures,
    /// `num_buffers` of the last frame received.
    pub last_num_buffers: u16,
    /// Ring bases returned by the last `GET_VRING_BASE` (where the device stopped).
    vring_bases: [u16; 2],
    next_tx: u16,
}

impl TestFrontend {
    /// Connects to `socket` (retrying while the listener is busy with a previous connection).
    pub fn connect(socket: &Path) -> Self {
        let deadline = Instant::now() + TIMEOUT;
        let stream = loop {
            match UnixStream::connect(socket) {
                Ok(s) => break s,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("cannot connect to {socket:?}: {e}"),
            }
        };
        let raw = stream.try_clone().unwrap();
        let frontend = Frontend::from_stream(stream, 2);
        frontend.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        TestFrontend {
            frontend,
            raw,
            mem: memfd_memory(MEM_SIZE),
            queues: [
                DriverQueue::new(RING_BASE[RX], QUEUE_SIZE),
                DriverQueue::new(RING_BASE[TX], QUEUE_SIZE),
            ],
            acked_features: 0,
            protocol_features: VhostUserProtocolFeatures::empty(),
            last_num_buffers: 0,
            vring_bases: [0; 2],
            next_tx: 0,
        }
    }

    /// Connects and starts the device the way QEMU does: owner, features, protocol features,
    /// memory table, then each vring (num, addr, base, call, kick, enable); posts RX buffers.
    pub fn start(socket: &Path) -> Self {
        let mut f = Self::connect(socket);
        f.negotiate().unwrap();
        f.set_mem_table().unwrap();
        f.start_rings().unwrap();
        f
    }

    /// Starts the device in the order QEMU 7.2's vhost-user-net uses (measured): protocol
    /// features, owner, call/err fds, then `SET_VRING_ENABLE` for both rings *before*
    /// `SET_FEATURES` (virtio-net's `peer_attach`), then features, memory table and rings, and
    /// no `SET_VRING_ENABLE` afterwards.
    pub fn start_like_qemu_7_2(socket: &Path) -> Self {
        let mut f = Self::connect(socket);
        let offered = f.frontend.get_features().unwrap();
        let proto = f.frontend.get_protocol_features().unwrap();
        let wanted = proto
            & (VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::RESET_DEVICE);
        f.frontend.set_protocol_features(wanted).unwrap();
        f.frontend.set_owner().unwrap();
        for q in [RX, TX] {
            f.frontend.set_vring_call(q, &f.queues[q].call).unwrap();
        }
        for q in [RX as u32, TX as u32] {
            // SET_VRING_ENABLE, version 1 without NEED_REPLY (as QEMU sends it), ring q, 1.
            let mut m = Vec::new();
            for v in [18u32, 1, 8, q, 1] {
                m.extend_from_slice(&v.to_le_bytes());
            }
            (&f.raw).write_all(&m).unwrap();
        }
        let acked = offered & !((1 << VIRTIO_NET_F_MAC) | (1 << VIRTIO_NET_F_STATUS));
        f.frontend.set_features(acked).unwrap();
        f.acked_features = acked;
        f.protocol_features = wanted;
        f.set_mem_table().unwrap();
        for q in [RX, TX] {
            let queue = &f.queues[q];
            f.frontend.set_vring_num(q, QUEUE_SIZE).unwrap();
            f.frontend.set_vring_base(q, 0).unwrap();
            f.frontend.set_vring_addr(q, &queue.config(&f.mem)).unwrap();
            f.frontend.set_vring_kick(q, &queue.kick).unwrap();
            f.frontend.set_vring_call(q, &queue.call).unwrap();
        }
        for id in 0..RX_BUFFERS {
            f.post_rx_buffer(id);
        }
        f.queues[RX].kick();
        f
    }

    pub fn negotiate(&mut self) -> vhost::Result<()> {
        self.frontend.set_owner()?;
        let offered = self.frontend.get_features()?;
        self.frontend.set_features(offered)?;
        self.acked_features = offered;
        let proto = self.frontend.get_protocol_features()?;
        let wanted = proto
            & (VhostUserProtocolFeatures::REPLY_ACK
                | VhostUserProtocolFeatures::CONFIG
                | VhostUserProtocolFeatures::RESET_DEVICE);
        self.frontend.set_protocol_features(wanted)?;
        self.protocol_features = wanted;
        Ok(())
    }

    pub fn region(&self) -> VhostUserMemoryRegionInfo {
        let region = self.mem.find_region(GuestAddress(0)).unwrap();
        VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: MEM_SIZE,
            userspace_addr: self.mem.get_host_address(GuestAddress(0)).unwrap() as u64,
            mmap_offset: 0,
            mmap_handle: region.file_offset().unwrap().file().as_raw_fd(),
        }
    }

    pub fn set_mem_table(&mut self) -> vhost::Result<()> {
        self.frontend.set_mem_table(&[self.region()]).map(|_| ())
    }

    pub fn start_rings(&mut self) -> vhost::Result<()> {
        for q in [RX, TX] {
            let queue = &self.queues[q];
            self.frontend.set_vring_num(q, QUEUE_SIZE)?;
            self.frontend.set_vring_addr(q, &queue.config(&self.mem))?;
            self.frontend.set_vring_base(q, self.vring_bases[q])?;
            self.frontend.set_vring_call(q, &queue.call)?;
            self.frontend.set_vring_kick(q, &queue.kick)?;
            self.frontend.set_vring_enable(q, true)?;
        }
        if self.queues[RX].next_avail == 0 {
            for id in 0..RX_BUFFERS {
                self.post_rx_buffer(id);
            }
            self.queues[RX].kick();
        }
        Ok(())
    }

    /// Stops both rings (`GET_VRING_BASE`), as QEMU does when the guest driver resets.
    pub fn stop_rings(&mut self) -> vhost::Result<()> {
        for q in [RX, TX] {
            self.frontend.set_vring_enable(q, false)?;
        }
        for q in [RX, TX] {
            self.stop_ring(q)?;
        }
        Ok(())
    }

    /// Stops one ring (`GET_VRING_BASE` only).
    pub fn stop_ring(&mut self, q: usize) -> vhost::Result<()> {
        self.vring_bases[q] = self.frontend.get_vring_base(q)? as u16;
        Ok(())
    }

    /// `RESET_DEVICE`.
    pub fn reset_device(&mut self) -> vhost::Result<()> {
        self.frontend.reset_device()
    }

    pub fn config_space(&mut self) -> Vec<u8> {
        let (_, data) = self
            .frontend
            .get_config(0, 10, VhostUserConfigFlags::empty(), &[0u8; 10])
            .unwrap();
        data
    }

    fn post_rx_buffer(&mut self, id: u16) {
        let addr = RX_BUF_BASE + u64::from(id) * u64::from(RX_BUF_LEN);
        self.queues[RX].post(&self.mem, id, &[(addr, RX_BUF_LEN, true)]);
    }

    /// Sends one frame (virtio-net header added) and waits until the device returned it.
    pub fn send(&mut self, frame: &[u8]) {
        assert!(HDR_LEN + frame.len() <= TX_BUF_LEN as usize);
        let id = self.next_tx;
        self.next_tx = (self.next_tx + 1) % TX_SLOTS;
        let addr = TX_BUF_BASE + u64::from(id) * u64::from(TX_BUF_LEN);
        self.mem
            .write_slice(&[0u8; HDR_LEN], GuestAddress(addr))
            .unwrap();
        self.mem
            .write_slice(frame, GuestAddress(addr + HDR_LEN as u64))
            .unwrap();
        // Header and frame in separate descriptors, as Linux does with a linear skb.
        let segments = [
            (addr, HDR_LEN as u32, false),
            (addr + HDR_LEN as u64, frame.len() as u32, false),
        ];
        self.send_chain(id * 2, &segments);
    }

    /// Posts an arbitrary TX chain at descriptor `id` and waits for the device to return it.
    pub fn send_chain(&mut self, id: u16, segments: &[(u64, u32, bool)]) -> (u32, u32) {
        let mem = &self.mem;
        let tx = &mut self.queues[TX];
        tx.post(mem, id, segments);
        tx.kick();
        tx.wait_used(mem, TIMEOUT)
            .expect("the device did not return a TX chain")
    }

    /// The next received frame (virtio-net header removed), reassembled from `num_buffers`
    /// buffers; the buffers are posted again.
    pub fn recv(&mut self, timeout: Duration) -> Option<Vec<u8>> {
        let (id, len) = self.queues[RX].wait_used(&self.mem, timeout)?;
        let mut bytes = self.read_rx_buffer(id, len);
        assert!(bytes.len() >= HDR_LEN, "short RX buffer: {len}");
        let num_buffers = u16::from_le_bytes([bytes[10], bytes[11]]);
        assert!(num_buffers >= 1);
        self.last_num_buffers = num_buffers;
        for _ in 1..num_buffers {
            let (id, len) = self.queues[RX]
                .wait_used(&self.mem, TIMEOUT)
                .expect("missing merged RX buffer");
            bytes.extend(self.read_rx_buffer(id, len));
        }
        self.queues[RX].kick();
        Some(bytes.split_off(HDR_LEN))
    }

    fn read_rx_buffer(&mut self, id: u32, len: u32) -> Vec<u8> {
        assert!(id < u32::from(QUEUE_SIZE) && len <= RX_BUF_LEN);
        let addr = RX_BUF_BASE + u64::from(id) * u64::from(RX_BUF_LEN);
        let mut buf = vec![0u8; len as usize];
        self.mem.read_slice(&mut buf, GuestAddress(addr)).unwrap();
        self.post_rx_buffer(id as u16);
        buf
    }

    /// Every frame that arrives until nothing more comes for `quiet`.
    pub fn recv_all(&mut self, quiet: Duration) -> Vec<Vec<u8>> {
        std::iter::from_fn(|| self.recv(quiet)).collect()
    }
}

/// What the device reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// `memory_changed`: Some (with its size) or None.
    Memory(PortId, Option<u64>),
    Svnic(PortId, Vec<u8>),
    Link(PortId, bool),
}

/// A `PortEvents` that records, and answers nothing.
#[derive(Default)]
pub struct Recorder {
    events: Mutex<Vec<Event>>,
    changed: Condvar,
}

impl Recorder {
    fn push(&self, e: Event) {
        self.events.lock().unwrap().push(e);
        self.changed.notify_all();
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

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
    pub switch: Arc<Switch>,
    pub events: Arc<Recorder>,
    pub stop: StopSignal,
    pub dir: TempDir,
    threads: Vec<JoinHandle<()>>,
}

impl Net {
    pub fn new() -> Self {
        capture_logs();
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
        let path = self.dir.as_path().join(format!("port{id}.sock"));
        self.threads
            .push(serve_port(self.switch.clone(), port, &path, &self.stop).unwrap());
        path
    }

    /// Raises the stop signal and waits for every listener.
    pub fn shutdown(&mut self) {
        self.stop.stop();
        for t in self.threads.drain(..) {
            t.join().unwrap();
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Warnings and errors logged by the library (the whole test process), as text.
static LOGS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();

struct CaptureLogger;

impl log::Log for CaptureLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Info
    }
    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            let line = format!("{} {}", record.level(), record.args());
            if std::env::var_os("SVNIC_TEST_LOG").is_some() {
                eprintln!("{line}");
            }
            LOGS.get_or_init(Default::default)
                .lock()
                .unwrap()
                .push(line);
        }
    }
    fn flush(&self) {}
}

pub fn capture_logs() {
    static LOGGER: CaptureLogger = CaptureLogger;
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
}

/// Captured log lines containing every one of `words`.
pub fn logs_with(words: &[&str]) -> Vec<String> {
    LOGS.get_or_init(Default::default)
        .lock()
        .unwrap()
        .iter()
        .filter(|l| words.iter().all(|w| l.contains(w)))
        .cloned()
        .collect()
}

/// Waits until a log line containing every one of `words` appears.
pub fn wait_for_log(words: &[&str]) -> String {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(l) = logs_with(words).pop() {
            return l;
        }
        assert!(Instant::now() < deadline, "no log line with {words:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
