//! Guest memory that arrives, changes and goes away under running channels (what vhost-user
//! SET_MEM_TABLE, reset and disconnect do).
#![allow(clippy::unwrap_used)]

mod support;

use std::fs::File;
use std::os::fd::FromRawFd;
use std::sync::Arc;
use std::time::Duration;

use support::*;
use svnic_backend::{Engine, EngineConfig, GuestWaker, RunState};
use svnic_channels::{ChannelId, CompletionStatus, DataRef, FailureReason, Message, SharedRegion};
use svnic_control::GuestPolicy;
use svnic_guest::Channel;
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
    id: svnic_control::GuestId,
    mac: svnic_channels::MacAddr,
    file: File,
    waker: Arc<EventWaker>,
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
    let req = svnic_control::CreateRequest {
        mac: g.mac,
        endpoint,
        ring_size: 64,
        region_addr: addr,
        region_len: 1 << 20,
    };
    engine.create_channel(g.id, &req).unwrap();
    let region = SharedRegion::from_guest_memory(mem.clone(), addr, 1 << 20).unwrap();
    Channel::attach(
        region,
        svnic_channels::ChannelAddr {
            mac: g.mac,
            endpoint,
        },
        Arc::new(EngineDoorbell(engine.clone())),
    )
    .unwrap()
}

#[test]
fn a_create_before_the_memory_table_fails_and_allocates_nothing() {
    let engine = engine(1);
    let g = vhost_guest(&engine, 1);
    let req = svnic_control::CreateRequest {
        mac: g.mac,
        endpoint: 1,
        ring_size: 64,
        region_addr: 0,
        region_len: 1 << 20,
    };
    assert_eq!(
        engine.create_channel(g.id, &req),
        Err(FailureReason::RegionOutsideMemory)
    );
    let mem = table(&g.file);
    engine.set_guest_memory(g.id, Some(mem)).unwrap();
    assert!(
        engine.create_channel(g.id, &req).is_ok(),
        "the endpoint was not left reserved"
    );
}

#[test]
fn a_resent_table_over_the_same_pages_keeps_channels_running() {
    let engine = engine(1);
    let ga = vhost_guest(&engine, 1);
    let gb = vhost_guest(&engine, 2);
    let (ma, mb) = (table(&ga.file), table(&gb.file));
    engine.set_guest_memory(ga.id, Some(ma.clone())).unwrap();
    engine.set_guest_memory(gb.id, Some(mb.clone())).unwrap();
    let mut a = open(&engine, &ga, &ma, 1, 2 << 20);
    let mut b = open(&engine, &gb, &mb, 2, 4 << 20);
    // The frontend re-sends its table: new fds, new mappings, same file.
    engine
        .set_guest_memory(gb.id, Some(table(&gb.file)))
        .unwrap();
    assert_eq!(engine.run_state(ChannelId(b.id())), Some(RunState::Live));
    a.send_user(
        svnic_channels::ChannelAddr {
            mac: gb.mac,
            endpoint: 2,
        },
        5,
        b"still",
        false,
    )
    .unwrap();
    a.flush().unwrap();
    let got = recv_n(&mut b, &gb.waker, 1, T);
    assert!(matches!(got[0], Message::UserData(u) if u.data() == b"still"));
}

#[test]
fn a_table_over_other_pages_faults_the_channels_it_moved() {
    let engine = engine(1);
    let ga = vhost_guest(&engine, 1);
    let gb = vhost_guest(&engine, 2);
    let (ma, mb) = (table(&ga.file), table(&gb.file));
    engine.set_guest_memory(ga.id, Some(ma.clone())).unwrap();
    engine.set_guest_memory(gb.id, Some(mb.clone())).unwrap();
    let mut a = open(&engine, &ga, &ma, 1, 2 << 20);
    let b = open(&engine, &gb, &mb, 2, 4 << 20);
    let other = memfd();
    engine.set_guest_memory(gb.id, Some(table(&other))).unwrap();
    assert_eq!(engine.run_state(ChannelId(b.id())), Some(RunState::Faulted));
    assert!(
        b.fault().unwrap().contains("no longer mapped"),
        "{:?}",
        b.fault()
    );
    a.send_user(
        svnic_channels::ChannelAddr {
            mac: gb.mac,
            endpoint: 2,
        },
        6,
        b"x",
        false,
    )
    .unwrap();
    a.flush().unwrap();
    let got = recv_n(&mut a, &ga.waker, 1, T);
    assert!(
        matches!(got[0], Message::Completion(c) if c.status == CompletionStatus::DestinationFaulted)
    );
}

#[test]
fn memory_gone_destroys_channels_and_fails_messages_in_flight_to_them() {
    let engine = Engine::new(EngineConfig {
        workers: 2,
        backpressure_wait: Duration::from_secs(30),
        ..Default::default()
    })
    .unwrap();
    let ga = vhost_guest(&engine, 1);
    let gb = vhost_guest(&engine, 2);
    let (ma, mb) = (table(&ga.file), table(&gb.file));
    engine.set_guest_memory(ga.id, Some(ma.clone())).unwrap();
    engine.set_guest_memory(gb.id, Some(mb.clone())).unwrap();
    let mut a = open(&engine, &ga, &ma, 1, 2 << 20);
    let b = open(&engine, &gb, &mb, 2, 4 << 20);
    // A DMA message waits for a buffer B will never post.
    let off = a.layout().data_offset;
    a.send_dma(
        svnic_channels::ChannelAddr {
            mac: gb.mac,
            endpoint: 2,
        },
        7,
        DataRef {
            offset: off,
            len: 8,
        },
    )
    .unwrap();
    a.flush().unwrap();
    wait_until(T, || {
        engine
            .channel_stats(ChannelId(a.id()))
            .unwrap()
            .backpressure_holds
            > 0
    });
    // B disconnects.
    engine.set_guest_memory(gb.id, None).unwrap();
    assert_eq!(engine.run_state(ChannelId(b.id())), None, "destroyed");
    let got = recv_n(&mut a, &ga.waker, 1, T);
    assert!(
        matches!(got[0], Message::Completion(c) if c.cookie == 7 && c.status == CompletionStatus::DestinationGone)
    );
    // B reconnects and creates the same endpoint again.
    let mb2 = table(&gb.file);
    engine.set_guest_memory(gb.id, Some(mb2.clone())).unwrap();
    let mut b2 = open(&engine, &gb, &mb2, 2, 4 << 20);
    a.send_user(
        svnic_channels::ChannelAddr {
            mac: gb.mac,
            endpoint: 2,
        },
        8,
        b"again",
        false,
    )
    .unwrap();
    a.flush().unwrap();
    assert_eq!(recv_n(&mut b2, &gb.waker, 1, T)[0].cookie(), 8);
}
