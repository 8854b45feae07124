//! Assembles the guest programs in `guest/` into flat binaries (`as`, then `objcopy -O binary`)
//! and generates the boot-info layout both sides use: `boot_info.inc` for the assembler and
//! `boot_info.rs` for the launcher, from the one table below.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The boot-info page: name, byte offset, meaning. Every field is a little-endian u64.
const BOOT_INFO: &[(&str, u64, &str)] = &[
    ("BI_MAGIC", 0x00, "`BOOT_MAGIC`, written by the launcher."),
    (
        "BI_CHANNEL",
        0x08,
        "Guest-physical address of the channel region.",
    ),
    (
        "BI_PEER_MAC",
        0x10,
        "The peer's MAC in the low six bytes (in wire order), the top two bytes zero.",
    ),
    (
        "BI_PEER_ENDPOINT",
        0x18,
        "The peer's endpoint (low 32 bits).",
    ),
    ("BI_COUNT", 0x20, "How many messages to exchange."),
    (
        "BI_SEED",
        0x28,
        "Payload of message `i` is `seed + i` (DMA-data: qword `k` is `seed + i + k`); the \
         reply must carry it back (an echo).",
    ),
    ("BI_MODE", 0x50, "`MODE_USER_DATA` or `MODE_DMA_DATA`."),
    (
        "BI_DMA_LEN",
        0x58,
        "DMA-data mode: bytes per message, a multiple of 8 (the launcher checks that two \
         buffers of it fit in the data area).",
    ),
    (
        "BI_EXIT_ADDR",
        0x30,
        "A guest-physical address outside every memslot: the final store goes there.",
    ),
    (
        "BI_RESULT",
        0x38,
        "Written by the guest: `RESULT_OK` or a failure code.",
    ),
    (
        "BI_DONE",
        0x40,
        "Written by the guest: replies received and checked so far.",
    ),
    (
        "BI_DETAIL",
        0x48,
        "Written by the guest on some failures: a completion status or the fault code.",
    ),
    (
        "BI_PATH",
        0x60,
        "The data path: `PATH_BYPASS`, `PATH_DOORBELL` or `PATH_MEDIATED`.",
    ),
    (
        "BI_DOORBELL_ADDR",
        0x68,
        "A guest-physical address outside every memslot registered as an ioeventfd: a store \
         there is a doorbell (an in-kernel exit).",
    ),
    (
        "BI_MEDIATE_ADDR",
        0x70,
        "`PATH_MEDIATED`: the VMM's register page, outside every memslot (`MEDIATE_SEND`, \
         `MEDIATE_RECV`).",
    ),
    (
        "BI_DOORBELLS",
        0x78,
        "Written by the guest: doorbells rung so far.",
    ),
    (
        "BI_TIMES",
        0x80,
        "Guest-physical address of an array of u64 round-trip times in TSC ticks, one per \
         message, or 0 for none.",
    ),
    ("BI_TIMES_LEN", 0x88, "Entries in the `BI_TIMES` array."),
];

/// Result codes the guest writes to `BI_RESULT`, the payloads of `BI_MODE`, the data paths of
/// `BI_PATH` and the register offsets of the mediated path's register page.
const RESULTS: &[(&str, u64, &str)] = &[
    (
        "MODE_USER_DATA",
        0,
        "Each message is user-data with 8 payload bytes inline.",
    ),
    (
        "MODE_DMA_DATA",
        1,
        "Each message is DMA-data from the data area into a buffer the peer posted; the echo \
         comes back into a buffer this program posted.",
    ),
    (
        "PATH_BYPASS",
        0,
        "The program publishes its ring indices itself and rings the ioeventfd doorbell only \
         when the engine advertises sleeping.",
    ),
    (
        "PATH_DOORBELL",
        1,
        "As `PATH_BYPASS`, but the doorbell is rung after every message.",
    ),
    (
        "PATH_MEDIATED",
        2,
        "Every message is handed to the VMM through an exit (its slot's address stored to \
         `MEDIATE_SEND`), and replies are learnt through another (a load of `MEDIATE_RECV`).",
    ),
    (
        "MEDIATE_SEND",
        0,
        "Register offset: a u64 store of a TX or post ring slot's guest-physical address \
         hands that message to the VMM.",
    ),
    (
        "MEDIATE_RECV",
        8,
        "Register offset: a u32 load returns the channel's rx_head once it differs from \
         rx_tail (or after a bounded wait).",
    ),
    (
        "RESULT_OK",
        1,
        "Every reply arrived, in order, with the expected payload.",
    ),
    (
        "RESULT_BAD_HEADER",
        2,
        "The channel header is not ready, or its magic or version is wrong.",
    ),
    (
        "RESULT_COMPLETION",
        3,
        "An error completion arrived (its status is in `BI_DETAIL`).",
    ),
    ("RESULT_BAD_KIND", 4, "An RX message of an unexpected kind."),
    (
        "RESULT_BAD_LEN",
        5,
        "A reply, or a DMA-data completion, of the wrong length.",
    ),
    (
        "RESULT_BAD_PEER",
        6,
        "A reply from another (MAC, endpoint) than the peer.",
    ),
    (
        "RESULT_BAD_COOKIE",
        7,
        "A reply whose cookie is not the index of the message it answers.",
    ),
    (
        "RESULT_BAD_PAYLOAD",
        8,
        "A reply whose payload is not the message's.",
    ),
    (
        "RESULT_FAULT",
        9,
        "The engine faulted the channel (the fault code is in `BI_DETAIL`).",
    ),
    (
        "RESULT_BAD_MAGIC",
        10,
        "The boot-info page does not start with `BOOT_MAGIC`.",
    ),
    (
        "RESULT_BAD_DMA",
        11,
        "A DMA-data echo not marked COMPLETE, or not in the buffer this program posted.",
    ),
];

/// "SVNICVM1" read as a little-endian u64.
const BOOT_MAGIC: u64 = u64::from_le_bytes(*b"SVNICVM1");

/// The programs, by file stem in `guest/`.
const PROGRAMS: &[&str] = &["bypass", "probe"];

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut inc = String::new();
    let mut rs = String::new();
    for (name, value, doc) in BOOT_INFO.iter().chain(RESULTS) {
        let _ = writeln!(inc, ".set {name}, {value:#x}");
        let _ = writeln!(rs, "/// {doc}\npub const {name}: u64 = {value:#x};");
    }
    let _ = writeln!(inc, ".set BOOT_MAGIC, {BOOT_MAGIC:#x}");
    let _ = writeln!(
        rs,
        "/// The first word of the boot-info page (\"SVNICVM1\").\n\
         pub const BOOT_MAGIC: u64 = {BOOT_MAGIC:#x};"
    );
    write(&out.join("boot_info.inc"), &inc);
    write(&out.join("boot_info.rs"), &rs);
    println!("cargo:rerun-if-changed=build.rs");
    for name in PROGRAMS {
        let src = Path::new("guest").join(format!("{name}.s"));
        println!("cargo:rerun-if-changed={}", src.display());
        let obj = out.join(format!("{name}.o"));
        let bin = out.join(format!("{name}.bin"));
        run(Command::new("as")
            .arg("--64")
            .arg("-I")
            .arg(&out)
            .arg("-o")
            .arg(&obj)
            .arg(&src));
        run(Command::new("objcopy")
            .args(["-O", "binary", "-j", ".text"])
            .arg(&obj)
            .arg(&bin));
    }
}

fn write(path: &Path, text: &str) {
    if let Err(e) = std::fs::write(path, text) {
        panic!("cannot write {}: {e}", path.display());
    }
}

fn run(cmd: &mut Command) {
    match cmd.status() {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{cmd:?} failed: {s} (scripts/setup.sh installs binutils)"),
        Err(e) => panic!("cannot run {cmd:?}: {e} (scripts/setup.sh installs binutils)"),
    }
}
