//! Attacks 7, 8 and 9 of issue 13: a guest that uses the control path and the engine as hard
//! as it can, to exhaust what is shared or to starve the others.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use svnic_channels::frame::{ControlOp, ControlRequest, CreateRequest, Frame, FrameBody};
use svnic_channels::{CompletionStatus, DataRef, MacAddr, Message};
use svnic_client::channel::WaitPolicy;
use svnic_host_frontend::host_guest::CreateState;
use svnic_host_frontend::HostGuest;
use svnic_tests::arena::{Arena, Bounds};
use svnic_tests::polite_pair::{test_frame, GUEST_MEMORY, LEG_TIMEOUT};

/// Attack 7: a guest sends create requests that are admitted and then fail (a region outside
/// its memory), as fast as it can. Neither the log nor the channel-id space may follow: the log
/// grows by far less than a line per request, and a polite guest's next channel id is not
/// pushed up by the failures.
#[test]
fn attack_07_failing_creates_neither_flood_the_log_nor_spend_the_id_space() {
    const CREATES: u32 = 10_000;
    let arena = Arena::start("hostile-a07", 0);
    let evil = HostGuest::connect(arena.socket("evil"), GUEST_MEMORY).unwrap();
    let before = arena.footprint();
    let log_before = arena.svnic.log_len();
    let me = evil.mac();
    for request_id in 0..CREATES {
        let frame = Frame {
            dst: MacAddr::ENGINE,
            src: me,
            body: FrameBody::ControlRequest(ControlRequest {
                request_id: request_id + 1_000_000,
                op: ControlOp::Create(CreateRequest {
                    mac: me,
                    endpoint: 100 + request_id % 1000,
                    ring_size: 256,
                    region_addr: 1 << 30,
                    region_len: 2 << 20,
                }),
            }),
        }
        .encode()
        .unwrap();
        let deadline = Instant::now() + LEG_TIMEOUT;
        while !evil.send_raw(&frame).unwrap() {
            assert!(
                Instant::now() < deadline,
                "the attacker's TX queue stayed full"
            );
            let _ = evil.poll_control();
        }
        if request_id % 64 == 0 {
            let _ = evil.poll_control();
        }
    }
    // Let the engine answer what it admitted.
    let settle = Instant::now() + Duration::from_secs(3);
    while Instant::now() < settle {
        let _ = evil.poll_control();
        std::thread::sleep(Duration::from_millis(20));
    }
    let logged = arena.svnic.log_len().saturating_sub(log_before);
    let polite = arena
        .pair
        .a
        .create_channel(9, 256, LEG_TIMEOUT)
        .unwrap_or_else(|e| {
            panic!(
                "A cannot create a channel after the attack: {e}\n{}",
                arena.log()
            )
        });
    eprintln!(
        "{CREATES} failing creates: {logged} bytes of log; A's next channel id {}",
        polite.id()
    );
    assert!(
        logged < 256 << 10,
        "{CREATES} failing creates wrote {logged} bytes of log\n{}",
        arena.log()
    );
    assert!(
        polite.id() < 1000,
        "after {CREATES} failing creates of another guest, A's new channel got id {}: the \
         failures spend the shared id space\n{}",
        polite.id(),
        arena.log()
    );
    drop(polite);
    arena.assert_unharmed(before, Bounds::default());
    drop(evil);
}

/// Attack 8: two guests flood broadcast frames; meanwhile B sleeps (no polling) waiting for
/// A's messages, and A creates a channel. The engine's wakes and control answers must get
/// through: every message is received long before B's wait would time out.
#[test]
fn attack_08_a_broadcast_flood_does_not_starve_wakes_or_control_answers() {
    const WAIT: Duration = Duration::from_secs(5);
    let mut arena = Arena::start("hostile-a08", 1);
    let before = arena.footprint();
    let stop = Arc::new(AtomicBool::new(false));
    let flooders: Vec<_> = ["evil", "evil2"]
        .into_iter()
        .map(|name| {
            let socket = arena.socket(name);
            let stop = stop.clone();
            std::thread::spawn(move || {
                let g = HostGuest::connect(&socket, GUEST_MEMORY).unwrap();
                let frame = test_frame(MacAddr::BROADCAST, g.mac(), 0);
                let mut sent = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    match g.send_raw(&frame) {
                        Ok(true) => sent += 1,
                        Ok(false) => {
                            let _ = g.poll_control();
                        }
                        Err(_) => break,
                    }
                }
                sent
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    arena.pair.cb.set_wait_policy(WaitPolicy {
        spins: 0,
        yields: 0,
    });
    let mut slow = Vec::new();
    for n in 0..20u64 {
        let cookie = 5_000 + n;
        arena.pair.send_a_to_b(cookie).unwrap();
        let t0 = Instant::now();
        let waiter = arena.pair.b.waiter(&arena.pair.cb);
        let mut got = false;
        while !got && t0.elapsed() < WAIT {
            let mut out = Vec::new();
            let _ =
                arena
                    .pair
                    .cb
                    .wait_poll(&mut out, 8, WAIT.saturating_sub(t0.elapsed()), &waiter);
            got = out
                .iter()
                .any(|m| matches!(m, Message::UserData(u) if u.cookie == cookie));
        }
        let took = t0.elapsed();
        if !got || took > Duration::from_secs(2) {
            slow.push((n, took, got));
        }
    }
    let created = arena.pair.a.create_channel(9, 256, WAIT);
    stop.store(true, Ordering::Relaxed);
    let sent: Vec<u64> = flooders
        .into_iter()
        .map(|t| t.join().unwrap_or(0))
        .collect();
    eprintln!("flood: {sent:?} broadcast frames; slow receptions: {slow:?}");
    assert!(
        slow.is_empty(),
        "B, sleeping, got these of A's messages late or never (n, waited, received): {slow:?}\n{}",
        arena.log()
    );
    assert!(
        created.is_ok(),
        "A's create during the flood: {:?}\n{}",
        created.err(),
        arena.log()
    );
    arena.pair.cb.set_wait_policy(WaitPolicy::default());
    arena.assert_unharmed(before, Bounds::default());
}

/// Attack 9: a guest keeps the (single) engine worker copying 32 DMA-data messages of 32 MiB at
/// a time between two of its channels. The pair, served by the same worker, must not wait for
/// whole gigabyte passes: its median round trip stays far below one such pass.
#[test]
fn attack_09_huge_dma_messages_do_not_stall_other_channels() {
    const LEN: u32 = 32 << 20;
    const REGION: u64 = 34 << 20;
    const BATCH: u64 = 32;
    let mut arena = Arena::start("hostile-a09", 0);
    let evil = HostGuest::connect(arena.socket("evil"), 96 << 20).unwrap();
    let open = |endpoint| match evil
        .begin_create(endpoint, 256, REGION)
        .unwrap()
        .wait(LEG_TIMEOUT)
    {
        Ok(CreateState::Success(ch)) => ch,
        other => panic!("attacker's channel: {other:?}"),
    };
    let (mut src, mut dst) = (open(1), open(2));
    let stop = Arc::new(AtomicBool::new(false));
    let (first_pass, first_pass_done) = mpsc::channel();
    let streamer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (s_data, d_data) = (src.layout().data_offset, dst.layout().data_offset);
            let to = dst.addr();
            let (ws, wd) = (evil.waiter(&src), evil.waiter(&dst));
            // Two batches in flight: the worker always has a batch queued behind the one it
            // copies, as a guest streaming at full speed would keep it.
            let (mut in_flight, mut copies) = (0u64, 0u64);
            let (mut got, mut done) = (Vec::new(), Vec::new());
            let deadline = Instant::now() + Duration::from_secs(120);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                while in_flight < 2 * BATCH {
                    let posted = DataRef {
                        offset: d_data,
                        len: LEN,
                    };
                    let sent = DataRef {
                        offset: s_data,
                        len: LEN,
                    };
                    if !dst.post_buffer(in_flight, posted).unwrap_or(false)
                        || !src.send_dma(to, in_flight, sent).unwrap_or(false)
                    {
                        break;
                    }
                    in_flight += 1;
                }
                dst.flush().unwrap_or_default();
                src.flush().unwrap_or_default();
                got.clear();
                done.clear();
                let _ = dst.wait_poll(&mut got, 256, Duration::from_millis(20), &wd);
                let _ = src.wait_poll(&mut done, 256, Duration::from_millis(20), &ws);
                in_flight = in_flight.saturating_sub(done.len() as u64);
                let copied = done
                    .iter()
                    .filter(
                        |m| matches!(m, Message::Completion(c) if c.status == CompletionStatus::Ok),
                    )
                    .count() as u64;
                copies += copied;
                if copies >= BATCH && copies - copied < BATCH {
                    let _ = first_pass.send(());
                }
            }
            let passes = copies / BATCH;
            (evil, passes)
        })
    };
    first_pass_done
        .recv_timeout(Duration::from_secs(120))
        .expect("the attacker's first batch of copies did not complete");
    // Measured now: the attacker's memory, touched by the copies, counts as the daemon's RSS.
    let before = arena.footprint();
    let mut rtts: Vec<Duration> = (0..21)
        .map(|_| arena.pair.user_round_trip().unwrap())
        .collect();
    stop.store(true, Ordering::Relaxed);
    let (evil, passes) = streamer.join().unwrap();
    rtts.sort();
    let median = rtts[rtts.len() / 2];
    eprintln!("{passes} passes of {BATCH} x 32 MiB; pair round trips {rtts:?}");
    assert!(
        median < Duration::from_millis(40),
        "the pair's median round trip was {median:?} while another guest streamed 32 MiB \
         DMA-data messages (all: {rtts:?})\n{}",
        arena.log()
    );
    arena.assert_unharmed(before, Bounds::default());
    drop(evil);
}
