//! Honest detection: is there a KVM, what does it offer, and does 64-bit user-mode (and, with
//! [`detect_all`], kernel-mode) guest code run natively on it?
//!
//! Capabilities alone do not answer the last question: this host's paravirtual KVM accepts
//! real mode, 32-bit and 64-bit kernel-mode guests but emulates every instruction of them in
//! the host kernel. So the probe runs a counting loop at CPL3 and times it: native execution
//! does an iteration in about a nanosecond, emulation takes microseconds. The vCPU's
//! `insn_emulation` counter, where the kernel has it, says the same from the other side.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use kvm_ioctls::{Cap, Kvm};
use svnic_host_frontend::virtio_user::memory::MIN_MEMORY_SIZE;
use svnic_host_frontend::virtio_user::MemfdMemory;

use crate::error::MicroVmError;
use crate::program::PROBE;
use crate::stats::VcpuStats;
use crate::vcpu::run_until_exit;
use crate::vm::{load, MicroVm, Privilege, EXIT_GPA};

/// Iterations of the probe's counting loop.
pub const PROBE_ITERATIONS: u64 = 2_000_000;
/// The probe must finish within this, or it is not native (2 million iterations take a few
/// milliseconds natively and seconds emulated).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Slowest rate still called native, in iterations per second.
pub const NATIVE_MIN_RATE: f64 = 50e6;

/// The capabilities the micro-VM uses or will use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Memslots from user memory (required).
    pub user_memory: bool,
    /// An in-kernel interrupt controller.
    pub irqchip: bool,
    /// Interrupts injected through eventfds.
    pub irqfd: bool,
    /// Guest stores signalled on eventfds.
    pub ioeventfd: bool,
    /// The binary statistics file (exit counters).
    pub binary_stats_fd: bool,
}

/// What a probe of one privilege level found.
#[derive(Debug, Clone, PartialEq)]
pub enum ModeProbe {
    /// The loop ran natively.
    Native {
        /// Iterations per second.
        rate: f64,
        /// Exits to user space (the final MMIO exit included).
        user_exits: u64,
        /// Instructions the host kernel emulated, if it counts them.
        emulated: Option<u64>,
    },
    /// The loop ran, but too slowly to be native (emulated).
    Emulated {
        /// Iterations per second (counted up to [`PROBE_TIMEOUT`] if it did not finish).
        rate: f64,
        /// Instructions the host kernel emulated, if it counts them.
        emulated: Option<u64>,
    },
    /// The probe could not run.
    Failed(String),
}

/// The detection report.
#[derive(Debug, Clone, PartialEq)]
pub struct KvmReport {
    /// `KVM_GET_API_VERSION`.
    pub api_version: i32,
    /// Capabilities.
    pub caps: Capabilities,
    /// The CPL3 (guest user mode) probe.
    pub cpl3: ModeProbe,
    /// The CPL0 (guest kernel mode) probe, if it was run ([`detect_all`]).
    pub cpl0: Option<ModeProbe>,
}

impl KvmReport {
    /// Whether 64-bit user-mode guests run natively here: what the micro-VM needs.
    pub fn cpl3_native(&self) -> bool {
        matches!(self.cpl3, ModeProbe::Native { .. })
    }
}

impl fmt::Display for KvmReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.caps;
        writeln!(f, "KVM API version {}", self.api_version)?;
        writeln!(
            f,
            "capabilities: user_memory={} irqchip={} irqfd={} ioeventfd={} binary_stats_fd={}",
            c.user_memory, c.irqchip, c.irqfd, c.ioeventfd, c.binary_stats_fd
        )?;
        self.cpl3.describe(f, "64-bit user mode (CPL3)")?;
        if let Some(cpl0) = &self.cpl0 {
            writeln!(f)?;
            cpl0.describe(f, "64-bit kernel mode (CPL0)")?;
        }
        Ok(())
    }
}

impl ModeProbe {
    fn describe(&self, f: &mut fmt::Formatter<'_>, mode: &str) -> fmt::Result {
        let emu = |e: &Option<u64>| e.map_or("not counted".to_string(), |n| n.to_string());
        match self {
            ModeProbe::Native {
                rate,
                user_exits,
                emulated,
            } => write!(
                f,
                "{mode}: native, {:.0} M iterations/s, {user_exits} user-space exit(s), \
                 emulated instructions: {}",
                rate / 1e6,
                emu(emulated)
            ),
            ModeProbe::Emulated { rate, emulated } => write!(
                f,
                "{mode}: NOT native ({:.3} M iterations/s, emulated instructions: {})",
                rate / 1e6,
                emu(emulated)
            ),
            ModeProbe::Failed(why) => write!(f, "{mode}: cannot run a guest: {why}"),
        }
    }
}

/// Opens `/dev/kvm`; `Err` says why there is no usable KVM (absent, no permission).
pub fn open() -> Result<Kvm, MicroVmError> {
    Kvm::new().map_err(MicroVmError::kvm("open /dev/kvm"))
}

/// Detects KVM and probes 64-bit user mode. `Err` only when `/dev/kvm` cannot be opened; a
/// KVM that cannot run the probe is reported as [`ModeProbe::Failed`].
pub fn detect() -> Result<KvmReport, MicroVmError> {
    detect_modes(false)
}

/// [`detect`], and a probe of 64-bit kernel mode too (up to [`PROBE_TIMEOUT`] more where it
/// is emulated).
pub fn detect_all() -> Result<KvmReport, MicroVmError> {
    detect_modes(true)
}

fn detect_modes(with_cpl0: bool) -> Result<KvmReport, MicroVmError> {
    let kvm = open()?;
    let caps = Capabilities {
        user_memory: kvm.check_extension(Cap::UserMemory),
        irqchip: kvm.check_extension(Cap::Irqchip),
        irqfd: kvm.check_extension(Cap::Irqfd),
        ioeventfd: kvm.check_extension(Cap::Ioeventfd),
        binary_stats_fd: kvm
            .check_extension_raw(libc::c_ulong::from(kvm_bindings::KVM_CAP_BINARY_STATS_FD))
            > 0,
    };
    let run = |privilege| {
        if caps.user_memory {
            probe(&kvm, privilege).unwrap_or_else(|e| ModeProbe::Failed(e.to_string()))
        } else {
            ModeProbe::Failed("KVM cannot map user memory (no KVM_CAP_USER_MEMORY)".into())
        }
    };
    Ok(KvmReport {
        api_version: kvm.get_api_version(),
        caps,
        cpl3: run(Privilege::User),
        cpl0: with_cpl0.then(|| run(Privilege::Kernel)),
    })
}

/// Runs the counting loop at `privilege` in a fresh micro-VM of the smallest memory.
fn probe(kvm: &Kvm, privilege: Privilege) -> Result<ModeProbe, MicroVmError> {
    let memory = Arc::new(MemfdMemory::new(MIN_MEMORY_SIZE)?);
    let mut vm = MicroVm::with_privilege(kvm, memory, privilege)?;
    let code = vm.load(PROBE)?;
    let counter = vm.alloc_page()?;
    vm.set_entry(code, [counter, PROBE_ITERATIONS, EXIT_GPA])?;
    let stats = VcpuStats::open(vm.vcpu_mut()).ok();
    let before = stats.as_ref().and_then(|s| s.snapshot().ok());
    let run = run_until_exit(vm.vcpu_mut(), EXIT_GPA, PROBE_TIMEOUT);
    let emulated = match (&stats, &before) {
        (Some(s), Some(b)) => s
            .snapshot()
            .ok()
            .and_then(|after| after.since(b).get("insn_emulation")),
        _ => None,
    };
    let outcome = match run {
        Ok(o) => o,
        Err(MicroVmError::Timeout { waited }) => {
            let count = load::<u64>(vm.memory(), counter)?;
            return Ok(ModeProbe::Emulated {
                rate: count as f64 / waited.as_secs_f64(),
                emulated,
            });
        }
        Err(e) => return Err(e),
    };
    let count = load::<u64>(vm.memory(), counter)?;
    if count != PROBE_ITERATIONS || outcome.value != PROBE_ITERATIONS {
        return Ok(ModeProbe::Failed(format!(
            "the probe counted {count} (reported {}), not {PROBE_ITERATIONS}",
            outcome.value
        )));
    }
    let rate = PROBE_ITERATIONS as f64 / outcome.elapsed.as_secs_f64().max(1e-9);
    Ok(if rate >= NATIVE_MIN_RATE {
        ModeProbe::Native {
            rate,
            user_exits: outcome.user_exits,
            emulated,
        }
    } else {
        ModeProbe::Emulated { rate, emulated }
    })
}
