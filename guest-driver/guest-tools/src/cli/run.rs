//! Running one tool: the transport (VM agent or host-process guest), the path, the measurement.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use svnic_channels::{ChannelAddr, MacAddr};

use super::args::{Command, Common, EchoArgs, PathKind, PerfArgs, PingArgs, SinkArgs, Target};
use super::frames::{with_frame_port, FrameRunner};
use super::transport::Transport;
use super::{CliError, Outcome, Report};
use crate::measure::{
    channel_await_probe, channel_dma_stream_recv, channel_dma_stream_send, channel_echo,
    channel_ping, channel_probe, channel_stream_recv, channel_stream_send, udp_echo, udp_ping,
    udp_probe, udp_stream_recv, udp_stream_send, PingKind, Throughput, MAX_UDP_SIZE,
};
use svnic_client::channel::{Channel, Waiter};

/// Idle time after which an echo of frames or datagrams gives up between messages.
const ECHO_IDLE: Duration = Duration::from_secs(30);

/// Runs the tool `cmd` and returns its report (printing "ready" lines on stderr for echo/sink).
pub fn run(cmd: &Command) -> Result<Report, CliError> {
    match cmd {
        Command::Ping(a) => ping(a),
        Command::Echo(a) => echo(a),
        Command::Perf(a) => perf(a),
        Command::Sink(a) => sink(a),
        Command::CrashTest(a) => super::crash::crash_test(a),
    }
}

/// The common options of a command.
pub fn common_of(cmd: &Command) -> &Common {
    match cmd {
        Command::Ping(a) => &a.common,
        Command::Echo(a) => &a.common,
        Command::Perf(a) => &a.common,
        Command::Sink(a) => &a.common,
        Command::CrashTest(a) => &a.common,
    }
}

/// Drops root for good: no supplementary groups, then group and user `uid`.
pub fn drop_privileges(uid: u32) -> Result<(), CliError> {
    let fail = |what: &str| {
        CliError::failed(
            format!("run as user {uid}: {what}"),
            std::io::Error::last_os_error(),
        )
    };
    // SAFETY: setgroups with an empty list reads no memory.
    if unsafe { libc::setgroups(0, std::ptr::null()) } != 0 {
        return Err(fail("setgroups"));
    }
    // SAFETY: setgid/setuid take plain integers.
    if unsafe { libc::setgid(uid) } != 0 {
        return Err(fail("setgid"));
    }
    // SAFETY: as above.
    if unsafe { libc::setuid(uid) } != 0 {
        return Err(fail("setuid"));
    }
    Ok(())
}

fn ready(tool: &str, at: &str, c: &Common) {
    eprintln!(
        "svnic-guest {tool}: ready at {at} ({}, path {})",
        c.mode(),
        c.path.name()
    );
}

fn kind_of(path: PathKind) -> PingKind {
    if path == PathKind::Dma {
        PingKind::DmaData
    } else {
        PingKind::UserData
    }
}

/// The payload size a sending tool uses on `path`: `--size`, or the path's default; checked
/// against what the path carries.
fn payload_size(path: PathKind, t: &Target) -> Result<usize, CliError> {
    let size = t.size.unwrap_or(path.default_size());
    let max = match path {
        PathKind::User => svnic_channels::message::INLINE_CAPACITY,
        PathKind::Dma => 1 << 20,
        PathKind::Frame => svnic_host_frontend::virtio_user::MAX_TX_FRAME - 14,
        PathKind::Udp => MAX_UDP_SIZE,
    };
    if size > max {
        return Err(CliError::Usage(format!(
            "--size {size}: path {} carries at most {max} bytes per message",
            path.name()
        )));
    }
    Ok(size)
}

/// `MAC/ENDPOINT` (or `MAC`, endpoint 1).
fn parse_channel_peer(s: &str) -> Result<ChannelAddr, CliError> {
    let bad = || {
        CliError::Usage(format!(
            "--peer {s:?}: expected MAC/ENDPOINT, e.g. 52:54:00:00:00:02/1"
        ))
    };
    let (mac, ep) = s.split_once('/').unwrap_or((s, "1"));
    Ok(ChannelAddr::new(
        mac.parse().map_err(|_| bad())?,
        ep.parse().map_err(|_| bad())?,
    ))
}

fn parse_mac(s: &str) -> Result<MacAddr, CliError> {
    s.parse().map_err(|_| {
        CliError::Usage(format!(
            "--peer {s:?}: expected a MAC, e.g. 52:54:00:00:00:02"
        ))
    })
}

fn parse_socket_addr(s: &str) -> Result<SocketAddr, CliError> {
    s.parse().map_err(|_| {
        CliError::Usage(format!(
            "--peer {s:?}: expected IP:PORT, e.g. 10.0.0.2:7777"
        ))
    })
}

fn udp_socket(bind: &str) -> Result<UdpSocket, CliError> {
    UdpSocket::bind(bind).map_err(|e| CliError::failed(format!("bind UDP {bind}"), e))
}

/// The error of an initiator whose `responder` (echo or sink) at `peer` never answered a probe.
fn no_answer(responder: &str, peer: impl std::fmt::Display, wait: Duration) -> CliError {
    CliError::failed(
        format!("reach the {responder}"),
        format!("{peer} did not answer within {wait:?}"),
    )
}

/// An initiator's channel path: creates this side's channel, probes `peer` (MAC/ENDPOINT) until
/// the `responder` answers, runs `f`, then releases the channel. Returns (local, peer, result).
fn with_channel_peer<T>(
    c: &Common,
    peer: &str,
    responder: &str,
    f: impl FnOnce(&mut Channel, ChannelAddr, &dyn Waiter) -> Result<T, CliError>,
) -> Result<(String, String, T), CliError> {
    let peer = parse_channel_peer(peer)?;
    let t = Transport::connect(c)?;
    let (mut ch, w) = t.channel(c)?;
    let local = ch.addr().to_string();
    let r = channel_probe(&mut ch, peer, c.wait(), &*w)
        .map_err(|e| CliError::failed(format!("reach the {responder}"), e))
        .and_then(|()| f(&mut ch, peer, &*w));
    t.release(ch);
    Ok((local, peer.to_string(), r?))
}

/// An initiator's frame path: probes `peer` (a MAC) until the `responder` answers, then runs
/// `f` on the frame port. Returns (local, peer, result).
fn with_frame_peer<T>(
    c: &Common,
    peer: &str,
    responder: &str,
    f: impl FnOnce(&mut dyn FrameRunner, MacAddr) -> Result<T, CliError>,
) -> Result<(String, String, T), CliError> {
    let peer = parse_mac(peer)?;
    let wait = c.wait();
    with_frame_port(c, |p| {
        if !p
            .probe(peer, wait)
            .map_err(|e| CliError::failed("probe", e))?
        {
            return Err(no_answer(responder, peer, wait));
        }
        let r = f(&mut *p, peer)?;
        Ok((p.mac().to_string(), peer.to_string(), r))
    })
}

/// An initiator's UDP path: binds an ephemeral socket, probes `peer` (IP:PORT) until the
/// `responder` answers, then runs `f`. Returns (local, peer, result).
fn with_udp_peer<T>(
    c: &Common,
    peer: &str,
    responder: &str,
    f: impl FnOnce(&UdpSocket, SocketAddr) -> Result<T, CliError>,
) -> Result<(String, String, T), CliError> {
    let peer = parse_socket_addr(peer)?;
    let wait = c.wait();
    let sock = udp_socket("0.0.0.0:0")?;
    let local = sock
        .local_addr()
        .map_or_else(|_| "?".into(), |l| l.to_string());
    if !udp_probe(&sock, peer, wait).map_err(|e| CliError::failed("probe", e))? {
        return Err(no_answer(responder, peer, wait));
    }
    Ok((local, peer.to_string(), f(&sock, peer)?))
}

/// A responder's channel path: creates this side's channel, prints the `tool`'s "ready" line,
/// runs `f`, then releases the channel. Returns (local, result).
fn with_ready_channel<T>(
    c: &Common,
    tool: &str,
    f: impl FnOnce(&mut Channel, &dyn Waiter) -> Result<T, CliError>,
) -> Result<(String, T), CliError> {
    let t = Transport::connect(c)?;
    let (mut ch, w) = t.channel(c)?;
    let local = ch.addr().to_string();
    ready(tool, &local, c);
    let r = f(&mut ch, &*w);
    t.release(ch);
    Ok((local, r?))
}

/// A responder's channel path that answers the `initiator`'s first probe before it runs `f`
/// (see [`with_ready_channel`]).
fn with_probed_channel<T>(
    c: &Common,
    tool: &str,
    initiator: &str,
    f: impl FnOnce(&mut Channel, &dyn Waiter) -> Result<T, CliError>,
) -> Result<(String, T), CliError> {
    with_ready_channel(c, tool, |ch, w| {
        channel_await_probe(ch, c.wait(), w)
            .map_err(|e| CliError::failed(format!("wait for the {initiator}"), e))?;
        f(ch, w)
    })
}

/// A responder's frame path: prints the `tool`'s "ready" line, then runs `f` on the frame port.
/// Returns (local, result).
fn with_ready_frame_port<T>(
    c: &Common,
    tool: &str,
    f: impl FnOnce(&mut dyn FrameRunner) -> Result<T, CliError>,
) -> Result<(String, T), CliError> {
    with_frame_port(c, |p| {
        let local = p.mac().to_string();
        ready(tool, &local, c);
        Ok((local, f(p)?))
    })
}

/// A responder's UDP path: binds `listen`, prints the `tool`'s "ready" line, then runs `f`.
/// Returns (local, result).
fn with_ready_udp<T>(
    c: &Common,
    tool: &str,
    listen: SocketAddr,
    f: impl FnOnce(&UdpSocket) -> Result<T, CliError>,
) -> Result<(String, T), CliError> {
    let sock = udp_socket(&listen.to_string())?;
    let local = listen.to_string();
    ready(tool, &local, c);
    Ok((local, f(&sock)?))
}

fn ping(a: &PingArgs) -> Result<Report, CliError> {
    let c = &a.common;
    let size = payload_size(c.path, &a.target)?;
    let (local, peer, stats) = match c.path {
        PathKind::User | PathKind::Dma => {
            with_channel_peer(c, &a.target.peer, "echo", |ch, peer, w| {
                channel_ping(ch, peer, kind_of(c.path), size, a.count, w)
                    .map_err(|e| CliError::failed("ping", e))
            })?
        }
        PathKind::Frame => with_frame_peer(c, &a.target.peer, "echo", |p, peer| {
            p.ping(peer, size, a.count)
                .map_err(|e| CliError::failed("ping", e))?
                .ok_or_else(|| CliError::failed("ping", "a reply never came"))
        })?,
        PathKind::Udp => with_udp_peer(c, &a.target.peer, "echo", |sock, peer| {
            udp_ping(sock, peer, size, a.count)
                .map_err(|e| CliError::failed("ping", e))?
                .ok_or_else(|| CliError::failed("ping", "a reply never came"))
        })?,
    };
    Ok(c.report(
        "ping",
        (size, a.count as u64),
        local,
        Some(peer),
        Outcome::Latency(stats),
    ))
}

fn echo(a: &EchoArgs) -> Result<Report, CliError> {
    let c = &a.common;
    let wait = c.wait();
    let (local, echoed) = match c.path {
        PathKind::User | PathKind::Dma => with_probed_channel(c, "echo", "ping", |ch, w| {
            channel_echo(ch, kind_of(c.path), a.count, w)
                .map_err(|e| CliError::failed("echo", e))?;
            Ok(a.count)
        })?,
        PathKind::Frame => with_ready_frame_port(c, "echo", |p| {
            p.echo(a.count).map_err(|e| CliError::failed("echo", e))
        })?,
        PathKind::Udp => with_ready_udp(c, "echo", a.listen, |sock| {
            udp_echo(sock, a.count, wait, ECHO_IDLE).map_err(|e| CliError::failed("echo", e))
        })?,
    };
    if echoed < a.count {
        return Err(CliError::failed(
            "echo",
            format!(
                "answered {echoed} of {} messages, then nothing more came",
                a.count
            ),
        ));
    }
    Ok(c.report(
        "echo",
        (0, a.count as u64),
        local,
        None,
        Outcome::Echoed(echoed as u64),
    ))
}

fn timed(
    count: u64,
    size: usize,
    f: impl FnOnce() -> Result<(), CliError>,
) -> Result<Throughput, CliError> {
    let t0 = Instant::now();
    f()?;
    Ok(Throughput {
        messages: count,
        bytes: count.saturating_mul(size as u64),
        elapsed: t0.elapsed(),
    })
}

fn perf(a: &PerfArgs) -> Result<Report, CliError> {
    let c = &a.common;
    let size = payload_size(c.path, &a.target)?;
    let (local, peer, t) = match c.path {
        PathKind::User | PathKind::Dma => {
            with_channel_peer(c, &a.target.peer, "sink", |ch, peer, w| {
                timed(a.count, size, || {
                    let sent = if c.path == PathKind::User {
                        channel_stream_send(ch, peer, size, a.count)
                    } else {
                        channel_dma_stream_send(ch, peer, size, a.count, w)
                    };
                    sent.map_err(|e| CliError::failed("stream", e))
                })
            })?
        }
        PathKind::Frame => with_frame_peer(c, &a.target.peer, "sink", |p, peer| {
            timed(a.count, size, || {
                p.send(peer, size, a.count)
                    .map_err(|e| CliError::failed("stream", e))
            })
        })?,
        PathKind::Udp => with_udp_peer(c, &a.target.peer, "sink", |sock, peer| {
            let size = size.max(8);
            timed(a.count, size, || {
                udp_stream_send(sock, peer, size, a.count)
                    .map_err(|e| CliError::failed("stream", e))
            })
        })?,
    };
    Ok(c.report(
        "perf",
        (size, a.count),
        local,
        Some(peer),
        Outcome::Stream(t),
    ))
}

fn sink(a: &SinkArgs) -> Result<Report, CliError> {
    let c = &a.common;
    let wait = c.wait();
    let idle = Duration::from_millis(a.idle_ms);
    let size = a.size.unwrap_or(c.path.default_size());
    let (local, t) = match c.path {
        PathKind::User => with_probed_channel(c, "sink", "perf", |ch, w| {
            channel_stream_recv(ch, a.count, w).map_err(|e| CliError::failed("receive", e))
        })?,
        // Buffers are posted before the sender can reach us; probes are answered inside the
        // receive loop.
        PathKind::Dma => with_ready_channel(c, "sink", |ch, w| {
            channel_dma_stream_recv(ch, a.count, size, wait, w)
                .map_err(|e| CliError::failed("receive", e))
        })?,
        PathKind::Frame => with_ready_frame_port(c, "sink", |p| {
            p.recv(a.count, wait, idle)
                .map_err(|e| CliError::failed("receive", e))
        })?,
        PathKind::Udp => with_ready_udp(c, "sink", a.listen, |sock| {
            udp_stream_recv(sock, a.count, wait, idle).map_err(|e| CliError::failed("receive", e))
        })?,
    };
    if t.messages == 0 {
        return Err(CliError::failed("receive", "nothing arrived"));
    }
    Ok(c.report(
        "sink",
        (
            t.bytes.checked_div(t.messages).unwrap_or(0) as usize,
            a.count,
        ),
        local,
        None,
        Outcome::Stream(t),
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn peers_parse_or_say_what_is_expected() {
        let p = parse_channel_peer("52:54:00:00:00:02/7").unwrap();
        assert_eq!((p.mac, p.endpoint), (MacAddr([0x52, 0x54, 0, 0, 0, 2]), 7));
        assert_eq!(parse_channel_peer("52:54:00:00:00:02").unwrap().endpoint, 1);
        for bad in ["52:54:00:00:00/1", "52:54:00:00:00:02/x", ""] {
            let e = parse_channel_peer(bad).unwrap_err().to_string();
            assert!(e.contains("MAC/ENDPOINT"), "{e}");
        }
        assert!(parse_mac("nope").is_err());
        assert!(parse_socket_addr("10.0.0.2:7777").is_ok());
        assert!(parse_socket_addr("10.0.0.2").is_err());
        let size = |size| Target {
            peer: String::new(),
            size,
        };
        assert_eq!(payload_size(PathKind::User, &size(Some(40))).unwrap(), 40);
        assert!(payload_size(PathKind::User, &size(Some(41))).is_err());
        assert!(payload_size(PathKind::Udp, &size(Some(100_000))).is_err());
        assert_eq!(payload_size(PathKind::Dma, &size(None)).unwrap(), 4096);
    }
}
