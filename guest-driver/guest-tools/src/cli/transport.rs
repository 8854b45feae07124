//! The channel transport of the tools: a host-process guest of the daemon (`--socket`) or a
//! connection to the guest agent (`--agent`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use log::warn;

use super::args::Common;
use super::CliError;
use svnic_client::channel::{Channel, WaitPolicy, Waiter};
use svnic_client::vm::{AgentClient, AgentError, DEFAULT_AGENT_SOCKET};
use svnic_host_frontend::host_guest::ClientError;
use svnic_host_frontend::HostGuest;
use thiserror::Error;

/// How long a channel create or destroy may take.
pub(super) const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for queued messages or frames to leave before a channel or NIC goes away.
pub(super) const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The channel transport: a host-process guest or a connection to the agent.
pub(super) enum Transport {
    /// Host-process mode.
    Host(HostGuest),
    /// VM mode.
    Vm(AgentClient),
}

/// An error of either transport.
#[derive(Debug, Error)]
pub(super) enum TransportError {
    /// Host-process mode.
    #[error(transparent)]
    Host(#[from] ClientError),
    /// VM mode.
    #[error(transparent)]
    Vm(#[from] AgentError),
}

impl Transport {
    /// Connects, retrying until `--wait` passes (the daemon or agent may still be starting).
    pub(super) fn connect(c: &Common) -> Result<Self, CliError> {
        let deadline = Instant::now() + c.wait();
        let (what, path) = match &c.socket {
            Some(s) => ("host-process guest on", s.clone()),
            None => (
                "svnic-guestd at",
                c.agent
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(DEFAULT_AGENT_SOCKET)),
            ),
        };
        loop {
            let attempt = match &c.socket {
                Some(s) => HostGuest::connect(s, c.memory_mib << 20)
                    .map(Transport::Host)
                    .map_err(TransportError::from),
                None => AgentClient::connect(&path)
                    .map(Transport::Vm)
                    .map_err(TransportError::from),
            };
            match attempt {
                Ok(t) => return Ok(t),
                Err(e) if Instant::now() >= deadline => {
                    return Err(CliError::failed(
                        format!("connect to the {what} {}", path.display()),
                        e,
                    ))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Creates this side's channel and its waiter.
    pub(super) fn channel(&self, c: &Common) -> Result<(Channel, Box<dyn Waiter>), CliError> {
        let what = || format!("create a channel at endpoint {}", c.endpoint);
        let (mut ch, waiter): (Channel, Box<dyn Waiter>) = match self {
            Transport::Host(g) => {
                let ch = g
                    .create_channel(c.endpoint, c.ring_size, CONTROL_TIMEOUT)
                    .map_err(|e| CliError::failed(what(), e))?;
                let w = g.waiter(&ch);
                (ch, Box::new(w))
            }
            Transport::Vm(a) => {
                let ch = a
                    .create_channel(c.endpoint, c.ring_size, CONTROL_TIMEOUT)
                    .map_err(|e| CliError::failed(what(), e))?;
                let w = a.waiter(&ch).map_err(|e| CliError::failed(what(), e))?;
                (ch, Box::new(w))
            }
        };
        ch.set_wait_policy(WaitPolicy {
            spins: c.spins,
            yields: c.yields,
        });
        Ok((ch, waiter))
    }

    /// Destroys the channel (the engine acknowledges before its memory is freed), once the
    /// engine has taken everything queued on its TX ring: destroying it earlier would drop
    /// the last messages (a reply, the end of a stream).
    pub(super) fn release(&self, mut ch: Channel) {
        let id = ch.id();
        let ring = ch.layout().ring_size;
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        while ch.tx_free().is_ok_and(|free| free < ring) && Instant::now() < deadline {
            std::thread::yield_now();
        }
        let r = match self {
            Transport::Host(g) => g
                .destroy_channel(ch, CONTROL_TIMEOUT)
                .map_err(TransportError::from),
            Transport::Vm(a) => a
                .destroy_channel(ch, CONTROL_TIMEOUT)
                .map_err(TransportError::from),
        };
        if let Err(e) = r {
            warn!("destroying channel {id}: {e}");
        }
    }
}
