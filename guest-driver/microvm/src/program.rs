//! The guest programs and the boot-info page.
//!
//! The programs are x86-64 assembly (`guest/*.s`), assembled by `build.rs` with `as` and cut to
//! a flat binary with `objcopy -O binary`. Assembly rather than a `no_std` Rust program because
//! the vCPU runs with the smallest register setup this host's KVM runs natively, in which
//! `cr4.OSFXSR` is clear: any SSE instruction faults, and compiled Rust uses SSE for copies and
//! zeroing wherever it likes. In assembly every instruction is chosen, the programs are position
//! independent (loaded anywhere, no relocation), and each line maps to a rule of docs/abi.md.
//!
//! The boot-info page ([`crate::boot_info`]) is how the launcher tells the program what to do
//! (the channel's guest-physical address, the peer, the count) and how the program reports.

use svnic_channels::ChannelAddr;

use crate::boot_info::*;
use crate::error::MicroVmError;
use crate::vm::{load, write, MicroVm, EXIT_GPA};

/// The bypass program: N user-data messages to a peer, N replies checked.
pub const BYPASS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/bypass.bin"));
/// The detection probe: increments a counter N times.
pub const PROBE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/probe.bin"));

/// What the launcher tells the bypass program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BypassArgs {
    /// Guest-physical address of the channel region (created, header ready).
    pub channel_gpa: u64,
    /// The peer to exchange with.
    pub peer: ChannelAddr,
    /// Messages to send (and replies to expect).
    pub count: u64,
    /// Payload of message `i` is `seed + i`.
    pub seed: u64,
}

/// What the bypass program reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BypassResult {
    /// [`RESULT_OK`] or a failure code.
    pub result: u64,
    /// Replies received and checked.
    pub done: u64,
    /// The completion status or fault code of some failures.
    pub detail: u64,
}

impl BypassResult {
    /// What the result code means.
    pub fn describe(&self) -> String {
        let what = match self.result {
            RESULT_OK => "ok",
            RESULT_BAD_HEADER => "channel header not ready or wrong magic/version",
            RESULT_COMPLETION => "error completion",
            RESULT_BAD_KIND => "RX message of an unexpected kind",
            RESULT_BAD_LEN => "reply of the wrong length",
            RESULT_BAD_PEER => "reply from another peer",
            RESULT_BAD_COOKIE => "reply out of order (cookie)",
            RESULT_BAD_PAYLOAD => "reply with the wrong payload",
            RESULT_FAULT => "channel faulted",
            RESULT_BAD_MAGIC => "boot info not found",
            _ => "unknown result code",
        };
        format!(
            "{what} (result {}, {} replies checked, detail {})",
            self.result, self.done, self.detail
        )
    }
}

/// The peer MAC as the program compares it: six bytes in wire order, two zero bytes (the
/// message's status field, zero in user-data).
fn mac_word(peer: ChannelAddr) -> u64 {
    let mut w = [0u8; 8];
    w[..6].copy_from_slice(&peer.mac.0);
    u64::from_le_bytes(w)
}

/// Loads the bypass program and its boot-info page into `vm` and points the vCPU at it.
/// Returns the boot-info page's guest-physical address.
pub fn load_bypass(vm: &MicroVm, args: BypassArgs) -> Result<u64, MicroVmError> {
    let code = vm.load(BYPASS)?;
    let info = vm.alloc_page()?;
    let fields = [
        (BI_MAGIC, BOOT_MAGIC),
        (BI_CHANNEL, args.channel_gpa),
        (BI_PEER_MAC, mac_word(args.peer)),
        (BI_PEER_ENDPOINT, u64::from(args.peer.endpoint)),
        (BI_COUNT, args.count),
        (BI_SEED, args.seed),
        (BI_EXIT_ADDR, EXIT_GPA),
    ];
    for (offset, value) in fields {
        write(vm.memory(), info + offset, &value.to_le_bytes())?;
    }
    vm.set_entry(code, [info, 0, 0])?;
    Ok(info)
}

/// Reads what the bypass program reported in its boot-info page at `info`.
pub fn read_bypass(vm: &MicroVm, info: u64) -> Result<BypassResult, MicroVmError> {
    Ok(BypassResult {
        result: load::<u64>(vm.memory(), info + BI_RESULT)?,
        done: load::<u64>(vm.memory(), info + BI_DONE)?,
        detail: load::<u64>(vm.memory(), info + BI_DETAIL)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_assembled_and_end_in_their_idle_loop() {
        // `pause; jmp pause`: f3 90 eb fc.
        for program in [BYPASS, PROBE] {
            assert!(
                program.ends_with(&[0xf3, 0x90, 0xeb, 0xfc]),
                "{program:02x?}"
            );
        }
    }

    #[test]
    fn boot_info_fields_are_distinct_aligned_words_inside_one_page() {
        let mut fields = [
            BI_MAGIC,
            BI_CHANNEL,
            BI_PEER_MAC,
            BI_PEER_ENDPOINT,
            BI_COUNT,
            BI_SEED,
            BI_EXIT_ADDR,
            BI_RESULT,
            BI_DONE,
            BI_DETAIL,
        ];
        fields.sort_unstable();
        for w in fields.windows(2) {
            assert!(w[1] >= w[0] + 8, "{fields:x?}");
        }
        assert!(fields.iter().all(|f| f % 8 == 0 && *f + 8 <= 4096));
    }
}
