//! A raw vhost-user frontend: any message, in any order, with any file descriptors, over a Unix
//! socket, plus builders for the common message bodies and memfd helpers. Nothing here checks
//! what it sends: that is the point (the `vhost` crate's frontend only sends polite sequences).
//! [`crate::vhost_frontend`] sends QEMU 7.2's conversation through it one step at a time, so
//! that tests can deviate at any step.
//!
//! Wire format (vhost-user spec, "Message Specification"): a 12-byte header of three
//! little-endian u32 (request, flags, body size), then the body; descriptors ride as
//! SCM_RIGHTS ancillary data on the first byte.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::io::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// Request codes of the frontend ("front-end message types"), as numbers so that any value can
/// be sent.
pub mod req {
    pub const GET_FEATURES: u32 = 1;
    pub const SET_FEATURES: u32 = 2;
    pub const SET_OWNER: u32 = 3;
    pub const RESET_OWNER: u32 = 4;
    pub const SET_MEM_TABLE: u32 = 5;
    pub const SET_LOG_BASE: u32 = 6;
    pub const SET_LOG_FD: u32 = 7;
    pub const SET_VRING_NUM: u32 = 8;
    pub const SET_VRING_ADDR: u32 = 9;
    pub const SET_VRING_BASE: u32 = 10;
    pub const GET_VRING_BASE: u32 = 11;
    pub const SET_VRING_KICK: u32 = 12;
    pub const SET_VRING_CALL: u32 = 13;
    pub const SET_VRING_ERR: u32 = 14;
    pub const GET_PROTOCOL_FEATURES: u32 = 15;
    pub const SET_PROTOCOL_FEATURES: u32 = 16;
    pub const GET_QUEUE_NUM: u32 = 17;
    pub const SET_VRING_ENABLE: u32 = 18;
    pub const SET_BACKEND_REQ_FD: u32 = 21;
    pub const GET_CONFIG: u32 = 24;
    pub const SET_CONFIG: u32 = 25;
    pub const RESET_DEVICE: u32 = 34;
    pub const GET_MAX_MEM_SLOTS: u32 = 36;
    pub const ADD_MEM_REG: u32 = 37;
    pub const REM_MEM_REG: u32 = 38;
}

/// Header flags.
pub mod flags {
    /// The protocol version every message carries.
    pub const VERSION_1: u32 = 0x1;
    /// Set on replies.
    pub const REPLY: u32 = 0x4;
    /// Asks for an acknowledgement (with REPLY_ACK negotiated).
    pub const NEED_REPLY: u32 = 0x8;
}

/// Protocol feature bits (`VHOST_USER_PROTOCOL_F_*`).
pub mod protocol {
    pub const MQ: u64 = 1 << 0;
    pub const REPLY_ACK: u64 = 1 << 3;
    pub const BACKEND_REQ: u64 = 1 << 5;
    pub const CONFIG: u64 = 1 << 9;
    pub const RESET_DEVICE: u64 = 1 << 13;
    pub const CONFIGURE_MEM_SLOTS: u64 = 1 << 15;
}

/// `VHOST_USER_F_PROTOCOL_FEATURES`, a virtio feature bit.
pub const F_PROTOCOL_FEATURES: u64 = 1 << 30;

/// Header length.
pub const HEADER_LEN: usize = 12;

/// One message from the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Its request code.
    pub request: u32,
    /// Its flags.
    pub flags: u32,
    /// Its body.
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as a u64 (GET_FEATURES, acks), if it is 8 bytes.
    pub fn u64(&self) -> Option<u64> {
        let bytes: [u8; 8] = self.body.get(..8)?.try_into().ok()?;
        (self.body.len() == 8).then_some(u64::from_le_bytes(bytes))
    }
}

/// The bytes of one message: header, then body. The size field is the body's length.
pub fn encode(request: u32, flags: u32, body: &[u8]) -> Vec<u8> {
    let size = u32::try_from(body.len()).unwrap_or(u32::MAX);
    encode_with_size(request, flags, size, body)
}

/// Like [`encode`] with any size field (a lie, for framing attacks).
pub fn encode_with_size(request: u32, flags: u32, size: u32, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(HEADER_LEN + body.len());
    m.extend_from_slice(&request.to_le_bytes());
    m.extend_from_slice(&flags.to_le_bytes());
    m.extend_from_slice(&size.to_le_bytes());
    m.extend_from_slice(body);
    m
}

/// A u64 body (features, protocol features, RESET_OWNER's 0...).
pub fn u64_body(value: u64) -> Vec<u8> {
    value.to_le_bytes().to_vec()
}

/// A vring state body: ring index and a number (SET_VRING_NUM, _BASE, _ENABLE, GET_VRING_BASE).
pub fn vring_state(index: u32, num: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(8);
    b.extend_from_slice(&index.to_le_bytes());
    b.extend_from_slice(&num.to_le_bytes());
    b
}

/// A vring fd body (SET_VRING_KICK/_CALL/_ERR): the ring index, and bit 8 set if no fd is sent.
pub fn vring_fd_body(index: u8, no_fd: bool) -> Vec<u8> {
    let value = u64::from(index) | if no_fd { 1 << 8 } else { 0 };
    u64_body(value)
}

/// A SET_VRING_ADDR body. Addresses are in the frontend's address space (translated through the
/// memory table's `user_addr`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VringAddr {
    /// Ring index.
    pub index: u32,
    /// Flags (bit 0: logging).
    pub flags: u32,
    /// Descriptor table.
    pub desc: u64,
    /// Used ring.
    pub used: u64,
    /// Available ring.
    pub avail: u64,
    /// Log address.
    pub log: u64,
}

impl VringAddr {
    /// The 40-byte body.
    pub fn body(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(40);
        b.extend_from_slice(&self.index.to_le_bytes());
        b.extend_from_slice(&self.flags.to_le_bytes());
        for v in [self.desc, self.used, self.avail, self.log] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }
}

/// One memory region of SET_MEM_TABLE or ADD_MEM_REG.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemRegion {
    /// Guest-physical start.
    pub gpa: u64,
    /// Size.
    pub size: u64,
    /// Start in the frontend's address space.
    pub user_addr: u64,
    /// Offset in the region's file.
    pub mmap_offset: u64,
}

impl MemRegion {
    fn put(&self, b: &mut Vec<u8>) {
        for v in [self.gpa, self.size, self.user_addr, self.mmap_offset] {
            b.extend_from_slice(&v.to_le_bytes());
        }
    }
}

/// A SET_MEM_TABLE body: region count, padding, then each region (send one fd per region).
pub fn mem_table(regions: &[MemRegion]) -> Vec<u8> {
    mem_table_claiming(u32::try_from(regions.len()).unwrap_or(u32::MAX), regions)
}

/// Like [`mem_table`] with any region count (a lie, for attacks).
pub fn mem_table_claiming(count: u32, regions: &[MemRegion]) -> Vec<u8> {
    let mut b = Vec::with_capacity(8 + 32 * regions.len());
    b.extend_from_slice(&count.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    for r in regions {
        r.put(&mut b);
    }
    b
}

/// An ADD_MEM_REG / REM_MEM_REG body: 8 bytes of padding, then the region.
pub fn single_region(region: MemRegion) -> Vec<u8> {
    let mut b = vec![0u8; 8];
    region.put(&mut b);
    b
}

/// A GET_CONFIG / SET_CONFIG body: offset, size, flags, then `size` bytes of payload.
pub fn config_body(offset: u32, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(12 + payload.len());
    b.extend_from_slice(&offset.to_le_bytes());
    b.extend_from_slice(
        &u32::try_from(payload.len())
            .unwrap_or(u32::MAX)
            .to_le_bytes(),
    );
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(payload);
    b
}

pub use svnic_host_frontend::virtio_user::Sealing;

/// A memfd of a given size.
#[derive(Debug)]
pub struct Memfd {
    file: File,
}

impl Memfd {
    /// A new memfd of `size` bytes.
    pub fn new(size: u64, sealing: Sealing) -> io::Result<Memfd> {
        // SAFETY: the name is a NUL-terminated literal; the flags are valid.
        let fd = unsafe {
            libc::memfd_create(
                c"svnic-hostile".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: memfd_create just returned this descriptor, which nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(size)?;
        let memfd = Memfd { file };
        if sealing == Sealing::Sealed {
            memfd.add_seals(libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL)?;
        }
        Ok(memfd)
    }

    /// Adds `seals` (F_SEAL_*).
    pub fn add_seals(&self, seals: libc::c_int) -> io::Result<()> {
        // SAFETY: F_ADD_SEALS takes an int argument and touches no memory of ours.
        let rc = unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_ADD_SEALS, seals) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Changes its size (fails if sealed). Whoever maps it past the new end gets SIGBUS there.
    pub fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    /// The file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Its descriptor, to send.
    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

/// The frontend end of one vhost-user connection.
#[derive(Debug)]
pub struct RawFrontend {
    stream: UnixStream,
    /// How long [`RawFrontend::recv`] waits by default.
    pub reply_timeout: Duration,
}

impl RawFrontend {
    /// Connects to `socket`, retrying for up to `timeout` while it does not accept yet.
    pub fn connect(socket: &Path, timeout: Duration) -> io::Result<RawFrontend> {
        let deadline = Instant::now() + timeout;
        loop {
            match UnixStream::connect(socket) {
                Ok(stream) => return Ok(RawFrontend::from_stream(stream)),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Over an already connected stream.
    pub fn from_stream(stream: UnixStream) -> RawFrontend {
        RawFrontend {
            stream,
            reply_timeout: Duration::from_secs(10),
        }
    }

    /// The socket.
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// Sends one message with `fds` attached.
    pub fn send(&self, request: u32, flags: u32, body: &[u8], fds: &[RawFd]) -> io::Result<()> {
        self.send_bytes(&encode(request, flags, body), fds)
    }

    /// Sends any bytes (one message, several, or a broken one) with `fds` on the first byte.
    pub fn send_bytes(&self, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
        let sent = if fds.is_empty() {
            0
        } else {
            let first = bytes.get(..1).unwrap_or_default();
            self.stream
                .send_with_fds(&[first], fds)
                .map_err(io::Error::from)?
        };
        (&self.stream).write_all(bytes.get(sent..).unwrap_or_default())
    }

    /// Sends a request with NEED_REPLY and waits for its acknowledgement: the ack value (0 is
    /// success), or an error if the connection ended or nothing came in time.
    pub fn ack(&self, request: u32, body: &[u8], fds: &[RawFd]) -> io::Result<u64> {
        let reply = self.request_reply(request, flags::NEED_REPLY, body, fds)?;
        reply.u64().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "request {request}: ack with a {}-byte body",
                    reply.body.len()
                ),
            )
        })
    }

    /// Sends a request (VERSION_1 and `extra_flags`) and waits for the reply to it, skipping
    /// replies to earlier requests.
    pub fn request_reply(
        &self,
        request: u32,
        extra_flags: u32,
        body: &[u8],
        fds: &[RawFd],
    ) -> io::Result<Reply> {
        self.send(request, flags::VERSION_1 | extra_flags, body, fds)?;
        let deadline = Instant::now() + self.reply_timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let reply = self.recv(left)?;
            if reply.request == request {
                return Ok(reply);
            }
        }
    }

    /// Receives one message from the backend, waiting at most `timeout`.
    pub fn recv(&self, timeout: Duration) -> io::Result<Reply> {
        self.stream
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
        let mut header = [0u8; HEADER_LEN];
        (&self.stream).read_exact(&mut header)?;
        let word = |i: usize| {
            let mut w = [0u8; 4];
            w.copy_from_slice(&header[i..i + 4]);
            u32::from_le_bytes(w)
        };
        let (request, flags, size) = (word(0), word(4), word(8));
        if size > 0x1000 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("reply to {request} announces {size} bytes"),
            ));
        }
        let mut body = vec![0u8; size as usize];
        (&self.stream).read_exact(&mut body)?;
        Ok(Reply {
            request,
            flags,
            body,
        })
    }

    /// Waits until the backend has handled everything sent so far: a GET_FEATURES round trip
    /// (replies to earlier requests are skipped).
    pub fn sync(&self) -> io::Result<u64> {
        let reply = self.request_reply(req::GET_FEATURES, 0, &[], &[])?;
        reply.u64().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "GET_FEATURES reply is not a u64",
            )
        })
    }

    /// True once the backend has closed the connection (a read returns end of stream within
    /// `timeout`; replies that arrive meanwhile are discarded).
    pub fn closed_within(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if self
                .stream
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .is_err()
            {
                return true;
            }
            match (&self.stream).read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == io::ErrorKind::TimedOut => return false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return true,
            }
        }
        false
    }
}

/// A pipe; `blocking_write_end` is what a hostile frontend passes as a call fd.
#[derive(Debug)]
pub struct Pipe {
    /// Read end.
    pub read: File,
    /// Write end.
    pub write: File,
}

impl Pipe {
    /// A new blocking pipe whose buffer is as small as Linux allows (one page), so that a
    /// writer blocks after a few hundred 8-byte writes.
    pub fn small() -> io::Result<Pipe> {
        let mut fds = [-1; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 returned these descriptors, owned by nothing else.
        let read = unsafe { File::from_raw_fd(fds[0]) };
        // SAFETY: as above.
        let write = unsafe { File::from_raw_fd(fds[1]) };
        // SAFETY: F_SETPIPE_SZ takes an int; the kernel rounds up to a page.
        unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, 4096) };
        Ok(Pipe { read, write })
    }
}
