//! Running one tool: the transport (VM agent or host-process guest), the path, the measurement.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use svnic_channels::{ChannelAddr, MacAddr};

use super::args::{Command, Common, EchoArgs, PathKind, PerfArgs, PingArgs, SinkArgs};
use super::frames::with_frame_port;
use super::transport::Transport;
use super::{CliError, Outcome, Report};
use crate::tools::{
    channel_await_probe, channel_dma_stream_recv, channel_dma_stream_send, channel_echo,
    channel_ping, channel_probe, channel_stream_recv, channel_stream_send, udp_echo, udp_ping,
    udp_probe, udp_stream_recv, udp_stream_send, PingKind, Throughput, MAX_UDP_SIZE,
};

/// How long a channel create or destroy may take.
pub(super) const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for queued messages or frames to leave before a channel or NIC goes away.
pub(super) const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
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

pub(super) fn wait_of(c: &Common) -> Duration {
    Duration::from_secs(c.wait)
}

pub(super) fn mode(c: &Common) -> &'static str {
    if c.socket.is_some() {
        "host-process"
    } else {
        "vm"
    }
}

fn ready(tool: &str, at: &str, c: &Common) {
    eprintln!(
        "svnic-guest {tool}: ready at {at} ({}, path {})",
        mode(c),
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

fn check_size(path: PathKind, size: usize) -> Result<(), CliError> {
    let max = match path {
        PathKind::User => svnic_channels::message::INLINE_CAPACITY,
        PathKind::Dma => 1 << 20,
        PathKind::Frame => crate::virtio_user::MAX_TX_FRAME - 14,
        PathKind::Udp => MAX_UDP_SIZE,
    };
    if size > max {
        return Err(CliError::Usage(format!(
            "--size {size}: path {} carries at most {max} bytes per message",
            path.name()
        )));
    }
    Ok(())
}

/// `MAC/ENDPOINT` (or `MAC`, endpoint 1).
fn parse_channel_peer(s: &str) -> Result<ChannelAddr, CliError> {
    let bad = || {
        CliError::Usage(format!(
            "--peer {s:?}: expected MAC/ENDPOINT, e.g. 52:54:00:00:00:02/1"
        ))
    };
    let (mac, ep) = s.split_once('/').unwrap_or((s, "1"));
    Ok(ChannelAddr {
        mac: mac.parse().map_err(|_| bad())?,
        endpoint: ep.parse().map_err(|_| bad())?,
    })
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

fn ping(a: &PingArgs) -> Result<Report, CliError> {
    let c = &a.common;
    let size = a.size.unwrap_or(c.path.default_size());
    check_size(c.path, size)?;
    let wait = wait_of(c);
    let (local, peer, stats) = match c.path {
        PathKind::User | PathKind::Dma => {
            let peer = parse_channel_peer(&a.peer)?;
            let t = Transport::connect(c)?;
            let (mut ch, w) = t.channel(c)?;
            let local = ch.addr().to_string();
            let r = channel_probe(&mut ch, peer, wait, &*w)
                .map_err(|e| CliError::failed("reach the echo", e))
                .and_then(|()| {
                    channel_ping(&mut ch, peer, kind_of(c.path), size, a.count, &*w)
                        .map_err(|e| CliError::failed("ping", e))
                });
            t.release(ch);
            (local, peer.to_string(), r?)
        }
        PathKind::Frame => {
            let peer = parse_mac(&a.peer)?;
            with_frame_port(c, |p| {
                if !p
                    .probe(peer, wait)
                    .map_err(|e| CliError::failed("probe", e))?
                {
                    return Err(CliError::failed(
                        "reach the echo",
                        format!("{peer} did not answer within {wait:?}"),
                    ));
                }
                let s = p
                    .ping(peer, size, a.count)
                    .map_err(|e| CliError::failed("ping", e))?
                    .ok_or_else(|| CliError::failed("ping", "a reply never came"))?;
                Ok((p.mac().to_string(), peer.to_string(), s))
            })?
        }
        PathKind::Udp => {
            let peer = parse_socket_addr(&a.peer)?;
            let sock = udp_socket("0.0.0.0:0")?;
            let local = sock
                .local_addr()
                .map_or_else(|_| "?".into(), |l| l.to_string());
            if !udp_probe(&sock, peer, wait).map_err(|e| CliError::failed("probe", e))? {
                return Err(CliError::failed(
                    "reach the echo",
                    format!("{peer} did not answer within {wait:?}"),
                ));
            }
            let s = udp_ping(&sock, peer, size, a.count)
                .map_err(|e| CliError::failed("ping", e))?
                .ok_or_else(|| CliError::failed("ping", "a reply never came"))?;
            (local, peer.to_string(), s)
        }
    };
    Ok(Report {
        tool: "ping",
        mode: mode(c),
        path: c.path,
        size,
        count: a.count as u64,
        local,
        peer: Some(peer),
        outcome: Outcome::Latency(stats),
    })
}

fn echo(a: &EchoArgs) -> Result<Report, CliError> {
    let c = &a.common;
    let wait = wait_of(c);
    let (local, echoed) = match c.path {
        PathKind::User | PathKind::Dma => {
            let t = Transport::connect(c)?;
            let (mut ch, w) = t.channel(c)?;
            let local = ch.addr().to_string();
            ready("echo", &local, c);
            let r = channel_await_probe(&mut ch, wait, &*w)
                .map_err(|e| CliError::failed("wait for the ping", e))
                .and_then(|_| {
                    channel_echo(&mut ch, kind_of(c.path), a.count, &*w)
                        .map_err(|e| CliError::failed("echo", e))
                });
            t.release(ch);
            r?;
            (local, a.count)
        }
        PathKind::Frame => with_frame_port(c, |p| {
            let local = p.mac().to_string();
            ready("echo", &local, c);
            let n = p.echo(a.count).map_err(|e| CliError::failed("echo", e))?;
            Ok((local, n))
        })?,
        PathKind::Udp => {
            let sock = udp_socket(&a.listen.to_string())?;
            let local = a.listen.to_string();
            ready("echo", &local, c);
            let n = udp_echo(&sock, a.count, wait, ECHO_IDLE)
                .map_err(|e| CliError::failed("echo", e))?;
            (local, n)
        }
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
    Ok(Report {
        tool: "echo",
        mode: mode(c),
        path: c.path,
        size: 0,
        count: a.count as u64,
        local,
        peer: None,
        outcome: Outcome::Echoed(echoed as u64),
    })
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
    let size = a.size.unwrap_or(c.path.default_size());
    check_size(c.path, size)?;
    let wait = wait_of(c);
    let (local, peer, t) = match c.path {
        PathKind::User | PathKind::Dma => {
            let peer = parse_channel_peer(&a.peer)?;
            let tr = Transport::connect(c)?;
            let (mut ch, w) = tr.channel(c)?;
            let local = ch.addr().to_string();
            let r = channel_probe(&mut ch, peer, wait, &*w)
                .map_err(|e| CliError::failed("reach the sink", e))
                .and_then(|()| {
                    timed(a.count, size, || {
                        let sent = if c.path == PathKind::User {
                            channel_stream_send(&mut ch, peer, size, a.count)
                        } else {
                            channel_dma_stream_send(&mut ch, peer, size, a.count, &*w)
                        };
                        sent.map_err(|e| CliError::failed("stream", e))
                    })
                });
            tr.release(ch);
            (local, peer.to_string(), r?)
        }
        PathKind::Frame => {
            let peer = parse_mac(&a.peer)?;
            with_frame_port(c, |p| {
                if !p
                    .probe(peer, wait)
                    .map_err(|e| CliError::failed("probe", e))?
                {
                    return Err(CliError::failed(
                        "reach the sink",
                        format!("{peer} did not answer within {wait:?}"),
                    ));
                }
                let t = timed(a.count, size, || {
                    p.send(peer, size, a.count)
                        .map_err(|e| CliError::failed("stream", e))
                })?;
                Ok((p.mac().to_string(), peer.to_string(), t))
            })?
        }
        PathKind::Udp => {
            let peer = parse_socket_addr(&a.peer)?;
            let sock = udp_socket("0.0.0.0:0")?;
            let local = sock
                .local_addr()
                .map_or_else(|_| "?".into(), |l| l.to_string());
            if !udp_probe(&sock, peer, wait).map_err(|e| CliError::failed("probe", e))? {
                return Err(CliError::failed(
                    "reach the sink",
                    format!("{peer} did not answer within {wait:?}"),
                ));
            }
            let size = size.max(8);
            let t = timed(a.count, size, || {
                udp_stream_send(&sock, peer, size, a.count)
                    .map_err(|e| CliError::failed("stream", e))
            })?;
            (local, peer.to_string(), t)
        }
    };
    Ok(Report {
        tool: "perf",
        mode: mode(c),
        path: c.path,
        size,
        count: a.count,
        local,
        peer: Some(peer),
        outcome: Outcome::Stream(t),
    })
}

fn sink(a: &SinkArgs) -> Result<Report, CliError> {
    let c = &a.common;
    let wait = wait_of(c);
    let idle = Duration::from_millis(a.idle_ms);
    let size = a.size.unwrap_or(c.path.default_size());
    let (local, t) = match c.path {
        PathKind::User | PathKind::Dma => {
            let tr = Transport::connect(c)?;
            let (mut ch, w) = tr.channel(c)?;
            let local = ch.addr().to_string();
            let r = if c.path == PathKind::User {
                ready("sink", &local, c);
                channel_await_probe(&mut ch, wait, &*w)
                    .map_err(|e| CliError::failed("wait for the perf", e))
                    .and_then(|_| {
                        channel_stream_recv(&mut ch, a.count, &*w)
                            .map_err(|e| CliError::failed("receive", e))
                    })
            } else {
                // Buffers are posted before the sender can reach us; probes are answered
                // inside the receive loop.
                ready("sink", &local, c);
                channel_dma_stream_recv(&mut ch, a.count, size, wait, &*w)
                    .map_err(|e| CliError::failed("receive", e))
            };
            tr.release(ch);
            (local, r?)
        }
        PathKind::Frame => with_frame_port(c, |p| {
            let local = p.mac().to_string();
            ready("sink", &local, c);
            let t = p
                .recv(a.count, wait, idle)
                .map_err(|e| CliError::failed("receive", e))?;
            Ok((local, t))
        })?,
        PathKind::Udp => {
            let sock = udp_socket(&a.listen.to_string())?;
            let local = a.listen.to_string();
            ready("sink", &local, c);
            let t = udp_stream_recv(&sock, a.count, wait, idle)
                .map_err(|e| CliError::failed("receive", e))?;
            (local, t)
        }
    };
    if t.messages == 0 {
        return Err(CliError::failed("receive", "nothing arrived"));
    }
    Ok(Report {
        tool: "sink",
        mode: mode(c),
        path: c.path,
        size: t.bytes.checked_div(t.messages).unwrap_or(0) as usize,
        count: a.count,
        local,
        peer: None,
        outcome: Outcome::Stream(t),
    })
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
        assert!(check_size(PathKind::User, 40).is_ok());
        assert!(check_size(PathKind::User, 41).is_err());
        assert!(check_size(PathKind::Udp, 100_000).is_err());
    }
}
