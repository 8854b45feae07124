//! The agent's lifecycle: create, use, destroy; refusals; applications that die or leave
//! mid-create; stop; restart recovery.
#![allow(clippy::unwrap_used)]

use super::*;
use svnic_client::Completions;

#[test]
fn a_channel_is_created_used_and_destroyed_through_the_agent() {
    let h = Harness::start("use", Behaviour::default());
    create_use_and_destroy(&h);
}

/// The agent over a real raw packet socket: a veth pair in a private network namespace, the
/// fake engine on the other end. Needs root (skipped otherwise).
#[test]
fn the_agent_speaks_through_a_real_packet_socket() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root");
        return;
    }
    let t = std::thread::spawn(|| {
        // SAFETY: unshare(CLONE_NEWNET) moves only this thread (and what it spawns) into a new
        // network namespace; it touches no memory.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            eprintln!("skipped: cannot unshare the network namespace");
            return;
        }
        let made = std::process::Command::new("ip")
            .args([
                "link", "add", "svt0", "type", "veth", "peer", "name", "svt1",
            ])
            .status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("skipped: cannot create a veth pair");
            return;
        }
        // Opening brings both ends up.
        let nic = PacketSocket::open("svt0", svnic_channels::frame::ETHERTYPE).unwrap();
        let wire = PacketSocket::open("svt1", svnic_channels::frame::ETHERTYPE).unwrap();
        assert!(nic.describe().starts_with("svt0"));
        let h = Harness::start_with(
            test_dir("veth"),
            Box::new(nic),
            Box::new(wire),
            Behaviour::default(),
        );
        create_use_and_destroy(&h);
    });
    t.join().unwrap();
}

fn create_use_and_destroy(h: &Harness) {
    let mac = h.mac;
    let client = h.client();
    assert_eq!(client.mac(), mac);
    assert_eq!(client.info().region_len, HUGEPAGE);
    let mut ch = client.create_channel(5, 256, LONG).unwrap();
    assert_eq!(ch.addr(), ChannelAddr { mac, endpoint: 5 });
    assert_eq!(h.memory_held(), HUGEPAGE);
    let id = ChannelId(ch.id());
    let create = h.engine.seen(|s| s.creates[0]);
    assert_eq!(
        (create.mac, create.endpoint, create.ring_size),
        (mac, 5, 256)
    );
    assert_eq!(create.region_len, HUGEPAGE);
    assert_eq!(create.region_addr % HUGEPAGE, 0);
    wait_until("the channel is live", || h.status().live_channels == 1);

    // Engine -> application: an RX message written into the memory the agent registered.
    let (region, layout) = h.engine.seen(|s| s.regions[&id].clone());
    let mem = region.channel(layout).unwrap();
    let mut rx = Producer::new(RingKind::Rx, &layout);
    let from = ChannelAddr::new(MacAddr([2, 0, 0, 0, 0, 9]), 1);
    let msg = Message::UserData(UserData::new(from, 77, b"through the agent").unwrap());
    assert!(rx.push(&mem, &msg.encode()).unwrap());
    rx.publish(&mem).unwrap();
    let mut got = Vec::new();
    assert_eq!(ch.poll(&mut got, 8).unwrap(), 1);
    assert!(
        matches!(&got[0], Message::UserData(u) if u.cookie == 77 && u.data() == b"through the agent")
    );

    // Application -> engine: a doorbell when the worker sleeps, relayed as a frame.
    mem.set_sleeping(header::ENGINE_SLEEPING, true);
    assert!(ch.send_user(from, 1, b"hi", Completions::OnError).unwrap());
    ch.flush().unwrap();
    wait_until("the doorbell frame", || {
        h.engine.seen(|s| s.doorbells.contains(&id))
    });

    // Engine wake -> the application's waiter.
    let waiter = client.waiter(&ch).unwrap();
    assert!(!waiter.wait_for_wake(Duration::from_millis(10)).unwrap());
    h.engine
        .send(frame_to(mac, FrameBody::Wake { channel: id }));
    assert!(waiter.wait_for_wake(LONG).unwrap());
    wait_until("the wake is counted", || h.status().wakes == 1);

    client.destroy_channel(ch, LONG).unwrap();
    assert_eq!(h.memory_held(), 0, "freed before Destroyed was answered");
    assert_eq!(h.engine.seen(|s| s.destroys.clone()), vec![id]);
    let ev = events(h);
    let pos = |e: &AgentEvent| ev.iter().position(|x| x == e).unwrap();
    let gpa = create.region_addr;
    assert!(
        pos(&AgentEvent::DestroySent { channel: id })
            < pos(&AgentEvent::EngineDestroyed { channel: id })
    );
    assert!(
        pos(&AgentEvent::EngineDestroyed { channel: id })
            < pos(&AgentEvent::MemoryFreed {
                gpa,
                channel: Some(id)
            })
    );
    let state = std::fs::read_to_string(h.dir.join("agent.channels")).unwrap();
    assert!(!state.lines().any(|l| l == id.0.to_string()), "{state}");
}

#[test]
fn a_refused_create_frees_the_memory_at_once() {
    let b = Behaviour {
        refuse: HashMap::from([(9, FailureReason::EndpointTaken)]),
        ..Default::default()
    };
    let h = Harness::start("refused", b);
    let client = h.client();
    match client.create_channel(9, 256, LONG) {
        Err(ClientError::Refused {
            reason: AgentFailure::Engine(FailureReason::EndpointTaken),
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(h.memory_held(), 0);
    wait_until("no region held", || h.status().held_regions == 0);
    // The client still works.
    let ch = client.create_channel(10, 256, LONG).unwrap();
    client.destroy_channel(ch, LONG).unwrap();
}

#[test]
fn an_application_that_dies_has_its_channels_destroyed_before_the_memory_is_freed() {
    let h = Harness::start("dies", Behaviour::default());
    let client = h.client();
    let a = client.create_channel(1, 256, LONG).unwrap();
    let b = client.create_channel(2, 64, LONG).unwrap();
    let ids = [ChannelId(a.id()), ChannelId(b.id())];
    h.engine.behave(holding_destroys());
    // The "crash": the connection closes with the channels live.
    drop((a, b, client));
    wait_until("both destroy frames", || {
        h.engine.seen(|s| s.destroys.len() == 2)
    });
    let mut destroyed = h.engine.seen(|s| s.destroys.clone());
    destroyed.sort();
    assert_eq!(destroyed, ids);
    // Not acknowledged yet: the memory is still held.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(h.memory_held(), 2 * HUGEPAGE);
    let st = h.status();
    assert_eq!((st.apps, st.live_channels, st.held_regions), (0, 0, 2));
    let state = std::fs::read_to_string(h.dir.join("agent.channels")).unwrap();
    for id in ids {
        assert!(state.lines().any(|l| l == id.0.to_string()), "{state}");
    }
    h.engine.release();
    wait_until("the memory is freed", || h.memory_held() == 0);
    wait_until("no region held", || h.status().held_regions == 0);
    let ev = events(&h);
    for id in ids {
        let i = ev
            .iter()
            .position(|e| *e == AgentEvent::EngineDestroyed { channel: id })
            .unwrap();
        assert!(matches!(ev[i + 1], AgentEvent::MemoryFreed { channel: Some(c), .. } if c == id));
    }
    assert!(ev.contains(&AgentEvent::AppGone {
        app: 1,
        channels: 2
    }));
}

#[test]
fn an_application_gone_while_its_create_is_pending_gets_the_channel_destroyed() {
    let h = Harness::start(
        "pending",
        Behaviour {
            hold_creates: true,
            ..Default::default()
        },
    );
    let raw = Raw::connect(&h);
    raw.region(1, 4);
    raw.send(Request::Mapped { token: 1 });
    assert!(matches!(raw.recv().0, Response::Pending { token: 1 }));
    drop(raw);
    wait_until("the app is gone", || h.status().apps == 0);
    assert_eq!(h.memory_held(), HUGEPAGE);
    // The Success comes after the application left: the agent destroys the channel.
    h.engine.release();
    wait_until("the channel is destroyed", || {
        h.engine.seen(|s| s.destroys.len() == 1)
    });
    wait_until("the memory is freed", || h.memory_held() == 0);
    // The status is a snapshot the agent publishes after each turn of its loop, so it may still
    // show the request a moment after the memory (read directly) is free.
    wait_until("no request outstanding", || h.status().outstanding == 0);
}

#[test]
fn memory_passed_but_never_registered_is_freed_on_cancel_or_disconnect() {
    let h = Harness::start("cancel", Behaviour::default());
    let raw = Raw::connect(&h);
    for token in [1, 2] {
        raw.region(token, token);
    }
    assert_eq!(h.memory_held(), 2 * HUGEPAGE);
    raw.send(Request::Cancel { token: 1 });
    wait_until("cancel frees", || h.memory_held() == HUGEPAGE);
    drop(raw);
    wait_until("disconnect frees", || h.memory_held() == 0);
    assert!(h
        .engine
        .seen(|s| s.creates.is_empty() && s.destroys.is_empty()));
}

#[test]
fn a_refused_destroy_keeps_the_memory_for_good() {
    let h = Harness::start("quarantine", Behaviour::default());
    let client = h.client();
    let ch = client.create_channel(3, 256, LONG).unwrap();
    let id = ChannelId(ch.id());
    h.engine.behave(Behaviour {
        refuse_destroys: true,
        ..Default::default()
    });
    match client.destroy_channel(ch, LONG) {
        Err(ClientError::Refused {
            reason: AgentFailure::Engine(FailureReason::NoSuchChannel),
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    wait_until("quarantined", || h.status().quarantined == 1);
    drop(client);
    wait_until("the app is gone", || h.status().apps == 0);
    assert_eq!(h.memory_held(), HUGEPAGE);
    assert!(events(&h).contains(&AgentEvent::Quarantined { channel: id }));
}

#[test]
fn stopping_the_agent_destroys_every_channel_first() {
    let mut h = Harness::start("stop", Behaviour::default());
    let client = h.client();
    let ch = client.create_channel(1, 256, LONG).unwrap();
    let id = ChannelId(ch.id());
    h.stop();
    assert_eq!(h.engine.seen(|s| s.destroys.clone()), vec![id]);
    assert_eq!(h.memory_held(), 0);
    let st = h.status();
    assert!(st.stopped);
    assert_eq!(st.held_regions, 0);
    assert!(!h.dir.join("agent.sock").exists());
    // The application finds out on its next request.
    assert!(client
        .create_channel(2, 256, Duration::from_secs(1))
        .is_err());
}

#[test]
fn a_new_agent_destroys_the_channels_an_earlier_one_left() {
    let dir = test_dir("recover");
    std::fs::write(dir.join("agent.channels"), "# earlier agent\n101\n102\n").unwrap();
    let b = Behaviour {
        stale: HashSet::from([101]),
        ..Default::default()
    };
    let h = Harness::start_in(dir, b);
    // Recovery runs before the first application is served.
    let client = h.client();
    let destroyed = h.engine.seen(|s| s.destroys.clone());
    assert_eq!(destroyed, vec![ChannelId(101), ChannelId(102)]);
    assert!(events(&h).contains(&AgentEvent::Recovered {
        channel: ChannelId(101)
    }));
    let state = std::fs::read_to_string(h.dir.join("agent.channels")).unwrap();
    assert!(!state.contains("101") && !state.contains("102"), "{state}");
    let ch = client.create_channel(1, 256, LONG).unwrap();
    client.destroy_channel(ch, LONG).unwrap();
}
