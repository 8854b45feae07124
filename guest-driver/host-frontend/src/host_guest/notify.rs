//! The [`Doorbell`] and [`Waiter`] of channels created through the control client: a Doorbell
//! frame to the engine through the TX queue, and a wait for the engine's Wake frame on RX.
//!
//! Neither trait can return an error. A failing transport is logged once; a waiter then sleeps a
//! little instead of spinning, so `Channel::wait_poll` degrades to polling the channel rings,
//! which do not depend on the NIC.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use log::warn;

use super::error::ClientError;
use super::Shared;
use svnic_client::channel::{Doorbell, Waiter};

/// Longest sleep of a waiter whose transport failed.
const FAILED_WAIT: Duration = Duration::from_millis(10);

fn warn_once(shared: &Shared, what: &str, e: &ClientError) {
    if !shared.warned.swap(true, Ordering::Relaxed) {
        warn!("{what}: {e} (further failures are not logged)");
    }
}

/// Rings a channel's doorbell by sending a Doorbell frame {channel} to the engine. If the TX
/// ring is full the doorbell is kept and sent before anything else later.
#[derive(Debug)]
pub struct FrameDoorbell {
    shared: Arc<Shared>,
}

impl FrameDoorbell {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        FrameDoorbell { shared }
    }
}

impl Doorbell for FrameDoorbell {
    fn ring(&self, channel_id: u32) {
        let result = self.shared.lock().ring_doorbell(channel_id);
        if let Err(e) = result {
            warn_once(&self.shared, "doorbell", &e);
        }
    }
}

/// Blocks until the engine's Wake frame for one channel arrives (or the timeout passes). A wake
/// that arrived before the wait began ends it at once, so none is lost between the channel's
/// "sleeping" flag and the wait.
#[derive(Debug, Clone)]
pub struct ChannelWaiter {
    shared: Arc<Shared>,
    channel: u32,
}

impl ChannelWaiter {
    pub(crate) fn new(shared: Arc<Shared>, channel: u32) -> Self {
        ChannelWaiter { shared, channel }
    }

    /// Like [`Waiter::wait`], but says whether a wake arrived and reports transport errors.
    pub fn wait_for_wake(&self, timeout: Duration) -> Result<bool, ClientError> {
        let channel = self.channel;
        Ok(self
            .shared
            .wait_until(timeout, |core| core.take_wake(channel).then_some(()))?
            .is_some())
    }
}

impl Waiter for ChannelWaiter {
    fn wait(&self, timeout: Duration) {
        if let Err(e) = self.wait_for_wake(timeout) {
            warn_once(&self.shared, "channel waiter", &e);
            std::thread::sleep(timeout.min(FAILED_WAIT));
        }
    }
}
