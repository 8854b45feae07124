//! The mmap rings of a TPACKET_V2 socket: their geometry ([`RingLayout`]), the shared mapping
//! ([`RingMapping`]) and per-slot access with the kernel's ownership protocol ([`Ring`]).
//!
//! Every slot starts with a `tpacket2_hdr` whose `tp_status` says who owns it. RX: the kernel
//! fills a slot owned by it (TP_STATUS_KERNEL), then publishes it with TP_STATUS_USER after a
//! write barrier; user space reads it after an Acquire load of the status and hands it back
//! with a Release store of TP_STATUS_KERNEL once done with its bytes. TX: user space fills a
//! TP_STATUS_AVAILABLE slot and publishes it with a Release store of
//! TP_STATUS_SEND_REQUEST; the kernel sets it back to AVAILABLE once the frame is gone. Both
//! sides walk a ring in slot order, so one head index per ring is enough.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// Slot alignment the kernel requires (TPACKET_ALIGNMENT).
pub(super) const SLOT_ALIGN: usize = 16;
/// Size of the V2 slot header with the sockaddr_ll after it (TPACKET2_HDRLEN).
pub(super) const HDR_LEN: usize = libc::TPACKET2_HDRLEN;
/// Offset of the sockaddr_ll in a slot: after the header, aligned.
pub(super) const SLL_OFFSET: usize = align(std::mem::size_of::<libc::tpacket2_hdr>());
/// Where the frame starts in an RX slot: the kernel puts the network header at
/// `align(HDR_LEN + 16)` and the 14-byte Ethernet header right before it (`tpacket_rcv`).
pub(super) const RX_FRAME_OFFSET: usize = align(HDR_LEN + 16) - ETH_HLEN;
/// Where the frame starts in a TX slot (`HDR_LEN` minus the sockaddr_ll, `tpacket_fill_skb`).
pub(super) const TX_FRAME_OFFSET: usize = HDR_LEN - std::mem::size_of::<libc::sockaddr_ll>();
/// Ethernet header length.
pub(super) const ETH_HLEN: usize = 14;
/// Frames per ring block aimed at: few enough that a small ring is not rounded up much, many
/// enough that the block's page rounding wastes little.
const FRAMES_PER_BLOCK_TARGET: usize = 16;

pub(super) const fn align(n: usize) -> usize {
    (n + SLOT_ALIGN - 1) & !(SLOT_ALIGN - 1)
}

/// The geometry of one ring: `blocks` blocks of `block_size` bytes (a page multiple), each
/// holding `frames_per_block` slots of `frame_size` bytes; slots never straddle blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RingLayout {
    pub frame_size: usize,
    pub block_size: usize,
    pub blocks: usize,
    pub frames_per_block: usize,
}

impl RingLayout {
    /// The smallest layout with at least `frames` slots of `frame_size` bytes (a multiple of
    /// 16, not zero) on pages of `page_size` bytes. None when it would not fit the kernel's
    /// 32-bit fields.
    pub fn new(frame_size: usize, frames: usize, page_size: usize) -> Option<Self> {
        if frame_size == 0 || frame_size % SLOT_ALIGN != 0 || frames == 0 || page_size == 0 {
            return None;
        }
        let target = frames.min(FRAMES_PER_BLOCK_TARGET);
        let block_size = frame_size
            .checked_mul(target)?
            .div_ceil(page_size)
            .checked_mul(page_size)?;
        let frames_per_block = block_size / frame_size;
        let blocks = frames.div_ceil(frames_per_block);
        // Every product `frames()` and `bytes()` compute is checked here, once.
        u32::try_from(blocks.checked_mul(frames_per_block)?).ok()?;
        u32::try_from(block_size).ok()?;
        blocks.checked_mul(block_size)?;
        Some(RingLayout {
            frame_size,
            block_size,
            blocks,
            frames_per_block,
        })
    }

    /// Number of slots.
    pub fn frames(&self) -> usize {
        self.blocks * self.frames_per_block
    }

    /// Bytes the ring takes in the mapping.
    pub fn bytes(&self) -> usize {
        self.blocks * self.block_size
    }

    /// Offset of slot `slot` (< `frames()`) from the ring's start.
    pub fn slot_offset(&self, slot: usize) -> usize {
        (slot / self.frames_per_block) * self.block_size
            + (slot % self.frames_per_block) * self.frame_size
    }

    /// The request for PACKET_RX_RING / PACKET_TX_RING (`new` checked every field fits).
    pub fn request(&self) -> libc::tpacket_req {
        libc::tpacket_req {
            tp_block_size: self.block_size as libc::c_uint,
            tp_block_nr: self.blocks as libc::c_uint,
            tp_frame_size: self.frame_size as libc::c_uint,
            tp_frame_nr: self.frames() as libc::c_uint,
        }
    }
}

/// The kernel's ring memory mapped into this process (RX ring then TX ring), unmapped on drop.
#[derive(Debug)]
pub(super) struct RingMapping {
    base: NonNull<u8>,
    len: usize,
}

impl RingMapping {
    /// Maps the `len` bytes of rings configured on socket `fd`.
    pub fn new(fd: libc::c_int, len: usize) -> io::Result<Self> {
        // SAFETY: a fresh shared mapping chosen by the kernel (no address hint), backed by the
        // socket's ring pages; nothing else in this process is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(RingMapping { base, len })
    }

    /// The ring of `layout` at byte `offset` of the mapping (`offset + layout.bytes()` must
    /// not exceed the mapping: the caller derives both from the same layouts).
    pub fn ring(&self, offset: usize, layout: RingLayout) -> Option<Ring> {
        if offset.checked_add(layout.bytes())? > self.len {
            return None;
        }
        // SAFETY: `offset` lies within the mapping (checked above), so the result stays in
        // the same allocation.
        let base = unsafe { self.base.as_ptr().add(offset) };
        Some(Ring {
            base,
            layout,
            head: 0,
        })
    }
}

impl Drop for RingMapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly what mmap returned; the `Ring`s pointing into the
        // mapping belong to the same socket and are dropped with it, never used after this.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// One ring inside a [`RingMapping`], walked from `head`.
#[derive(Debug)]
pub(super) struct Ring {
    base: *mut u8,
    layout: RingLayout,
    head: usize,
}

/// The fields of an RX slot header the receive path uses, read after the status.
#[derive(Debug, Clone, Copy)]
pub(super) struct RxHeader {
    pub len: usize,
    pub snaplen: usize,
    pub mac: usize,
    pub vlan_tci: u16,
    pub vlan_tpid: u16,
    pub pkttype: u8,
}

impl Ring {
    pub fn layout(&self) -> RingLayout {
        self.layout
    }

    /// The slot the ring's walk is at.
    pub fn head(&self) -> usize {
        self.head
    }

    /// Moves the walk to the next slot.
    pub fn advance(&mut self) {
        self.head = (self.head + 1) % self.layout.frames();
    }

    /// The slot `n` places before the head (modulo the ring).
    pub fn slot_before_head(&self, n: usize) -> usize {
        let frames = self.layout.frames();
        (self.head + frames - n % frames) % frames
    }

    /// The address of slot `slot` (taken modulo the ring), inside the mapping.
    fn slot_ptr(&self, slot: usize) -> *mut u8 {
        self.base
            .wrapping_add(self.layout.slot_offset(slot % self.layout.frames()))
    }

    fn status_word(&self, slot: usize) -> &AtomicU32 {
        // SAFETY: `tp_status` is the first field of the slot header, a u32 at a 16-byte
        // aligned address inside the mapping (`slot_ptr`), which outlives `self`'s borrow.
        // The kernel writes it concurrently, which is why it is only accessed as an atomic.
        unsafe { AtomicU32::from_ptr(self.slot_ptr(slot).cast()) }
    }

    /// The slot's status, Acquire: after seeing the status that hands a slot to user space,
    /// the kernel's writes of the header and frame before it are visible.
    pub fn status(&self, slot: usize) -> u32 {
        self.status_word(slot).load(Ordering::Acquire)
    }

    /// Sets the slot's status, Release: every read and write of the slot before it happens
    /// before the kernel sees the new owner.
    pub fn set_status(&self, slot: usize, status: u32) {
        self.status_word(slot).store(status, Ordering::Release)
    }

    /// The header of RX slot `slot`.
    ///
    /// # Safety
    /// User space must own the slot: its status, read with [`Ring::status`], has
    /// TP_STATUS_USER and has not been handed back since.
    pub unsafe fn rx_header(&self, slot: usize) -> RxHeader {
        let p = self.slot_ptr(slot);
        // SAFETY: the slot header is a tpacket2_hdr at a 16-byte aligned address inside the
        // mapping; the kernel does not write a slot user space owns (caller's contract), and
        // the Acquire load of its status ordered this read after the kernel's writes.
        // Volatile: the memory is shared with the kernel.
        let hdr = unsafe { p.cast::<libc::tpacket2_hdr>().read_volatile() };
        // `sll_pkttype` is byte 10 of the sockaddr_ll the kernel writes at SLL_OFFSET.
        let pkttype_at = p.wrapping_add(SLL_OFFSET + 10);
        // SAFETY: that byte is inside the same owned slot (SLL_OFFSET + 10 < HDR_LEN).
        let pkttype = unsafe { pkttype_at.read_volatile() };
        RxHeader {
            len: hdr.tp_len as usize,
            snaplen: hdr.tp_snaplen as usize,
            mac: usize::from(hdr.tp_mac),
            vlan_tci: hdr.tp_vlan_tci,
            vlan_tpid: hdr.tp_vlan_tpid,
            pkttype,
        }
    }

    /// The `len` bytes at `offset` of slot `slot`; None when they would leave the slot.
    ///
    /// # Safety
    /// User space must own the slot (as for [`Ring::rx_header`]) for as long as the slice
    /// lives: the caller hands the slot back only after its last use.
    pub unsafe fn slot_bytes(&self, slot: usize, offset: usize, len: usize) -> Option<&[u8]> {
        if offset.checked_add(len)? > self.layout.frame_size {
            return None;
        }
        let start = self.slot_ptr(slot).wrapping_add(offset);
        // SAFETY: the range is inside the slot (checked above), hence inside the mapping,
        // and the kernel writes no slot user space owns, which the caller guarantees for the
        // slice's life: the bytes are initialised and do not change under the reference.
        Some(unsafe { std::slice::from_raw_parts(start, len) })
    }

    /// Copies `frame` into TX slot `slot` and records its length; the caller then publishes
    /// it with [`Ring::set_status`]`(TP_STATUS_SEND_REQUEST)`. False if it does not fit the
    /// slot.
    ///
    /// # Safety
    /// User space must own the slot: its status, read with [`Ring::status`], is
    /// TP_STATUS_AVAILABLE and it has not been published since.
    pub unsafe fn write_tx(&self, slot: usize, frame: &[u8]) -> bool {
        if TX_FRAME_OFFSET + frame.len() > self.layout.frame_size {
            return false;
        }
        let p = self.slot_ptr(slot);
        let data = p.wrapping_add(TX_FRAME_OFFSET);
        // SAFETY: the destination is inside the slot (checked above) and the slot belongs to
        // user space (caller's contract), so the kernel neither reads nor writes it now;
        // `frame` is ordinary memory, not the mapping's slot.
        unsafe { std::ptr::copy_nonoverlapping(frame.as_ptr(), data, frame.len()) };
        let tp_len = p
            .wrapping_add(std::mem::offset_of!(libc::tpacket2_hdr, tp_len))
            .cast::<u32>();
        // SAFETY: `tp_len` is an aligned u32 field of the owned slot's header; the Release
        // status store that follows publishes it.
        unsafe { tp_len.write_volatile(frame.len() as u32) };
        true
    }
}

#[cfg(test)]
mod tests;
