//! The engine under load and under abuse: many channels on two workers with exact accounting,
//! faults that stay local, destroy under traffic, and sleep/wake transitions with no lost wakeup.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};
use svnic_client::Completions;

use svnic_backend::{Engine, EngineConfig, RunState};
use svnic_channels::layout::header;
use svnic_channels::{ChannelId, CompletionStatus, Message};
use svnic_tests::fake_guest::*;
use vm_memory::Bytes;

const T: Duration = Duration::from_secs(30);

#[test]
fn two_workers_64_channels_many_messages_counters_balance_exactly() {
    let engine = engine(2);
    // 4 guests x 16 channels; channel i of guest g sends to channel i of guest (g+1) % 4.
    let mut guests: Vec<FakeGuest> = (0..4).map(|g| FakeGuest::new(&engine, g + 1, 40)).collect();
    let mut chans = Vec::new();
    for (g, guest) in guests.iter_mut().enumerate() {
        for i in 0..16u32 {
            let ch = guest.open_with(i, 64, 1 << 20).unwrap();
            chans.push((g, i, ch));
        }
    }
    let dests: Vec<_> = chans
        .iter()
        .map(|(g, i, _)| guests[(g + 1) % 4].addr(*i))
        .collect();
    let per_channel = 3_000u64;
    let mut sent = vec![0u64; chans.len()];
    let mut received = vec![Vec::<u64>::new(); chans.len()];
    let mut buf = Vec::new();
    let deadline = Instant::now() + T;
    loop {
        let mut all = true;
        for (k, (_, _, ch)) in chans.iter_mut().enumerate() {
            while sent[k] < per_channel
                && ch
                    .send_user(
                        dests[k],
                        sent[k],
                        &(k as u64).to_le_bytes(),
                        Completions::OnError,
                    )
                    .unwrap()
            {
                sent[k] += 1;
            }
            ch.flush().unwrap();
            buf.clear();
            ch.poll(&mut buf, 256).unwrap();
            for m in &buf {
                let Message::UserData(u) = m else {
                    panic!("unexpected {m:?}")
                };
                received[k].push(u.cookie);
            }
            all &= received[k].len() as u64 == per_channel;
        }
        if all {
            break;
        }
        assert!(Instant::now() < deadline, "traffic did not complete");
    }
    // Every receiver got 0..per_channel in order from its single sender.
    for r in &received {
        assert_eq!(*r, (0..per_channel).collect::<Vec<_>>());
    }
    // Counters balance exactly, per channel and in total.
    let mut taken = 0;
    let mut rx = 0;
    for (_, _, ch) in &chans {
        let s = engine.channel_stats(ChannelId(ch.id())).unwrap();
        assert_eq!(s.tx_taken, per_channel);
        assert_eq!(s.tx_delivered + s.tx_errors_total(), s.tx_taken);
        assert_eq!(s.tx_errors_total(), 0);
        assert_eq!(s.rx_messages, per_channel);
        taken += s.tx_taken;
        rx += s.rx_messages;
    }
    assert_eq!(taken, 64 * per_channel);
    assert_eq!(rx, taken);
    // Both workers served channels and processed messages.
    let w = engine.worker_stats();
    assert_eq!(w.len(), 2);
    assert_eq!(w.iter().map(|w| w.counts.channels).sum::<u64>(), 64);
    assert!(w.iter().all(|w| w.counts.messages > 0), "{w:?}");
    assert_eq!(w.iter().map(|w| w.counts.messages).sum::<u64>(), taken);
}

#[test]
fn a_faulted_channel_does_not_disturb_the_others() {
    let engine = engine(1);
    let mut ga = FakeGuest::new(&engine, 1, 8);
    let mut gb = FakeGuest::new(&engine, 2, 8);
    let mut gc = FakeGuest::new(&engine, 3, 8);
    let mut a = ga.open(1);
    let mut b = gb.open(2);
    let bad = gc.open(3);
    let n = 5_000u64;
    let mut sent = 0;
    let mut got = Vec::new();
    let mut faulted = false;
    while (got.len() as u64) < n {
        send_user_while_room(&mut a, gb.addr(2), &mut sent, n, b"ok");
        if sent > n / 2 && !faulted {
            // Guest C writes a TX producer index 1000 slots ahead, and garbage posts.
            bad.region()
                .slice()
                .write_obj(1000u32, header::TX_HEAD)
                .unwrap();
            engine.doorbell(ChannelId(bad.id()));
            faulted = true;
        }
        b.poll(&mut got, 256).unwrap();
    }
    assert_eq!(
        got.iter().map(|m| m.cookie()).collect::<Vec<_>>(),
        (0..n).collect::<Vec<_>>()
    );
    wait_until(T, || {
        engine.run_state(ChannelId(bad.id())) == Some(RunState::Faulted)
    });
    assert_eq!(
        bad.fault(),
        Some(svnic_client::channel::Fault::Reason(
            svnic_channels::FaultReason::TxIndex
        ))
    );
    assert_eq!(engine.worker_stats()[0].counts.faults, 1);
    // The worker goes on serving: a fresh round trip works.
    a.send_user(gb.addr(2), 99, b"after", Completions::OnError)
        .unwrap();
    a.flush().unwrap();
    assert_eq!(recv_n(&mut b, &gb.waker, 1, T)[0].cookie(), 99);
    // The faulted channel can be destroyed, freeing its endpoint for a new channel.
    engine
        .destroy_channel(Some(gc.id), ChannelId(bad.id()))
        .unwrap();
    let _again = gc.open(3);
}

#[test]
fn destroy_while_traffic_flows_accounts_for_every_message() {
    let engine = engine_with_wait(2, Duration::from_millis(20));
    let (ga, gb, mut a, mut b) = guest_pair(&engine);
    let b_id = ChannelId(b.id());
    let n = 20_000u64;
    let mut sent = 0;
    let mut received = 0u64;
    let mut completions = Vec::new();
    let mut buf = Vec::new();
    let mut destroyed = false;
    while sent < n {
        send_user_while_room(&mut a, gb.addr(2), &mut sent, n, b"d");
        if !destroyed {
            buf.clear();
            received += b.poll(&mut buf, 256).unwrap() as u64;
            if sent > n / 3 {
                engine.destroy_channel(Some(gb.id), b_id).unwrap();
                destroyed = true;
            }
        }
        a.poll(&mut completions, 1024).unwrap();
    }
    // Wait until the engine has taken everything, then collect the last completions.
    wait_until(T, || {
        engine.channel_stats(ChannelId(a.id())).unwrap().tx_taken == n
    });
    let s = engine.channel_stats(ChannelId(a.id())).unwrap();
    let errors = s.tx_errors_total();
    while (completions.len() as u64) < errors {
        a.wait_poll(
            &mut completions,
            1024,
            Duration::from_millis(100),
            &*ga.waker,
        )
        .unwrap();
        assert!(completions.len() as u64 <= errors);
    }
    assert_eq!(
        s.tx_delivered + errors,
        n,
        "every message delivered or error-completed"
    );
    assert!(errors > 0 && s.tx_delivered > 0);
    assert_completions_among(
        &completions,
        &[CompletionStatus::NoRoute, CompletionStatus::DestinationGone],
    );
    // B saw a prefix of what was delivered before the destroy (it stopped polling then).
    assert!(received <= s.tx_delivered);
    assert_eq!(
        engine.run_state(b_id),
        None,
        "destroyed channels are forgotten by the engine"
    );
}

#[test]
fn no_wakeup_is_lost_across_many_sleep_wake_transitions() {
    // Workers go to sleep after a handful of idle passes and would sleep 60 s without a doorbell;
    // clients block on their waker for up to 60 s. A single lost doorbell or wake stalls a round
    // far beyond the per-round limit asserted below.
    let engine = Engine::new(EngineConfig {
        workers: 1,
        spin_passes: 2,
        idle_passes: 4,
        max_sleep: Duration::from_secs(60),
        ..Default::default()
    })
    .unwrap();
    let (ga, gb, mut a, mut b) = guest_pair(&engine);
    // Clients sleep as soon as nothing is there: every round is a sleep/wake transition.
    let eager = svnic_client::WaitPolicy {
        spins: 0,
        yields: 0,
    };
    a.set_wait_policy(eager);
    b.set_wait_policy(eager);
    let a_addr = ga.addr(1);
    let b_addr = gb.addr(2);
    let rounds = 1_500u64;
    let gb_waker = gb.waker.clone();
    let echo = std::thread::spawn(move || {
        let mut b = b;
        let mut buf = Vec::new();
        for i in 0..rounds {
            buf.clear();
            let n = b
                .wait_poll(&mut buf, 1, Duration::from_secs(60), &*gb_waker)
                .unwrap();
            assert_eq!(n, 1, "echo side: round {i} timed out");
            assert_eq!(buf[0].cookie(), i);
            assert!(b
                .send_user(a_addr, i, b"pong", Completions::OnError)
                .unwrap());
            b.flush().unwrap();
        }
        b.stats()
    });
    let mut buf = Vec::new();
    let mut worst = Duration::ZERO;
    for i in 0..rounds {
        // Every few rounds, pause long enough for the worker and the echo side to fall asleep.
        if i % 3 == 0 {
            std::thread::sleep(Duration::from_micros(300));
        }
        let t0 = Instant::now();
        assert!(a
            .send_user(b_addr, i, b"ping", Completions::OnError)
            .unwrap());
        a.flush().unwrap();
        buf.clear();
        let n = a
            .wait_poll(&mut buf, 1, Duration::from_secs(60), &*ga.waker)
            .unwrap();
        assert_eq!(n, 1, "round {i} timed out");
        assert_eq!(buf[0].cookie(), i);
        worst = worst.max(t0.elapsed());
    }
    let b_stats = echo.join().unwrap();
    let w = &engine.worker_stats()[0];
    // The test did exercise sleeping on both sides many times.
    assert!(
        w.counts.sleeps > 100,
        "worker slept only {} times",
        w.counts.sleeps
    );
    assert!(
        a.stats().sleeps + b_stats.sleeps > 100,
        "clients slept {} + {} times",
        a.stats().sleeps,
        b_stats.sleeps
    );
    assert!(a.stats().doorbells + b_stats.doorbells > 100);
    assert!(
        worst < Duration::from_secs(5),
        "worst round trip {worst:?}: a wakeup was lost"
    );
}
