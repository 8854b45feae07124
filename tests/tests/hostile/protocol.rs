//! Attacks 1, 2, 3, 5 and 6 of issue 13: the vhost-user conversation itself.

use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::time::{Duration, Instant};

use svnic_tests::arena::{run_with_timeout, Arena, Bounds};
use svnic_tests::polite_pair::{GUEST_MEMORY, LEG_TIMEOUT};
use svnic_tests::raw_frontend::{
    encode, flags, mem_table, protocol, req, single_region, vring_fd_body, vring_state, MemRegion,
    Memfd, Pipe, Sealing,
};
use svnic_tests::raw_ring::Desc;
use svnic_tests::vhost_frontend::{TestFrontend, RX, TX, TX_BUFS, WANTED_FEATURES};

use super::super::{
    evil_after_handshake, evil_with_memory, polite_evil, settle_then_assert_unharmed, SETTLE,
};

/// Attack 1: the memfd behind the memory table shrinks to nothing before the rings are set up;
/// SET_VRING_ADDR makes the backend read the used ring.
#[test]
fn attack_01_memfd_truncated_before_vring_addr() {
    let arena = Arena::start("hostile-a01a", 0);
    let mut f = TestFrontend::connect(&arena.socket("evil"), Sealing::Unsealed);
    f.handshake().unwrap();
    f.early_enable().unwrap();
    f.set_features(f.offered_features & WANTED_FEATURES)
        .unwrap();
    let before = arena.footprint();
    // The memory table is accepted (unsealed memory is guarded, not refused); the truncation
    // below must then be survived.
    if let Err(e) = f.set_mem_table() {
        panic!("SET_MEM_TABLE refused: {e}\n{}", arena.log());
    }
    f.memory.file().set_len(0).unwrap();
    for q in [RX, TX] {
        let _ = f.setup_vring(q);
    }
    std::thread::sleep(SETTLE);
    assert_fault_recovered(&arena);
    arena.assert_unharmed(before, Bounds::default());
}

/// The daemon says it recovered from a fault in guest memory (`svnic ctl engine`).
fn assert_fault_recovered(arena: &Arena) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let faults = arena.svnic.engine().map(|e| e.memory_faults);
        if faults.as_ref().is_ok_and(|&n| n > 0) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no recovered memory fault reported by svnic ctl engine: {faults:?}\n{}",
            arena.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Attack 1, while the rings run: a TX chain is published, the memfd truncated, then kicked.
#[test]
fn attack_01_memfd_truncated_while_rings_run() {
    let arena = Arena::start("hostile-a01b", 0);
    let mut f = TestFrontend::connect(&arena.socket("evil"), Sealing::Unsealed);
    let before = arena.footprint();
    if let Err(e) = f.polite_setup() {
        panic!(
            "polite setup failed before the attack: {e}\n{}",
            arena.log()
        );
    }
    // Everything is written before the truncation: touching it afterwards would be this
    // process's own SIGBUS. Only the kick is left.
    f.send_frame(&[0u8; 60]).unwrap();
    let _ = f.wait_used(TX, Duration::from_secs(2));
    let tx = f.raw_ring(TX);
    let head = tx.avail_idx().unwrap();
    let d = Desc {
        addr: TX_BUFS,
        len: 72,
        flags: 0,
        next: 0,
    };
    tx.write_desc(head, d).unwrap();
    tx.publish(head).unwrap();
    f.memory.file().set_len(0).unwrap();
    let _ = f.kick(TX);
    let _ = f.kick(RX);
    std::thread::sleep(SETTLE);
    assert_fault_recovered(&arena);
    arena.assert_unharmed(before, Bounds::default());
}

/// Attack 2: two million SET_VRING_ENABLE, each for a different ring, before SET_FEATURES.
/// Streamed without waiting for anything; the backend's memory must not follow.
#[test]
fn attack_02_millions_of_early_vring_enables() {
    const MESSAGES: u32 = 2_000_000;
    let arena = Arena::start("hostile-a02", 0);
    let f = evil_after_handshake(&arena);
    let before = arena.footprint();
    let mut chunk = Vec::with_capacity(1 << 20);
    let mut sent = 0u32;
    'stream: while sent < MESSAGES {
        chunk.clear();
        while chunk.len() < (1 << 20) - 20 && sent < MESSAGES {
            let m = encode(
                req::SET_VRING_ENABLE,
                flags::VERSION_1,
                &vring_state(sent, 1),
            );
            chunk.extend_from_slice(&m);
            sent += 1;
        }
        if f.raw.stream().write_all(&chunk).is_err() {
            break 'stream; // the backend ended the connection: as good as bounded
        }
    }
    // Everything sent is handled before this answer (unless the connection is gone).
    let _ = f.raw.sync();
    arena.assert_unharmed(before, Bounds::default());
}

/// Attack 3: CONFIGURE_MEM_SLOTS acknowledged although never offered, then a thousand
/// ADD_MEM_REG, one descriptor each.
#[test]
fn attack_03_a_thousand_memory_regions_added() {
    const REGIONS: u64 = 1000;
    let arena = Arena::start("hostile-a03", 0);
    let mut f = evil_after_handshake(&arena);
    let unoffered = protocol::REPLY_ACK | protocol::CONFIG | protocol::CONFIGURE_MEM_SLOTS;
    let _ = f.set_protocol_features(unoffered);
    f.reply_ack = false;
    let _ = f.set_features(f.offered_features & WANTED_FEATURES);
    let _ = f.set_mem_table();
    let _ = f.raw.sync();
    let before = arena.footprint();
    let page = Memfd::new(4096, Sealing::Sealed).unwrap();
    for i in 0..REGIONS {
        let region = MemRegion {
            gpa: (1 << 32) + i * 4096,
            size: 4096,
            user_addr: (1 << 44) + i * 4096,
            mmap_offset: 0,
        };
        let m = encode(req::ADD_MEM_REG, flags::VERSION_1, &single_region(region));
        if f.raw.send_bytes(&m, &[page.fd()]).is_err() {
            break;
        }
    }
    let _ = f.raw.sync();
    arena.assert_unharmed(before, Bounds::default());
}

/// Attack 5: a blocking pipe with a one-page buffer as the TX call fd, never read; then enough
/// TX chains that the backend signals it far more often than the pipe holds. The guest then
/// reconnects on the same socket (the pipe still open), and SIGTERM must still end the daemon.
#[test]
fn attack_05_a_blocking_pipe_as_call_fd() {
    let arena = Arena::start("hostile-a05", 0);
    let mut f = evil_with_memory(&arena);
    f.setup_vring(RX).unwrap();
    let pipe = Pipe::small().unwrap();
    let before = arena.footprint();
    let mut served_throughout = f.setup_vring(TX).is_ok();
    if served_throughout {
        let _ = f.request(
            "SET_VRING_CALL (pipe)",
            req::SET_VRING_CALL,
            &vring_fd_body(1, false),
            &[pipe.write.as_raw_fd()],
        );
        // Each chain used is one 8-byte write to the call fd: 2000 of them overfill a page.
        for _ in 0..2000 {
            if f.send_frame(&[]).is_err() {
                break;
            }
            match f.wait_used(TX, Duration::from_secs(2)) {
                Ok(used) if !used.is_empty() => {}
                _ => {
                    served_throughout = false;
                    break;
                }
            }
        }
    }
    eprintln!("the backend served the TX queue to the end: {served_throughout}");
    // The frontend goes away, the pipe stays open; a polite guest takes the socket.
    drop(f);
    let socket = arena.socket("evil");
    let back = run_with_timeout(LEG_TIMEOUT + LEG_TIMEOUT, move || {
        let g = svnic_host_frontend::HostGuest::connect(&socket, GUEST_MEMORY)
            .map_err(|e| format!("connect: {e}"))?;
        g.create_channel(3, 256, LEG_TIMEOUT)
            .map(|ch| (g, ch))
            .map_err(|e| format!("create channel: {e}"))
    });
    match back {
        Some(Ok(_guest)) => {}
        Some(Err(e)) => panic!(
            "the guest cannot come back on its socket: {e}\n{}",
            arena.log()
        ),
        None => panic!(
            "the guest cannot come back on its socket: no answer in 20 s\n{}",
            arena.log()
        ),
    }
    arena.assert_unharmed(before, Bounds::default());
    drop(pipe);
}

/// Attack 6: a frontend that sends requests with replies and never reads them.
#[test]
fn attack_06_a_frontend_that_never_reads_its_replies() {
    let arena = Arena::start("hostile-a06", 0);
    let f = polite_evil(&arena);
    let before = arena.footprint();
    let stream = f.raw.stream();
    stream
        .set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let get = encode(req::GET_FEATURES, flags::VERSION_1, &[]);
    let batch: Vec<u8> = get.iter().copied().cycle().take(get.len() * 1000).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut batches = 0;
    // Until the socket buffers on both sides are full (a write blocks for 2 s), or 200 k
    // requests.
    while batches < 200 && Instant::now() < deadline {
        if (&*stream).write_all(&batch).is_err() {
            break;
        }
        batches += 1;
    }
    eprintln!("{batches} thousand GET_FEATURES written");
    arena.assert_unharmed(before, Bounds::default());
    drop(f);
}

/// Attack 3's cousin: a memory table that claims more regions than it carries, or more than the
/// protocol allows, with as many descriptors as can be attached.
#[test]
fn memory_tables_with_lying_region_counts() {
    let arena = Arena::start("hostile-memtable", 0);
    let before = arena.footprint();
    let memfd = Memfd::new(1 << 20, Sealing::Sealed).unwrap();
    let fds = [memfd.fd(); 32];
    for (count, carried) in [(0u32, 0usize), (8, 1), (33, 33), (u32::MAX, 2), (1, 1)] {
        let mut f = evil_after_handshake(&arena);
        f.set_features(f.offered_features & WANTED_FEATURES)
            .unwrap();
        let regions: Vec<MemRegion> = (0..carried as u64)
            .map(|i| MemRegion {
                gpa: i << 20,
                size: 1 << 20,
                user_addr: (1 << 44) + (i << 20),
                mmap_offset: 0,
            })
            .collect();
        let mut body = mem_table(&regions);
        body[..4].copy_from_slice(&count.to_le_bytes());
        let nfds = carried.min(fds.len());
        let _ = f.raw.send(
            req::SET_MEM_TABLE,
            flags::VERSION_1 | flags::NEED_REPLY,
            &body,
            &fds[..nfds],
        );
        let _ = f.raw.sync();
    }
    settle_then_assert_unharmed(arena, before);
}
