//! Fair passes: a worker's channels share it by bytes as well as by messages. A DMA-data message
//! longer than the byte budget is copied in pieces, one per pass, so that the other channels of
//! the worker are served meanwhile; the receiver sees it only once all its data is in place, in
//! order, exactly once; and a destination or sender that goes away mid-message leaves nothing
//! written into a closed channel, nothing reserved, and counters that balance.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};
use svnic_client::Completions;

use svnic_backend::{Engine, EngineConfig};
use svnic_channels::message::FLAG_COMPLETE;
use svnic_channels::{ChannelId, CompletionStatus, DataRef, Message};
use svnic_client::Channel;
use svnic_tests::fake_guest::*;
use vm_memory::{Bytes, GuestAddress};

const T: Duration = Duration::from_secs(30);

/// The large message: 32 MiB, far more than any byte budget used here.
const LARGE: u32 = 32 << 20;

/// A region with room for a [`LARGE`] buffer after its rings.
const LARGE_REGION: u64 = 34 << 20;

/// Channels of one worker, whose share of a pass ends after `byte_budget` bytes.
fn engine_with_budget(byte_budget: u32) -> Engine {
    Engine::new(EngineConfig {
        workers: 1,
        byte_budget,
        ..Default::default()
    })
    .unwrap()
}

/// Guests 1 (the senders) and 2 (the destinations) on `engine`, each with memory for a
/// [`LARGE_REGION`] channel and a default one.
fn large_guests(engine: &Engine) -> (FakeGuest, FakeGuest) {
    two_guests(engine, 40)
}

/// `len` bytes, none of them zero, that differ from one `seed` to the next.
fn pattern(seed: u8, len: u32) -> Vec<u8> {
    (0..len)
        .map(|i| ((i % 251) as u8).wrapping_add(seed) | 1)
        .collect()
}

/// Polls `ch` once for at most `max` messages, without waiting.
fn poll_now(ch: &mut Channel, max: usize) -> Vec<Message> {
    let mut out = Vec::new();
    ch.poll(&mut out, max).unwrap();
    out
}

/// The only completion in `msgs`, as (cookie, status, len).
fn completion_of(msgs: &[Message]) -> (u64, CompletionStatus, u32) {
    let [Message::Completion(c)] = msgs else {
        panic!("expected one completion, got {msgs:?}")
    };
    (c.cookie, c.status, c.len)
}

/// Posts the buffer at the start of `ch`'s data area, `len` bytes, with `cookie`.
fn post_at_start(ch: &mut Channel, cookie: u64, len: u32) -> u64 {
    let offset = ch.layout().data_offset;
    post_flushed(ch, cookie, offset, len);
    offset
}

/// A [`LARGE`] message is copied one piece per pass: a second sender on the same worker
/// completes user-data round trips while the receiver of the large message has not seen it yet.
/// (A pass that copied the message whole would let at most one round trip through before it,
/// and that only if the round trip's two messages both slipped in before the message was read.)
#[test]
fn round_trips_of_another_channel_complete_while_a_large_message_is_copied() {
    const ROUND_TRIPS: u32 = 3;
    let engine = engine_with_budget(4096);
    let (mut senders, mut receivers) = large_guests(&engine);
    // Created first, so served first in each pass.
    let mut a = senders.open_with(1, 256, LARGE_REGION).unwrap();
    let mut b = senders.open(2);
    let mut d = receivers.open_with(1, 256, LARGE_REGION).unwrap();
    let mut e = receivers.open(2);
    let data = pattern(7, LARGE);
    let source = a.layout().data_offset;
    a.write_data(source, &data).unwrap();
    // Retried if this machine's scheduler kept the test thread off the CPU for the whole copy.
    let mut best = 0;
    for attempt in 0..10u64 {
        let buffer = post_at_start(&mut d, 100 + attempt, LARGE);
        send_dma_flushed(&mut a, receivers.addr(1), attempt, source, LARGE);
        let mut during = 0u32;
        let arrived = loop {
            // One round trip B -> E -> B.
            send_user_blocking(&mut b, receivers.addr(2), attempt, b"ping");
            b.flush().unwrap();
            let ping = recv_n(&mut e, &receivers.waker, 1, T);
            assert_eq!(ping.len(), 1, "ping lost");
            send_user_blocking(&mut e, senders.addr(2), attempt, b"pong");
            e.flush().unwrap();
            let pong = recv_n(&mut b, &senders.waker, 1, T);
            assert_eq!(pong.len(), 1, "pong lost");
            // The round trip is over: had the large message arrived by then?
            let got = poll_now(&mut d, 1);
            if !got.is_empty() {
                break got;
            }
            during += 1;
        };
        let [Message::DmaData(m)] = arrived.as_slice() else {
            panic!("unexpected {arrived:?}")
        };
        assert_eq!((m.cookie, m.data.len), (100 + attempt, LARGE));
        assert_ne!(m.flags & FLAG_COMPLETE, 0);
        let mut got = vec![0u8; LARGE as usize];
        d.read_data(buffer, &mut got).unwrap();
        assert!(got == data, "attempt {attempt}: data differs");
        let done = recv_n(&mut a, &senders.waker, 1, T);
        assert_eq!(completion_of(&done), (attempt, CompletionStatus::Ok, LARGE));
        best = best.max(during);
        if best >= ROUND_TRIPS {
            return;
        }
    }
    panic!(
        "at most {best} round trips of another channel completed while a {LARGE}-byte message \
         was copied (wanted {ROUND_TRIPS})"
    );
}

/// A message of many pieces arrives once, whole, COMPLETE, in order with the user-data and the
/// DMA-data its sender queued behind it; the second DMA-data message takes the next posted
/// buffer; the sender gets one Ok completion each; counters balance.
#[test]
fn a_large_message_arrives_once_intact_and_in_order() {
    // With the default budget; the length is no multiple of it.
    let engine = engine(1);
    let piece = engine.config().byte_budget;
    let len = 8 * piece + 123;
    let (mut ga, mut gd) = large_guests(&engine);
    let mut a = ga.open_with(1, 256, LARGE_REGION).unwrap();
    let mut d = gd.open_with(1, 256, LARGE_REGION).unwrap();
    let small = 5000u32;
    let (src_a, src_b) = (a.layout().data_offset, a.layout().data_offset + (16 << 20));
    let (large_data, small_data) = (pattern(3, len), pattern(9, small));
    a.write_data(src_a, &large_data).unwrap();
    a.write_data(src_b, &small_data).unwrap();
    let buf_a = post_at_start(&mut d, 501, len);
    let buf_b = buf_a + (16 << 20);
    post_flushed(&mut d, 502, buf_b, small);
    let large = DataRef { offset: src_a, len };
    assert!(a.send_dma(gd.addr(1), 1, large).unwrap());
    assert!(a
        .send_user(gd.addr(1), 2, b"after", Completions::OnError)
        .unwrap());
    let second = DataRef {
        offset: src_b,
        len: small,
    };
    assert!(a.send_dma(gd.addr(1), 3, second).unwrap());
    a.flush().unwrap();
    let got = recv_n(&mut d, &gd.waker, 3, T);
    let [Message::DmaData(m1), Message::UserData(u), Message::DmaData(m2)] = got.as_slice() else {
        panic!("unexpected {got:?}")
    };
    assert_eq!((m1.cookie, m1.data.offset, m1.data.len), (501, buf_a, len));
    assert_eq!((u.cookie, u.data()), (2, &b"after"[..]));
    assert_eq!(
        (m2.cookie, m2.data.offset, m2.data.len),
        (502, buf_b, small)
    );
    for m in [m1, m2] {
        assert_ne!(m.flags & FLAG_COMPLETE, 0);
        assert_eq!(m.peer, ga.addr(1));
    }
    let mut out = vec![0u8; len as usize];
    d.read_data(buf_a, &mut out).unwrap();
    assert!(out == large_data, "large message's data differs");
    let mut out = vec![0u8; small as usize];
    d.read_data(buf_b, &mut out).unwrap();
    assert!(out == small_data, "small message's data differs");
    let done = recv_n(&mut a, &ga.waker, 2, T);
    let done: Vec<_> = done
        .iter()
        .map(|m| completion_of(std::slice::from_ref(m)))
        .collect();
    assert_eq!(
        done,
        [
            (1, CompletionStatus::Ok, len),
            (3, CompletionStatus::Ok, small)
        ]
    );
    // Exactly once: nothing more arrives.
    std::thread::sleep(Duration::from_millis(100));
    assert!(poll_now(&mut d, 16).is_empty());
    assert!(poll_now(&mut a, 16).is_empty());
    let sa = engine.channel_stats(ChannelId(a.id())).unwrap();
    assert_eq!(
        (sa.tx_taken, sa.tx_delivered, sa.tx_errors_total()),
        (3, 3, 0)
    );
    let sd = engine.channel_stats(ChannelId(d.id())).unwrap();
    assert_eq!(
        (sd.rx_messages, sd.rx_bytes),
        (3, u64::from(len) + u64::from(small))
    );
}

/// While a large message is copied into a destination's posted buffer, that buffer is reserved:
/// a small DMA-data message of another sender (on the same worker, so that it is read while the
/// copy is in progress) waits and takes the next buffer, and the destination sees the two in
/// buffer order; the small one is not refused meanwhile.
#[test]
fn dma_data_behind_a_reserved_buffer_waits_and_keeps_buffer_order() {
    let engine = Engine::new(EngineConfig {
        workers: 1,
        byte_budget: 4096,
        backpressure_wait: Duration::from_secs(20),
        ..Default::default()
    })
    .unwrap();
    let (mut ga, mut gd) = large_guests(&engine);
    let mut a = ga.open_with(1, 256, LARGE_REGION).unwrap();
    let mut c = ga.open(2);
    let (mut d, d_region) = gd.open_region(1, 256, LARGE_REGION).unwrap();
    a.write_data(a.layout().data_offset, &pattern(1, LARGE))
        .unwrap();
    let small = pattern(2, 4096);
    c.write_data(c.layout().data_offset, &small).unwrap();
    let first = post_at_start(&mut d, 1, LARGE);
    let second = first + u64::from(LARGE);
    post_flushed(&mut d, 2, second, 4096);
    send_large_and_wait_for_first_piece(&mut a, &gd, 1, d_region + first, 10);
    let source = c.layout().data_offset;
    send_dma_flushed(&mut c, gd.addr(1), 20, source, 4096);
    let got = recv_n(&mut d, &gd.waker, 2, T);
    let [Message::DmaData(m1), Message::DmaData(m2)] = got.as_slice() else {
        panic!("unexpected {got:?}")
    };
    assert_eq!((m1.cookie, m1.peer, m1.data.len), (1, ga.addr(1), LARGE));
    assert_eq!((m2.cookie, m2.peer, m2.data.len), (2, ga.addr(2), 4096));
    let mut out = vec![0u8; 4096];
    d.read_data(second, &mut out).unwrap();
    assert!(out == small);
    let done_a = recv_n(&mut a, &ga.waker, 1, T);
    assert_eq!(completion_of(&done_a), (10, CompletionStatus::Ok, LARGE));
    let done_c = recv_n(&mut c, &ga.waker, 1, T);
    assert_eq!(completion_of(&done_c), (20, CompletionStatus::Ok, 4096));
}

/// Sends a [`LARGE`] message from `a` to `dest` (which posted a buffer at guest address
/// `buffer`) and waits until its first bytes are there: the copy has begun.
fn send_large_and_wait_for_first_piece(
    a: &mut Channel,
    dest: &FakeGuest,
    endpoint: u32,
    buffer: u64,
    cookie: u64,
) {
    let source = a.layout().data_offset;
    send_dma_flushed(a, dest.addr(endpoint), cookie, source, LARGE);
    let deadline = Instant::now() + T;
    while dest.mem.read_obj::<u8>(GuestAddress(buffer)).unwrap() == 0 {
        assert!(Instant::now() < deadline, "the copy never began");
        std::hint::spin_loop();
    }
}

/// The destination is destroyed while a large message is copied into it: the sender gets
/// `DestinationGone`, nothing more is written into the destination's memory once the destroy
/// returned, and the sender's counters balance.
#[test]
fn a_destination_destroyed_mid_message_fails_it_and_is_not_written_after() {
    let engine = engine_with_budget(4096);
    let (mut ga, mut gd) = large_guests(&engine);
    let mut a = ga.open_with(1, 256, LARGE_REGION).unwrap();
    let data = pattern(5, LARGE);
    a.write_data(a.layout().data_offset, &data).unwrap();
    let region = gd.alloc(LARGE_REGION);
    for attempt in 0..10u64 {
        // A fresh destination each attempt, over the same (zeroed) memory.
        let (id, mut d) = gd.recreate_at(1, 256, region, LARGE_REGION);
        let buffer = region + post_at_start(&mut d, 9, LARGE);
        send_large_and_wait_for_first_piece(&mut a, &gd, 1, buffer, attempt);
        engine.destroy_channel(None, id).unwrap();
        let mut after_destroy = vec![0u8; LARGE_REGION as usize];
        gd.mem
            .read_slice(&mut after_destroy, GuestAddress(region))
            .unwrap();
        let (cookie, status, len) = completion_of(&recv_n(&mut a, &ga.waker, 1, T));
        assert_eq!(cookie, attempt);
        if status == CompletionStatus::Ok {
            // The whole copy ran before the destroy: try again.
            assert_eq!(len, LARGE);
            continue;
        }
        assert_eq!((status, len), (CompletionStatus::DestinationGone, 0));
        // Give a stray piece time to land, then compare.
        std::thread::sleep(Duration::from_millis(50));
        let mut now = vec![0u8; LARGE_REGION as usize];
        gd.mem.read_slice(&mut now, GuestAddress(region)).unwrap();
        assert!(now == after_destroy, "written after the destroy returned");
        let s = engine.channel_stats(ChannelId(a.id())).unwrap();
        assert_eq!(s.tx_taken, attempt + 1);
        assert_eq!(s.tx_delivered + s.tx_errors_total(), s.tx_taken);
        assert_eq!(s.errors(CompletionStatus::DestinationGone), 1);
        // The sender goes on: the next message behind it was not held up for good.
        let mut gd2 = FakeGuest::new(&engine, 3, 8);
        let mut other = gd2.open(1);
        assert!(a
            .send_user(gd2.addr(1), 77, b"next", Completions::OnError)
            .unwrap());
        a.flush().unwrap();
        let got = recv_n(&mut other, &gd2.waker, 1, T);
        assert!(matches!(got.as_slice(), [Message::UserData(u)] if u.cookie == 77));
        return;
    }
    panic!("the copy finished before the destroy in every attempt");
}

/// The sender is destroyed while its large message is copied: the destination's posted buffer,
/// reserved for that message, is given back and stays posted (it never got an RX message): the
/// next DMA-data message for the destination, from another sender, fills it.
#[test]
fn a_sender_destroyed_mid_message_gives_the_posted_buffer_back() {
    let engine = engine_with_budget(4096);
    let (mut ga, mut gd) = large_guests(&engine);
    let mut c = ga.open(2);
    let a_region = ga.alloc(LARGE_REGION);
    let (mut d, d_region) = gd.open_region(1, 256, LARGE_REGION).unwrap();
    let buffer = d.layout().data_offset;
    let data = pattern(11, LARGE);
    for attempt in 0..10u64 {
        // A fresh sender each attempt, over the same memory.
        let (id, mut a) = ga.recreate_at(1, 256, a_region, LARGE_REGION);
        a.write_data(a.layout().data_offset, &data).unwrap();
        gd.mem
            .write_slice(&vec![0u8; LARGE as usize], GuestAddress(d_region + buffer))
            .unwrap();
        post_at_start(&mut d, 40 + attempt, LARGE);
        send_large_and_wait_for_first_piece(&mut a, &gd, 1, d_region + buffer, attempt);
        engine.destroy_channel(None, id).unwrap();
        // The worker has let go of the sender: a message not delivered by now never will be.
        let early = poll_now(&mut d, 1);
        if !early.is_empty() {
            let [Message::DmaData(m)] = early.as_slice() else {
                panic!("unexpected {early:?}")
            };
            assert_eq!(m.cookie, 40 + attempt);
            continue;
        }
        let small = pattern(13, 4096);
        let source = c.layout().data_offset;
        c.write_data(source, &small).unwrap();
        send_dma_flushed(&mut c, gd.addr(1), 1, source, 4096);
        let got = recv_n(&mut d, &gd.waker, 1, T);
        let [Message::DmaData(m)] = got.as_slice() else {
            panic!("unexpected {got:?}")
        };
        assert_eq!(
            (m.cookie, m.data.offset, m.data.len),
            (40 + attempt, buffer, 4096)
        );
        let mut out = vec![0u8; 4096];
        d.read_data(m.data.offset, &mut out).unwrap();
        assert!(out == small);
        let done = recv_n(&mut c, &ga.waker, 1, T);
        assert_eq!(completion_of(&done), (1, CompletionStatus::Ok, 4096));
        return;
    }
    panic!("the copy finished before the destroy in every attempt");
}

/// A sender that never reads its RX ring, with completions waiting in its backlog, still gets
/// its large message through: the message holds the destination's head posted buffer, which
/// must not stay reserved while the backlog holds the sender's other messages back.
#[test]
fn a_large_copy_finishes_while_its_senders_completions_wait() {
    const RING: u32 = 16;
    let engine = engine_with_budget(64 << 10);
    let (mut ga, mut gd) = large_guests(&engine);
    let mut a = ga.open_with(1, RING, LARGE_REGION).unwrap();
    let mut d = gd.open_with(1, 256, LARGE_REGION).unwrap();
    let nowhere = gd.addr(99);
    let id = ChannelId(a.id());
    let taken = |n: u64| {
        wait_until(T, || {
            engine.channel_stats(id).is_some_and(|s| s.tx_taken >= n)
        });
    };
    // Error completions (no route) that A never reads: a full RX ring, then a backlog one
    // short of the ring's size.
    let mut sent = 0u64;
    for batch in [RING, RING - 1] {
        for _ in 0..batch {
            assert!(a
                .send_user(nowhere, sent, b"x", Completions::OnError)
                .unwrap());
            sent += 1;
        }
        a.flush().unwrap();
        taken(sent);
    }
    // One more failure and a large message in one batch: the pass that begins the copy fills
    // the backlog.
    let len = 1 << 20;
    let data = pattern(5, len);
    let src = a.layout().data_offset;
    a.write_data(src, &data).unwrap();
    let buf = post_at_start(&mut d, 700, len);
    assert!(a
        .send_user(nowhere, sent, b"x", Completions::OnError)
        .unwrap());
    assert!(a
        .send_dma(d.addr(), sent + 1, DataRef { offset: src, len })
        .unwrap());
    a.flush().unwrap();
    let got = recv_n(&mut d, &gd.waker, 1, T);
    let [Message::DmaData(m)] = got.as_slice() else {
        panic!("unexpected {got:?}")
    };
    assert_eq!((m.cookie, m.data.offset, m.data.len), (700, buf, len));
    let mut out = vec![0u8; len as usize];
    d.read_data(buf, &mut out).unwrap();
    assert!(out == data, "the large message's data differs");
}
