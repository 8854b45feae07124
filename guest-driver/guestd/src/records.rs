//! The agent's records: connected applications, and each channel's memory and requests at
//! every stage (prepared, held, creating, live, destroying). Data only; what happens to them is
//! in [`super::book`].

use svnic_channels::{ChannelAddr, ChannelId};
use svnic_client::vm::event::Event;
use svnic_client::vm::seqpacket::SeqPacket;

use super::memory::ChannelMemory;

/// A connected application.
#[derive(Debug)]
pub(crate) struct App {
    pub(crate) sock: SeqPacket,
    pub(crate) pid: i32,
    /// The user it runs as (`SO_PEERCRED` when it connected): whose quota it spends.
    pub(crate) uid: u32,
}

/// Memory passed to an application that has not said `Mapped` yet.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) mem: ChannelMemory,
    pub(crate) uid: u32,
    pub(crate) endpoint: u32,
    pub(crate) ring_size: u32,
    pub(crate) wake: Event,
    pub(crate) doorbell: Event,
}

impl Prepared {
    pub(crate) fn len(&self) -> u64 {
        self.mem.len()
    }
}

/// Memory the engine knows of (or may): kept until the engine lets go of it.
#[derive(Debug)]
pub(crate) struct Held {
    /// Kept alive until the engine lets go of it; dropping it frees it.
    pub(crate) memory: ChannelMemory,
    pub(crate) app: u64,
    /// Charged to this uid, which holds `endpoint`, until the memory is freed.
    pub(crate) uid: u32,
    pub(crate) endpoint: u32,
    pub(crate) channel: Option<ChannelId>,
    pub(crate) quarantined: bool,
}

impl Held {
    pub(crate) fn channel(&self) -> Option<ChannelId> {
        self.channel
    }

    pub(crate) fn len(&self) -> u64 {
        self.memory.len()
    }
}

/// A create request an application waits for.
#[derive(Debug)]
pub(crate) struct Creating {
    pub(crate) app: u64,
    pub(crate) token: u32,
    pub(crate) gpa: u64,
    pub(crate) addr: ChannelAddr,
    pub(crate) wake: Event,
    pub(crate) doorbell: Event,
}

/// A channel live in the engine for a connected application.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) app: u64,
    pub(crate) wake: Event,
    pub(crate) doorbell: Event,
}

/// A destroy request an application waits for.
#[derive(Debug)]
pub(crate) struct Destroying {
    pub(crate) app: u64,
    pub(crate) token: u32,
    pub(crate) channel: ChannelId,
}
