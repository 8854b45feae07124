//! The reliability protocol between engines, as a state machine without I/O: a sender keeps a
//! bounded window of data frames per session and retransmits go-back-N; a receiver accepts frames
//! in order only and acknowledges cumulatively. docs/wire.md is the normative description.
//!
//! Nothing here reads a clock, touches a socket or spawns a thread: the engine passes `now` in,
//! encodes the frames [`SendTable::transmit`] hands it, and feeds decoded data and ack frames
//! back. Both tables are generic over the engine's per-message state: `T` on the sending side
//! (whatever it needs to re-read a message's bytes for a retransmission and to complete it), `P`
//! on the receiving side (where the message is being placed).
//!
//! - [`send`]: [`SendSession`] and the bounded [`SendTable`].
//! - [`recv`]: [`RecvSession`] and the bounded [`RecvTable`], and the stateless answer
//!   [`no_route`].
//! - [`rtt`]: the retransmission timeout estimator (RFC 6298).
//! - [`fault`]: the seeded fault injector for tests ([`FaultInjection`], [`FaultInjector`]).

pub mod fault;
pub mod recv;
pub mod rtt;
pub mod send;

#[cfg(test)]
mod sim_tests;

use std::time::Duration;

use svnic_channels::frame::{
    AckFrame, AckKind, BundleFrame, DataFrame, DataKind, Frame, FrameBody, DEFAULT_MTU,
    MAX_DATA_LEN,
};
use svnic_channels::{ChannelAddr, ChannelId, CompletionStatus, DataMessage};

pub use fault::{FaultCounters, FaultInjection, FaultInjector};
pub use recv::{no_route, Blocked, BundleVerdict, RecvCounters, RecvSession, RecvTable, Verdict};
pub use rtt::RttEstimator;
pub use send::Bundle;
pub use send::{FrameOut, Refused, SendCounters, SendSession, SendTable};

/// Parameters of the protocol; docs/wire.md ("Timers and bounds") argues the defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReliableConfig {
    /// Payload bytes per data frame (the uplink MTU minus 44).
    pub chunk: usize,
    /// Data frames sent but not acknowledged, per session.
    pub window_frames: u32,
    /// Messages queued or in flight, per session; more are refused (backpressure).
    pub max_messages: usize,
    /// Lower bound of the retransmission timeout.
    pub min_rto: Duration,
    /// Retransmission timeout before the first round-trip sample.
    pub initial_rto: Duration,
    /// Upper bound of the retransmission timeout (backoff stops there).
    pub max_rto: Duration,
    /// Without any valid ack for this long while frames are outstanding, every message of the
    /// session completes [`CompletionStatus::PeerUnreachable`].
    pub peer_timeout: Duration,
    /// How long a receiver retries a frame it cannot place before rejecting its message.
    pub backpressure_wait: Duration,
    /// A receiving state without progress (a frame taken) for this long may be dropped (a partial message with
    /// it); a sending session idle for half of it starts a new session before its next message.
    pub state_lifetime: Duration,
    /// Sending sessions per table.
    pub max_send_sessions: usize,
    /// Receiving states per table.
    pub max_recv_sessions: usize,
}

impl Default for ReliableConfig {
    fn default() -> Self {
        ReliableConfig {
            // The default MTU's capacity; the engine sets it from its uplink's MTU.
            chunk: DataMessage::fragment_capacity(DEFAULT_MTU).unwrap_or(1456),
            window_frames: 256,
            max_messages: 64,
            min_rto: Duration::from_millis(1),
            initial_rto: Duration::from_millis(10),
            max_rto: Duration::from_millis(200),
            peer_timeout: Duration::from_secs(2),
            backpressure_wait: Duration::from_millis(1),
            state_lifetime: Duration::from_secs(10),
            max_send_sessions: 1024,
            max_recv_sessions: 1024,
        }
    }
}

/// Smallest fragment: the capacity at the smallest MTU. Smaller fragments would number a
/// session's queued messages (up to 4096 of 1 MiB) past 2^31 frames, where serial-number
/// comparisons are ambiguous.
pub const MIN_CHUNK: usize = svnic_channels::frame::MIN_MTU
    - svnic_channels::frame::SVNIC_HEADER_LEN
    - svnic_channels::frame::DATA_HEADER_LEN;

/// Largest window: far below 2^31, so serial-number comparisons never become ambiguous even
/// with every queued message numbered ahead of the window.
pub const MAX_WINDOW_FRAMES: u32 = 1 << 16;

impl ReliableConfig {
    /// Entry bytes a bundle frame holds: the frame a data frame of `chunk` payload bytes would
    /// fill.
    pub fn bundle_room(&self) -> u32 {
        let frame = self.chunk + svnic_channels::frame::DATA_HEADER_LEN;
        frame.saturating_sub(svnic_channels::frame::BUNDLE_HEADER_LEN) as u32
    }

    /// Checks that the values make sense together; the error names the field and the value.
    pub fn validate(&self) -> Result<(), String> {
        let err =
            |field: &str, what: String| Err(format!("reliable uplink config: {field} {what}"));
        if self.chunk < MIN_CHUNK || self.chunk > usize::from(u16::MAX) {
            return err(
                "chunk",
                format!("{} is not in {MIN_CHUNK}..=65535", self.chunk),
            );
        }
        if self.window_frames == 0 || self.window_frames > MAX_WINDOW_FRAMES {
            return err(
                "window_frames",
                format!("{} is not in 1..={MAX_WINDOW_FRAMES}", self.window_frames),
            );
        }
        if self.max_messages == 0 || self.max_messages > 4096 {
            return err(
                "max_messages",
                format!("{} is not in 1..=4096", self.max_messages),
            );
        }
        if self.min_rto.is_zero()
            || self.min_rto > self.initial_rto
            || self.initial_rto > self.max_rto
        {
            return err(
                "min_rto/initial_rto/max_rto",
                format!(
                    "{:?}/{:?}/{:?} are not 0 < min <= initial <= max",
                    self.min_rto, self.initial_rto, self.max_rto
                ),
            );
        }
        if self.peer_timeout < self.max_rto {
            return err(
                "peer_timeout",
                format!(
                    "{:?} is shorter than max_rto {:?}",
                    self.peer_timeout, self.max_rto
                ),
            );
        }
        // A sender gives up within the peer timeout, and a state blocked for the whole
        // backpressure wait takes no frame meanwhile: a state outlives both, twice over.
        let floor = self
            .peer_timeout
            .max(self.backpressure_wait)
            .saturating_mul(2);
        if self.state_lifetime < floor {
            return err(
                "state_lifetime",
                format!(
                    "{:?} is shorter than twice peer_timeout {:?} or twice backpressure_wait {:?}",
                    self.state_lifetime, self.peer_timeout, self.backpressure_wait
                ),
            );
        }
        if self.max_send_sessions == 0 || self.max_recv_sessions == 0 {
            return err(
                "max_send_sessions/max_recv_sessions",
                "must be at least 1".into(),
            );
        }
        Ok(())
    }

    /// Data frames a message of `len` bytes takes: an empty message is one empty frame.
    pub fn frames_of(&self, len: u32) -> u32 {
        let chunk = self.chunk.max(1) as u64;
        u64::from(len).div_ceil(chunk).max(1) as u32
    }
}

/// Serial-number arithmetic on `u32` sequence numbers (RFC 1982): `a` comes before `b`.
pub fn seq_lt(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// `a` comes before `b` or is `b`.
pub fn seq_le(a: u32, b: u32) -> bool {
    a == b || seq_lt(a, b)
}

/// The key of a session in a table: the local channel and the remote channel's address.
pub type SessionKey = (ChannelId, ChannelAddr);

/// What the protocol needs from a data frame (everything but the payload bytes).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DataHeader {
    /// The sender's session.
    pub session: u32,
    /// The frame's sequence number.
    pub seq: u32,
    /// The message the frame belongs to.
    pub message_id: u32,
    /// User-data or DMA-data.
    pub kind: DataKind,
    /// The message's flags.
    pub msg_flags: u8,
    /// The message's length.
    pub total_len: u32,
    /// Where this fragment starts in the message.
    pub frag_offset: u32,
    /// This fragment's length.
    pub frag_len: u32,
    /// The sender's cookie.
    pub cookie: u64,
}

impl DataHeader {
    /// The header of a decoded data frame.
    pub fn of(d: &DataFrame<'_>) -> DataHeader {
        DataHeader {
            session: d.session,
            seq: d.seq,
            message_id: d.header.message_id,
            kind: d.header.kind,
            msg_flags: d.header.msg_flags,
            total_len: d.total_len,
            frag_offset: d.frag_offset,
            frag_len: d.payload.len() as u32,
            cookie: d.header.cookie,
        }
    }

    /// True if this fragment ends the message.
    pub fn is_last(&self) -> bool {
        u64::from(self.frag_offset) + u64::from(self.frag_len) >= u64::from(self.total_len)
    }
}

/// What the protocol needs from a bundle frame (everything but the entries).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct BundleHeader {
    /// The sender's session.
    pub session: u32,
    /// The frame's sequence number.
    pub seq: u32,
    /// The first message's id; entry `i` is message `first_message_id + i`.
    pub first_message_id: u32,
    /// Number of entries (at least 2).
    pub count: u16,
}

impl BundleHeader {
    /// The header of a decoded bundle frame.
    pub fn of(b: &BundleFrame<'_>) -> BundleHeader {
        BundleHeader {
            session: b.session,
            seq: b.seq,
            first_message_id: b.first_message_id,
            count: b.count,
        }
    }

    /// Entry `i` as the header of a whole user-data message (its length and cookie are not
    /// the protocol's business: 0 here).
    fn entry(&self, i: u16) -> DataHeader {
        DataHeader {
            session: self.session,
            seq: self.seq,
            message_id: self.first_message_id.wrapping_add(u32::from(i)),
            kind: DataKind::UserData,
            msg_flags: 0,
            total_len: 0,
            frag_offset: 0,
            frag_len: 0,
            cookie: 0,
        }
    }
}

/// A message the sender is done with: its handle back, and how it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completed<T> {
    /// The sending channel.
    pub local: ChannelId,
    /// The destination.
    pub remote: ChannelAddr,
    /// The engine's handle, as offered.
    pub handle: T,
    /// Ok if the receiver delivered it; else why not.
    pub status: CompletionStatus,
}

/// An ack the receiving engine must send: from `local`'s MAC and endpoint to `remote`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutgoingAck {
    /// The receiving channel (the ack's source).
    pub local: ChannelId,
    /// The sending channel (the ack's destination).
    pub remote: ChannelAddr,
    /// The session acknowledged.
    pub session: u32,
    /// What to say.
    pub kind: AckKind,
}

impl OutgoingAck {
    /// The ack frame to encode, from the receiving channel at `local_addr` (its MAC and
    /// endpoint) to the sending channel.
    pub fn frame(&self, local_addr: ChannelAddr) -> Frame<'static> {
        Frame {
            dst: self.remote.mac,
            src: local_addr.mac,
            body: FrameBody::Ack(AckFrame {
                src_endpoint: local_addr.endpoint,
                dst_endpoint: self.remote.endpoint,
                session: self.session,
                kind: self.kind,
            }),
        }
    }
}

/// Largest message the protocol carries (the frame format's limit).
pub const MAX_MESSAGE_LEN: u32 = MAX_DATA_LEN;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_arithmetic_wraps() {
        assert!(seq_lt(1, 2));
        assert!(seq_lt(u32::MAX, 0));
        assert!(seq_lt(u32::MAX - 5, 3));
        assert!(!seq_lt(3, u32::MAX - 5));
        assert!(!seq_lt(7, 7));
        assert!(seq_le(7, 7));
        assert!(!seq_le(8, 7));
        assert!(seq_lt(0, (1 << 31) - 1));
    }

    #[test]
    fn default_config_is_valid_and_each_bad_field_is_named() {
        let c = ReliableConfig::default();
        assert_eq!((c.chunk, MIN_CHUNK), (1456, 24));
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.frames_of(0), 1);
        assert_eq!(c.frames_of(1456), 1);
        assert_eq!(c.frames_of(1457), 2);
        assert_eq!(c.frames_of(MAX_MESSAGE_LEN), 721);
        type Spoil = fn(&mut ReliableConfig);
        let cases: [(&str, Spoil); 12] = [
            ("chunk", |c| c.chunk = 0),
            ("chunk", |c| c.chunk = MIN_CHUNK - 1),
            ("chunk", |c| c.chunk = 65_536),
            ("min_rto/initial_rto/max_rto", |c| {
                c.initial_rto = c.max_rto * 2
            }),
            ("window_frames", |c| c.window_frames = MAX_WINDOW_FRAMES + 1),
            ("max_messages", |c| c.max_messages = 0),
            ("min_rto", |c| c.min_rto = Duration::ZERO),
            ("peer_timeout", |c| {
                c.peer_timeout = Duration::from_millis(1)
            }),
            ("state_lifetime", |c| c.state_lifetime = c.peer_timeout),
            ("state_lifetime", |c| c.backpressure_wait = c.state_lifetime),
            ("max_send_sessions", |c| c.max_send_sessions = 0),
            ("max_recv_sessions", |c| c.max_recv_sessions = 0),
        ];
        for (field, spoil) in cases {
            let mut c = ReliableConfig::default();
            spoil(&mut c);
            let e = c.validate().unwrap_err();
            assert!(e.contains(field), "{e}");
        }
    }
}
