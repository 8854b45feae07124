//! The CVE-2024-11614 class on channels: a host-process guest writes its channel memory
//! directly (indices far ahead, behind, garbage slots). That channel is faulted or its garbage
//! refused one by one (docs/abi.md, section 3); its other channel, and everybody else, are fine.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use svnic_client::Completions;

use svnic_channels::layout::header;
use svnic_channels::{CompletionStatus, DataRef, FaultReason, Message};
use svnic_client::Channel;
use svnic_host_frontend::HostGuest;
use svnic_tests::arena::{Arena, Bounds};
use svnic_tests::polite_pair::{GUEST_MEMORY, LEG_TIMEOUT};
use vm_memory::Bytes;

/// A guest on "evil" with two channels: the one it attacks and one it keeps healthy.
fn evil_guest(arena: &Arena) -> (HostGuest, Channel, Channel) {
    let g = HostGuest::connect(arena.socket("evil"), GUEST_MEMORY).unwrap();
    let attacked = g.create_channel(1, 256, LEG_TIMEOUT).unwrap();
    let healthy = g.create_channel(2, 256, LEG_TIMEOUT).unwrap();
    (g, attacked, healthy)
}

fn store(ch: &Channel, offset: usize, value: u32) {
    ch.region()
        .slice()
        .store(value, offset, Ordering::Release)
        .unwrap();
}

fn fault_code(ch: &Channel) -> u32 {
    ch.region()
        .slice()
        .load::<u32>(header::FAULT, Ordering::Acquire)
        .unwrap()
}

/// Waits until the engine faults `ch`; the fault code (0 if it did not within the timeout).
fn wait_fault(ch: &Channel) -> u32 {
    let deadline = Instant::now() + LEG_TIMEOUT;
    while fault_code(ch) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    fault_code(ch)
}

/// A sends user-data to `ch` (a channel of `g`), which must receive it.
fn a_reaches(arena: &mut Arena, g: &HostGuest, ch: &mut Channel) {
    let n = 0xabcd;
    let to = ch.addr();
    assert!(arena
        .pair
        .ca
        .send_user(to, n, b"still fine", Completions::OnError)
        .unwrap());
    arena.pair.ca.flush().unwrap();
    let waiter = g.waiter(ch);
    let mut out = Vec::new();
    let deadline = Instant::now() + LEG_TIMEOUT;
    while out.is_empty() && Instant::now() < deadline {
        ch.wait_poll(&mut out, 4, Duration::from_millis(200), &waiter)
            .unwrap();
    }
    assert!(
        matches!(out.first(), Some(Message::UserData(u)) if u.cookie == n),
        "the attacker's healthy channel got {out:?}\n{}",
        arena.log()
    );
}

/// What makes the engine look at the index a test corrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    /// A doorbell: the engine reads the TX head.
    Doorbell,
    /// A DMA-data message from A: the engine takes a posted buffer.
    DmaFromA,
    /// More messages from A than the RX ring holds: the engine needs the consumer's tail.
    RingfulFromA,
}

fn expect_fault(mut arena: Arena, offset: usize, value: u32, fault: FaultReason, how: Trigger) {
    let (g, attacked, mut healthy) = evil_guest(&arena);
    let before = arena.footprint();
    store(&attacked, offset, value);
    let to = attacked.addr();
    let a = &mut arena.pair.ca;
    match how {
        Trigger::Doorbell => g.doorbell().ring(attacked.id()),
        Trigger::DmaFromA => {
            let buf = DataRef {
                offset: a.layout().data_offset,
                len: 64,
            };
            assert!(a.send_dma(to, 1, buf).unwrap());
        }
        Trigger::RingfulFromA => {
            let deadline = Instant::now() + LEG_TIMEOUT;
            let mut n = 0;
            while n < 300 && Instant::now() < deadline {
                // A full TX ring only means the engine is busy: try again.
                if a.send_user(to, n, b"x", Completions::OnError).unwrap() {
                    n += 1;
                }
                a.flush().unwrap();
            }
        }
    }
    a.flush().unwrap();
    let code = wait_fault(&attacked);
    assert_eq!(
        code,
        fault.code(),
        "{offset:#x} := {value}: the channel's fault code\n{}",
        arena.log()
    );
    a_reaches(&mut arena, &g, &mut healthy);
    arena.assert_unharmed(before, Bounds::default());
    drop(g);
}

#[test]
fn channel_tx_head_far_ahead_faults_only_that_channel() {
    let arena = Arena::start("hostile-ch-tx", 0);
    expect_fault(
        arena,
        header::TX_HEAD,
        100_000,
        FaultReason::TxIndex,
        Trigger::Doorbell,
    );
}

#[test]
fn channel_tx_head_behind_faults_only_that_channel() {
    let arena = Arena::start("hostile-ch-txb", 0);
    expect_fault(
        arena,
        header::TX_HEAD,
        u32::MAX,
        FaultReason::TxIndex,
        Trigger::Doorbell,
    );
}

#[test]
fn channel_post_head_far_ahead_faults_only_that_channel() {
    let arena = Arena::start("hostile-ch-post", 0);
    expect_fault(
        arena,
        header::POST_HEAD,
        5_000,
        FaultReason::PostIndex,
        Trigger::DmaFromA,
    );
}

#[test]
fn channel_rx_tail_past_what_was_published_faults_only_that_channel() {
    let arena = Arena::start("hostile-ch-rx", 0);
    expect_fault(
        arena,
        header::RX_TAIL,
        5_000,
        FaultReason::RxIndex,
        Trigger::RingfulFromA,
    );
}

/// A full ring of garbage TX slots behind a valid head: each is refused with a BadMessage
/// completion carrying its cookie, and the channel keeps working.
#[test]
fn channel_garbage_tx_slots_are_refused_one_by_one() {
    const SLOTS: u32 = 64;
    let mut arena = Arena::start("hostile-ch-garbage", 0);
    let (g, mut attacked, _healthy) = evil_guest(&arena);
    let before = arena.footprint();
    let tx_ring = attacked.layout().tx_ring;
    for i in 0..SLOTS {
        let mut slot = [0x77u8; 64];
        slot[16..24].copy_from_slice(&u64::from(i).to_le_bytes());
        attacked
            .region()
            .slice()
            .write_slice(&slot, tx_ring + 64 * i as usize)
            .unwrap();
    }
    store(&attacked, header::TX_HEAD, SLOTS);
    g.doorbell().ring(attacked.id());
    let waiter = g.waiter(&attacked);
    let mut out = Vec::new();
    let deadline = Instant::now() + LEG_TIMEOUT;
    while out.len() < SLOTS as usize && Instant::now() < deadline {
        let _ = attacked.wait_poll(&mut out, 64, Duration::from_millis(200), &waiter);
    }
    let refused: Vec<u64> = out
        .iter()
        .filter_map(|m| match m {
            Message::Completion(c) if c.status == CompletionStatus::BadMessage => Some(c.cookie),
            _ => None,
        })
        .collect();
    assert_eq!(
        refused,
        (0..u64::from(SLOTS)).collect::<Vec<_>>(),
        "one BadMessage completion per garbage slot, in order\n{}",
        arena.log()
    );
    assert_eq!(
        fault_code(&attacked),
        0,
        "garbage slots do not fault the channel"
    );
    drop(_healthy);
    a_reaches(&mut arena, &g, &mut attacked);
    arena.assert_unharmed(before, Bounds::default());
    drop(g);
}
