//! Guest memory that arrives, changes and goes away under running channels (what vhost-user
//! SET_MEM_TABLE, reset and disconnect do).
#![allow(clippy::unwrap_used)]

use std::fs::File;
use std::os::fd::FromRawFd;
use std::sync::Arc;
use std::time::Duration;
use svnic_client::Completions;

use svnic_backend::{Engine, GuestWaker, RunState};
use svnic_channels::{
    ChannelAddr, ChannelId, CompletionStatus, FailureReason, Message, SharedRegion,
};
use svnic_client::Channel;
use svnic_control_plane::{CreateRequest, GuestPolicy};
use svnic_tests::fake_guest::*;
use vm_memory::{FileOffset, GuestAddress, GuestMemoryMmap};

const T: Duration = Duration::from_secs(10);
const MEM: usize = 16 << 20;

fn memfd() -> File {
    // SAFETY: memfd_create with a valid NUL-terminated name; the returned fd is owned by the File.
    let fd = unsafe { libc::memfd_create(c"svnic-test".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0);
    // SAFETY: fd is a fresh, valid descriptor nobody else owns.
    let f = unsafe { File::from_raw_fd(fd) };
    f.set_len(MEM as u64).unwrap();
    f
}

/// A guest memory table over `file` (what the backend builds from SET_MEM_TABLE's fds).
fn table(file: &File) -> Arc<GuestMemoryMmap> {
    let fo = FileOffset::new(file.try_clone().unwrap(), 0);
    Arc::new(GuestMemoryMmap::from_ranges_with_files(&[(GuestAddress(0), MEM, Some(fo))]).unwrap())
}

struct VhostGuest {
    id: svnic_control_plane::GuestId,
    mac: svnic_channels::MacAddr,
    file: File,
    waker: Arc<EventWaker>,
}

impl VhostGuest {
    fn addr(&self, endpoint: u32) -> ChannelAddr {
        ChannelAddr::new(self.mac, endpoint)
    }

    /// A request for a channel on `endpoint`: 64 slots, 1 MiB region at `region_addr`.
    fn request(&self, endpoint: u32, region_addr: u64) -> CreateRequest {
        CreateRequest {
            mac: self.mac,
            endpoint,
            ring_size: 64,
            region_addr,
            region_len: 1 << 20,
        }
    }
}

fn vhost_guest(engine: &Engine, n: u8) -> VhostGuest {
    let waker = EventWaker::new();
    let id = engine
        .register_guest(
            GuestPolicy::new(format!("vm{n}"), mac(n)),
            Some(waker.clone() as Arc<dyn GuestWaker>),
        )
        .unwrap();
    VhostGuest {
        id,
        mac: mac(n),
        file: memfd(),
        waker,
    }
}

fn open(
    engine: &Engine,
    g: &VhostGuest,
    mem: &Arc<GuestMemoryMmap>,
    endpoint: u32,
    addr: u64,
) -> Channel {
    engine
        .create_channel(g.id, &g.request(endpoint, addr))
        .unwrap();
    let region = SharedRegion::from_guest_memory(mem.clone(), addr, 1 << 20).unwrap();
    Channel::attach(
        region,
        g.addr(endpoint),
        Arc::new(EngineDoorbell(engine.clone())),
    )
    .unwrap()
}

/// Maps `g`'s memory file anew and sets it as `g`'s memory table (as on SET_MEM_TABLE).
fn set_table(engine: &Engine, g: &VhostGuest) -> Arc<GuestMemoryMmap> {
    let mem = table(&g.file);
    engine.set_guest_memory(g.id, Some(mem.clone())).unwrap();
    mem
}

/// Guests 1 and 2 with their memory tables set and one channel each, as `(ga, gb, a, b)`: `a` on
/// guest 1's endpoint 1 (region at 2 MiB), `b` on guest 2's endpoint 2 (region at 4 MiB).
fn live_pair(engine: &Engine) -> (VhostGuest, VhostGuest, Channel, Channel) {
    let ga = vhost_guest(engine, 1);
    let gb = vhost_guest(engine, 2);
    let (ma, mb) = (set_table(engine, &ga), set_table(engine, &gb));
    let a = open(engine, &ga, &ma, 1, 2 << 20);
    let b = open(engine, &gb, &mb, 2, 4 << 20);
    (ga, gb, a, b)
}

#[test]
fn a_create_before_the_memory_table_fails_and_allocates_nothing() {
    let engine = engine(1);
    let g = vhost_guest(&engine, 1);
    let req = g.request(1, 0);
    assert_eq!(
        engine.create_channel(g.id, &req),
        Err(FailureReason::RegionOutsideMemory)
    );
    set_table(&engine, &g);
    assert!(
        engine.create_channel(g.id, &req).is_ok(),
        "the endpoint was not left reserved"
    );
}

#[test]
fn a_resent_table_over_the_same_pages_keeps_channels_running() {
    let engine = engine(1);
    let (_ga, gb, mut a, mut b) = live_pair(&engine);
    // The frontend re-sends its table: new fds, new mappings, same file.
    set_table(&engine, &gb);
    assert_eq!(engine.run_state(ChannelId(b.id())), Some(RunState::Live));
    a.send_user(gb.addr(2), 5, b"still", Completions::OnError)
        .unwrap();
    a.flush().unwrap();
    let got = recv_n(&mut b, &gb.waker, 1, T);
    assert!(matches!(got[0], Message::UserData(u) if u.data() == b"still"));
}

#[test]
fn a_table_over_other_pages_faults_the_channels_it_moved() {
    let engine = engine(1);
    let (ga, gb, mut a, b) = live_pair(&engine);
    let other = memfd();
    engine.set_guest_memory(gb.id, Some(table(&other))).unwrap();
    assert_eq!(engine.run_state(ChannelId(b.id())), Some(RunState::Faulted));
    assert_eq!(
        b.fault(),
        Some(svnic_client::channel::Fault::Reason(
            svnic_channels::FaultReason::MemoryGone
        ))
    );
    a.send_user(gb.addr(2), 6, b"x", Completions::OnError)
        .unwrap();
    a.flush().unwrap();
    let got = recv_n(&mut a, &ga.waker, 1, T);
    assert!(
        matches!(got[0], Message::Completion(c) if c.status == CompletionStatus::DestinationFaulted)
    );
}

#[test]
fn memory_gone_destroys_channels_and_fails_messages_in_flight_to_them() {
    let engine = engine_with_wait(2, Duration::from_secs(30));
    let (ga, gb, mut a, b) = live_pair(&engine);
    // A DMA message waits for a buffer B will never post.
    send_dma_held(&engine, &mut a, gb.addr(2), 7);
    // B disconnects.
    engine.set_guest_memory(gb.id, None).unwrap();
    assert_eq!(engine.run_state(ChannelId(b.id())), None, "destroyed");
    let got = recv_n(&mut a, &ga.waker, 1, T);
    assert!(
        matches!(got[0], Message::Completion(c) if c.cookie == 7 && c.status == CompletionStatus::DestinationGone)
    );
    // B reconnects and creates the same endpoint again.
    let mb2 = set_table(&engine, &gb);
    let mut b2 = open(&engine, &gb, &mb2, 2, 4 << 20);
    a.send_user(gb.addr(2), 8, b"again", Completions::OnError)
        .unwrap();
    a.flush().unwrap();
    assert_eq!(recv_n(&mut b2, &gb.waker, 1, T)[0].cookie(), 8);
}
