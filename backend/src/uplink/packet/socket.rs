//! [`PacketSocket`]: one AF_PACKET socket with its RX and TX rings on a host interface.

use std::cell::Cell;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use super::ring::{self, Ring, RingLayout, RingMapping, RxHeader, ETH_HLEN, RX_FRAME_OFFSET};
use super::steering::steering_program;
use super::{sys, PacketConfig, PacketError, PacketStats, MAX_RING_FRAMES};

/// Upper bound of one ring's memory.
const MAX_RING_BYTES: usize = 1 << 30;
/// Length of a VLAN tag (TPID + TCI).
const VLAN_HLEN: usize = 4;
/// The TPID of a tag whose TPID the kernel did not record (802.1Q).
const ETH_P_8021Q: u16 = 0x8100;

/// A packet socket bound to one host interface, with mmap RX and TX rings (module
/// documentation of [`super`]). Dropping it unmaps the rings and closes the socket (which also
/// leaves its fanout group and the interface's promiscuous mode).
#[derive(Debug)]
pub struct PacketSocket {
    // Declaration order is drop order: the rings point into the mapping, which is unmapped
    // before the socket is closed.
    rx: Ring,
    tx: Ring,
    /// Held for its `Drop`: the rings live in it.
    _mapping: RingMapping,
    fd: OwnedFd,
    iface: String,
    ifindex: libc::c_int,
    mtu: usize,
    /// Frames published in the TX ring since the last successful send.
    tx_pending: usize,
    /// Where a VLAN-tagged frame is rebuilt with its tag.
    scratch: Vec<u8>,
    stats: PacketStats,
    /// Drops reported by PACKET_STATISTICS so far (each read resets the kernel's counter).
    kernel_drops: Cell<u64>,
}

// SAFETY: the socket owns its mapping exclusively (no other handle points into it) and every
// access to the rings goes through `&self`/`&mut self`; moving it to another thread moves
// that ownership along. It is not `Sync` (the drop counter is a `Cell`).
unsafe impl Send for PacketSocket {}

/// The smallest RX slot for frames of an `mtu`-byte payload plus the Ethernet header.
pub(super) fn slot_size_for_mtu(mtu: usize) -> usize {
    ring::align(RX_FRAME_OFFSET + mtu + ETH_HLEN)
}

fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

fn check_frames(field: &'static str, value: usize) -> Result<(), PacketError> {
    if value == 0 || value > MAX_RING_FRAMES {
        return Err(PacketError::Config {
            field,
            value,
            rule: "must be 1..=65536",
        });
    }
    Ok(())
}

impl PacketSocket {
    /// Opens a socket on `iface` (by name, in the calling thread's network namespace):
    /// TPACKET_V2 rings of `cfg`'s sizes, bound to every protocol (ETH_P_ALL), promiscuous
    /// (PACKET_MR_PROMISC membership), blind to its own transmissions
    /// (PACKET_IGNORE_OUTGOING), non-blocking. Fails if the interface does not exist, is down,
    /// or its MTU does not fit `cfg.frame_size`.
    pub fn open(iface: &str, cfg: &PacketConfig) -> Result<Self, PacketError> {
        let req =
            sys::ifreq_for(iface).ok_or_else(|| PacketError::BadInterfaceName(iface.to_owned()))?;
        check_frames("rx_frames", cfg.rx_frames)?;
        check_frames("tx_frames", cfg.tx_frames)?;
        let os = |op: &'static str| {
            move |source: io::Error| PacketError::Os {
                op,
                iface: iface.to_owned(),
                source,
            }
        };
        let fd = sys::packet_socket().map_err(os("socket(AF_PACKET)"))?;
        let raw = fd.as_raw_fd();
        let ifindex = sys::interface_index(raw, req).map_err(|e| {
            if e.raw_os_error() == Some(libc::ENODEV) {
                PacketError::NoSuchInterface {
                    iface: iface.to_owned(),
                }
            } else {
                os("SIOCGIFINDEX")(e)
            }
        })?;
        let flags = sys::interface_flags(raw, req).map_err(os("SIOCGIFFLAGS"))?;
        if flags & libc::IFF_UP == 0 {
            return Err(PacketError::InterfaceDown {
                iface: iface.to_owned(),
            });
        }
        let mtu = sys::interface_mtu(raw, req).map_err(os("SIOCGIFMTU"))?;
        let mtu = usize::try_from(mtu)
            .map_err(|_| os("SIOCGIFMTU")(io::Error::other(format!("negative MTU {mtu}"))))?;
        let needed = slot_size_for_mtu(mtu);
        let frame_size = match cfg.frame_size {
            None => needed,
            Some(size) if size == 0 || size % ring::SLOT_ALIGN != 0 => {
                return Err(PacketError::Config {
                    field: "frame_size",
                    value: size,
                    rule: "must be a non-zero multiple of 16",
                })
            }
            Some(size) if size < needed => {
                return Err(PacketError::SlotTooSmall {
                    iface: iface.to_owned(),
                    mtu,
                    frame_size: size,
                    needed,
                })
            }
            Some(size) => size,
        };
        let layout = |field: &'static str, frames: usize| {
            RingLayout::new(frame_size, frames, page_size())
                .filter(|l| l.bytes() <= MAX_RING_BYTES)
                .ok_or(PacketError::Config {
                    field,
                    value: frames,
                    rule: "makes a ring over 1 GiB with this frame size",
                })
        };
        let rx_layout = layout("rx_frames", cfg.rx_frames)?;
        let tx_layout = layout("tx_frames", cfg.tx_frames)?;

        let sol = libc::SOL_PACKET;
        let version = libc::tpacket_versions::TPACKET_V2 as libc::c_int;
        sys::set_option(&fd, sol, libc::PACKET_VERSION, &version).map_err(os("PACKET_VERSION"))?;
        // A TX frame the kernel refuses (say, after an MTU change) is skipped instead of
        // blocking the TX ring for good.
        sys::set_option(&fd, sol, libc::PACKET_LOSS, &1 as &libc::c_int)
            .map_err(os("PACKET_LOSS"))?;
        sys::set_option(&fd, sol, libc::PACKET_IGNORE_OUTGOING, &1 as &libc::c_int)
            .map_err(os("PACKET_IGNORE_OUTGOING"))?;
        sys::set_option(&fd, sol, libc::PACKET_RX_RING, &rx_layout.request())
            .map_err(os("PACKET_RX_RING"))?;
        sys::set_option(&fd, sol, libc::PACKET_TX_RING, &tx_layout.request())
            .map_err(os("PACKET_TX_RING"))?;
        let mapping =
            RingMapping::new(raw, rx_layout.bytes() + tx_layout.bytes()).map_err(os("mmap"))?;
        let outside = || os("mmap")(io::Error::other("ring layout exceeds the mapping"));
        let rx = mapping.ring(0, rx_layout).ok_or_else(outside)?;
        let tx = mapping
            .ring(rx_layout.bytes(), tx_layout)
            .ok_or_else(outside)?;
        sys::bind_all_protocols(&fd, ifindex).map_err(os("bind"))?;
        let promisc = libc::packet_mreq {
            mr_ifindex: ifindex,
            mr_type: libc::PACKET_MR_PROMISC as libc::c_ushort,
            mr_alen: 0,
            mr_address: [0; 8],
        };
        sys::set_option(&fd, sol, libc::PACKET_ADD_MEMBERSHIP, &promisc)
            .map_err(os("PACKET_ADD_MEMBERSHIP(PROMISC)"))?;
        log::info!(
            "uplink {iface}: packet socket open (MTU {mtu}, {} RX and {} TX slots of {frame_size} bytes)",
            rx_layout.frames(),
            tx_layout.frames()
        );
        Ok(PacketSocket {
            rx,
            tx,
            _mapping: mapping,
            fd,
            iface: iface.to_owned(),
            ifindex,
            mtu,
            tx_pending: 0,
            scratch: Vec::with_capacity(frame_size + VLAN_HLEN),
            stats: PacketStats::default(),
            kernel_drops: Cell::new(0),
        })
    }

    /// Makes this a socket that only sends: a filter that accepts no frame, so that the kernel
    /// copies nothing into its RX ring (the switch's socket, whose frames the workers receive).
    /// Frames received between `open` and this call stay in the ring, never read.
    pub fn send_only(&self) -> Result<(), PacketError> {
        let mut reject_all = [libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: 0,
        }];
        let prog = libc::sock_fprog {
            len: 1,
            filter: reject_all.as_mut_ptr(),
        };
        sys::set_option(&self.fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &prog).map_err(
            |source| PacketError::Os {
                op: "SO_ATTACH_FILTER",
                iface: self.iface.clone(),
                source,
            },
        )
    }

    /// Joins fanout group `group_id` of this socket's network namespace as its next member,
    /// with the steering program for `workers` members ([`steering_program`]), so that each
    /// frame reaches one member of the group instead of all of them.
    ///
    /// Ordering rules: a member's index in the group (the worker number the program returns)
    /// is its join order, so worker `i`'s socket must be the `i`-th to join, and all
    /// `workers` sockets must have joined before traffic matters: the kernel reduces the
    /// program's result modulo the members present, and until the first join has installed
    /// the program every frame goes to member 0. All members must be bound to the same
    /// interface. Closing a member moves the last member into its index: a group that lost
    /// a member is rebuilt (every socket closed and reopened) rather than patched. Group ids
    /// are shared by every process of the network namespace, and joining a group of the same
    /// kind that another program made succeeds: make member 0's group with
    /// [`PacketSocket::create_fanout`].
    pub fn join_fanout(&self, group_id: u16, workers: u16) -> Result<(), PacketError> {
        self.fanout(group_id, 0, workers)?;
        Ok(())
    }

    /// Creates a fanout group of its own with this socket as member 0, under an id the kernel
    /// picks among those no one in the network namespace uses (so no other program can be
    /// in it by chance), and returns that id for the other members' [`PacketSocket::join_fanout`].
    pub fn create_fanout(&self, workers: u16) -> Result<u16, PacketError> {
        self.fanout(0, libc::PACKET_FANOUT_FLAG_UNIQUEID, workers)
    }

    /// Joins (or with UNIQUEID in `flags`, creates) fanout group `group_id` and sets its
    /// steering program; returns the group's id.
    fn fanout(&self, group_id: u16, flags: u32, workers: u16) -> Result<u16, PacketError> {
        if workers == 0 {
            return Err(PacketError::NoWorkers);
        }
        // The group's own hook must also ignore outgoing frames: the socket's
        // PACKET_IGNORE_OUTGOING does not apply once it receives through the group.
        let type_flags =
            libc::PACKET_FANOUT_CBPF | libc::PACKET_FANOUT_FLAG_IGNORE_OUTGOING | flags;
        let arg = (u32::from(group_id) | (type_flags << 16)) as libc::c_int;
        let os = |op: &'static str| {
            move |source: io::Error| PacketError::Os {
                op,
                iface: self.iface.clone(),
                source,
            }
        };
        sys::set_option(&self.fd, libc::SOL_PACKET, libc::PACKET_FANOUT, &arg)
            .map_err(os("PACKET_FANOUT"))?;
        let group_id = sys::fanout_group(self.fd.as_raw_fd()).map_err(os("PACKET_FANOUT"))?;
        let mut program = steering_program(workers);
        let fprog = libc::sock_fprog {
            len: program.len() as libc::c_ushort,
            filter: program.as_mut_ptr(),
        };
        // The kernel copies the `len` instructions `fprog` points to during the call;
        // `program` outlives it.
        sys::set_option(&self.fd, libc::SOL_PACKET, libc::PACKET_FANOUT_DATA, &fprog)
            .map_err(os("PACKET_FANOUT_DATA"))?;
        log::info!(
            "uplink {}: joined fanout group {group_id} ({workers} workers)",
            self.iface
        );
        Ok(group_id)
    }

    /// True if the kernel has handed a frame to the RX ring that [`PacketSocket::receive`] has
    /// not taken yet: one load of a slot's status, no syscall.
    pub fn has_frames(&self) -> bool {
        self.rx.status(self.rx.head()) & libc::TP_STATUS_USER != 0
    }

    /// Walks the RX ring: calls `f` with each received frame (the whole Ethernet frame, VLAN
    /// tag in place) for at most `max` ring slots, and returns the slots to the kernel. Never
    /// blocks. Returns the number of frames handed to `f`; slots holding frames that are
    /// dropped (truncated, our own) count toward `max` but not the result.
    pub fn receive(&mut self, max: usize, mut f: impl FnMut(&[u8])) -> usize {
        let mut delivered = 0;
        let mut losing = false;
        for _ in 0..max {
            let slot = self.rx.head();
            let status = self.rx.status(slot);
            if status & libc::TP_STATUS_USER == 0 {
                break;
            }
            losing |= status & libc::TP_STATUS_LOSING != 0;
            // SAFETY: the status has TP_STATUS_USER: user space owns the slot until the
            // set_status below.
            let hdr = unsafe { self.rx.rx_header(slot) };
            if self.deliver(slot, status, &hdr, &mut f) {
                delivered += 1;
            }
            self.rx.set_status(slot, libc::TP_STATUS_KERNEL);
            self.rx.advance();
        }
        self.stats.received += delivered as u64;
        if losing {
            // The kernel flags frames while it has unreported drops; reading the counters
            // accounts for them and clears the flag.
            self.refresh_kernel_drops();
        }
        delivered
    }

    /// Hands the frame in user-owned RX slot `slot` to `f` unless it must be dropped; true if
    /// it was handed over.
    fn deliver(
        &mut self,
        slot: usize,
        status: u32,
        hdr: &RxHeader,
        f: &mut impl FnMut(&[u8]),
    ) -> bool {
        if hdr.pkttype == libc::PACKET_OUTGOING {
            self.stats.outgoing_ignored += 1;
            return false;
        }
        if status & libc::TP_STATUS_COPY != 0 || hdr.snaplen < hdr.len {
            self.stats.truncated += 1;
            return false;
        }
        // SAFETY: `receive` owns the slot (TP_STATUS_USER) and hands it back only after this
        // function returns, when `frame` is gone.
        let frame = unsafe { self.rx.slot_bytes(slot, hdr.mac, hdr.snaplen) };
        let Some(frame) = frame.filter(|frame| frame.len() >= 2 * 6) else {
            self.stats.truncated += 1;
            return false;
        };
        if status & libc::TP_STATUS_VLAN_VALID == 0 {
            f(frame);
            return true;
        }
        let tpid = if status & libc::TP_STATUS_VLAN_TPID_VALID != 0 && hdr.vlan_tpid != 0 {
            hdr.vlan_tpid
        } else {
            ETH_P_8021Q
        };
        self.scratch.clear();
        self.scratch.extend_from_slice(&frame[..12]);
        self.scratch.extend_from_slice(&tpid.to_be_bytes());
        self.scratch.extend_from_slice(&hdr.vlan_tci.to_be_bytes());
        self.scratch.extend_from_slice(&frame[12..]);
        self.stats.vlan_reinserted += 1;
        f(&self.scratch);
        true
    }

    /// The longest frame [`PacketSocket::queue`] takes: MTU + 14 bytes, 4 more for a
    /// VLAN-tagged one (`tagged`).
    pub fn max_frame_len(&self, tagged: bool) -> usize {
        let slot_room = self.tx.layout().frame_size - ring::TX_FRAME_OFFSET;
        (self.mtu + ETH_HLEN + if tagged { VLAN_HLEN } else { 0 }).min(slot_room)
    }

    /// Copies `frame` (a whole Ethernet frame without FCS) into the next TX slot. Never
    /// blocks: `Err(Full)` when no slot is free (flush, then queue again). Nothing is sent
    /// before [`PacketSocket::flush`].
    pub fn queue(&mut self, frame: &[u8]) -> Result<(), PacketError> {
        let tagged = frame
            .get(12..14)
            .is_some_and(|t| matches!(u16::from_be_bytes([t[0], t[1]]), 0x8100 | 0x88a8));
        let max = self.max_frame_len(tagged);
        if frame.len() < ETH_HLEN || frame.len() > max {
            return Err(PacketError::FrameSize {
                iface: self.iface.clone(),
                len: frame.len(),
                max,
            });
        }
        let slot = self.tx.head();
        if self.tx.status(slot) != libc::TP_STATUS_AVAILABLE {
            self.stats.tx_full += 1;
            return Err(PacketError::Full);
        }
        // SAFETY: the slot's status is TP_STATUS_AVAILABLE: user space owns it until the
        // set_status below publishes it.
        if !unsafe { self.tx.write_tx(slot, frame) } {
            return Err(PacketError::FrameSize {
                iface: self.iface.clone(),
                len: frame.len(),
                max,
            });
        }
        self.tx.set_status(slot, libc::TP_STATUS_SEND_REQUEST);
        self.tx.advance();
        self.tx_pending += 1;
        Ok(())
    }

    /// Hands the queued frames to the kernel with one `send()` (which does not wait for
    /// their transmission). Returns how many it took. On error, the frames it did not take
    /// stay queued and go with the next flush; a gone interface never takes them (open a
    /// new socket).
    pub fn flush(&mut self) -> Result<usize, PacketError> {
        if self.tx_pending == 0 {
            return Ok(0);
        }
        let result = sys::send_tx_ring(self.fd.as_raw_fd());
        // The kernel takes queued frames in ring order: those it left are the newest.
        let oldest = self.tx.slot_before_head(self.tx_pending);
        let left = (0..self.tx_pending)
            .filter(|&i| self.tx.status(oldest + i) == libc::TP_STATUS_SEND_REQUEST)
            .count();
        let taken = self.tx_pending - left;
        self.tx_pending = left;
        self.stats.sent += taken as u64;
        match result {
            Ok(_) => Ok(taken),
            Err(e) => Err(self.os_error("send", e)),
        }
    }

    /// The socket's pending error, if any (cleared by the call): what a worker calls when
    /// `poll` reports POLLERR on [`PacketSocket::fd`]. `InterfaceDown` is transient (the
    /// socket receives again once the interface is up); `InterfaceGone` is not.
    pub fn take_error(&self) -> Result<(), PacketError> {
        match sys::take_socket_error(self.fd.as_raw_fd()) {
            Ok(0) => Ok(()),
            Ok(errno) => Err(self.os_error("socket", io::Error::from_raw_os_error(errno))),
            Err(e) => Err(self.os_error("getsockopt(SO_ERROR)", e)),
        }
    }

    /// An OS error of `op`, as InterfaceDown / InterfaceGone when it says so.
    fn os_error(&self, op: &'static str, source: io::Error) -> PacketError {
        let iface = self.iface.clone();
        match source.raw_os_error() {
            Some(libc::ENXIO | libc::ENODEV) => PacketError::InterfaceGone { iface },
            Some(libc::ENETDOWN) => {
                // Down, or removed (the kernel reports both as ENETDOWN): look again, in the
                // socket's own network namespace.
                let same = sys::ifreq_for(&self.iface)
                    .and_then(|req| sys::interface_index(self.fd.as_raw_fd(), req).ok())
                    == Some(self.ifindex);
                if same {
                    PacketError::InterfaceDown { iface }
                } else {
                    PacketError::InterfaceGone { iface }
                }
            }
            _ => PacketError::Os { op, iface, source },
        }
    }

    /// The descriptor to poll: POLLIN when the RX ring holds a frame, POLLOUT when a TX slot
    /// is free, POLLERR when [`PacketSocket::take_error`] has something to say.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The interface's MTU when the socket was opened (SIOCGIFMTU).
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// The interface name.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// Bytes per ring slot.
    pub fn frame_size(&self) -> usize {
        self.rx.layout().frame_size
    }

    /// Slots of the RX and TX rings (after rounding up to whole blocks).
    pub fn ring_frames(&self) -> (usize, usize) {
        (self.rx.layout().frames(), self.tx.layout().frames())
    }

    /// Frames queued and not yet taken by the kernel.
    pub fn tx_pending(&self) -> usize {
        self.tx_pending
    }

    /// The socket's counters (reads the kernel's drop counter: one syscall).
    pub fn stats(&self) -> PacketStats {
        self.refresh_kernel_drops();
        PacketStats {
            rx_kernel_drops: self.kernel_drops.get(),
            ..self.stats
        }
    }

    fn refresh_kernel_drops(&self) {
        match sys::packet_statistics(self.fd.as_raw_fd()) {
            Ok((_, drops)) => self
                .kernel_drops
                .set(self.kernel_drops.get() + u64::from(drops)),
            Err(e) => log::debug!("uplink {}: PACKET_STATISTICS: {e}", self.iface),
        }
    }
}
