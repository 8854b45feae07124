//! [`PendingChannel`]: a create request on its way (Pending -> Success | Failure).

use std::sync::Arc;
use std::time::Duration;

use log::{info, warn};
use svnic_channels::{ChannelAddr, FailureReason, SharedRegion};

use super::error::ClientError;
use super::notify::FrameDoorbell;
use super::Shared;
use svnic_client::channel::Channel;
use svnic_client::request_table::Outcome;
use svnic_client::OwnedChannelError;

/// Where a create request stands.
#[derive(Debug)]
pub enum CreateState {
    /// No final answer yet (or only Pending): ask again later.
    Pending(PendingChannel),
    /// Created and attached.
    Success(Channel),
    /// Refused; nothing was allocated, and the region went back to the guest memory.
    Failure(FailureReason),
}

/// A channel create request that has been sent. Dropping it unanswered abandons it: its answer is
/// still processed, and a channel created for it is destroyed.
#[derive(Debug)]
pub struct PendingChannel {
    shared: Arc<Shared>,
    request_id: u32,
    addr: ChannelAddr,
    region_addr: u64,
    region: SharedRegion,
    finished: bool,
}

impl PendingChannel {
    pub(crate) fn new(
        shared: Arc<Shared>,
        request_id: u32,
        addr: ChannelAddr,
        region_addr: u64,
        region: SharedRegion,
    ) -> Self {
        PendingChannel {
            shared,
            request_id,
            addr,
            region_addr,
            region,
            finished: false,
        }
    }

    /// The request id (echoed by the engine).
    pub fn request_id(&self) -> u32 {
        self.request_id
    }

    /// The channel's address (this NIC's MAC, the endpoint).
    pub fn addr(&self) -> ChannelAddr {
        self.addr
    }

    /// Guest-physical address of the channel region.
    pub fn region_addr(&self) -> u64 {
        self.region_addr
    }

    /// Processes what arrived (without blocking) and says where the request stands.
    pub fn state(self) -> Result<CreateState, ClientError> {
        self.shared.poll()?;
        self.resolve()
    }

    /// Waits up to `timeout` for the final answer. `CreateState::Pending` on timeout.
    pub fn wait(self, timeout: Duration) -> Result<CreateState, ClientError> {
        let id = self.request_id;
        self.shared.wait_until(timeout, |core| {
            (core.table.outcome(id) != Some(Outcome::Pending)).then_some(())
        })?;
        self.resolve()
    }

    fn resolve(mut self) -> Result<CreateState, ClientError> {
        let outcome = self.shared.lock().table.take_final(self.request_id);
        let (channel, worker, cpu) = match outcome {
            None => return Ok(CreateState::Pending(self)),
            Some(Outcome::Refused(reason)) => {
                self.finished = true;
                return Ok(CreateState::Failure(reason));
            }
            Some(Outcome::Created {
                channel,
                worker,
                cpu,
            }) => (channel, worker, cpu),
            // The table gives create requests only create outcomes.
            Some(Outcome::Pending | Outcome::Destroyed | Outcome::DestroyRefused(_)) => {
                self.finished = true;
                return Ok(CreateState::Failure(FailureReason::BadRequest));
            }
        };
        self.finished = true;
        let doorbell = Arc::new(FrameDoorbell::new(self.shared.clone()));
        let attached = Channel::attach(self.region.clone(), self.addr, doorbell).and_then(|ch| {
            if ch.id() == channel.0 {
                Ok(ch)
            } else {
                Err(svnic_client::channel::ChannelError::WrongChannel {
                    header: ch.id(),
                    answer: channel.0,
                })
            }
        });
        match attached {
            Ok(ch) => {
                info!(
                    "{channel} created at {} (region {:#x}), served by worker {worker}",
                    self.addr, self.region_addr
                );
                if ch.served_by() != (worker, cpu) {
                    warn!(
                        "{channel}: header says worker/CPU {:?}, the engine's answer {:?}",
                        ch.served_by(),
                        (worker, cpu)
                    );
                }
                Ok(CreateState::Success(ch))
            }
            Err(source) => {
                // The engine holds a channel we cannot use: give it back.
                let mut core = self.shared.lock();
                core.apply(vec![svnic_client::request_table::Action::Destroy(channel)])?;
                Err(OwnedChannelError::Attach { channel, source }.into())
            }
        }
    }
}

impl Drop for PendingChannel {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let mut core = self.shared.lock();
        let actions = core.table.abandon(self.request_id);
        if let Err(e) = core.apply(actions) {
            warn!("abandoning create request {}: {e}", self.request_id);
        }
    }
}
