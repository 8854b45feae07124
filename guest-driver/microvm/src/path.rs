//! The three data paths of the same guest program, the comparison of the self-virtualized NIC
//! research, and the VMM's side of each:
//!
//! - [`DataPath::Bypass`]: the program drives the rings in its memory and rings the doorbell
//!   only when the engine advertises sleeping (docs/abi.md §4).
//! - [`DataPath::Doorbell`]: the same, with a doorbell after every message, as a
//!   doorbell-per-message device would.
//! - [`DataPath::Mediated`]: an emulated device: every message is handed to the VMM through an
//!   exit, the VMM publishes it to the engine, and the program learns of replies through another
//!   exit ([`Mediator`]).
//!
//! The doorbell is a store to [`DOORBELL_GPA`], which the launcher registers as an ioeventfd:
//! KVM signals the eventfd in the kernel, with no exit to the VMM. The engine cannot take an
//! eventfd (its doorbell is a Doorbell frame through the guest's virtio-net port), so a VMM
//! thread off the vCPU's path, [`relay_doorbells`], turns each signal into a Doorbell frame when
//! the engine sleeps, as the guest would.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use svnic_channels::layout::header;
use svnic_channels::{ChannelLayout, ChannelMem, RingKind, SharedRegion};
use svnic_client::channel::Doorbell;
use vm_memory::Bytes;
use vmm_sys_util::eventfd::EventFd;

use crate::boot_info::{MEDIATE_RECV, MEDIATE_SEND, PATH_BYPASS, PATH_DOORBELL, PATH_MEDIATED};
use crate::error::MicroVmError;
use crate::vcpu::Mmio;
use crate::vm::{DOORBELL_GPA, MEDIATE_GPA};

/// How the guest program's messages reach the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataPath {
    /// Rings in guest memory, no exit (a doorbell only to a sleeping engine).
    #[default]
    Bypass,
    /// A doorbell (an in-kernel ioeventfd exit) after every message.
    Doorbell,
    /// Every message handed to the VMM through an exit to user space.
    Mediated,
}

impl DataPath {
    /// All three, in the order of the comparison.
    pub const ALL: [DataPath; 3] = [DataPath::Bypass, DataPath::Doorbell, DataPath::Mediated];

    /// The boot-info code (`BI_PATH`).
    pub fn code(self) -> u64 {
        match self {
            DataPath::Bypass => PATH_BYPASS,
            DataPath::Doorbell => PATH_DOORBELL,
            DataPath::Mediated => PATH_MEDIATED,
        }
    }

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            DataPath::Bypass => "bypass",
            DataPath::Doorbell => "doorbell",
            DataPath::Mediated => "mediated",
        }
    }
}

impl fmt::Display for DataPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DataPath {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        DataPath::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown mode {s:?} (bypass, doorbell or mediated)"))
    }
}

/// The channel as the VMM sees it: its region in guest memory, and its doorbell.
#[derive(Clone)]
pub struct EngineSide<'a> {
    /// The channel region (in the guest memory, at `channel_gpa`) with its layout.
    pub mem: ChannelMem<'a>,
    /// Guest-physical address of the channel region.
    pub channel_gpa: u64,
    /// The channel id the doorbell names.
    pub channel_id: u32,
    /// The engine's doorbell (a Doorbell frame through the guest's virtio-net port).
    pub doorbell: &'a dyn Doorbell,
}

impl fmt::Debug for EngineSide<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineSide")
            .field("channel_gpa", &self.channel_gpa)
            .field("channel_id", &self.channel_id)
            .finish_non_exhaustive()
    }
}

impl<'a> EngineSide<'a> {
    /// The channel in `region` (at `channel_gpa` in the guest memory) with `layout`, its id and
    /// the engine's doorbell. Fails if the region is shorter than the layout says.
    pub fn new(
        region: &'a SharedRegion,
        layout: ChannelLayout,
        channel_gpa: u64,
        channel_id: u32,
        doorbell: &'a dyn Doorbell,
    ) -> Result<Self, MicroVmError> {
        let mem = region
            .channel(layout)
            .map_err(|e| MicroVmError::BadConfig(format!("channel region: {e}")))?;
        Ok(EngineSide {
            mem,
            channel_gpa,
            channel_id,
            doorbell,
        })
    }

    fn access_error(&self, offset: usize, e: impl fmt::Display) -> MicroVmError {
        MicroVmError::Access {
            addr: self.channel_gpa + offset as u64,
            why: e.to_string(),
        }
    }

    /// The header word at `offset` (an acquire load).
    fn word(&self, offset: usize) -> Result<u32, MicroVmError> {
        self.mem
            .slice()
            .load::<u32>(offset, Ordering::Acquire)
            .map_err(|e| self.access_error(offset, e))
    }

    /// Publishes `value` in the header word at `offset` (a release store).
    fn publish(&self, offset: usize, value: u32) -> Result<(), MicroVmError> {
        self.mem
            .slice()
            .store(value, offset, Ordering::Release)
            .map_err(|e| self.access_error(offset, e))
    }

    /// The notifier's half of docs/abi.md §4, after a producer index was published: a full
    /// fence, then a Doorbell frame if the engine advertises sleeping (or its flag cannot be
    /// read). Returns whether it rang.
    pub fn notify(&self) -> bool {
        let sleeping = self.mem.peer_sleeping(header::ENGINE_SLEEPING);
        if sleeping {
            self.doorbell.ring(self.channel_id);
        }
        sleeping
    }
}

/// What the doorbell relay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Reads of the ioeventfd that returned signals.
    pub wakeups: u64,
    /// Signals (guest stores to the doorbell) they carried.
    pub signals: u64,
    /// Doorbell frames sent to the engine (it was sleeping).
    pub frames: u64,
}

/// How often the relay looks at `running` while no signal comes.
const RELAY_POLL: Duration = Duration::from_millis(20);

/// The VMM's doorbell thread: waits on `evt` (the ioeventfd of [`DOORBELL_GPA`]) and, after
/// each signal, notifies the engine as the guest would (a Doorbell frame only if it sleeps),
/// while `running`.
pub fn relay_doorbells(
    evt: &EventFd,
    side: &EngineSide<'_>,
    running: &AtomicBool,
) -> Result<RelayStats, MicroVmError> {
    let mut stats = RelayStats::default();
    let timeout = RELAY_POLL.as_millis() as libc::c_int;
    while running.load(Ordering::Acquire) {
        let mut pfd = libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(evt),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: pfd is one valid pollfd on this stack frame, and the count says one.
        let n = unsafe { libc::poll(&mut pfd, 1, timeout) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(MicroVmError::Relay(e));
        }
        if n == 0 {
            continue;
        }
        match evt.read() {
            Ok(count) => {
                stats.wakeups += 1;
                stats.signals += count;
                if side.notify() {
                    stats.frames += 1;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(MicroVmError::Relay(e)),
        }
    }
    // Signals of the last messages, if the run ended before they were read.
    if let Ok(count) = evt.read() {
        stats.wakeups += 1;
        stats.signals += count;
        if side.notify() {
            stats.frames += 1;
        }
    }
    Ok(stats)
}

/// Creates the doorbell's eventfd and registers it as an ioeventfd at [`DOORBELL_GPA`] (any
/// length, any value).
pub fn register_doorbell(vm: &kvm_ioctls::VmFd) -> Result<EventFd, MicroVmError> {
    let evt = EventFd::new(libc::EFD_NONBLOCK).map_err(MicroVmError::Relay)?;
    vm.register_ioevent(
        &evt,
        &kvm_ioctls::IoEventAddress::Mmio(DOORBELL_GPA),
        kvm_ioctls::NoDatamatch,
    )
    .map_err(MicroVmError::kvm("register ioeventfd"))?;
    Ok(evt)
}

/// Longest the VMM waits for a reply before it answers a `MEDIATE_RECV` load anyway (the guest
/// then loads again), so that the run loop sees its watchdog.
pub const RECV_WAIT: Duration = Duration::from_millis(10);
/// How long the VMM spins for a reply before it yields its CPU between checks (to a peer that
/// shares it).
pub const RECV_SPIN: Duration = Duration::from_micros(100);

/// What the mediator did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MediatorStats {
    /// Messages the guest handed over (TX and post ring slots).
    pub sends: u64,
    /// `MEDIATE_RECV` loads answered.
    pub recvs: u64,
    /// Of those, answered with nothing new (the wait ran out).
    pub empty_recvs: u64,
    /// Doorbell frames sent to the engine (it was sleeping).
    pub frames: u64,
}

/// The VMM side of [`DataPath::Mediated`]: the emulated device's two registers at
/// [`MEDIATE_GPA`]. A store of a ring slot's address to `MEDIATE_SEND` publishes that slot (it
/// must be the next one of the TX or post ring) and notifies the engine; a load of
/// `MEDIATE_RECV` waits until the engine has published a reply the guest has not consumed (or
/// [`RECV_WAIT`] passed, or the channel faulted) and returns `rx_head`; it spins for the first
/// [`RECV_SPIN`] of the wait and yields the CPU between checks after that.
#[derive(Debug)]
pub struct Mediator<'a> {
    side: EngineSide<'a>,
    tx_head: u32,
    post_head: u32,
    stats: MediatorStats,
}

impl<'a> Mediator<'a> {
    /// A mediator for a fresh channel (every index 0).
    pub fn new(side: EngineSide<'a>) -> Self {
        Mediator {
            side,
            tx_head: 0,
            post_head: 0,
            stats: MediatorStats::default(),
        }
    }

    /// What it did so far.
    pub fn stats(&self) -> MediatorStats {
        self.stats
    }

    /// Emulates one access; `Ok(false)` for an address that is not a register.
    pub fn handle(&mut self, access: Mmio<'_>) -> Result<bool, MicroVmError> {
        match access {
            Mmio::Write(addr, data) if addr == MEDIATE_GPA + MEDIATE_SEND => {
                let mut v = [0u8; 8];
                let n = data.len().min(8);
                v[..n].copy_from_slice(&data[..n]);
                self.send(u64::from_le_bytes(v))?;
                Ok(true)
            }
            Mmio::Read(addr, out) if addr == MEDIATE_GPA + MEDIATE_RECV => {
                let head = self.recv()?.to_le_bytes();
                let n = out.len().min(4);
                out.fill(0);
                out[..n].copy_from_slice(&head[..n]);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn send(&mut self, slot_gpa: u64) -> Result<(), MicroVmError> {
        let l = self.side.mem.layout();
        let slot =
            |ring: RingKind, head: u32| self.side.channel_gpa + ring.slot_offset(l, head) as u64;
        let (word, head) = if slot_gpa == slot(RingKind::Tx, self.tx_head) {
            self.tx_head = self.tx_head.wrapping_add(1);
            (header::TX_HEAD, self.tx_head)
        } else if slot_gpa == slot(RingKind::Post, self.post_head) {
            self.post_head = self.post_head.wrapping_add(1);
            (header::POST_HEAD, self.post_head)
        } else {
            return Err(MicroVmError::BadGuest(format!(
                "MEDIATE_SEND of {slot_gpa:#x}, which is not the next TX ({:#x}) or post \
                 ({:#x}) ring slot",
                slot(RingKind::Tx, self.tx_head),
                slot(RingKind::Post, self.post_head)
            )));
        };
        self.side.publish(word, head)?;
        self.stats.sends += 1;
        if self.side.notify() {
            self.stats.frames += 1;
        }
        Ok(())
    }

    fn recv(&mut self) -> Result<u32, MicroVmError> {
        let start = Instant::now();
        self.stats.recvs += 1;
        loop {
            let head = self.side.word(header::RX_HEAD)?;
            if head != self.side.word(header::RX_TAIL)? {
                return Ok(head);
            }
            let waited = start.elapsed();
            if self.side.mem.fault().is_some() || waited >= RECV_WAIT {
                self.stats.empty_recvs += 1;
                return Ok(head);
            }
            if waited >= RECV_SPIN {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}
