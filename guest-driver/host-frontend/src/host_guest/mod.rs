//! # A host-process guest: its NIC, and channels requested over it
//!
//! [`HostGuest`] owns a [`VirtioNet`] and speaks svnic control frames with the engine through it: create requests for channel regions it
//! allocates in the guest memory (answered Pending, then Success or Failure), destroy requests
//! (answered Destroyed, and only then is the region freed), doorbells, wakes.
//!
//! ## Threads
//! One `HostGuest` is a cheap handle (`Clone`) on shared state: an `Arc` holding the
//! `VirtioNet` behind a `Mutex` with a `Condvar`. The [`Doorbell`] and
//! [`svnic_client::channel::Waiter`] of every channel it creates hold the same `Arc`, so
//! `Channel::flush` may ring from any thread while another creates channels or reads raw frames.
//! Blocking never holds the lock: one waiting thread (the "leader") arms the device's
//! notifications under the lock, then sleeps on the call eventfds without it; the others sleep
//! on the condvar and are woken whenever the leader returns, and everybody re-examines what
//! arrived. So any number of threads may wait — for a wake of their channel, a control answer,
//! or raw frames — and none misses what another received.
//! The vhost-user connection stays open as long as the client or any of its channels lives.

mod core;
mod error;
mod notify;
mod pending;

#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use log::info;
use svnic_channels::frame::{ControlOp, ControlRequest, CreateRequest};
use svnic_channels::layout::DEFAULT_REGION_LEN;
use svnic_channels::{ChannelAddr, ChannelId, ChannelLayout, EndpointId, MacAddr};

pub use self::core::{ControlStats, RAW_QUEUE_LIMIT};
pub use self::error::ClientError;
pub use self::notify::{ChannelWaiter, FrameDoorbell};
pub use self::pending::{CreateState, PendingChannel};
pub use svnic_client::request_table::RegionLease;

use self::core::Core;
use crate::virtio_user::{CallWaiter, MemfdMemory, VirtioNet, DEFAULT_QUEUE_SIZE};
use svnic_client::channel::{Channel, Doorbell};
use svnic_client::request_table::Outcome;
use svnic_client::OwnedChannelError;

/// State shared by the client, its pending channels, doorbells and waiters.
#[derive(Debug)]
pub(crate) struct Shared {
    core: Mutex<Core>,
    cond: Condvar,
    waiter: CallWaiter,
    mac: MacAddr,
    memory: Arc<MemfdMemory>,
    /// Set once a doorbell or waiter has logged that the transport failed (they cannot return
    /// errors), so that the log is not flooded.
    pub(crate) warned: AtomicBool,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One non-blocking pass over the NIC; wakes waiters if anything arrived.
    pub(crate) fn poll(&self) -> Result<usize, ClientError> {
        let mut core = self.lock();
        let n = core.poll();
        drop(core);
        if !matches!(n, Ok(0)) {
            self.cond.notify_all();
        }
        n
    }

    /// Runs `cond` after processing what arrived, until it yields a value or `timeout` passes
    /// (`Ok(None)`). See the module documentation for how several threads share the wait.
    pub(crate) fn wait_until<T>(
        &self,
        timeout: Duration,
        mut cond: impl FnMut(&mut Core) -> Option<T>,
    ) -> Result<Option<T>, ClientError> {
        let deadline = Instant::now().checked_add(timeout);
        let mut core = self.lock();
        loop {
            let polled = core.poll();
            if !matches!(polled, Ok(0)) {
                self.cond.notify_all();
            }
            polled?;
            if let Some(v) = cond(&mut core) {
                return Ok(Some(v));
            }
            let remaining = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(r) if !r.is_zero() => r,
                    _ => return Ok(None),
                },
                None => Duration::from_secs(3600),
            };
            if core.leader {
                core = self
                    .cond
                    .wait_timeout(core, remaining)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
                continue;
            }
            if core.net.prepare_wait()? {
                continue;
            }
            core.leader = true;
            drop(core);
            let blocked = self.waiter.block(remaining);
            core = self.lock();
            core.leader = false;
            self.cond.notify_all();
            blocked?;
        }
    }
}

/// The channel control client of one guest NIC. See the module documentation.
#[derive(Debug, Clone)]
pub struct HostGuest {
    shared: Arc<Shared>,
}

impl HostGuest {
    /// Host-process mode: creates a memfd guest memory of `memory_size` bytes (e.g.
    /// [`crate::virtio_user::DEFAULT_MEMORY_SIZE`]), connects to the vhost-user backend at
    /// `socket_path` as its frontend, and brings up the virtio-net device.
    pub fn connect(socket_path: impl AsRef<Path>, memory_size: u64) -> Result<Self, ClientError> {
        let memory = Arc::new(MemfdMemory::new(memory_size)?);
        let net = VirtioNet::connect(socket_path, memory, DEFAULT_QUEUE_SIZE)?;
        Ok(Self::new(net))
    }

    /// A client over an already connected device.
    pub fn new(net: VirtioNet) -> Self {
        let waiter = net.call_waiter();
        let mac = net.mac();
        let memory = net.memory().clone();
        HostGuest {
            shared: Arc::new(Shared {
                core: Mutex::new(Core::new(net)),
                cond: Condvar::new(),
                waiter,
                mac,
                memory,
                warned: AtomicBool::new(false),
            }),
        }
    }

    /// The NIC's MAC address: the MAC of every channel this client creates.
    pub fn mac(&self) -> MacAddr {
        self.shared.mac
    }

    /// The guest memory channel regions are allocated from.
    pub fn memory(&self) -> &Arc<MemfdMemory> {
        &self.shared.memory
    }

    /// Counters.
    pub fn stats(&self) -> ControlStats {
        self.shared.lock().stats
    }

    /// Runs `f` on the device under the client's lock (counters, features; sending and
    /// receiving should go through the client, which demultiplexes).
    pub fn with_net<R>(&self, f: impl FnOnce(&mut VirtioNet) -> R) -> R {
        f(&mut self.shared.lock().net)
    }

    /// Asks the engine for a channel at (this NIC's MAC, `endpoint`) with `ring_size` slots per
    /// ring in a new `region_len`-byte region of the guest memory (2 MiB aligned). Returns at
    /// once; follow the request with [`PendingChannel::state`] or [`PendingChannel::wait`].
    pub fn begin_create(
        &self,
        endpoint: EndpointId,
        ring_size: u32,
        region_len: u64,
    ) -> Result<PendingChannel, ClientError> {
        ChannelLayout::new(ring_size, region_len).map_err(ClientError::BadParameters)?;
        let (gpa, region) = self.shared.memory.alloc_region(region_len)?;
        let mut core = self.shared.lock();
        let request_id = core.table.begin_create(RegionLease {
            gpa,
            len: region_len,
        });
        let addr = ChannelAddr::new(self.shared.mac, endpoint);
        let sent = core.send_request(ControlRequest {
            request_id,
            op: ControlOp::Create(CreateRequest {
                mac: addr.mac,
                endpoint,
                ring_size,
                region_addr: gpa,
                region_len,
            }),
        });
        if let Err(e) = sent {
            // The request may or may not have reached the engine: keep the region until an
            // answer says it may go (abandoned, so a late Success is destroyed).
            let actions = core.table.abandon(request_id);
            let _ = core.apply(actions);
            return Err(e);
        }
        Ok(PendingChannel::new(
            self.shared.clone(),
            request_id,
            addr,
            gpa,
            region,
        ))
    }

    /// Creates a channel and waits for the engine's answer: [`HostGuest::begin_create`] with
    /// the default 2 MiB region, then [`PendingChannel::wait`]. On timeout the request is
    /// abandoned (a channel the engine creates later is destroyed automatically).
    pub fn create_channel(
        &self,
        endpoint: EndpointId,
        ring_size: u32,
        timeout: Duration,
    ) -> Result<Channel, ClientError> {
        let pending = self.begin_create(endpoint, ring_size, DEFAULT_REGION_LEN)?;
        let request_id = pending.request_id();
        match pending.wait(timeout)? {
            CreateState::Success(channel) => Ok(channel),
            CreateState::Failure(reason) => Err(ClientError::Refused(reason)),
            CreateState::Pending(p) => {
                drop(p);
                Err(ClientError::Timeout {
                    what: "channel create",
                    request_id,
                    waited: timeout,
                })
            }
        }
    }

    /// Destroys `channel`: sends Destroy, waits for Destroyed, and only then frees its region.
    /// On timeout the region stays reserved until the engine answers (it is freed then, by
    /// whichever call processes the answer).
    pub fn destroy_channel(&self, channel: Channel, timeout: Duration) -> Result<(), ClientError> {
        let id = ChannelId(channel.id());
        let request_id = {
            let mut core = self.shared.lock();
            let request_id = core
                .table
                .begin_destroy(id)
                .ok_or(OwnedChannelError::Unknown(id))?;
            core.send_request(ControlRequest {
                request_id,
                op: ControlOp::Destroy { channel: id },
            })?;
            request_id
        };
        drop(channel);
        let done = self
            .shared
            .wait_until(timeout, |core| core.table.take_final(request_id))?;
        match done {
            Some(Outcome::Destroyed) => {
                info!("{id} destroyed; its region is free again");
                Ok(())
            }
            Some(Outcome::DestroyRefused(reason)) => Err(ClientError::DestroyRefused {
                channel: id,
                reason,
            }),
            Some(_) | None => {
                let mut core = self.shared.lock();
                let actions = core.table.abandon(request_id);
                core.apply(actions)?;
                Err(ClientError::Timeout {
                    what: "channel destroy",
                    request_id,
                    waited: timeout,
                })
            }
        }
    }

    /// Processes whatever arrived (control answers, wakes, raw frames) and sends what waits
    /// (requests, doorbells) without blocking. Returns the number of frames received.
    pub fn poll_control(&self) -> Result<usize, ClientError> {
        self.shared.poll()
    }

    /// Moves up to `max` received non-svnic frames (whole Ethernet frames, no virtio header)
    /// to `out`, after processing what arrived. Returns how many.
    pub fn recv_raw(&self, out: &mut Vec<Vec<u8>>, max: usize) -> Result<usize, ClientError> {
        self.shared.poll()?;
        Ok(self.shared.lock().take_raw(out, max))
    }

    /// Blocks until a raw frame is queued (then read it with [`HostGuest::recv_raw`]) or
    /// `timeout` passes. Returns true if one is queued.
    pub fn wait_raw(&self, timeout: Duration) -> Result<bool, ClientError> {
        Ok(self
            .shared
            .wait_until(timeout, |core| core.has_raw().then_some(()))?
            .is_some())
    }

    /// Sends one raw Ethernet frame through the NIC and notifies the device. `Ok(false)`: TX
    /// ring full, try again later. (svnic frames are consumed by the backend, never switched.)
    pub fn send_raw(&self, frame: &[u8]) -> Result<bool, ClientError> {
        let mut core = self.shared.lock();
        core.pump_tx()?;
        let sent = core.net.send_frame(frame)?;
        core.net.flush()?;
        Ok(sent)
    }

    /// The doorbell of channels created by this client (a Doorbell frame to the engine).
    pub fn doorbell(&self) -> Arc<dyn Doorbell> {
        Arc::new(FrameDoorbell::new(self.shared.clone()))
    }

    /// A [`svnic_client::channel::Waiter`] for `channel`: blocks until the engine's Wake frame for it
    /// arrives (use it with `Channel::wait_poll`).
    pub fn waiter(&self, channel: &Channel) -> ChannelWaiter {
        ChannelWaiter::new(self.shared.clone(), channel.id())
    }

    /// Live channels created by this client (destroy not begun), outstanding requests, and
    /// regions quarantined because the engine refused their destroy.
    pub fn channel_counts(&self) -> (usize, usize, usize) {
        let core = self.shared.lock();
        (
            core.table.live_channels(),
            core.table.outstanding(),
            core.table.quarantined().len(),
        )
    }
}
