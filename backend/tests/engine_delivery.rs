//! Delivery between channels of different guests, and every error completion, end to end through
//! the engine's workers with the real client library.
#![allow(clippy::unwrap_used)]

use std::time::Duration;
use svnic_client::Completions;

use svnic_backend::{Engine, EngineConfig};
use svnic_channels::{ChannelId, CompletionStatus, DataRef, Message};
use svnic_tests::fake_guest::*;

const T: Duration = Duration::from_secs(10);

fn completions(msgs: &[Message]) -> Vec<(u64, CompletionStatus, u32)> {
    msgs.iter()
        .filter_map(|m| match m {
            Message::Completion(c) => Some((c.cookie, c.status, c.len)),
            _ => None,
        })
        .collect()
}

#[test]
fn user_data_arrives_intact_and_in_order_across_guests() {
    let engine = engine(2);
    let (mut ga, mut gb) = two_guests(&engine, 8);
    let mut a = ga.open(10);
    let mut b = gb.open(20);
    let n = 20_000u64;
    let mut got = Vec::new();
    let mut sent = 0u64;
    while (got.len() as u64) < n {
        while sent < n
            && a.send_user(
                gb.addr(20),
                sent,
                &sent.to_le_bytes().repeat(5),
                Completions::OnError,
            )
            .unwrap()
        {
            sent += 1;
        }
        a.flush().unwrap();
        b.poll(&mut got, 256).unwrap();
    }
    for (i, m) in got.iter().enumerate() {
        let Message::UserData(u) = m else {
            panic!("unexpected {m:?}")
        };
        assert_eq!(u.cookie, i as u64, "order");
        assert_eq!(
            u.data(),
            (i as u64).to_le_bytes().repeat(5).as_slice(),
            "payload"
        );
        assert_eq!(
            u.peer,
            ga.addr(10),
            "source address is the sender's channel"
        );
        assert_ne!(u.flags & svnic_channels::message::FLAG_COMPLETE, 0);
    }
    // No completions for successful user-data unless asked for.
    let mut rest = Vec::new();
    a.poll(&mut rest, 1000).unwrap();
    assert!(rest.is_empty(), "{rest:?}");
    let s = engine.channel_stats(ChannelId(a.id())).unwrap();
    assert_eq!((s.tx_taken, s.tx_delivered), (n, n));
}

#[test]
fn want_completion_gives_ok_completions_for_user_data() {
    let engine = engine(1);
    let (ga, gb, mut a, mut b) = guest_pair(&engine);
    for i in 0..10 {
        assert!(a
            .send_user(gb.addr(2), 100 + i, b"x", Completions::Always)
            .unwrap());
    }
    a.flush().unwrap();
    assert_eq!(recv_n(&mut b, &gb.waker, 10, T).len(), 10);
    let c = completions(&recv_n(&mut a, &ga.waker, 10, T));
    assert_eq!(
        c,
        (0..10)
            .map(|i| (100 + i, CompletionStatus::Ok, 0))
            .collect::<Vec<_>>()
    );
}

/// The distinct payload of the `i`th DMA message, `len` bytes.
fn dma_pattern(i: usize, len: u32) -> Vec<u8> {
    (0..len)
        .map(|j| (j as u8).wrapping_mul(7).wrapping_add(i as u8))
        .collect()
}

#[test]
fn dma_data_is_copied_once_intact_and_completed() {
    let engine = engine(2);
    let (ga, gb, mut a, mut b) = guest_pair(&engine);
    let data_a = a.layout().data_offset;
    let data_b = b.layout().data_offset;
    let sizes = [1u32, 63, 64, 65, 1000, 4096, 65536, 200_000];
    // B posts as many 256 KiB buffers as its data area holds; A fills distinct patterns.
    let posted = sizes
        .len()
        .min((b.layout().data_len() / (256 << 10)) as usize);
    for i in 0..posted {
        assert!(b
            .post_buffer(
                1000 + i as u64,
                DataRef {
                    offset: data_b + i as u64 * (256 << 10),
                    len: 256 << 10
                }
            )
            .unwrap());
    }
    b.flush().unwrap();
    let mut off = data_a;
    for (i, &len) in sizes.iter().enumerate() {
        a.write_data(off, &dma_pattern(i, len)).unwrap();
        assert!(a
            .send_dma(gb.addr(2), 500 + i as u64, DataRef { offset: off, len })
            .unwrap());
        off += u64::from(len);
    }
    a.flush().unwrap();
    // Only as many messages as B had room to post buffers for (its data area is ~1.95 MiB).
    let got = recv_n(&mut b, &gb.waker, posted, T);
    assert_eq!(got.len(), posted);
    for (i, m) in got.iter().enumerate() {
        let Message::DmaData(d) = m else {
            panic!("unexpected {m:?}")
        };
        assert!(d.is_complete(), "COMPLETE flag set");
        assert_eq!(d.cookie, 1000 + i as u64, "posted buffer's cookie");
        assert_eq!(d.data.len, sizes[i]);
        assert_eq!(d.peer, ga.addr(1));
        let mut buf = vec![0u8; d.data.len as usize];
        b.read_data(d.data.offset, &mut buf).unwrap();
        assert!(
            buf == dma_pattern(i, sizes[i]),
            "payload of message {i} intact"
        );
    }
    let c = completions(&recv_n(&mut a, &ga.waker, posted, T));
    let expect: Vec<_> = (0..posted)
        .map(|i| (500 + i as u64, CompletionStatus::Ok, sizes[i]))
        .collect();
    assert_eq!(c, expect);
}

/// Builds an engine with a short backpressure wait for the error-path tests.
fn quick_engine() -> Engine {
    engine_with_wait(1, Duration::from_millis(50))
}

fn one_completion(
    a: &mut svnic_client::Channel,
    waker: &EventWaker,
) -> (u64, CompletionStatus, u32) {
    let got = completions(&recv_n(a, waker, 1, T));
    assert_eq!(got.len(), 1, "exactly one completion");
    got[0]
}

/// Asserts that `a`'s next messages hold exactly one completion, and that it is `expected`.
#[track_caller]
fn assert_one_completion(
    a: &mut svnic_client::Channel,
    waker: &EventWaker,
    expected: (u64, CompletionStatus, u32),
) {
    assert_eq!(one_completion(a, waker), expected);
}

/// Sends one user-data message from `a` to `to` and asserts that its one completion is an
/// error with `status`.
#[track_caller]
fn send_expecting_error(
    a: &mut svnic_client::Channel,
    waker: &EventWaker,
    to: svnic_channels::ChannelAddr,
    cookie: u64,
    status: CompletionStatus,
) {
    a.send_user(to, cookie, b"x", Completions::OnError).unwrap();
    a.flush().unwrap();
    assert_one_completion(a, waker, (cookie, status, 0));
}

#[test]
fn no_route_is_an_error_completion() {
    let engine = quick_engine();
    let mut ga = FakeGuest::new(&engine, 1, 8);
    let gb = FakeGuest::new(&engine, 2, 8);
    let mut a = ga.open(1);
    send_expecting_error(&mut a, &ga.waker, gb.addr(99), 7, CompletionStatus::NoRoute);
}

#[test]
fn address_outside_the_data_area_is_an_error_completion() {
    let engine = quick_engine();
    let (ga, gb, mut a, _b) = guest_pair(&engine);
    // The client library refuses such a buffer itself; write the message raw, as a hostile
    // guest would, pointing at the channel's own rings.
    support_raw::push_raw_dma(&mut a, gb.addr(2), 8, 0x1000, 64);
    assert_one_completion(
        &mut a,
        &ga.waker,
        (8, CompletionStatus::AddressOutOfRange, 0),
    );
}

#[test]
fn malformed_message_is_an_error_completion() {
    let engine = quick_engine();
    let mut ga = FakeGuest::new(&engine, 1, 8);
    let mut a = ga.open(1);
    let mut raw = [0u8; 64];
    raw[0] = 0x77; // unknown kind
    raw[16..24].copy_from_slice(&42u64.to_le_bytes());
    support_raw::push_raw(&mut a, raw);
    assert_one_completion(&mut a, &ga.waker, (42, CompletionStatus::BadMessage, 0));
}

#[test]
fn no_posted_buffer_within_the_wait_is_an_error_completion() {
    let engine = quick_engine();
    let (ga, gb, mut a, _b) = guest_pair(&engine);
    let off = a.layout().data_offset;
    send_dma_flushed(&mut a, gb.addr(2), 9, off, 100);
    assert_one_completion(&mut a, &ga.waker, (9, CompletionStatus::NoBuffer, 0));
}

#[test]
fn posted_buffer_too_small_is_an_error_completion_and_stays_posted() {
    let engine = quick_engine();
    let (ga, gb, mut a, mut b) = guest_pair(&engine);
    let (da, db) = (a.layout().data_offset, b.layout().data_offset);
    post_flushed(&mut b, 77, db, 10);
    send_dma_flushed(&mut a, gb.addr(2), 10, da, 100);
    assert_one_completion(&mut a, &ga.waker, (10, CompletionStatus::BufferTooSmall, 0));
    // The small buffer is still there for a message that fits.
    a.write_data(da, b"0123456789").unwrap();
    send_dma_flushed(&mut a, gb.addr(2), 11, da, 10);
    let got = recv_n(&mut b, &gb.waker, 1, T);
    assert!(matches!(got[0], Message::DmaData(d) if d.cookie == 77 && d.data.len == 10));
    assert_one_completion(&mut a, &ga.waker, (11, CompletionStatus::Ok, 10));
}

#[test]
fn refused_posted_buffer_is_reported_to_its_owner_and_skipped() {
    let engine = quick_engine();
    let (ga, gb, mut a, mut b) = guest_pair(&engine);
    let (da, db) = (a.layout().data_offset, b.layout().data_offset);
    // A post pointing at the rings (outside the data area), then a good one.
    support_raw::push_raw_post(&mut b, 66, 0x1000, 4096);
    support_raw::push_raw_post(&mut b, 67, db, 4096);
    send_dma_flushed(&mut a, gb.addr(2), 12, da, 16);
    let got = recv_n(&mut b, &gb.waker, 2, T);
    assert_eq!(
        completions(&got),
        vec![(66, CompletionStatus::BadPostBuffer, 0)]
    );
    assert!(got
        .iter()
        .any(|m| matches!(m, Message::DmaData(d) if d.cookie == 67)));
    assert_one_completion(&mut a, &ga.waker, (12, CompletionStatus::Ok, 16));
}

#[test]
fn full_ring_applies_backpressure_then_delivers() {
    // Wait long enough for the receiver to catch up: nothing is lost, nothing errors.
    let engine = engine_with_wait(1, Duration::from_secs(5));
    let (mut ga, mut gb) = two_guests(&engine, 8);
    let mut a = ga.open_with(1, 16, 1 << 20).unwrap();
    let mut b = gb.open_with(2, 16, 1 << 20).unwrap();
    let n = 200u64;
    let mut sent = 0;
    let mut got = Vec::new();
    // Send as fast as the TX ring allows, receive slowly (4 per 2 ms): the RX ring (16) is far
    // smaller than what is sent, so the engine must hold messages until room appears.
    while (got.len() as u64) < n {
        send_user_while_room(&mut a, gb.addr(2), &mut sent, n, b"bp");
        std::thread::sleep(Duration::from_millis(2));
        b.poll(&mut got, 4).unwrap();
    }
    let cookies: Vec<u64> = got.iter().map(|m| m.cookie()).collect();
    assert_eq!(cookies, (0..n).collect::<Vec<_>>());
    let mut errs = Vec::new();
    a.poll(&mut errs, 100).unwrap();
    assert!(errs.is_empty(), "no error completions: {errs:?}");
    let s = engine.channel_stats(ChannelId(a.id())).unwrap();
    assert!(
        s.backpressure_holds > 0,
        "the sender was held at least once"
    );
}

#[test]
fn full_ring_for_the_whole_wait_is_an_error_completion() {
    let engine = quick_engine();
    let (mut ga, mut gb) = two_guests(&engine, 8);
    let mut a = ga.open_with(1, 64, 1 << 20).unwrap();
    let _b = gb.open_with(2, 16, 1 << 20).unwrap(); // never polled
    for i in 0..20 {
        a.send_user(gb.addr(2), i, b"x", Completions::OnError)
            .unwrap();
    }
    a.flush().unwrap();
    let c = completions(&recv_n(&mut a, &ga.waker, 4, T));
    assert_eq!(
        c,
        (16..20)
            .map(|i| (i, CompletionStatus::RingFull, 0))
            .collect::<Vec<_>>()
    );
    let s = engine.channel_stats(ChannelId(a.id())).unwrap();
    assert_eq!(
        (
            s.tx_taken,
            s.tx_delivered,
            s.errors(CompletionStatus::RingFull)
        ),
        (20, 16, 4)
    );
}

#[test]
fn destination_destroyed_while_held_is_destination_gone() {
    let engine = engine_with_wait(1, Duration::from_secs(30));
    let (ga, gb, mut a, b) = guest_pair(&engine);
    // No buffer posted: the DMA message waits (30 s) ...
    send_dma_held(&engine, &mut a, gb.addr(2), 13);
    // ... until its destination is destroyed.
    engine
        .destroy_channel(Some(gb.id), ChannelId(b.id()))
        .unwrap();
    assert_one_completion(
        &mut a,
        &ga.waker,
        (13, CompletionStatus::DestinationGone, 0),
    );
    // Later sends to it have no route.
    send_expecting_error(&mut a, &ga.waker, gb.addr(2), 14, CompletionStatus::NoRoute);
}

#[test]
fn faulted_destination_is_an_error_completion() {
    let engine = quick_engine();
    let (ga, gb, mut a, b) = guest_pair(&engine);
    // B scribbles an impossible TX index: its worker faults it.
    support_raw::scribble(&b, svnic_channels::layout::header::TX_HEAD, 100_000);
    wait_until(T, || {
        engine.run_state(ChannelId(b.id())) == Some(svnic_backend::RunState::Faulted)
    });
    assert!(b.fault().is_some(), "fault recorded in the header");
    send_expecting_error(
        &mut a,
        &ga.waker,
        gb.addr(2),
        15,
        CompletionStatus::DestinationFaulted,
    );
}

mod support_raw {
    //! Raw ring writes, as a hostile or buggy guest would do them.
    use svnic_channels::{
        ChannelAddr, ChannelMem, DataRef, DmaData, Message, PostBuffer, RawMessage,
    };
    use vm_memory::Bytes;

    fn mem(
        ch: &svnic_client::Channel,
    ) -> (svnic_channels::SharedRegion, svnic_channels::ChannelLayout) {
        (ch.region().clone(), *ch.layout())
    }

    /// Writes a u32 into the channel header at `off`.
    pub fn scribble(ch: &svnic_client::Channel, off: usize, value: u32) {
        let (r, _) = mem(ch);
        r.slice().write_obj(value, off).unwrap();
    }

    fn push_ring(ring_off: usize, head_off: usize, ch: &svnic_client::Channel, raw: RawMessage) {
        let (r, l) = mem(ch);
        let m = ChannelMem::new(r.slice(), l).unwrap();
        let s = m.slice();
        let head: u32 = s.read_obj(head_off).unwrap();
        let slot = ring_off + (head & (l.ring_size - 1)) as usize * 64;
        s.write_obj(raw, slot).unwrap();
        s.store(
            head.wrapping_add(1),
            head_off,
            std::sync::atomic::Ordering::Release,
        )
        .unwrap();
    }

    /// Pushes raw bytes into the TX ring behind the client's back (the client's own queue must
    /// be flushed and empty). Rings the doorbell through a flush.
    pub fn push_raw(ch: &mut svnic_client::Channel, bytes: [u8; 64]) {
        ch.flush().unwrap();
        let l = *ch.layout();
        push_ring(
            l.tx_ring,
            svnic_channels::layout::header::TX_HEAD,
            ch,
            RawMessage(bytes),
        );
    }

    pub fn push_raw_dma(
        ch: &mut svnic_client::Channel,
        dest: ChannelAddr,
        cookie: u64,
        offset: u64,
        len: u32,
    ) {
        let m = Message::DmaData(DmaData {
            peer: dest,
            flags: 0,
            cookie,
            data: DataRef { offset, len },
        });
        push_raw(ch, m.encode().0);
    }

    pub fn push_raw_post(ch: &mut svnic_client::Channel, cookie: u64, offset: u64, len: u32) {
        ch.flush().unwrap();
        let l = *ch.layout();
        let m = Message::PostBuffer(PostBuffer {
            cookie,
            buf: DataRef { offset, len },
        });
        push_ring(
            l.post_ring,
            svnic_channels::layout::header::POST_HEAD,
            ch,
            m.encode(),
        );
    }
}

#[test]
fn a_channel_is_reachable_as_soon_as_its_creation_succeeds() {
    // The worker loads a routing snapshot per pass; a channel created during a pass is bound in
    // a newer one. Its peer may send the moment creation returns, and must never get NoRoute.
    // A busy channel keeps the worker in passes all the time, so many creations land mid-pass.
    let engine = engine(1);
    let mut ga = FakeGuest::new(&engine, 1, 16);
    let mut gb = FakeGuest::new(&engine, 2, 200);
    let mut busy = ga.open(1);
    let mut sink = gb.open(1);
    let sink_addr = sink.addr();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let streamer = std::thread::spawn(move || {
        let mut out = Vec::new();
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            while busy
                .send_user(sink_addr, 0, b"busy", Completions::OnError)
                .unwrap()
            {}
            busy.flush().unwrap();
            out.clear();
            sink.poll(&mut out, 256).unwrap();
            busy.poll(&mut out, 256).unwrap();
        }
    });
    let mut a = ga.open(2);
    for k in 0..60u32 {
        let b = gb.open(100 + k);
        a.send_user(b.addr(), u64::from(k), b"hello", Completions::Always)
            .unwrap();
        a.flush().unwrap();
        assert_eq!(
            one_completion(&mut a, &ga.waker),
            (u64::from(k), CompletionStatus::Ok, 0),
            "message to channel {k}, sent as soon as it was created"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    streamer.join().unwrap();
}

/// A doorbell that rings nothing: the engine only learns of what these channels publish when
/// the test rings it.
struct MutedDoorbell;

impl svnic_client::Doorbell for MutedDoorbell {
    fn ring(&self, _channel_id: u32) {}
}

/// A channel of `g` (4096-slot rings) whose client never rings the engine's doorbell, and the
/// guest address of its region.
fn open_muted(g: &mut FakeGuest, endpoint: u32) -> (svnic_client::Channel, u64) {
    let len = svnic_channels::layout::DEFAULT_REGION_LEN;
    g.open_with_doorbell(endpoint, 4096, len, std::sync::Arc::new(MutedDoorbell))
        .unwrap()
}

/// Waits until the (only) worker blocks on its doorbell: it advertises sleeping in the header of
/// the channel at `region` of `g` and stays asleep (flag set, no new sleep counted) for 20 ms.
fn wait_worker_asleep(engine: &Engine, g: &FakeGuest, region: u64) {
    use vm_memory::{Bytes, GuestAddress};
    let flag = GuestAddress(region + svnic_channels::layout::header::ENGINE_SLEEPING as u64);
    let asleep = || g.mem.read_obj::<u32>(flag).unwrap() != 0;
    wait_until(T, || {
        if !asleep() {
            return false;
        }
        let sleeps = engine.worker_stats()[0].counts.sleeps;
        std::thread::sleep(Duration::from_millis(20));
        asleep() && engine.worker_stats()[0].counts.sleeps == sleeps
    });
}

/// A worker takes at most `poll_budget` messages from one channel per pass: another channel of
/// the same worker is served in between, so a busy sender cannot starve it. The worker is made
/// to sleep, both senders publish (the busy one a long burst first), and only then is the worker
/// woken: the quiet channel's message must come after at most one budget of the busy one's.
#[test]
fn a_busy_sender_cannot_starve_another_channel_of_its_worker() {
    const BUDGET: u32 = 4;
    const BURST: u64 = 2048;
    let engine = Engine::new(EngineConfig {
        workers: 1,
        poll_budget: BUDGET,
        spin_passes: 1,
        idle_passes: 2,
        max_sleep: Duration::from_secs(60),
        ..Default::default()
    })
    .unwrap();
    let (mut ga, mut gb) = two_guests(&engine, 8);
    // Created first, so served first in a pass.
    let (mut busy, busy_region) = open_muted(&mut ga, 10);
    let (mut quiet, _) = open_muted(&mut ga, 11);
    let (mut rx, _) = open_muted(&mut gb, 20);
    let dest = gb.addr(20);
    for round in 0..3u64 {
        wait_worker_asleep(&engine, &ga, busy_region);
        for i in 0..BURST {
            assert!(busy.send_user(dest, i, b"b", Completions::OnError).unwrap());
        }
        busy.flush().unwrap();
        let marker = u64::MAX - round;
        assert!(quiet
            .send_user(dest, marker, b"q", Completions::OnError)
            .unwrap());
        quiet.flush().unwrap();
        engine.doorbell(svnic_channels::ChannelId(busy.id()));
        let got = recv_n(&mut rx, &gb.waker, BURST as usize + 1, T);
        assert_eq!(got.len() as u64, BURST + 1);
        let at = got
            .iter()
            .position(|m| matches!(m, Message::UserData(u) if u.cookie == marker))
            .unwrap();
        assert!(
            at <= BUDGET as usize,
            "round {round}: the quiet channel's message came after {at} of the busy one's \
             (budget {BUDGET})"
        );
    }
}
