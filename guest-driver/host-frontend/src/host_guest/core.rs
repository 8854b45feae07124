//! The state behind the client's mutex: the [`VirtioNet`], the request table, and what arrived
//! for whom. Incoming frames are demultiplexed here: svnic frames from the engine (control
//! responses, wakes) are consumed; every other frame is queued for the application as a raw
//! virtio-net frame.
//!
//! Outgoing control requests and doorbells never get lost to a full TX ring: requests wait in a
//! backlog and doorbells in a set (one per channel is enough), both sent before anything else on
//! every later pass.

use std::collections::{BTreeSet, HashSet, VecDeque};

use log::{debug, warn};
use svnic_channels::frame::{claims_svnic, ControlRequest, Frame, FrameBody};
use svnic_channels::{ChannelId, MacAddr};

use super::error::ClientError;
use crate::virtio_user::VirtioNet;
use svnic_client::request_table::{Action, RequestTable};

/// Raw frames kept for the application before the oldest are dropped.
pub const RAW_QUEUE_LIMIT: usize = 4096;
/// Frames taken from the RX ring per pass.
const RX_BUDGET: usize = 256;

/// Counters of the control client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ControlStats {
    /// Control responses applied.
    pub responses: u64,
    /// Control responses ignored (unknown request, impossible status).
    pub ignored_responses: u64,
    /// Wake frames received.
    pub wakes: u64,
    /// Doorbell frames sent.
    pub doorbells: u64,
    /// Doorbells that found the TX ring full and were sent later.
    pub doorbells_deferred: u64,
    /// Raw (non-svnic) frames queued for the application.
    pub raw_received: u64,
    /// Raw frames dropped because the application did not read them (queue full).
    pub raw_dropped: u64,
    /// svnic frames dropped: malformed, not from the engine, or of a type a guest never gets.
    pub svnic_dropped: u64,
}

/// Everything behind the client's mutex.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) net: VirtioNet,
    pub(crate) table: RequestTable,
    raw: VecDeque<Vec<u8>>,
    wakes: HashSet<u32>,
    doorbells: BTreeSet<u32>,
    backlog: VecDeque<Vec<u8>>,
    /// True while one thread blocks on the call eventfds for everybody (see `Shared::wait_until`).
    pub(crate) leader: bool,
    pub(crate) stats: ControlStats,
    scratch: Vec<Vec<u8>>,
}

impl Core {
    pub(crate) fn new(net: VirtioNet) -> Self {
        Core {
            net,
            table: RequestTable::new(),
            raw: VecDeque::new(),
            wakes: HashSet::new(),
            doorbells: BTreeSet::new(),
            backlog: VecDeque::new(),
            leader: false,
            stats: ControlStats::default(),
            scratch: Vec::new(),
        }
    }

    /// Queues a control request to the engine and sends what the TX ring takes.
    pub(crate) fn send_request(&mut self, req: ControlRequest) -> Result<(), ClientError> {
        let frame = Frame {
            dst: MacAddr::ENGINE,
            src: self.net.mac(),
            body: FrameBody::ControlRequest(req),
        };
        self.backlog.push_back(frame.encode()?);
        self.pump_tx()
    }

    /// Queues a doorbell for `channel` and sends what the TX ring takes.
    pub(crate) fn ring_doorbell(&mut self, channel: u32) -> Result<(), ClientError> {
        self.doorbells.insert(channel);
        self.pump_tx()?;
        if self.doorbells.contains(&channel) {
            self.stats.doorbells_deferred += 1;
        }
        Ok(())
    }

    /// Sends queued requests, then queued doorbells, as far as the TX ring allows; one flush.
    pub(crate) fn pump_tx(&mut self) -> Result<(), ClientError> {
        let mut sent = false;
        while let Some(frame) = self.backlog.front() {
            if !self.net.send_frame(frame)? {
                break;
            }
            self.backlog.pop_front();
            sent = true;
        }
        if self.backlog.is_empty() {
            while let Some(&channel) = self.doorbells.first() {
                let frame = Frame {
                    dst: MacAddr::ENGINE,
                    src: self.net.mac(),
                    body: FrameBody::Doorbell {
                        channel: ChannelId(channel),
                    },
                }
                .encode()?;
                if !self.net.send_frame(&frame)? {
                    break;
                }
                self.doorbells.pop_first();
                self.stats.doorbells += 1;
                sent = true;
            }
        }
        if sent {
            self.net.flush()?;
        }
        Ok(())
    }

    /// One non-blocking pass: sends what waits, takes received frames and dispatches them.
    /// Returns the number of frames received.
    pub(crate) fn poll(&mut self) -> Result<usize, ClientError> {
        self.pump_tx()?;
        let mut frames = std::mem::take(&mut self.scratch);
        frames.clear();
        let n = self.net.recv_frames(&mut frames, RX_BUDGET);
        let mut result = n.map_err(ClientError::from);
        for frame in frames.drain(..) {
            if let Err(e) = self.dispatch(frame) {
                result = Err(e);
            }
        }
        self.scratch = frames;
        // Answers may have queued destroys of abandoned channels.
        if !self.backlog.is_empty() || !self.doorbells.is_empty() {
            self.pump_tx()?;
        }
        result
    }

    fn dispatch(&mut self, bytes: Vec<u8>) -> Result<(), ClientError> {
        if !claims_svnic(&bytes) {
            if self.raw.len() >= RAW_QUEUE_LIMIT {
                self.raw.pop_front();
                self.stats.raw_dropped += 1;
            }
            self.raw.push_back(bytes);
            self.stats.raw_received += 1;
            return Ok(());
        }
        let frame = match Frame::decode(&bytes) {
            Ok(f) if f.src == MacAddr::ENGINE => f,
            Ok(f) => {
                self.stats.svnic_dropped += 1;
                debug!("svnic frame from {} (not the engine) dropped", f.src);
                return Ok(());
            }
            Err(e) => {
                self.stats.svnic_dropped += 1;
                debug!("malformed svnic frame dropped: {e}");
                return Ok(());
            }
        };
        match frame.body {
            FrameBody::ControlResponse(resp) => match self.table.on_response(&resp) {
                Ok(actions) => {
                    self.stats.responses += 1;
                    self.apply(actions)
                }
                Err(why) => {
                    self.stats.ignored_responses += 1;
                    debug!("control response ignored: {why:?}");
                    Ok(())
                }
            },
            FrameBody::Wake { channel } => {
                self.stats.wakes += 1;
                self.wakes.insert(channel.0);
                Ok(())
            }
            // Requests, doorbells and the engines' frames between hosts never come to a guest.
            _ => {
                self.stats.svnic_dropped += 1;
                Ok(())
            }
        }
    }

    /// Carries out what the request table decided.
    pub(crate) fn apply(&mut self, actions: Vec<Action>) -> Result<(), ClientError> {
        for action in actions {
            match action {
                Action::Free(region) => {
                    if let Err(e) = self.net.memory().free_region(region.gpa) {
                        warn!("channel region {:#x}: cannot free: {e}", region.gpa);
                    }
                }
                Action::Destroy(channel) => {
                    if let Some(id) = self.table.begin_destroy(channel) {
                        debug!("{channel}: created for an abandoned request; destroying it");
                        // Nobody waits for this answer; its region is freed when it comes.
                        self.table.abandon(id);
                        self.send_request(ControlRequest {
                            request_id: id,
                            op: svnic_channels::frame::ControlOp::Destroy { channel },
                        })?;
                    }
                }
                Action::Quarantine {
                    channel,
                    region,
                    reason,
                } => warn!(
                    "{channel}: the engine refused its destroy ({reason}); region {:#x}+{:#x} \
                     stays reserved for good",
                    region.gpa, region.len
                ),
            }
        }
        Ok(())
    }

    /// Consumes a wake for `channel`, if one arrived.
    pub(crate) fn take_wake(&mut self, channel: u32) -> bool {
        self.wakes.remove(&channel)
    }

    /// True if raw frames wait for the application.
    pub(crate) fn has_raw(&self) -> bool {
        !self.raw.is_empty()
    }

    /// Moves up to `max` raw frames to `out`.
    pub(crate) fn take_raw(&mut self, out: &mut Vec<Vec<u8>>, max: usize) -> usize {
        let n = max.min(self.raw.len());
        out.extend(self.raw.drain(..n));
        n
    }
}
