//! The launcher: a micro-VM that is a host-process guest of `svnic serve`.
//!
//! It connects to the daemon as a [`HostGuest`] (which creates the memfd guest memory and
//! brings up virtio-net over vhost-user), creates the channel through the control path on the
//! guest program's behalf (Pending, then Success), registers the very same memory as the KVM
//! memslot, loads the program and its boot-info page from that memory's allocator, and runs the
//! vCPU until the program's final MMIO exit. The host side never touches the channel while the
//! program runs; it destroys it afterwards.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use log::info;
use svnic_channels::layout::{header, DEFAULT_REGION_LEN};
use svnic_channels::{ChannelAddr, EndpointId};
use svnic_host_frontend::host_guest::CreateState;
use svnic_host_frontend::HostGuest;

use crate::detect;
use crate::error::MicroVmError;
use crate::program::{load_bypass, read_bypass, BypassArgs, BypassResult, Payload};
use crate::stats::{Snapshot, VcpuStats};
use crate::vcpu::{run_until_exit, RunOutcome};
use crate::vm::{load, MicroVm, EXIT_GPA};

/// What to run.
#[derive(Debug, Clone)]
pub struct BypassConfig {
    /// The guest socket of `svnic serve` to connect to.
    pub socket: PathBuf,
    /// Guest memory size (at most [`crate::vm::MAX_MEMORY`]).
    pub memory_size: u64,
    /// The guest's channel endpoint.
    pub endpoint: EndpointId,
    /// Slots per ring.
    pub ring_size: u32,
    /// The peer: an echo (such as `svnic-guest echo`), answering each message with its payload
    /// and cookie.
    pub peer: ChannelAddr,
    /// Messages.
    pub count: u64,
    /// Payload of message `i` is `seed + i` (DMA-data: qword `k` is `seed + i + k`).
    pub seed: u64,
    /// User-data or DMA-data.
    pub payload: Payload,
    /// Longest wait for the create answer, and for the program to finish.
    pub timeout: Duration,
}

/// What happened.
#[derive(Debug, Clone)]
pub struct BypassReport {
    /// This guest's channel address.
    pub addr: ChannelAddr,
    /// The channel region's guest-physical address, as handed to the program.
    pub channel_gpa: u64,
    /// Messages asked for.
    pub count: u64,
    /// What the program reported.
    pub result: BypassResult,
    /// The run.
    pub run: RunOutcome,
    /// The vCPU's KVM statistics over the run (after − before), if the kernel has them.
    pub stats: Option<Snapshot>,
}

impl BypassReport {
    /// Whether every reply arrived intact and in order.
    pub fn ok(&self) -> bool {
        self.result.result == crate::boot_info::RESULT_OK && self.result.done == self.count
    }
}

/// Runs the bypass program once, as described in the module documentation.
pub fn run_bypass(cfg: &BypassConfig) -> Result<BypassReport, MicroVmError> {
    let kvm = detect::open()?;
    let guest = HostGuest::connect(&cfg.socket, cfg.memory_size)?;
    let pending = guest.begin_create(cfg.endpoint, cfg.ring_size, DEFAULT_REGION_LEN)?;
    let channel_gpa = pending.region_addr();
    let addr = pending.addr();
    let channel = match pending.wait(cfg.timeout)? {
        CreateState::Success(channel) => channel,
        CreateState::Failure(reason) => return Err(MicroVmError::Create(reason.to_string())),
        CreateState::Pending(_) => {
            return Err(MicroVmError::Create(format!(
                "no answer within {:?}",
                cfg.timeout
            )))
        }
    };
    info!(
        "channel {} at {addr} in guest memory at {channel_gpa:#x}",
        channel.id()
    );
    cfg.payload.check(channel.layout())?;
    let mut vm = MicroVm::new(&kvm, Arc::clone(guest.memory()))?;
    let info = load_bypass(
        &vm,
        BypassArgs {
            channel_gpa,
            peer: cfg.peer,
            count: cfg.count,
            seed: cfg.seed,
            payload: cfg.payload,
        },
    )?;
    let stats = VcpuStats::open(vm.vcpu_mut()).ok();
    let before = stats.as_ref().map(VcpuStats::snapshot).transpose()?;
    let run = run_until_exit(vm.vcpu_mut(), EXIT_GPA, cfg.timeout);
    let after = stats.as_ref().map(VcpuStats::snapshot).transpose()?;
    let run = match run {
        Err(MicroVmError::Timeout { waited }) => {
            let progress = format!(
                "{}; channel: {}",
                read_bypass(&vm, info)?.describe(),
                channel_words(&vm, channel_gpa)?
            );
            return Err(MicroVmError::Stalled { waited, progress });
        }
        other => other?,
    };
    let result = read_bypass(&vm, info)?;
    guest.destroy_channel(channel, cfg.timeout)?;
    Ok(BypassReport {
        addr,
        channel_gpa,
        count: cfg.count,
        result,
        run,
        stats: after.zip(before).map(|(a, b)| a.since(&b)),
    })
}

/// The channel's index and flag words (docs/abi.md §2), for a stalled run's report.
fn channel_words(vm: &MicroVm, gpa: u64) -> Result<String, MicroVmError> {
    let words = [
        ("fault", header::FAULT),
        ("tx_head", header::TX_HEAD),
        ("tx_tail", header::TX_TAIL),
        ("rx_head", header::RX_HEAD),
        ("rx_tail", header::RX_TAIL),
        ("engine_sleeping", header::ENGINE_SLEEPING),
    ];
    let mut out = Vec::with_capacity(words.len());
    for (name, offset) in words {
        out.push(format!(
            "{name} {}",
            load::<u32>(vm.memory(), gpa + offset as u64)?
        ));
    }
    Ok(out.join(", "))
}
