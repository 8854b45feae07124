//! The state file: the ids of the channels whose memory the agent holds, rewritten whenever that
//! set changes. If the agent dies, the engine keeps serving those channels while their hugepages
//! return to the pool; the next agent destroys them before it allocates anything, so that no
//! page of the pool is handed out while the engine may still write into it.

use std::collections::{BTreeSet, HashSet};
use std::time::Instant;

use log::{debug, info, warn};
use svnic_channels::frame::{ControlOp, ControlRequest, ControlStatus, Frame, FrameBody};
use svnic_channels::{ChannelId, FailureReason, MacAddr};

use super::server::Agent;
use super::AgentEvent;
use svnic_client::vm::seqpacket::poll_readable;

/// Request ids of recovery destroys (far from the ids the request table hands out).
const RECOVERY_BASE: u32 = 0x8000_0000;

/// Channel ids listed in a state file; lines that are not ids are skipped (and reported).
pub(super) fn parse_state(text: &str) -> (Vec<u32>, Vec<String>) {
    let mut ids = BTreeSet::new();
    let mut bad = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.parse::<u32>() {
            Ok(id) => {
                ids.insert(id);
            }
            Err(_) => bad.push(line.to_string()),
        }
    }
    (ids.into_iter().collect(), bad)
}

impl Agent {
    /// Rewrites the state file (atomically: a temporary file renamed over it).
    pub(super) fn save_state(&mut self) {
        let Some(path) = self.cfg.state_file.clone() else {
            return;
        };
        let ids: BTreeSet<u32> = self
            .regions
            .values()
            .filter_map(|h| h.channel())
            .map(|c| c.0)
            .collect();
        let mut text = String::from(
            "# svnic-guestd: channels whose memory this agent holds (destroyed by the next agent)\n",
        );
        for id in ids {
            text.push_str(&format!("{id}\n"));
        }
        let tmp = path.with_extension("tmp");
        let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &path));
        match written {
            Ok(()) => self.state_warned = false,
            Err(e) if !self.state_warned => {
                warn!("state file {}: {e}", path.display());
                self.state_warned = true;
            }
            Err(_) => {}
        }
    }

    /// Destroys the channels an earlier agent left in the state file, waiting up to
    /// `recovery_wait` for the engine's answers.
    pub(super) fn recover(&mut self) {
        let Some(path) = self.cfg.state_file.clone() else {
            return;
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => {
                warn!("state file {}: {e}", path.display());
                return;
            }
        };
        let (ids, bad) = parse_state(&text);
        for line in bad {
            warn!(
                "state file {}: {line:?} is not a channel id",
                path.display()
            );
        }
        if ids.is_empty() {
            return;
        }
        info!(
            "an earlier agent left {} channel(s) in {}: destroying them before serving",
            ids.len(),
            path.display()
        );
        let mut waiting: HashSet<u32> = HashSet::new();
        for (i, id) in ids.iter().enumerate() {
            let request_id = RECOVERY_BASE.wrapping_add(i as u32);
            waiting.insert(request_id);
            self.send_request(ControlRequest {
                request_id,
                op: ControlOp::Destroy {
                    channel: ChannelId(*id),
                },
            });
        }
        let deadline = Instant::now() + self.cfg.recovery_wait;
        let mut buf = [0u8; 2048];
        while !waiting.is_empty() {
            self.pump();
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                break;
            };
            let left = left.min(std::time::Duration::from_millis(20));
            if !poll_readable(self.nic.fd(), left).unwrap_or(false) {
                continue;
            }
            while let Ok(Some(n)) = self.nic.recv(&mut buf) {
                let Ok(frame) = Frame::decode(&buf[..n]) else {
                    continue;
                };
                let FrameBody::ControlResponse(r) = frame.body else {
                    continue;
                };
                if frame.src != MacAddr::ENGINE || !waiting.contains(&r.request_id) {
                    continue;
                }
                match r.status {
                    ControlStatus::Pending => {}
                    ControlStatus::Destroyed => {
                        waiting.remove(&r.request_id);
                        info!(
                            "stale {} of an earlier agent destroyed by engine",
                            r.channel
                        );
                        self.event(AgentEvent::Recovered { channel: r.channel });
                    }
                    ControlStatus::Failure(FailureReason::NoSuchChannel) => {
                        waiting.remove(&r.request_id);
                        debug!("stale {}: already gone", r.channel);
                    }
                    other => {
                        waiting.remove(&r.request_id);
                        warn!("stale {}: destroy answered {other:?}", r.channel);
                    }
                }
            }
        }
        if !waiting.is_empty() {
            warn!(
                "{} stale channel(s) not acknowledged within {:?}; the engine may still use \
                 their old memory",
                waiting.len(),
                self.cfg.recovery_wait
            );
        }
        self.save_state();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_files_list_ids_and_skip_the_rest() {
        let (ids, bad) = parse_state("# comment\n7\n\n 3 \nseven\n7\n4294967295\n-1\n");
        assert_eq!(ids, vec![3, 7, u32::MAX]);
        assert_eq!(bad, vec!["seven".to_string(), "-1".to_string()]);
    }
}
