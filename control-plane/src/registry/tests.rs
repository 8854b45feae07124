//! Channel-id allocation as the registry uses it: wrap-around, skipping held ids, and a guest
//! looping create/fail that cannot make another guest's creates fail.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::manual_clock::ManualClock;

use svnic_channels::layout::DEFAULT_REGION_LEN;
use svnic_channels::{ChannelId, FailureReason, MacAddr};

use super::*;
use crate::channel_ids::ChannelIds;

const MAC_A: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 0xa]);
const MAC_B: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 0xb]);

fn req(mac: MacAddr, endpoint: u32, region_addr: u64) -> CreateRequest {
    CreateRequest {
        mac,
        endpoint,
        ring_size: 256,
        region_addr,
        region_len: DEFAULT_REGION_LEN,
    }
}

fn plane(clock: &ManualClock) -> (ControlPlane<u32>, GuestId, GuestId) {
    let clock = clock.clone();
    let cp = ControlPlane::with_clock(move || clock.now());
    let a = cp.add_guest(GuestPolicy::new("a", MAC_A)).unwrap();
    let b = cp.add_guest(GuestPolicy::new("b", MAC_B)).unwrap();
    (cp, a, b)
}

fn start_ids_after(cp: &ControlPlane<u32>, last: u32) {
    cp.lock().channel_ids = ChannelIds::after(last);
}

#[test]
fn ids_wrap_past_u32_max_to_low_ids_skipping_live_and_kept_records() {
    let clock = ManualClock::new();
    let (cp, a, b) = plane(&clock);
    let one = cp.begin_create(a, &req(MAC_A, 1, 0)).unwrap();
    let two = cp.begin_create(b, &req(MAC_B, 2, 0)).unwrap();
    let three = cp
        .begin_create(a, &req(MAC_A, 3, DEFAULT_REGION_LEN))
        .unwrap();
    assert_eq!(
        (one, two, three),
        (ChannelId(1), ChannelId(2), ChannelId(3))
    );
    cp.complete_create(one, 1, 0, None).unwrap();
    // Two fails: its terminal record is kept, so its id stays taken.
    cp.fail_create(two, FailureReason::RegionOutsideMemory)
        .unwrap();

    start_ids_after(&cp, u32::MAX - 1);
    let top = cp.begin_create(b, &req(MAC_B, 4, 0)).unwrap();
    assert_eq!(top, ChannelId(u32::MAX));
    let wrapped = cp
        .begin_create(b, &req(MAC_B, 5, DEFAULT_REGION_LEN))
        .unwrap();
    assert_eq!(wrapped, ChannelId(4), "0 is never an id; 1 to 3 are held");

    // The records the skipped ids name are untouched.
    assert_eq!(cp.channel(one).unwrap().state, ChannelState::Success);
    assert_eq!(
        cp.channel(two).unwrap().state,
        ChannelState::Failure(FailureReason::RegionOutsideMemory)
    );
    assert_eq!(cp.channel(three).unwrap().guest, a);
    assert_eq!(cp.channel(wrapped).unwrap().addr.endpoint, 5);
}

#[test]
fn a_create_fail_loop_of_one_guest_never_fails_another_guests_creates() {
    const CYCLES: u32 = 100_000;
    let clock = ManualClock::new();
    let (cp, a, b) = plane(&clock);
    // Start close enough to the end of the cycle that the loop wraps around it.
    start_ids_after(&cp, u32::MAX - CYCLES / 2);
    let kept = cp.begin_create(b, &req(MAC_B, 0, 0)).unwrap();
    cp.complete_create(kept, 7, 0, None).unwrap();

    let mut wrapped = false;
    for i in 0..CYCLES {
        // A at exactly its sustained rate (200/s): never rate limited.
        clock.advance(Duration::from_millis(5));
        let id = cp
            .begin_create(a, &req(MAC_A, 1, 0))
            .unwrap_or_else(|r| panic!("cycle {i}: A's create refused: {r}"));
        assert_ne!(id, kept, "cycle {i}: B's live channel id handed out again");
        wrapped |= id.0 < CYCLES;
        cp.fail_create(id, FailureReason::RegionOutsideMemory)
            .unwrap();
        if i % 1000 == 0 {
            let other = cp
                .begin_create(b, &req(MAC_B, 1, DEFAULT_REGION_LEN))
                .unwrap_or_else(|r| panic!("cycle {i}: B's create refused: {r}"));
            cp.complete_create(other, 8, 0, None).unwrap();
            cp.begin_destroy(Some(b), other).unwrap();
            cp.finish_destroy(other).unwrap();
        }
    }
    assert!(wrapped, "the ids went past u32::MAX");
    assert_eq!(cp.channel(kept).unwrap().state, ChannelState::Success);
    assert!(cp
        .begin_create(b, &req(MAC_B, 2, 2 * DEFAULT_REGION_LEN))
        .is_ok());
    // Records stay bounded: B's live channel and the kept terminal ones.
    assert_eq!(cp.channels().len(), 1 + MAX_TERMINAL_RECORDS + 1);
}
