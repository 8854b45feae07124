//! Round trips and streaming over plain virtio-net frames (the path the guest kernel would use),
//! for comparison with the bypass channel.

use std::time::{Duration, Instant};

use svnic_channels::MacAddr;

use super::stats::{LatencyStats, Throughput};

/// EtherType of benchmark frames (IEEE local experimental 2; not svnic's, so they are switched).
pub const BENCH_ETHERTYPE: u16 = 0x88b6;
/// Sequence number of probe frames: answered by [`frame_echo`] and [`frame_stream_recv`], never
/// counted (see [`frame_probe`]).
pub const PROBE_SEQ: u64 = u64::MAX;

/// A virtio-net port as the benchmarks need it.
pub trait FramePort {
    /// Error type.
    type Error: std::error::Error + Send + Sync + 'static;
    /// This port's MAC.
    fn mac(&self) -> MacAddr;
    /// Queues a frame; false if the TX ring is full.
    fn send(&mut self, frame: &[u8]) -> Result<bool, Self::Error>;
    /// Publishes queued frames and notifies the device (once per batch).
    fn flush(&mut self) -> Result<(), Self::Error>;
    /// Appends received frames to `out`; returns how many.
    fn recv(&mut self, out: &mut Vec<Vec<u8>>) -> Result<usize, Self::Error>;
    /// Blocks until the device signals or `timeout` passes (the interrupt path).
    fn wait(&mut self, timeout: Duration) -> Result<(), Self::Error>;
}

fn frame(dst: MacAddr, src: MacAddr, seq: u64, size: usize) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + size.max(8));
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&BENCH_ETHERTYPE.to_be_bytes());
    f.extend_from_slice(&seq.to_le_bytes());
    f.resize(14 + size.max(8), 0xa5);
    f
}

/// Sends a probe frame to `peer` every 200 ms until one comes back (the peer's echo or sink
/// runs) or `within` passes. True if the peer answered.
pub fn frame_probe<P: FramePort>(
    p: &mut P,
    peer: MacAddr,
    within: Duration,
) -> Result<bool, P::Error> {
    let deadline = Instant::now() + within;
    let mut buf = Vec::new();
    loop {
        let f = frame(peer, p.mac(), PROBE_SEQ, 8);
        p.send(&f)?;
        p.flush()?;
        let round = Instant::now() + Duration::from_millis(200);
        while Instant::now() < round {
            buf.clear();
            if p.recv(&mut buf)? == 0 {
                p.wait(Duration::from_millis(20))?;
                continue;
            }
            if buf.iter().any(|f| seq_of(f) == Some(PROBE_SEQ)) {
                return Ok(true);
            }
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
    }
}

/// Returns a probe frame to its sender.
fn answer_probe<P: FramePort>(p: &mut P, mut f: Vec<u8>) -> Result<(), P::Error> {
    let (dst, src) = (f[6..12].to_vec(), p.mac());
    f[0..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src.0);
    p.send(&f)?;
    p.flush()
}

fn seq_of(f: &[u8]) -> Option<u64> {
    if f.len() < 22 || f[12..14] != BENCH_ETHERTYPE.to_be_bytes() {
        return None;
    }
    let mut b = [0u8; 8];
    b.copy_from_slice(&f[14..22]);
    Some(u64::from_le_bytes(b))
}

/// The next benchmark frame (not a probe). Probes that arrive are answered when
/// `answer_probes` (echo side) and dropped otherwise (a late answer to our own probe).
fn recv_bench<P: FramePort>(
    p: &mut P,
    timeout: Duration,
    buf: &mut Vec<Vec<u8>>,
    answer_probes: bool,
) -> Result<Option<Vec<u8>>, P::Error> {
    let deadline = Instant::now() + timeout;
    loop {
        while let Some(f) = buf.pop() {
            match seq_of(&f) {
                Some(PROBE_SEQ) if answer_probes => answer_probe(p, f)?,
                Some(PROBE_SEQ) | None => {}
                Some(_) => return Ok(Some(f)),
            }
        }
        if p.recv(buf)? > 0 {
            buf.reverse();
            continue;
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        p.wait(deadline - now)?;
    }
}

/// Ping-pong of frames with a `size`-byte payload to `peer`, `count` times, waiting on the
/// device's interrupt (call eventfd) like a guest kernel. `Ok(None)` if a reply never came.
pub fn frame_ping<P: FramePort>(
    p: &mut P,
    peer: MacAddr,
    size: usize,
    count: usize,
) -> Result<Option<LatencyStats>, P::Error> {
    let mut samples = Vec::with_capacity(count);
    let mut buf = Vec::new();
    for i in 0..count as u64 {
        let f = frame(peer, p.mac(), i, size);
        let t0 = Instant::now();
        while !p.send(&f)? {
            p.flush()?;
        }
        p.flush()?;
        match recv_bench(p, Duration::from_secs(10), &mut buf, false)? {
            Some(_) => samples.push(t0.elapsed()),
            None => return Ok(None),
        }
    }
    Ok(Some(LatencyStats::from_samples(samples)))
}

/// The echo half of [`frame_ping`]: returns each benchmark frame to its sender (probes too,
/// without counting them).
pub fn frame_echo<P: FramePort>(p: &mut P, count: usize) -> Result<usize, P::Error> {
    let mut buf = Vec::new();
    let mut echoed = 0;
    while echoed < count {
        let Some(mut f) = recv_bench(p, Duration::from_secs(30), &mut buf, true)? else {
            break;
        };
        let (dst, src) = (f[6..12].to_vec(), p.mac());
        f[0..6].copy_from_slice(&dst);
        f[6..12].copy_from_slice(&src.0);
        while !p.send(&f)? {
            p.flush()?;
        }
        p.flush()?;
        echoed += 1;
    }
    Ok(echoed)
}

/// Streams `count` frames with a `size`-byte payload to `peer`, flushing per batch.
pub fn frame_stream_send<P: FramePort>(
    p: &mut P,
    peer: MacAddr,
    size: usize,
    count: u64,
) -> Result<(), P::Error> {
    let mut sent = 0;
    while sent < count {
        let mut batch = 0;
        while sent < count && batch < 64 && p.send(&frame(peer, p.mac(), sent, size))? {
            sent += 1;
            batch += 1;
        }
        p.flush()?;
        if batch == 0 {
            std::thread::yield_now();
        }
    }
    Ok(())
}

/// Receives benchmark frames until `count` arrived or nothing came for `idle`; the clock runs
/// from the first to the last frame. Frames lost on the way (a full queue drops) show as fewer
/// messages than sent.
pub fn frame_stream_recv<P: FramePort>(
    p: &mut P,
    count: u64,
    idle: Duration,
) -> Result<Throughput, P::Error> {
    frame_stream_recv_within(p, count, idle, idle)
}

/// [`frame_stream_recv`] that waits up to `first_within` for the first frame (the sender may
/// start later), then stops when nothing came for `idle`. Probes are answered, not counted.
pub fn frame_stream_recv_within<P: FramePort>(
    p: &mut P,
    count: u64,
    first_within: Duration,
    idle: Duration,
) -> Result<Throughput, P::Error> {
    let mut buf = Vec::new();
    let (mut got, mut bytes) = (0u64, 0u64);
    let mut first = None;
    let mut last = Instant::now();
    while got < count {
        buf.clear();
        if p.recv(&mut buf)? == 0 {
            let limit = if first.is_some() { idle } else { first_within };
            if last.elapsed() > limit {
                break;
            }
            p.wait(Duration::from_millis(10))?;
            continue;
        }
        for f in std::mem::take(&mut buf) {
            if seq_of(&f) == Some(PROBE_SEQ) {
                answer_probe(p, f)?;
                continue;
            }
            if seq_of(&f).is_some() {
                first.get_or_insert_with(Instant::now);
                got += 1;
                bytes += (f.len() - 14) as u64;
                last = Instant::now();
            }
        }
    }
    let elapsed = first.map_or(Duration::ZERO, |f| last.duration_since(f));
    Ok(Throughput {
        messages: got,
        bytes,
        elapsed,
    })
}
