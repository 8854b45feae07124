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

use svnic_channels::{ChannelAddr, ChannelLayout};

use crate::boot_info::*;
use crate::error::MicroVmError;
use crate::path::DataPath;
use crate::vm::{load, write, MicroVm, DOORBELL_GPA, EXIT_GPA, MEDIATE_GPA, PAGE};

/// The bypass program: N user-data or DMA-data messages to a peer, N replies checked, on any of
/// the three data paths ([`DataPath`]).
pub const BYPASS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/bypass.bin"));
/// The detection probe: increments a counter N times.
pub const PROBE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/probe.bin"));

/// What each message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// User-data: 8 bytes inline.
    UserData,
    /// DMA-data of `len` bytes (a multiple of 8), from the data area into a posted buffer.
    DmaData {
        /// Bytes per message.
        len: u32,
    },
}

impl Payload {
    /// Checks that the program's two buffers fit in the data area of `layout` (the send buffer
    /// at its start, the receive buffer at the next 4 KiB boundary).
    pub fn check(&self, layout: &ChannelLayout) -> Result<(), MicroVmError> {
        let Payload::DmaData { len } = *self else {
            return Ok(());
        };
        let len = u64::from(len);
        let need = len.div_ceil(PAGE) * PAGE + len;
        if len == 0 || len % 8 != 0 || need > layout.data_len() {
            return Err(MicroVmError::BadConfig(format!(
                "DMA-data length {len} must be a non-zero multiple of 8, and two buffers of it \
                 must fit in the {}-byte data area",
                layout.data_len()
            )));
        }
        Ok(())
    }
}

/// What the launcher asks of the bypass program: the exchange it runs with its peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BypassArgs {
    /// The peer to exchange with: an echo (such as `svnic-guest echo`), answering each message
    /// with its payload and cookie, or another micro-VM sending the same messages.
    pub peer: ChannelAddr,
    /// Messages to send (and replies to expect).
    pub count: u64,
    /// Payload of message `i` is `seed + i` (DMA-data: qword `k` is `seed + i + k`).
    pub seed: u64,
    /// User-data or DMA-data.
    pub payload: Payload,
    /// How messages reach the engine.
    pub path: DataPath,
    /// Round trips to time (the first `times` messages; 0 for none).
    pub times: u64,
}

/// Where the program's boot-info page and round-trip times lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loaded {
    /// The boot-info page.
    pub info: u64,
    /// The round-trip array (0 if none), and its entries.
    pub times: (u64, u64),
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
    /// Doorbells it rang.
    pub doorbells: u64,
}

impl BypassResult {
    /// What the result code means.
    pub fn describe(&self) -> String {
        let what = match self.result {
            RESULT_OK => "ok",
            RESULT_BAD_HEADER => "channel header not ready or wrong magic/version",
            RESULT_COMPLETION => "error completion",
            RESULT_BAD_KIND => "RX message of an unexpected kind",
            RESULT_BAD_LEN => "reply or completion of the wrong length",
            RESULT_BAD_PEER => "reply from another peer",
            RESULT_BAD_COOKIE => "reply out of order (cookie)",
            RESULT_BAD_PAYLOAD => "reply with the wrong payload",
            RESULT_FAULT => "channel faulted",
            RESULT_BAD_MAGIC => "boot info not found",
            RESULT_BAD_DMA => "DMA-data echo not COMPLETE or not in the posted buffer",
            _ => "unknown result code",
        };
        format!(
            "{what} (result {}, {} replies checked, detail {}, {} doorbell(s))",
            self.result, self.done, self.detail, self.doorbells
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

/// Loads the bypass program and its boot-info page into `vm` and points the vCPU at it: `args`
/// on the channel region at guest-physical `channel_gpa` (created, header ready).
pub fn load_bypass(
    vm: &MicroVm,
    channel_gpa: u64,
    args: BypassArgs,
) -> Result<Loaded, MicroVmError> {
    let (mode, dma_len) = match args.payload {
        Payload::UserData => (MODE_USER_DATA, 0),
        Payload::DmaData { len } => (MODE_DMA_DATA, u64::from(len)),
    };
    let code = vm.load(BYPASS)?;
    let info = vm.alloc_page()?;
    let times = match args.times {
        0 => 0,
        n => {
            let bytes = n.checked_mul(8).ok_or_else(|| {
                MicroVmError::BadConfig(format!("{n} round-trip times do not fit in memory"))
            })?;
            vm.memory().alloc(bytes, PAGE)?
        }
    };
    let fields = [
        (BI_MAGIC, BOOT_MAGIC),
        (BI_CHANNEL, channel_gpa),
        (BI_PEER_MAC, mac_word(args.peer)),
        (BI_PEER_ENDPOINT, u64::from(args.peer.endpoint)),
        (BI_COUNT, args.count),
        (BI_SEED, args.seed),
        (BI_EXIT_ADDR, EXIT_GPA),
        (BI_MODE, mode),
        (BI_DMA_LEN, dma_len),
        (BI_PATH, args.path.code()),
        (BI_DOORBELL_ADDR, DOORBELL_GPA),
        (BI_MEDIATE_ADDR, MEDIATE_GPA),
        (BI_TIMES, times),
        (BI_TIMES_LEN, args.times),
    ];
    for (offset, value) in fields {
        write(vm.memory(), info + offset, &value.to_le_bytes())?;
    }
    vm.set_entry(code, [info, 0, 0])?;
    Ok(Loaded {
        info,
        times: (times, args.times),
    })
}

/// The round trips the program timed, in TSC ticks (the first `min(done, entries)` messages).
pub fn read_times(vm: &MicroVm, loaded: &Loaded, done: u64) -> Result<Vec<u64>, MicroVmError> {
    let (at, entries) = loaded.times;
    (0..done.min(entries))
        .map(|i| load::<u64>(vm.memory(), at + 8 * i))
        .collect()
}

/// Reads what the bypass program reported in its boot-info page at `info`.
pub fn read_bypass(vm: &MicroVm, info: u64) -> Result<BypassResult, MicroVmError> {
    Ok(BypassResult {
        result: load::<u64>(vm.memory(), info + BI_RESULT)?,
        done: load::<u64>(vm.memory(), info + BI_DONE)?,
        detail: load::<u64>(vm.memory(), info + BI_DETAIL)?,
        doorbells: load::<u64>(vm.memory(), info + BI_DOORBELLS)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use svnic_channels::layout::DEFAULT_REGION_LEN;

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
            BI_MODE,
            BI_DMA_LEN,
            BI_PATH,
            BI_DOORBELL_ADDR,
            BI_MEDIATE_ADDR,
            BI_DOORBELLS,
            BI_TIMES,
            BI_TIMES_LEN,
        ];
        fields.sort_unstable();
        for w in fields.windows(2) {
            assert!(w[1] >= w[0] + 8, "{fields:x?}");
        }
        assert!(fields.iter().all(|f| f % 8 == 0 && *f + 8 <= 4096));
    }

    #[test]
    fn dma_lengths_must_be_word_multiples_whose_two_buffers_fit() {
        let layout = ChannelLayout::new(256, DEFAULT_REGION_LEN).expect("the default layout");
        let data = layout.data_len();
        let fits = |len: u32| Payload::DmaData { len }.check(&layout).is_ok();
        assert!(Payload::UserData.check(&layout).is_ok());
        assert!(fits(8) && fits(4096) && fits(65536));
        assert!(!fits(0) && !fits(12) && !fits(4097));
        // The largest: a multiple of 8 and of 4 KiB, twice, within the data area.
        let half = (data / 2 / PAGE * PAGE) as u32;
        assert!(fits(half));
        assert!(!fits(half + 4096));
    }
}
