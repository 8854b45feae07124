//! The agent's NIC: where control, doorbell and wake frames go in and out.
//!
//! - [`Nic`]: the small trait the agent needs (send a frame, receive one without blocking, a
//!   descriptor to poll).
//! - [`PacketSocket`]: the real one, a raw `AF_PACKET` socket bound to the svnic NIC and to one
//!   EtherType (root or `CAP_NET_RAW`). Also the `frame` path of `svnic-guest` in a VM.
//! - [`DatagramNic`]: a NIC whose wire is a Unix datagram socket pair, for tests and for running
//!   the agent against an in-process engine.
//! - [`find_virtio_nic`]: which interface is the virtio-net device (sysfs).

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::path::Path;

use log::{info, warn};
use svnic_channels::MacAddr;
use thiserror::Error;

/// `PACKET_IGNORE_OUTGOING` (Linux 4.20): do not loop our own transmitted frames back.
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;

/// Errors finding or opening the NIC.
#[derive(Debug, Error)]
pub enum NicError {
    /// No interface is driven by virtio_net.
    #[error(
        "no network interface is driven by virtio_net (interfaces: {found}); name one with --iface"
    )]
    NotFound {
        /// The interfaces seen, with their drivers.
        found: String,
    },
    /// Reading sysfs failed.
    #[error("{path}: {source}")]
    Sysfs {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A socket call failed.
    #[error("interface {iface}: {what}: {source}")]
    Socket {
        /// The interface.
        iface: String,
        /// Which call.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// What the agent needs of a NIC.
pub trait Nic: Send {
    /// The NIC's MAC (source of every frame sent; destination of the engine's answers).
    fn mac(&self) -> MacAddr;
    /// A short description for logs ("eth0 (ifindex 2)").
    fn describe(&self) -> String;
    /// A descriptor that polls readable when frames wait.
    fn fd(&self) -> BorrowedFd<'_>;
    /// Sends one whole Ethernet frame. `WouldBlock` (or `ENOBUFS`): try again later.
    fn send(&mut self, frame: &[u8]) -> io::Result<()>;
    /// Receives one frame into `buf` without blocking; `None` if none waits. A frame longer
    /// than `buf` is cut.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>>;
}

/// Which interface under `sys_root` (normally `/sys`) is driven by `virtio_net`. With several,
/// the first by name is taken (and the choice logged).
pub fn find_virtio_nic(sys_root: &Path) -> Result<String, NicError> {
    let dir = sys_root.join("class/net");
    let entries = std::fs::read_dir(&dir).map_err(|source| NicError::Sysfs {
        path: dir.display().to_string(),
        source,
    })?;
    let mut seen = Vec::new();
    let mut virtio = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let driver = std::fs::read_link(entry.path().join("device/driver"))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        if driver.as_deref() == Some("virtio_net") {
            virtio.push(name.clone());
        }
        seen.push(format!(
            "{name} ({})",
            driver.as_deref().unwrap_or("no driver")
        ));
    }
    virtio.sort();
    seen.sort();
    match virtio.as_slice() {
        [] => Err(NicError::NotFound {
            found: if seen.is_empty() {
                "none".into()
            } else {
                seen.join(", ")
            },
        }),
        [one] => Ok(one.clone()),
        [first, ..] => {
            warn!(
                "several virtio_net interfaces ({}); using {first} (choose with --iface)",
                virtio.join(", ")
            );
            Ok(first.clone())
        }
    }
}

/// A raw packet socket on one interface, for one EtherType. Non-blocking.
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
    iface: String,
    ifindex: u32,
    mac: MacAddr,
}

fn ifreq_for(iface: &str) -> io::Result<libc::ifreq> {
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { zeroed() };
    let bytes = iface.as_bytes();
    if bytes.is_empty() || bytes.len() >= req.ifr_name.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {iface:?} is not 1..15 bytes without NUL"),
        ));
    }
    for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    Ok(req)
}

impl PacketSocket {
    /// Opens a raw packet socket on `iface` that receives frames of `ethertype` only, brings
    /// the interface up if it is down, and learns its MAC.
    pub fn open(iface: &str, ethertype: u16) -> Result<Self, NicError> {
        let err = |what, source| NicError::Socket {
            iface: iface.to_string(),
            what,
            source,
        };
        let cname = std::ffi::CString::new(iface)
            .map_err(|_| err("name", io::Error::from(io::ErrorKind::InvalidInput)))?;
        // SAFETY: if_nametoindex reads the NUL-terminated name; 0 means not found.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(err("if_nametoindex", io::Error::last_os_error()));
        }
        let proto = ethertype.to_be();
        // SAFETY: socket() takes integer arguments and returns a new descriptor or -1.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::c_int::from(proto),
            )
        };
        if raw < 0 {
            return Err(err(
                "socket(AF_PACKET) (needs root)",
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: raw is a new descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let one: libc::c_int = 1;
        // SAFETY: setsockopt reads one c_int we own. Failure (a kernel before 4.20) is fine:
        // recv also drops outgoing frames by their packet type.
        let _ = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                PACKET_IGNORE_OUTGOING,
                (&one as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        let mut sock = PacketSocket {
            fd,
            iface: iface.to_string(),
            ifindex,
            mac: MacAddr([0; 6]),
        };
        sock.mac = sock
            .hardware_address()
            .map_err(|e| err("SIOCGIFHWADDR", e))?;
        // Up before bind: a packet socket bound to a down interface starts with a pending
        // ENETDOWN error.
        sock.bring_up()
            .map_err(|e| err("bring the interface up", e))?;
        sock.bind(proto).map_err(|e| err("bind", e))?;
        Ok(sock)
    }

    /// Binds to the interface and to `proto` (network byte order).
    fn bind(&self, proto: u16) -> io::Result<()> {
        // SAFETY: sockaddr_ll is plain old data; all zeroes is valid.
        let mut sll: libc::sockaddr_ll = unsafe { zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = self.ifindex as i32;
        // SAFETY: bind with a sockaddr_ll we own, of its exact size.
        let rc = unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The interface's MAC (SIOCGIFHWADDR).
    fn hardware_address(&self) -> io::Result<MacAddr> {
        let mut req = ifreq_for(&self.iface)?;
        // SAFETY: SIOCGIFHWADDR fills the hardware address of the ifreq we own.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: after SIOCGIFHWADDR the union holds a sockaddr with the address.
        let data = unsafe { req.ifr_ifru.ifru_hwaddr }.sa_data;
        let mut mac = [0u8; 6];
        for (m, d) in mac.iter_mut().zip(data.iter()) {
            *m = *d as u8;
        }
        Ok(MacAddr(mac))
    }

    /// Sets IFF_UP if the interface is down.
    fn bring_up(&self) -> io::Result<()> {
        let mut req = ifreq_for(&self.iface)?;
        // SAFETY: SIOCGIFFLAGS fills the flags of the ifreq we own.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: after SIOCGIFFLAGS the union holds the flags.
        let flags = unsafe { req.ifr_ifru.ifru_flags };
        if flags & libc::IFF_UP as libc::c_short != 0 {
            return Ok(());
        }
        req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
        // SAFETY: SIOCSIFFLAGS reads the ifreq we own.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } != 0 {
            return Err(io::Error::last_os_error());
        }
        info!("{}: interface was down; brought it up", self.iface);
        Ok(())
    }

    /// The interface name.
    pub fn iface(&self) -> &str {
        &self.iface
    }
}

impl Nic for PacketSocket {
    fn mac(&self) -> MacAddr {
        self.mac
    }

    fn describe(&self) -> String {
        format!("{} (ifindex {}, {})", self.iface, self.ifindex, self.mac)
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: send reads frame.len() bytes from a slice we borrow.
        let n = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ENOBUFS) => io::Error::from(io::ErrorKind::WouldBlock),
                _ => e,
            });
        }
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            // SAFETY: sockaddr_ll is plain old data; all zeroes is valid.
            let mut from: libc::sockaddr_ll = unsafe { zeroed() };
            let mut len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: recvfrom writes at most buf.len() bytes into buf and at most `len` bytes
            // into `from`, both ours.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut len,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(None),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(e),
                };
            }
            if from.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            return Ok(Some((n as usize).min(buf.len())));
        }
    }
}

/// A NIC whose wire is a Unix datagram socket: every datagram is one Ethernet frame. The other
/// end plays the engine (tests) or forwards to an in-process engine.
#[derive(Debug)]
pub struct DatagramNic {
    sock: UnixDatagram,
    mac: MacAddr,
}

impl DatagramNic {
    /// A NIC with address `mac` and the other end of its wire.
    pub fn pair(mac: MacAddr) -> io::Result<(Self, UnixDatagram)> {
        let (a, b) = UnixDatagram::pair()?;
        Ok((Self::new(a, mac)?, b))
    }

    /// A NIC with address `mac` on a connected datagram socket (made non-blocking).
    pub fn new(sock: UnixDatagram, mac: MacAddr) -> io::Result<Self> {
        sock.set_nonblocking(true)?;
        Ok(DatagramNic { sock, mac })
    }
}

impl Nic for DatagramNic {
    fn mac(&self) -> MacAddr {
        self.mac
    }

    fn describe(&self) -> String {
        format!("datagram NIC ({})", self.mac)
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        self.sock.send(frame).map(|_| ())
    }

    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match self.sock.recv(buf) {
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    use std::path::PathBuf;

    fn fake_sys(name: &str, nics: &[(&str, Option<&str>, &str)]) -> PathBuf {
        let root = std::env::temp_dir().join(format!("svnic-sys-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (iface, driver, mac) in nics {
            let dir = root.join("class/net").join(iface);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("address"), format!("{mac}\n")).unwrap();
            if let Some(d) = driver {
                let drv = root.join("bus/drivers").join(d);
                std::fs::create_dir_all(&drv).unwrap();
                std::fs::create_dir_all(dir.join("device")).unwrap();
                std::os::unix::fs::symlink(&drv, dir.join("device/driver")).unwrap();
            }
        }
        root
    }

    #[test]
    fn the_virtio_net_interface_is_found_by_its_driver() {
        let root = fake_sys(
            "one",
            &[
                ("lo", None, "00:00:00:00:00:00"),
                ("eth1", Some("e1000"), "52:54:00:00:00:09"),
                ("eth0", Some("virtio_net"), "52:54:00:12:34:56"),
            ],
        );
        assert_eq!(find_virtio_nic(&root).unwrap(), "eth0");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn no_or_several_virtio_interfaces() {
        let root = fake_sys("none", &[("eth0", Some("e1000"), "52:54:00:00:00:01")]);
        let e = find_virtio_nic(&root).unwrap_err();
        assert!(e.to_string().contains("eth0 (e1000)"), "{e}");
        let _ = std::fs::remove_dir_all(&root);
        let root = fake_sys(
            "two",
            &[
                ("ens5", Some("virtio_net"), "52:54:00:00:00:02"),
                ("ens4", Some("virtio_net"), "52:54:00:00:00:01"),
            ],
        );
        assert_eq!(find_virtio_nic(&root).unwrap(), "ens4");
        let _ = std::fs::remove_dir_all(&root);
        assert!(matches!(
            find_virtio_nic(Path::new("/nonexistent")),
            Err(NicError::Sysfs { .. })
        ));
    }

    #[test]
    fn a_datagram_nic_carries_frames_both_ways() {
        let mac = MacAddr([2, 0, 0, 0, 0, 1]);
        let (mut nic, wire) = DatagramNic::pair(mac).unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(nic.recv(&mut buf).unwrap(), None);
        nic.send(b"frame").unwrap();
        assert_eq!(wire.recv(&mut buf).unwrap(), 5);
        wire.send(b"back").unwrap();
        assert_eq!(nic.recv(&mut buf).unwrap(), Some(4));
        assert_eq!(nic.mac(), mac);
    }

    #[test]
    fn bad_interface_names_are_refused() {
        assert!(ifreq_for("").is_err());
        assert!(ifreq_for("a-very-long-interface-name").is_err());
        assert!(ifreq_for("eth0").is_ok());
    }
}
