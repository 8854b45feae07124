//! Round trips and streaming over ordinary UDP sockets: in a VM, the guest kernel's network
//! stack on the svnic NIC's virtio-net queues, for comparison with the channel paths.
//!
//! Datagrams carry an 8-byte little-endian sequence number, padded to the chosen size (at
//! least 8); sequence [`UDP_PROBE_SEQ`] marks probes, which responders answer and never count.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use super::stats::{LatencyStats, Throughput};

/// Sequence number of probe datagrams.
pub const UDP_PROBE_SEQ: u64 = u64::MAX;
/// Largest datagram payload the benches send (fits one Ethernet frame with IPv4 and UDP).
pub const MAX_UDP_SIZE: usize = 1472;

fn datagram(seq: u64, size: usize) -> Vec<u8> {
    let mut d = seq.to_le_bytes().to_vec();
    d.resize(size.clamp(8, MAX_UDP_SIZE), 0x5a);
    d
}

fn seq_of(d: &[u8]) -> Option<u64> {
    let mut b = [0u8; 8];
    b.copy_from_slice(d.get(..8)?);
    Some(u64::from_le_bytes(b))
}

/// Receives one datagram within `timeout`: `Ok(None)` on timeout.
fn recv_within(
    sock: &UdpSocket,
    buf: &mut [u8],
    timeout: Duration,
) -> io::Result<Option<(usize, SocketAddr)>> {
    sock.set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
    match sock.recv_from(buf) {
        Ok(r) => Ok(Some(r)),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Sends a probe to `peer` every 200 ms until one comes back or `within` passes. True if the
/// peer answered.
pub fn udp_probe(sock: &UdpSocket, peer: SocketAddr, within: Duration) -> io::Result<bool> {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 2048];
    loop {
        // A peer that is not up yet may make the send fail (ICMP port unreachable): retry.
        let _ = sock.send_to(&datagram(UDP_PROBE_SEQ, 8), peer);
        let round = Instant::now() + Duration::from_millis(200);
        loop {
            let left = round.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match recv_within(sock, &mut buf, left) {
                Ok(Some((n, from))) if from == peer && seq_of(&buf[..n]) == Some(UDP_PROBE_SEQ) => {
                    return Ok(true)
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
                Err(e) => return Err(e),
            }
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
    }
}

/// Round trips of `size`-byte datagrams to `peer`, `count` times (each waits up to 10 s for its
/// answer). `Ok(None)` if an answer never came.
pub fn udp_ping(
    sock: &UdpSocket,
    peer: SocketAddr,
    size: usize,
    count: usize,
) -> io::Result<Option<LatencyStats>> {
    let mut samples = Vec::with_capacity(count);
    let mut buf = [0u8; 2048];
    for i in 0..count as u64 {
        let d = datagram(i, size);
        let t0 = Instant::now();
        sock.send_to(&d, peer)?;
        let deadline = t0 + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            match recv_within(sock, &mut buf, left)? {
                Some((n, from)) if from == peer && seq_of(&buf[..n]) == Some(i) => break,
                _ => continue,
            }
        }
        samples.push(t0.elapsed());
    }
    Ok(Some(LatencyStats::from_samples(samples)))
}

/// The echo half of [`udp_ping`]: returns `count` datagrams to their senders (probes too,
/// uncounted), waiting up to `first_within` for the first and `idle` between the others.
pub fn udp_echo(
    sock: &UdpSocket,
    count: usize,
    first_within: Duration,
    idle: Duration,
) -> io::Result<usize> {
    let echoed = respond(sock, count as u64, first_within, idle, |d, from| {
        sock.send_to(d, from).map(drop)
    })?;
    Ok(echoed as usize)
}

/// Streams `count` datagrams of `size` bytes to `peer` as fast as the socket takes them.
pub fn udp_stream_send(
    sock: &UdpSocket,
    peer: SocketAddr,
    size: usize,
    count: u64,
) -> io::Result<()> {
    let mut d = datagram(0, size);
    for i in 0..count {
        d[..8].copy_from_slice(&i.to_le_bytes());
        loop {
            match sock.send_to(&d, peer) {
                Ok(_) => break,
                // The socket or the device queue is full: let it drain.
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => std::thread::yield_now(),
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Receives datagrams until `count` arrived, or nothing came for `idle` after the first
/// (waiting up to `first_within` for it); the clock runs from the first to the last. Datagrams
/// the kernel dropped show as fewer messages than sent.
pub fn udp_stream_recv(
    sock: &UdpSocket,
    count: u64,
    first_within: Duration,
    idle: Duration,
) -> io::Result<Throughput> {
    let mut bytes = 0u64;
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let messages = respond(sock, count, first_within, idle, |d, _| {
        last = Instant::now();
        first.get_or_insert(last);
        bytes += d.len() as u64;
        Ok(())
    })?;
    Ok(Throughput {
        messages,
        bytes,
        elapsed: first.map_or(Duration::ZERO, |f| last.duration_since(f)),
    })
}

/// A responder's receive loop: sends probes back (uncounted), hands every other datagram with a
/// sequence number to `on_data` with its sender, and ignores the rest; until `count` were
/// handed over, or nothing came for `idle` after the first (waiting up to `first_within` for
/// it). Returns how many were handed over.
fn respond(
    sock: &UdpSocket,
    count: u64,
    first_within: Duration,
    idle: Duration,
    mut on_data: impl FnMut(&[u8], SocketAddr) -> io::Result<()>,
) -> io::Result<u64> {
    let mut buf = [0u8; 2048];
    let mut got = 0;
    while got < count {
        let wait = if got == 0 { first_within } else { idle };
        let Some((n, from)) = recv_within(sock, &mut buf, wait)? else {
            break;
        };
        let d = &buf[..n];
        match seq_of(d) {
            Some(UDP_PROBE_SEQ) => {
                sock.send_to(d, from)?;
            }
            Some(_) => {
                on_data(d, from)?;
                got += 1;
            }
            None => {}
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn pair() -> (UdpSocket, UdpSocket) {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        (a, b)
    }

    /// Runs `serve` on the second socket of a pair in a thread, and returns the first socket,
    /// the second's address (probed: the server answers) and the thread.
    fn served<T: Send + 'static>(
        serve: impl FnOnce(UdpSocket) -> T + Send + 'static,
    ) -> (UdpSocket, SocketAddr, std::thread::JoinHandle<T>) {
        let (a, b) = pair();
        let peer = b.local_addr().unwrap();
        let server = std::thread::spawn(move || serve(b));
        assert!(udp_probe(&a, peer, Duration::from_secs(10)).unwrap());
        (a, peer, server)
    }

    #[test]
    fn ping_and_echo_over_loopback() {
        let (a, peer, echo) =
            served(|b| udp_echo(&b, 50, Duration::from_secs(10), Duration::from_secs(5)).unwrap());
        let s = udp_ping(&a, peer, 64, 50).unwrap().unwrap();
        assert_eq!(s.count, 50);
        assert!(s.min <= s.p50 && s.p50 <= s.p99);
        assert_eq!(echo.join().unwrap(), 50, "the probe is not counted");
    }

    #[test]
    fn a_stream_is_counted_from_first_to_last() {
        let (a, peer, sink) = served(|b| {
            udp_stream_recv(&b, 200, Duration::from_secs(10), Duration::from_millis(500)).unwrap()
        });
        udp_stream_send(&a, peer, 100, 200).unwrap();
        let t = sink.join().unwrap();
        // Loopback may drop under pressure; most arrive, each of 100 bytes.
        assert!(t.messages > 0 && t.messages <= 200);
        assert_eq!(t.bytes, t.messages * 100);
    }

    #[test]
    fn nobody_listening_means_no_answer() {
        let (a, b) = pair();
        let peer = b.local_addr().unwrap();
        drop(b);
        assert!(!udp_probe(&a, peer, Duration::from_millis(300)).unwrap());
        assert_eq!(udp_ping(&a, peer, 8, 0).unwrap().unwrap().count, 0);
        assert_eq!(datagram(3, 2).len(), 8);
        assert_eq!(datagram(3, 100_000).len(), MAX_UDP_SIZE);
        assert_eq!(seq_of(&[1, 2, 3]), None);
    }
}
