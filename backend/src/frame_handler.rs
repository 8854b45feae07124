//! The frame handler: what the daemon does with every svnic-EtherType frame a guest sends through
//! its virtio-net TX queue (the control frames and doorbells of docs/abi.md §7-8), and the frames
//! it sends back.
//!
//! - ControlRequest Create: answered Pending at once, then Success (channel id, serving worker
//!   and CPU) or Failure (reason). A failed request allocates nothing.
//! - ControlRequest Destroy: answered Destroyed once the engine no longer touches the channel.
//! - Doorbell: wakes the worker serving the channel (only the guest's own channels).
//!
//! The requesting guest is the port the frame came in on, never a field it wrote: its source
//! MAC must be one the port owns, and every request is checked against that guest's policy.
//! Responses and wake frames come from [`MacAddr::ENGINE`].
//!
//! A guest decides how often every line here would be written, so per-request lines are debug
//! and warnings go through [`log_limited!`]; [`FrameCounters`] keep the counts.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use log::{debug, Level};
use svnic_channels::frame::{
    control_request_id, ControlOp, ControlRequest, ControlResponse, ControlStatus, Frame, FrameBody,
};
use svnic_channels::{ChannelId, FailureReason, MacAddr};
use svnic_control_plane::{log_limited, CreateRequest, GuestId};

use crate::debug_fields::debug_fields;
use crate::engine::{Engine, GuestWaker};

/// Where the frame handler sends frames: into a guest's virtio-net RX queue (the switch).
pub trait FrameOut: Send + Sync {
    /// Queues `frame` for the guest behind `port`; false if it could not be queued.
    fn send(&self, port: GuestId, frame: &[u8]) -> bool;
}

/// Counters of the frame handler.
#[derive(Debug, Default)]
pub struct FrameCounters {
    /// Requests answered (any status).
    pub requests: AtomicU64,
    /// Create requests the control plane refused before admitting them (rate limits included).
    pub creates_refused: AtomicU64,
    /// Of those, refused because the guest exceeded its create rate.
    pub creates_rate_limited: AtomicU64,
    /// Creates admitted (Pending) that the engine then failed (e.g. region outside memory).
    pub creates_failed: AtomicU64,
    /// Creates that reached Success.
    pub creates_succeeded: AtomicU64,
    /// Doorbells relayed to a worker.
    pub doorbells: AtomicU64,
    /// Wake frames sent to guests.
    pub wakes: AtomicU64,
    /// Frames dropped: undecodable, wrong source MAC, not for the engine, foreign channel.
    pub dropped: AtomicU64,
    /// Responses or wakes that could not be queued to the guest.
    pub undeliverable: AtomicU64,
}

/// The handler of svnic frames for one engine: control requests in, control responses and
/// wakes out, doorbells to the workers.
pub struct FrameHandler {
    engine: Engine,
    out: Arc<dyn FrameOut>,
    counters: FrameCounters,
}

debug_fields!(FrameHandler, |f| counters: f.counters);

impl FrameHandler {
    /// A frame handler for `engine`, answering through `out`.
    pub fn new(engine: Engine, out: Arc<dyn FrameOut>) -> Arc<Self> {
        Arc::new(FrameHandler {
            engine,
            out,
            counters: FrameCounters::default(),
        })
    }

    /// Counters.
    pub fn counters(&self) -> &FrameCounters {
        &self.counters
    }

    /// A waker that sends Wake frames to `mac` through `port`; give it to the engine for that
    /// guest ([`Engine::set_guest_waker`]).
    pub fn waker(self: &Arc<Self>, port: GuestId, mac: MacAddr) -> Arc<dyn GuestWaker> {
        Arc::new(WakeSender {
            handler: self.clone(),
            port,
            mac,
        })
    }

    fn owns(&self, port: GuestId, mac: MacAddr) -> bool {
        self.engine
            .control_plane()
            .guest(port)
            .is_some_and(|g| g.policy.owns_mac(&mac))
    }

    fn drop_frame(&self, port: GuestId, why: &str) {
        self.counters.dropped.fetch_add(1, Relaxed);
        debug!("{port}: svnic frame dropped: {why}");
    }

    /// Handles one svnic frame from `port`. Never panics, whatever the bytes.
    pub fn handle(&self, port: GuestId, bytes: &[u8]) {
        let frame = match Frame::decode(bytes) {
            Ok(f) => f,
            Err(e) => {
                // A malformed request still gets an answer if its id and source can be read.
                if let (Some(request_id), Some(src)) =
                    (control_request_id(bytes), source_mac(bytes))
                {
                    if self.owns(port, src) {
                        debug!("{port}: malformed control request {request_id}: {e}");
                        self.respond(
                            port,
                            src,
                            request_id,
                            ChannelId(0),
                            ControlStatus::Failure(FailureReason::BadRequest),
                        );
                        return;
                    }
                }
                return self.drop_frame(port, &format!("undecodable: {e}"));
            }
        };
        if !self.owns(port, frame.src) {
            return self.drop_frame(
                port,
                &format!("source MAC {} not owned by the port", frame.src),
            );
        }
        match frame.body {
            FrameBody::ControlRequest(req) => self.request(port, frame.src, req),
            FrameBody::Doorbell { channel } => self.doorbell(port, channel),
            FrameBody::ControlResponse(_)
            | FrameBody::Wake { .. }
            | FrameBody::Data(_)
            | FrameBody::Ack(_)
            | FrameBody::Bundle(_) => {
                self.drop_frame(port, "engine-to-guest or uplink frame sent by a guest")
            }
        }
    }

    fn request(&self, port: GuestId, src: MacAddr, req: ControlRequest) {
        let id = req.request_id;
        match req.op {
            ControlOp::Create(c) => {
                let create = CreateRequest {
                    mac: c.mac,
                    endpoint: c.endpoint,
                    ring_size: c.ring_size,
                    region_addr: c.region_addr,
                    region_len: c.region_len,
                };
                let channel = match self.engine.begin_create(port, &create) {
                    Ok(ch) => ch,
                    Err(reason) => {
                        self.counters.creates_refused.fetch_add(1, Relaxed);
                        if reason == FailureReason::RateLimited {
                            self.counters.creates_rate_limited.fetch_add(1, Relaxed);
                        }
                        debug!("{port}: create {create} refused: {reason}");
                        return self.respond(
                            port,
                            src,
                            id,
                            ChannelId(0),
                            ControlStatus::Failure(reason),
                        );
                    }
                };
                self.respond(port, src, id, channel, ControlStatus::Pending);
                match self.engine.finish_create(channel) {
                    Ok(info) => {
                        self.counters.creates_succeeded.fetch_add(1, Relaxed);
                        debug!(
                            "{port}: {channel} created at {} on worker {}",
                            info.addr, info.worker
                        );
                        self.respond(
                            port,
                            src,
                            id,
                            channel,
                            ControlStatus::Success {
                                worker: info.worker,
                                cpu: info.cpu,
                            },
                        );
                    }
                    Err(reason) => {
                        self.counters.creates_failed.fetch_add(1, Relaxed);
                        debug!("{port}: {channel} ({create}) failed: {reason}");
                        self.respond(port, src, id, channel, ControlStatus::Failure(reason));
                    }
                }
            }
            ControlOp::Destroy { channel } => {
                match self.engine.destroy_channel(Some(port), channel) {
                    Ok(()) => self.respond(port, src, id, channel, ControlStatus::Destroyed),
                    Err(reason) => {
                        self.respond(port, src, id, channel, ControlStatus::Failure(reason))
                    }
                }
            }
        }
    }

    fn doorbell(&self, port: GuestId, channel: ChannelId) {
        match self.engine.control_plane().channel(channel) {
            Some(rec) if rec.guest == port => {
                self.counters.doorbells.fetch_add(1, Relaxed);
                self.engine.doorbell(channel);
            }
            _ => self.drop_frame(
                port,
                &format!("doorbell for {channel}, not one of the port's channels"),
            ),
        }
    }

    fn respond(
        &self,
        port: GuestId,
        dst: MacAddr,
        request_id: u32,
        channel: ChannelId,
        status: ControlStatus,
    ) {
        self.counters.requests.fetch_add(1, Relaxed);
        let frame = Frame {
            dst,
            src: MacAddr::ENGINE,
            body: FrameBody::ControlResponse(ControlResponse {
                request_id,
                channel,
                status,
            }),
        };
        self.send(port, &frame);
    }

    fn send(&self, port: GuestId, frame: &Frame<'_>) {
        match frame.encode() {
            Ok(bytes) => {
                if !self.out.send(port, &bytes) {
                    self.counters.undeliverable.fetch_add(1, Relaxed);
                    log_limited!(
                        Level::Warn,
                        "{port}: engine frame could not be queued (port down, or its guest does not drain its RX)"
                    );
                }
            }
            Err(e) => log_limited!(Level::Warn, "{port}: cannot encode control frame: {e}"),
        }
    }
}

/// The source MAC of an Ethernet frame, if it is long enough to have one.
fn source_mac(bytes: &[u8]) -> Option<MacAddr> {
    let b = bytes.get(6..12)?;
    let mut m = [0u8; 6];
    m.copy_from_slice(b);
    Some(MacAddr(m))
}

struct WakeSender {
    handler: Arc<FrameHandler>,
    port: GuestId,
    mac: MacAddr,
}

impl GuestWaker for WakeSender {
    fn wake(&self, channel: ChannelId) {
        self.handler.counters.wakes.fetch_add(1, Relaxed);
        let frame = Frame {
            dst: self.mac,
            src: MacAddr::ENGINE,
            body: FrameBody::Wake { channel },
        };
        self.handler.send(self.port, &frame);
    }
}
