//! The svnic libfabric provider through its C entry points, exactly as libfabric's inline
//! wrappers call them (`fi_prov_ini`, then the function pointers of every object's tables), in
//! this process, against the daemon (`Daemon::start`) with one host-process guest: attributes,
//! the getname/AV protocols, data of every path (inline, staged DMA, queued, truncated, failed,
//! cancelled), and bad use answered with libfabric error codes instead of a crash.
#![allow(clippy::unwrap_used)]

use std::ffi::CStr;
use std::os::raw::{c_int, c_void};
use std::ptr::{null, null_mut};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use svnic_backend::config::EngineOverrides;
use svnic_channels::MacAddr;
use svnic_control_plane::lifecycle::ChannelState;
use svnic_fi::addr::{self, ADDR_LEN};
use svnic_fi::errors::{PROV_CANCELED, PROV_NO_MESSAGE, PROV_TRUNCATED};
use svnic_fi::ffi::domain::{FiAvAttr, FidAv, FidDomain};
use svnic_fi::ffi::endpoint::tagged::FiMsgTagged;
use svnic_fi::ffi::endpoint::{FiMsg, FidEp};
use svnic_fi::ffi::eq::*;
use svnic_fi::ffi::errno::*;
use svnic_fi::ffi::prov::FiProvider;
use svnic_fi::ffi::*;
use svnic_fi::info::free_info;
use svnic_tests::daemon_fixture::DaemonFixture;

const MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x72, 0x01, 0x01]);

/// The provider's environment is process-wide: tests that open domains take this lock.
static ENV: Mutex<()> = Mutex::new(());

/// Takes [`ENV`] (also after a test that held it failed).
fn env_lock() -> MutexGuard<'static, ()> {
    ENV.lock().unwrap_or_else(|e| e.into_inner())
}

/// Calls slot `$slot` of the operations table at `$table`, as libfabric's inline wrappers do.
macro_rules! call {
    ($table:expr, $slot:ident ( $($arg:expr),* $(,)? )) => {{
        // SAFETY: every table this test reaches is a static of the provider, found through a
        // live object of this test; the arguments are live objects and buffers of this test,
        // or deliberately NULL/garbage that the provider must refuse without touching.
        let table = unsafe { &*$table };
        let f = table.$slot.expect(concat!(stringify!($slot), " is NULL"));
        // SAFETY: as above.
        unsafe { f($($arg),*) }
    }};
}

/// Reads a live C object of this test.
fn r<'a, T>(p: *mut T) -> &'a T {
    assert!(!p.is_null());
    // SAFETY: only called on objects the provider returned to this test and not closed yet.
    unsafe { &*p }
}

/// A zeroed C struct (attributes, hints, entries).
fn zeroed<T>() -> T {
    // SAFETY: only used for the C structs of the ffi module, whose fields are integers, raw
    // pointers and nullable function pointers: all-zero bytes are a valid value of each.
    unsafe { std::mem::zeroed() }
}

fn provider() -> &'static FiProvider {
    // SAFETY: fi_prov_ini returns the address of the provider static.
    unsafe { &*svnic_fi::fi_prov_ini() }
}

fn getinfo(
    version: u32,
    node: *const i8,
    flags: u64,
    hints: Option<&FiInfo>,
) -> Result<*mut FiInfo, c_int> {
    let mut out = null_mut();
    let f = provider().getinfo.unwrap();
    // SAFETY: NULL or live hints of this test; `out` is writable.
    let rc = unsafe {
        f(
            version,
            node,
            null(),
            flags,
            hints.map_or(null(), |h| h as *const FiInfo),
            &mut out,
        )
    };
    if rc == 0 {
        Ok(out)
    } else {
        Err(rc)
    }
}

fn free(info: *mut FiInfo) {
    // SAFETY: a list the provider's getinfo returned, freed once.
    unsafe { free_info(info) }
}

/// Hints with every attribute struct present and zeroed.
struct Hints {
    info: Box<FiInfo>,
    tx: Box<FiTxAttr>,
    rx: Box<FiRxAttr>,
    ep: Box<FiEpAttr>,
    domain: Box<FiDomainAttr>,
    fabric: Box<FiFabricAttr>,
}

impl Hints {
    fn new() -> Hints {
        let mut h = Hints {
            info: Box::new(zeroed()),
            tx: Box::new(zeroed()),
            rx: Box::new(zeroed()),
            ep: Box::new(zeroed()),
            domain: Box::new(zeroed()),
            fabric: Box::new(zeroed()),
        };
        h.info.tx_attr = &mut *h.tx;
        h.info.rx_attr = &mut *h.rx;
        h.info.ep_attr = &mut *h.ep;
        h.info.domain_attr = &mut *h.domain;
        h.info.fabric_attr = &mut *h.fabric;
        h
    }
}

#[test]
fn getinfo_answers_hints_and_refuses_what_svnic_lacks() {
    let v = svnic_fi::API_VERSION;
    let f = provider().getinfo.unwrap();
    // SAFETY: a NULL output pointer is the bad use under test.
    let rc = unsafe { f(v, null(), null(), 0, null(), null_mut()) };
    assert_eq!(rc, -FI_EINVAL);

    // Two entries: the native RDM endpoint first, then the DGRAM one.
    let info = getinfo(v, null(), 0, None).unwrap();
    let rdm = r(info);
    assert_eq!(r(rdm.ep_attr).type_, FI_EP_RDM);
    assert_eq!(
        rdm.caps,
        caps::FI_MSG
            | caps::FI_TAGGED
            | caps::FI_SEND
            | caps::FI_RECV
            | caps::FI_DIRECTED_RECV
            | caps::FI_LOCAL_COMM
            | caps::FI_REMOTE_COMM
    );
    assert_eq!(rdm.mode, 0);
    assert_eq!(r(rdm.ep_attr).max_msg_size, 8 * 65536, "in parts of 64 KiB");
    assert_eq!(r(rdm.ep_attr).mem_tag_format, FI_TAG_GENERIC);
    assert_eq!(r(rdm.tx_attr).inject_size, 40 - 21, "the header's room");
    assert_eq!(r(rdm.tx_attr).msg_order, FI_ORDER_SAS);
    assert_eq!(r(rdm.rx_attr).msg_order, FI_ORDER_SAS);
    assert_eq!(
        r(rdm.rx_attr).caps & caps::FI_DIRECTED_RECV,
        caps::FI_DIRECTED_RECV
    );
    assert_eq!(r(rdm.domain_attr).cq_data_size, 8);
    assert_eq!(r(rdm.domain_attr).data_progress, FI_PROGRESS_MANUAL);
    let i = r(rdm.next);
    assert!(i.next.is_null());
    assert_eq!(i.caps & caps::FI_MSG, caps::FI_MSG);
    assert_eq!(i.caps & caps::FI_TAGGED, 0);
    assert_eq!(r(i.domain_attr).cq_data_size, 0);
    assert_eq!(i.mode, 0);
    assert_eq!(r(i.ep_attr).type_, FI_EP_DGRAM);
    assert_eq!(r(i.ep_attr).max_msg_size, 65536);
    assert_eq!(r(i.tx_attr).inject_size, 40);
    assert_eq!(r(i.domain_attr).data_progress, FI_PROGRESS_MANUAL);
    assert!(
        r(i.fabric_attr).prov_name.is_null(),
        "libfabric fills prov_name"
    );
    // SAFETY: the provider's NUL-terminated name.
    assert_eq!(unsafe { CStr::from_ptr(r(i.fabric_attr).name) }, c"svnic");
    free(info);

    // Utility providers (ofi_rxd) ask with libfabric's internal OFI_CORE_PROV_ONLY bit: they
    // get nothing unless FI_SVNIC_RXD=1, then the DGRAM core only, marked for a reliable layer.
    let env = env_lock();
    std::env::remove_var("FI_SVNIC_RXD");
    assert_eq!(getinfo(v, null(), 1 << 59, None).err(), Some(-FI_ENODATA));
    std::env::set_var("FI_SVNIC_RXD", "1");
    let layered = getinfo(v, null(), 1 << 59, None);
    std::env::remove_var("FI_SVNIC_RXD");
    drop(env);
    let info = layered.unwrap();
    assert!(r(info).next.is_null());
    assert_eq!(r(r(info).ep_attr).type_, FI_EP_DGRAM);
    assert_eq!(
        r(r(info).ep_attr).protocol,
        svnic_fi::info::PROTOCOL_LAYERED
    );
    free(info);

    // Open MPI's OFI MTL hints: the RDM entry, with directed receives and remote CQ data.
    let mut h = Hints::new();
    h.info.caps =
        caps::FI_TAGGED | caps::FI_LOCAL_COMM | caps::FI_REMOTE_COMM | caps::FI_DIRECTED_RECV;
    h.info.mode = (1 << 59) | (1 << 52);
    h.ep.type_ = FI_EP_RDM;
    h.domain.cq_data_size = 4;
    h.domain.av_type = FI_AV_MAP;
    h.tx.msg_order = FI_ORDER_SAS;
    h.rx.msg_order = FI_ORDER_SAS;
    let info = getinfo(fi_version(1, 5), null(), 0, Some(&h.info)).unwrap();
    assert!(r(info).next.is_null());
    assert_eq!(r(r(info).ep_attr).type_, FI_EP_RDM);
    assert_eq!(
        r(info).caps & caps::FI_DIRECTED_RECV,
        caps::FI_DIRECTED_RECV
    );
    free(info);
    // fi_pingpong's `-e rdm` hints (FI_MSG): receives ignore their source unless asked.
    let mut h = Hints::new();
    h.info.caps = caps::FI_MSG;
    h.ep.type_ = FI_EP_RDM;
    let info = getinfo(v, null(), 0, Some(&h.info)).unwrap();
    assert_eq!(r(info).caps & caps::FI_DIRECTED_RECV, 0);
    assert_eq!(r(r(info).rx_attr).caps & caps::FI_DIRECTED_RECV, 0);
    free(info);
    let mut h = Hints::new();
    h.info.caps = caps::FI_MSG;
    h.info.mode = !0;
    h.ep.type_ = FI_EP_DGRAM;
    h.ep.max_msg_size = 4096;
    h.domain.av_type = FI_AV_MAP;
    let info = getinfo(v, null(), 0, Some(&h.info)).unwrap();
    assert_eq!(r(r(info).domain_attr).av_type, FI_AV_MAP);
    free(info);

    // A destination address in the hints (what fi_pingpong's client passes) is copied.
    let dest = addr::encode(svnic_channels::ChannelAddr::new(MAC, 3));
    let mut h = Hints::new();
    h.info.dest_addr = dest.as_ptr() as *mut c_void;
    h.info.dest_addrlen = ADDR_LEN;
    let info = getinfo(v, null(), 0, Some(&h.info)).unwrap();
    assert_eq!(r(info).dest_addrlen, ADDR_LEN);
    // SAFETY: the provider allocated dest_addrlen bytes.
    let copied = unsafe { std::slice::from_raw_parts(r(info).dest_addr as *const u8, ADDR_LEN) };
    assert_eq!(copied, &dest);
    free(info);

    let garbage = [7u8; ADDR_LEN];
    type Change = Box<dyn Fn(&mut Hints)>;
    let refused: [(&str, Change); 11] = [
        ("MSG endpoint", Box::new(|h| h.ep.type_ = 1)),
        (
            "tagged DGRAM",
            Box::new(|h| {
                h.ep.type_ = FI_EP_DGRAM;
                h.info.caps = caps::FI_TAGGED;
            }),
        ),
        (
            "DGRAM with cq data",
            Box::new(|h| {
                h.ep.type_ = FI_EP_DGRAM;
                h.domain.cq_data_size = 4;
            }),
        ),
        ("atomics", Box::new(|h| h.info.caps = 1 << 4)),
        ("1 MiB messages", Box::new(|h| h.ep.max_msg_size = 1 << 20)),
        ("sockaddr_in", Box::new(|h| h.info.addr_format = 2)),
        (
            "auto progress",
            Box::new(|h| h.domain.data_progress = FI_PROGRESS_AUTO),
        ),
        (
            "16 bytes of cq data",
            Box::new(|h| h.domain.cq_data_size = 16),
        ),
        (
            "fabric name",
            Box::new(|h| h.fabric.name = c"udp".as_ptr() as *mut _),
        ),
        (
            "domain name",
            Box::new(|h| h.domain.name = c"lo".as_ptr() as *mut _),
        ),
        (
            "garbage address",
            Box::new(move |h| {
                h.info.dest_addr = garbage.as_ptr() as *mut c_void;
                h.info.dest_addrlen = ADDR_LEN;
            }),
        ),
    ];
    for (what, set) in refused {
        let mut h = Hints::new();
        set(&mut h);
        assert_eq!(
            getinfo(v, null(), 0, Some(&h.info)).err(),
            Some(-FI_ENODATA),
            "{what}"
        );
    }
    assert_eq!(
        getinfo(v, c"host".as_ptr(), 0, None).err(),
        Some(-FI_ENODATA),
        "node"
    );
    assert_eq!(
        getinfo(fi_version(1, 18), null(), 0, None).err(),
        Some(-FI_ENODATA),
        "1.18"
    );

    // fi_fabric: NULL attributes and another fabric's name.
    let fab = provider().fabric.unwrap();
    let mut out = null_mut();
    // SAFETY: NULL attributes are the bad use under test.
    assert_eq!(unsafe { fab(null_mut(), &mut out, null_mut()) }, -FI_EINVAL);
    let mut attr: FiFabricAttr = zeroed();
    attr.name = c"udp".as_ptr() as *mut _;
    // SAFETY: live attributes of this test.
    assert_eq!(unsafe { fab(&mut attr, &mut out, null_mut()) }, -FI_EINVAL);

    // fi_domain with no guest socket configured, or one nobody serves.
    let _env = env_lock();
    let (info, fabric) = open_fabric(FI_EP_DGRAM);
    for (socket, want) in [
        (None, -FI_ENODEV),
        (Some("/nonexistent/svnic.sock"), -FI_ECONNREFUSED),
    ] {
        match socket {
            Some(s) => std::env::set_var("FI_SVNIC_SOCKET", s),
            None => std::env::remove_var("FI_SVNIC_SOCKET"),
        }
        let mut dom = null_mut();
        assert_eq!(
            call!(r(fabric).ops, domain(fabric, info, &mut dom, null_mut())),
            want
        );
        assert!(dom.is_null());
    }
    close(fabric.cast());
    free(info);
}

/// getinfo (for endpoints of `ep_type`) + fi_fabric as libfabric does them (it records the API
/// version in the attributes).
fn open_fabric(ep_type: c_int) -> (*mut FiInfo, *mut FidFabric) {
    let mut h = Hints::new();
    h.ep.type_ = ep_type;
    let info = getinfo(svnic_fi::API_VERSION, null(), 0, Some(&h.info)).unwrap();
    assert_eq!(r(r(info).ep_attr).type_, ep_type);
    let fa = r(info).fabric_attr;
    // SAFETY: the provider's live attributes; libfabric writes api_version the same way.
    unsafe { (*fa).api_version = svnic_fi::API_VERSION };
    let mut fabric = null_mut();
    let f = provider().fabric.unwrap();
    // SAFETY: live attributes of the list above; `fabric` is writable.
    assert_eq!(unsafe { f(fa, &mut fabric, null_mut()) }, 0);
    (info, fabric)
}

fn close(fid: *mut Fid) {
    assert_eq!(call!(r(fid).ops, close(fid)), 0);
}

fn cq_open(dom: *mut FidDomain, format: c_int, wait: c_int, flags: u64) -> (c_int, *mut FidCq) {
    let mut attr: FiCqAttr = zeroed();
    attr.size = 64;
    attr.format = format;
    attr.wait_obj = wait;
    attr.flags = flags;
    let mut cq = null_mut();
    let rc = call!(r(dom).ops, cq_open(dom, &mut attr, &mut cq, null_mut()));
    (rc, cq)
}

fn getname(ep: *mut FidEp) -> [u8; ADDR_LEN] {
    let mut b = [0u8; ADDR_LEN];
    let mut len = ADDR_LEN;
    assert_eq!(
        call!(
            r(ep).cm,
            getname(ep.cast(), b.as_mut_ptr().cast(), &mut len)
        ),
        0
    );
    assert_eq!(len, ADDR_LEN);
    b
}

/// Reads completions of `cq` (DATA format) until `n` arrived or an error entry is next.
fn read_n(cq: *mut FidCq, n: usize) -> Result<Vec<FiCqDataEntry>, isize> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < n {
        let mut e: [FiCqDataEntry; 4] = zeroed();
        let rc = call!(r(cq).ops, read(cq, e.as_mut_ptr().cast(), 4));
        match rc {
            k if k > 0 => got.extend(e.into_iter().take(k as usize)),
            k if k == -(FI_EAGAIN as isize) => {
                assert!(
                    Instant::now() < deadline,
                    "{} of {n} completions",
                    got.len()
                );
                std::thread::yield_now();
            }
            k => return Err(k),
        }
    }
    Ok(got)
}

/// Reads until the next entry of `cq` is an error, and returns it.
fn read_err(cq: *mut FidCq) -> FiCqErrEntry {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut e: FiCqDataEntry = zeroed();
        let rc = call!(
            r(cq).ops,
            read(cq, (&mut e as *mut FiCqDataEntry).cast(), 1)
        );
        if rc == -(FI_EAVAIL as isize) {
            break;
        }
        assert_eq!(
            rc,
            -(FI_EAGAIN as isize),
            "a success where an error was expected"
        );
        assert!(Instant::now() < deadline, "no error entry");
        std::thread::yield_now();
    }
    let mut err: FiCqErrEntry = zeroed();
    assert_eq!(call!(r(cq).ops, readerr(cq, &mut err, 0)), 1);
    err
}

/// Waits up to `ms` for `fd` to become readable (poll(2)); true if it did.
fn readable(fd: c_int, ms: c_int) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    n == 1 && p.revents & libc::POLLIN != 0
}

fn ctx(n: usize) -> *mut c_void {
    n as *mut c_void
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

const EAGAIN: isize = -(FI_EAGAIN as isize);
const EINVAL: isize = -(FI_EINVAL as isize);

#[test]
fn endpoints_send_receive_and_refuse_bad_use() {
    let _env = env_lock();
    let d = attached_daemon("fi-api", &[(MAC, "")], EngineOverrides::default());
    std::env::set_var("FI_SVNIC_PEER_TIMEOUT_MS", "200");
    let (info, fabric) = open_fabric(FI_EP_DGRAM);
    let mut dom = null_mut();
    assert_eq!(
        call!(r(fabric).ops, domain(fabric, info, &mut dom, null_mut())),
        0
    );

    // Completion queues: formats and wait objects svnic lacks are refused.
    assert_eq!(
        cq_open(dom, FI_CQ_FORMAT_DATA, FI_WAIT_SET, 0).0,
        -FI_ENOSYS
    );
    assert_eq!(
        cq_open(dom, FI_CQ_FORMAT_DATA, FI_WAIT_NONE, 1).0,
        -FI_EBADFLAGS
    );
    assert_eq!(cq_open(dom, 99, FI_WAIT_NONE, 0).0, -FI_EINVAL);
    let (rc, cq_a) = cq_open(dom, FI_CQ_FORMAT_DATA, FI_WAIT_NONE, 0);
    assert_eq!(rc, 0);
    let (rc, cq_b) = cq_open(dom, FI_CQ_FORMAT_DATA, FI_WAIT_NONE, 0);
    assert_eq!(rc, 0);

    // Address vector: UNSPEC becomes TABLE.
    let mut av_attr: FiAvAttr = zeroed();
    let mut av: *mut FidAv = null_mut();
    assert_eq!(
        call!(r(dom).ops, av_open(dom, &mut av_attr, &mut av, null_mut())),
        0
    );
    assert_eq!(av_attr.type_, FI_AV_TABLE);
    av_attr.flags = 1;
    let mut av2 = null_mut();
    assert_eq!(
        call!(r(dom).ops, av_open(dom, &mut av_attr, &mut av2, null_mut())),
        -FI_EBADFLAGS
    );

    // Two endpoints: the first free endpoint ids of the guest.
    let mut a: *mut FidEp = null_mut();
    let mut b: *mut FidEp = null_mut();
    assert_eq!(
        call!(r(dom).ops, endpoint(dom, info, &mut a, null_mut())),
        0
    );
    assert_eq!(
        call!(r(dom).ops, endpoint(dom, info, &mut b, null_mut())),
        0
    );

    // fi_getname: the -FI_ETOOSMALL protocol, then the address.
    let mut len = 0usize;
    assert_eq!(
        call!(r(a).cm, getname(a.cast(), null_mut(), &mut len)),
        -FI_ETOOSMALL
    );
    assert_eq!(len, ADDR_LEN);
    let mut small = [0u8; 8];
    len = small.len();
    assert_eq!(
        call!(
            r(a).cm,
            getname(a.cast(), small.as_mut_ptr().cast(), &mut len)
        ),
        -FI_ETOOSMALL
    );
    assert_eq!(
        call!(r(a).cm, getname(a.cast(), null_mut(), null_mut())),
        -FI_EINVAL
    );
    let (name_a, name_b) = (getname(a), getname(b));
    let addr_a = addr::decode(&name_a).unwrap();
    let addr_b = addr::decode(&name_b).unwrap();
    assert_eq!((addr_a.mac, addr_a.endpoint), (MAC, 1));
    assert_eq!((addr_b.mac, addr_b.endpoint), (MAC, 2));

    // Not enabled yet: posts are refused, enable needs an AV, binds are checked.
    let data = pattern(64, 1);
    assert_eq!(
        call!(
            r(a).msg,
            send(a, data.as_ptr().cast(), 8, null_mut(), 0, null_mut())
        ),
        -(FI_EOPBADSTATE as isize)
    );
    let enable = |ep: *mut FidEp| call!(r(ep).fid.ops, control(ep.cast(), FI_ENABLE, null_mut()));
    assert_eq!(enable(a), -FI_ENOAV);
    let bind = |ep: *mut FidEp, what: *mut Fid, flags: u64| {
        call!(r(ep).fid.ops, bind(ep.cast(), what, flags))
    };
    static FOREIGN_OPS: FiOps = FiOps::ENOSYS;
    let mut foreign = Fid {
        fclass: FI_CLASS_CQ,
        context: null_mut(),
        ops: &FOREIGN_OPS,
    };
    assert_eq!(bind(a, null_mut(), 0), -FI_EINVAL);
    assert_eq!(
        bind(a, &mut foreign, op_flags::FI_TRANSMIT),
        -FI_EINVAL,
        "another provider's CQ"
    );
    assert_eq!(bind(a, cq_a.cast(), 0), -FI_EBADFLAGS);
    assert_eq!(bind(a, av.cast(), op_flags::FI_RECV), -FI_EBADFLAGS);
    for (ep, cq) in [(a, cq_a), (b, cq_b)] {
        assert_eq!(bind(ep, av.cast(), 0), 0);
        assert_eq!(
            bind(ep, cq.cast(), op_flags::FI_TRANSMIT | op_flags::FI_RECV),
            0
        );
        assert_eq!(enable(ep), 0);
    }
    assert_eq!(
        bind(a, cq_b.cast(), op_flags::FI_RECV),
        -FI_EOPBADSTATE,
        "after enable"
    );

    let insert = |addrs: &[u8], out: &mut [u64], flags: u64| {
        let (p, n, o) = (addrs.as_ptr().cast(), out.len(), out.as_mut_ptr());
        call!(r(av).ops, insert(av, p, n, o, flags, null_mut()))
    };
    // fi_av_insert: the count inserted; garbage gets FI_ADDR_NOTAVAIL, and all-garbage an error.
    let mut fi_addr = [0u64; 2];
    let both: Vec<u8> = [name_a, name_b].concat();
    assert_eq!(insert(&both, &mut fi_addr[..2], 0), 2);
    assert_eq!(fi_addr, [0, 1]);
    let (to_a, to_b) = (fi_addr[0], fi_addr[1]);
    let garbage = [0x5au8; ADDR_LEN];
    let mut h = [0u64; 1];
    assert_eq!(insert(&garbage, &mut h[..1], 0), -FI_EINVAL);
    assert_eq!(h[0], FI_ADDR_NOTAVAIL);
    let mixed: Vec<u8> = [garbage, name_b].concat();
    let mut h2 = [0u64; 2];
    assert_eq!(insert(&mixed, &mut h2[..2], 0), 1);
    assert_eq!(h2, [FI_ADDR_NOTAVAIL, 2]);
    assert_eq!(
        call!(
            r(av).ops,
            insert(av, null(), 1, h.as_mut_ptr(), 0, null_mut())
        ),
        -FI_EINVAL
    );
    assert_eq!(insert(&both, &mut h[..1], 1 << 4), -FI_EBADFLAGS);
    // Service-name insertion is not offered.
    assert_eq!(
        call!(
            r(av).ops,
            insertsvc(
                av,
                c"h".as_ptr(),
                c"1".as_ptr(),
                h.as_mut_ptr(),
                0,
                null_mut()
            )
        ),
        -FI_ENOSYS
    );

    // fi_av_lookup / straddr.
    let mut out = [0u8; 4];
    let mut len = out.len();
    assert_eq!(
        call!(
            r(av).ops,
            lookup(av, to_b, out.as_mut_ptr().cast(), &mut len)
        ),
        0
    );
    assert_eq!(
        (len, out),
        (ADDR_LEN, [name_b[0], name_b[1], name_b[2], name_b[3]])
    );
    assert_eq!(
        call!(r(av).ops, lookup(av, 77, out.as_mut_ptr().cast(), &mut len)),
        -FI_EINVAL
    );
    assert_eq!(
        call!(
            r(av).ops,
            lookup(av, to_b, out.as_mut_ptr().cast(), null_mut())
        ),
        -FI_EINVAL
    );
    let mut text = [0u8; 64];
    let mut tlen = text.len();
    let s = call!(
        r(av).ops,
        straddr(
            av,
            name_b.as_ptr().cast(),
            text.as_mut_ptr().cast(),
            &mut tlen
        )
    );
    assert!(!s.is_null());
    // SAFETY: straddr wrote a NUL-terminated string into `text`.
    let s = unsafe { CStr::from_ptr(s) }.to_str().unwrap();
    assert_eq!(s, format!("fi_svnic://{MAC}/2"));
    assert_eq!(tlen, s.len() + 1);

    // Bad posts: unknown address, NULL buffers, too long, bad flags, missing operations.
    let send = |ep: *mut FidEp, buf: &[u8], to: u64, c: usize| {
        call!(
            r(ep).msg,
            send(ep, buf.as_ptr().cast(), buf.len(), null_mut(), to, ctx(c))
        )
    };
    let recv = |ep: *mut FidEp, buf: &mut [u8], c: usize| {
        call!(
            r(ep).msg,
            recv(
                ep,
                buf.as_mut_ptr().cast(),
                buf.len(),
                null_mut(),
                0,
                ctx(c)
            )
        )
    };
    let big = pattern(65537, 3);
    // Lengths far beyond max_msg_size are refused before anything is read or allocated.
    let huge = call!(
        r(a).msg,
        send(
            a,
            data.as_ptr().cast(),
            1 << 40,
            null_mut(),
            to_b,
            null_mut()
        )
    );
    assert_eq!(huge, -(FI_EMSGSIZE as isize));
    let halves = [libc::iovec {
        iov_base: data.as_ptr() as *mut c_void,
        iov_len: usize::MAX / 2 + 1,
    }; 2];
    let wrap = call!(
        r(a).msg,
        sendv(a, halves.as_ptr(), null_mut(), 2, to_b, null_mut())
    );
    assert_eq!(wrap, -(FI_EMSGSIZE as isize), "lengths whose sum overflows");
    assert_eq!(send(a, &data, 99, 0), EINVAL, "unknown fi_addr");
    assert_eq!(send(a, &data, FI_ADDR_NOTAVAIL, 0), EINVAL);
    assert_eq!(
        call!(r(a).msg, send(a, null(), 5, null_mut(), to_b, null_mut())),
        EINVAL
    );
    assert_eq!(send(a, &big, to_b, 0), -(FI_EMSGSIZE as isize));
    assert_eq!(
        call!(r(a).msg, inject(a, data.as_ptr().cast(), 41, to_b)),
        -(FI_EMSGSIZE as isize)
    );
    assert_eq!(
        call!(r(a).msg, recv(a, null_mut(), 8, null_mut(), 0, null_mut())),
        EINVAL
    );
    let iov = [libc::iovec {
        iov_base: null_mut(),
        iov_len: 0,
    }; 5];
    assert_eq!(
        call!(
            r(a).msg,
            recvv(a, iov.as_ptr(), null_mut(), 5, 0, null_mut())
        ),
        EINVAL
    );
    assert_eq!(call!(r(a).msg, sendmsg(a, null(), 0)), EINVAL);
    let one = [libc::iovec {
        iov_base: data.as_ptr() as *mut c_void,
        iov_len: 8,
    }];
    let msg = FiMsg {
        msg_iov: one.as_ptr(),
        desc: null_mut(),
        iov_count: 1,
        addr: to_b,
        context: null_mut(),
        data: 0,
    };
    assert_eq!(
        call!(r(a).msg, sendmsg(a, &msg, op_flags::FI_REMOTE_CQ_DATA)),
        -(FI_EBADFLAGS as isize)
    );
    assert_eq!(
        call!(
            r(a).msg,
            senddata(a, data.as_ptr().cast(), 8, null_mut(), 1, to_b, null_mut())
        ),
        -(FI_ENOSYS as isize)
    );
    assert_eq!(
        call!(
            r(a).tagged,
            send(a, data.as_ptr().cast(), 8, null_mut(), to_b, 1, null_mut())
        ),
        -(FI_ENOSYS as isize)
    );
    assert_eq!(
        call!(
            r(a).rma,
            read(a, null_mut(), 8, null_mut(), to_b, 0, 0, null_mut())
        ),
        -(FI_ENOSYS as isize)
    );
    assert_eq!(
        call!(r(a).atomic, writevalid(a, 0, 0, null_mut())),
        -FI_ENOSYS
    );
    assert_eq!(
        call!(r(a).collective, barrier(a, 0, null_mut())),
        -(FI_ENOSYS as isize)
    );
    assert_eq!(
        call!(r(a).ops, getopt(a.cast(), 0, 0, null_mut(), null_mut())),
        -FI_ENOPROTOOPT
    );
    assert_eq!(call!(r(cq_a).ops, read(cq_a, null_mut(), 1)), EINVAL);
    assert_eq!(call!(r(cq_a).ops, readerr(cq_a, null_mut(), 0)), EINVAL);
    let mut e: FiCqErrEntry = zeroed();
    assert_eq!(call!(r(cq_a).ops, readerr(cq_a, &mut e, 0)), EAGAIN);
    assert_eq!(
        call!(
            r(cq_a).ops,
            sread(cq_a, (&mut e as *mut FiCqErrEntry).cast(), 1, null(), 0)
        ),
        -(FI_ENOSYS as isize),
        "no wait object"
    );

    // Data: inline (5 B), staged DMA (1000 B, 64 KiB), and a zero-length message.
    let mut bufs: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; 65536]).collect();
    for (k, buf) in bufs.iter_mut().enumerate() {
        let rc = recv(b, buf, 100 + k);
        assert_eq!(rc, 0);
    }
    let payloads = [
        pattern(5, 7),
        pattern(1000, 8),
        pattern(65536, 9),
        Vec::new(),
    ];
    for (k, p) in payloads.iter().enumerate() {
        assert_eq!(send(a, p, to_b, 1 + k), 0);
    }
    let mut sent: Vec<usize> = read_n(cq_a, 4)
        .unwrap()
        .iter()
        .map(|e| {
            assert_eq!(e.flags, op_flags::FI_SEND | op_flags::FI_MSG);
            e.op_context as usize
        })
        .collect();
    sent.sort_unstable();
    assert_eq!(sent, [1, 2, 3, 4]);
    let got = read_n(cq_b, 4).unwrap();
    for (k, e) in got.iter().enumerate() {
        assert_eq!(e.flags, op_flags::FI_RECV | op_flags::FI_MSG);
        assert_eq!(e.op_context as usize, 100 + k, "receives complete in order");
        assert_eq!(e.len, payloads[k].len());
        assert_eq!(e.buf as usize, bufs[k].as_ptr() as usize);
        assert_eq!(&bufs[k][..e.len], &payloads[k][..], "payload {k}");
    }

    // A message with no receive posted waits for the next fi_recv; fi_inject completes nothing.
    let early = pattern(20, 11);
    assert_eq!(
        call!(
            r(a).msg,
            inject(a, early.as_ptr().cast(), early.len(), to_b)
        ),
        0
    );
    let late = pattern(3000, 12);
    assert_eq!(send(a, &late, to_b, 5), 0);
    assert_eq!(read_n(cq_a, 1).unwrap()[0].op_context as usize, 5);
    std::thread::sleep(Duration::from_millis(50));
    for (k, want) in [&early, &late].into_iter().enumerate() {
        let buf = &mut bufs[k];
        buf.fill(0);
        assert_eq!(recv(b, buf, 200 + k), 0);
        let e = read_n(cq_b, 1).unwrap()[0];
        assert_eq!((e.op_context as usize, e.len), (200 + k, want.len()));
        assert_eq!(&buf[..e.len], &want[..]);
    }
    let mut none: FiCqDataEntry = zeroed();
    assert_eq!(
        call!(
            r(cq_a).ops,
            read(cq_a, (&mut none as *mut FiCqDataEntry).cast(), 1)
        ),
        EAGAIN,
        "no completion of fi_inject"
    );

    // The other direction.
    let mut back = [0u8; 64];
    assert_eq!(recv(a, &mut back, 250), 0);
    let reply = pattern(33, 14);
    assert_eq!(send(b, &reply, to_a, 251), 0);
    assert_eq!(read_n(cq_b, 1).unwrap()[0].op_context as usize, 251);
    let e = read_n(cq_a, 1).unwrap()[0];
    assert_eq!((e.op_context as usize, e.len), (250, reply.len()));
    assert_eq!(&back[..e.len], &reply[..]);

    // Truncation: an error entry with the bytes that did not fit.
    let mut small = [0u8; 10];
    assert_eq!(recv(b, &mut small, 300), 0);
    let long = pattern(100, 13);
    assert_eq!(send(a, &long, to_b, 6), 0);
    let err = read_err(cq_b);
    assert_eq!(
        (err.op_context as usize, err.err, err.prov_errno),
        (300, FI_ETRUNC, PROV_TRUNCATED)
    );
    assert_eq!((err.len, err.olen), (10, 90));
    assert_eq!(&small[..], &long[..10]);
    assert_eq!(read_n(cq_a, 1).unwrap()[0].op_context as usize, 6);

    // A destination nobody is bound to: the engine's NoRoute as FI_EHOSTUNREACH, inline and DMA.
    let nowhere = addr::encode(svnic_channels::ChannelAddr::new(MAC, 999));
    let mut to_nowhere = [0u64];
    assert_eq!(insert(&nowhere, &mut to_nowhere, 0), 1);
    let to_nowhere = to_nowhere[0];
    for (k, len) in [(400, 5), (401, 500)] {
        assert_eq!(send(a, &pattern(len, 1), to_nowhere, k), 0);
        let err = read_err(cq_a);
        assert_eq!(
            (err.op_context as usize, err.err, err.prov_errno),
            (k, FI_EHOSTUNREACH, 1),
            "{len} B"
        );
        let s = call!(
            r(cq_a).ops,
            strerror(cq_a, err.prov_errno, null(), null_mut(), 0)
        );
        // SAFETY: strerror returns a static NUL-terminated string when given no buffer.
        assert!(unsafe { CStr::from_ptr(s) }
            .to_str()
            .unwrap()
            .contains("no route"));
    }

    // fi_cancel of a posted receive: an FI_ECANCELED entry; an unknown context: -FI_ENOENT.
    let mut c = [0u8; 16];
    assert_eq!(recv(b, &mut c, 500), 0);
    assert_eq!(call!(r(b).ops, cancel(b.cast(), ctx(500))), 0);
    let err = read_err(cq_b);
    assert_eq!(
        (err.op_context as usize, err.err, err.prov_errno),
        (500, FI_ECANCELED, PROV_CANCELED)
    );
    assert_eq!(
        call!(r(b).ops, cancel(b.cast(), ctx(500))),
        -(FI_ENOENT as isize)
    );

    // FI_WAIT_FD: the descriptor of fi_control(FI_GETWAIT) becomes readable when a completion
    // arrives after fi_trywait said 0; fi_trywait with something to read says -FI_EAGAIN.
    let (rc, cq_w) = cq_open(dom, FI_CQ_FORMAT_DATA, FI_WAIT_FD, 0);
    assert_eq!(rc, 0);
    let mut c: *mut FidEp = null_mut();
    assert_eq!(
        call!(r(dom).ops, endpoint(dom, info, &mut c, null_mut())),
        0
    );
    assert_eq!(bind(c, av.cast(), 0), 0);
    assert_eq!(
        bind(c, cq_w.cast(), op_flags::FI_TRANSMIT | op_flags::FI_RECV),
        0
    );
    assert_eq!(enable(c), 0);
    let mut to_c = [0u64];
    assert_eq!(insert(&getname(c), &mut to_c, 0), 1);
    let to_c = to_c[0];
    let mut obj: c_int = -1;
    let mut fd: c_int = -1;
    let control = |what: c_int, out: &mut c_int| {
        let arg = (out as *mut c_int).cast();
        call!(r(cq_w).fid.ops, control(cq_w.cast(), what, arg))
    };
    assert_eq!(control(FI_GETWAITOBJ, &mut obj), 0);
    assert_eq!(obj, FI_WAIT_FD);
    assert_eq!(control(FI_GETWAIT, &mut fd), 0);
    assert!(fd >= 0);
    let mut none_fd = -1;
    assert_eq!(
        call!(
            r(cq_a).fid.ops,
            control(cq_a.cast(), FI_GETWAIT, (&mut none_fd as *mut c_int).cast())
        ),
        -FI_ENODATA
    );
    let trywait = |fid: *mut Fid| {
        let mut fids = [fid];
        call!(r(fabric).ops, trywait(fabric, fids.as_mut_ptr(), 1))
    };
    assert_eq!(trywait(cq_a.cast()), -FI_EINVAL, "no wait object");
    assert_eq!(trywait(&mut foreign), -FI_EINVAL, "another provider's CQ");
    let mut wbuf = vec![0u8; 4096];
    for round in 0..3usize {
        assert_eq!(recv(c, &mut wbuf, 600 + round), 0);
        assert_eq!(
            trywait(cq_w.cast()),
            0,
            "round {round}: nothing to read yet"
        );
        assert!(
            !readable(fd, 0),
            "round {round}: readable before anything was sent"
        );
        let p = pattern(100 + round * 1000, 15);
        assert_eq!(send(a, &p, to_c, 700 + round), 0);
        assert_eq!(read_n(cq_a, 1).unwrap()[0].op_context as usize, 700 + round);
        assert!(
            readable(fd, 10_000),
            "round {round}: the descriptor never became readable"
        );
        assert_eq!(
            trywait(cq_w.cast()),
            -FI_EAGAIN,
            "round {round}: a completion waits"
        );
        let e = read_n(cq_w, 1).unwrap()[0];
        assert_eq!((e.op_context as usize, e.len), (600 + round, p.len()));
        assert_eq!(&wbuf[..e.len], &p[..]);
        assert!(
            !readable(fd, 0),
            "round {round}: the read drained the descriptor"
        );
    }
    // fi_cq_sread blocks on the descriptor: a timeout with nothing, then a completion.
    let mut one: FiCqDataEntry = zeroed();
    let one_ptr = (&mut one as *mut FiCqDataEntry).cast();
    assert_eq!(
        call!(r(cq_w).ops, sread(cq_w, one_ptr, 1, null(), 50)),
        EAGAIN
    );
    assert_eq!(recv(c, &mut wbuf, 650), 0);
    assert_eq!(send(a, &pattern(7, 16), to_c, 750), 0);
    assert_eq!(
        call!(r(cq_w).ops, sread(cq_w, one_ptr, 1, null(), 10_000)),
        1
    );
    assert_eq!((one.op_context as usize, one.len), (650, 7));
    assert_eq!(read_n(cq_a, 1).unwrap()[0].op_context as usize, 750);

    // Peer liveness: c sent to a, so when a's endpoint goes away while c waits for a message,
    // c's probe meets NoRoute and the waiting receive fails instead of waiting forever.
    assert_eq!(send(c, &pattern(8, 17), to_a, 800), 0);
    assert_eq!(read_n(cq_w, 1).unwrap()[0].op_context as usize, 800);
    assert_eq!(recv(c, &mut wbuf, 801), 0);
    close(a.cast());
    let err = read_err(cq_w);
    assert_eq!(
        (err.op_context as usize, err.err, err.prov_errno),
        (801, FI_EHOSTUNREACH, 1),
        "the receive fails with the engine's NoRoute"
    );
    close(c.cast());
    close(cq_w.cast());

    // Closing: a fid of the right class that is not the provider's is refused; then everything.
    let mut fake_ep = Fid {
        fclass: FI_CLASS_EP,
        context: null_mut(),
        ops: &FOREIGN_OPS,
    };
    assert_eq!(call!(r(b).fid.ops, close(&mut fake_ep)), -FI_EINVAL);
    close_all(&[b.cast(), cq_a.cast(), cq_b.cast()], av, dom, fabric, info);
    let states: Vec<_> = d
        .daemon()
        .engine()
        .channel_records()
        .iter()
        .map(|c| (c.addr.endpoint, c.state))
        .collect();
    assert_eq!(
        states,
        [
            (1, ChannelState::Destroyed),
            (2, ChannelState::Destroyed),
            (3, ChannelState::Destroyed)
        ],
        "closing the endpoints destroyed their channels"
    );
}

/// `fi_tsend` of `buf` to `to` with `tag` and context `ctx(cx)`.
fn tsend(ep: *mut FidEp, buf: &[u8], to: u64, tag: u64, cx: usize) -> isize {
    call!(
        r(ep).tagged,
        send(
            ep,
            buf.as_ptr().cast(),
            buf.len(),
            null_mut(),
            to,
            tag,
            ctx(cx)
        )
    )
}

/// `fi_trecv` into `buf` of a message from `from` whose tag matches `tag` but for the `ignore`
/// bits, with context `ctx(cx)`.
fn trecv(ep: *mut FidEp, buf: &mut [u8], from: u64, tag: u64, ignore: u64, cx: usize) -> isize {
    call!(
        r(ep).tagged,
        recv(
            ep,
            buf.as_mut_ptr().cast(),
            buf.len(),
            null_mut(),
            from,
            tag,
            ignore,
            ctx(cx)
        )
    )
}

/// Reads `n` completions of a TAGGED-format `cq` (or stops at an error entry).
fn read_tagged(cq: *mut FidCq, n: usize) -> Result<Vec<FiCqTaggedEntry>, isize> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < n {
        let mut e: [FiCqTaggedEntry; 4] = zeroed();
        match call!(r(cq).ops, read(cq, e.as_mut_ptr().cast(), 4)) {
            k if k > 0 => got.extend(e.into_iter().take(k as usize)),
            EAGAIN => {
                assert!(Instant::now() < deadline, "{} of {n}", got.len());
                std::thread::yield_now();
            }
            k => return Err(k),
        }
    }
    Ok(got)
}

/// One RDM endpoint of `dom` with its own TAGGED CQ (bound with `cq_flags` for both
/// directions), bound to `av` and enabled.
fn rdm_endpoint(
    dom: *mut FidDomain,
    info: *mut FiInfo,
    av: *mut FidAv,
    cq_flags: u64,
) -> (*mut FidEp, *mut FidCq) {
    let mut ep: *mut FidEp = null_mut();
    assert_eq!(
        call!(r(dom).ops, endpoint(dom, info, &mut ep, null_mut())),
        0
    );
    let (rc, cq) = cq_open(dom, FI_CQ_FORMAT_TAGGED, FI_WAIT_NONE, 0);
    assert_eq!(rc, 0);
    let bind = |what: *mut Fid, flags: u64| call!(r(ep).fid.ops, bind(ep.cast(), what, flags));
    assert_eq!(bind(av.cast(), 0), 0);
    let dirs = op_flags::FI_TRANSMIT | op_flags::FI_RECV;
    assert_eq!(bind(cq.cast(), dirs | cq_flags), 0);
    assert_eq!(
        call!(r(ep).fid.ops, control(ep.cast(), FI_ENABLE, null_mut())),
        0
    );
    (ep, cq)
}

/// Closes `fids` (endpoints, then CQs), then the AV, the domain and the fabric, and frees `info`.
fn close_all(
    fids: &[*mut Fid],
    av: *mut FidAv,
    dom: *mut FidDomain,
    fabric: *mut FidFabric,
    info: *mut FiInfo,
) {
    for &fid in fids {
        close(fid);
    }
    for fid in [av.cast(), dom.cast(), fabric.cast::<Fid>()] {
        close(fid);
    }
    free(info);
}

/// A daemon with `guests`, the provider attached to the first one (`FI_SVNIC_SOCKET`, no fixed
/// endpoint).
fn attached_daemon(
    name: &str,
    guests: &[(MacAddr, &str)],
    engine: EngineOverrides,
) -> DaemonFixture {
    let d = DaemonFixture::start(name, guests, engine);
    std::env::set_var("FI_SVNIC_SOCKET", d.sock(1));
    std::env::remove_var("FI_SVNIC_ENDPOINT");
    d
}

/// Inserts the addresses of `eps` into `av`; their handles, in order.
fn insert_names<const N: usize>(av: *mut FidAv, eps: [*mut FidEp; N]) -> [u64; N] {
    let names: Vec<u8> = eps.map(getname).concat();
    let mut h = [0u64; N];
    assert_eq!(
        call!(
            r(av).ops,
            insert(av, names.as_ptr().cast(), N, h.as_mut_ptr(), 0, null_mut())
        ),
        N as c_int
    );
    h
}

/// The RDM fabric's info and fabric, a domain of it and an AV of `av_type`.
fn rdm_domain(av_type: c_int) -> (*mut FiInfo, *mut FidFabric, *mut FidDomain, *mut FidAv) {
    let (info, fabric) = open_fabric(FI_EP_RDM);
    let mut dom = null_mut();
    assert_eq!(
        call!(r(fabric).ops, domain(fabric, info, &mut dom, null_mut())),
        0
    );
    let mut av_attr: FiAvAttr = zeroed();
    av_attr.type_ = av_type;
    let mut av: *mut FidAv = null_mut();
    assert_eq!(
        call!(r(dom).ops, av_open(dom, &mut av_attr, &mut av, null_mut())),
        0
    );
    (info, fabric, dom, av)
}

/// What every RDM test opens first: the environment lock (held until it closes), a daemon
/// whose first guest the provider attaches to, and the RDM fabric's info and fabric, a domain
/// and an AV.
struct RdmDomain {
    daemon: DaemonFixture,
    info: *mut FiInfo,
    fabric: *mut FidFabric,
    dom: *mut FidDomain,
    av: *mut FidAv,
    _env: MutexGuard<'static, ()>,
}

impl RdmDomain {
    /// Opens it on a daemon of one guest: an AV of `av_type`, the provider's variables `env` set
    /// while the domain (which keeps the configuration they give) opens.
    fn open(name: &str, av_type: c_int, env: &[(&str, &str)]) -> RdmDomain {
        let engine = EngineOverrides::default();
        RdmDomain::open_with(name, &[(MAC, "")], engine, av_type, env)
    }

    /// [`RdmDomain::open`] on a daemon of `guests` with the engine settings `engine`.
    fn open_with(
        name: &str,
        guests: &[(MacAddr, &str)],
        engine: EngineOverrides,
        av_type: c_int,
        env: &[(&str, &str)],
    ) -> RdmDomain {
        let lock = env_lock();
        let daemon = attached_daemon(name, guests, engine);
        for (k, v) in env {
            std::env::set_var(k, v);
        }
        let (info, fabric, dom, av) = rdm_domain(av_type);
        for (k, _) in env {
            std::env::remove_var(k);
        }
        RdmDomain {
            daemon,
            info,
            fabric,
            dom,
            av,
            _env: lock,
        }
    }

    /// An endpoint as [`rdm_endpoint`] opens it.
    fn endpoint(&self, cq_flags: u64) -> (*mut FidEp, *mut FidCq) {
        rdm_endpoint(self.dom, self.info, self.av, cq_flags)
    }

    /// Closes `fids` (endpoints, then CQs), then everything it opened.
    fn close(self, fids: &[*mut Fid]) {
        close_all(fids, self.av, self.dom, self.fabric, self.info);
    }
}

#[test]
fn rdm_endpoints_match_tags_and_sources_keep_unexpected_messages_and_report_dead_peers() {
    let rdm = RdmDomain::open(
        "fi-api-rdm",
        FI_AV_MAP,
        &[("FI_SVNIC_PEER_TIMEOUT_MS", "200")],
    );
    let (info, av) = (rdm.info, rdm.av);
    // As Open MPI asks: completions by default, and selective completion on the CQ (of a).
    // SAFETY: the live attributes of the provider's list.
    unsafe { (*r(info).tx_attr).op_flags = op_flags::FI_COMPLETION };
    let (a, cq_a) = rdm.endpoint(op_flags::FI_SELECTIVE_COMPLETION);
    let (b, cq_b) = rdm.endpoint(0);
    let (c, cq_c) = rdm.endpoint(0);
    let [to_a, to_b, to_c] = insert_names(av, [a, b, c]);

    // Selective completion on a, FI_COMPLETION in its default op_flags: plain sends report,
    // `*msg` sends only with FI_COMPLETION in their flags.
    let send_done = |cx: usize| {
        let e = read_tagged(cq_a, 1).unwrap()[0];
        assert_eq!(e.data_entry.op_context as usize, cx);
        assert_eq!(e.data_entry.flags, op_flags::FI_SEND | op_flags::FI_TAGGED);
    };

    // Tags, sizes (inline, staged, the 64 KiB maximum), received out of their sending order
    // from the unexpected queue, and an untagged message that only an fi_recv takes.
    let payloads = [
        pattern(3, 1),
        pattern(19, 2),
        pattern(20, 3),
        pattern(5000, 4),
    ];
    let big = pattern(65536, 5);
    for (k, p) in payloads.iter().enumerate() {
        assert_eq!(tsend(a, p, to_b, 10 + k as u64, k), 0);
        send_done(k);
    }
    assert_eq!(tsend(a, &big, to_b, 99, 9), 0);
    send_done(9);
    assert_eq!(
        tsend(a, &pattern(8 * 65536 + 1, 6), to_b, 1, 0),
        -(FI_EMSGSIZE as isize)
    );
    let untagged = pattern(7, 7);
    assert_eq!(
        call!(
            r(a).msg,
            send(a, untagged.as_ptr().cast(), 7, null_mut(), to_b, ctx(20))
        ),
        0
    );
    let e = read_tagged(cq_a, 1).unwrap()[0];
    assert_eq!(
        (e.data_entry.op_context as usize, e.data_entry.flags),
        (20, op_flags::FI_SEND | op_flags::FI_MSG)
    );
    std::thread::sleep(Duration::from_millis(50));
    let mut buf = vec![0u8; 65536];
    assert_eq!(trecv(b, &mut buf, FI_ADDR_UNSPEC, 99, 0, 199), 0);
    let e = read_tagged(cq_b, 1).unwrap()[0];
    assert_eq!(
        (e.data_entry.op_context as usize, e.data_entry.len, e.tag),
        (199, 65536, 99)
    );
    assert_eq!(e.data_entry.flags, op_flags::FI_RECV | op_flags::FI_TAGGED);
    assert_eq!(buf, big);
    let mut ubuf = [0u8; 16];
    assert_eq!(
        call!(
            r(b).msg,
            recv(
                b,
                ubuf.as_mut_ptr().cast(),
                16,
                null_mut(),
                FI_ADDR_UNSPEC,
                ctx(120)
            )
        ),
        0
    );
    let e = read_tagged(cq_b, 1).unwrap()[0];
    assert_eq!(
        (e.data_entry.op_context as usize, e.data_entry.len),
        (120, 7)
    );
    assert_eq!(e.data_entry.flags, op_flags::FI_RECV | op_flags::FI_MSG);
    assert_eq!(&ubuf[..7], &untagged[..]);
    for k in (0..payloads.len()).rev() {
        buf.fill(0);
        // Tag 10 + k, matched through the ignore bits for k = 0 (tag 8 | ignore 2 = 10).
        let (tag, ignore) = if k == 0 { (8, 2) } else { (10 + k as u64, 0) };
        assert_eq!(trecv(b, &mut buf, FI_ADDR_UNSPEC, tag, ignore, 100 + k), 0);
        let e = read_tagged(cq_b, 1).unwrap()[0];
        assert_eq!(
            (e.data_entry.op_context as usize, e.data_entry.len, e.tag),
            (100 + k, payloads[k].len(), 10 + k as u64)
        );
        assert_eq!(&buf[..e.data_entry.len], &payloads[k][..]);
    }

    // A posted receive that nothing matches stays posted; fi_inject with the header's room;
    // remote CQ data; `*msg` sends under selective completion.
    let mut waiting = [0u8; 8];
    assert_eq!(trecv(b, &mut waiting, FI_ADDR_UNSPEC, 77, 0, 300), 0);
    let small = pattern(19, 8);
    assert_eq!(
        call!(r(a).tagged, inject(a, small.as_ptr().cast(), 19, to_b, 5)),
        0
    );
    assert_eq!(
        call!(r(a).tagged, inject(a, small.as_ptr().cast(), 20, to_b, 5)),
        -(FI_EMSGSIZE as isize)
    );
    assert_eq!(
        call!(
            r(a).tagged,
            senddata(
                a,
                small.as_ptr().cast(),
                10,
                null_mut(),
                0xfeed,
                to_b,
                6,
                ctx(31)
            )
        ),
        0
    );
    send_done(31);
    let iov = [libc::iovec {
        iov_base: small.as_ptr() as *mut c_void,
        iov_len: 4,
    }];
    let mut msg = FiMsgTagged {
        msg_iov: iov.as_ptr(),
        desc: null_mut(),
        iov_count: 1,
        addr: to_b,
        tag: 7,
        ignore: 0,
        context: ctx(32),
        data: 0xbeef,
    };
    assert_eq!(call!(r(a).tagged, sendmsg(a, &msg, 0)), 0);
    msg.context = ctx(33);
    let flags = op_flags::FI_COMPLETION | op_flags::FI_REMOTE_CQ_DATA;
    assert_eq!(call!(r(a).tagged, sendmsg(a, &msg, flags)), 0);
    send_done(33);
    let mut got = Vec::new();
    for (k, tag) in [(0usize, 5u64), (1, 6), (2, 7), (3, 7)] {
        let mut bb = [0u8; 32];
        assert_eq!(trecv(b, &mut bb, to_a, tag, 0, 400 + k), 0);
        let e = read_tagged(cq_b, 1).unwrap()[0];
        let d = e.data_entry;
        got.push((d.op_context as usize, d.len, e.tag, d.data, d.flags));
    }
    let (rt, rd) = (
        op_flags::FI_RECV | op_flags::FI_TAGGED,
        op_flags::FI_RECV | op_flags::FI_TAGGED | op_flags::FI_REMOTE_CQ_DATA,
    );
    assert_eq!(
        got,
        [
            (400, 19, 5, 0, rt),
            (401, 10, 6, 0xfeed, rd),
            (402, 4, 7, 0, rt),
            (403, 4, 7, 0xbeef, rd)
        ]
    );
    let mut none: FiCqTaggedEntry = zeroed();
    let none_ptr = (&mut none as *mut FiCqTaggedEntry).cast();
    assert_eq!(
        call!(r(cq_a).ops, read(cq_a, none_ptr, 1)),
        EAGAIN,
        "no completion of fi_tinject nor of a selective fi_tsendmsg without FI_COMPLETION"
    );
    assert_eq!(
        call!(r(b).tagged, recvmsg(b, &msg, 1 << 16)),
        -(FI_EBADFLAGS as isize),
        "FI_MULTI_RECV is not offered"
    );

    // Directed receives: b takes c's message first although a's arrived before it.
    let (from_a, from_c) = (pattern(30, 9), pattern(31, 10));
    assert_eq!(tsend(a, &from_a, to_b, 50, 50), 0);
    send_done(50);
    assert_eq!(tsend(c, &from_c, to_b, 50, 51), 0);
    assert_eq!(
        read_tagged(cq_c, 1).unwrap()[0].data_entry.op_context as usize,
        51
    );
    std::thread::sleep(Duration::from_millis(50));
    for (from, want, cx) in [(to_c, &from_c, 500), (to_a, &from_a, 501)] {
        buf.fill(0);
        assert_eq!(trecv(b, &mut buf, from, 50, 0, cx), 0);
        let e = read_tagged(cq_b, 1).unwrap()[0];
        assert_eq!(
            (e.data_entry.op_context as usize, e.data_entry.len),
            (cx, want.len())
        );
        assert_eq!(&buf[..want.len()], &want[..]);
    }
    assert_eq!(trecv(b, &mut buf, 77, 0, 0, 0), EINVAL, "unknown source");

    // FI_PEEK: nothing with tag 90 yet (FI_ENOMSG); then a message is found and stays queued,
    // is claimed (FI_PEEK|FI_CLAIM) so that a receive of its tag does not get it, and is
    // received by the claim (FI_CLAIM, the same context); FI_PEEK|FI_DISCARD drops one.
    let tmsg = |tag: u64, flags: u64, cx: usize, buf: &mut [u8]| {
        let iov = [libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        }];
        let m = FiMsgTagged {
            msg_iov: iov.as_ptr(),
            desc: null_mut(),
            iov_count: 1,
            addr: FI_ADDR_UNSPEC,
            tag,
            ignore: 0,
            context: ctx(cx),
            data: 0,
        };
        call!(r(b).tagged, recvmsg(b, &m, flags))
    };
    let (peek, claim, discard) = (op_flags::FI_PEEK, op_flags::FI_CLAIM, op_flags::FI_DISCARD);
    assert_eq!(tmsg(90, peek, 900, &mut []), 0);
    let err = read_err(cq_b);
    assert_eq!(
        (err.op_context as usize, err.err, err.prov_errno),
        (900, FI_ENOMSG, PROV_NO_MESSAGE)
    );
    let claimed = pattern(2000, 12);
    assert_eq!(tsend(a, &claimed, to_b, 90, 90), 0);
    send_done(90);
    assert_eq!(tsend(a, &pattern(5, 13), to_b, 91, 91), 0);
    send_done(91);
    std::thread::sleep(Duration::from_millis(50));
    for (flags, cx) in [(peek, 901), (peek | claim, 902)] {
        assert_eq!(tmsg(90, flags, cx, &mut []), 0);
        let e = read_tagged(cq_b, 1).unwrap()[0];
        let d = e.data_entry;
        assert_eq!((d.op_context as usize, d.len, e.tag), (cx, 2000, 90));
    }
    let mut other = [0u8; 8];
    assert_eq!(trecv(b, &mut other, FI_ADDR_UNSPEC, 90, 0, 903), 0);
    buf.fill(0);
    assert_eq!(tmsg(90, claim, 902, &mut buf), 0);
    let e = read_tagged(cq_b, 1).unwrap()[0];
    let d = e.data_entry;
    assert_eq!((d.op_context as usize, d.len, e.tag), (902, 2000, 90));
    assert_eq!(&buf[..2000], &claimed[..]);
    assert_eq!(tmsg(90, claim, 902, &mut buf), EINVAL, "claimed once");
    assert_eq!(tmsg(91, peek | discard, 904, &mut []), 0);
    let e = read_tagged(cq_b, 1).unwrap()[0];
    assert_eq!(
        (e.data_entry.op_context as usize, e.data_entry.len, e.tag),
        (904, 5, 91)
    );
    assert_eq!(tmsg(91, peek, 905, &mut []), 0);
    assert_eq!(read_err(cq_b).err, FI_ENOMSG, "discarded");
    assert_eq!(
        call!(r(b).ops, cancel(b.cast(), ctx(903))),
        0,
        "not given the claimed message"
    );
    assert_eq!(read_err(cq_b).err, FI_ECANCELED);

    // Waits for a's send `cx` while b progresses (reads its CQ, finding nothing there).
    let send_done_b_polling = |cx: usize| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut e: FiCqTaggedEntry = zeroed();
            let at = (&mut e as *mut FiCqTaggedEntry).cast();
            assert_eq!(call!(r(cq_b).ops, read(cq_b, at, 1)), EAGAIN);
            let rc = call!(r(cq_a).ops, read(cq_a, at, 1));
            if rc == 1 {
                assert_eq!(e.data_entry.op_context as usize, cx);
                return;
            }
            assert_eq!(rc, EAGAIN, "send {cx}");
            assert!(Instant::now() < deadline, "send {cx} never completed");
        }
    };
    // More unexpected DMA-data messages than bounce buffers, while b progresses (reads its
    // CQ): copied out of the bounce buffers, none refused, and taken in order.
    let many: Vec<Vec<u8>> = (0..40).map(|k| pattern(4096, k as u8)).collect();
    for (k, p) in many.iter().enumerate() {
        assert_eq!(tsend(a, p, to_b, 1000, 1000 + k), 0);
        send_done_b_polling(1000 + k);
    }
    for (k, p) in many.iter().enumerate() {
        buf.fill(0);
        assert_eq!(trecv(b, &mut buf, FI_ADDR_UNSPEC, 1000, 0, 2000 + k), 0);
        let e = read_tagged(cq_b, 1).unwrap()[0];
        assert_eq!(
            (e.data_entry.op_context as usize, e.data_entry.len),
            (2000 + k, 4096)
        );
        assert_eq!(&buf[..4096], &p[..], "message {k}");
    }

    // Messages longer than a bounce buffer travel in parts: into a posted receive of two
    // segments, as an unexpected message, the largest, and truncated (one completion each).
    let (mut seg1, mut seg2) = (vec![0u8; 100_000], vec![0u8; 8 * 65536]);
    let iov = [
        libc::iovec {
            iov_base: seg1.as_mut_ptr().cast(),
            iov_len: seg1.len(),
        },
        libc::iovec {
            iov_base: seg2.as_mut_ptr().cast(),
            iov_len: seg2.len(),
        },
    ];
    let long = pattern(300_000, 21);
    assert_eq!(
        call!(
            r(b).tagged,
            recvv(
                b,
                iov.as_ptr(),
                null_mut(),
                2,
                FI_ADDR_UNSPEC,
                70,
                0,
                ctx(1100)
            )
        ),
        0
    );
    assert_eq!(tsend(a, &long, to_b, 70, 1101), 0);
    send_done(1101);
    let e = read_tagged(cq_b, 1).unwrap()[0];
    assert_eq!(
        (e.data_entry.op_context as usize, e.data_entry.len, e.tag),
        (1100, 300_000, 70)
    );
    assert_eq!(&seg1[..], &long[..100_000]);
    assert_eq!(&seg2[..200_000], &long[100_000..]);
    let largest = pattern(8 * 65536, 22);
    assert_eq!(tsend(a, &largest, to_b, 71, 1102), 0);
    // No receive is posted: b assembles the parts as an unexpected message.
    send_done_b_polling(1102);
    seg2.fill(0);
    assert_eq!(trecv(b, &mut seg2, FI_ADDR_UNSPEC, 71, 0, 1103), 0);
    let e = read_tagged(cq_b, 1).unwrap()[0];
    assert_eq!(
        (e.data_entry.op_context as usize, e.data_entry.len),
        (1103, 8 * 65536)
    );
    assert_eq!(seg2, largest, "unexpected, assembled");
    assert_eq!(trecv(b, &mut seg1, FI_ADDR_UNSPEC, 72, 0, 1104), 0);
    assert_eq!(tsend(a, &long, to_b, 72, 1105), 0);
    send_done(1105);
    let err = read_err(cq_b);
    assert_eq!(
        (err.op_context as usize, err.err, err.len, err.olen, err.tag),
        (1104, FI_ETRUNC, 100_000, 200_000, 72)
    );
    assert_eq!(&seg1[..], &long[..100_000]);

    // Truncation keeps the tag; a send to an endpoint nobody owns fails FI_EHOSTUNREACH.
    let mut tiny = [0u8; 4];
    assert_eq!(trecv(b, &mut tiny, FI_ADDR_UNSPEC, 60, 0, 600), 0);
    assert_eq!(tsend(a, &pattern(100, 11), to_b, 60, 60), 0);
    send_done(60);
    let err = read_err(cq_b);
    assert_eq!(
        (err.op_context as usize, err.err, err.olen, err.tag),
        (600, FI_ETRUNC, 96, 60)
    );
    let nowhere = addr::encode(svnic_channels::ChannelAddr::new(MAC, 999));
    let mut to_nowhere = [0u64];
    assert_eq!(
        call!(
            r(av).ops,
            insert(
                av,
                nowhere.as_ptr().cast(),
                1,
                to_nowhere.as_mut_ptr(),
                0,
                null_mut()
            )
        ),
        1
    );
    assert_eq!(tsend(a, &pattern(9, 1), to_nowhere[0], 1, 700), 0);
    let err = read_err(cq_a);
    assert_eq!(
        (err.op_context as usize, err.err, err.prov_errno),
        (700, FI_EHOSTUNREACH, 1)
    );

    // A peer that goes away: b's receive directed at c fails once the peer timeout passes
    // (b has sent to c, so it probes it), the one still waiting for a's tag 77 stays posted.
    let mut cbuf = [0u8; 8];
    assert_eq!(trecv(c, &mut cbuf, FI_ADDR_UNSPEC, 1, 0, 800), 0);
    assert_eq!(tsend(b, &pattern(8, 1), to_c, 1, 801), 0);
    assert_eq!(
        read_tagged(cq_b, 1).unwrap()[0].data_entry.op_context as usize,
        801
    );
    assert_eq!(
        read_tagged(cq_c, 1).unwrap()[0].data_entry.op_context as usize,
        800
    );
    close(c.cast());
    assert_eq!(trecv(b, &mut buf, to_c, 2, 0, 802), 0);
    let err = read_err(cq_b);
    assert_eq!(err.op_context as usize, 802, "the receive directed at c");
    assert!(
        [FI_EHOSTUNREACH, FI_ECONNRESET].contains(&err.err),
        "{}",
        err.err
    );
    assert_eq!(
        call!(r(b).ops, cancel(b.cast(), ctx(300))),
        0,
        "still posted"
    );
    let err = read_err(cq_b);
    assert_eq!((err.op_context as usize, err.err), (300, FI_ECANCELED));

    rdm.close(&[a.cast(), b.cast(), cq_a.cast(), cq_b.cast(), cq_c.cast()]);
}

/// The entries of `cq` there are now (tagged format), none if it has none; panics on an error
/// entry (`who` names the side in the message).
fn read_now(cq: *mut FidCq, who: &str) -> Vec<FiCqTaggedEntry> {
    let mut e: [FiCqTaggedEntry; 8] = zeroed();
    match call!(r(cq).ops, read(cq, e.as_mut_ptr().cast(), 8)) {
        k if k > 0 => e.into_iter().take(k as usize).collect(),
        EAGAIN => Vec::new(),
        k if k == -(FI_EAVAIL as isize) => {
            let mut err: FiCqErrEntry = zeroed();
            call!(r(cq).ops, readerr(cq, &mut err, 0));
            panic!("{who}: error entry {} ({})", err.err, err.prov_errno);
        }
        k => panic!("{who}: read {k}"),
    }
}

/// Two RDM endpoints, a sending to b, of a daemon whose engine waits 20 ms for a receive
/// buffer: b with two bounce buffers and `bufs.len()` tagged receives (tag 7) of 64 bytes posted
/// into `bufs`, a with `tx_buffers` staging slots.
struct OrderRig {
    rdm: RdmDomain,
    a: *mut FidEp,
    cq_a: *mut FidCq,
    b: *mut FidEp,
    cq_b: *mut FidCq,
    to_b: u64,
}

impl OrderRig {
    fn start(name: &str, tx_buffers: &str, bufs: &mut [[u8; 64]]) -> OrderRig {
        let wait = EngineOverrides {
            backpressure_wait_ms: Some(20),
            ..EngineOverrides::default()
        };
        let env = [
            ("FI_SVNIC_RX_BUFFERS", "2"),
            ("FI_SVNIC_TX_BUFFERS", tx_buffers),
        ];
        let rdm = RdmDomain::open_with(name, &[(MAC, "")], wait, FI_AV_TABLE, &env);
        let (a, cq_a) = rdm.endpoint(0);
        let (b, cq_b) = rdm.endpoint(0);
        let [_, to_b] = insert_names(rdm.av, [a, b]);
        for (k, buf) in bufs.iter_mut().enumerate() {
            assert_eq!(trecv(b, buf, FI_ADDR_UNSPEC, 7, 0, k), 0);
        }
        OrderRig {
            rdm,
            a,
            cq_a,
            b,
            cq_b,
            to_b,
        }
    }

    /// Sends message `k` (64 bytes: DMA-data, each needing a bounce buffer, numbered in their
    /// first bytes) with context `ctx(n + k)`.
    fn send(&self, k: usize, n: usize) -> isize {
        let mut m = [0u8; 64];
        m[..8].copy_from_slice(&(k as u64).to_le_bytes());
        tsend(self.a, &m, self.to_b, 7, n + k)
    }

    /// The message numbers in `bufs`.
    fn numbers(bufs: &[[u8; 64]]) -> Vec<u64> {
        bufs.iter()
            .map(|b| u64::from_le_bytes(b[..8].try_into().unwrap()))
            .collect()
    }

    /// Checks that neither CQ has anything more, and closes everything.
    fn finish(self) {
        assert!(
            read_now(self.cq_a, "sender").is_empty() && read_now(self.cq_b, "receiver").is_empty(),
            "nothing more"
        );
        let eps_and_cqs = [
            self.a.cast(),
            self.b.cast(),
            self.cq_a.cast(),
            self.cq_b.cast(),
        ];
        self.rdm.close(&eps_and_cqs);
    }
}

/// FI_ORDER_SAS when sends are retried: a receiver with two bounce buffers stops calling into
/// libfabric for 200 ms (ten times the engine's backpressure wait) while its sender streams
/// numbered tagged messages, so the engine completes the sends behind it NoBuffer and the
/// provider retries them, while later ones find buffers once the receiver is back. Every
/// message arrives exactly once and in send order, and no send fails.
#[test]
fn rdm_retried_sends_keep_their_order_behind_a_receiver_that_stopped() {
    const N: usize = 300;
    let mut bufs = vec![[0u8; 64]; N];
    let rig = OrderRig::start("fi-api-order", "14", &mut bufs);
    let retries_before = svnic_fi::stats::SEND_RETRIES.get();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut sent, mut sends_done) = (0, 0);
    let mut received: Vec<usize> = Vec::new();
    let mut pause: Option<Instant> = None;
    while received.len() < N || sends_done < N {
        assert!(
            Instant::now() < deadline,
            "sent {sent}, {sends_done} send completions, {} received",
            received.len()
        );
        if sent < N {
            match rig.send(sent, N) {
                0 => sent += 1,
                EAGAIN => {}
                rc => panic!("send {sent}: {rc}"),
            }
        }
        sends_done += read_now(rig.cq_a, "sender").len();
        if sent >= 20 && pause.is_none() {
            pause = Some(Instant::now());
        }
        if pause.is_some_and(|t| t.elapsed() < Duration::from_millis(200)) {
            std::thread::yield_now();
            continue;
        }
        for e in read_now(rig.cq_b, "receiver") {
            assert_eq!(e.data_entry.len, 64);
            received.push(e.data_entry.op_context as usize);
        }
    }
    assert_eq!(
        received,
        (0..N).collect::<Vec<_>>(),
        "completions in posted order"
    );
    assert_eq!(
        OrderRig::numbers(&bufs),
        (0..N as u64).collect::<Vec<_>>(),
        "messages in send order"
    );
    assert!(
        svnic_fi::stats::SEND_RETRIES.get() > retries_before,
        "the receiver's stop made the engine answer NoBuffer and the provider retry"
    );
    rig.finish();
}

/// A send that finally fails (its receiver stopped for longer than the 8 retries take) does not
/// leave the receiver waiting for it: once the receiver is back, the messages sent after it (a
/// few, far fewer than the window, so that only the failed send's skip marker can release them)
/// arrive, in order, and the failed ones never do.
#[test]
fn rdm_a_send_that_finally_failed_does_not_hold_up_the_later_ones() {
    const N: usize = 200;
    let mut bufs = vec![[0u8; 64]; N];
    let rig = OrderRig::start("fi-api-skip", "4", &mut bufs);
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut sent, mut ok) = (0, 0);
    let mut failed: Vec<usize> = Vec::new();
    let mut received = 0;
    // The receiver takes messages until 10 are sent, then stops until a send has failed; once it
    // is back, `after` more are sent, and nothing else.
    let after = 5;
    let mut back = false;
    let mut back_at: Option<Instant> = None;
    let mut last = None;
    loop {
        assert!(
            Instant::now() < deadline,
            "sent {sent}, {ok} sent, {failed:?} failed, {received} received"
        );
        let target = if back { last.unwrap_or(sent) } else { N };
        if sent < target {
            match rig.send(sent, N) {
                0 => sent += 1,
                EAGAIN => {}
                rc => panic!("send {sent}: {rc}"),
            }
        }
        let cq_a = rig.cq_a;
        let mut e: [FiCqTaggedEntry; 8] = zeroed();
        match call!(r(cq_a).ops, read(cq_a, e.as_mut_ptr().cast(), 8)) {
            k if k > 0 => ok += k as usize,
            EAGAIN => {}
            k if k == -(FI_EAVAIL as isize) => {
                let mut err: FiCqErrEntry = zeroed();
                assert_eq!(call!(r(cq_a).ops, readerr(cq_a, &mut err, 0)), 1);
                assert_eq!(err.err, FI_ENORX);
                failed.push(err.op_context as usize - N);
            }
            k => panic!("sender: read {k}"),
        }
        if sent < 10 || back {
            let got = read_now(rig.cq_b, "receiver");
            received += got.len();
        } else if !failed.is_empty() {
            back = true;
            back_at = Some(Instant::now());
            last = Some(sent + after);
        }
        // Well inside the receiver's give-up time for a gap (GAP_WAIT, 30 s), which would also
        // release the messages behind a missing number: only the skip marker can have done it.
        assert!(
            back_at.is_none_or(|t| t.elapsed() < Duration::from_secs(10)),
            "the messages after a failed send took 10 s once the receiver was back"
        );
        if back
            && sent == last.unwrap_or(0)
            && ok + failed.len() == sent
            && received + failed.len() == sent
        {
            break;
        }
    }
    assert!(!failed.is_empty());
    let delivered: Vec<u64> = (0..sent as u64)
        .filter(|k| !failed.contains(&(*k as usize)))
        .collect();
    assert_eq!(
        OrderRig::numbers(&bufs[..received]),
        delivered,
        "the messages that were not failed, in send order, the last ones too"
    );
    rig.finish();
}

/// An RDM endpoint whose unexpected queue is full still reads its RX ring: b takes 140
/// unmatched 64 KiB messages from a (8 MiB copied out, the rest kept in bounce buffers), and
/// then b's own send to a completes and reaches a. Once b posts receives for them, all 140
/// arrive, in order and intact.
#[test]
fn rdm_an_endpoint_with_a_full_unexpected_queue_still_completes_its_sends() {
    let rdm = RdmDomain::open("fi-api-full", FI_AV_TABLE, &[]);
    let (a, cq_a) = rdm.endpoint(0);
    let (b, cq_b) = rdm.endpoint(0);
    let [to_a, to_b] = insert_names(rdm.av, [a, b]);
    const N: usize = 140;
    const LEN: usize = 64 << 10;
    const { assert!(N * LEN > svnic_fi::ep::UNEXPECTED_BYTES) };
    let msgs: Vec<Vec<u8>> = (0..N).map(|k| pattern(LEN, k as u8)).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut sent, mut done) = (0, 0);
    while done < N {
        assert!(Instant::now() < deadline, "sent {sent}, {done} completions");
        if sent < N {
            match tsend(a, &msgs[sent], to_b, 9, sent) {
                0 => sent += 1,
                EAGAIN => {}
                rc => panic!("send {sent}: {rc}"),
            }
        }
        done += read_now(cq_a, "a").len();
        assert!(read_now(cq_b, "b").is_empty(), "b posted nothing");
    }

    // b's own send completes although its unexpected queue is over its bounds.
    let mut back = [0u8; 64];
    assert_eq!(trecv(a, &mut back, FI_ADDR_UNSPEC, 1, 0, 1000), 0);
    let hello = pattern(64, 77);
    assert_eq!(tsend(b, &hello, to_a, 1, 2000), 0);
    let mut b_done = Vec::new();
    let mut a_got = Vec::new();
    while b_done.is_empty() || a_got.is_empty() {
        assert!(
            Instant::now() < deadline,
            "b's send completed: {}, a received it: {}",
            !b_done.is_empty(),
            !a_got.is_empty()
        );
        b_done.extend(read_now(cq_b, "b"));
        a_got.extend(read_now(cq_a, "a"));
        std::thread::yield_now();
    }
    assert_eq!(b_done[0].data_entry.op_context as usize, 2000);
    assert_eq!(a_got[0].data_entry.op_context as usize, 1000);
    assert_eq!(&back[..], &hello[..]);

    // Nothing was lost: every unexpected message is received, in order.
    let mut bufs = vec![vec![0u8; LEN]; N];
    for (k, buf) in bufs.iter_mut().enumerate() {
        assert_eq!(trecv(b, buf, FI_ADDR_UNSPEC, 9, 0, k), 0, "receive {k}");
    }
    let got = read_tagged(cq_b, N).unwrap();
    let order: Vec<usize> = got
        .iter()
        .map(|e| e.data_entry.op_context as usize)
        .collect();
    assert_eq!(order, (0..N).collect::<Vec<_>>());
    assert!(got.iter().all(|e| e.data_entry.len == LEN && e.tag == 9));
    assert!(bufs == msgs, "the messages' bytes, in send order");
    let eps_and_cqs = [a.cast(), b.cast(), cq_a.cast(), cq_b.cast()];
    rdm.close(&eps_and_cqs);
}

/// Messages in parts from a peer that does not follow the protocol, sent through a raw channel
/// of a second guest: a receive that took a first part (and waits for parts that never come)
/// can be cancelled, and a part carrying bytes past the announced length fails its receive
/// instead of completing it; the sender's next message is received as usual. A receive
/// waiting for the later parts of a sender that is then gone fails once the endpoint's probe
/// finds it gone.
#[test]
fn rdm_receives_of_broken_messages_in_parts_can_be_cancelled_or_fail() {
    const MAC2: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x72, 0x01, 0x02]);
    let guests = [(MAC, ""), (MAC2, "")];
    let env = [("FI_SVNIC_PEER_TIMEOUT_MS", "200")];
    let engine = EngineOverrides::default();
    let rdm = RdmDomain::open_with("fi-api-parts", &guests, engine, FI_AV_TABLE, &env);
    let av = rdm.av;
    let (b, cq_b) = rdm.endpoint(0);
    let to = addr::decode(&getname(b)).unwrap();
    let peer = rdm.daemon.guest(2);
    let mut raw = peer
        .create_channel(1, 256, Duration::from_secs(10))
        .unwrap();
    let raw_addr = addr::encode(raw.addr());
    // Posts a receive (context `cx`) into `buf`, then sends from the raw channel message `seq`,
    // announced as `total` bytes in parts (None: whole), with `payload`.
    let mut cookie = 0;
    let mut recv_raw = |buf: &mut [u8], cx: usize, seq: u32, total: Option<u64>, payload: &[u8]| {
        let rc = call!(
            r(b).msg,
            recv(
                b,
                buf.as_mut_ptr().cast(),
                buf.len(),
                null_mut(),
                FI_ADDR_UNSPEC,
                ctx(cx)
            )
        );
        assert_eq!(rc, 0);
        let h = svnic_fi::rdm::Header {
            seq: Some(seq),
            total,
            ..Default::default()
        };
        let (hb, n) = h.encode();
        let mut m = hb[..n].to_vec();
        m.extend_from_slice(payload);
        cookie += 1;
        assert!(raw
            .send_user(to, cookie, &m, svnic_client::Completions::OnError)
            .unwrap());
        raw.flush().unwrap();
    };
    let settle = || {
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(300) {
            assert!(read_now(cq_b, "b").is_empty());
            std::thread::yield_now();
        }
    };

    // A first part of a 1000-byte message, and nothing more: the receive can be cancelled.
    let mut buf1 = [0u8; 2000];
    recv_raw(&mut buf1, 1, 0, Some(1000), &[1; 10]);
    settle();
    assert_eq!(
        call!(r(b).ops, cancel(b.cast(), ctx(1))),
        0,
        "the receive taking the message in parts is cancelled"
    );
    let err = read_err(cq_b);
    assert_eq!((err.op_context as usize, err.err), (1, FI_ECANCELED));

    // A first part with more bytes than the message it announces fails its receive.
    let mut buf2 = [0u8; 2000];
    recv_raw(&mut buf2, 2, 1, Some(4), &[2; 10]);
    let err = read_err(cq_b);
    assert_eq!((err.op_context as usize, err.err), (2, FI_EIO));

    // The sender's next message is received as usual.
    let mut buf3 = [0u8; 64];
    recv_raw(&mut buf3, 3, 2, None, &[3; 5]);
    let got = read_tagged(cq_b, 1).unwrap();
    assert_eq!(
        (got[0].data_entry.op_context as usize, got[0].data_entry.len),
        (3, 5)
    );
    assert_eq!(&buf3[..5], &[3; 5]);

    // b has sent to the peer (so it probes it); the peer sends a first part and goes away.
    let mut to_raw = 0u64;
    assert_eq!(
        call!(
            r(av).ops,
            insert(av, raw_addr.as_ptr().cast(), 1, &mut to_raw, 0, null_mut())
        ),
        1
    );
    let ping = [0u8; 8];
    assert_eq!(
        call!(
            r(b).msg,
            inject(b, ping.as_ptr().cast(), ping.len(), to_raw)
        ),
        0
    );
    let mut buf4 = [0u8; 2000];
    recv_raw(&mut buf4, 4, 3, Some(1000), &[4; 10]);
    settle();
    peer.destroy_channel(raw, Duration::from_secs(10)).unwrap();
    let err = read_err(cq_b);
    assert_eq!(err.op_context as usize, 4);
    assert!(
        [FI_EHOSTUNREACH, FI_ECONNRESET].contains(&err.err),
        "{}",
        err.err
    );
    rdm.close(&[b.cast(), cq_b.cast()]);
}

/// The RDM `max_msg_size` fi_getinfo advertises is what the endpoint accepts: with 4 staging
/// slots (fewer than the 8 parts a message may have) it is 4 parts, and a message of exactly
/// that size is sent and received while one byte more is `-FI_EMSGSIZE`.
#[test]
fn rdm_max_msg_size_advertised_is_what_the_endpoint_takes() {
    let rdm = RdmDomain::open(
        "fi-api-maxmsg",
        FI_AV_TABLE,
        &[("FI_SVNIC_TX_BUFFERS", "4")],
    );
    let max = r(r(rdm.info).ep_attr).max_msg_size;
    let (a, cq_a) = rdm.endpoint(0);
    let (b, cq_b) = rdm.endpoint(0);
    assert_eq!(max, 4 * svnic_fi::config::DEFAULT_MAX_MSG_SIZE);
    let [_, to_b] = insert_names(rdm.av, [a, b]);
    let msg = pattern(max + 1, 5);
    let send = |len: usize| {
        call!(
            r(a).msg,
            send(a, msg.as_ptr().cast(), len, null_mut(), to_b, ctx(1))
        )
    };
    assert_eq!(send(max + 1), -(FI_EMSGSIZE as isize));
    let mut buf = vec![0u8; max];
    assert_eq!(
        call!(
            r(b).msg,
            recv(
                b,
                buf.as_mut_ptr().cast(),
                max,
                null_mut(),
                FI_ADDR_UNSPEC,
                ctx(2)
            )
        ),
        0
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match send(max) {
            0 => break,
            EAGAIN => assert!(Instant::now() < deadline, "the send never went"),
            rc => panic!("send of max_msg_size bytes: {rc}"),
        }
    }
    assert_eq!(
        read_tagged(cq_a, 1).unwrap()[0].data_entry.op_context as usize,
        1
    );
    let got = read_tagged(cq_b, 1).unwrap();
    assert_eq!(got[0].data_entry.len, max);
    assert!(buf[..] == msg[..max]);
    let eps_and_cqs = [a.cast(), b.cast(), cq_a.cast(), cq_b.cast()];
    rdm.close(&eps_and_cqs);
}
