//! The launcher's errors.

use std::time::Duration;

use svnic_host_frontend::virtio_user::MemoryError;
use svnic_host_frontend::ClientError;
use thiserror::Error;

/// What can go wrong setting up or running a micro-VM.
#[derive(Debug, Error)]
pub enum MicroVmError {
    /// A KVM ioctl failed.
    #[error("KVM {step} failed: {source}")]
    Kvm {
        /// What was being done.
        step: &'static str,
        /// The error the ioctl returned.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// The guest memory refused an allocation or an access.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// Writing or reading the guest memory failed.
    #[error("guest memory access at {addr:#x} failed: {why}")]
    Access {
        /// Guest-physical address.
        addr: u64,
        /// What vm-memory said.
        why: String,
    },
    /// The guest memory does not fit the identity map below the exit address.
    #[error("guest memory of {size:#x} bytes is too large for the micro-VM (at most {max:#x})")]
    MemoryTooLarge {
        /// Size asked for.
        size: u64,
        /// Largest size.
        max: u64,
    },
    /// A setting the program cannot run with.
    #[error("{0}")]
    BadConfig(String),
    /// The vCPU stopped for a reason the launcher does not handle.
    #[error("the guest stopped unexpectedly: {what} (rip {rip:#x})")]
    UnexpectedExit {
        /// The exit.
        what: String,
        /// The guest's instruction pointer then, if it could be read (else 0).
        rip: u64,
    },
    /// The guest did not reach its final exit in time.
    #[error("the guest did not finish within {waited:?}")]
    Timeout {
        /// How long the launcher waited.
        waited: Duration,
    },
    /// The watchdog's signal handler could not be installed.
    #[error("cannot install the run watchdog's signal handler: {0}")]
    Watchdog(String),
    /// The guest program did not finish in time; what it had reported by then.
    #[error("the guest program did not finish within {waited:?}: {progress}")]
    Stalled {
        /// How long the launcher waited.
        waited: Duration,
        /// The program's boot-info report at that moment.
        progress: String,
    },
    /// The VMM's doorbell relay (its eventfd) failed.
    #[error("doorbell relay: {0}")]
    Relay(#[source] std::io::Error),
    /// The guest program broke the contract of its data path.
    #[error("the guest program: {0}")]
    BadGuest(String),
    /// The vCPU's statistics file could not be opened or read.
    #[error("KVM binary statistics: {0}")]
    Stats(#[source] std::io::Error),
    /// The host-process guest (vhost-user connection, control path) failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The channel API refused (a broken or faulted channel).
    #[error(transparent)]
    Channel(#[from] svnic_client::ChannelError),
    /// The echo peer saw something it cannot answer, or nothing at all.
    #[error("echo: {0}")]
    Peer(String),
    /// Micro-VMs that were to start together did not (one failed, or one was late).
    #[error("start: {0}")]
    Start(String),
    /// The engine refused or did not answer the channel create.
    #[error("channel create: {0}")]
    Create(String),
}

impl MicroVmError {
    pub(crate) fn kvm(step: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Self {
        move |source| MicroVmError::Kvm { step, source }
    }
}
