//! The vCPU run loop: run until the guest stores to the exit address, with a watchdog, handing
//! other MMIO accesses to the VMM's handler (the mediated path's device registers).
//!
//! A guest program that never reaches its exit (a peer that never answers) would keep `KVM_RUN`
//! in the kernel forever; the watchdog interrupts it with a real-time signal aimed at the
//! running thread (`KVM_RUN` then returns `EINTR`), repeatedly until the loop notices.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use kvm_ioctls::{VcpuExit, VcpuFd};
use log::warn;
use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

use crate::error::MicroVmError;

/// How the run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOutcome {
    /// The value the guest stored to the exit address (little-endian, up to 8 bytes).
    pub value: u64,
    /// Returns of `KVM_RUN` to the launcher, the final exit included: every one is a
    /// user-space exit.
    pub user_exits: u64,
    /// Of those, returns with `EINTR` (a signal) that the launcher resumed.
    pub interrupted: u64,
    /// From the first `KVM_RUN` to the final exit.
    pub elapsed: Duration,
}

/// The signal the watchdog sends.
fn kick_signal() -> libc::c_int {
    SIGRTMIN() + 1
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

fn install_handler() -> Result<(), MicroVmError> {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| register_signal_handler(kick_signal(), on_kick).map_err(|e| e.to_string()))
        .clone()
        .map_err(MicroVmError::Watchdog)
}

/// An MMIO access of the guest other than its final store, for the VMM to emulate.
#[derive(Debug)]
pub enum Mmio<'a> {
    /// A store of `data` at the address.
    Write(u64, &'a [u8]),
    /// A load at the address, whose value the VMM writes into the slice.
    Read(u64, &'a mut [u8]),
}

/// Emulates an MMIO access: `Ok(true)` if handled (the guest resumes), `Ok(false)` if the
/// address is not the handler's (the run fails with an unexpected exit).
pub type MmioHandler<'h> = dyn FnMut(Mmio<'_>) -> Result<bool, MicroVmError> + 'h;

/// Runs `vcpu` until it stores to `exit_gpa`, or fails after `timeout`. Any other exit to
/// user space is an error, except an interruption by a signal (counted and resumed).
pub fn run_until_exit(
    vcpu: &mut VcpuFd,
    exit_gpa: u64,
    timeout: Duration,
) -> Result<RunOutcome, MicroVmError> {
    run_with(vcpu, exit_gpa, timeout, &mut |_| Ok(false))
}

/// [`run_until_exit`], handing every other MMIO access to `mmio` first.
pub fn run_with(
    vcpu: &mut VcpuFd,
    exit_gpa: u64,
    timeout: Duration,
    mmio: &mut MmioHandler<'_>,
) -> Result<RunOutcome, MicroVmError> {
    install_handler()?;
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() };
    let fired = AtomicBool::new(false);
    let (stop, stopped) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let fired = &fired;
        s.spawn(move || {
            if !matches!(
                stopped.recv_timeout(timeout),
                Err(mpsc::RecvTimeoutError::Timeout)
            ) {
                return;
            }
            fired.store(true, Ordering::SeqCst);
            loop {
                // SAFETY: `me` is the thread running this scope, alive until the scope ends,
                // which waits for this thread; the signal has a no-op handler.
                unsafe { libc::pthread_kill(me, kick_signal()) };
                if !matches!(
                    stopped.recv_timeout(Duration::from_millis(10)),
                    Err(mpsc::RecvTimeoutError::Timeout)
                ) {
                    return;
                }
            }
        });
        let result = run_loop(vcpu, exit_gpa, timeout, fired, mmio);
        drop(stop);
        result
    })
}

/// Hands `access` to the VMM's handler: an empty string if it handled it, else what the
/// unexpected exit was.
fn hand_over(mmio: &mut MmioHandler<'_>, access: Mmio<'_>) -> Result<String, MicroVmError> {
    let (what, addr, len) = match &access {
        Mmio::Write(addr, data) => ("write", *addr, data.len()),
        Mmio::Read(addr, data) => ("read", *addr, data.len()),
    };
    Ok(if mmio(access)? {
        String::new()
    } else {
        format!("MMIO {what} of {len} bytes at {addr:#x}")
    })
}

fn run_loop(
    vcpu: &mut VcpuFd,
    exit_gpa: u64,
    timeout: Duration,
    fired: &AtomicBool,
    mmio: &mut MmioHandler<'_>,
) -> Result<RunOutcome, MicroVmError> {
    let start = Instant::now();
    let mut user_exits = 0u64;
    let mut interrupted = 0u64;
    loop {
        let exit = vcpu.run();
        user_exits += 1;
        let what = match exit {
            Ok(VcpuExit::MmioWrite(addr, data)) if addr == exit_gpa => {
                let mut v = [0u8; 8];
                let n = data.len().min(8);
                v[..n].copy_from_slice(&data[..n]);
                return Ok(RunOutcome {
                    value: u64::from_le_bytes(v),
                    user_exits,
                    interrupted,
                    elapsed: start.elapsed(),
                });
            }
            Ok(VcpuExit::MmioWrite(addr, data)) => hand_over(mmio, Mmio::Write(addr, data))?,
            Ok(VcpuExit::MmioRead(addr, data)) => hand_over(mmio, Mmio::Read(addr, data))?,
            Ok(VcpuExit::IoOut(port, _)) => format!("port write to {port:#x}"),
            Ok(VcpuExit::IoIn(port, _)) => format!("port read from {port:#x}"),
            Ok(VcpuExit::Intr) => {
                interrupted += 1;
                String::new()
            }
            Ok(other) => format!("{other:?}"),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                interrupted += 1;
                String::new()
            }
            Err(e) => {
                return Err(MicroVmError::Kvm {
                    step: "run",
                    source: e,
                })
            }
        };
        if !what.is_empty() {
            let rip = vcpu.get_regs().map(|r| r.rip).unwrap_or(0);
            return Err(MicroVmError::UnexpectedExit { what, rip });
        }
        if fired.load(Ordering::SeqCst) {
            warn!("the guest did not finish within {timeout:?}; stopped");
            return Err(MicroVmError::Timeout { waited: timeout });
        }
    }
}
