//! The agent's records: connected applications, and each channel's memory and requests at
//! every stage (prepared, held, creating, live, destroying). Data only; what happens to them is
//! in [`super::book`].

use std::io;

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

/// A channel's memory and who it is charged to: the user whose quota it spends, and the
/// endpoint that user holds with it (no other uid may hold that endpoint meanwhile). Carried
/// from the moment the memory is passed to an application until it is freed: dropping it frees
/// the memory and ends the charge.
#[derive(Debug)]
pub(crate) struct Charged {
    pub(crate) memory: ChannelMemory,
    pub(crate) uid: u32,
    pub(crate) endpoint: u32,
}

impl Charged {
    /// The bytes charged.
    pub(crate) fn len(&self) -> u64 {
        self.memory.len()
    }
}

/// A channel's two eventfds, passed to its application: `wake` the agent signals when the
/// engine sends a Wake frame, `doorbell` the application signals for the agent to relay.
#[derive(Debug)]
pub(crate) struct ChannelEvents {
    pub(crate) wake: Event,
    pub(crate) doorbell: Event,
}

impl ChannelEvents {
    /// Two new eventfds.
    pub(crate) fn new() -> io::Result<Self> {
        Ok(ChannelEvents {
            wake: Event::new()?,
            doorbell: Event::new()?,
        })
    }
}

/// Memory passed to an application that has not said `Mapped` yet.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) charged: Charged,
    pub(crate) ring_size: u32,
    pub(crate) events: ChannelEvents,
}

/// Memory the engine knows of (or may): kept until the engine lets go of it.
#[derive(Debug)]
pub(crate) struct Held {
    /// Kept alive until the engine lets go of it; dropping it frees it.
    pub(crate) charged: Charged,
    pub(crate) app: u64,
    pub(crate) channel: Option<ChannelId>,
    pub(crate) quarantined: bool,
}

impl Held {
    pub(crate) fn channel(&self) -> Option<ChannelId> {
        self.channel
    }
}

/// A create request an application waits for.
#[derive(Debug)]
pub(crate) struct Creating {
    pub(crate) app: u64,
    pub(crate) token: u32,
    pub(crate) gpa: u64,
    pub(crate) addr: ChannelAddr,
    pub(crate) events: ChannelEvents,
}

/// A channel live in the engine for a connected application.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) app: u64,
    pub(crate) events: ChannelEvents,
}

/// A destroy request an application waits for.
#[derive(Debug)]
pub(crate) struct Destroying {
    pub(crate) app: u64,
    pub(crate) token: u32,
    pub(crate) channel: ChannelId,
}
