//! The address vector: svnic addresses (16 bytes, see [`crate::addr`]) in insertion order; the
//! `fi_addr_t` of an address is its index, for `FI_AV_TABLE` and `FI_AV_MAP` alike.

use std::os::raw::{c_char, c_int, c_void};
use std::sync::{Arc, Mutex};

use svnic_channels::ChannelAddr;

use crate::addr::{self, ADDR_LEN};
use crate::ffi::domain::*;
use crate::ffi::errno::*;
use crate::ffi::*;
use crate::{guard_object, open_object, put, FidObject};

/// The table, shared with the endpoints bound to it.
#[derive(Debug, Default)]
pub struct AvInner {
    table: Mutex<Vec<Option<ChannelAddr>>>,
}

impl AvInner {
    /// Inserts one address (16 bytes); its handle, or `None` if the bytes are not an address.
    pub fn insert(&self, bytes: &[u8]) -> Option<u64> {
        let a = addr::decode(bytes)?;
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        t.push(Some(a));
        Some(t.len() as u64 - 1)
    }

    /// The address of a handle, if it is live.
    pub fn get(&self, fi_addr: u64) -> Option<ChannelAddr> {
        let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        usize::try_from(fi_addr)
            .ok()
            .and_then(|i| t.get(i).copied().flatten())
    }

    /// Removes a handle (it is never reused); false if it was not live.
    pub fn remove(&self, fi_addr: u64) -> bool {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        match usize::try_from(fi_addr).ok().and_then(|i| t.get_mut(i)) {
            Some(slot @ Some(_)) => {
                *slot = None;
                true
            }
            _ => false,
        }
    }
}

fid_object! {
    /// An address vector.
    pub struct SvnicAv: FidAv, FI_CLASS_AV {
        /// The shared table (bound endpoints keep it when the AV is closed).
        inner: Arc<AvInner>,
    }
}

static AV_OPS: FiOpsAv = FiOpsAv {
    insert: Some(av_insert),
    remove: Some(av_remove),
    lookup: Some(av_lookup),
    straddr: Some(av_straddr),
    ..FiOpsAv::ENOSYS
};

/// `fi_av_open`: types UNSPEC (becomes TABLE, written back), MAP and TABLE; no named (shared)
/// AVs, no flags.
pub(crate) fn open(
    attr: Option<&mut FiAvAttr>,
    out: *mut *mut FidAv,
    context: *mut c_void,
) -> c_int {
    open_object(attr, out, |attr| {
        match attr.type_ {
            FI_AV_UNSPEC => attr.type_ = FI_AV_TABLE,
            FI_AV_MAP | FI_AV_TABLE => {}
            _ => return Err(FI_EINVAL),
        }
        if !attr.name.is_null() {
            return Err(FI_ENOSYS);
        }
        if attr.flags != 0 {
            return Err(FI_EBADFLAGS);
        }
        Ok(SvnicAv {
            c: FidAv {
                fid: SvnicAv::fid(context),
                ops: &AV_OPS,
            },
            inner: Arc::default(),
        })
    })
}

/// `fi_av_insert`: `count` addresses of 16 bytes end to end. Returns how many were inserted;
/// a bad address gets `FI_ADDR_NOTAVAIL`, and if none of a non-empty batch is an address the
/// result is `-FI_EINVAL`. Asynchronous insertion (flags, context) is not offered.
unsafe extern "C" fn av_insert(
    a: *mut FidAv,
    addrs: *const c_void,
    count: usize,
    fi_addr: *mut u64,
    flags: u64,
    _context: *mut c_void,
) -> c_int {
    guard_object("fi_av_insert", a, |av: &SvnicAv| {
        if flags != 0 {
            return -FI_EBADFLAGS;
        }
        if count == 0 {
            return 0;
        }
        if addrs.is_null() || count > (c_int::MAX as usize) {
            return -FI_EINVAL;
        }
        let Some(total) = count.checked_mul(ADDR_LEN) else {
            return -FI_EINVAL;
        };
        // SAFETY: the application passes `count` addresses of the provider's address length.
        let bytes = unsafe { std::slice::from_raw_parts(addrs.cast::<u8>(), total) };
        let mut inserted = 0;
        for (k, b) in bytes.chunks_exact(ADDR_LEN).enumerate() {
            let handle = av.inner.insert(b);
            if handle.is_some() {
                inserted += 1;
            }
            if !fi_addr.is_null() {
                // SAFETY: the application's output array holds `count` entries.
                unsafe { put(fi_addr.wrapping_add(k), handle.unwrap_or(FI_ADDR_NOTAVAIL)) };
            }
        }
        if inserted == 0 {
            -FI_EINVAL
        } else {
            inserted
        }
    })
}

unsafe extern "C" fn av_remove(
    a: *mut FidAv,
    fi_addr: *mut u64,
    count: usize,
    flags: u64,
) -> c_int {
    guard_object("fi_av_remove", a, |av: &SvnicAv| {
        if flags != 0 {
            return -FI_EBADFLAGS;
        }
        if fi_addr.is_null() && count > 0 {
            return -FI_EINVAL;
        }
        let mut all = true;
        for k in 0..count {
            // SAFETY: the application passes `count` handles.
            let h = unsafe { fi_addr.wrapping_add(k).read_unaligned() };
            all &= av.inner.remove(h);
        }
        if all {
            0
        } else {
            -FI_EINVAL
        }
    })
}

/// `fi_av_lookup`: copies up to `*addrlen` bytes of the address and sets `*addrlen` to its
/// real length (16).
unsafe extern "C" fn av_lookup(
    a: *mut FidAv,
    fi_addr: u64,
    out: *mut c_void,
    addrlen: *mut usize,
) -> c_int {
    guard_object("fi_av_lookup", a, |av: &SvnicAv| {
        if addrlen.is_null() {
            return -FI_EINVAL;
        }
        let Some(found) = av.inner.get(fi_addr) else {
            return -FI_EINVAL;
        };
        let b = addr::encode(found);
        // SAFETY: checked non-NULL.
        let room = unsafe { addrlen.read_unaligned() };
        if room > 0 && out.is_null() {
            return -FI_EINVAL;
        }
        let n = room.min(ADDR_LEN);
        // SAFETY: the caller's buffer holds `room` >= n bytes.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), out.cast::<u8>(), n) };
        // SAFETY: checked non-NULL.
        unsafe { put(addrlen, ADDR_LEN) };
        0
    })
}

/// `fi_av_straddr`: `fi_svnic://<mac>/<endpoint>` into `buf` (truncated to `*len`), `*len` set
/// to the size needed including the NUL; returns `buf` (NULL for bad arguments).
unsafe extern "C" fn av_straddr(
    a: *mut FidAv,
    address: *const c_void,
    buf: *mut c_char,
    len: *mut usize,
) -> *const c_char {
    guard_object("fi_av_straddr", a, |_: &SvnicAv| {
        if address.is_null() || len.is_null() {
            return std::ptr::null();
        }
        // SAFETY: an address of the provider's length, per fi_av_straddr's contract.
        let bytes = unsafe { std::slice::from_raw_parts(address.cast::<u8>(), ADDR_LEN) };
        let s = addr::to_string(bytes);
        // SAFETY: checked non-NULL.
        let room = unsafe { len.read_unaligned() };
        // SAFETY: checked non-NULL.
        unsafe { put(len, s.len() + 1) };
        if buf.is_null() || room == 0 {
            return buf.cast_const();
        }
        let n = s.len().min(room - 1);
        // SAFETY: the caller's buffer holds `room` > n bytes.
        unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), n) };
        // SAFETY: as above.
        unsafe { put(buf.wrapping_add(n), 0) };
        buf.cast_const()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_indices_and_removed_ones_stay_dead() {
        let av = AvInner::default();
        let a = ChannelAddr::new(svnic_channels::MacAddr([0x52, 0x54, 0, 0, 0, 1]), 7);
        assert_eq!(av.insert(&addr::encode(a)), Some(0));
        assert_eq!(av.insert(&[0u8; ADDR_LEN]), None);
        assert_eq!(av.insert(&addr::encode(a)), Some(1));
        assert_eq!(av.get(1), Some(a));
        assert!(av.remove(0));
        assert!(!av.remove(0));
        assert_eq!(av.get(0), None);
        assert_eq!(av.get(2), None);
        assert_eq!(av.get(u64::MAX), None);
    }
}
