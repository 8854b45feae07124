//! The protocol gate: which frontend messages the relay passes on to the daemon.
//!
//! A frontend may speak only the part of vhost-user that svnic offered; anything else ends its
//! connection before the daemon sees it, its descriptors closed. The rules:
//!
//! - **Flags**: version 1, not a reply, no reserved bit (`NEED_REPLY` is the only other flag).
//! - **Features**: `SET_FEATURES` and `SET_PROTOCOL_FEATURES` may ack only bits offered
//!   ([`device_features`], and [`protocol_features`] plus `REPLY_ACK`, which the vhost crate always
//!   adds). The libraries store whatever is acked, so an unoffered `CONFIGURE_MEM_SLOTS` would make
//!   `ADD_MEM_REG` reachable, without a region cap.
//! - **Requests**: the allowlist below; every other code (known or not) is refused:
//!   - always: `GET_FEATURES`, `SET_FEATURES`, `SET_OWNER`, `RESET_OWNER`, `SET_MEM_TABLE`,
//!     `SET_VRING_NUM`, `SET_VRING_ADDR`, `SET_VRING_BASE`, `GET_VRING_BASE`, `SET_VRING_KICK`,
//!     `SET_VRING_CALL`, `SET_VRING_ERR`, `GET_PROTOCOL_FEATURES`, `SET_PROTOCOL_FEATURES`,
//!     `SET_VRING_ENABLE`: what QEMU 7.2's vhost-user-net and DPDK virtio-user send to start,
//!     stop and reset a single-queue-pair NIC;
//!   - `GET_CONFIG` / `SET_CONFIG` once `CONFIG` is acked (DPDK virtio-user and svnic's own
//!     host-process guests read the MAC this way; QEMU's vhost-user-net does not ack `CONFIG`);
//!   - `RESET_DEVICE` once `RESET_DEVICE` is acked (QEMU prefers it to `RESET_OWNER` then);
//!   - `GET_QUEUE_NUM` once `MQ` is acked, as the vhost crate requires (never offered, and QEMU
//!     and DPDK ask only with `MQ`).
//!
//!   Refused: memory slots (`GET_MAX_MEM_SLOTS`, `ADD_MEM_REG`, `REM_MEM_REG`), dirty logging
//!   (`SET_LOG_BASE`, `SET_LOG_FD`), `SET_BACKEND_REQ_FD`, `IOTLB_MSG`, inflight, postcopy,
//!   status, `SEND_RARP`, `NET_SET_MTU`, `SET_VRING_ENDIAN`, `VRING_KICK`, device state, shared
//!   objects: none is offered, so neither QEMU nor DPDK sends them to svnic.
//! - **Sizes and rings**: fixed-size bodies must have their exact size (as the vhost crate
//!   checks); every ring index must name one of the device's [`NUM_QUEUES`] rings; an enable
//!   state is 0 or 1.
//! - **Descriptors**: `SET_MEM_TABLE` carries one regular file (memfd, hugetlbfs, tmpfs) per
//!   region, 1 to [`MAX_REGIONS`] regions; `SET_VRING_KICK/CALL/ERR` carry one eventfd, or none
//!   with the no-fd flag (bit 8); every other request carries none. Kick, call and err eventfds
//!   are made non-blocking (a status flag of the open file, so the frontend's copy changes too;
//!   QEMU and DPDK create them non-blocking already): a worker must never block on a counter the
//!   frontend controls.
//! - **Bounded state**: the `SET_VRING_ENABLE` messages QEMU 7.2 sends before `SET_FEATURES`
//!   are held back in one slot per ring (see the relay's module doc).

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;

use thiserror::Error;
use vhost::vhost_user::message::{FrontendReq, VhostUserProtocolFeatures, VhostUserVirtioFeatures};

use crate::net::device::protocol_features;
use crate::net::virtio_net::{device_features, NUM_QUEUES};

/// Message flags: the version (bits 0-1), reply, need-reply.
pub(crate) const FLAG_VERSION_1: u32 = 0x1;
pub(crate) const FLAG_REPLY: u32 = 0x4;
pub(crate) const FLAG_NEED_REPLY: u32 = 0x8;
const VERSION_MASK: u32 = 0x3;

/// The most memory regions a table may list (QEMU's and DPDK's limit for `SET_MEM_TABLE`).
pub const MAX_REGIONS: u32 = 8;
/// `VhostUserMemory`: region count and padding.
const MEM_TABLE_HEADER: usize = 8;
/// `VhostUserMemoryRegion`: guest address, size, user address, mmap offset.
const MEM_REGION_LEN: usize = 32;
/// `VhostUserConfig`: offset, size, flags (the payload follows).
const CONFIG_HEADER: usize = 12;
/// `VhostUserVringAddr`: index, flags and four addresses.
const VRING_ADDR_LEN: usize = 40;
/// Bit 8 of a `SET_VRING_KICK/CALL/ERR` body: no descriptor attached.
const VRING_NOFD: u64 = 0x100;
/// What `/proc/self/fd/N` names for an eventfd.
const EVENTFD_TARGET: &str = "anon_inode:[eventfd]";

/// A vhost-user request code, shown with its name when it has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestCode(pub u32);

impl fmt::Display for RequestCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match FrontendReq::try_from(self.0) {
            Ok(request) => write!(f, "{request:?} ({})", self.0),
            Err(()) => write!(f, "unknown request {}", self.0),
        }
    }
}

/// Why the gate refused a frontend's message (the connection ends).
#[derive(Debug, Error)]
pub enum Refusal {
    /// The flags are not those of a version-1 request.
    #[error(
        "{request} has flags {flags:#x}; a request is version 1, not a reply, no reserved bit"
    )]
    Flags {
        /// The request.
        request: RequestCode,
        /// Its flags.
        flags: u32,
    },
    /// svnic does not serve this request.
    #[error("{request} is not served by svnic")]
    NotServed {
        /// The request.
        request: RequestCode,
    },
    /// The request belongs to a protocol feature the frontend did not ack.
    #[error("{request} needs protocol feature {feature}, which was not negotiated")]
    NotNegotiated {
        /// The request.
        request: RequestCode,
        /// The feature's name.
        feature: &'static str,
    },
    /// `SET_FEATURES` acks virtio features never offered.
    #[error(
        "SET_FEATURES acks features svnic never offered: {} ({unoffered:#x})",
        feature_bits(*.unoffered)
    )]
    UnofferedFeatures {
        /// The unoffered bits.
        unoffered: u64,
    },
    /// `SET_PROTOCOL_FEATURES` acks protocol features never offered.
    #[error(
        "SET_PROTOCOL_FEATURES acks protocol features svnic never offered: {} ({unoffered:#x})",
        protocol_feature_names(*.unoffered)
    )]
    UnofferedProtocolFeatures {
        /// The unoffered bits.
        unoffered: u64,
    },
    /// The body does not have the request's size.
    #[error("{request} has a {size}-byte body; it takes {expected}")]
    BodySize {
        /// The request.
        request: RequestCode,
        /// The body's size.
        size: usize,
        /// The size it must have (the least, for a config access).
        expected: usize,
    },
    /// A memory table with no region or too many.
    #[error("SET_MEM_TABLE lists {regions} regions; svnic takes 1 to {MAX_REGIONS}")]
    RegionCount {
        /// The announced count.
        regions: u32,
    },
    /// A ring index beyond the device's rings.
    #[error("{request} names ring {index}; the device has rings 0 to {}", NUM_QUEUES - 1)]
    RingIndex {
        /// The request.
        request: RequestCode,
        /// The index (for kick/call/err: the body without the no-fd bit).
        index: u64,
    },
    /// An enable state other than 0 or 1.
    #[error("SET_VRING_ENABLE for ring {index} with state {state}; it is 0 or 1")]
    EnableState {
        /// The ring.
        index: u32,
        /// The state.
        state: u32,
    },
    /// The wrong number of descriptors for the request.
    #[error("{request} carries {got} file descriptors; it takes {expected}")]
    FdCount {
        /// The request.
        request: RequestCode,
        /// Descriptors received.
        got: usize,
        /// Descriptors it takes.
        expected: usize,
    },
    /// A kick, call or err descriptor that is not an eventfd.
    #[error("{request} carries {target:?}, not an eventfd")]
    NotEventFd {
        /// The request.
        request: RequestCode,
        /// What the descriptor is (its `/proc/self/fd` link).
        target: String,
    },
    /// A memory region's descriptor that is not a regular file.
    #[error("SET_MEM_TABLE: the descriptor of region {region} is not a regular file")]
    NotRegularFile {
        /// The region's position in the table.
        region: usize,
    },
    /// A descriptor could not be examined or made non-blocking.
    #[error("{request}: cannot examine or prepare its descriptor: {source}")]
    Descriptor {
        /// The request.
        request: RequestCode,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// "bit 3, bit 27" for a virtio feature mask.
fn feature_bits(bits: u64) -> String {
    let names: Vec<String> = (0..64)
        .filter(|bit| bits & (1u64 << bit) != 0)
        .map(|bit| format!("bit {bit}"))
        .collect();
    names.join(", ")
}

/// "CONFIGURE_MEM_SLOTS | STATUS" for a protocol feature mask, unnamed bits in hex.
fn protocol_feature_names(bits: u64) -> String {
    let known = VhostUserProtocolFeatures::from_bits_truncate(bits);
    let mut names: Vec<String> = known.iter_names().map(|(name, _)| name.into()).collect();
    let unnamed = bits & !VhostUserProtocolFeatures::all().bits();
    if unnamed != 0 {
        names.push(format!("{unnamed:#x}"));
    }
    names.join(" | ")
}

/// What the relay does with a message the gate accepted.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Pass it to the daemon unchanged.
    Forward,
    /// An early `SET_VRING_ENABLE`, kept back; the relay answers it itself if `ack`.
    Hold {
        /// The frontend asked for a reply.
        ack: bool,
    },
    /// Pass it on (the `SET_FEATURES` that acks `PROTOCOL_FEATURES`), then these enable states
    /// (`SET_VRING_ENABLE` bodies, in ring order).
    ForwardThenReplay(Vec<[u8; 8]>),
}

/// How large a request's body is.
#[derive(Clone, Copy)]
enum BodyRule {
    Exact(usize),
    AtLeast(usize),
    MemTable,
}

/// Where a request names a ring.
#[derive(Clone, Copy)]
enum RingRule {
    None,
    /// A u32 at the start of the body (`VhostUserVringState`, `VhostUserVringAddr`).
    LeadingU32,
    /// A u64 body: index in bits 0-7, the no-fd flag in bit 8.
    FdBody,
}

/// Which descriptors a request carries.
#[derive(Clone, Copy)]
enum FdRule {
    None,
    VringEventFd,
    PerRegion,
}

#[derive(Clone, Copy)]
struct Rule {
    needs: Option<(VhostUserProtocolFeatures, &'static str)>,
    body: BodyRule,
    ring: RingRule,
    fds: FdRule,
}

impl Rule {
    const fn body(size: usize) -> Self {
        Rule {
            needs: None,
            body: BodyRule::Exact(size),
            ring: RingRule::None,
            fds: FdRule::None,
        }
    }

    const fn ring(size: usize) -> Self {
        Rule {
            ring: RingRule::LeadingU32,
            ..Rule::body(size)
        }
    }

    const fn needs(self, feature: VhostUserProtocolFeatures, name: &'static str) -> Self {
        Rule {
            needs: Some((feature, name)),
            ..self
        }
    }
}

/// The allowlist (see the module doc); `None` for every request svnic does not serve.
fn rule_for(request: u32) -> Option<Rule> {
    use FrontendReq as R;
    let request = FrontendReq::try_from(request).ok()?;
    Some(match request {
        R::GET_FEATURES | R::SET_OWNER | R::RESET_OWNER | R::GET_PROTOCOL_FEATURES => Rule::body(0),
        R::SET_FEATURES | R::SET_PROTOCOL_FEATURES => Rule::body(8),
        R::SET_MEM_TABLE => Rule {
            body: BodyRule::MemTable,
            fds: FdRule::PerRegion,
            ..Rule::body(0)
        },
        R::SET_VRING_NUM | R::SET_VRING_BASE | R::GET_VRING_BASE | R::SET_VRING_ENABLE => {
            Rule::ring(8)
        }
        R::SET_VRING_ADDR => Rule::ring(VRING_ADDR_LEN),
        R::SET_VRING_KICK | R::SET_VRING_CALL | R::SET_VRING_ERR => Rule {
            ring: RingRule::FdBody,
            fds: FdRule::VringEventFd,
            ..Rule::body(8)
        },
        R::GET_QUEUE_NUM => Rule::body(0).needs(VhostUserProtocolFeatures::MQ, "MQ"),
        R::GET_CONFIG | R::SET_CONFIG => Rule {
            body: BodyRule::AtLeast(CONFIG_HEADER),
            ..Rule::body(0)
        }
        .needs(VhostUserProtocolFeatures::CONFIG, "CONFIG"),
        R::RESET_DEVICE => {
            Rule::body(0).needs(VhostUserProtocolFeatures::RESET_DEVICE, "RESET_DEVICE")
        }
        _ => return None,
    })
}

fn u32_at(body: &[u8], at: usize) -> Option<u32> {
    let bytes = body.get(at..at.checked_add(4)?)?;
    let mut value = [0u8; 4];
    value.copy_from_slice(bytes);
    Some(u32::from_le_bytes(value))
}

fn u64_at(body: &[u8], at: usize) -> Option<u64> {
    let bytes = body.get(at..at.checked_add(8)?)?;
    let mut value = [0u8; 8];
    value.copy_from_slice(bytes);
    Some(u64::from_le_bytes(value))
}

/// The per-connection protocol state the relay's request thread keeps.
#[derive(Debug)]
pub(crate) struct RequestGate {
    offered_features: u64,
    offered_protocol: u64,
    acked_protocol: u64,
    /// Mirrors the vhost crate: set by every `SET_FEATURES`, to whether it acks
    /// `PROTOCOL_FEATURES`; until then `SET_VRING_ENABLE` is held back.
    protocol_features_acked: bool,
    /// The last enable state held back per ring (the 8-byte body).
    held_enables: [Option<[u8; 8]>; NUM_QUEUES],
}

impl RequestGate {
    /// A gate for what svnic's [`NetDevice`](crate::net::NetDevice) offers.
    pub(crate) fn for_device() -> Self {
        Self::new(
            device_features(),
            (protocol_features() | VhostUserProtocolFeatures::REPLY_ACK).bits(),
        )
    }

    /// A gate for a daemon offering these virtio and protocol features.
    pub(crate) fn new(offered_features: u64, offered_protocol: u64) -> Self {
        RequestGate {
            offered_features,
            offered_protocol,
            acked_protocol: 0,
            protocol_features_acked: false,
            held_enables: [None; NUM_QUEUES],
        }
    }

    /// How many enable states are held back (never more than the device's rings).
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held_enables.iter().flatten().count()
    }

    /// Checks one frontend message (its header's `request` and `flags`, its body and the
    /// descriptors that came with it) and says what to do with it. Kick, call and err eventfds
    /// are made non-blocking here. State changes only when the message is accepted.
    pub(crate) fn check(
        &mut self,
        request: u32,
        flags: u32,
        body: &[u8],
        files: &[File],
    ) -> Result<Verdict, Refusal> {
        let code = RequestCode(request);
        if flags & VERSION_MASK != FLAG_VERSION_1 || flags & !(VERSION_MASK | FLAG_NEED_REPLY) != 0
        {
            return Err(Refusal::Flags {
                request: code,
                flags,
            });
        }
        let rule = rule_for(request).ok_or(Refusal::NotServed { request: code })?;
        if let Some((feature, name)) = rule.needs {
            if self.acked_protocol & feature.bits() == 0 {
                return Err(Refusal::NotNegotiated {
                    request: code,
                    feature: name,
                });
            }
        }
        let expected_fds = check_body(code, rule, body)?;
        check_descriptors(code, rule.fds, expected_fds, files)?;
        self.apply(request, flags, body)
    }

    /// The accepted message's effect on the protocol state.
    fn apply(&mut self, request: u32, flags: u32, body: &[u8]) -> Result<Verdict, Refusal> {
        let value = u64_at(body, 0).unwrap_or(0);
        match FrontendReq::try_from(request) {
            Ok(FrontendReq::SET_FEATURES) => {
                let unoffered = value & !self.offered_features;
                if unoffered != 0 {
                    return Err(Refusal::UnofferedFeatures { unoffered });
                }
                self.protocol_features_acked =
                    value & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0;
                if !self.protocol_features_acked {
                    return Ok(Verdict::Forward);
                }
                let replay: Vec<[u8; 8]> = self
                    .held_enables
                    .iter_mut()
                    .filter_map(Option::take)
                    .collect();
                Ok(if replay.is_empty() {
                    Verdict::Forward
                } else {
                    Verdict::ForwardThenReplay(replay)
                })
            }
            Ok(FrontendReq::SET_PROTOCOL_FEATURES) => {
                let unoffered = value & !self.offered_protocol;
                if unoffered != 0 {
                    return Err(Refusal::UnofferedProtocolFeatures { unoffered });
                }
                self.acked_protocol = value;
                Ok(Verdict::Forward)
            }
            Ok(FrontendReq::SET_VRING_ENABLE) => {
                let (index, state) = (u32_at(body, 0).unwrap_or(0), u32_at(body, 4).unwrap_or(0));
                if state > 1 {
                    return Err(Refusal::EnableState { index, state });
                }
                if self.protocol_features_acked {
                    return Ok(Verdict::Forward);
                }
                // The ring index was checked against the device's rings.
                if let (Some(slot), Some(value)) = (
                    self.held_enables.get_mut(index as usize),
                    body.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()),
                ) {
                    *slot = Some(value);
                }
                Ok(Verdict::Hold {
                    ack: flags & FLAG_NEED_REPLY != 0,
                })
            }
            _ => Ok(Verdict::Forward),
        }
    }
}

/// Checks the body's size and ring index; returns how many descriptors the request takes.
fn check_body(code: RequestCode, rule: Rule, body: &[u8]) -> Result<usize, Refusal> {
    let size = body.len();
    let wrong_size = |expected| Refusal::BodySize {
        request: code,
        size,
        expected,
    };
    let mut expected_fds = 0;
    match rule.body {
        BodyRule::Exact(expected) if size != expected => return Err(wrong_size(expected)),
        BodyRule::AtLeast(least) if size < least => return Err(wrong_size(least)),
        BodyRule::Exact(_) | BodyRule::AtLeast(_) => {}
        BodyRule::MemTable => {
            let regions = u32_at(body, 0).ok_or(wrong_size(MEM_TABLE_HEADER))?;
            if regions == 0 || regions > MAX_REGIONS {
                return Err(Refusal::RegionCount { regions });
            }
            // At most MAX_REGIONS regions: no overflow.
            let expected = MEM_TABLE_HEADER + regions as usize * MEM_REGION_LEN;
            if size != expected {
                return Err(wrong_size(expected));
            }
            expected_fds = regions as usize;
        }
    }
    let index = match rule.ring {
        RingRule::None => return Ok(expected_fds),
        RingRule::LeadingU32 => u64::from(u32_at(body, 0).unwrap_or(u32::MAX)),
        RingRule::FdBody => {
            let value = u64_at(body, 0).unwrap_or(u64::MAX);
            if matches!(rule.fds, FdRule::VringEventFd) && value & VRING_NOFD == 0 {
                expected_fds = 1;
            }
            value & !VRING_NOFD
        }
    };
    if index >= NUM_QUEUES as u64 {
        return Err(Refusal::RingIndex {
            request: code,
            index,
        });
    }
    Ok(expected_fds)
}

/// Checks the count and kind of the descriptors; makes kick/call/err eventfds non-blocking.
fn check_descriptors(
    code: RequestCode,
    rule: FdRule,
    expected: usize,
    files: &[File],
) -> Result<(), Refusal> {
    if files.len() != expected {
        return Err(Refusal::FdCount {
            request: code,
            got: files.len(),
            expected,
        });
    }
    let io_error = |source| Refusal::Descriptor {
        request: code,
        source,
    };
    match rule {
        FdRule::None => {}
        FdRule::PerRegion => {
            for (region, file) in files.iter().enumerate() {
                if !file.metadata().map_err(io_error)?.file_type().is_file() {
                    return Err(Refusal::NotRegularFile { region });
                }
            }
        }
        FdRule::VringEventFd => {
            for file in files {
                let target = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
                    .map_err(io_error)?;
                if target.as_os_str() != EVENTFD_TARGET {
                    return Err(Refusal::NotEventFd {
                        request: code,
                        target: target.to_string_lossy().into_owned(),
                    });
                }
                set_nonblocking(file).map_err(io_error)?;
            }
        }
    }
    Ok(())
}

/// Sets O_NONBLOCK on the open file behind `file`.
fn set_nonblocking(file: &File) -> io::Result<()> {
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL only reads the status flags of `fd`, which `file` keeps open.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    if flags & libc::O_NONBLOCK != 0 {
        return Ok(());
    }
    // SAFETY: F_SETFL only changes the status flags of `fd`, which `file` keeps open.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
