//! `fi_getinfo` for the svnic provider: matching the hints, and building the `fi_info` list.
//!
//! Everything in a returned list is released by libfabric with `free()`, so every piece is
//! allocated with libc (`calloc`, `strdup`), never with Rust's allocator; `nic`, `handle`,
//! `fabric_attr->prov_name` and the versions are left for libfabric to fill. getinfo never
//! connects to anything: it is called by `fi_info`, by utility providers and by MPI probes, often
//! several times per run.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int};

use crate::addr::{self, ADDR_LEN};
use crate::config::Config;
use crate::ffi::errno::*;
use crate::ffi::*;
use crate::{guard, put, API_VERSION};

/// The capabilities of the DGRAM core.
pub const CAPS: u64 =
    caps::FI_MSG | caps::FI_SEND | caps::FI_RECV | caps::FI_LOCAL_COMM | caps::FI_REMOTE_COMM;
/// The capabilities of the RDM endpoint.
pub const RDM_CAPS: u64 = CAPS | caps::FI_TAGGED | caps::FI_DIRECTED_RECV;
/// `domain_attr->cq_data_size` of the RDM endpoint (remote CQ data in its header).
pub const RDM_CQ_DATA_SIZE: usize = 8;
/// `ep_attr->protocol`: provider specific, svnic channels.
pub const PROTOCOL: u32 = FI_PROV_SPECIFIC | 1;
/// `ep_attr->protocol` of the entries given to a utility provider that layers on the DGRAM core
/// (ofi_rxd): the same channels, with send failures completed as dropped datagrams
/// ([`crate::errors::Delivery::UnderReliableLayer`]).
pub const PROTOCOL_LAYERED: u32 = FI_PROV_SPECIFIC | 2;
/// The `fi_getinfo` flag with which libfabric 1.17's utility providers ask for core providers
/// (`OFI_CORE_PROV_ONLY`, include/ofi.h; libfabric-internal, hence pinned to 1.17 here).
pub const OFI_CORE_PROV_ONLY: u64 = 1 << 59;
/// `ep_attr->protocol_version`: the channel ABI version.
pub const PROTOCOL_VERSION: u32 = 2;
/// Largest payload sent inline (one user-data message): `tx_attr->inject_size`.
pub const INJECT_SIZE: usize = svnic_channels::message::INLINE_CAPACITY;
/// Sends in flight per endpoint (`tx_attr->size`).
pub const TX_SIZE: usize = 128;
/// Posted receives per endpoint (`rx_attr->size`).
pub const RX_SIZE: usize = 1024;
/// Scatter/gather entries per operation (`iov_limit`).
pub const IOV_LIMIT: usize = 4;
/// Names of the fabric and of the domain.
pub const FABRIC_NAME: &CStr = c"svnic";

/// Entry point of `struct fi_provider`.
pub(crate) unsafe extern "C" fn svnic_getinfo(
    version: u32,
    node: *const c_char,
    service: *const c_char,
    flags: u64,
    hints: *const FiInfo,
    info: *mut *mut FiInfo,
) -> c_int {
    guard("getinfo", || {
        if info.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: libfabric passes NULL or a valid fi_info that outlives the call.
        let hints = unsafe { hints.as_ref() };
        // SAFETY: getinfo only reads the hints' attribute pointers when non-NULL.
        match unsafe { getinfo(version, node, service, flags, hints) } {
            Ok(list) => {
                // SAFETY: checked non-NULL above.
                unsafe { put(info, list) };
                0
            }
            Err(e) => -e,
        }
    })
}

/// Why a hint does not match (logged at debug level), as `Err(FI_ENODATA)`.
fn no_match(why: &str) -> Result<*mut FiInfo, c_int> {
    log::debug!("svnic getinfo: no match: {why}");
    Err(FI_ENODATA)
}

/// `fi_getinfo` as the provider answers it: the RDM entry then the DGRAM one (those the hints
/// match), or a positive errno. A utility provider (ofi_rxd, which asks with
/// [`OFI_CORE_PROV_ONLY`]) gets the DGRAM entry only with `FI_SVNIC_RXD=1`: libfabric 1.17 lists
/// built-in providers before external ones, so `svnic;ofi_rxd` would come before the native RDM
/// entry and be what `fi_pingpong -p svnic -e rdm` and Open MPI take.
///
/// # Safety
/// `hints`, if present, must be a valid `fi_info` whose non-NULL pointers are valid.
pub unsafe fn getinfo(
    version: u32,
    node: *const c_char,
    service: *const c_char,
    flags: u64,
    hints: Option<&FiInfo>,
) -> Result<*mut FiInfo, c_int> {
    if version > API_VERSION {
        return no_match("API version newer than 1.17");
    }
    if !node.is_null() || !service.is_null() {
        return no_match("node/service given (svnic addresses come from fi_getname)");
    }
    let cfg = Config::from_env();
    let layered = flags & OFI_CORE_PROV_ONLY != 0;
    if layered && !cfg.rxd {
        return no_match("a utility provider (FI_SVNIC_RXD=1 offers the DGRAM core to ofi_rxd)");
    }
    let types: &[c_int] = if layered {
        &[FI_EP_DGRAM]
    } else {
        &[FI_EP_RDM, FI_EP_DGRAM]
    };
    let mut entries = Vec::with_capacity(types.len());
    let mut why = "";
    for &t in types {
        let mut out = Defaults::new(&cfg, t);
        if layered {
            out.protocol = PROTOCOL_LAYERED;
        }
        if let Some(h) = hints {
            // SAFETY: the caller guarantees the hints' pointers.
            if let Err(w) = unsafe { out.apply_hints(h) } {
                why = w;
                continue;
            }
        }
        entries.push(out);
    }
    if entries.is_empty() {
        return no_match(why);
    }
    let mut list: *mut FiInfo = std::ptr::null_mut();
    for out in entries.iter().rev() {
        match out.build() {
            Ok(i) => {
                // SAFETY: `i` is the fresh entry just built, not yet shared.
                unsafe { (*i).next = list };
                list = i;
            }
            Err(e) => {
                // SAFETY: built by this function, with libc only.
                unsafe { free_info(list) };
                return Err(e);
            }
        }
    }
    Ok(list)
}

/// The attributes of the one entry, tailored to the hints before it is allocated.
struct Defaults {
    /// `FI_EP_RDM` or `FI_EP_DGRAM`.
    ep_type: c_int,
    caps: u64,
    /// [`PROTOCOL`], or [`PROTOCOL_LAYERED`] for a utility provider.
    protocol: u32,
    max_msg_size: usize,
    av_type: c_int,
    threading: c_int,
    tx_op_flags: u64,
    rx_op_flags: u64,
    tx_size: usize,
    rx_size: usize,
    tx_iov: usize,
    rx_iov: usize,
    inject_size: usize,
    src_addr: Option<[u8; ADDR_LEN]>,
    dest_addr: Option<[u8; ADDR_LEN]>,
}

/// A C string attribute of the hints, if set.
///
/// # Safety
/// `p` must be NULL or a NUL-terminated string.
unsafe fn hint_name<'a>(p: *const c_char) -> Option<&'a CStr> {
    // SAFETY: per the contract above.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) })
}

/// An address of the hints: absent, or exactly one svnic address.
///
/// # Safety
/// `p` must be NULL or readable for `len` bytes.
unsafe fn hint_addr(p: *const u8, len: usize) -> Result<Option<[u8; ADDR_LEN]>, &'static str> {
    if p.is_null() {
        return Ok(None);
    }
    if len != ADDR_LEN {
        return Err("address length is not 16");
    }
    // SAFETY: per the contract above.
    let b = unsafe { std::slice::from_raw_parts(p, len) };
    if addr::decode(b).is_none() {
        return Err("not an svnic address");
    }
    let mut a = [0u8; ADDR_LEN];
    a.copy_from_slice(b);
    Ok(Some(a))
}

impl Defaults {
    fn new(cfg: &Config, ep_type: c_int) -> Defaults {
        let rdm = ep_type == FI_EP_RDM;
        Defaults {
            ep_type,
            caps: if rdm { RDM_CAPS } else { CAPS },
            protocol: PROTOCOL,
            // An RDM message may travel in parts of a bounce buffer each.
            max_msg_size: if rdm {
                cfg.rdm_max_msg_size()
            } else {
                cfg.max_msg_size
            },
            av_type: FI_AV_UNSPEC,
            threading: FI_THREAD_SAFE,
            tx_op_flags: 0,
            rx_op_flags: 0,
            tx_size: TX_SIZE,
            rx_size: RX_SIZE,
            tx_iov: IOV_LIMIT,
            rx_iov: IOV_LIMIT,
            inject_size: if rdm {
                INJECT_SIZE - crate::rdm::HEADER_MAX
            } else {
                INJECT_SIZE
            },
            src_addr: None,
            dest_addr: None,
        }
    }

    /// Checks the hints against what svnic offers and tailors the entry to them (the rules of
    /// libfabric's own `ofi_check_info` / `ofi_alter_info`). Unknown `flags`/mode bits are
    /// ignored; every attribute pointer may be NULL.
    ///
    /// # Safety
    /// Every non-NULL pointer of `h` must be valid.
    unsafe fn apply_hints(&mut self, h: &FiInfo) -> Result<(), &'static str> {
        if h.caps & !self.caps != 0 {
            return Err("capabilities svnic does not offer (for this endpoint type)");
        }
        if h.caps != 0 && h.caps & caps::FI_DIRECTED_RECV == 0 {
            // Receives ignore their source address unless the application asks.
            self.caps &= !caps::FI_DIRECTED_RECV;
        }
        if h.addr_format != FI_FORMAT_UNSPEC {
            return Err("address format other than FI_FORMAT_UNSPEC");
        }
        // SAFETY: the caller guarantees the pointers and their lengths.
        self.src_addr = unsafe { hint_addr(h.src_addr as *const u8, h.src_addrlen) }?;
        // SAFETY: as above.
        self.dest_addr = unsafe { hint_addr(h.dest_addr as *const u8, h.dest_addrlen) }?;
        // SAFETY: NULL or valid, per the caller.
        if let Some(f) = unsafe { h.fabric_attr.as_ref() } {
            // SAFETY: NULL or a C string.
            if unsafe { hint_name(f.name) }.is_some_and(|n| n != FABRIC_NAME) {
                return Err("another fabric name");
            }
        }
        // SAFETY: NULL or valid, per the caller.
        if let Some(d) = unsafe { h.domain_attr.as_ref() } {
            // SAFETY: NULL or a C string.
            if unsafe { hint_name(d.name) }.is_some_and(|n| n != FABRIC_NAME) {
                return Err("another domain name");
            }
            if d.data_progress == FI_PROGRESS_AUTO {
                return Err("automatic data progress (svnic progresses in CQ reads)");
            }
            if d.cq_data_size > self.cq_data_size() {
                return Err("remote CQ data (larger than the endpoint type offers)");
            }
            match d.av_type {
                FI_AV_UNSPEC => {}
                FI_AV_MAP | FI_AV_TABLE => self.av_type = d.av_type,
                _ => return Err("unknown AV type"),
            }
            if d.threading != FI_THREAD_UNSPEC {
                self.threading = d.threading;
            }
        }
        // SAFETY: NULL or valid, per the caller.
        if let Some(e) = unsafe { h.ep_attr.as_ref() } {
            if e.type_ != FI_EP_UNSPEC && e.type_ != self.ep_type {
                return Err("another endpoint type");
            }
            if e.max_msg_size > self.max_msg_size {
                return Err("max_msg_size above FI_SVNIC_MAX_MSG_SIZE");
            }
            match e.protocol {
                0 => {}
                PROTOCOL | PROTOCOL_LAYERED => self.protocol = e.protocol,
                _ => return Err("another protocol"),
            }
        }
        // SAFETY: NULL or valid, per the caller.
        if let Some(t) = unsafe { h.tx_attr.as_ref() } {
            if t.size > self.tx_size
                || t.iov_limit > self.tx_iov
                || t.inject_size > self.inject_size
            {
                return Err("tx_attr above svnic's limits");
            }
            self.tx_op_flags = t.op_flags;
            take_hint(&mut self.tx_size, t.size);
            take_hint(&mut self.tx_iov, t.iov_limit);
            take_hint(&mut self.inject_size, t.inject_size);
        }
        // SAFETY: NULL or valid, per the caller.
        if let Some(r) = unsafe { h.rx_attr.as_ref() } {
            if r.size > self.rx_size || r.iov_limit > self.rx_iov || r.total_buffered_recv > 0 {
                return Err("rx_attr above svnic's limits");
            }
            self.rx_op_flags = r.op_flags;
            take_hint(&mut self.rx_size, r.size);
            take_hint(&mut self.rx_iov, r.iov_limit);
        }
        Ok(())
    }

    fn rdm(&self) -> bool {
        self.ep_type == FI_EP_RDM
    }

    fn cq_data_size(&self) -> usize {
        if self.rdm() {
            RDM_CQ_DATA_SIZE
        } else {
            0
        }
    }

    /// Allocates the entry (all with libc); on failure frees what was allocated.
    fn build(&self) -> Result<*mut FiInfo, c_int> {
        let info: *mut FiInfo = calloc()?;
        // SAFETY: `info` is a fresh zeroed allocation; on error it is freed with free_info,
        // which frees exactly the non-NULL pieces.
        match unsafe { self.fill(info) } {
            Ok(()) => Ok(info),
            Err(e) => {
                // SAFETY: built by calloc/strdup/malloc only.
                unsafe { free_info(info) };
                Err(e)
            }
        }
    }

    /// # Safety
    /// `info` must be a zeroed `FiInfo` allocated with libc.
    unsafe fn fill(&self, info: *mut FiInfo) -> Result<(), c_int> {
        // SAFETY: per the contract above.
        let i = unsafe { &mut *info };
        i.caps = self.caps;
        i.mode = 0;
        i.addr_format = FI_FORMAT_UNSPEC;
        if let Some(a) = self.src_addr {
            i.src_addr = malloc_copy(&a)?;
            i.src_addrlen = ADDR_LEN;
        }
        if let Some(a) = self.dest_addr {
            i.dest_addr = malloc_copy(&a)?;
            i.dest_addrlen = ADDR_LEN;
        }
        // SAFETY: a C attribute struct (integers and pointers).
        let tx = unsafe { calloc_into(&mut i.tx_attr) }?;
        let order = if self.rdm() { FI_ORDER_SAS } else { 0 };
        tx.caps = self.caps & (caps::FI_MSG | caps::FI_TAGGED | caps::FI_SEND);
        tx.msg_order = order;
        tx.op_flags = self.tx_op_flags;
        tx.inject_size = self.inject_size;
        tx.size = self.tx_size;
        tx.iov_limit = self.tx_iov;
        // SAFETY: a C attribute struct (integers and pointers).
        let rx = unsafe { calloc_into(&mut i.rx_attr) }?;
        rx.caps =
            self.caps & (caps::FI_MSG | caps::FI_TAGGED | caps::FI_RECV | caps::FI_DIRECTED_RECV);
        rx.msg_order = order;
        rx.op_flags = self.rx_op_flags;
        rx.size = self.rx_size;
        rx.iov_limit = self.rx_iov;
        // SAFETY: a C attribute struct (integers and pointers).
        let ep = unsafe { calloc_into(&mut i.ep_attr) }?;
        ep.type_ = self.ep_type;
        if self.rdm() {
            ep.mem_tag_format = FI_TAG_GENERIC;
        }
        ep.protocol = self.protocol;
        ep.protocol_version = PROTOCOL_VERSION;
        ep.max_msg_size = self.max_msg_size;
        ep.tx_ctx_cnt = 1;
        ep.rx_ctx_cnt = 1;
        // SAFETY: a C attribute struct (integers and pointers).
        let d = unsafe { calloc_into(&mut i.domain_attr) }?;
        d.name = strdup(FABRIC_NAME)?;
        d.threading = self.threading;
        d.control_progress = FI_PROGRESS_AUTO;
        d.data_progress = FI_PROGRESS_MANUAL;
        d.resource_mgmt = FI_RM_ENABLED;
        d.av_type = self.av_type;
        d.mr_mode = 0;
        d.cq_data_size = self.cq_data_size();
        d.mr_key_size = 8;
        d.cq_cnt = 256;
        d.ep_cnt = 64;
        d.tx_ctx_cnt = 64;
        d.rx_ctx_cnt = 64;
        d.max_ep_tx_ctx = 1;
        d.max_ep_rx_ctx = 1;
        d.mr_iov_limit = 1;
        d.caps = caps::FI_LOCAL_COMM | caps::FI_REMOTE_COMM;
        d.mr_cnt = 1 << 16;
        // SAFETY: a C attribute struct (integers and pointers).
        let f = unsafe { calloc_into(&mut i.fabric_attr) }?;
        f.name = strdup(FABRIC_NAME)?;
        Ok(())
    }
}

/// Takes a size or limit hint already checked against ours; 0 in a hint means "the provider's
/// choice" and keeps ours.
fn take_hint(ours: &mut usize, hint: usize) {
    if hint > 0 {
        *ours = hint;
    }
}

/// A zeroed libc allocation of one `T`, linked into `slot` (so that `free_info` frees it
/// whatever happens next), to be filled in.
///
/// # Safety
/// All-zero bytes must be a valid `T`.
unsafe fn calloc_into<'a, T>(slot: &mut *mut T) -> Result<&'a mut T, c_int> {
    let p: *mut T = calloc()?;
    *slot = p;
    // SAFETY: a fresh allocation of one T, zeroed, which the caller says is a valid T; the
    // entry being built owns it and nothing else refers to it yet.
    Ok(unsafe { &mut *p })
}

/// A zeroed libc allocation of one `T`.
fn calloc<T>() -> Result<*mut T, c_int> {
    // SAFETY: calloc has no preconditions; NULL is checked.
    let p = unsafe { libc::calloc(1, std::mem::size_of::<T>()) } as *mut T;
    if p.is_null() {
        Err(FI_ENOMEM)
    } else {
        Ok(p)
    }
}

fn strdup(s: &CStr) -> Result<*mut c_char, c_int> {
    // SAFETY: `s` is NUL-terminated; NULL is checked.
    let p = unsafe { libc::strdup(s.as_ptr()) };
    if p.is_null() {
        Err(FI_ENOMEM)
    } else {
        Ok(p)
    }
}

fn malloc_copy(b: &[u8]) -> Result<*mut std::os::raw::c_void, c_int> {
    // SAFETY: malloc has no preconditions; NULL is checked.
    let p = unsafe { libc::malloc(b.len()) };
    if p.is_null() {
        return Err(FI_ENOMEM);
    }
    // SAFETY: `p` holds b.len() bytes and does not overlap `b`.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), p as *mut u8, b.len()) };
    Ok(p)
}

/// Frees a list the way `fi_freeinfo` does (every piece with `free()`); for lists this crate
/// built (tests, error paths). NULL is allowed.
///
/// # Safety
/// `info` must be NULL or a list whose pieces were all allocated with libc, not used again.
pub unsafe fn free_info(mut info: *mut FiInfo) {
    use std::os::raw::c_void;
    while !info.is_null() {
        // SAFETY: per the contract above.
        let i = unsafe { &*info };
        let mut pieces: Vec<*mut c_void> = Vec::with_capacity(16);
        // SAFETY: NULL or valid attribute structs, per the contract above.
        if let Some(d) = unsafe { i.domain_attr.as_ref() } {
            pieces.extend([d.name.cast(), d.auth_key.cast()]);
        }
        // SAFETY: as above.
        if let Some(e) = unsafe { i.ep_attr.as_ref() } {
            pieces.push(e.auth_key.cast());
        }
        // SAFETY: as above.
        if let Some(f) = unsafe { i.fabric_attr.as_ref() } {
            pieces.extend([f.name.cast(), f.prov_name.cast()]);
        }
        pieces.extend([
            i.src_addr,
            i.dest_addr,
            i.tx_attr.cast(),
            i.rx_attr.cast(),
            i.ep_attr.cast(),
            i.domain_attr.cast(),
            i.fabric_attr.cast(),
        ]);
        let next = i.next;
        pieces.push(info.cast());
        for p in pieces {
            // SAFETY: each piece is NULL or from libc and freed once; free(NULL) does nothing.
            unsafe { libc::free(p) };
        }
        info = next;
    }
}
