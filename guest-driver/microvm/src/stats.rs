//! KVM's binary statistics of a vCPU (`KVM_GET_STATS_FD`): named counters such as `exits`,
//! `mmio_exits`, `io_exits`, `irq_exits` (external interrupts, e.g. host timer ticks) and
//! `insn_emulation` (instructions the host kernel emulated).
//!
//! The file starts with a header (flags, name size, number of descriptors, offsets of the id,
//! the descriptors and the data); each descriptor (flags, exponent, size, offset, bucket size,
//! name) says where its value lies in the data block. Only single-value counters are kept.

use std::fs::File;
use std::os::fd::FromRawFd;
use std::os::unix::fs::FileExt;

use kvm_ioctls::VcpuFd;
use vmm_sys_util::ioctl::ioctl;
use vmm_sys_util::ioctl_io_nr;

use crate::error::MicroVmError;

ioctl_io_nr!(KVM_GET_STATS_FD, kvm_bindings::KVMIO, 0xce);

/// Size of the header, and of a descriptor before its name.
const HEADER_LEN: usize = 24;
const DESC_FIXED_LEN: usize = 16;
/// Descriptor types of a single counter or value (cumulative, instant, peak).
const TYPE_MASK: u32 = 0xf;
const TYPE_HISTOGRAM_MIN: u32 = 3;
/// Bounds on what the header may claim (the kernel's are 48 bytes and a few dozen).
const MAX_NAME: usize = 4096;
const MAX_DESCRIPTORS: usize = 4096;

/// One counter: its name and where its value lies in the file.
#[derive(Debug, Clone)]
struct Counter {
    name: String,
    offset: u64,
}

/// The statistics file of one vCPU, with its descriptors read once.
#[derive(Debug)]
pub struct VcpuStats {
    file: File,
    counters: Vec<Counter>,
}

/// The counters at one instant, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot(pub Vec<(String, u64)>);

impl Snapshot {
    /// The value of `name`, if the kernel has that counter.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.0.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    }

    /// `self - earlier`, counter by counter (wrapping: counters only grow).
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        Snapshot(
            self.0
                .iter()
                .map(|(n, v)| (n.clone(), v.wrapping_sub(earlier.get(n).unwrap_or(0))))
                .collect(),
        )
    }

    /// The non-zero counters.
    pub fn nonzero(&self) -> Vec<(String, u64)> {
        self.0.iter().filter(|(_, v)| *v != 0).cloned().collect()
    }

    /// The counters whose name ends in `exits` or is `insn_emulation`, that are non-zero.
    pub fn exits(&self) -> Vec<(String, u64)> {
        self.0
            .iter()
            .filter(|(n, v)| *v != 0 && (n.ends_with("exits") || n == "insn_emulation"))
            .cloned()
            .collect()
    }
}

/// A run's (or a window's) exits by kind, from KVM's counters. Every VM exit is counted in
/// `exits`; of those, the ones that returned to the VMM are user-space exits, the rest stayed in
/// the host kernel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExitCounts {
    /// Exits to the VMM (user space): KVM's `mmio_exits` + `io_exits` (the program's only exits
    /// to the VMM are MMIO accesses; a signal that interrupts `KVM_RUN` is not one).
    pub user_space: u64,
    /// Exits handled in the host kernel (`exits` − `user_space`).
    pub in_kernel: u64,
    /// Of those, host interrupts (`irq_exits`: timer ticks, IPIs).
    pub irq: u64,
    /// Of those, `hlt` (`halt_exits`).
    pub halt: u64,
    /// Of those, first touches of guest pages (`pf_fixed`).
    pub page_faults: u64,
    /// Of those, every other one: among them the guest's stores to a registered ioeventfd (the
    /// doorbell), each an emulated store signalled in the kernel. The doorbells themselves are
    /// counted by the program (`BypassResult::doorbells`), not here.
    pub other: u64,
    /// Instructions the host kernel emulated (`insn_emulation`): MMIO stores and loads.
    pub emulated: u64,
}

/// [`ExitCounts`] divided by a number of messages.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PerMessage {
    /// Exits to the VMM.
    pub user_space: f64,
    /// Exits handled in the host kernel.
    pub in_kernel: f64,
    /// Of those, host interrupts.
    pub irq: f64,
    /// Of those, halts.
    pub halt: f64,
    /// Of those, first touches of guest pages.
    pub page_faults: f64,
    /// Of those, every other one.
    pub other: f64,
    /// Instructions the host kernel emulated.
    pub emulated: f64,
}

impl ExitCounts {
    /// The counts of `s`.
    pub fn from_snapshot(s: &Snapshot) -> Self {
        let n = |name| s.get(name).unwrap_or(0);
        let user_space = n("mmio_exits") + n("io_exits");
        let in_kernel = n("exits").saturating_sub(user_space);
        let (irq, halt, page_faults) = (n("irq_exits"), n("halt_exits"), n("pf_fixed"));
        ExitCounts {
            user_space,
            in_kernel,
            irq,
            halt,
            page_faults,
            other: in_kernel.saturating_sub(irq + halt + page_faults),
            emulated: n("insn_emulation"),
        }
    }

    /// The counts divided by `messages`, or all zero for no messages.
    pub fn per_message(&self, messages: u64) -> PerMessage {
        let per = |v: u64| {
            if messages == 0 {
                0.0
            } else {
                v as f64 / messages as f64
            }
        };
        PerMessage {
            user_space: per(self.user_space),
            in_kernel: per(self.in_kernel),
            irq: per(self.irq),
            halt: per(self.halt),
            page_faults: per(self.page_faults),
            other: per(self.other),
            emulated: per(self.emulated),
        }
    }

    /// "user-space X, in-kernel Y (irq, halt, page faults, other), emulated Z" per message.
    pub fn describe_per_message(&self, messages: u64) -> String {
        let p = self.per_message(messages);
        format!(
            "per message: {:.3} user-space exits, {:.3} in-kernel exits ({:.3} host interrupts, \
             {:.3} halts, {:.3} page faults, {:.3} other), {:.3} emulated instructions",
            p.user_space, p.in_kernel, p.irq, p.halt, p.page_faults, p.other, p.emulated
        )
    }
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut w = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        w.copy_from_slice(s);
    }
    u32::from_le_bytes(w)
}

fn le_u16(b: &[u8], at: usize) -> u16 {
    let mut w = [0u8; 2];
    if let Some(s) = b.get(at..at + 2) {
        w.copy_from_slice(s);
    }
    u16::from_le_bytes(w)
}

fn bad(what: &str) -> MicroVmError {
    MicroVmError::Stats(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        what.to_string(),
    ))
}

impl VcpuStats {
    /// Opens the statistics file of `vcpu` and reads its descriptors.
    pub fn open(vcpu: &VcpuFd) -> Result<Self, MicroVmError> {
        // SAFETY: KVM_GET_STATS_FD takes no argument and returns a new file descriptor (or -1);
        // it touches no memory of this process.
        let fd = unsafe { ioctl(vcpu, KVM_GET_STATS_FD()) };
        if fd < 0 {
            return Err(MicroVmError::Stats(std::io::Error::last_os_error()));
        }
        // SAFETY: fd is a fresh descriptor nobody else owns; the File closes it.
        let file = unsafe { File::from_raw_fd(fd) };
        Self::from_file(file)
    }

    /// Reads the descriptors of a statistics file in KVM's binary format.
    pub fn from_file(file: File) -> Result<Self, MicroVmError> {
        let mut header = [0u8; HEADER_LEN];
        file.read_exact_at(&mut header, 0)
            .map_err(MicroVmError::Stats)?;
        let name_size = le_u32(&header, 4) as usize;
        let num_desc = le_u32(&header, 8) as usize;
        let desc_offset = u64::from(le_u32(&header, 16));
        let data_offset = u64::from(le_u32(&header, 20));
        let desc_len = DESC_FIXED_LEN + name_size;
        if name_size == 0 || name_size > MAX_NAME || num_desc > MAX_DESCRIPTORS {
            return Err(bad("implausible header"));
        }
        let mut descs = vec![0u8; desc_len * num_desc];
        file.read_exact_at(&mut descs, desc_offset)
            .map_err(MicroVmError::Stats)?;
        let counters = descs
            .chunks_exact(desc_len)
            .filter(|d| {
                let ty = le_u32(d, 0) & TYPE_MASK;
                ty < TYPE_HISTOGRAM_MIN && le_u16(d, 6) == 1
            })
            .map(|d| {
                let name = &d[DESC_FIXED_LEN..];
                let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
                Counter {
                    name: String::from_utf8_lossy(&name[..end]).into_owned(),
                    offset: data_offset + u64::from(le_u32(d, 8)),
                }
            })
            .collect();
        Ok(VcpuStats { file, counters })
    }

    /// Reads every counter now.
    pub fn snapshot(&self) -> Result<Snapshot, MicroVmError> {
        let mut out = Vec::with_capacity(self.counters.len());
        for c in &self.counters {
            let mut v = [0u8; 8];
            self.file
                .read_exact_at(&mut v, c.offset)
                .map_err(MicroVmError::Stats)?;
            out.push((c.name.clone(), u64::from_le_bytes(v)));
        }
        Ok(Snapshot(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A statistics file in KVM's layout: header, id, descriptors, data.
    fn stats_file(counters: &[(&str, u32, u16, &[u64])]) -> File {
        const NAME: usize = 48;
        let id_offset = HEADER_LEN;
        let desc_offset = id_offset + NAME;
        let desc_len = DESC_FIXED_LEN + NAME;
        let data_offset = desc_offset + desc_len * counters.len();
        let mut header = Vec::new();
        for w in [0, NAME, counters.len(), id_offset, desc_offset, data_offset] {
            header.extend_from_slice(&(w as u32).to_le_bytes());
        }
        header.extend_from_slice(&[0u8; NAME]);
        let mut data = Vec::new();
        for &(name, flags, size, values) in counters {
            header.extend_from_slice(&flags.to_le_bytes());
            header.extend_from_slice(&0i16.to_le_bytes());
            header.extend_from_slice(&size.to_le_bytes());
            header.extend_from_slice(&(data.len() as u32).to_le_bytes());
            header.extend_from_slice(&0u32.to_le_bytes());
            let mut n = [0u8; NAME];
            n[..name.len()].copy_from_slice(name.as_bytes());
            header.extend_from_slice(&n);
            for v in values {
                data.extend_from_slice(&v.to_le_bytes());
            }
        }
        let mut f = tempfile();
        f.write_all(&header).expect("write header");
        f.write_all(&data).expect("write data");
        f
    }

    fn tempfile() -> File {
        let name = c"svnic-stats-test";
        // SAFETY: memfd_create reads a valid C string and returns a new descriptor or -1.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: a fresh descriptor nobody else owns.
        unsafe { File::from_raw_fd(fd) }
    }

    #[test]
    fn exit_counts_split_the_kernel_exits_by_kind() {
        let s = Snapshot(vec![
            ("exits".into(), 1030),
            ("mmio_exits".into(), 1),
            ("irq_exits".into(), 17),
            ("pf_fixed".into(), 12),
            ("insn_emulation".into(), 1001),
        ]);
        let c = ExitCounts::from_snapshot(&s);
        assert_eq!(
            c,
            ExitCounts {
                user_space: 1,
                in_kernel: 1029,
                irq: 17,
                halt: 0,
                page_faults: 12,
                other: 1000,
                emulated: 1001,
            }
        );
        // Port exits go to the VMM as well.
        let with_io = Snapshot(vec![
            ("exits".into(), 1030),
            ("mmio_exits".into(), 1),
            ("io_exits".into(), 29),
            ("irq_exits".into(), 17),
        ]);
        let io = ExitCounts::from_snapshot(&with_io);
        assert_eq!((io.user_space, io.in_kernel, io.other), (30, 1000, 983));
        let p = c.per_message(1000);
        assert_eq!(
            p,
            PerMessage {
                user_space: 0.001,
                in_kernel: 1.029,
                irq: 0.017,
                halt: 0.0,
                page_faults: 0.012,
                other: 1.0,
                emulated: 1.001,
            }
        );
        assert_eq!(c.per_message(0), PerMessage::default());
        let line = c.describe_per_message(1000);
        assert!(
            line.contains("0.001 user-space exits, 1.029 in-kernel exits (0.017 host interrupts")
                && line.contains("0.012 page faults, 1.000 other), 1.001 emulated"),
            "{line}"
        );
    }

    #[test]
    fn counters_are_read_by_name_and_histograms_skipped() {
        // Types: 0 cumulative, 1 instant, 3 linear histogram (skipped).
        let f = stats_file(&[
            ("exits", 0, 1, &[7]),
            ("histogram", 3, 2, &[1, 2]),
            ("mmio_exits", 0, 1, &[3]),
            ("halt_poll_ns", 1, 1, &[9]),
        ]);
        let s = VcpuStats::from_file(f).expect("parse");
        let snap = s.snapshot().expect("read");
        assert_eq!(
            snap,
            Snapshot(vec![
                ("exits".into(), 7),
                ("mmio_exits".into(), 3),
                ("halt_poll_ns".into(), 9)
            ])
        );
    }

    #[test]
    fn since_subtracts_by_name_and_exits_keeps_nonzero_exit_counters() {
        let a = Snapshot(vec![("exits".into(), 10), ("mmio_exits".into(), 2)]);
        let b = Snapshot(vec![
            ("exits".into(), 13),
            ("mmio_exits".into(), 2),
            ("insn_emulation".into(), 5),
            ("halt_wakeup".into(), 9),
        ]);
        let d = b.since(&a);
        assert_eq!(d.get("exits"), Some(3));
        assert_eq!(d.get("mmio_exits"), Some(0));
        assert_eq!(d.get("insn_emulation"), Some(5));
        assert_eq!(
            d.exits(),
            vec![("exits".to_string(), 3), ("insn_emulation".to_string(), 5)]
        );
    }
}
