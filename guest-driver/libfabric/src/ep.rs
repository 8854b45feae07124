//! The DGRAM and RDM endpoints: one svnic channel each.
//!
//! An RDM endpoint is a DGRAM endpoint whose messages carry the header of [`crate::rdm`] (tag,
//! remote CQ data) and whose receives match on it: svnic channels already deliver reliably
//! (every send is delivered or fails with the reason), so nothing is retransmitted. It offers
//! `FI_TAGGED`, `FI_DIRECTED_RECV` and remote CQ data; its bounce buffers and staging slots
//! have [`rdm::SLOT_EXTRA`] bytes beyond `max_msg_size` for the header.
//!
//! - Sends of at most 40 bytes travel inline in one user-data message; larger ones are copied
//!   into a staging slot of the channel's data area and sent as DMA-data. Every send asks the
//!   engine for its completion, which frees the slot and writes the CQ entry (none for
//!   `fi_inject`). `NoBuffer`/`RingFull` are retried by the provider before they are reported.
//!   On an RDM endpoint a retried send keeps its sequence number and the receiver puts each
//!   sender's messages back in order ([`crate::rdm`]); a send that finally fails is replaced by a
//!   skip marker (unless the peer is gone, which restarts the numbering to it).
//! - Receives: the provider keeps `FI_SVNIC_RX_BUFFERS` bounce buffers of `max_msg_size` bytes
//!   posted in the channel; the application's receives wait in a FIFO. A message is copied
//!   into the head receive (truncation is an `FI_ETRUNC` error entry) and its bounce buffer is
//!   posted again. A message with no receive waiting keeps its bounce buffer (inline ones are
//!   copied, up to the receive queue size) until the next `fi_recv`, so the engine
//!   backpressures the sender instead of the provider dropping.
//! - Progress is manual: CQ reads and every post call poll the channel.
//! - Peer liveness: DGRAM gives a receiver no way to learn that its peer died, so while receives
//!   (posted, or taking a message in parts) have waited `FI_SVNIC_PEER_TIMEOUT_MS` with nothing
//!   arriving, the endpoint probes the peers
//!   it sent to (a zero-length user-data message the receiving provider discards, at most one in
//!   flight per peer). A probe the engine answers with NoRoute, DestinationGone or
//!   DestinationFaulted fails the posted receives directed at that peer (`FI_DIRECTED_RECV`),
//!   or if there are none the oldest posted receive, with that error, and forgets the peer.
//! - RDM unexpected messages: a message no posted receive matches waits in the unexpected
//!   queue, a DMA-data one copied out of its bounce buffer (so the buffer takes the next
//!   message) while the queue holds fewer than [`UNEXPECTED_MAX`] messages and the copies stay
//!   within [`UNEXPECTED_BYTES`] (messages being assembled from parts on the heap and messages
//!   kept aside for ordering count as copies too); past that it keeps its bounce buffer, so
//!   once all are held the engine backpressures the senders: nothing is dropped. The RX ring is
//!   read all the while, since it also carries this endpoint's send completions and probe
//!   answers; only with [`UNEXPECTED_RING_STOP`] messages queued (inline ones, which hold no
//!   bounce buffer, are what can get there) or [`UNEXPECTED_RING_STOP_BYTES`] copied out (messages
//!   in parts, copied part by part) does the endpoint stop reading it. A first part announcing
//!   more than 8 parts of the largest message size, or a message in parts no posted receive
//!   matches from more than [`ASSEMBLING_MAX`] senders at once, is refused before anything is
//!   held for it; a
//!   message in parts whose next part has not come for `GAP_WAIT` is abandoned (its receive,
//!   if it has one, fails `FI_EIO`).
//! - Log lines that peers' messages can cause are limited to one per second per call site
//!   ([`crate::stats`], which also counts them).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::os::raw::{c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use svnic_channels::layout::header;
use svnic_channels::message::INLINE_CAPACITY;
use svnic_channels::ChannelMem;
use svnic_channels::{ChannelAddr, Completion, CompletionStatus, DataRef, Message};
use svnic_client::{Channel, ChannelError, Completions};

use crate::addr::{self, ADDR_LEN};
use crate::attach::{DomainInner, CONTROL_TIMEOUT};
use crate::av::{AvInner, SvnicAv};
use crate::cq::{CqEntry, CqInner, ErrInfo, SvnicCq};
use crate::eq::SvnicEq;
use crate::errors::{
    self, Delivery, PROV_CANCELED, PROV_CHANNEL_FAILED, PROV_NO_MESSAGE, PROV_PARTS, PROV_TRUNCATED,
};
use crate::ffi::endpoint::atomic::FiOpsAtomic;
use crate::ffi::endpoint::cm::FiOpsCm;
use crate::ffi::endpoint::collective::FiOpsCollective;
use crate::ffi::endpoint::rma::FiOpsRma;
use crate::ffi::endpoint::tagged::{FiMsgTagged, FiOpsTagged};
use crate::ffi::endpoint::*;
use crate::ffi::errno::*;
use crate::ffi::*;
use crate::info::{INJECT_SIZE, IOV_LIMIT, RX_SIZE, TX_SIZE};
use crate::rdm::{self, Header, Reorder, Want};
use crate::stats::warn_limited;
use crate::wait::Progress;
use crate::{
    close_fid, guard, guard_fid, guard_object, object, object_of, open_object, put, FidObject,
};

/// Cookies of posted bounce buffers carry this bit (send cookies never do).
const BOUNCE_TAG: u64 = 1 << 63;
/// Cookies of liveness probes carry this bit; the receiver sees it and discards the probe.
const PROBE_TAG: u64 = 1 << 62;
/// Peers an endpoint remembers for probing.
const MAX_PEERS: usize = 64;
/// Times a send that met `NoBuffer`/`RingFull` is sent again before the error is reported.
const MAX_RETRIES: u32 = 8;
/// Messages taken from the RX ring per poll.
const POLL_BATCH: usize = 64;
/// Progress passes between two services of the guest's NIC (control answers, stray frames).
const NIC_SERVICE_EVERY: u32 = 1024;
/// How long an RDM endpoint waits for a sender's missing message before it hands on what the
/// sender sent after it ([`Reorder::expire`]). An honest sender fills a gap within its retries
/// (8 backpressure waits) and a skip marker; what this bounds is a sender still numbering for an
/// earlier endpoint at this address.
const GAP_WAIT: Duration = Duration::from_secs(30);

/// Flags `fi_sendmsg` accepts.
const SEND_FLAGS: u64 = op_flags::FI_COMPLETION
    | op_flags::FI_INJECT
    | op_flags::FI_INJECT_COMPLETE
    | op_flags::FI_TRANSMIT_COMPLETE
    | op_flags::FI_DELIVERY_COMPLETE
    | op_flags::FI_MORE
    | op_flags::FI_MSG
    | op_flags::FI_SEND;
/// Flags `fi_recvmsg` accepts.
const RECV_FLAGS: u64 =
    op_flags::FI_COMPLETION | op_flags::FI_MORE | op_flags::FI_MSG | op_flags::FI_RECV;
/// The flags of `fi_trecvmsg` that peek at and claim unexpected messages.
const PEEK_FLAGS: u64 = op_flags::FI_PEEK | op_flags::FI_CLAIM | op_flags::FI_DISCARD;
/// Flags an RDM endpoint's `fi_sendmsg`/`fi_tsendmsg` accept beyond [`SEND_FLAGS`].
const RDM_SEND_FLAGS: u64 = op_flags::FI_TAGGED | op_flags::FI_REMOTE_CQ_DATA;
/// Messages in an RDM endpoint's unexpected queue beyond which DMA-data ones keep their bounce
/// buffers (are not copied out).
pub const UNEXPECTED_MAX: usize = 4096;
/// Bytes copied out of bounce buffers (unexpected messages, messages in parts assembled on the
/// heap, messages kept aside for ordering) beyond which unexpected DMA-data messages keep their
/// bounce buffers.
pub const UNEXPECTED_BYTES: usize = 8 << 20;
/// Messages in an RDM endpoint's unexpected queue beyond which it stops reading its RX ring
/// (the only backpressure on inline messages, which hold no bounce buffer).
pub const UNEXPECTED_RING_STOP: usize = 16 * UNEXPECTED_MAX;
/// Bytes copied out of bounce buffers beyond which an RDM endpoint stops reading its RX ring:
/// what peers' unmatched messages in parts can make it hold (their parts are copied out one by
/// one, so only this stop holds them back).
pub const UNEXPECTED_RING_STOP_BYTES: usize = 8 * UNEXPECTED_BYTES;
/// Senders whose messages in parts an RDM endpoint assembles on the heap at once.
pub const ASSEMBLING_MAX: usize = 64;

/// A scatter/gather list of the application's memory: (address, length) pairs.
type Segments = Vec<(usize, usize)>;

#[derive(Debug, Default)]
struct PostedRecv {
    segs: Segments,
    ctx: usize,
    report: bool,
    /// The messages it takes (any, on a DGRAM endpoint).
    want: Want,
    /// `FI_MSG` or `FI_TAGGED`, for its completion.
    op: u64,
}

impl PostedRecv {
    fn capacity(&self) -> usize {
        self.segs.iter().fold(0usize, |a, s| a.saturating_add(s.1))
    }
}

/// A message taken from the RX ring, its header already read.
#[derive(Debug)]
struct Arrived {
    src: ChannelAddr,
    hdr: Header,
    body: Body,
}

/// Where an arrived message's payload is.
#[derive(Debug)]
enum Body {
    /// `data[start..end]` of a user-data message.
    Inline {
        data: [u8; INLINE_CAPACITY],
        start: usize,
        end: usize,
    },
    /// `len` bytes at `start` in bounce buffer `idx` (still held).
    Bounce {
        idx: usize,
        start: usize,
        len: usize,
    },
    /// Copied out of its bounce buffer (an RDM unexpected message).
    Heap(Vec<u8>),
}

impl Body {
    fn len(&self) -> usize {
        match self {
            Body::Inline { start, end, .. } => end - start,
            Body::Bounce { len, .. } => *len,
            Body::Heap(v) => v.len(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Payload {
    Inline([u8; INLINE_CAPACITY], usize),
    Staged(u64, usize),
}

#[derive(Debug)]
struct PendingSend {
    ctx: usize,
    report: bool,
    inject: bool,
    /// `FI_MSG` or `FI_TAGGED`, for its completion.
    op: u64,
    /// The message in parts this is a part of ([`EpState::groups`]).
    group: Option<u64>,
    dest: ChannelAddr,
    payload: Payload,
    retries: u32,
    /// RDM: the sequence number it carries.
    seq: Option<SeqRef>,
    /// A skip marker standing for the failed send `seq` (no completion of its own).
    marker: bool,
}

/// A sequence number handed out to a send: the numbering it belongs to ([`PeerSeq::epoch`]).
#[derive(Debug, Clone, Copy)]
struct SeqRef {
    epoch: u64,
    n: u64,
}

/// The numbering of the messages an RDM endpoint sends to one peer.
#[derive(Debug, Default)]
struct PeerSeq {
    /// Bumped when the numbering starts over (the peer was found gone).
    epoch: u64,
    next: u64,
    /// Numbers sent but not yet known delivered or skipped (their marker delivered).
    open: BTreeSet<u64>,
}

impl PeerSeq {
    /// Whether `count` more numbers fit in the window ([`rdm::WINDOW`]).
    fn room(&self, count: u64) -> bool {
        let oldest = self.open.first().copied().unwrap_or(self.next);
        (self.next + count).saturating_sub(oldest) <= rdm::WINDOW
    }
}

/// The parts of a message in parts still in flight, and the first error among those done.
#[derive(Debug)]
struct Group {
    remaining: usize,
    err: Option<ErrInfo>,
}

/// A message in parts being received from one sender.
#[derive(Debug)]
struct Assembly {
    /// Its header (tag, data).
    hdr: Header,
    total: usize,
    /// Bytes received so far (the offset the next part must have).
    got: usize,
    sink: Sink,
    /// When its last part arrived.
    since: Instant,
}

/// Where the parts of a message go.
#[derive(Debug)]
enum Sink {
    /// The posted receive its first part matched, and the bytes copied into it.
    Posted { r: PostedRecv, copied: usize },
    /// No receive matched: assembled here, then queued as unexpected.
    Heap(Vec<u8>),
}

/// What to do with one engine completion of a send.
enum SendOutcome {
    Retry,
    Done(Option<ErrInfo>),
}

#[derive(Debug)]
struct EpState {
    channel: Option<Channel>,
    addr: ChannelAddr,
    av: Option<Arc<AvInner>>,
    tx_cq: Option<Arc<CqInner>>,
    rx_cq: Option<Arc<CqInner>>,
    tx_selective: bool,
    rx_selective: bool,
    tx_op_flags: u64,
    rx_op_flags: u64,
    enabled: bool,
    failed: bool,
    /// RDM: messages carry the header of [`crate::rdm`] and receives match on it.
    rdm: bool,
    /// Receives honour their source address (`FI_DIRECTED_RECV`).
    directed: bool,
    /// Bytes of each bounce buffer and staging slot: `max_msg`, plus room for the header.
    slot_len: usize,
    /// Payload bytes copied out of bounce buffers and held by the endpoint: the unexpected
    /// queue's [`Body::Heap`] messages, the messages kept aside by [`EpState::order`] and the
    /// messages in parts assembled on the heap.
    unexpected_bytes: usize,
    /// Messages claimed by `FI_PEEK|FI_CLAIM`, by the context of the claim.
    claimed: HashMap<usize, Arrived>,
    /// Payload bytes of each part of a message in parts (`max_msg_size`).
    part_len: usize,
    /// Messages in parts being sent, by group id.
    groups: HashMap<u64, Group>,
    next_group: u64,
    /// Messages in parts being received, by sender.
    assembling: HashMap<ChannelAddr, Assembly>,
    /// RDM: each sender's messages put back in order (see [`crate::rdm`]).
    order: Reorder<Arrived>,
    /// RDM: the numbering of the messages sent to each peer.
    seqs: HashMap<ChannelAddr, PeerSeq>,
    bounces: Vec<u64>,
    staging_free: Vec<u64>,
    recvs: VecDeque<PostedRecv>,
    unexpected: VecDeque<Arrived>,
    pending: HashMap<u64, PendingSend>,
    deferred: VecDeque<u64>,
    next_cookie: u64,
    scratch: Vec<Message>,
    passes: u32,
    dropped: u64,
    /// Peers sent to, with the cookie of the probe in flight to each.
    peers: HashMap<ChannelAddr, Option<u64>>,
    /// When something last arrived (or a receive was posted, or peers were probed).
    last_rx: Instant,
    peer_timeout: Option<Duration>,
    /// Who reads the send completions: what a failed send reports.
    delivery: Delivery,
}

/// The endpoint state, shared with the CQs it is bound to.
#[derive(Debug)]
pub struct EpInner {
    domain: Arc<DomainInner>,
    waiter: crate::attach::Waiter,
    max_msg: usize,
    /// Largest `fi_inject` payload (the inline bytes less the RDM header's room).
    inject_max: usize,
    rdm: bool,
    state: Mutex<EpState>,
}

fid_object! {
    /// An endpoint.
    pub struct SvnicEp: FidEp, FI_CLASS_EP {
        /// The endpoint state.
        inner: Arc<EpInner>,
    }
    fi_ops = FiOps {
        close: Some(ep_close),
        bind: Some(ep_bind),
        control: Some(ep_control),
        ..FiOps::ENOSYS
    };
}

static EP_OPS: FiOpsEp = FiOpsEp {
    cancel: Some(ep_cancel),
    getopt: Some(ep_getopt),
    setopt: Some(ep_setopt),
    rx_size_left: Some(ep_rx_size_left),
    tx_size_left: Some(ep_tx_size_left),
    ..FiOpsEp::ENOSYS
};

static CM_OPS: FiOpsCm = FiOpsCm {
    getname: Some(ep_getname),
    ..FiOpsCm::ENOSYS
};

static MSG_OPS: FiOpsMsg = FiOpsMsg {
    recv: Some(ep_recv),
    recvv: Some(ep_recvv),
    recvmsg: Some(ep_recvmsg),
    send: Some(ep_send),
    sendv: Some(ep_sendv),
    sendmsg: Some(ep_sendmsg),
    inject: Some(ep_inject),
    ..FiOpsMsg::ENOSYS
};

static RDM_MSG_OPS: FiOpsMsg = FiOpsMsg {
    senddata: Some(ep_senddata),
    injectdata: Some(ep_injectdata),
    ..MSG_OPS
};

static RMA_OPS: FiOpsRma = FiOpsRma::ENOSYS;
static DGRAM_TAGGED_OPS: FiOpsTagged = FiOpsTagged::ENOSYS;
static TAGGED_OPS: FiOpsTagged = FiOpsTagged {
    recv: Some(ep_trecv),
    recvv: Some(ep_trecvv),
    recvmsg: Some(ep_trecvmsg),
    send: Some(ep_tsend),
    sendv: Some(ep_tsendv),
    sendmsg: Some(ep_tsendmsg),
    inject: Some(ep_tinject),
    senddata: Some(ep_tsenddata),
    injectdata: Some(ep_tinjectdata),
    ..FiOpsTagged::ENOSYS
};
static ATOMIC_OPS: FiOpsAtomic = FiOpsAtomic::ENOSYS;
static COLLECTIVE_OPS: FiOpsCollective = FiOpsCollective::ENOSYS;

/// `fi_endpoint`: a DGRAM or RDM endpoint with its channel (created now, so `fi_getname` works
/// before `fi_enable`).
pub(crate) fn open(
    dom: &Arc<DomainInner>,
    info: Option<&FiInfo>,
    out: *mut *mut FidEp,
    context: *mut c_void,
) -> c_int {
    open_object(info, out, |info| new_endpoint(dom, info, context))
}

/// The endpoint `info` asks for, or why not (a positive libfabric error number).
fn new_endpoint(
    dom: &Arc<DomainInner>,
    info: &FiInfo,
    context: *mut c_void,
) -> Result<SvnicEp, c_int> {
    // SAFETY: NULL or the application's attributes.
    let ep_attr = unsafe { info.ep_attr.as_ref() };
    let rdm = match ep_attr.map_or(FI_EP_UNSPEC, |e| e.type_) {
        FI_EP_RDM => true,
        FI_EP_UNSPEC | FI_EP_DGRAM => false,
        _ => return Err(FI_EINVAL),
    };
    let offered = if rdm {
        crate::info::RDM_CAPS
    } else {
        crate::info::CAPS
    };
    if info.caps & !offered != 0 {
        return Err(FI_EINVAL);
    }
    let directed = rdm && (info.caps == 0 || info.caps & caps::FI_DIRECTED_RECV != 0);
    let delivery = match ep_attr.map(|e| e.protocol) {
        Some(crate::info::PROTOCOL_LAYERED) => Delivery::UnderReliableLayer,
        _ => Delivery::Direct,
    };
    // SAFETY: NULL or the application's attributes.
    let tx_op_flags = unsafe { info.tx_attr.as_ref() }.map_or(0, |t| t.op_flags);
    // SAFETY: NULL or the application's attributes.
    let rx_op_flags = unsafe { info.rx_attr.as_ref() }.map_or(0, |r| r.op_flags);
    let d = dom.clone();
    let cfg = d.cfg.clone();
    let channel = d.create_channel()?;
    let layout = *channel.layout();
    let slot_len = cfg.slot_len(rdm);
    let msg = slot_len as u64;
    let (rx, tx) = cfg.buffers(rdm, layout.region_len - layout.data_offset);
    if rx == 0 || tx == 0 {
        log::warn!("svnic provider: the channel's data area holds no bounce and staging buffers");
        let _ = d.guest.destroy_channel(channel, CONTROL_TIMEOUT);
        return Err(FI_ENOMEM);
    }
    // fi_getinfo advertised Config::rdm_max_msg_size (from the configured region): an endpoint with
    // fewer staging slots than its parts need is refused rather than offering less.
    let max_msg = if rdm {
        cfg.rdm_max_msg_size()
    } else {
        cfg.max_msg_size
    };
    if rdm && cfg.max_msg_size * rdm::MAX_PARTS.min(tx as usize) < max_msg {
        log::warn!(
            "svnic provider: the channel's data area holds {tx} staging buffers of {msg} bytes, \
             fewer than the {} parts of max_msg_size {max_msg} (lower FI_SVNIC_MAX_MSG_SIZE, \
             FI_SVNIC_RX_BUFFERS or FI_SVNIC_TX_BUFFERS)",
            max_msg.div_ceil(cfg.max_msg_size)
        );
        let _ = d.guest.destroy_channel(channel, CONTROL_TIMEOUT);
        return Err(FI_ENOMEM);
    }
    let at = |i: u64| layout.data_offset + i * msg;
    let addr = channel.addr();
    let waiter = match d.guest.waiter(&channel) {
        Ok(w) => w,
        Err(e) => {
            log::warn!("svnic provider: no wake waiter for the endpoint's channel: {e}");
            let _ = d.guest.destroy_channel(channel, CONTROL_TIMEOUT);
            return Err(FI_EIO);
        }
    };
    log::info!(
        "svnic provider: {} endpoint {addr} ({rx} receive, {tx} staging buffers of {msg} bytes)",
        if rdm { "RDM" } else { "DGRAM" }
    );
    let state = EpState {
        channel: Some(channel),
        addr,
        av: None,
        tx_cq: None,
        rx_cq: None,
        tx_selective: false,
        rx_selective: false,
        tx_op_flags,
        rx_op_flags,
        enabled: false,
        failed: false,
        rdm,
        directed,
        slot_len,
        unexpected_bytes: 0,
        claimed: HashMap::new(),
        part_len: cfg.max_msg_size,
        groups: HashMap::new(),
        next_group: 0,
        assembling: HashMap::new(),
        order: Reorder::default(),
        seqs: HashMap::new(),
        bounces: (0..rx).map(at).collect(),
        staging_free: (rx..rx + tx).map(at).collect(),
        recvs: VecDeque::new(),
        unexpected: VecDeque::new(),
        pending: HashMap::new(),
        deferred: VecDeque::new(),
        next_cookie: 1,
        scratch: Vec::with_capacity(POLL_BATCH),
        passes: 0,
        dropped: 0,
        peers: HashMap::new(),
        last_rx: Instant::now(),
        // Under a reliable layer, peer liveness is the layer's business (it gives a peer up
        // itself): no probes, and no posted receive is failed for a peer.
        peer_timeout: (cfg.peer_timeout_ms > 0 && delivery == Delivery::Direct)
            .then(|| Duration::from_millis(cfg.peer_timeout_ms)),
        delivery,
    };
    Ok(SvnicEp {
        c: FidEp {
            fid: SvnicEp::fid(context),
            ops: &EP_OPS,
            cm: &CM_OPS,
            msg: if rdm { &RDM_MSG_OPS } else { &MSG_OPS },
            rma: &RMA_OPS,
            tagged: if rdm { &TAGGED_OPS } else { &DGRAM_TAGGED_OPS },
            atomic: &ATOMIC_OPS,
            collective: &COLLECTIVE_OPS,
        },
        inner: Arc::new(EpInner {
            domain: d,
            waiter,
            max_msg,
            inject_max: if rdm {
                INJECT_SIZE - rdm::HEADER_MAX
            } else {
                INJECT_SIZE
            },
            rdm,
            state: Mutex::new(state),
        }),
    })
}

/// Copies `src` into the application's segments; returns the bytes copied.
///
/// # Safety
/// Every segment must be writable application memory (a posted receive's buffers).
unsafe fn scatter(segs: &Segments, src: &[u8]) -> usize {
    // SAFETY: per the contract above.
    unsafe { scatter_at(segs, 0, src) }
}

/// Copies `src` into the application's segments from byte `at` of them on; returns the bytes
/// copied (fewer if the segments end first).
///
/// # Safety
/// As [`scatter`].
unsafe fn scatter_at(segs: &Segments, mut at: usize, src: &[u8]) -> usize {
    let mut done = 0;
    for &(base, len) in segs {
        if done == src.len() {
            break;
        }
        if at >= len {
            at -= len;
            continue;
        }
        // A zero-length segment holds nothing; the next one may.
        let n = (len - at).min(src.len() - done);
        if n == 0 {
            continue;
        }
        // SAFETY: per the contract above; at + n <= len.
        unsafe { std::ptr::copy_nonoverlapping(src[done..].as_ptr(), (base + at) as *mut u8, n) };
        at = 0;
        done += n;
    }
    done
}

/// `prefix` followed by the application's gather list, as one contiguous copy (the list at most
/// `max` bytes, else `FI_EMSGSIZE`).
///
/// # Safety
/// Every segment must be readable application memory.
unsafe fn gather(segs: &Segments, max: usize, prefix: &[u8]) -> Result<Vec<u8>, c_int> {
    let total = segs
        .iter()
        .try_fold(0usize, |a, s| a.checked_add(s.1))
        .filter(|&t| t <= max)
        .ok_or(FI_EMSGSIZE)?;
    let mut v = Vec::with_capacity(prefix.len() + total);
    v.extend_from_slice(prefix);
    for &(base, len) in segs {
        if len > 0 {
            // SAFETY: per the contract above.
            v.extend_from_slice(unsafe { std::slice::from_raw_parts(base as *const u8, len) });
        }
    }
    Ok(v)
}

/// An application iovec array as segments (`count <= IOV_LIMIT`, no NULL base with a length).
///
/// # Safety
/// `iov` must be NULL or hold `count` iovecs.
unsafe fn segments(iov: *const libc::iovec, count: usize) -> Result<Segments, c_int> {
    if count > IOV_LIMIT || (iov.is_null() && count > 0) {
        return Err(FI_EINVAL);
    }
    let mut segs = Vec::with_capacity(count);
    for k in 0..count {
        // SAFETY: per the contract above.
        let v = unsafe { iov.wrapping_add(k).read_unaligned() };
        if v.iov_base.is_null() && v.iov_len > 0 {
            return Err(FI_EINVAL);
        }
        segs.push((v.iov_base as usize, v.iov_len));
    }
    Ok(segs)
}

fn one_segment(buf: *const c_void, len: usize) -> Result<Segments, c_int> {
    if buf.is_null() && len > 0 {
        return Err(FI_EINVAL);
    }
    Ok(vec![(buf as usize, len)])
}

impl Progress for EpInner {
    fn progress(&self) {
        EpInner::progress(self);
    }

    fn set_sleeping(&self, sleeping: bool) {
        let s = self.lock();
        if let Some(ch) = &s.channel {
            if let Ok(mem) = ChannelMem::new(ch.region().slice(), *ch.layout()) {
                mem.set_sleeping(header::GUEST_SLEEPING, sleeping);
            }
        }
    }

    fn wait_wake(&self, timeout: Duration) -> bool {
        match self.waiter.wait_for_wake(timeout) {
            Ok(woke) => woke,
            Err(e) => {
                log::debug!("svnic provider: waiting for a wake: {e}");
                std::thread::sleep(timeout);
                false
            }
        }
    }
}

impl EpInner {
    fn lock(&self) -> MutexGuard<'_, EpState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Polls the channel: received messages into posted receives, send completions into the
    /// TX CQ, retries of deferred sends, one flush.
    pub fn progress(&self) {
        let mut s = self.lock();
        s.passes = s.passes.wrapping_add(1);
        if s.passes % NIC_SERVICE_EVERY == 0 {
            if let Err(e) = self.domain.guest.poll_control() {
                log::debug!("svnic provider: NIC service: {e}");
            }
            if s.order.held() > 0 {
                let mut due = Vec::new();
                s.order.expire(Instant::now(), GAP_WAIT, &mut due);
                for a in due {
                    s.unhold(&a);
                    s.arrived_or_part(a);
                }
            }
            s.expire_assemblies(Instant::now());
        }
        s.progress();
    }

    /// Posts a receive of the messages from `src` (an AV handle, or `FI_ADDR_UNSPEC`; honoured
    /// with `FI_DIRECTED_RECV` only) with the tag `tag` (`Some((tag, ignore))` for a tagged
    /// receive).
    fn recv(&self, op: RecvOp, segs: Segments) -> isize {
        let mut s = self.lock();
        if let Err(e) = s.ready() {
            return -(e as isize);
        }
        if s.rx_cq.is_none() {
            return -(FI_ENOCQ as isize);
        }
        if s.recvs.len() >= RX_SIZE {
            s.progress();
            return -(FI_EAGAIN as isize);
        }
        let src = if s.directed && op.src != FI_ADDR_UNSPEC {
            match s.av.as_ref().and_then(|av| av.get(op.src)) {
                Some(a) => Some(a),
                None => return EINVAL,
            }
        } else {
            None
        };
        let selective = s.rx_selective;
        let r = PostedRecv {
            segs,
            ctx: op.ctx,
            report: reports(op.report, selective, s.rx_op_flags),
            want: Want { tag: op.tag, src },
            op: op_kind(op.tag),
        };
        if op.flags & PEEK_FLAGS != 0 {
            return s.peek_or_claim(r, op.flags);
        }
        if s.recvs.is_empty() {
            // The wait the peer timeout measures starts now.
            s.last_rx = Instant::now();
        }
        // No unexpected message matches an older posted receive (it would have taken it).
        match s
            .unexpected
            .iter()
            .position(|a| r.want.matches(&a.hdr, a.src))
            .and_then(|i| s.take_unexpected(i))
        {
            Some(a) => s.deliver(r, a),
            None => s.recvs.push_back(r),
        }
        s.progress();
        0
    }

    /// Sends the payload `segs` with the header `hdr` (RDM endpoints only) to the AV handle
    /// `dest`.
    fn send(&self, op: SendOp, segs: Segments) -> isize {
        let max = if op.inject {
            self.inject_max
        } else {
            self.max_msg
        };
        let prefix = if self.rdm {
            // The number is the endpoint's to give (EpState::send): room for it here.
            Header {
                seq: Some(0),
                ..op.hdr
            }
            .encode()
        } else if op.hdr != Header::default() {
            return -(FI_EBADFLAGS as isize);
        } else {
            ([0; rdm::PART_HEADER_MAX], 0)
        };
        // Checked before anything is copied or allocated.
        // SAFETY: the segments were built from the application's buffers, readable for the call.
        let mut data = match unsafe { gather(&segs, max, &prefix.0[..prefix.1]) } {
            Ok(d) => d,
            Err(err) => return -(err as isize),
        };
        let mut s = self.lock();
        match s.send(&mut data, &op) {
            Ok(()) => 0,
            Err(e) => -(e as isize),
        }
    }
}

/// Whether an operation writes a completion: a `*msg` call's `FI_COMPLETION` flag (`report`),
/// else the endpoint's `op_flags`; everything does unless the CQ was bound with
/// `FI_SELECTIVE_COMPLETION`.
fn reports(report: Option<bool>, selective: bool, op_flags: u64) -> bool {
    !selective || report.unwrap_or(op_flags & op_flags::FI_COMPLETION != 0)
}

/// `FI_TAGGED` for an operation with a tag, else `FI_MSG` (for its completion's flags).
fn op_kind<T>(tag: Option<T>) -> u64 {
    if tag.is_some() {
        op_flags::FI_TAGGED
    } else {
        op_flags::FI_MSG
    }
}

/// A receive as posted, less its buffers.
struct RecvOp {
    ctx: usize,
    /// `FI_PEEK`, `FI_CLAIM`, `FI_DISCARD` of an `fi_trecvmsg`.
    flags: u64,
    /// `Some(flag)`: `FI_COMPLETION` of a `*msg` call's flags; `None`: the endpoint's default.
    report: Option<bool>,
    src: u64,
    tag: Option<(u64, u64)>,
}

/// A send as posted, less its buffers.
struct SendOp {
    dest: u64,
    ctx: usize,
    /// As [`RecvOp::report`].
    report: Option<bool>,
    inject: bool,
    hdr: Header,
}

impl EpState {
    fn ready(&self) -> Result<(), c_int> {
        if self.failed {
            Err(FI_EIO)
        } else if !self.enabled || self.channel.is_none() {
            Err(FI_EOPBADSTATE)
        } else {
            Ok(())
        }
    }

    fn progress(&mut self) {
        if self.ready().is_err() {
            return;
        }
        let mut msgs = std::mem::take(&mut self.scratch);
        for _ in 0..16 {
            msgs.clear();
            if self.rdm
                && (self.unexpected.len() >= UNEXPECTED_RING_STOP
                    || self.unexpected_bytes >= UNEXPECTED_RING_STOP_BYTES)
            {
                // Backpressure on inline messages and on messages in parts (which are copied
                // out part by part): the engine holds the senders (and this endpoint's
                // completions wait) until receives are posted.
                break;
            }
            let Some(ch) = self.channel.as_mut() else {
                break;
            };
            match ch.poll(&mut msgs, POLL_BATCH) {
                Ok(0) => break,
                Ok(_) => {
                    for m in msgs.drain(..) {
                        self.handle(m);
                    }
                }
                Err(e) => {
                    self.fail(&e);
                    break;
                }
            }
        }
        self.scratch = msgs;
        self.retry_deferred();
        self.probe_peers();
        self.flush();
    }

    /// Probes every peer without a probe in flight when receives have waited for the peer
    /// timeout with nothing arriving (see the module documentation).
    fn probe_peers(&mut self) {
        let Some(timeout) = self.peer_timeout else {
            return;
        };
        let waiting = !self.recvs.is_empty()
            || self
                .assembling
                .values()
                .any(|m| matches!(m.sink, Sink::Posted { .. }));
        if !waiting || self.peers.is_empty() || self.last_rx.elapsed() < timeout {
            return;
        }
        self.last_rx = Instant::now();
        let idle: Vec<ChannelAddr> = self
            .peers
            .iter()
            .filter(|(_, probe)| probe.is_none())
            .map(|(a, _)| *a)
            .collect();
        for peer in idle {
            let cookie = PROBE_TAG | self.take_cookie();
            let Some(ch) = self.channel.as_mut() else {
                return;
            };
            match ch.send_user(peer, cookie, &[], Completions::Always) {
                Ok(true) => {
                    self.peers.insert(peer, Some(cookie));
                }
                Ok(false) => return,
                Err(e) => {
                    self.fail(&e);
                    return;
                }
            }
        }
    }

    /// The engine's answer to a probe: a peer that is gone fails the posted receives directed
    /// at it, or if there are none the oldest posted receive.
    fn probe_done(&mut self, c: Completion) {
        let Some(peer) = self
            .peers
            .iter()
            .find(|(_, probe)| **probe == Some(c.cookie))
            .map(|(a, _)| *a)
        else {
            return;
        };
        if !peer_gone(c.status) {
            self.peers.insert(peer, None);
            return;
        }
        self.peers.remove(&peer);
        self.restart_numbering(peer);
        log::info!("svnic provider: peer {peer} is gone: {}", c.status);
        let Some(err) = errors::send_error(c.status) else {
            return;
        };
        if let Some(m) = self.assembling.remove(&peer) {
            match m.sink {
                Sink::Posted { r, .. } => self.fail_recv(&r, err, c_int::from(c.status.code())),
                Sink::Heap(v) => {
                    self.unexpected_bytes = self.unexpected_bytes.saturating_sub(v.len())
                }
            }
        }
        let directed = self.recvs.iter().any(|r| r.want.src == Some(peer));
        let mut failed = Vec::new();
        self.recvs.retain_mut(|r| {
            let fail = if directed {
                r.want.src == Some(peer)
            } else {
                failed.is_empty() && r.want.src.is_none()
            };
            if fail {
                failed.push(std::mem::take(r));
            }
            !fail
        });
        for r in &failed {
            self.fail_recv(r, err, c_int::from(c.status.code()));
        }
    }

    /// Completes a posted receive (already taken off the queue) with an error entry.
    fn fail_recv(&self, r: &PostedRecv, err: c_int, prov_errno: c_int) {
        let err = ErrInfo {
            err,
            prov_errno,
            olen: 0,
        };
        self.complete_recv(r, 0, 0, Header::default(), Some(err));
    }

    fn flush(&mut self) {
        let r = self.channel.as_mut().map(Channel::flush);
        if let Some(Err(e)) = r {
            self.fail(&e);
        }
    }

    fn handle(&mut self, m: Message) {
        match m {
            Message::UserData(u) if u.cookie & PROBE_TAG != 0 && u.len == 0 => {}
            Message::UserData(u) => {
                self.last_rx = Instant::now();
                let d = u.data();
                let mut data = [0u8; INLINE_CAPACITY];
                data[..d.len()].copy_from_slice(d);
                let Some((hdr, start)) = self.header(u.peer, |_| Header::decode(d)) else {
                    return;
                };
                let body = Body::Inline {
                    data,
                    start,
                    end: d.len(),
                };
                self.in_order(Arrived {
                    src: u.peer,
                    hdr,
                    body,
                });
            }
            Message::DmaData(d) => {
                self.last_rx = Instant::now();
                let idx = (d.cookie & !BOUNCE_TAG) as usize;
                let len = d.data.len as usize;
                let ok = d.cookie & BOUNCE_TAG != 0
                    && self.bounces.get(idx) == Some(&d.data.offset)
                    && len <= self.slot_len;
                if !ok {
                    crate::stats::PEER_MESSAGES_IGNORED.bump();
                    warn_limited!("svnic provider: DMA-data into an unknown buffer ignored: {d:?}");
                    return;
                }
                let Some((hdr, start)) = self.header(d.peer, |s| s.bounce_header(idx, len)) else {
                    self.repost(idx);
                    return;
                };
                let body = Body::Bounce {
                    idx,
                    start,
                    len: len - start,
                };
                self.in_order(Arrived {
                    src: d.peer,
                    hdr,
                    body,
                });
            }
            Message::Completion(c) if c.cookie & PROBE_TAG != 0 => self.probe_done(c),
            Message::Completion(c) if c.cookie & BOUNCE_TAG != 0 => {
                log::warn!(
                    "svnic provider: the engine refused a receive buffer: {}",
                    c.status
                );
            }
            Message::Completion(c) => self.send_done(c),
            Message::PostBuffer(_) => {}
        }
    }

    /// The header of a message from `peer` and its length: none on a DGRAM endpoint, what `read`
    /// finds on an RDM one (`None`, logged, if the message has none).
    fn header(
        &mut self,
        peer: ChannelAddr,
        read: impl FnOnce(&mut Self) -> Option<(Header, usize)>,
    ) -> Option<(Header, usize)> {
        if !self.rdm {
            return Some((Header::default(), 0));
        }
        let found = read(self);
        if found.is_none() {
            crate::stats::PEER_MESSAGES_IGNORED.bump();
            warn_limited!("svnic provider: message without RDM header from {peer} ignored");
        }
        found
    }

    /// The RDM header at the front of the `len` bytes in bounce buffer `idx`.
    fn bounce_header(&mut self, idx: usize, len: usize) -> Option<(Header, usize)> {
        let mut b = [0u8; rdm::PART_HEADER_MAX];
        let n = len.min(rdm::PART_HEADER_MAX);
        let off = *self.bounces.get(idx)?;
        let read = self.channel.as_ref()?.read_data(off, &mut b[..n]);
        if let Err(e) = read {
            self.fail(&e);
            return None;
        }
        Header::decode(&b[..n])
    }

    /// Posts bounce buffer `idx` in the channel again.
    fn repost(&mut self, idx: usize) {
        let Some(&offset) = self.bounces.get(idx) else {
            return;
        };
        let buf = DataRef {
            offset,
            len: self.slot_len as u32,
        };
        let posted = match self.channel.as_mut() {
            Some(ch) => ch.post_buffer(BOUNCE_TAG | idx as u64, buf),
            None => return,
        };
        match posted {
            Ok(true) => {}
            Ok(false) => log::warn!("svnic provider: post ring full; bounce buffer {idx} lost"),
            Err(e) => self.fail(&e),
        }
    }

    /// Copies `len` bytes at `start` of bounce buffer `idx` into the application's segments
    /// (as many as fit); the bytes copied.
    fn copy_out(&mut self, idx: usize, start: usize, len: usize, segs: &Segments) -> usize {
        let (Some(&off), Some(ch)) = (self.bounces.get(idx), self.channel.as_ref()) else {
            return 0;
        };
        let mut done = 0;
        let mut failed = None;
        for &(base, seg) in segs {
            if done == len {
                break;
            }
            let n = seg.min(len - done);
            if n == 0 {
                continue;
            }
            // SAFETY: the segments are writable memory of n <= their length bytes (a posted
            // receive's buffers, owned by the provider until their completion, or a Vec's).
            let dst = unsafe { std::slice::from_raw_parts_mut(base as *mut u8, n) };
            if let Err(e) = ch.read_data(off + (start + done) as u64, dst) {
                failed = Some(e);
                break;
            }
            done += n;
        }
        if let Some(e) = failed {
            self.fail(&e);
        }
        done
    }

    /// A message's payload out of its buffer (a bounce buffer is posted again).
    fn take_bytes(&mut self, body: Body) -> Vec<u8> {
        match body {
            Body::Inline { data, start, end } => data[start..end].to_vec(),
            Body::Heap(v) => v,
            Body::Bounce { idx, start, len } => {
                let mut v = vec![0u8; len];
                let segs = vec![(v.as_mut_ptr() as usize, len)];
                let done = self.copy_out(idx, start, len, &segs);
                v.truncate(done);
                self.repost(idx);
                v
            }
        }
    }

    /// An RDM message (or part, or skip marker) with its sequence number goes through its
    /// sender's [`Reorder`]: kept aside (copied out of its bounce buffer, which takes the next
    /// message meanwhile) while it is ahead of a missing one; then it and those now due go on.
    fn in_order(&mut self, a: Arrived) {
        let Some(seq) = a.hdr.seq.filter(|_| self.rdm) else {
            return self.arrived_or_part(a);
        };
        let src = a.src;
        let item = if a.hdr.skip {
            self.release(a);
            None
        } else if self.order.is_next(src, seq) {
            Some(a)
        } else {
            let body = match a.body {
                b @ Body::Bounce { .. } => Body::Heap(self.take_bytes(b)),
                b => b,
            };
            if let Body::Heap(v) = &body {
                self.unexpected_bytes += v.len();
            }
            Some(Arrived { body, ..a })
        };
        let mut due = Vec::new();
        self.order.arrive(src, seq, item, &mut due);
        for a in due {
            self.unhold(&a);
            self.arrived_or_part(a);
        }
    }

    /// A message handed on by [`EpState::order`]: a copy it kept aside is no longer counted
    /// there (the unexpected queue counts it again if it goes there).
    fn unhold(&mut self, a: &Arrived) {
        if let Body::Heap(v) = &a.body {
            self.unexpected_bytes = self.unexpected_bytes.saturating_sub(v.len());
        }
    }

    fn arrived_or_part(&mut self, a: Arrived) {
        if a.hdr.total.is_none() && a.hdr.offset.is_none() {
            return self.arrived(a);
        }
        let src = a.src;
        let bytes = self.take_bytes(a.body);
        match (a.hdr.total, a.hdr.offset) {
            (Some(total), _) => {
                if let Some(old) = self.assembling.remove(&src) {
                    self.abandon(old, src, "a new message began before it ended");
                }
                // No sender can send more (8 parts of the largest message size); a peer that
                // says so is not believed, and nothing is held or allocated for it.
                if total > (rdm::MAX_PARTS * crate::config::LARGEST_MAX_MSG_SIZE) as u64 {
                    crate::stats::PARTS_ABANDONED.bump();
                    warn_limited!("svnic provider: a message of {total} bytes from {src} refused");
                    return;
                }
                let hdr = Header {
                    total: None,
                    ..a.hdr
                };
                let posted = self
                    .recvs
                    .iter()
                    .position(|r| r.want.matches(&hdr, src))
                    .and_then(|i| self.recvs.remove(i));
                let sink = match posted {
                    Some(r) => Sink::Posted { r, copied: 0 },
                    // Only messages assembled on the heap hold the provider's memory.
                    None if self.heap_assemblies() >= ASSEMBLING_MAX => {
                        crate::stats::PARTS_ABANDONED.bump();
                        warn_limited!(
                            "svnic provider: a message in parts from {src} refused: \
                             {ASSEMBLING_MAX} senders' messages in parts are being assembled"
                        );
                        return;
                    }
                    None => Sink::Heap(Vec::with_capacity(bytes.len())),
                };
                let m = Assembly {
                    hdr,
                    total: total as usize,
                    got: 0,
                    sink,
                    since: Instant::now(),
                };
                self.add_part(src, m, &bytes);
            }
            (None, Some(offset)) => match self.assembling.remove(&src) {
                Some(m) if m.got as u64 == offset => self.add_part(src, m, &bytes),
                Some(m) => self.abandon(m, src, "a part out of order (a retried send)"),
                None => {
                    crate::stats::PEER_MESSAGES_IGNORED.bump();
                    warn_limited!("svnic provider: a part of an unknown message from {src}");
                }
            },
            _ => {}
        }
    }

    /// Messages in parts being assembled on the heap (no posted receive matched them).
    fn heap_assemblies(&self) -> usize {
        self.assembling
            .values()
            .filter(|m| matches!(m.sink, Sink::Heap(_)))
            .count()
    }

    /// Adds the next part's bytes to a message in parts; delivers it when complete. A part
    /// that would take the message past its announced length abandons it.
    fn add_part(&mut self, src: ChannelAddr, mut m: Assembly, bytes: &[u8]) {
        if m.got.saturating_add(bytes.len()) > m.total {
            return self.abandon(m, src, "a part beyond the message's length");
        }
        match &mut m.sink {
            // SAFETY: the application owns the posted buffers until their completion.
            Sink::Posted { r, copied } => *copied += unsafe { scatter_at(&r.segs, m.got, bytes) },
            Sink::Heap(v) => {
                v.extend_from_slice(bytes);
                self.unexpected_bytes += bytes.len();
            }
        }
        m.got += bytes.len();
        if m.got < m.total {
            m.since = Instant::now();
            self.assembling.insert(src, m);
            return;
        }
        match m.sink {
            Sink::Posted { r, copied } => self.complete_into(&r, copied, m.total, m.hdr),
            Sink::Heap(v) => {
                self.unexpected_bytes = self.unexpected_bytes.saturating_sub(v.len());
                self.arrived(Arrived {
                    src,
                    hdr: m.hdr,
                    body: Body::Heap(v),
                })
            }
        }
    }

    /// Gives up a message in parts from `src`: its receive, if it has one, fails.
    fn abandon(&mut self, m: Assembly, src: ChannelAddr, why: &str) {
        crate::stats::PARTS_ABANDONED.bump();
        warn_limited!("svnic provider: message in parts from {src} abandoned: {why}");
        match m.sink {
            Sink::Posted { r, .. } => self.fail_recv(&r, FI_EIO, PROV_PARTS),
            Sink::Heap(v) => self.unexpected_bytes = self.unexpected_bytes.saturating_sub(v.len()),
        }
    }

    /// Abandons the messages in parts whose next part has not come for `GAP_WAIT` (a sender
    /// that stopped, or whose later parts failed without a later message following).
    fn expire_assemblies(&mut self, now: Instant) {
        let stale: Vec<ChannelAddr> = self
            .assembling
            .iter()
            .filter(|(_, m)| now.saturating_duration_since(m.since) >= GAP_WAIT)
            .map(|(a, _)| *a)
            .collect();
        for src in stale {
            if let Some(m) = self.assembling.remove(&src) {
                self.abandon(m, src, "its next part did not come");
            }
        }
    }

    fn arrived(&mut self, a: Arrived) {
        if let Some(i) = self
            .recvs
            .iter()
            .position(|r| r.want.matches(&a.hdr, a.src))
        {
            if let Some(r) = self.recvs.remove(i) {
                self.deliver(r, a);
            }
            return;
        }
        match a.body {
            Body::Bounce { len, .. }
                if self.rdm
                    && self.unexpected.len() < UNEXPECTED_MAX
                    && self.unexpected_bytes + len <= UNEXPECTED_BYTES =>
            {
                // Copied out, so that the bounce buffer takes the next message.
                let v = self.take_bytes(a.body);
                self.unexpected_bytes += v.len();
                self.unexpected.push_back(Arrived {
                    body: Body::Heap(v),
                    ..a
                });
            }
            Body::Inline { .. } if !self.rdm && self.unexpected.len() >= RX_SIZE => {
                self.dropped += 1;
                log::debug!("svnic provider: inline message dropped (no receive posted)");
            }
            Body::Heap(ref v) => {
                self.unexpected_bytes += v.len();
                self.unexpected.push_back(a);
            }
            _ => self.unexpected.push_back(a),
        }
    }

    /// Unexpected message `i`, out of the queue.
    fn take_unexpected(&mut self, i: usize) -> Option<Arrived> {
        let a = self.unexpected.remove(i)?;
        if let Body::Heap(v) = &a.body {
            self.unexpected_bytes = self.unexpected_bytes.saturating_sub(v.len());
        }
        Some(a)
    }

    /// Drops a message taken out of the unexpected queue (its bounce buffer is posted again).
    fn release(&mut self, a: Arrived) {
        if let Body::Bounce { idx, .. } = a.body {
            self.repost(idx);
        }
    }

    /// `fi_trecvmsg` with `FI_PEEK` (and `FI_CLAIM` or `FI_DISCARD`), or with `FI_CLAIM` alone
    /// (and `FI_DISCARD`).
    /// A peek looks for the oldest matching unexpected message: none is an `FI_ENOMSG` error
    /// entry; one is an entry with its length, tag and data, and the message stays queued,
    /// or is set aside for the claim's context (`FI_CLAIM`), or dropped (`FI_DISCARD`). A claim
    /// receives (or with `FI_DISCARD` drops) the message set aside for its context.
    fn peek_or_claim(&mut self, r: PostedRecv, flags: u64) -> isize {
        // What a peek found (or that it found nothing) is always reported.
        let r = PostedRecv { report: true, ..r };
        let (claim, discard) = (
            flags & op_flags::FI_CLAIM != 0,
            flags & op_flags::FI_DISCARD != 0,
        );
        if flags & op_flags::FI_PEEK == 0 {
            let Some(a) = self.claimed.remove(&r.ctx) else {
                return EINVAL;
            };
            if discard {
                let hdr = a.hdr;
                self.release(a);
                self.complete_recv(&r, 0, 0, hdr, None);
            } else {
                self.deliver(r, a);
            }
            return 0;
        }
        self.progress();
        let Some(i) = self
            .unexpected
            .iter()
            .position(|a| r.want.matches(&a.hdr, a.src))
        else {
            self.fail_recv(&r, FI_ENOMSG, PROV_NO_MESSAGE);
            return 0;
        };
        let (len, hdr) = (self.unexpected[i].body.len(), self.unexpected[i].hdr);
        if claim || discard {
            if let Some(a) = self.take_unexpected(i) {
                if claim {
                    if let Some(old) = self.claimed.insert(r.ctx, a) {
                        self.release(old);
                    }
                } else {
                    self.release(a);
                }
            }
        }
        self.complete_recv(&r, len, 0, hdr, None);
        0
    }

    /// Writes the completion of receive `r`: `len` bytes at `buf`, the message's header `hdr`.
    fn complete_recv(
        &self,
        r: &PostedRecv,
        len: usize,
        buf: usize,
        hdr: Header,
        err: Option<ErrInfo>,
    ) {
        if !r.report && err.is_none() {
            return;
        }
        let data_flag = hdr.data.map_or(0, |_| op_flags::FI_REMOTE_CQ_DATA);
        if let Some(cq) = &self.rx_cq {
            cq.push(CqEntry {
                ctx: r.ctx,
                flags: op_flags::FI_RECV | r.op | data_flag,
                len,
                buf,
                data: hdr.data.unwrap_or(0),
                tag: hdr.tag.unwrap_or(0),
                err,
            });
        }
    }

    /// Copies an arrived message into a posted receive and writes its completion.
    fn deliver(&mut self, r: PostedRecv, a: Arrived) {
        let len = a.body.len();
        let copied = match &a.body {
            // SAFETY: the application owns the posted buffers until their completion.
            Body::Inline { data, start, end } => unsafe { scatter(&r.segs, &data[*start..*end]) },
            // SAFETY: as above.
            Body::Heap(v) => unsafe { scatter(&r.segs, v) },
            &Body::Bounce { idx, start, len } => {
                let done = self.copy_out(idx, start, len, &r.segs);
                self.repost(idx);
                done
            }
        };
        self.complete_into(&r, copied, len, a.hdr);
    }

    /// Writes the completion of receive `r` that took `copied` bytes of a `len`-byte message
    /// with header `hdr` (`FI_ETRUNC` if it was longer than the receive).
    fn complete_into(&self, r: &PostedRecv, copied: usize, len: usize, hdr: Header) {
        let cap = r.capacity();
        let first = r.segs.first().map_or(0, |s| s.0);
        let err = (len > cap).then(|| ErrInfo {
            err: FI_ETRUNC,
            prov_errno: PROV_TRUNCATED,
            olen: len - cap,
        });
        self.complete_recv(r, copied, first, hdr, err);
    }

    /// Sends `data` (the RDM header and the payload) as `op` says.
    fn send(&mut self, data: &mut [u8], op: &SendOp) -> Result<(), c_int> {
        self.ready()?;
        if data.len() > self.slot_len {
            return match self.rdm {
                true => self.send_parts(data, op),
                false => Err(FI_EMSGSIZE),
            };
        }
        let av = self.av.as_ref().ok_or(FI_ENOAV)?;
        let peer = av.get(op.dest).ok_or(FI_EINVAL)?;
        if !op.inject && self.tx_cq.is_none() {
            return Err(FI_ENOCQ);
        }
        let full = |s: &EpState| {
            s.pending.len() >= TX_SIZE || (s.rdm && !s.seqs.get(&peer).is_none_or(|q| q.room(1)))
        };
        if full(self) {
            self.progress();
            if full(self) {
                return Err(FI_EAGAIN);
            }
        }
        let seq = self.rdm.then(|| self.seq_ref(peer));
        if let Some(r) = seq {
            rdm::stamp_seq(data, r.n as u32);
        }
        let data = &*data;
        let payload = if data.len() <= INLINE_CAPACITY {
            let mut b = [0u8; INLINE_CAPACITY];
            b[..data.len()].copy_from_slice(data);
            Payload::Inline(b, data.len())
        } else {
            if self.staging_free.is_empty() {
                self.progress();
            }
            let slot = self.staging_free.pop().ok_or(FI_EAGAIN)?;
            let written = self.channel.as_ref().map(|ch| ch.write_data(slot, data));
            if let Some(Err(e)) = written {
                self.staging_free.push(slot);
                self.fail(&e);
                return Err(FI_EIO);
            }
            Payload::Staged(slot, data.len())
        };
        let cookie = self.take_cookie();
        let selective = self.tx_selective;
        let report = reports(op.report, selective, self.tx_op_flags);
        let p = PendingSend {
            ctx: op.ctx,
            report,
            inject: op.inject,
            op: op_kind(op.hdr.tag),
            group: None,
            dest: peer,
            payload,
            retries: 0,
            seq,
            marker: false,
        };
        match self.transmit(cookie, &p) {
            Ok(true) => {
                self.seq_taken(peer, seq);
                self.remember_peer(peer);
                self.pending.insert(cookie, p);
                self.flush();
                Ok(())
            }
            Ok(false) => {
                if let Payload::Staged(slot, _) = p.payload {
                    self.staging_free.push(slot);
                }
                self.progress();
                Err(FI_EAGAIN)
            }
            Err(e) => {
                self.fail(&e);
                Err(FI_EIO)
            }
        }
    }

    /// Sends `data` (the RDM header and a payload longer than a bounce buffer) in parts of
    /// `part_len` bytes, back to back: only when a staging slot and a TX ring slot are free for
    /// every part (else `FI_EAGAIN`), and with one completion for the whole message.
    fn send_parts(&mut self, data: &[u8], op: &SendOp) -> Result<(), c_int> {
        let (hdr, n) = Header::decode(data).ok_or(FI_EOTHER)?;
        let payload = &data[n..];
        let av = self.av.as_ref().ok_or(FI_ENOAV)?;
        let peer = av.get(op.dest).ok_or(FI_EINVAL)?;
        if self.tx_cq.is_none() {
            return Err(FI_ENOCQ);
        }
        let count = payload.len().div_ceil(self.part_len);
        let room = |s: &mut EpState| {
            let ring = s.channel.as_mut().map_or(0, |ch| ch.tx_free().unwrap_or(0)) as usize;
            s.staging_free.len() >= count
                && ring >= count
                && s.pending.len() + count <= TX_SIZE
                && s.seqs.get(&peer).is_none_or(|q| q.room(count as u64))
        };
        if !room(self) {
            self.progress();
            if !room(self) {
                return Err(FI_EAGAIN);
            }
        }
        let group = self.next_group;
        self.next_group += 1;
        self.groups.insert(
            group,
            Group {
                remaining: count,
                err: None,
            },
        );
        let selective = self.tx_selective;
        let report = reports(op.report, selective, self.tx_op_flags);
        for (k, chunk) in payload.chunks(self.part_len).enumerate() {
            // Every part has its own number: the receiver gets them back in order.
            let seq = self.seq_ref(peer);
            let h = match k {
                0 => Header {
                    total: Some(payload.len() as u64),
                    seq: Some(seq.n as u32),
                    ..hdr
                },
                _ => Header {
                    offset: Some((k * self.part_len) as u64),
                    seq: Some(seq.n as u32),
                    ..Header::default()
                },
            };
            let (b, m) = h.encode();
            let mut part = Vec::with_capacity(m + chunk.len());
            part.extend_from_slice(&b[..m]);
            part.extend_from_slice(chunk);
            let slot = self.staging_free.pop().ok_or(FI_EAGAIN)?;
            let written = self.channel.as_ref().map(|ch| ch.write_data(slot, &part));
            if let Some(Err(e)) = written {
                self.staging_free.push(slot);
                self.fail(&e);
                return Err(FI_EIO);
            }
            let cookie = self.take_cookie();
            let p = PendingSend {
                ctx: op.ctx,
                report,
                inject: false,
                op: op_kind(hdr.tag),
                group: Some(group),
                dest: peer,
                payload: Payload::Staged(slot, part.len()),
                retries: 0,
                seq: Some(seq),
                marker: false,
            };
            self.seq_taken(peer, Some(seq));
            match self.transmit(cookie, &p) {
                Ok(true) => {}
                // Checked above; should the ring fill anyway, the part goes with the retries.
                Ok(false) => self.deferred.push_back(cookie),
                Err(e) => {
                    self.pending.insert(cookie, p);
                    self.fail(&e);
                    return Err(FI_EIO);
                }
            }
            self.pending.insert(cookie, p);
        }
        self.remember_peer(peer);
        self.flush();
        Ok(())
    }

    /// Queues one send (again) in the TX ring; `Ok(false)` when the ring is full.
    fn transmit(&mut self, cookie: u64, p: &PendingSend) -> Result<bool, ChannelError> {
        let Some(ch) = self.channel.as_mut() else {
            return Ok(false);
        };
        match p.payload {
            Payload::Inline(b, n) => ch.send_user(p.dest, cookie, &b[..n], Completions::Always),
            Payload::Staged(offset, len) => ch.send_dma(
                p.dest,
                cookie,
                DataRef {
                    offset,
                    len: len as u32,
                },
            ),
        }
    }

    fn send_done(&mut self, c: Completion) {
        let Some(mut p) = self.pending.remove(&c.cookie) else {
            warn_limited!(
                "svnic provider: completion for an unknown send {:#x}",
                c.cookie
            );
            return;
        };
        let outcome = match c.status {
            CompletionStatus::Ok => SendOutcome::Done(None),
            // A skip marker is retried for as long as the peer is there: the peer waits for it.
            CompletionStatus::NoBuffer | CompletionStatus::RingFull
                if p.retries < MAX_RETRIES || p.marker =>
            {
                SendOutcome::Retry
            }
            status => {
                SendOutcome::Done(
                    errors::send_outcome(status, self.delivery).map(|err| ErrInfo {
                        err,
                        prov_errno: c_int::from(status.code()),
                        olen: 0,
                    }),
                )
            }
        };
        match outcome {
            SendOutcome::Retry => {
                crate::stats::SEND_RETRIES.bump();
                p.retries += 1;
                self.pending.insert(c.cookie, p);
                self.deferred.push_back(c.cookie);
            }
            SendOutcome::Done(err) => {
                self.numbered_done(&p, c.status);
                self.finish(p, err);
            }
        }
    }

    /// The next sequence number to `peer` (taken by [`EpState::seq_taken`]).
    fn seq_ref(&mut self, peer: ChannelAddr) -> SeqRef {
        let q = self.seqs.entry(peer).or_default();
        SeqRef {
            epoch: q.epoch,
            n: q.next,
        }
    }

    /// A cookie for a send or probe: never one with [`BOUNCE_TAG`] or [`PROBE_TAG`] set.
    fn take_cookie(&mut self) -> u64 {
        let cookie = self.next_cookie;
        self.next_cookie = (self.next_cookie + 1) & !(BOUNCE_TAG | PROBE_TAG);
        cookie
    }

    /// Remembers `peer` for probing (at most [`MAX_PEERS`]).
    fn remember_peer(&mut self, peer: ChannelAddr) {
        if self.peers.len() < MAX_PEERS {
            self.peers.entry(peer).or_insert(None);
        }
    }

    /// Sequence number `seq` to `peer` is in flight.
    fn seq_taken(&mut self, peer: ChannelAddr, seq: Option<SeqRef>) {
        let Some(r) = seq else {
            return;
        };
        let q = self.seqs.entry(peer).or_default();
        if q.epoch == r.epoch && r.n == q.next {
            q.open.insert(r.n);
            q.next += 1;
        }
    }

    /// A numbered send (or skip marker) is done with `status`: its number is closed, or a send
    /// that failed (the peer still there) is replaced by a skip marker, or the numbering to a
    /// peer that is gone starts over (a new endpoint at its address starts at 0 too).
    fn numbered_done(&mut self, p: &PendingSend, status: CompletionStatus) {
        let Some(r) = p.seq else {
            return;
        };
        if peer_gone(status) {
            // Only a send of the current numbering restarts it: the other sends in flight
            // of a numbering already restarted fail the same way.
            if self.seqs.get(&p.dest).is_some_and(|q| q.epoch == r.epoch) {
                self.restart_numbering(p.dest);
            }
            return;
        }
        let current = self
            .seqs
            .get(&p.dest)
            .is_some_and(|q| q.epoch == r.epoch && q.open.contains(&r.n));
        if !current {
            return;
        }
        if status == CompletionStatus::Ok || p.marker {
            if status != CompletionStatus::Ok {
                warn_limited!(
                    "svnic provider: skip marker {} to {} failed: {status}",
                    r.n,
                    p.dest
                );
            }
            if let Some(q) = self.seqs.get_mut(&p.dest) {
                q.open.remove(&r.n);
            }
            return;
        }
        let (b, n) = Header {
            seq: Some(r.n as u32),
            skip: true,
            ..Header::default()
        }
        .encode();
        let mut inline = [0u8; INLINE_CAPACITY];
        inline[..n].copy_from_slice(&b[..n]);
        let marker = PendingSend {
            ctx: 0,
            report: false,
            inject: true,
            op: 0,
            group: None,
            dest: p.dest,
            payload: Payload::Inline(inline, n),
            retries: 0,
            seq: Some(r),
            marker: true,
        };
        let cookie = self.take_cookie();
        self.pending.insert(cookie, marker);
        self.deferred.push_back(cookie);
    }

    /// Forgets the numbering to `peer` and what its messages to this endpoint kept aside
    /// (handed on now): the peer is gone.
    fn restart_numbering(&mut self, peer: ChannelAddr) {
        if let Some(q) = self.seqs.get_mut(&peer) {
            q.epoch += 1;
            q.next = 0;
            q.open.clear();
        }
        let mut due = Vec::new();
        self.order.forget(peer, &mut due);
        for a in due {
            self.unhold(&a);
            self.arrived_or_part(a);
        }
    }

    fn finish(&mut self, p: PendingSend, err: Option<ErrInfo>) {
        if p.marker {
            return;
        }
        if let Payload::Staged(slot, _) = p.payload {
            self.staging_free.push(slot);
        }
        let mut err = err;
        if let Some(id) = p.group {
            // One completion for a message in parts: when its last part is done.
            let Some(g) = self.groups.get_mut(&id) else {
                return;
            };
            g.remaining -= 1;
            g.err = g.err.or(err);
            if g.remaining > 0 {
                return;
            }
            err = g.err;
            self.groups.remove(&id);
        }
        if p.inject {
            if let Some(e) = err {
                log::info!(
                    "svnic provider: injected message to {} failed: {}",
                    p.dest,
                    errors::prov_strerror(e.prov_errno).to_string_lossy()
                );
            }
            return;
        }
        if !p.report && err.is_none() {
            return;
        }
        if let Some(cq) = &self.tx_cq {
            cq.push(CqEntry {
                ctx: p.ctx,
                flags: op_flags::FI_SEND | p.op,
                len: 0,
                buf: 0,
                data: 0,
                tag: 0,
                err,
            });
        }
    }

    fn retry_deferred(&mut self) {
        for _ in 0..self.deferred.len() {
            let Some(cookie) = self.deferred.pop_front() else {
                break;
            };
            let Some(p) = self.pending.remove(&cookie) else {
                continue;
            };
            match self.transmit(cookie, &p) {
                Ok(true) => {
                    self.pending.insert(cookie, p);
                }
                Ok(false) => {
                    self.pending.insert(cookie, p);
                    self.deferred.push_front(cookie);
                    break;
                }
                Err(e) => {
                    self.pending.insert(cookie, p);
                    self.fail(&e);
                    break;
                }
            }
        }
    }

    /// The channel failed (faulted by the engine, or its memory is broken): every pending
    /// operation completes with `FI_EIO`; new ones are refused with `-FI_EIO`.
    fn fail(&mut self, e: &ChannelError) {
        if self.failed {
            return;
        }
        log::warn!("svnic provider: endpoint {} failed: {e}", self.addr);
        self.failed = true;
        let eio = Some(ErrInfo {
            err: FI_EIO,
            prov_errno: PROV_CHANNEL_FAILED,
            olen: 0,
        });
        let pending: Vec<PendingSend> = self.pending.drain().map(|(_, p)| p).collect();
        self.deferred.clear();
        for p in pending {
            self.finish(p, eio);
        }
        let mut recvs: Vec<PostedRecv> = self.recvs.drain(..).collect();
        for (_, m) in self.assembling.drain() {
            match m.sink {
                Sink::Posted { r, .. } => recvs.push(r),
                Sink::Heap(v) => {
                    self.unexpected_bytes = self.unexpected_bytes.saturating_sub(v.len())
                }
            }
        }
        for r in &recvs {
            self.fail_recv(r, FI_EIO, PROV_CHANNEL_FAILED);
        }
    }

    fn enable(&mut self) -> Result<(), c_int> {
        if self.failed {
            return Err(FI_EIO);
        }
        if self.enabled {
            return Ok(());
        }
        if self.av.is_none() {
            return Err(FI_ENOAV);
        }
        if self.tx_cq.is_none() && self.rx_cq.is_none() {
            return Err(FI_ENOCQ);
        }
        let Some(ch) = self.channel.as_mut() else {
            return Err(FI_EOPBADSTATE);
        };
        for (idx, &offset) in self.bounces.iter().enumerate() {
            let buf = DataRef {
                offset,
                len: self.slot_len as u32,
            };
            match ch.post_buffer(BOUNCE_TAG | idx as u64, buf) {
                Ok(true) => {}
                Ok(false) => return Err(FI_EAGAIN),
                Err(e) => {
                    self.fail(&e);
                    return Err(FI_EIO);
                }
            }
        }
        self.enabled = true;
        self.flush();
        Ok(())
    }

    /// Cancels the posted receive with context `ctx`, waiting in the queue or taking a
    /// message in parts (whose later parts are then ignored).
    fn cancel(&mut self, ctx: usize) -> Result<(), c_int> {
        if let Some(r) = self
            .recvs
            .iter()
            .position(|r| r.ctx == ctx)
            .and_then(|i| self.recvs.remove(i))
        {
            self.fail_recv(&r, FI_ECANCELED, PROV_CANCELED);
            return Ok(());
        }
        let src = self
            .assembling
            .iter()
            .find(|(_, m)| matches!(&m.sink, Sink::Posted { r, .. } if r.ctx == ctx))
            .map(|(a, _)| *a)
            .ok_or(FI_ENOENT)?;
        if let Some(Assembly {
            sink: Sink::Posted { r, .. },
            ..
        }) = self.assembling.remove(&src)
        {
            self.fail_recv(&r, FI_ECANCELED, PROV_CANCELED);
        }
        Ok(())
    }
}

const EINVAL: isize = -(FI_EINVAL as isize);

/// Whether a completion status says the peer is gone (its numbering starts over, a probe
/// fails the receives waiting for it).
fn peer_gone(status: CompletionStatus) -> bool {
    matches!(
        status,
        CompletionStatus::NoRoute
            | CompletionStatus::DestinationGone
            | CompletionStatus::DestinationFaulted
    )
}

/// How long closing an endpoint waits for the engine to take the messages still in its TX ring.
const CLOSE_LINGER: Duration = Duration::from_secs(1);

/// Waits (at most [`CLOSE_LINGER`]) until the engine has taken every message of the TX ring:
/// a message the application handed over is sent even when the endpoint closes right after
/// (say, the last acknowledgement of a reliable layer), as a datagram socket's would be.
fn linger(ch: &mut Channel) {
    let ring = ch.layout().ring_size;
    if ch.flush().is_err() {
        return;
    }
    let deadline = Instant::now() + CLOSE_LINGER;
    loop {
        match ch.tx_free() {
            Ok(free) if free < ring => {}
            _ => return,
        }
        if Instant::now() >= deadline {
            log::warn!(
                "svnic provider: closing endpoint {} with messages the engine has not taken",
                ch.addr()
            );
            return;
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

unsafe extern "C" fn ep_close(fid: *mut Fid) -> c_int {
    // SAFETY: the fid libfabric passed to fi_close (close_object's contract).
    unsafe {
        close_fid("ep close", fid, |e: &SvnicEp| {
            let channel = {
                let mut s = e.inner.lock();
                s.enabled = false;
                s.channel.take()
            };
            if let Some(mut ch) = channel {
                linger(&mut ch);
                if let Err(err) = e.inner.domain.guest.destroy_channel(ch, CONTROL_TIMEOUT) {
                    log::warn!("svnic provider: destroying the endpoint's channel: {err}");
                }
            }
        })
    }
}

unsafe extern "C" fn ep_bind(fid: *mut Fid, bfid: *mut Fid, flags: u64) -> c_int {
    guard_fid("fi_ep_bind", fid, |e: &SvnicEp| {
        let mut s = e.inner.lock();
        if s.enabled {
            return -FI_EOPBADSTATE;
        }
        // SAFETY: the application's fid, recognised before use.
        if let Some(av) = unsafe { object::<SvnicAv>(bfid) } {
            if flags != 0 {
                return -FI_EBADFLAGS;
            }
            if s.av.is_some() {
                return -FI_EINVAL;
            }
            s.av = Some(av.inner().clone());
            return 0;
        }
        // SAFETY: as above.
        if let Some(cq) = unsafe { object::<SvnicCq>(bfid) } {
            let dirs = op_flags::FI_TRANSMIT | op_flags::FI_RECV;
            if flags & !(dirs | op_flags::FI_SELECTIVE_COMPLETION) != 0 || flags & dirs == 0 {
                return -FI_EBADFLAGS;
            }
            let selective = flags & op_flags::FI_SELECTIVE_COMPLETION != 0;
            if flags & op_flags::FI_TRANSMIT != 0 {
                if s.tx_cq.is_some() {
                    return -FI_EINVAL;
                }
                s.tx_cq = Some(cq.inner().clone());
                s.tx_selective = selective;
            }
            if flags & op_flags::FI_RECV != 0 {
                if s.rx_cq.is_some() {
                    return -FI_EINVAL;
                }
                s.rx_cq = Some(cq.inner().clone());
                s.rx_selective = selective;
            }
            drop(s);
            let source: Weak<dyn Progress> = Arc::downgrade(&e.inner) as Weak<EpInner>;
            cq.inner().bind(source);
            return 0;
        }
        // SAFETY: as above.
        if unsafe { object::<SvnicEq>(bfid) }.is_some() {
            // Connectionless: there are no events; accepted and ignored.
            return 0;
        }
        if bfid.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: non-NULL fid of the application; only the class is read.
        if unsafe { (*bfid).fclass } == FI_CLASS_CNTR {
            return -FI_ENOSYS;
        }
        -FI_EINVAL
    })
}

unsafe extern "C" fn ep_control(fid: *mut Fid, command: c_int, _arg: *mut c_void) -> c_int {
    guard_fid("ep control", fid, |e: &SvnicEp| match command {
        FI_ENABLE => match e.inner.lock().enable() {
            Ok(()) => 0,
            Err(err) => -err,
        },
        _ => -FI_ENOSYS,
    })
}

/// `fi_getname`: the 16-byte address; `-FI_ETOOSMALL` with `*addrlen` set when the buffer is
/// smaller (or NULL).
unsafe extern "C" fn ep_getname(fid: *mut Fid, out: *mut c_void, addrlen: *mut usize) -> c_int {
    guard_fid("fi_getname", fid, |e: &SvnicEp| {
        if addrlen.is_null() {
            return -FI_EINVAL;
        }
        // SAFETY: checked non-NULL.
        let room = unsafe { addrlen.read_unaligned() };
        // SAFETY: checked non-NULL.
        unsafe { put(addrlen, ADDR_LEN) };
        if room < ADDR_LEN || out.is_null() {
            return -FI_ETOOSMALL;
        }
        let b = addr::encode(e.inner.lock().addr);
        // SAFETY: the caller's buffer holds `room` >= 16 bytes.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), out.cast::<u8>(), ADDR_LEN) };
        0
    })
}

unsafe extern "C" fn ep_cancel(fid: *mut Fid, context: *mut c_void) -> isize {
    guard_fid("fi_cancel", fid, |e: &SvnicEp| {
        match e.inner.lock().cancel(context as usize) {
            Ok(()) => 0,
            Err(err) => -(err as isize),
        }
    })
}

unsafe extern "C" fn ep_getopt(
    _: *mut Fid,
    _: c_int,
    _: c_int,
    _: *mut c_void,
    _: *mut usize,
) -> c_int {
    -FI_ENOPROTOOPT
}

unsafe extern "C" fn ep_setopt(
    _: *mut Fid,
    _: c_int,
    _: c_int,
    _: *const c_void,
    _: usize,
) -> c_int {
    -FI_ENOPROTOOPT
}

unsafe extern "C" fn ep_rx_size_left(e: *mut FidEp) -> isize {
    guard_object("fi_rx_size_left", e, |e: &SvnicEp| {
        (RX_SIZE - e.inner.lock().recvs.len().min(RX_SIZE)) as isize
    })
}

unsafe extern "C" fn ep_tx_size_left(e: *mut FidEp) -> isize {
    guard_object("fi_tx_size_left", e, |e: &SvnicEp| {
        (TX_SIZE - e.inner.lock().pending.len().min(TX_SIZE)) as isize
    })
}

/// What an entry point posts on an endpoint: a receive or a send.
trait Op {
    /// Posts the operation with its buffers.
    fn post(self, ep: &EpInner, segs: Segments) -> isize;
}

impl Op for RecvOp {
    fn post(self, ep: &EpInner, segs: Segments) -> isize {
        ep.recv(self, segs)
    }
}

impl Op for SendOp {
    fn post(self, ep: &EpInner, segs: Segments) -> isize {
        ep.send(self, segs)
    }
}

/// Posts `op` with its buffers `segs` (or returns their error) on the endpoint `e` an entry
/// point was called on.
fn post(e: *mut FidEp, segs: Result<Segments, c_int>, op: impl Op) -> isize {
    // SAFETY: recognised before use.
    let Some(e) = (unsafe { object_of::<SvnicEp>(e) }) else {
        return EINVAL;
    };
    match segs {
        Ok(segs) => op.post(&e.inner, segs),
        Err(err) => -(err as isize),
    }
}

/// The flags a `*msg` send call accepts on this endpoint.
fn send_flags(e: *mut FidEp) -> u64 {
    // SAFETY: recognised before use.
    match unsafe { object_of::<SvnicEp>(e) } {
        Some(e) if e.inner.rdm => SEND_FLAGS | RDM_SEND_FLAGS,
        _ => SEND_FLAGS,
    }
}

fn recv_op(ctx: *mut c_void, src: u64, tag: Option<(u64, u64)>) -> RecvOp {
    RecvOp {
        ctx: ctx as usize,
        flags: 0,
        report: None,
        src,
        tag,
    }
}

fn send_op(dest: u64, ctx: *mut c_void, tag: Option<u64>, data: Option<u64>) -> SendOp {
    SendOp {
        dest,
        ctx: ctx as usize,
        report: None,
        inject: false,
        hdr: Header {
            tag,
            data,
            ..Header::default()
        },
    }
}

fn inject_op(dest: u64, tag: Option<u64>, data: Option<u64>) -> SendOp {
    SendOp {
        report: Some(false),
        inject: true,
        ..send_op(dest, std::ptr::null_mut(), tag, data)
    }
}

unsafe extern "C" fn ep_recv(
    e: *mut FidEp,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: u64,
    ctx: *mut c_void,
) -> isize {
    guard("fi_recv", || {
        post(e, one_segment(buf, len), recv_op(ctx, src, None))
    })
}

unsafe extern "C" fn ep_recvv(
    e: *mut FidEp,
    iov: *const libc::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src: u64,
    ctx: *mut c_void,
) -> isize {
    guard("fi_recvv", || {
        // SAFETY: the application's iovec array of `count` entries.
        let segs = unsafe { segments(iov, count) };
        post(e, segs, recv_op(ctx, src, None))
    })
}

/// The parts of an `fi_msg` or `fi_msg_tagged` that the `*msg` calls use, checked: `flags`
/// within `allowed`.
struct MsgParts {
    segs: Result<Segments, c_int>,
    addr: u64,
    context: *mut c_void,
    /// The tag and ignore bits (0 for an `fi_msg`).
    tag: u64,
    ignore: u64,
    /// `FI_COMPLETION` of the flags.
    report: Option<bool>,
    /// Remote CQ data, with `FI_REMOTE_CQ_DATA`.
    data: Option<u64>,
}

/// An `fi_msg` (NULL is `-FI_EINVAL`) as its parts.
fn unpack(msg: *const FiMsg, flags: u64, allowed: u64) -> Result<MsgParts, isize> {
    // SAFETY: NULL or the application's message.
    let m = unsafe { msg.as_ref() }.ok_or(EINVAL)?;
    let t = FiMsgTagged {
        msg_iov: m.msg_iov,
        desc: m.desc,
        iov_count: m.iov_count,
        addr: m.addr,
        tag: 0,
        ignore: 0,
        context: m.context,
        data: m.data,
    };
    unpack_tagged(&t, flags, allowed)
}

/// An `fi_msg_tagged` (NULL is `-FI_EINVAL`) as its parts.
fn unpack_tagged(msg: *const FiMsgTagged, flags: u64, allowed: u64) -> Result<MsgParts, isize> {
    // SAFETY: NULL or the application's message.
    let m = unsafe { msg.as_ref() }.ok_or(EINVAL)?;
    if flags & !allowed != 0 {
        return Err(-(FI_EBADFLAGS as isize));
    }
    Ok(MsgParts {
        // SAFETY: the message's iovec array of `iov_count` entries.
        segs: unsafe { segments(m.msg_iov, m.iov_count) },
        addr: m.addr,
        context: m.context,
        tag: m.tag,
        ignore: m.ignore,
        report: Some(flags & op_flags::FI_COMPLETION != 0),
        data: (flags & op_flags::FI_REMOTE_CQ_DATA != 0).then_some(m.data),
    })
}

unsafe extern "C" fn ep_recvmsg(e: *mut FidEp, msg: *const FiMsg, flags: u64) -> isize {
    guard("fi_recvmsg", || match unpack(msg, flags, RECV_FLAGS) {
        Ok(p) => post(
            e,
            p.segs,
            RecvOp {
                report: p.report,
                ..recv_op(p.context, p.addr, None)
            },
        ),
        Err(r) => r,
    })
}

unsafe extern "C" fn ep_send(
    e: *mut FidEp,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: u64,
    ctx: *mut c_void,
) -> isize {
    guard("fi_send", || {
        post(e, one_segment(buf, len), send_op(dest, ctx, None, None))
    })
}

unsafe extern "C" fn ep_sendv(
    e: *mut FidEp,
    iov: *const libc::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    dest: u64,
    ctx: *mut c_void,
) -> isize {
    guard("fi_sendv", || {
        // SAFETY: the application's iovec array of `count` entries.
        let segs = unsafe { segments(iov, count) };
        post(e, segs, send_op(dest, ctx, None, None))
    })
}

unsafe extern "C" fn ep_sendmsg(e: *mut FidEp, msg: *const FiMsg, flags: u64) -> isize {
    guard("fi_sendmsg", || {
        match unpack(msg, flags & !op_flags::FI_TAGGED, send_flags(e)) {
            Ok(p) => post(
                e,
                p.segs,
                SendOp {
                    report: p.report,
                    ..send_op(p.addr, p.context, None, p.data)
                },
            ),
            Err(r) => r,
        }
    })
}

unsafe extern "C" fn ep_inject(e: *mut FidEp, buf: *const c_void, len: usize, dest: u64) -> isize {
    guard("fi_inject", || {
        post(e, one_segment(buf, len), inject_op(dest, None, None))
    })
}

unsafe extern "C" fn ep_senddata(
    e: *mut FidEp,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    data: u64,
    dest: u64,
    ctx: *mut c_void,
) -> isize {
    guard("fi_senddata", || {
        post(
            e,
            one_segment(buf, len),
            send_op(dest, ctx, None, Some(data)),
        )
    })
}

unsafe extern "C" fn ep_injectdata(
    e: *mut FidEp,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: u64,
) -> isize {
    guard("fi_injectdata", || {
        post(e, one_segment(buf, len), inject_op(dest, None, Some(data)))
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn ep_trecv(
    e: *mut FidEp,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src: u64,
    tag: u64,
    ignore: u64,
    ctx: *mut c_void,
) -> isize {
    guard("fi_trecv", || {
        let op = recv_op(ctx, src, Some((tag, ignore)));
        post(e, one_segment(buf, len), op)
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn ep_trecvv(
    e: *mut FidEp,
    iov: *const libc::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src: u64,
    tag: u64,
    ignore: u64,
    ctx: *mut c_void,
) -> isize {
    guard("fi_trecvv", || {
        // SAFETY: the application's iovec array of `count` entries.
        let segs = unsafe { segments(iov, count) };
        post(e, segs, recv_op(ctx, src, Some((tag, ignore))))
    })
}

unsafe extern "C" fn ep_trecvmsg(e: *mut FidEp, msg: *const FiMsgTagged, flags: u64) -> isize {
    let allowed = RECV_FLAGS | op_flags::FI_TAGGED | PEEK_FLAGS;
    guard("fi_trecvmsg", || match unpack_tagged(msg, flags, allowed) {
        Ok(p) => post(
            e,
            p.segs,
            RecvOp {
                report: p.report,
                flags: flags & PEEK_FLAGS,
                ..recv_op(p.context, p.addr, Some((p.tag, p.ignore)))
            },
        ),
        Err(r) => r,
    })
}

unsafe extern "C" fn ep_tsend(
    e: *mut FidEp,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest: u64,
    tag: u64,
    ctx: *mut c_void,
) -> isize {
    guard("fi_tsend", || {
        post(
            e,
            one_segment(buf, len),
            send_op(dest, ctx, Some(tag), None),
        )
    })
}

unsafe extern "C" fn ep_tsendv(
    e: *mut FidEp,
    iov: *const libc::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    dest: u64,
    tag: u64,
    ctx: *mut c_void,
) -> isize {
    guard("fi_tsendv", || {
        // SAFETY: the application's iovec array of `count` entries.
        let segs = unsafe { segments(iov, count) };
        post(e, segs, send_op(dest, ctx, Some(tag), None))
    })
}

unsafe extern "C" fn ep_tsendmsg(e: *mut FidEp, msg: *const FiMsgTagged, flags: u64) -> isize {
    guard("fi_tsendmsg", || {
        match unpack_tagged(msg, flags, SEND_FLAGS | RDM_SEND_FLAGS) {
            Ok(p) => post(
                e,
                p.segs,
                SendOp {
                    report: p.report,
                    ..send_op(p.addr, p.context, Some(p.tag), p.data)
                },
            ),
            Err(r) => r,
        }
    })
}

unsafe extern "C" fn ep_tinject(
    e: *mut FidEp,
    buf: *const c_void,
    len: usize,
    dest: u64,
    tag: u64,
) -> isize {
    guard("fi_tinject", || {
        post(e, one_segment(buf, len), inject_op(dest, Some(tag), None))
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn ep_tsenddata(
    e: *mut FidEp,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    data: u64,
    dest: u64,
    tag: u64,
    ctx: *mut c_void,
) -> isize {
    guard("fi_tsenddata", || {
        let op = send_op(dest, ctx, Some(tag), Some(data));
        post(e, one_segment(buf, len), op)
    })
}

unsafe extern "C" fn ep_tinjectdata(
    e: *mut FidEp,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest: u64,
    tag: u64,
) -> isize {
    guard("fi_tinjectdata", || {
        post(
            e,
            one_segment(buf, len),
            inject_op(dest, Some(tag), Some(data)),
        )
    })
}

#[cfg(test)]
mod scatter_tests {
    use super::*;

    #[test]
    fn a_zero_length_segment_is_passed_over_not_the_end() {
        let (mut a, mut b) = ([0u8; 4], [0u8; 4]);
        let segs: Segments = [(a.as_mut_ptr() as usize, 0), (b.as_mut_ptr() as usize, 4)]
            .into_iter()
            .collect();
        // SAFETY: both segments are this test's own arrays, of the lengths given.
        let done = unsafe { scatter(&segs, b"wxyz") };
        assert_eq!((done, a, b), (4, [0; 4], *b"wxyz"));
    }
}
