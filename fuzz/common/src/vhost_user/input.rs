//! The input of `vhost_user_sequences`: a sequence of vhost-user messages, each with its header
//! fields, a body (structured for the messages that carry one, or raw bytes) and the file
//! descriptors attached to it.

use svnic_tests::raw_frontend::flags::{NEED_REPLY, VERSION_1};

use crate::encode::structured;

/// Messages per input at most (the rest is ignored).
pub const MAX_MESSAGES: usize = 64;
/// File descriptors attached to one message at most (the rest is ignored).
pub const MAX_FDS: usize = 8;
/// Regions of a structured memory table at most (vhost-user's own limit is 8: a few more are
/// sent to see them refused).
pub const MAX_REGIONS: usize = 10;
/// Raw body bytes at most.
pub const MAX_RAW_BODY: usize = 512;
/// Largest memfd an input may ask for (sparse: nothing is written to it).
pub const MAX_MEMFD: u64 = 64 << 20;
/// The highest request code [`Request::Known`] is biased toward.
pub const LAST_KNOWN_REQUEST: u32 = 40;

structured! {
    /// One fuzz input.
    pub struct Input {
        /// Sent in order over one fresh connection (at most [`MAX_MESSAGES`]).
        pub messages: Vec<Message>,
    }
}

structured! {
    /// One vhost-user message and what goes with it.
    pub struct Message {
        /// Before sending it, truncate to 0 every "truncated later" memfd sent so far.
        pub truncate_before: bool,
        /// The request code.
        pub request: Request,
        /// The header flags.
        pub flags: Flags,
        /// The body.
        pub body: Body,
        /// Overrides the header's body size (normally the body's length).
        pub size: Option<u32>,
        /// Attached file descriptors (SCM_RIGHTS), in order (at most [`MAX_FDS`]).
        pub fds: Vec<Attach>,
    }
}

structured! {
    /// The request code: mostly a real one, sometimes anything.
    #[derive(Copy)]
    pub enum Request {
        /// `1 + n % LAST_KNOWN_REQUEST`.
        Known(u8),
        /// Any code.
        Any(u32),
    }
}

impl Request {
    /// The code on the wire.
    pub fn code(self) -> u32 {
        match self {
            Request::Known(n) => 1 + u32::from(n) % LAST_KNOWN_REQUEST,
            Request::Any(code) => code,
        }
    }

    /// The `Known` form of a real code (for seeds).
    pub fn of(code: u32) -> Self {
        Request::Known(u8::try_from(code.saturating_sub(1)).unwrap_or(0))
    }
}

structured! {
    /// The header flags.
    #[derive(Copy)]
    pub enum Flags {
        /// Version 1, no reply asked (how QEMU sends most messages).
        Version1,
        /// Version 1 with NEED_REPLY.
        NeedReply,
        /// Anything.
        Raw(u32),
    }
}

impl Flags {
    /// The flags on the wire.
    pub fn bits(self) -> u32 {
        match self {
            Flags::Version1 => VERSION_1,
            Flags::NeedReply => VERSION_1 | NEED_REPLY,
            Flags::Raw(bits) => bits,
        }
    }
}

structured! {
    /// A message body.
    pub enum Body {
        /// No body.
        Empty,
        /// A u64 (features, protocol features, log base).
        U64(u64),
        /// `vhost_vring_state`: ring index and a number (size, base, enable).
        VringState { index: u32, num: u32, },
        /// The u64 of SET_VRING_KICK/CALL/ERR: ring index, bit 8 "no fd".
        VringFd { index: u8, no_fd: bool, },
        /// `vhost_vring_addr`.
        VringAddr {
            index: u32,
            flags: u32,
            desc: Addr,
            used: Addr,
            avail: Addr,
            log: u64,
        },
        /// `vhost_user_memory`: up to [`MAX_REGIONS`] regions; `claimed` replaces the region
        /// count.
        MemTable { regions: Vec<Region>, claimed: Option<u32>, },
        /// `vhost_user_memory_single_region` (ADD_MEM_REG / REM_MEM_REG).
        SingleRegion(Region),
        /// Up to [`MAX_RAW_BODY`] bytes.
        Raw(Vec<u8>),
    }
}

structured! {
    /// An address in a vring message.
    #[derive(Copy)]
    pub enum Addr {
        /// As is.
        Raw(u64),
        /// Inside a region of the last memory table sent (its frontend address plus `offset`
        /// modulo the region's size), or `offset` when none was sent.
        InRegion { region: u8, offset: u32, },
    }
}

structured! {
    /// A memory-table region.
    #[derive(Copy)]
    pub enum Region {
        /// Every field as is.
        Raw { gpa: u64, size: u64, user_addr: u64, offset: u64, },
        /// In pages: plausible values, more likely to fit a memfd.
        Pages { gpa_page: u16, pages: u16, user_page: u32, offset_page: u16, },
    }
}

/// Page size of [`Region::Pages`].
pub const PAGE: u64 = 4096;
/// Frontend addresses of [`Region::Pages`] start here (like a user-space mapping).
pub const USER_BASE: u64 = 0x7f00_0000_0000;

impl Region {
    /// The region on the wire.
    pub fn wire(self) -> svnic_tests::raw_frontend::MemRegion {
        use svnic_tests::raw_frontend::MemRegion;
        match self {
            Region::Raw {
                gpa,
                size,
                user_addr,
                offset,
            } => MemRegion {
                gpa,
                size,
                user_addr,
                mmap_offset: offset,
            },
            Region::Pages {
                gpa_page,
                pages,
                user_page,
                offset_page,
            } => MemRegion {
                gpa: u64::from(gpa_page) * PAGE,
                size: u64::from(pages) * PAGE,
                user_addr: USER_BASE + u64::from(user_page) * PAGE,
                mmap_offset: u64::from(offset_page) * PAGE,
            },
        }
    }
}

structured! {
    /// A file descriptor attached to a message.
    #[derive(Copy)]
    pub enum Attach {
        /// A memfd of `size % (MAX_MEMFD + 1)` bytes; sealed against shrinking and growing (as
        /// QEMU's memory-backend-memfd is) or not.
        Memfd { size: u32, sealed: bool, },
        /// An unsealed memfd that a later message's `truncate_before` truncates to 0.
        MemfdTruncatedLater { size: u32, },
        /// An eventfd.
        EventFd,
        /// The read end of a pipe (the harness keeps the write end).
        PipeRead,
        /// The write end of a pipe, which nobody reads (the harness keeps the read end).
        PipeWrite,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::{decode, Encode};

    #[test]
    fn every_variant_round_trips_through_arbitrary() {
        let regions = vec![
            Region::Raw {
                gpa: 1,
                size: u64::MAX,
                user_addr: 3,
                offset: 4,
            },
            Region::Pages {
                gpa_page: 5,
                pages: 6,
                user_page: 7,
                offset_page: 8,
            },
        ];
        let bodies = [
            Body::Empty,
            Body::U64(u64::MAX - 1),
            Body::VringState { index: 1, num: 2 },
            Body::VringFd {
                index: 1,
                no_fd: true,
            },
            Body::VringAddr {
                index: 1,
                flags: 2,
                desc: Addr::Raw(3),
                used: Addr::InRegion {
                    region: 4,
                    offset: 5,
                },
                avail: Addr::Raw(6),
                log: 7,
            },
            Body::MemTable {
                regions: regions.clone(),
                claimed: Some(9),
            },
            Body::SingleRegion(regions[1]),
            Body::Raw(vec![0, 1, 0xff, 2]),
        ];
        let fds = [
            Attach::Memfd {
                size: 77,
                sealed: true,
            },
            Attach::MemfdTruncatedLater { size: 88 },
            Attach::EventFd,
            Attach::PipeRead,
            Attach::PipeWrite,
        ];
        let messages = bodies
            .into_iter()
            .enumerate()
            .map(|(i, body)| Message {
                truncate_before: i % 2 == 1,
                request: if i % 3 == 0 {
                    Request::Any(0xdead_0000 + i as u32)
                } else {
                    Request::of(i as u32 + 1)
                },
                flags: [Flags::Version1, Flags::NeedReply, Flags::Raw(0x1234)][i % 3],
                body,
                size: (i % 2 == 0).then_some(i as u32),
                fds: fds[..i % 6].to_vec(),
            })
            .collect();
        let input = Input { messages };
        assert_eq!(decode::<Input>(&input.to_bytes()), Ok(input));
    }

    #[test]
    fn request_codes_stay_known_and_flags_match_the_protocol() {
        use svnic_tests::raw_frontend::req;
        assert_eq!(Request::of(req::SET_MEM_TABLE).code(), req::SET_MEM_TABLE);
        assert_eq!(Request::Known(255).code(), 1 + 255 % 40);
        assert_eq!(Flags::NeedReply.bits(), 0x9);
    }
}
