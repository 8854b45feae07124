//! How a domain attaches to svnic, and how an endpoint gets its channel:
//!
//! - host-process mode: the process becomes its own guest over the vhost-user socket named by
//!   `FI_SVNIC_SOCKET` (a pool's socket, or a configured guest's);
//! - VM mode: inside a guest whose NIC the guest agent (`svnic-guestd`) owns, the process asks
//!   the agent over its Unix socket (`FI_SVNIC_AGENT`, else the agent's default socket when it
//!   exists and `FI_SVNIC_SOCKET` is not set) and needs no privilege: the agent passes each
//!   channel's memory, doorbell and wake descriptors.

use std::os::raw::c_int;
use std::path::{Path, PathBuf};
use std::time::Duration;

use svnic_channels::{EndpointId, FailureReason, MacAddr};
use svnic_client::vm::protocol::AgentFailure;
use svnic_client::vm::{AgentClient, AgentError, AgentWaiter, DEFAULT_AGENT_SOCKET};
use svnic_client::Channel;
use svnic_host_frontend::host_guest::{ChannelWaiter, CreateState};
use svnic_host_frontend::HostGuest;

use crate::config::{Config, ENDPOINT_SEARCH, RING_SIZE};
use crate::ffi::errno::*;

/// How long `fi_endpoint` waits for the engine to create a channel, and `fi_close` for it to
/// destroy one.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a domain attaches, as the environment chooses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Host-process mode: this vhost-user socket.
    Host(PathBuf),
    /// VM mode: the guest agent at this socket.
    Agent(PathBuf),
}

/// The attach rule: `FI_SVNIC_AGENT` and `FI_SVNIC_SOCKET` name their mode (both at once is an
/// error: `-FI_EINVAL`); with neither, the agent's default socket if it exists
/// (`default_agent`), else nothing to attach to (`-FI_ENODEV`).
pub fn choose(
    socket: Option<&Path>,
    agent: Option<&Path>,
    default_agent: Option<&Path>,
) -> Result<Target, c_int> {
    match (socket, agent) {
        (Some(s), Some(a)) => {
            log::warn!(
                "svnic provider: both FI_SVNIC_SOCKET ({}) and FI_SVNIC_AGENT ({}) are set",
                s.display(),
                a.display()
            );
            Err(FI_EINVAL)
        }
        (Some(s), None) => Ok(Target::Host(s.to_path_buf())),
        (None, Some(a)) => Ok(Target::Agent(a.to_path_buf())),
        (None, None) => match default_agent {
            Some(a) => Ok(Target::Agent(a.to_path_buf())),
            None => {
                log::warn!(
                    "svnic provider: neither FI_SVNIC_SOCKET nor FI_SVNIC_AGENT is set and \
                     {DEFAULT_AGENT_SOCKET} does not exist; no svnic guest to attach to"
                );
                Err(FI_ENODEV)
            }
        },
    }
}

/// The connection every endpoint's channel is created through.
#[derive(Debug)]
pub enum Guest {
    /// A host-process guest of the daemon.
    Host(HostGuest),
    /// The guest agent of the VM this process runs in.
    Agent(AgentClient),
}

/// Blocks until the engine's wake for one channel arrives.
#[derive(Debug)]
pub enum Waiter {
    /// Through the host-process guest's NIC.
    Host(ChannelWaiter),
    /// Relayed by the guest agent.
    Agent(AgentWaiter),
}

impl Waiter {
    /// Waits up to `timeout`; whether a wake came.
    pub fn wait_for_wake(&self, timeout: Duration) -> Result<bool, String> {
        match self {
            Waiter::Host(w) => w.wait_for_wake(timeout).map_err(|e| e.to_string()),
            Waiter::Agent(w) => w.wait_for_wake(timeout).map_err(|e| e.to_string()),
        }
    }
}

/// Why one endpoint id could not be had.
enum CreateError {
    /// Taken (or reserved for another user): the next id may do.
    Taken,
    /// Anything else, as errno.
    Fatal(c_int),
}

impl Guest {
    /// The NIC's MAC.
    pub fn mac(&self) -> MacAddr {
        match self {
            Guest::Host(g) => g.mac(),
            Guest::Agent(a) => a.mac(),
        }
    }

    /// Destroys `channel` (waits up to `timeout` for the engine).
    pub fn destroy_channel(&self, channel: Channel, timeout: Duration) -> Result<(), String> {
        match self {
            Guest::Host(g) => g
                .destroy_channel(channel, timeout)
                .map_err(|e| e.to_string()),
            Guest::Agent(a) => a
                .destroy_channel(channel, timeout)
                .map_err(|e| e.to_string()),
        }
    }

    /// The wake waiter of `channel`.
    pub fn waiter(&self, channel: &Channel) -> Result<Waiter, String> {
        match self {
            Guest::Host(g) => Ok(Waiter::Host(g.waiter(channel))),
            Guest::Agent(a) => a
                .waiter(channel)
                .map(Waiter::Agent)
                .map_err(|e| e.to_string()),
        }
    }

    /// Services the host-process guest's NIC (control answers, wakes); the agent does that
    /// itself in VM mode.
    pub fn poll_control(&self) -> Result<(), String> {
        match self {
            Guest::Host(g) => g.poll_control().map(drop).map_err(|e| e.to_string()),
            Guest::Agent(_) => Ok(()),
        }
    }

    fn create(&self, id: EndpointId, region_len: u64) -> Result<Channel, CreateError> {
        match self {
            Guest::Host(g) => {
                let pending = g.begin_create(id, RING_SIZE, region_len).map_err(|e| {
                    log::warn!("svnic provider: channel request failed: {e}");
                    CreateError::Fatal(FI_EIO)
                })?;
                match pending.wait(CONTROL_TIMEOUT) {
                    Ok(CreateState::Success(ch)) => Ok(ch),
                    Ok(CreateState::Failure(r)) => Err(engine_refusal(id, r)),
                    Ok(CreateState::Pending(_)) => {
                        log::warn!(
                            "svnic provider: no answer to the channel request for endpoint {id}"
                        );
                        Err(CreateError::Fatal(FI_EIO))
                    }
                    Err(e) => {
                        log::warn!("svnic provider: channel request failed: {e}");
                        Err(CreateError::Fatal(FI_EIO))
                    }
                }
            }
            // The agent sizes the region (its Hello's region_len); the endpoint fits its
            // buffers into whatever it gets.
            Guest::Agent(a) => match a.create_channel(id, RING_SIZE, CONTROL_TIMEOUT) {
                Ok(ch) => Ok(ch),
                Err(AgentError::Refused { reason, detail }) => {
                    Err(agent_refusal(id, reason, &detail))
                }
                Err(e) => {
                    log::warn!("svnic provider: channel request through the agent failed: {e}");
                    Err(CreateError::Fatal(match e {
                        AgentError::Timeout { .. } => FI_ETIMEDOUT,
                        _ => FI_EIO,
                    }))
                }
            },
        }
    }
}

fn engine_refusal(id: EndpointId, r: FailureReason) -> CreateError {
    if r == FailureReason::EndpointTaken {
        return CreateError::Taken;
    }
    log::warn!("svnic provider: the engine refused endpoint {id}: {r}");
    CreateError::Fatal(match r {
        FailureReason::QuotaExceeded | FailureReason::RegionTooLarge => FI_ENOMEM,
        _ => FI_EIO,
    })
}

fn agent_refusal(id: EndpointId, reason: AgentFailure, detail: &str) -> CreateError {
    let errno = match reason {
        AgentFailure::Engine(r) => return engine_refusal(id, r),
        AgentFailure::EndpointOwned => return CreateError::Taken,
        AgentFailure::NoMemory | AgentFailure::UidMemoryQuota => FI_ENOMEM,
        AgentFailure::TooManyChannels | AgentFailure::UidChannelQuota => FI_ENOSPC,
        _ => FI_EIO,
    };
    log::warn!("svnic provider: the agent refused endpoint {id}: {reason} {detail}");
    CreateError::Fatal(errno)
}

/// What the domain's objects share.
#[derive(Debug)]
pub struct DomainInner {
    /// The connection every endpoint's channel belongs to.
    pub guest: Guest,
    /// The environment when the domain was opened.
    pub cfg: Config,
    /// The application's API version (decides the `fi_cq_err_entry` layout).
    pub api_version: u32,
}

impl DomainInner {
    /// Attaches as [`choose`] says, as errno: `-FI_ENODEV` with nothing to attach to,
    /// `-FI_EINVAL` when both modes are named, `-FI_ECONNREFUSED` if the connection fails.
    pub fn connect(api_version: u32) -> Result<DomainInner, c_int> {
        let cfg = Config::from_env();
        let default_agent = Path::new(DEFAULT_AGENT_SOCKET);
        let target = choose(
            cfg.socket.as_deref(),
            cfg.agent.as_deref(),
            default_agent.exists().then_some(default_agent),
        )?;
        let guest = match &target {
            Target::Host(socket) => HostGuest::connect(socket, cfg.memory_mib << 20)
                .map(Guest::Host)
                .map_err(|e| {
                    log::warn!("svnic provider: cannot attach to {}: {e}", socket.display());
                    FI_ECONNREFUSED
                })?,
            Target::Agent(socket) => {
                AgentClient::connect(socket)
                    .map(Guest::Agent)
                    .map_err(|e| {
                        log::warn!("svnic provider: cannot reach the guest agent: {e}");
                        FI_ECONNREFUSED
                    })?
            }
        };
        log::info!("svnic provider: attached ({target:?}) as {}", guest.mac());
        Ok(DomainInner {
            guest,
            cfg,
            api_version,
        })
    }

    /// Creates the channel of a new endpoint: at `FI_SVNIC_ENDPOINT` if set, else at the first
    /// free endpoint id from 1.
    pub fn create_channel(&self) -> Result<Channel, c_int> {
        let ids: Vec<u32> = match self.cfg.endpoint {
            Some(e) => vec![e],
            None => (1..=ENDPOINT_SEARCH).collect(),
        };
        for id in ids {
            match self.guest.create(id, self.cfg.region_len()) {
                Ok(ch) => return Ok(ch),
                Err(CreateError::Taken) if self.cfg.endpoint.is_none() => continue,
                Err(CreateError::Taken) => {
                    log::warn!("svnic provider: endpoint {id} is taken");
                    return Err(FI_EBUSY);
                }
                Err(CreateError::Fatal(e)) => return Err(e),
            }
        }
        log::warn!("svnic provider: endpoints 1..={ENDPOINT_SEARCH} are all taken");
        Err(FI_EBUSY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_chooses_the_mode() {
        let (s, a, d) = (
            Path::new("/tmp/g.sock"),
            Path::new("/tmp/agent.sock"),
            Path::new(DEFAULT_AGENT_SOCKET),
        );
        assert_eq!(choose(Some(s), None, Some(d)), Ok(Target::Host(s.into())));
        assert_eq!(choose(None, Some(a), Some(d)), Ok(Target::Agent(a.into())));
        assert_eq!(choose(None, Some(a), None), Ok(Target::Agent(a.into())));
        assert_eq!(choose(None, None, Some(d)), Ok(Target::Agent(d.into())));
        assert_eq!(choose(None, None, None), Err(FI_ENODEV));
        assert_eq!(choose(Some(s), Some(a), Some(d)), Err(FI_EINVAL));
    }

    #[test]
    fn refusals_map_to_libfabric_errors() {
        let fatal = |e: CreateError| match e {
            CreateError::Taken => None,
            CreateError::Fatal(e) => Some(e),
        };
        let taken = FailureReason::EndpointTaken;
        assert_eq!(fatal(engine_refusal(1, taken)), None);
        assert_eq!(
            fatal(agent_refusal(1, AgentFailure::Engine(taken), "")),
            None
        );
        assert_eq!(
            fatal(agent_refusal(1, AgentFailure::EndpointOwned, "")),
            None
        );
        for (r, want) in [
            (AgentFailure::NoMemory, FI_ENOMEM),
            (AgentFailure::UidMemoryQuota, FI_ENOMEM),
            (AgentFailure::TooManyChannels, FI_ENOSPC),
            (AgentFailure::UidChannelQuota, FI_ENOSPC),
            (AgentFailure::Nic, FI_EIO),
            (
                AgentFailure::Engine(FailureReason::QuotaExceeded),
                FI_ENOMEM,
            ),
            (
                AgentFailure::Engine(FailureReason::RegionTooLarge),
                FI_ENOMEM,
            ),
        ] {
            assert_eq!(fatal(agent_refusal(1, r, "")), Some(want), "{r:?}");
        }
    }
}
