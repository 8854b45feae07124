//! # libsvnic-fi.so: a libfabric 1.17 provider over svnic channels
//!
//! libfabric `dlopen`s this library from `FI_PROVIDER_PATH` and calls [`fi_prov_ini`]; the
//! provider it returns is named `svnic` and offers two endpoint types: `FI_EP_RDM` with
//! `FI_MSG`, `FI_TAGGED`, `FI_DIRECTED_RECV` and remote CQ data (messages in order per sender,
//! in parts beyond a bounce buffer: [`rdm`]), and `FI_EP_DGRAM` with `FI_MSG` (which libfabric's
//! `ofi_rxd` may layer RDM on with `FI_SVNIC_RXD=1`). Every endpoint is one svnic channel, of a
//! host-process guest (the vhost-user socket named by `FI_SVNIC_SOCKET`) or, inside a VM, of
//! the guest whose agent (`svnic-guestd`, socket `FI_SVNIC_AGENT` or its default) creates it for
//! this unprivileged process. docs/libfabric.md lists capabilities, attributes and variables.
//!
//! - [`ffi`]: the C structs and operation tables, mirrored by hand with layout assertions;
//! - [`info`]: `fi_getinfo` (hints matching, `fi_info` lists allocated with libc);
//! - [`addr`]: the provider address, (MAC, endpoint) as 16 canonical bytes;
//! - [`fabric`], [`domain`] (with memory registration), [`av`], [`cq`], [`eq`], [`ep`]: one
//!   module per object; [`attach`]: how a domain reaches svnic (either mode);
//! - [`config`]: the environment variables; [`errors`]: svnic statuses as libfabric errors;
//!   [`stats`]: counters of what the provider did on its own, and the limit on log lines.
//!
//! Every `extern "C"` entry point runs its body under [`guard`] (a panic becomes `-FI_EOTHER`,
//! never an unwind into C), checks every pointer it is given, and recognises the objects it
//! receives by their operations table before touching anything past `struct fid`.

// Tests may unwrap (STYLE.md); the library itself may not, which clippy still checks.
#![cfg_attr(test, allow(clippy::unwrap_used))]

/// Declares the provider object `$ty`: a `#[repr(C)]` struct whose first field `c` is the
/// libfabric struct `$c` (so its fid is at the object's address), followed by the fields given,
/// each readable outside its module through an accessor of the same name. `$ty` is a
/// [`FidObject`] of class `$class`, recognised by an `fi_ops` table that no other type can
/// name: `$fi_ops` when given, else one whose only operation is `close` by [`close_object`]
/// (for objects that own nothing needing more than their drop). Both offsets that [`object`]
/// relies on are checked at compile time. The rest of [`FidObject`]'s contract is the using
/// module's promise: it gives its objects to C with [`hand_out`] only.
macro_rules! fid_object {
    (
        $(#[$meta:meta])*
        pub struct $ty:ident: $c:ty, $class:path {
            $($(#[$fmeta:meta])* $field:ident: $fty:ty,)*
        }
        $(fi_ops = $fi_ops:expr;)?
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Debug)]
        pub struct $ty {
            c: $c,
            $($field: $fty,)*
        }

        impl $ty {
            $(
                $(#[$fmeta])*
                pub fn $field(&self) -> &$fty {
                    &self.$field
                }
            )*
        }

        const _: () =
            assert!(::std::mem::offset_of!($ty, c) == 0 && ::std::mem::offset_of!($c, fid) == 0);

        // SAFETY: the assertion above puts the struct fid at the object's address, the table
        // is a static of this function alone, and the using module hands its objects out with
        // hand_out (the macro's contract).
        unsafe impl $crate::FidObject for $ty {
            type C = $c;
            const CLASS: usize = $class;
            fn fi_ops() -> *const $crate::ffi::FiOps {
                static FI_OPS: $crate::ffi::FiOps = fid_object!(@fi_ops $ty $(, $fi_ops)?);
                &FI_OPS
            }
        }
    };
    (@fi_ops $ty:ident) => {
        $crate::ffi::FiOps {
            close: Some($crate::close_object::<$ty>),
            ..$crate::ffi::FiOps::ENOSYS
        }
    };
    (@fi_ops $ty:ident, $fi_ops:expr) => {
        $fi_ops
    };
}

pub mod addr;
pub mod attach;
pub mod av;
pub mod config;
pub mod cq;
pub mod domain;
pub mod ep;
pub mod eq;
pub mod errors;
pub mod fabric;
pub mod ffi;
pub mod info;
pub mod rdm;
pub mod stats;
pub mod wait;

use std::cell::UnsafeCell;
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::null_mut;

use ffi::errno::{FI_EINVAL, FI_EOTHER};
use ffi::prov::{FiContext, FiProvider};
use ffi::{fi_version, FiOps, Fid};

/// The provider's name, as `fi_info -p` and `FI_PROVIDER` spell it.
pub const PROVIDER_NAME: &std::ffi::CStr = c"svnic";
/// The provider's own version (0.1).
pub const PROVIDER_VERSION: u32 = fi_version(0, 1);
/// The libfabric API version implemented.
pub const API_VERSION: u32 = fi_version(1, 17);

/// The provider static. libfabric writes its private state into `context` at registration, so
/// it must live in writable memory: the `UnsafeCell` keeps it out of read-only data.
#[repr(transparent)]
struct ProviderCell(UnsafeCell<FiProvider>);

// SAFETY: Rust code never reads or writes the cell; libfabric writes `context` once, under its
// own initialisation lock, before it uses the provider anywhere else.
unsafe impl Sync for ProviderCell {}

static PROVIDER: ProviderCell = ProviderCell(UnsafeCell::new(FiProvider {
    version: PROVIDER_VERSION,
    fi_version: API_VERSION,
    context: FiContext {
        internal: [null_mut(); 4],
    },
    name: PROVIDER_NAME.as_ptr(),
    getinfo: Some(info::svnic_getinfo),
    fabric: Some(fabric::svnic_fabric),
    cleanup: Some(svnic_cleanup),
}));

/// The entry point libfabric looks up with `dlsym` after loading the library.
#[no_mangle]
pub extern "C" fn fi_prov_ini() -> *mut FiProvider {
    // A logger that cannot be installed is no reason to fail the provider.
    let _ = catch_unwind(StderrLog::install);
    PROVIDER.0.get()
}

/// The provider's log: to stderr, at the level named by `FI_SVNIC_LOG` (`error`, `warn`,
/// `info`, `debug`; unset: nothing), unless the application installed its own `log` logger.
#[derive(Debug)]
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            eprintln!("svnic-fi {}: {}", r.level(), r.args());
        }
    }

    fn flush(&self) {}
}

impl StderrLog {
    fn install() {
        static LOG: StderrLog = StderrLog;
        let Some(level) = std::env::var("FI_SVNIC_LOG")
            .ok()
            .and_then(|v| v.parse::<log::LevelFilter>().ok())
        else {
            return;
        };
        if log::set_logger(&LOG).is_ok() {
            log::set_max_level(level);
        }
    }
}

/// Called by libfabric's destructor at process exit, before the library is unloaded: stops the
/// only threads the provider starts (the waker threads of `FI_WAIT_FD` CQs).
unsafe extern "C" fn svnic_cleanup() {
    let _ = catch_unwind(wait::stop_all);
}

/// What an entry point returns when its body panicked (a bug): `-FI_EOTHER`, or NULL for the
/// entry points that return strings; and when it was called on something that is not the
/// object it expects: `-FI_EINVAL`, or NULL.
pub trait EntryReturn {
    /// The value for a panic.
    fn on_panic() -> Self;
    /// The value for an unrecognised object.
    fn invalid() -> Self;
}

impl EntryReturn for c_int {
    fn on_panic() -> Self {
        -FI_EOTHER
    }

    fn invalid() -> Self {
        -FI_EINVAL
    }
}

impl EntryReturn for isize {
    fn on_panic() -> Self {
        -(FI_EOTHER as isize)
    }

    fn invalid() -> Self {
        -(FI_EINVAL as isize)
    }
}

impl EntryReturn for *const c_char {
    fn on_panic() -> Self {
        std::ptr::null()
    }

    fn invalid() -> Self {
        std::ptr::null()
    }
}

/// Runs the body of an `extern "C"` entry point; a panic is logged and becomes
/// [`EntryReturn::on_panic`] instead of unwinding into C (which would abort the application).
pub fn guard<R: EntryReturn>(what: &str, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            log::error!("svnic provider: {what} panicked; returning an error");
            R::on_panic()
        }
    }
}

/// Runs the body of the entry point `what`, called on the object `c` (its C struct, as
/// libfabric passes it), under [`guard`] and on the recognised `T` ([`object_of`]);
/// [`EntryReturn::invalid`] for NULL or anything that is not a `T`.
///
/// `c` is what libfabric gave the entry point: NULL or a live libfabric object.
pub(crate) fn guard_object<T: FidObject, R: EntryReturn>(
    what: &str,
    c: *mut T::C,
    body: impl FnOnce(&T) -> R,
) -> R {
    guard_fid(what, c.cast(), body)
}

/// [`guard_object`] for the entry points that receive an object's fid (`fi_close`,
/// `fi_control`, ...).
pub(crate) fn guard_fid<T: FidObject, R: EntryReturn>(
    what: &str,
    fid: *mut Fid,
    body: impl FnOnce(&T) -> R,
) -> R {
    guard(what, || {
        // SAFETY: an entry point's object is NULL or a readable struct fid that lives until
        // fi_close (libfabric's contract), of this provider or another; anything not a T is
        // refused.
        match unsafe { object::<T>(fid) } {
            Some(obj) => body(obj),
            None => R::invalid(),
        }
    })
}

/// The part every `fi_*_open` shares: `-FI_EINVAL` for missing attributes or a NULL `out`;
/// otherwise the object `make` builds from the attributes is handed out, or its error (a
/// positive libfabric error number) returned negated.
///
/// `out` is the application's out-pointer: NULL or writable.
pub(crate) fn open_object<A, T: FidObject>(
    attr: Option<A>,
    out: *mut *mut T::C,
    make: impl FnOnce(A) -> Result<T, c_int>,
) -> c_int {
    let Some(attr) = attr else { return -FI_EINVAL };
    if out.is_null() {
        return -FI_EINVAL;
    }
    match make(attr) {
        Ok(obj) => {
            // SAFETY: checked non-NULL; the application's out-pointer is writable.
            unsafe { hand_out(out, obj) };
            0
        }
        Err(e) => -e,
    }
}

/// A provider object whose first field is its C fid, recognised by its class and its `fi_ops`
/// table. Implemented with `fid_object!`, which checks the layout.
///
/// # Safety
/// Implementors must keep their `struct fid` at offset 0 ([`FidObject::C`] first, itself
/// beginning with the fid), [`FidObject::fi_ops`] must be a table used by no other type, and
/// objects must reach C only through [`hand_out`] (so [`close_object`] may free them).
pub unsafe trait FidObject: Sized {
    /// The libfabric struct the object begins with (`struct fid_eq`, ...).
    type C;
    /// The `FI_CLASS_*` value.
    const CLASS: usize;
    /// The address of the type's `fi_ops` static.
    fn fi_ops() -> *const FiOps;

    /// The `struct fid` of a new object: the type's class and table, the application's context.
    fn fid(context: *mut c_void) -> Fid {
        Fid {
            fclass: Self::CLASS,
            context,
            ops: Self::fi_ops(),
        }
    }
}

/// The provider object of type `T` that `fid` points to, or `None` for NULL, another class or
/// a fid this provider did not create (another provider's, or garbage with the right class).
///
/// # Safety
/// `fid` must be NULL or point to a readable `struct fid` that stays alive while the returned
/// reference is used (libfabric's contract: objects live until `fi_close`).
pub unsafe fn object<'a, T: FidObject>(fid: *const Fid) -> Option<&'a T> {
    if fid.is_null() {
        return None;
    }
    // SAFETY: non-NULL, and the caller guarantees a readable struct fid.
    let head = unsafe { &*fid };
    if head.fclass != T::CLASS || head.ops != T::fi_ops() {
        return None;
    }
    // SAFETY: only objects of type T carry T's fi_ops table, and their fid is their first
    // field (FidObject's contract), so the fid address is the object address.
    Some(unsafe { &*(fid as *const T) })
}

/// [`object`] for the entry points that receive an object's C struct (`struct fid_av *`, ...)
/// instead of its fid.
///
/// # Safety
/// As [`object`].
pub unsafe fn object_of<'a, T: FidObject>(c: *mut T::C) -> Option<&'a T> {
    // SAFETY: per the contract above; a T::C begins with its fid (FidObject's contract), and so
    // does the C struct of any other libfabric object `c` may point to.
    unsafe { object::<T>(c.cast()) }
}

/// Gives a new object to the application: boxes it and writes its C struct's address to `out`.
///
/// # Safety
/// `out` must be valid for a write of a pointer (the caller checked it for NULL).
pub unsafe fn hand_out<T: FidObject>(out: *mut *mut T::C, obj: T) {
    // SAFETY: per the contract above. The C struct is the object's first field.
    unsafe { put(out, Box::into_raw(Box::new(obj)).cast::<T::C>()) }
}

/// Frees an object created by [`hand_out`] after [`object`] recognised it.
///
/// # Safety
/// `fid` must have been recognised by [`object::<T>`] and not be used again by anyone
/// (libfabric's contract after `fi_close`).
pub unsafe fn free_object<T: FidObject>(fid: *mut Fid) {
    // SAFETY: per the contract above; a recognised object came from `hand_out`'s
    // `Box::into_raw` (FidObject's contract), and its fid is at its address.
    drop(unsafe { Box::from_raw(fid as *mut T) });
}

/// `close` of `struct fi_ops` for the objects that own nothing needing more than their drop:
/// recognises the fid and frees the object. An object's shared state (CQs, AVs, the domain's
/// connection) stays alive through the `Arc`s of whoever still holds it.
///
/// # Safety
/// `fid` must be NULL or point to a readable `struct fid` (libfabric's contract for
/// `fi_close`); a fid of type `T` must not be used after it is closed.
pub unsafe extern "C" fn close_object<T: FidObject>(fid: *mut Fid) -> c_int {
    // SAFETY: per the contract above.
    unsafe { close_fid::<T>("fi_close", fid, |_| {}) }
}

/// The close of an object: recognises `fid` as a `T` (else `-FI_EINVAL`), runs `teardown` on
/// it, then frees it, once `teardown` has returned and no reference to it is left.
///
/// # Safety
/// As [`close_object`]'s.
pub(crate) unsafe fn close_fid<T: FidObject>(
    what: &str,
    fid: *mut Fid,
    teardown: impl FnOnce(&T),
) -> c_int {
    guard(what, || {
        // SAFETY: per the contract above.
        let Some(obj) = (unsafe { object::<T>(fid) }) else {
            return -FI_EINVAL;
        };
        teardown(obj);
        // SAFETY: recognised above and closed once (the contract above); `obj` is not used
        // after this.
        unsafe { free_object::<T>(fid) };
        0
    })
}

/// Writes `value` through an out-pointer the caller checked for NULL.
///
/// # Safety
/// `out` must be valid for a write of `T`.
pub(crate) unsafe fn put<T>(out: *mut T, value: T) {
    // SAFETY: per the contract above; unaligned in case the application's buffer is packed.
    unsafe { out.write_unaligned(value) }
}
