//! The micro-VM without a daemon: detection, the watchdog, and the bypass program's checks of
//! what the launcher hands it. Skips, saying why, only without a usable KVM or when the probe
//! cannot run a guest.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use svnic_channels::ChannelAddr;
use svnic_channels::MacAddr;
use svnic_host_frontend::virtio_user::memory::MIN_MEMORY_SIZE;
use svnic_host_frontend::virtio_user::MemfdMemory;
use svnic_microvm::boot_info::{BI_MAGIC, RESULT_BAD_HEADER, RESULT_BAD_MAGIC};
use svnic_microvm::detect::open;
use svnic_microvm::program::{load_bypass, read_bypass, BypassArgs, Payload, PROBE};
use svnic_microvm::vcpu::run_until_exit;
use svnic_microvm::vm::{write, MicroVm, EXIT_GPA};
use svnic_microvm::{detect, DataPath, MicroVmError, ModeProbe};

fn usable() -> bool {
    match detect() {
        Err(e) => {
            eprintln!("skipping: no usable KVM: {e}");
            false
        }
        Ok(r) if matches!(r.cpl3, ModeProbe::Failed(_)) => {
            eprintln!("skipping: KVM cannot run the probe guest:\n{r}");
            false
        }
        Ok(r) => {
            eprintln!("{r}");
            true
        }
    }
}

fn micro_vm() -> MicroVm {
    let memory = Arc::new(MemfdMemory::new(MIN_MEMORY_SIZE).unwrap());
    MicroVm::new(&open().unwrap(), memory).unwrap()
}

#[test]
fn a_guest_that_never_exits_is_stopped_by_the_watchdog() {
    if !usable() {
        return;
    }
    let mut vm = micro_vm();
    let code = vm.load(PROBE).unwrap();
    let counter = vm.alloc_page().unwrap();
    // 2^63 iterations: it would count for centuries.
    vm.set_entry(code, [counter, 1 << 63, EXIT_GPA]).unwrap();
    let waited = Duration::from_millis(200);
    match run_until_exit(vm.vcpu_mut(), EXIT_GPA, waited) {
        Err(MicroVmError::Timeout { waited: w }) => assert_eq!(w, waited),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_bypass_program_refuses_a_missing_boot_magic_and_an_unready_channel() {
    if !usable() {
        return;
    }
    // A zeroed page as the "channel": its header is not ready.
    let mut vm = micro_vm();
    let not_a_channel = vm.alloc_page().unwrap();
    let peer = ChannelAddr::new(MacAddr([2, 0, 0, 0, 0, 1]), 1);
    let args = BypassArgs {
        peer,
        count: 10,
        seed: 0,
        payload: Payload::UserData,
        path: DataPath::Bypass,
        times: 0,
    };
    let info = load_bypass(&vm, not_a_channel, args).unwrap().info;
    let run = run_until_exit(vm.vcpu_mut(), EXIT_GPA, Duration::from_secs(5)).unwrap();
    let got = read_bypass(&vm, info).unwrap();
    assert_eq!(
        (run.value, got.result, got.done),
        (RESULT_BAD_HEADER, RESULT_BAD_HEADER, 0)
    );

    // The same with the boot-info page's magic overwritten.
    let mut vm = micro_vm();
    let info = load_bypass(&vm, not_a_channel, args).unwrap().info;
    write(vm.memory(), info + BI_MAGIC, &0u64.to_le_bytes()).unwrap();
    let run = run_until_exit(vm.vcpu_mut(), EXIT_GPA, Duration::from_secs(5)).unwrap();
    assert_eq!(run.value, RESULT_BAD_MAGIC);
    assert_eq!(read_bypass(&vm, info).unwrap().result, RESULT_BAD_MAGIC);
}

#[test]
fn detect_all_probes_kernel_mode_too_and_reports_both() {
    if !usable() {
        return;
    }
    let r = svnic_microvm::detect_all().unwrap();
    let cpl0 = r.cpl0.clone().expect("detect_all probes CPL0");
    // Either way the probe ran and measured something (this host emulates CPL0).
    match cpl0 {
        ModeProbe::Native { rate, .. } | ModeProbe::Emulated { rate, .. } => assert!(rate > 0.0),
        ModeProbe::Failed(why) => panic!("CPL0 probe failed: {why}"),
    }
    let text = r.to_string();
    assert!(text.contains("(CPL3)") && text.contains("(CPL0)"), "{text}");
}
