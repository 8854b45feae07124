//! CVE-2024-11614 class on the virtio-net queues: available indices far ahead of the ring,
//! garbage ring entries, bogus ring sizes and absurd ring bases.

use std::time::Duration;

use svnic_tests::arena::Arena;
use svnic_tests::raw_frontend::{req, vring_state};
use svnic_tests::raw_ring::{Desc, DESC_F_WRITE};
use svnic_tests::vhost_frontend::{TestFrontend, FREE, QUEUE_SIZE, RX, TX};

use super::super::{broadcast_from_a, evil_with_memory, polite_evil, settle_then_assert_unharmed};

/// Sends the ring-state request `request` (`what`, for logs) for ring `q` with `value`, whether
/// or not the backend accepts it.
fn send_vring_state(f: &TestFrontend, what: &str, request: u32, q: usize, value: u32) {
    let _ = f.request(what, request, &vring_state(q as u32, value), &[]);
}

/// `avail.idx` far ahead of what was consumed (a whole ring and more, and "behind"), with
/// ring entries naming descriptors past the table, on TX and RX.
#[test]
fn cve_2024_11614_available_index_far_ahead() {
    let arena = Arena::start("hostile-cve2024-idx", 0);
    let f = polite_evil(&arena);
    let before = arena.footprint();
    for q in [TX, RX] {
        let ring = f.raw_ring(q);
        for slot in 0..QUEUE_SIZE {
            ring.set_avail_entry(slot, 256u16.wrapping_add(slot.wrapping_mul(251)))
                .unwrap();
        }
    }
    for idx in [257u16, 40_000, u16::MAX, 1] {
        for q in [TX, RX] {
            f.raw_ring(q).set_avail_idx(idx).unwrap();
            let _ = f.kick(q);
        }
        broadcast_from_a(&arena, u64::from(idx));
        std::thread::sleep(Duration::from_millis(50));
    }
    settle_then_assert_unharmed(arena, before);
}

/// SET_VRING_NUM 0, not a power of two, larger than the maximum, past u16; then the ring is set
/// up and kicked as if nothing happened. One connection per value (a refusal may end it).
#[test]
fn cve_2024_11614_bogus_ring_sizes() {
    let sizes = [
        0u32,
        3,
        255,
        1025,
        32_768,
        65_535,
        65_536,
        1 << 20,
        u32::MAX,
    ];
    attack_each_on_a_new_connection("hostile-cve2024-num", &sizes, |f, num| {
        let _ = f.setup_vring(RX);
        let _ = f.setup_vring(TX);
        for q in [RX, TX] {
            send_vring_state(f, "SET_VRING_NUM", req::SET_VRING_NUM, q, num);
        }
        let _ = f.send_frame(&[0u8; 60]);
        let _ = f.post_rx(8);
    });
}

/// Starts an arena named `name`; for each of `values`, a new frontend through the memory table
/// (one connection per value: a refusal may end it) gets `attack`, then A broadcasts (into its
/// RX queue); then the verdict.
fn attack_each_on_a_new_connection(
    name: &str,
    values: &[u32],
    attack: impl Fn(&mut TestFrontend, u32),
) {
    let arena = Arena::start(name, 0);
    let before = arena.footprint();
    for &value in values {
        let mut f = evil_with_memory(&arena);
        attack(&mut f, value);
        broadcast_from_a(&arena, u64::from(value));
        std::thread::sleep(Duration::from_millis(50));
    }
    settle_then_assert_unharmed(arena, before);
}

/// SET_VRING_BASE with values a u16 ring index cannot hold, or far from the driver's index,
/// then traffic; and SET_VRING_* for rings that do not exist.
#[test]
fn cve_2024_11614_absurd_ring_bases_and_indices() {
    let bases = [0x8000u32, 0xffff, 0x1_0000, u32::MAX];
    attack_each_on_a_new_connection("hostile-cve2024-base", &bases, |f, base| {
        for q in [RX, TX] {
            let _ = f.setup_vring(q);
            send_vring_state(f, "SET_VRING_BASE", req::SET_VRING_BASE, q, base);
        }
        for ring in [2u32, 255, 0x8000, u32::MAX] {
            for request in [
                req::SET_VRING_NUM,
                req::SET_VRING_BASE,
                req::SET_VRING_ENABLE,
            ] {
                let _ = f.request("ring out of range", request, &vring_state(ring, 1), &[]);
            }
        }
        let _ = f.send_frame(&[0u8; 60]);
        let slot = f.raw_ring(RX).avail_idx().unwrap() % QUEUE_SIZE;
        let _ = f.publish_raw(
            RX,
            slot,
            &[Desc {
                addr: FREE,
                len: 4096,
                flags: DESC_F_WRITE,
                next: 0,
            }],
        );
    });
}
