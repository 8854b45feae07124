//! What the agent does with application requests and engine answers, and the one rule that
//! matters for memory safety: channel memory is freed only when the engine refused to create the
//! channel or acknowledged its destruction (the control client's [`RequestTable`] decides, the
//! agent carries out its [`Action`]s). An application that goes away leaves its channels to be
//! destroyed; their memory stays held until the acknowledgement.
//!
//! [`RequestTable`]: svnic_client::request_table::RequestTable

use std::collections::HashMap;
use std::os::fd::AsFd;

use log::{debug, info, warn};
use svnic_channels::frame::{ControlOp, ControlRequest, ControlResponse, CreateRequest};
use svnic_channels::{ChannelAddr, ChannelId, ChannelLayout, FailureReason};

use super::records::{ChannelEvents, Charged, Creating, Destroying, Held, Live, Prepared};
use super::server::Agent;
use super::AgentEvent;
use svnic_client::request_table::{Action, Outcome, RegionLease};
use svnic_client::vm::protocol::{request_token, AgentFailure, Request, Response};

impl Agent {
    fn fail(&mut self, app: u64, token: u32, reason: AgentFailure, detail: impl Into<String>) {
        let detail = detail.into();
        debug!("application {app}: request {token} refused: {reason} ({detail})");
        self.reply(
            app,
            &Response::Failure {
                token,
                reason,
                detail,
            },
            &[],
        );
    }

    fn token_busy(&self, app: u64, token: u32) -> bool {
        self.prepared.contains_key(&(app, token))
            || self
                .creates
                .values()
                .any(|c| c.app == app && c.token == token)
            || self
                .destroys
                .values()
                .any(|d| d.app == app && d.token == token)
    }

    /// Channels (and held memory) of one application.
    fn channels_of(&self, app: u64) -> usize {
        self.prepared.keys().filter(|(a, _)| *a == app).count()
            + self.regions.values().filter(|h| h.app == app).count()
    }

    /// One message from an application.
    pub(super) fn on_app_message(&mut self, app: u64, bytes: &[u8], truncated: bool, fds: usize) {
        let token = request_token(bytes).unwrap_or(0);
        if truncated {
            return self.fail(app, token, AgentFailure::BadRequest, "message too long");
        }
        if fds > 0 {
            return self.fail(
                app,
                token,
                AgentFailure::BadRequest,
                "applications may not pass descriptors",
            );
        }
        let req = match Request::decode(bytes) {
            Ok(r) => r,
            Err(e) => return self.fail(app, token, AgentFailure::BadRequest, e.to_string()),
        };
        if req.token() == 0 {
            return self.fail(app, 0, AgentFailure::BadRequest, "token 0 is reserved");
        }
        match req {
            Request::Create {
                token,
                endpoint,
                ring_size,
            } => self.on_create(app, token, endpoint, ring_size),
            Request::Mapped { token } => self.on_mapped(app, token),
            Request::Destroy { token, channel } => self.on_destroy(app, token, channel),
            Request::Cancel { token } => {
                if self.prepared.remove(&(app, token)).is_some() {
                    debug!("application {app}: memory of request {token} given back and freed");
                }
            }
        }
    }

    fn on_create(&mut self, app: u64, token: u32, endpoint: u32, ring_size: u32) {
        if self.shutdown_deadline.is_some() {
            return self.fail(app, token, AgentFailure::ShuttingDown, "");
        }
        if self.token_busy(app, token) {
            let why = format!("token {token} is in use");
            return self.fail(app, token, AgentFailure::BadRequest, why);
        }
        let len = self.memory.region_len();
        if let Err(e) = ChannelLayout::new(ring_size, len) {
            let reason = AgentFailure::Engine(FailureReason::BadRingSize);
            return self.fail(app, token, reason, e.to_string());
        }
        let mine = self.channels_of(app);
        if mine >= self.cfg.max_channels_per_app {
            let why = format!(
                "the application has {mine} channel(s); the limit is {}",
                self.cfg.max_channels_per_app
            );
            return self.fail(app, token, AgentFailure::TooManyChannels, why);
        }
        let Some(uid) = self.apps.get(&app).map(|a| a.uid) else {
            return;
        };
        if let Err((reason, why)) = self.admit(uid, endpoint) {
            return self.fail(app, token, reason, why);
        }
        let all = self.prepared.len() + self.regions.len();
        if all >= self.cfg.max_channels {
            let why = format!(
                "the agent holds {all} channel(s); the limit is {}",
                self.cfg.max_channels
            );
            return self.fail(app, token, AgentFailure::TooManyChannels, why);
        }
        let mem = match self.memory.allocate() {
            Ok(m) => m,
            Err(e) => {
                self.counters.refused.no_memory += 1;
                debug!("application {app}: no memory for a channel: {e}");
                return self.fail(app, token, AgentFailure::NoMemory, e.to_string());
            }
        };
        let events = match ChannelEvents::new() {
            Ok(events) => events,
            Err(e) => {
                let why = format!("eventfd: {e}");
                return self.fail(app, token, AgentFailure::NoMemory, why);
            }
        };
        let region = Response::Region {
            token,
            region_len: mem.len(),
            fd_offset: mem.fd_offset(),
        };
        let fds = [mem.fd(), events.wake.as_fd(), events.doorbell.as_fd()];
        self.reply(app, &region, &fds);
        debug!("application {app}: memory for endpoint {endpoint} passed (request {token})");
        self.prepared.insert(
            (app, token),
            Prepared {
                charged: Charged {
                    memory: mem,
                    uid,
                    endpoint,
                },
                ring_size,
                events,
            },
        );
    }

    fn on_mapped(&mut self, app: u64, token: u32) {
        let Some(p) = self.prepared.remove(&(app, token)) else {
            let why = format!("no memory was passed for request {token}");
            return self.fail(app, token, AgentFailure::UnknownToken, why);
        };
        let gpa = match self.memory.finalize(&p.charged.memory) {
            Ok(gpa) => gpa,
            Err(e) => {
                warn!("application {app}: channel memory unusable: {e}");
                return self.fail(app, token, AgentFailure::Memory, e.to_string());
            }
        };
        if self.regions.contains_key(&gpa) {
            let why = format!("guest-physical address {gpa:#x} is registered already");
            warn!("application {app}: {why}");
            return self.fail(app, token, AgentFailure::Memory, why);
        }
        let (len, endpoint) = (p.charged.len(), p.charged.endpoint);
        let request_id = self.table.begin_create(RegionLease { gpa, len });
        self.send_request(ControlRequest {
            request_id,
            op: ControlOp::Create(CreateRequest {
                mac: self.mac,
                endpoint,
                ring_size: p.ring_size,
                region_addr: gpa,
                region_len: len,
            }),
        });
        debug!(
            "application {app}: create request {request_id} for endpoint {endpoint} at {gpa:#x}"
        );
        self.regions.insert(
            gpa,
            Held {
                charged: p.charged,
                app,
                channel: None,
                quarantined: false,
            },
        );
        self.creates.insert(
            request_id,
            Creating {
                app,
                token,
                gpa,
                addr: ChannelAddr::new(self.mac, endpoint),
                events: p.events,
            },
        );
    }

    fn on_destroy(&mut self, app: u64, token: u32, channel: ChannelId) {
        if self.token_busy(app, token) {
            let why = format!("token {token} is in use");
            return self.fail(app, token, AgentFailure::BadRequest, why);
        }
        if self.live.get(&channel).is_none_or(|l| l.app != app) {
            let why = format!("{channel} is not a live channel of this application");
            return self.fail(app, token, AgentFailure::NotYourChannel, why);
        }
        self.forget_live(channel);
        match self.destroy_in_engine(channel) {
            Some(id) => {
                info!("application {app}: destroying {channel}");
                self.destroys.insert(
                    id,
                    Destroying {
                        app,
                        token,
                        channel,
                    },
                );
            }
            None => self.fail(app, token, AgentFailure::NotYourChannel, "not live"),
        }
    }

    /// Removes a live channel from the loop (doorbell unwatched, pending doorbell dropped).
    fn forget_live(&mut self, channel: ChannelId) -> Option<Live> {
        let l = self.live.remove(&channel)?;
        self.unwatch(&l.events.doorbell);
        self.doorbells.remove(&channel.0);
        Some(l)
    }

    /// Sends Destroy for a live channel of the table; returns the request id.
    fn destroy_in_engine(&mut self, channel: ChannelId) -> Option<u32> {
        let id = self.table.begin_destroy(channel)?;
        self.send_request(ControlRequest {
            request_id: id,
            op: ControlOp::Destroy { channel },
        });
        self.event(AgentEvent::DestroySent { channel });
        Some(id)
    }

    /// An application's connection is gone (or dropped): destroy everything it had.
    pub(super) fn disconnect(&mut self, app: u64, why: &str) {
        let Some(a) = self.apps.remove(&app) else {
            return;
        };
        self.unwatch(&a.sock);
        let prepared: Vec<(u64, u32)> = self
            .prepared
            .keys()
            .filter(|k| k.0 == app)
            .copied()
            .collect();
        for key in prepared {
            // Never registered: the engine does not know this memory.
            self.prepared.remove(&key);
        }
        let creates = keys_of_app(&self.creates, app, |c| c.app);
        for id in &creates {
            self.creates.remove(id);
            // Answered later: a refusal frees the memory, a success is destroyed (Action).
            let actions = self.table.abandon(*id);
            self.apply(actions);
        }
        let destroys = keys_of_app(&self.destroys, app, |d| d.app);
        for id in &destroys {
            self.destroys.remove(id);
            self.table.abandon(*id);
        }
        let live = keys_of_app(&self.live, app, |l| l.app);
        for channel in &live {
            self.forget_live(*channel);
            if let Some(id) = self.destroy_in_engine(*channel) {
                self.table.abandon(id);
            }
        }
        let n = creates.len() + live.len() + destroys.len();
        if n > 0 {
            info!(
                "application {app} (pid {}) {why}: destroying {n} channel(s) with the engine; \
                 their memory is freed once the engine acknowledges",
                a.pid
            );
        } else {
            info!("application {app} (pid {}) {why}", a.pid);
        }
        self.event(AgentEvent::AppGone { app, channels: n });
    }

    /// A control response from the engine.
    pub(super) fn on_response(&mut self, resp: ControlResponse) {
        let id = resp.request_id;
        let actions = match self.table.on_response(&resp) {
            Ok(a) => a,
            Err(why) => {
                self.counters.ignored += 1;
                debug!("control response ignored: {why:?}");
                return;
            }
        };
        // Frees first: a Destroyed answer reaches the application after its memory is free.
        self.apply(actions);
        if let Some(c) = self.creates.get(&id) {
            let (app, token) = (c.app, c.token);
            match self.table.take_final(id) {
                None => self.reply(app, &Response::Pending { token }, &[]),
                Some(outcome) => {
                    let Some(c) = self.creates.remove(&id) else {
                        return;
                    };
                    self.create_answered(c, outcome);
                }
            }
        } else if let Some(d) = self.destroys.get(&id) {
            let (app, token, channel) = (d.app, d.token, d.channel);
            match self.table.take_final(id) {
                None => self.reply(app, &Response::Pending { token }, &[]),
                Some(outcome) => {
                    self.destroys.remove(&id);
                    let resp = match outcome {
                        Outcome::Destroyed => Response::Destroyed { token, channel },
                        Outcome::DestroyRefused(reason) => Response::Failure {
                            token,
                            reason: AgentFailure::Engine(reason),
                            detail: "the engine refused; the memory stays reserved".into(),
                        },
                        other => {
                            warn!("destroy request {id}: unexpected outcome {other:?}");
                            return;
                        }
                    };
                    self.reply(app, &resp, &[]);
                }
            }
        }
    }

    fn create_answered(&mut self, c: Creating, outcome: Outcome) {
        let Creating {
            app,
            token,
            gpa,
            addr,
            events,
        } = c;
        match outcome {
            Outcome::Created {
                channel,
                worker,
                cpu,
            } => {
                if let Some(h) = self.regions.get_mut(&gpa) {
                    h.channel = Some(channel);
                }
                let pid = self.apps.get(&app).map_or(-1, |a| a.pid);
                info!(
                    "{channel} created for application {app} (pid {pid}) at {addr}, memory \
                     {gpa:#x}, served by worker {worker}{}",
                    cpu.map_or(String::new(), |c| format!(" on CPU {c}"))
                );
                self.watch_doorbell(channel, &events.doorbell);
                self.live.insert(channel, Live { app, events });
                self.event(AgentEvent::Created { channel, app, gpa });
                self.save_state();
                let ok = Response::Success {
                    token,
                    channel,
                    worker,
                    cpu,
                    addr,
                };
                self.reply(app, &ok, &[]);
            }
            Outcome::Refused(reason) => {
                info!("application {app}: the engine refused a channel at {addr}: {reason}");
                self.fail(app, token, AgentFailure::Engine(reason), "");
            }
            other => warn!("create request for {addr}: unexpected outcome {other:?}"),
        }
    }

    /// Carries out what the request table decided.
    pub(super) fn apply(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Free(region) => self.free_region(region.gpa),
                Action::Destroy(channel) => {
                    // Created for an application that is gone: destroy it, nobody waits.
                    if let Some(lease) = self.table.live_region(channel) {
                        if let Some(h) = self.regions.get_mut(&lease.gpa) {
                            h.channel = Some(channel);
                        }
                    }
                    self.save_state();
                    if let Some(id) = self.destroy_in_engine(channel) {
                        self.table.abandon(id);
                    }
                }
                Action::Quarantine {
                    channel,
                    region,
                    reason,
                } => {
                    if let Some(h) = self.regions.get_mut(&region.gpa) {
                        h.quarantined = true;
                        h.channel = Some(channel);
                    }
                    warn!(
                        "{channel}: the engine refused to destroy it ({reason}); its memory \
                         {:#x} stays allocated for good",
                        region.gpa
                    );
                    self.event(AgentEvent::Quarantined { channel });
                }
            }
        }
    }

    fn free_region(&mut self, gpa: u64) {
        let Some(held) = self.regions.remove(&gpa) else {
            warn!("region {gpa:#x}: asked to free memory the agent does not hold");
            return;
        };
        let channel = held.channel;
        if let Some(ch) = channel {
            self.event(AgentEvent::EngineDestroyed { channel: ch });
        }
        drop(held);
        match channel {
            Some(ch) => info!("{ch} destroyed by engine; memory {gpa:#x} freed"),
            None => info!("memory {gpa:#x} freed (the engine created no channel in it)"),
        }
        self.event(AgentEvent::MemoryFreed { gpa, channel });
        self.save_state();
    }

    /// A Wake frame: signal the channel's application.
    pub(super) fn on_wake(&mut self, channel: ChannelId) {
        match self.live.get(&channel) {
            Some(l) => {
                if let Err(e) = l.events.wake.signal() {
                    debug!("{channel}: cannot signal the wake eventfd: {e}");
                }
                self.counters.wakes += 1;
            }
            None => {
                self.counters.ignored += 1;
                debug!("wake for {channel}, which no application holds");
            }
        }
    }

    /// A doorbell eventfd became readable: queue one Doorbell frame.
    pub(super) fn on_doorbell(&mut self, channel: ChannelId) {
        let Some(l) = self.live.get(&channel) else {
            return;
        };
        match l.events.doorbell.drain() {
            Ok(0) => {}
            Ok(_) => {
                self.doorbells.insert(channel.0);
            }
            Err(e) => debug!("{channel}: doorbell eventfd: {e}"),
        }
    }
}

/// The keys of the entries of `map` that belong to application `app`.
fn keys_of_app<K: Copy, V>(map: &HashMap<K, V>, app: u64, app_of: impl Fn(&V) -> u64) -> Vec<K> {
    map.iter()
        .filter(|(_, v)| app_of(v) == app)
        .map(|(k, _)| *k)
        .collect()
}
