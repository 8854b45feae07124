//! VM setup: the memslot, identity page tables and the registers of 64-bit user mode.
//!
//! The shape is the smallest one this host's paravirtual KVM runs natively: one memslot at
//! guest-physical 0 from a `MAP_SHARED` mapping; the first GiB identity mapped with 2 MiB pages,
//! the user bit set at every level; long mode with paging (`cr0`, `cr4.PAE`, `efer.LME|LMA`);
//! code and data segments of privilege level 3. Addresses of the first GiB past the end of the
//! memory are mapped too, so a store there reaches KVM as an MMIO exit (not a page fault):
//! [`EXIT_GPA`] is such an address.

use std::sync::Arc;

use kvm_bindings::{kvm_regs, kvm_segment, kvm_userspace_memory_region};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use svnic_host_frontend::virtio_user::MemfdMemory;
use vm_memory::{AtomicAccess, Bytes, GuestAddress};

use crate::error::MicroVmError;

/// Guest page size.
pub const PAGE: u64 = 4096;
/// Size of the identity-mapped range (one page directory of 2 MiB pages).
pub const MAPPED: u64 = 1 << 30;
/// The address the guest programs store to when they are done: the last page of the mapped
/// range, never part of the memslot.
pub const EXIT_GPA: u64 = MAPPED - PAGE;
/// The doorbell address: a store there signals the ioeventfd the launcher registers (an
/// in-kernel exit). In the same unbacked 2 MiB page as [`EXIT_GPA`].
pub const DOORBELL_GPA: u64 = MAPPED - 2 * PAGE;
/// The VMM-mediated path's register page: every access is an exit to the VMM.
pub const MEDIATE_GPA: u64 = MAPPED - 3 * PAGE;
/// Largest guest memory: the mapped range less the 2 MiB page holding [`EXIT_GPA`].
pub const MAX_MEMORY: u64 = MAPPED - (2 << 20);

/// Page-table entry bits: present, writable, user.
const PTE_PUW: u64 = 0x7;
/// A page-directory entry mapping a 2 MiB page (present, writable, user, page size).
const PDE_2M: u64 = 0x87;
/// cr0: paging, cache disable, not write-through, extension type, protection enable.
const CR0: u64 = 0xe000_0011;
/// cr4: physical address extension.
const CR4_PAE: u64 = 0x20;
/// efer: long mode enabled and active.
const EFER_LME_LMA: u64 = 0x500;
/// rflags: the always-one bit only (interrupts off).
const RFLAGS: u64 = 0x2;

/// The privilege level the vCPU starts at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privilege {
    /// CPL3, guest user mode: what the guest programs run at (native on this host's KVM).
    User,
    /// CPL0, guest kernel mode (only the detection probe uses it).
    Kernel,
}

/// A VM with one vCPU whose memory is `memory`, set up for 64-bit user mode.
#[derive(Debug)]
pub struct MicroVm {
    // Declared (and so dropped) before `memory`: the memslot refers to its mapping.
    vcpu: VcpuFd,
    vm: VmFd,
    stack_top: u64,
    memory: Arc<MemfdMemory>,
}

impl MicroVm {
    /// Creates the VM, registers all of `memory` as memslot 0 at guest-physical 0, builds the
    /// page tables and a stack page in it (from its allocator), and creates vCPU 0 in user mode.
    pub fn new(kvm: &Kvm, memory: Arc<MemfdMemory>) -> Result<Self, MicroVmError> {
        Self::with_privilege(kvm, memory, Privilege::User)
    }

    /// [`MicroVm::new`] with the vCPU starting at `privilege`.
    pub fn with_privilege(
        kvm: &Kvm,
        memory: Arc<MemfdMemory>,
        privilege: Privilege,
    ) -> Result<Self, MicroVmError> {
        let size = memory.size();
        if size > MAX_MEMORY {
            return Err(MicroVmError::MemoryTooLarge {
                size,
                max: MAX_MEMORY,
            });
        }
        let vm = kvm.create_vm().map_err(MicroVmError::kvm("create VM"))?;
        let region = kvm_userspace_memory_region {
            slot: 0,
            flags: 0,
            guest_phys_addr: 0,
            memory_size: size,
            userspace_addr: memory.host_address(0)?,
        };
        // SAFETY: the region is the whole shared mapping of `memory`, which this MicroVm keeps
        // alive (the `memory` field is dropped after `vm`, so the slot never outlives the
        // mapping); KVM only reads and writes guest memory through it.
        unsafe { vm.set_user_memory_region(region) }
            .map_err(MicroVmError::kvm("set user memory region"))?;
        let pml4 = memory.alloc(PAGE, PAGE)?;
        let pdpt = memory.alloc(PAGE, PAGE)?;
        let pd = memory.alloc(PAGE, PAGE)?;
        let stack = memory.alloc(PAGE, PAGE)?;
        write(&memory, pml4, &(pdpt | PTE_PUW).to_le_bytes())?;
        write(&memory, pdpt, &(pd | PTE_PUW).to_le_bytes())?;
        let entries: Vec<u8> = (0..512u64)
            .flat_map(|i| ((i << 21) | PDE_2M).to_le_bytes())
            .collect();
        write(&memory, pd, &entries)?;
        let vcpu = vm
            .create_vcpu(0)
            .map_err(MicroVmError::kvm("create vCPU"))?;
        let mut sregs = vcpu.get_sregs().map_err(MicroVmError::kvm("get sregs"))?;
        sregs.cr0 = CR0;
        sregs.cr3 = pml4;
        sregs.cr4 = CR4_PAE;
        sregs.efer = EFER_LME_LMA;
        // Selectors: GDT index 1 (kernel) or 3 (user) for code, 2 or 4 for data, with the RPL.
        let (code_sel, data_sel, dpl) = match privilege {
            Privilege::User => (0x1b, 0x23, 3),
            Privilege::Kernel => (0x08, 0x10, 0),
        };
        sregs.cs = segment(code_sel, 0xb, 1, dpl);
        let data = segment(data_sel, 0x3, 0, dpl);
        sregs.ds = data;
        sregs.es = data;
        sregs.fs = data;
        sregs.gs = data;
        sregs.ss = data;
        vcpu.set_sregs(&sregs)
            .map_err(MicroVmError::kvm("set sregs"))?;
        Ok(MicroVm {
            vcpu,
            vm,
            stack_top: stack + PAGE,
            memory,
        })
    }

    /// Copies `code` into freshly allocated guest pages; returns its guest-physical address.
    pub fn load(&self, code: &[u8]) -> Result<u64, MicroVmError> {
        let len = (code.len() as u64).max(1);
        let gpa = self.memory.alloc(len, PAGE)?;
        write(&self.memory, gpa, code)?;
        Ok(gpa)
    }

    /// Allocates one zeroed page of guest memory.
    pub fn alloc_page(&self) -> Result<u64, MicroVmError> {
        Ok(self.memory.alloc(PAGE, PAGE)?)
    }

    /// Sets the vCPU to start at `rip` with `rdi, rsi, rdx` = `args` and the stack page's top
    /// in `rsp`.
    pub fn set_entry(&self, rip: u64, args: [u64; 3]) -> Result<(), MicroVmError> {
        let regs = kvm_regs {
            rip,
            rsp: self.stack_top,
            rdi: args[0],
            rsi: args[1],
            rdx: args[2],
            rflags: RFLAGS,
            ..Default::default()
        };
        self.vcpu
            .set_regs(&regs)
            .map_err(MicroVmError::kvm("set regs"))
    }

    /// The vCPU (to run it, or read its statistics).
    pub fn vcpu_mut(&mut self) -> &mut VcpuFd {
        &mut self.vcpu
    }

    /// The VM.
    pub fn vm(&self) -> &VmFd {
        &self.vm
    }

    /// The guest memory.
    pub fn memory(&self) -> &Arc<MemfdMemory> {
        &self.memory
    }
}

/// A flat 4 GiB segment of privilege level `dpl`: code (`long` = 1) or data.
fn segment(selector: u16, type_: u8, long: u8, dpl: u8) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_,
        present: 1,
        dpl,
        db: 1 - long,
        s: 1,
        l: long,
        g: 1,
        ..Default::default()
    }
}

/// Writes `bytes` to the guest memory at `gpa`.
pub fn write(memory: &MemfdMemory, gpa: u64, bytes: &[u8]) -> Result<(), MicroVmError> {
    memory
        .guest_memory()
        .write_slice(bytes, GuestAddress(gpa))
        .map_err(|e| MicroVmError::Access {
            addr: gpa,
            why: e.to_string(),
        })
}

/// Reads the aligned word at `gpa` (a single load, so it may run while the guest writes it).
pub fn load<T: AtomicAccess>(memory: &MemfdMemory, gpa: u64) -> Result<T, MicroVmError> {
    memory
        .guest_memory()
        .load::<T>(GuestAddress(gpa), std::sync::atomic::Ordering::Acquire)
        .map_err(|e| MicroVmError::Access {
            addr: gpa,
            why: e.to_string(),
        })
}

/// Stores `value` to the aligned word at `gpa` (a single release store).
pub fn store<T: AtomicAccess>(
    memory: &MemfdMemory,
    gpa: u64,
    value: T,
) -> Result<(), MicroVmError> {
    memory
        .guest_memory()
        .store(
            value,
            GuestAddress(gpa),
            std::sync::atomic::Ordering::Release,
        )
        .map_err(|e| MicroVmError::Access {
            addr: gpa,
            why: e.to_string(),
        })
}
