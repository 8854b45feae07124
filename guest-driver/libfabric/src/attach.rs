//! How a domain attaches to svnic: in host-process mode, as its own guest over the vhost-user
//! socket named by `FI_SVNIC_SOCKET`; and how an endpoint gets its channel.

use std::os::raw::c_int;
use std::time::Duration;

use svnic_channels::FailureReason;
use svnic_client::Channel;
use svnic_host_frontend::host_guest::CreateState;
use svnic_host_frontend::HostGuest;

use crate::config::{Config, ENDPOINT_SEARCH, RING_SIZE};
use crate::ffi::errno::*;

/// How long `fi_endpoint` waits for the engine to create a channel, and `fi_close` for it to
/// destroy one.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

/// What the domain's objects share.
#[derive(Debug)]
pub struct DomainInner {
    /// The host-process guest every endpoint's channel belongs to.
    pub guest: HostGuest,
    /// The environment when the domain was opened.
    pub cfg: Config,
    /// The application's API version (decides the `fi_cq_err_entry` layout).
    pub api_version: u32,
}

impl DomainInner {
    /// Connects to `FI_SVNIC_SOCKET` as a host-process guest (`-FI_ENODEV` if it is not set,
    /// `-FI_ECONNREFUSED` if the connection fails), as errno.
    pub fn connect(api_version: u32) -> Result<DomainInner, c_int> {
        let cfg = Config::from_env();
        let Some(socket) = cfg.socket.clone() else {
            log::warn!("svnic provider: FI_SVNIC_SOCKET is not set; no svnic guest to attach to");
            return Err(FI_ENODEV);
        };
        let guest = HostGuest::connect(&socket, cfg.memory_mib << 20).map_err(|e| {
            log::warn!("svnic provider: cannot attach to {}: {e}", socket.display());
            FI_ECONNREFUSED
        })?;
        log::info!(
            "svnic provider: attached to {} as {}",
            socket.display(),
            guest.mac()
        );
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
            let pending = self
                .guest
                .begin_create(id, RING_SIZE, self.cfg.region_len())
                .map_err(|e| {
                    log::warn!("svnic provider: channel request failed: {e}");
                    FI_EIO
                })?;
            match pending.wait(CONTROL_TIMEOUT) {
                Ok(CreateState::Success(ch)) => return Ok(ch),
                Ok(CreateState::Failure(FailureReason::EndpointTaken))
                    if self.cfg.endpoint.is_none() =>
                {
                    continue
                }
                Ok(CreateState::Failure(r)) => {
                    log::warn!("svnic provider: the engine refused endpoint {id}: {r}");
                    return Err(match r {
                        FailureReason::EndpointTaken => FI_EBUSY,
                        FailureReason::QuotaExceeded | FailureReason::RegionTooLarge => FI_ENOMEM,
                        _ => FI_EIO,
                    });
                }
                Ok(CreateState::Pending(_)) => {
                    log::warn!(
                        "svnic provider: no answer to the channel request for endpoint {id}"
                    );
                    return Err(FI_EIO);
                }
                Err(e) => {
                    log::warn!("svnic provider: channel request failed: {e}");
                    return Err(FI_EIO);
                }
            }
        }
        log::warn!("svnic provider: endpoints 1..={ENDPOINT_SEARCH} are all taken");
        Err(FI_EBUSY)
    }
}
