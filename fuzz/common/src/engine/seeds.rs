//! Seed inputs of `engine_hostile_rings`, written as values.

use super::input::{
    Attacker, Head, HeaderWord, Length, Offset, Op, Peer, Ring, Script, Slot, SlotBody, Span,
    Target, Value,
};

/// The longest [`Op::Wait`].
const WAIT: Op = Op::Wait { units: 7 };

fn slot(peer: Peer, cookie: u16, body: SlotBody) -> Slot {
    Slot {
        peer,
        cookie,
        body,
        flip: None,
    }
}

fn dma(peer: Peer, cookie: u16, offset: Offset, len: Length) -> Slot {
    slot(
        peer,
        cookie,
        SlotBody::Dma {
            flags: 0,
            data: Span { offset, len },
        },
    )
}

fn write(chan: Attacker, slot: Slot) -> Op {
    Op::Write { chan, slot }
}

fn publish(chan: Attacker) -> Op {
    Op::Publish {
        chan,
        doorbell: true,
    }
}

/// Offsets around `n * 64` outside an attacker's data area: in its header and rings, before the
/// data area, near u64::MAX, at the far end of its region.
fn outside_data(n: u8) -> [Offset; 4] {
    [
        Offset::Start(n),
        Offset::BeforeData(n),
        Offset::NearMax(n),
        Offset::RegionEnd(n),
    ]
}

/// 64 bytes counting up from `first`.
fn counting(first: u8) -> [u8; 64] {
    std::array::from_fn(|i| first.wrapping_add(i as u8))
}

/// Every seed, with its file name.
pub fn seeds() -> Vec<(&'static str, Script)> {
    use Attacker::{A0, A1};

    // Honest DMA-data to the victim, one posted buffer's worth each.
    let mut dma_to_victim: Vec<Op> = (0..3)
        .map(|c| write(A0, dma(Peer::Victim, c, Offset::Data(0), Length::Post)))
        .collect();
    dma_to_victim.extend([publish(A0), WAIT, Op::VictimDrain]);

    // DMA-data whose source lies outside the attacker's data area or at the victim's address.
    let mut dma_bad_source: Vec<Op> = (11..)
        .zip(outside_data(4).into_iter().chain([Offset::Victim(4)]))
        .map(|(c, o)| write(A0, dma(Peer::Victim, c, o, Length::Small(31))))
        .collect();
    dma_bad_source.extend([publish(A0), WAIT]);

    // Hostile posted buffers, then DMA-data from the victim into them.
    let mut hostile_posts: Vec<Op> = (0..)
        .zip(outside_data(1).into_iter().chain([Offset::Data(1)]))
        .map(|(cookie, offset)| Op::Post {
            chan: A0,
            cookie,
            buf: Span {
                offset,
                len: Length::Post,
            },
        })
        .collect();
    hostile_posts.extend([
        Op::Publish {
            chan: A0,
            doorbell: false,
        },
        Op::VictimDma { to: A0, len: 10 },
        Op::VictimDma { to: A0, len: 3 },
        WAIT,
        Op::VictimDrain,
    ]);

    // Impossible indices: TX head far ahead, RX tail past what was published, post head at
    // three rings.
    let index_attacks = vec![
        Op::Store {
            chan: A0,
            word: HeaderWord::TxHead,
            value: Value::NearMax(5),
        },
        Op::Wait { units: 4 },
        Op::Store {
            chan: A1,
            word: HeaderWord::RxTail,
            value: Value::Small(200),
        },
        Op::Wait { units: 4 },
        Op::Store {
            chan: A0,
            word: HeaderWord::PostHead,
            value: Value::RingTimes(3),
        },
        Op::Doorbell {
            chan: A0,
            target: Target::Own,
        },
        WAIT,
    ];

    // An attacker channel DMA-ing to itself.
    let loopback = vec![
        Op::Post {
            chan: A0,
            cookie: 1,
            buf: Span {
                offset: Offset::Data(8),
                len: Length::Post,
            },
        },
        write(A0, dma(Peer::A0, 5, Offset::Data(0), Length::Small(63))),
        publish(A0),
        WAIT,
    ];

    // Garbage in the first three slots of every ring, published.
    let mut raw_slots: Vec<Op> = [Ring::Tx, Ring::Rx, Ring::Post]
        .into_iter()
        .flat_map(|ring| {
            (0..3u8).map(move |slot| Op::RawSlot {
                chan: A1,
                ring,
                slot,
                bytes: counting(7 * slot),
            })
        })
        .collect();
    raw_slots.extend([
        Op::Skew {
            chan: A1,
            head: Head::Tx,
            delta: 3,
        },
        Op::Skew {
            chan: A1,
            head: Head::Post,
            delta: 3,
        },
        Op::Doorbell {
            chan: A1,
            target: Target::Own,
        },
        WAIT,
    ]);

    // An RX ring the attacker never drains, flooded by the healthy channel, then its RX tail
    // scribbled on.
    let mut rx_full: Vec<Op> = (0..20)
        .map(|cookie| Op::HealthyUser {
            to: A0,
            cookie,
            want_completion: false,
        })
        .collect();
    rx_full.extend([
        WAIT,
        Op::Store {
            chan: A0,
            word: HeaderWord::RxTail,
            value: Value::Any(0xffff),
        },
        WAIT,
    ]);

    // An honest user-data burst to the victim.
    let burst = (0..8)
        .map(|cookie| {
            let body = SlotBody::User {
                flags: 0,
                len: 40,
                first: 0,
            };
            slot(Peer::Victim, cookie, body)
        })
        .collect();
    let user_burst = vec![
        Op::Burst {
            chan: A0,
            slots: burst,
        },
        WAIT,
        Op::VictimDrain,
    ];

    vec![
        ("seed-dma-bad-source", dma_bad_source),
        ("seed-dma-to-victim", dma_to_victim),
        ("seed-hostile-posts", hostile_posts),
        ("seed-index-attacks", index_attacks),
        ("seed-loopback", loopback),
        ("seed-raw-slots", raw_slots),
        ("seed-rx-full", rx_full),
        ("seed-user-burst", user_burst),
    ]
    .into_iter()
    .map(|(name, ops)| (name, Script { ops }))
    .collect()
}
