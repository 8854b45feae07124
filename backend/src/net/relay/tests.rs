use std::time::Instant;

use vmm_sys_util::eventfd::EventFd;

use super::gate::FLAG_NEED_REPLY;
use super::*;

const SET_FEATURES: u32 = 2;

fn message(request: u32, flags: u32, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&request.to_le_bytes());
    m.extend_from_slice(&flags.to_le_bytes());
    m.extend_from_slice(&(body.len() as u32).to_le_bytes());
    m.extend_from_slice(body);
    m
}

struct Pair {
    frontend: UnixStream,
    daemon: UnixStream,
    relay: Relay,
}

/// Sends a SET_VRING_CALL for ring 1 from the frontend side, carrying `fd`; returns the message.
fn send_vring_call(p: &Pair, fd: std::os::fd::RawFd) -> Vec<u8> {
    let call = message(13, 1, &0u64.to_le_bytes());
    p.frontend
        .send_with_fds(&[&call[..HEADER_LEN], &call[HEADER_LEN..]], &[fd])
        .unwrap();
    call
}

fn relayed() -> Pair {
    relayed_with_timeout(WRITE_TIMEOUT)
}

fn relayed_with_timeout(write_timeout: Duration) -> Pair {
    let (frontend, frontend_end) = UnixStream::pair().unwrap();
    let (daemon_end, daemon) = UnixStream::pair().unwrap();
    for s in [&frontend, &daemon] {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    }
    let relay = Relay::spawn_with_timeout(
        svnic_control_plane::GuestId(1),
        frontend_end,
        daemon_end,
        write_timeout,
    )
    .unwrap();
    Pair {
        frontend,
        daemon,
        relay,
    }
}

fn read_n(mut s: &UnixStream, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).unwrap();
    b
}

fn read_rest(mut s: &UnixStream) -> Vec<u8> {
    let mut b = Vec::new();
    s.read_to_end(&mut b).unwrap();
    b
}

#[test]
fn early_vring_enables_are_held_until_features_then_replayed() {
    let p = relayed();
    let enable = |index: u8, on: u8| message(SET_VRING_ENABLE, 1, &[index, 0, 0, 0, on, 0, 0, 0]);
    let asked = message(
        SET_VRING_ENABLE,
        1 | FLAG_NEED_REPLY,
        &[1, 0, 0, 0, 1, 0, 0, 0],
    );
    let features = message(SET_FEATURES, 1, &(1u64 << 30 | 1 << 32).to_le_bytes());
    // As QEMU 7.2 does: ring 0 enabled, disabled, enabled again; ring 1 enabled (here
    // asking for a reply).
    for m in [enable(0, 1), enable(0, 0), enable(0, 1)] {
        (&p.frontend).write_all(&m).unwrap();
    }
    (&p.frontend).write_all(&asked).unwrap();
    let ack = read_n(&p.frontend, HEADER_LEN + 8);
    assert_eq!(ack, message(SET_VRING_ENABLE, 1 | FLAG_REPLY, &[0; 8]));
    (&p.frontend).write_all(&features).unwrap();
    // The daemon sees SET_FEATURES, then the last state of each ring.
    assert_eq!(read_n(&p.daemon, features.len()), features);
    assert_eq!(read_n(&p.daemon, enable(0, 1).len()), enable(0, 1));
    assert_eq!(read_n(&p.daemon, enable(1, 1).len()), enable(1, 1));
    // After it, enables pass straight through.
    (&p.frontend).write_all(&enable(1, 0)).unwrap();
    assert_eq!(read_n(&p.daemon, enable(1, 0).len()), enable(1, 0));

    // Replies flow back.
    let reply = message(1, 1 | FLAG_REPLY, &[7; 8]);
    (&p.daemon).write_all(&reply).unwrap();
    assert_eq!(read_n(&p.frontend, reply.len()), reply);

    drop(p.frontend);
    assert!(
        read_rest(&p.daemon).is_empty(),
        "the daemon side is closed too"
    );
    assert!(p.relay.join().is_ok());
}

#[test]
fn descriptors_travel_with_their_message() {
    let p = relayed();
    let a = EventFd::new(0).unwrap();
    let call = send_vring_call(&p, a.as_raw_fd());
    let mut buf = vec![0u8; call.len()];
    let mut fds = [-1; 4];
    let mut iov = [libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    }];
    // SAFETY: the iovec describes `buf`, alive across the call.
    let (n, nfds) = unsafe { p.daemon.recv_with_fds(&mut iov, &mut fds) }.unwrap();
    assert_eq!((n, nfds), (call.len(), 1));
    assert_eq!(buf, call);
    // SAFETY: received descriptor, owned by nobody else.
    drop(unsafe { File::from_raw_fd(fds[0]) });
}

#[test]
fn an_oversized_header_ends_the_connection() {
    let p = relayed();
    let mut bad = message(5, 1, &[]);
    bad[8..12].copy_from_slice(&0x10_0000u32.to_le_bytes());
    (&p.frontend).write_all(&bad).unwrap();
    assert!(matches!(
        p.relay.join(),
        Err(RelayError::Oversized {
            request: 5,
            size: 0x10_0000
        })
    ));
    assert!(read_rest(&p.daemon).is_empty());
}

#[test]
fn a_message_cut_short_is_reported() {
    let p = relayed();
    let m = message(SET_FEATURES, 1, &[1, 2, 3, 4, 5, 6, 7, 8]);
    (&p.frontend).write_all(&m[..15]).unwrap();
    p.frontend.shutdown(Shutdown::Write).unwrap();
    assert!(matches!(
        p.relay.join(),
        Err(RelayError::Truncated {
            request: SET_FEATURES,
            got: 3,
            size: 8
        })
    ));
}

/// Joins the relay, failing the test if it has not ended within a generous deadline.
fn join_within(relay: Relay, deadline: Duration) -> Result<(), RelayError> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(relay.join()));
    rx.recv_timeout(deadline)
        .expect("the relay did not end in time")
}

/// A daemon that writes replies as fast as the relay takes them, until its writes fail or
/// stall for `stall`; returns how many it wrote.
fn flood_replies(daemon: UnixStream, stall: Duration) -> std::thread::JoinHandle<usize> {
    daemon.set_write_timeout(Some(stall)).unwrap();
    std::thread::spawn(move || {
        let reply = message(1, 1 | FLAG_REPLY, &[0; 8]);
        let mut sent = 0;
        while (&daemon).write_all(&reply).is_ok() {
            sent += 1;
        }
        sent
    })
}

#[test]
fn a_frontend_that_never_reads_replies_ends_the_relay_within_the_write_timeout() {
    let p = relayed_with_timeout(Duration::from_millis(200));
    let daemon = p.daemon.try_clone().unwrap();
    let flood = flood_replies(daemon, Duration::from_secs(30));
    let started = Instant::now();
    let ended = join_within(p.relay, Duration::from_secs(60));
    assert!(
        matches!(
            ended,
            Err(RelayError::WriteTimeout {
                peer: Peer::Frontend,
                ..
            })
        ),
        "{ended:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
    // The daemon side was shut down: its writes fail rather than stall, and it reads the
    // end of the stream (or a reset: the relay closed with replies unread).
    assert!(flood.join().unwrap() > 0);
    let mut rest = Vec::new();
    match (&p.daemon).read_to_end(&mut rest) {
        Ok(_) => assert!(rest.is_empty()),
        Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}"),
    }
}

#[test]
fn shutdown_ends_a_relay_blocked_writing_to_the_frontend() {
    let p = relayed_with_timeout(Duration::from_secs(3600));
    let daemon = p.daemon.try_clone().unwrap();
    // The flood stalls once the relay is blocked writing to the frontend.
    let flood = flood_replies(daemon, Duration::from_millis(300));
    flood.join().unwrap();
    p.relay.shutdown();
    assert!(join_within(p.relay, Duration::from_secs(60)).is_err());
    assert!(read_rest(&p.frontend).len() > HEADER_LEN);
}

#[test]
fn a_refused_request_shuts_both_sides_down() {
    let p = relayed();
    (&p.frontend).write_all(&message(37, 1, &[0; 40])).unwrap(); // ADD_MEM_REG
    let ended = join_within(p.relay, Duration::from_secs(60));
    assert!(
        matches!(
            ended,
            Err(RelayError::Refused(Refusal::NotServed {
                request: RequestCode(37)
            }))
        ),
        "{ended:?}"
    );
    assert!(read_rest(&p.daemon).is_empty(), "the daemon saw nothing");
    assert!(read_rest(&p.frontend).is_empty());
}

#[test]
fn the_daemon_ending_shuts_the_frontend_down() {
    let p = relayed();
    p.daemon.shutdown(Shutdown::Both).unwrap();
    assert!(read_rest(&p.frontend).is_empty());
    assert!(join_within(p.relay, Duration::from_secs(60)).is_ok());
}

#[test]
fn a_refused_call_fd_is_closed() {
    let p = relayed();
    let mut fds = [-1; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2() writes.
    let created = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK) };
    assert_eq!(created, 0);
    // SAFETY: pipe2() just created fds[0], owned by nobody else.
    let mut read_end = unsafe { File::from_raw_fd(fds[0]) };
    // SAFETY: pipe2() just created fds[1], owned by nobody else.
    let write_end = unsafe { File::from_raw_fd(fds[1]) };
    send_vring_call(&p, write_end.as_raw_fd());
    drop(write_end);
    let ended = join_within(p.relay, Duration::from_secs(60));
    assert!(
        matches!(ended, Err(RelayError::Refused(Refusal::NotEventFd { .. }))),
        "{ended:?}"
    );
    // Every copy of the write end is closed: the read end sees the end of the pipe.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match read_end.read(&mut [0u8; 8]) {
            Ok(0) => break,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "the relay kept the descriptor");
                std::thread::sleep(Duration::from_millis(10));
            }
            other => panic!("{other:?}"),
        }
    }
}
