//! Round trips and streaming over a bypass channel.

use std::time::{Duration, Instant};
use svnic_client::Completions;

use svnic_channels::{ChannelAddr, CompletionStatus, DataRef, Message};

use super::probe::{answer_probe, is_probe};
use super::stats::{LatencyStats, Throughput};
use super::MeasureError;
use svnic_client::channel::{Channel, ChannelError, Waiter};

/// Which message kind a ping uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PingKind {
    /// Inline payload (at most 40 bytes).
    UserData,
    /// Payload in the data area, copied by the engine into a posted buffer.
    DmaData,
}

fn recv_one(
    ch: &mut Channel,
    waiter: &dyn Waiter,
    timeout: Duration,
    buf: &mut Vec<Message>,
) -> Result<Message, MeasureError> {
    loop {
        if let Some(m) = buf.pop() {
            return Ok(m);
        }
        let n = ch.wait_poll(buf, 64, timeout, waiter)?;
        if n == 0 {
            return Err(MeasureError::TimedOut {
                during: "waiting for a message",
                waited: timeout,
                progress: "nothing received".into(),
            });
        }
        buf.reverse();
    }
}

/// The next message that is not a completion: Ok completions are skipped, any other completion
/// fails the measurement as `during`.
fn recv_data(
    ch: &mut Channel,
    waiter: &dyn Waiter,
    timeout: Duration,
    buf: &mut Vec<Message>,
    during: impl Fn() -> String,
) -> Result<Message, MeasureError> {
    loop {
        match recv_one(ch, waiter, timeout, buf)? {
            Message::Completion(c) if c.status == CompletionStatus::Ok => continue,
            Message::Completion(c) => {
                return Err(MeasureError::Completion {
                    during: during(),
                    status: c.status,
                })
            }
            m => return Ok(m),
        }
    }
}

/// Sends one message of `size` bytes (user-data: inline; DMA: from the start of the data area,
/// into a buffer the peer posted) and waits for the peer's reply, `count` times.
/// The reply of a DMA ping is a DMA message too; the initiator keeps one buffer posted.
pub fn channel_ping(
    ch: &mut Channel,
    peer: ChannelAddr,
    kind: PingKind,
    size: usize,
    count: usize,
    waiter: &dyn Waiter,
) -> Result<LatencyStats, MeasureError> {
    let data = ch.layout().data_offset;
    let (tx_buf, rx_buf) = (data, data + (1 << 20).min(ch.layout().data_len() / 2));
    let payload: Vec<u8> = (0..size).map(|i| i as u8).collect();
    if kind == PingKind::DmaData {
        ch.write_data(tx_buf, &payload)?;
    }
    let mut samples = Vec::with_capacity(count);
    let mut buf = Vec::new();
    for i in 0..count as u64 {
        if kind == PingKind::DmaData {
            ch.post_buffer(
                i,
                DataRef {
                    offset: rx_buf,
                    len: size.max(1) as u32,
                },
            )?;
        }
        let t0 = Instant::now();
        let queued = match kind {
            PingKind::UserData => ch.send_user(peer, i, &payload, Completions::OnError)?,
            PingKind::DmaData => ch.send_dma(
                peer,
                i,
                DataRef {
                    offset: tx_buf,
                    len: size.max(1) as u32,
                },
            )?,
        };
        if !queued {
            return Err(MeasureError::RingFull {
                ring: "TX",
                during: "during ping",
            });
        }
        ch.flush()?;
        recv_data(ch, waiter, Duration::from_secs(10), &mut buf, || {
            format!("ping {i}")
        })?;
        samples.push(t0.elapsed());
    }
    Ok(LatencyStats::from_samples(samples))
}

/// The echo half of [`channel_ping`]: replies to `count` messages with the same kind and size.
/// Probes ([`super::channel_probe`]) are answered and not counted.
pub fn channel_echo(
    ch: &mut Channel,
    kind: PingKind,
    count: usize,
    waiter: &dyn Waiter,
) -> Result<(), MeasureError> {
    let data = ch.layout().data_offset;
    let (tx_buf, rx_buf) = (data, data + (1 << 20).min(ch.layout().data_len() / 2));
    let mut buf = Vec::new();
    let mut posted = false;
    for i in 0..count as u64 {
        if kind == PingKind::DmaData && !posted {
            ch.post_buffer(
                i,
                DataRef {
                    offset: rx_buf,
                    len: (ch.layout().data_len() / 2) as u32,
                },
            )?;
            ch.flush()?;
            posted = true;
        }
        let m = loop {
            match recv_data(ch, waiter, Duration::from_secs(30), &mut buf, || {
                format!("echo {i}")
            })? {
                Message::UserData(u) if is_probe(&u) => answer_probe(ch, u.peer)?,
                m => break m,
            }
        };
        let queued = match m {
            Message::UserData(u) => {
                ch.send_user(u.peer, u.cookie, u.data(), Completions::OnError)?
            }
            Message::DmaData(d) => {
                posted = false;
                let mut tmp = vec![0u8; d.data.len as usize];
                ch.read_data(d.data.offset, &mut tmp)?;
                ch.write_data(tx_buf, &tmp)?;
                ch.send_dma(
                    d.peer,
                    d.cookie,
                    DataRef {
                        offset: tx_buf,
                        len: d.data.len,
                    },
                )?
            }
            _ => false,
        };
        if !queued {
            return Err(MeasureError::RingFull {
                ring: "TX",
                during: "during echo",
            });
        }
        ch.flush()?;
    }
    Ok(())
}

/// Sends user-data messages number `sent` up to `count` (the cookie is the number) to `peer`
/// while the TX ring takes them, then flushes once. Returns how many are sent in all.
#[inline]
fn send_user_batch(
    ch: &mut Channel,
    peer: ChannelAddr,
    payload: &[u8],
    mut sent: u64,
    count: u64,
) -> Result<u64, ChannelError> {
    while sent < count && ch.send_user(peer, sent, payload, Completions::OnError)? {
        sent += 1;
    }
    ch.flush()?;
    Ok(sent)
}

/// Polls up to 256 messages into `buf`; a stream asks for no completions, so any completion
/// among them is the error of a message sent (its status is the reason).
fn fail_on_completion(ch: &mut Channel, buf: &mut Vec<Message>) -> Result<(), MeasureError> {
    buf.clear();
    ch.poll(buf, 256)?;
    if let Some(Message::Completion(c)) = buf.iter().find(|m| matches!(m, Message::Completion(_))) {
        return Err(MeasureError::Completion {
            during: "stream".into(),
            status: c.status,
        });
    }
    Ok(())
}

/// How long [`channel_stream_send`] waits for the engine to take its messages.
const STREAM_DEADLINE: Duration = Duration::from_secs(120);

/// One turn of [`channel_stream_send`]'s waits for the engine: drains error completions (so that
/// a full RX ring never blocks the engine), fails as `during` once `deadline` passed, and lets
/// the engine worker (maybe on this very CPU) run.
fn stream_wait_turn(
    ch: &mut Channel,
    buf: &mut Vec<Message>,
    deadline: Instant,
    during: &'static str,
    progress: impl FnOnce() -> String,
) -> Result<(), MeasureError> {
    fail_on_completion(ch, buf)?;
    if Instant::now() > deadline {
        return Err(MeasureError::TimedOut {
            during,
            waited: STREAM_DEADLINE,
            progress: progress(),
        });
    }
    std::thread::yield_now();
    Ok(())
}

/// Streams `count` user-data messages of `size` bytes to `peer` as fast as the TX ring allows,
/// flushing once per batch. Returns when the engine has taken every message from the TX ring
/// (delivered, or an error completion came back), so that the channel may be destroyed.
pub fn channel_stream_send(
    ch: &mut Channel,
    peer: ChannelAddr,
    size: usize,
    count: u64,
) -> Result<(), MeasureError> {
    let payload = vec![0x5au8; size.min(svnic_channels::message::INLINE_CAPACITY)];
    let mut sent = 0u64;
    let mut buf = Vec::new();
    let deadline = Instant::now() + STREAM_DEADLINE;
    while sent < count {
        sent = send_user_batch(ch, peer, &payload, sent, count)?;
        stream_wait_turn(
            ch,
            &mut buf,
            deadline,
            "stream: the TX ring stayed full",
            || format!("{sent} of {count} sent"),
        )?;
    }
    let ring = ch.layout().ring_size;
    while ch.tx_free()? < ring {
        stream_wait_turn(
            ch,
            &mut buf,
            deadline,
            "stream: the engine stopped taking messages",
            || format!("{sent} of {count} sent"),
        )?;
    }
    Ok(())
}

/// Receives `count` messages; the clock starts at the first one. Probes are answered and not
/// counted. Fails if nothing arrives for 30 s (before the first) or 10 s (after).
pub fn channel_stream_recv(
    ch: &mut Channel,
    count: u64,
    waiter: &dyn Waiter,
) -> Result<Throughput, MeasureError> {
    let mut buf = Vec::with_capacity(256);
    let mut got = 0u64;
    let mut bytes = 0u64;
    let mut start = None;
    let mut last = Instant::now();
    while got < count {
        buf.clear();
        let n = if start.is_none() {
            ch.wait_poll(&mut buf, 256, Duration::from_secs(30), waiter)?
        } else {
            ch.poll(&mut buf, 256)?
        };
        if n == 0 && start.is_none() {
            return Err(MeasureError::TimedOut {
                during: "stream: waiting for the first message",
                waited: Duration::from_secs(30),
                progress: format!("0 of {count} received"),
            });
        }
        if n == 0 {
            if last.elapsed() > Duration::from_secs(10) {
                return Err(MeasureError::TimedOut {
                    during: "stream stalled",
                    waited: Duration::from_secs(10),
                    progress: format!("{got} of {count} received"),
                });
            }
            // Nothing yet: give the CPU to the engine worker and the sender.
            std::thread::yield_now();
        } else {
            last = Instant::now();
        }
        for m in &buf {
            match m {
                Message::UserData(u) if is_probe(u) => answer_probe(ch, u.peer)?,
                Message::UserData(u) => {
                    start.get_or_insert_with(Instant::now);
                    got += 1;
                    bytes += u64::from(u.len);
                }
                _ => {}
            }
        }
    }
    Ok(Throughput {
        messages: got,
        bytes,
        elapsed: start.map_or(Duration::ZERO, |s| s.elapsed()),
    })
}

/// Ping-pong between two channels driven by one thread (both guests' polling loops on one CPU):
/// `a` sends `size` bytes to `b`, `b` replies, `count` times. With no context switch on the way,
/// this measures the data path itself: ring writes, the engine worker's polling and delivery.
pub fn channel_ping_local(
    a: &mut Channel,
    b: &mut Channel,
    kind: PingKind,
    size: usize,
    count: usize,
) -> Result<LatencyStats, MeasureError> {
    let (a_addr, b_addr) = (a.addr(), b.addr());
    let payload: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let (ta, tb) = (a.layout().data_offset, b.layout().data_offset);
    let (ra, rb) = (
        ta + (1 << 20).min(a.layout().data_len() / 2),
        tb + (1 << 20).min(b.layout().data_len() / 2),
    );
    let len = size.max(1) as u32;
    if kind == PingKind::DmaData {
        a.write_data(ta, &payload)?;
        b.write_data(tb, &payload)?;
    }
    let mut samples = Vec::with_capacity(count);
    let (mut ba, mut bb) = (Vec::new(), Vec::new());
    for i in 0..count as u64 {
        if kind == PingKind::DmaData {
            a.post_buffer(i, DataRef { offset: ra, len })?;
            b.post_buffer(i, DataRef { offset: rb, len })?;
            a.flush()?;
            b.flush()?;
        }
        let t0 = Instant::now();
        let queued = match kind {
            PingKind::UserData => a.send_user(b_addr, i, &payload, Completions::OnError)?,
            PingKind::DmaData => a.send_dma(b_addr, i, DataRef { offset: ta, len })?,
        };
        if !queued {
            return Err(MeasureError::RingFull {
                ring: "TX",
                during: "during ping",
            });
        }
        a.flush()?;
        let deadline = t0 + Duration::from_secs(10);
        let mut replied = false;
        loop {
            if !replied {
                bb.clear();
                b.poll(&mut bb, 8)?;
                if bb
                    .iter()
                    .any(|m| matches!(m, Message::UserData(_) | Message::DmaData(_)))
                {
                    match kind {
                        PingKind::UserData => {
                            b.send_user(a_addr, i, &payload, Completions::OnError)?
                        }
                        PingKind::DmaData => b.send_dma(a_addr, i, DataRef { offset: tb, len })?,
                    };
                    b.flush()?;
                    replied = true;
                }
            }
            ba.clear();
            a.poll(&mut ba, 8)?;
            if ba
                .iter()
                .any(|m| matches!(m, Message::UserData(_) | Message::DmaData(_)))
            {
                break;
            }
            if let Some(Message::Completion(c)) = ba
                .iter()
                .chain(bb.iter())
                .find(|m| matches!(m, Message::Completion(c) if c.status != CompletionStatus::Ok))
            {
                return Err(MeasureError::Completion {
                    during: format!("ping {i}"),
                    status: c.status,
                });
            }
            if Instant::now() > deadline {
                return Err(MeasureError::TimedOut {
                    during: "ping: waiting for the reply",
                    waited: Duration::from_secs(10),
                    progress: format!("{i} of {count} answered"),
                });
            }
        }
        samples.push(t0.elapsed());
    }
    Ok(LatencyStats::from_samples(samples))
}

/// Streams `count` user-data messages from `a` to `b` with one thread driving both (send a
/// batch, receive what arrived); the clock runs from the first send to the last receive.
pub fn channel_stream_local(
    a: &mut Channel,
    b: &mut Channel,
    count: u64,
) -> Result<Throughput, MeasureError> {
    let dest = b.addr();
    let payload = [0x5au8; svnic_channels::message::INLINE_CAPACITY];
    let (mut sent, mut got, mut bytes) = (0u64, 0u64, 0u64);
    let mut buf = Vec::with_capacity(512);
    let start = Instant::now();
    let deadline = start + Duration::from_secs(120);
    while got < count {
        sent = send_user_batch(a, dest, &payload, sent, count)?;
        buf.clear();
        b.poll(&mut buf, 512)?;
        for m in &buf {
            if let Message::UserData(u) = m {
                got += 1;
                bytes += u64::from(u.len);
            }
        }
        if Instant::now() > deadline {
            return Err(MeasureError::TimedOut {
                during: "stream stalled",
                waited: Duration::from_secs(120),
                progress: format!("{got} of {count} received"),
            });
        }
    }
    Ok(Throughput {
        messages: got,
        bytes,
        elapsed: start.elapsed(),
    })
}
