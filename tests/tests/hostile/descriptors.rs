//! DPDK vhost CVE classes on the virtio-net queues: descriptors and ring addresses outside
//! memory (CVE-2018-1059), lengths near the integer limits, chain loops, over-long and indirect
//! chains, memory tables changed under running rings or overlapping (CVE-2020-10722..10726),
//! buffers straddling two regions (CVE-2022-2132).

use std::time::Duration;

use std::os::unix::io::AsRawFd;
use svnic_tests::arena::{Arena, Bounds};

use svnic_host_frontend::virtio_user::{MemfdMemory, RingLayout};
use svnic_tests::raw_frontend::{flags, mem_table, req, MemRegion};
use svnic_tests::raw_ring::{Desc, DESC_F_INDIRECT, DESC_F_NEXT, DESC_F_WRITE};
use svnic_tests::vhost_frontend::{
    TestFrontend, FREE, MEM_SIZE, QUEUE_SIZE, RX, TX, WANTED_FEATURES,
};

use super::super::{
    broadcast_from_a, evil_after_handshake, evil_up_to_features, evil_with_memory, polite_evil,
    settle_then_assert_unharmed, SETTLE,
};

fn desc(addr: u64, len: u32, flags: u16, next: u16) -> Desc {
    Desc {
        addr,
        len,
        flags,
        next,
    }
}

/// Publishes each chain on TX (kicking each), and each chain as RX buffers followed by a
/// broadcast from A that the backend must write into them.
fn publish_everywhere(arena: &Arena, f: &mut TestFrontend, chains: &[Vec<Desc>]) {
    for (i, chain) in chains.iter().enumerate() {
        let head = f.raw_ring(TX).avail_idx().unwrap() % QUEUE_SIZE;
        let _ = f.publish_raw(TX, head, chain);
        std::thread::sleep(Duration::from_millis(20));
        let writable: Vec<Desc> = chain
            .iter()
            .map(|d| Desc {
                flags: d.flags | DESC_F_WRITE,
                ..*d
            })
            .collect();
        let head = f.raw_ring(RX).avail_idx().unwrap() % QUEUE_SIZE;
        let _ = f.publish_raw(RX, head, &writable);
        broadcast_from_a(arena, i as u64);
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(SETTLE);
}

/// Starts an arena named `name`, publishes `chains` everywhere from a polite evil frontend, and
/// asserts that the daemon is unharmed.
fn assert_chains_harmless(name: &str, chains: &[Vec<Desc>]) {
    let arena = Arena::start(name, 0);
    let mut f = polite_evil(&arena);
    let before = arena.footprint();
    publish_everywhere(&arena, &mut f, chains);
    arena.assert_unharmed(before, Bounds::default());
}

/// CVE-2018-1059: descriptors whose buffer starts inside memory and ends outside it, or lies
/// wholly outside it.
#[test]
fn cve_2018_1059_descriptors_leaving_memory() {
    assert_chains_harmless(
        "hostile-cve2018-desc",
        &[
            vec![desc(MEM_SIZE - 16, 4096, 0, 0)],
            vec![desc(MEM_SIZE, 64, 0, 0)],
            vec![desc(MEM_SIZE - 1, 2, 0, 0)],
            vec![desc(1 << 40, 1500, 0, 0)],
            vec![
                desc(FREE, 100, DESC_F_NEXT, 1),
                desc(MEM_SIZE - 8, 100, 0, 0),
            ],
        ],
    );
}

/// CVE-2018-1059: ring addresses outside every region, or starting inside and running off its
/// end (a used ring whose last entries are past the end).
#[test]
fn cve_2018_1059_ring_addresses_leaving_memory() {
    let arena = Arena::start("hostile-cve2018-rings", 0);
    let before = arena.footprint();
    for (desc_gpa, avail_gpa, used_gpa) in [
        (MEM_SIZE + 4096, 0x2_1000, 0x2_2000),
        (0x2_0000, MEM_SIZE - 4, 0x2_2000),
        (0x2_0000, 0x2_1000, MEM_SIZE - 64),
        (MEM_SIZE - 16, 0x2_1000, 0x2_2000),
        (u64::MAX - 4095, u64::MAX - 1023, u64::MAX - 511),
    ] {
        let f = evil_with_memory(&arena);
        let layout = RingLayout {
            size: QUEUE_SIZE,
            desc: desc_gpa,
            avail: avail_gpa,
            used: used_gpa,
        };
        let _ = f.setup_vring_at(TX, layout);
        let _ = f.kick(TX);
        std::thread::sleep(Duration::from_millis(50));
    }
    settle_then_assert_unharmed(arena, before);
}

/// CVE-2020-10722/10726: lengths at the u32 limit, addresses at the u64 limit, and chains whose
/// total length overflows.
#[test]
fn cve_2020_10722_lengths_near_integer_limits() {
    assert_chains_harmless(
        "hostile-cve2020-len",
        &[
            vec![desc(FREE, u32::MAX, 0, 0)],
            vec![desc(u64::MAX - 15, 32, 0, 0)],
            vec![desc(u64::MAX, u32::MAX, 0, 0)],
            vec![
                desc(FREE, 0x8000_0000, DESC_F_NEXT, 1),
                desc(FREE, 0x8000_0000, DESC_F_NEXT, 2),
                desc(FREE, 0x8000_0000, 0, 0),
            ],
            vec![desc(FREE, 0, 0, 0)],
            vec![desc(FREE, 11, 0, 0)],
        ],
    );
}

/// CVE-2020-10723: chains that loop (directly, through each other, through an indirect table),
/// chains longer than the ring, `next` past the table, nested and malformed indirect tables.
#[test]
fn cve_2020_10723_chain_loops_and_overlong_chains() {
    let arena = Arena::start("hostile-cve2020-chains", 0);
    let mut f = polite_evil(&arena);
    let before = arena.footprint();
    // An indirect table at FREE: a loop inside it; another whose entry is itself indirect.
    let table = FREE + 0x1_0000;
    f.raw_ring(TX)
        .write_table(
            table,
            &[
                desc(FREE, 64, DESC_F_NEXT, 1),
                desc(FREE, 64, DESC_F_NEXT, 0),
            ],
        )
        .unwrap();
    let nested = FREE + 0x2_0000;
    f.raw_ring(TX)
        .write_table(nested, &[desc(table, 32, DESC_F_INDIRECT, 0)])
        .unwrap();
    let long: Vec<Desc> = (0..256u16)
        .map(|i| desc(FREE, 64, DESC_F_NEXT, i.wrapping_add(1) % 256))
        .collect();
    publish_everywhere(
        &arena,
        &mut f,
        &[
            vec![desc(FREE, 64, DESC_F_NEXT, 0)],
            vec![
                desc(FREE, 64, DESC_F_NEXT, 1),
                desc(FREE, 64, DESC_F_NEXT, 0),
            ],
            vec![desc(FREE, 64, DESC_F_NEXT, 300)],
            vec![desc(FREE, 64, DESC_F_NEXT, u16::MAX)],
            vec![desc(table, 32, DESC_F_INDIRECT, 0)],
            vec![desc(nested, 16, DESC_F_INDIRECT, 0)],
            vec![desc(table, 33, DESC_F_INDIRECT, 0)],
            vec![desc(table, 0, DESC_F_INDIRECT, 0)],
            vec![desc(table, !15, DESC_F_INDIRECT, 0)],
            vec![desc(table, 32, DESC_F_INDIRECT | DESC_F_NEXT, 1)],
            long,
        ],
    );
    arena.assert_unharmed(before, Bounds::default());
}

/// CVE-2020-10724/10725: the memory table replaced, shrunk under the rings, or emptied while
/// the rings run and frames flow.
#[test]
fn cve_2020_10724_memory_table_changed_while_rings_run() {
    let arena = Arena::start("hostile-cve2020-table", 0);
    let mut f = polite_evil(&arena);
    f.post_rx(64).unwrap();
    let before = arena.footprint();
    let whole = f.mem_region();
    let other = MemfdMemory::new(MEM_SIZE).unwrap();
    for round in 0..20u64 {
        // Shrunk: the TX ring (0x2_0000) and every buffer fall outside.
        let shrunk = MemRegion {
            size: 0x1_8000,
            ..whole
        };
        // Replaced: the same addresses backed by another (zeroed) file.
        let replaced = MemRegion {
            user_addr: other.host_address(0).unwrap(),
            ..whole
        };
        let (table, fd) = match round % 3 {
            0 => (mem_table(&[shrunk]), f.memfd()),
            1 => (mem_table(&[replaced]), other.file().as_raw_fd()),
            _ => (mem_table(&[whole]), f.memfd()),
        };
        let _ = f.send_frame(&[0u8; 60]);
        broadcast_from_a(&arena, round);
        let _ = f
            .raw
            .send(req::SET_MEM_TABLE, flags::VERSION_1, &table, &[fd]);
        let _ = f.kick(TX);
        let _ = f.kick(RX);
    }
    let _ = f.raw.sync();
    settle_then_assert_unharmed(arena, before);
}

/// CVE-2020-10725: memory tables whose regions overlap (in guest-physical or frontend
/// addresses), or with a zero-sized or wrapping region.
#[test]
fn cve_2020_10725_overlapping_memory_regions() {
    let arena = Arena::start("hostile-cve2020-overlap", 0);
    let before = arena.footprint();
    for shape in 0..4 {
        let mut f = evil_after_handshake(&arena);
        f.set_features(f.offered_features & WANTED_FEATURES)
            .unwrap();
        let whole = f.mem_region();
        let second = match shape {
            0 => MemRegion {
                gpa: 0x10_0000,
                user_addr: whole.user_addr + (1 << 30),
                ..whole
            },
            1 => MemRegion {
                gpa: 1 << 32,
                ..whole
            },
            2 => MemRegion {
                gpa: u64::MAX - 0xfff,
                size: 0x2000,
                ..whole
            },
            _ => MemRegion { size: 0, ..whole },
        };
        let fd = f.memfd();
        let _ = f.raw.send(
            req::SET_MEM_TABLE,
            flags::VERSION_1,
            &mem_table(&[whole, second]),
            &[fd, fd],
        );
        for q in [RX, TX] {
            let _ = f.setup_vring(q);
        }
        let _ = f.send_frame(&[0u8; 60]);
        let _ = f.raw.sync();
    }
    settle_then_assert_unharmed(arena, before);
}

/// CVE-2022-2132: the same memory announced as two regions (two mappings in the backend), and
/// buffers that cross the seam, on TX and RX.
#[test]
fn cve_2022_2132_buffers_straddling_two_regions() {
    let arena = Arena::start("hostile-cve2022", 0);
    let mut f = evil_up_to_features(&arena);
    let whole = f.mem_region();
    let seam = MEM_SIZE / 2;
    let first = MemRegion {
        size: seam,
        ..whole
    };
    let second = MemRegion {
        gpa: seam,
        size: MEM_SIZE - seam,
        user_addr: whole.user_addr + seam,
        mmap_offset: seam,
    };
    let fd = f.memfd();
    f.request(
        "SET_MEM_TABLE (two regions)",
        req::SET_MEM_TABLE,
        &mem_table(&[first, second]),
        &[fd, fd],
    )
    .unwrap();
    f.setup_vring(RX).unwrap();
    f.setup_vring(TX).unwrap();
    let before = arena.footprint();
    // A valid frame across the seam, as a guest may legitimately lay it out.
    let mut frame = vec![0u8; 12];
    frame.extend_from_slice(&svnic_tests::polite_pair::test_frame(
        arena.pair.b.mac(),
        svnic_channels::MacAddr([0x52, 0x54, 0, 0x5e, 0, 3]),
        1,
    ));
    f.write(seam - 30, &frame).unwrap();
    publish_everywhere(
        &arena,
        &mut f,
        &[
            vec![desc(seam - 30, frame.len() as u32, 0, 0)],
            vec![desc(seam - 1, 4096, 0, 0)],
            vec![desc(seam - 2048, 0x1_0000, 0, 0)],
            vec![
                desc(seam - 8, 16, DESC_F_NEXT, 1),
                desc(seam + 8, 4096, 0, 0),
            ],
        ],
    );
    arena.assert_unharmed(before, Bounds::default());
}
