//! Streaming DMA-data between two channels: the sender keeps a window of buffers in flight (a
//! buffer is reused when its completion comes back), the receiver keeps buffers posted (each
//! posted again as soon as it was filled).

use std::time::{Duration, Instant};

use svnic_channels::{ChannelAddr, CompletionStatus, DataRef, Message};

use super::probe::{answer_probe, is_probe, PROBE_COOKIE};
use super::stats::Throughput;
use super::MeasureError;
use svnic_client::channel::{Channel, Waiter};

/// Most buffers in flight (sender) or posted (receiver).
const WINDOW: u64 = 64;
/// Longest wait for the next completion or message once a stream runs.
const STALL: Duration = Duration::from_secs(10);

/// `(slots, size)` for buffers of `size` bytes in the data area, at most [`WINDOW`] and at most
/// the ring size.
fn slots(ch: &Channel, size: usize) -> Result<(u64, u32), MeasureError> {
    let data_len = ch.layout().data_len();
    let size_error = MeasureError::DmaSize { size, data_len };
    let size = u32::try_from(size.max(1)).map_err(|_| size_error)?;
    let n = (data_len / u64::from(size))
        .min(WINDOW)
        .min(u64::from(ch.layout().ring_size));
    if n == 0 {
        return Err(MeasureError::DmaSize {
            size: size as usize,
            data_len,
        });
    }
    Ok((n, size))
}

/// Streams `count` DMA-data messages of `size` bytes to `peer` (which must keep buffers of at
/// least `size` bytes posted) and returns once every completion came back: everything was
/// delivered.
pub fn channel_dma_stream_send(
    ch: &mut Channel,
    peer: ChannelAddr,
    size: usize,
    count: u64,
    waiter: &dyn Waiter,
) -> Result<(), MeasureError> {
    let (n, size) = slots(ch, size)?;
    let base = ch.layout().data_offset;
    let payload = vec![0xa5u8; size as usize];
    for slot in 0..n {
        ch.write_data(base + slot * u64::from(size), &payload)?;
    }
    let mut free: Vec<u64> = (0..n).rev().collect();
    let (mut sent, mut done) = (0u64, 0u64);
    let mut buf = Vec::with_capacity(256);
    while done < count {
        let mut queued = false;
        while sent < count {
            let Some(&slot) = free.last() else { break };
            let buf_ref = DataRef {
                offset: base + slot * u64::from(size),
                len: size,
            };
            if !ch.send_dma(peer, slot, buf_ref)? {
                break;
            }
            free.pop();
            sent += 1;
            queued = true;
        }
        if queued {
            ch.flush()?;
        }
        buf.clear();
        let blocked = free.is_empty() || sent == count;
        let got = if blocked {
            ch.wait_poll(&mut buf, 256, STALL, waiter)?
        } else {
            ch.poll(&mut buf, 256)?
        };
        if got == 0 && blocked {
            return Err(MeasureError::TimedOut {
                during: "DMA stream: waiting for a completion",
                waited: STALL,
                progress: format!("{done} of {count} done"),
            });
        }
        for m in &buf {
            let Message::Completion(c) = m else { continue };
            if c.cookie == PROBE_COOKIE {
                continue;
            }
            if c.status != CompletionStatus::Ok {
                return Err(MeasureError::Completion {
                    during: format!("DMA stream: message {done}"),
                    status: c.status,
                });
            }
            if c.cookie >= n {
                return Err(MeasureError::UnknownBuffer {
                    during: "DMA stream",
                    what: "completion",
                    cookie: c.cookie,
                });
            }
            free.push(c.cookie);
            done += 1;
        }
    }
    Ok(())
}

/// Receives `count` DMA-data messages into posted buffers of `size` bytes, waiting up to
/// `first_within` for the first; the clock runs from the first to the last. Probes are
/// answered, not counted.
pub fn channel_dma_stream_recv(
    ch: &mut Channel,
    count: u64,
    size: usize,
    first_within: Duration,
    waiter: &dyn Waiter,
) -> Result<Throughput, MeasureError> {
    let (n, size) = slots(ch, size)?;
    let base = ch.layout().data_offset;
    for slot in 0..n {
        let posted = ch.post_buffer(
            slot,
            DataRef {
                offset: base + slot * u64::from(size),
                len: size,
            },
        )?;
        if !posted {
            return Err(MeasureError::RingFull {
                ring: "posted-buffer",
                during: "posting the DMA stream's buffers",
            });
        }
    }
    ch.flush()?;
    let (mut got, mut bytes) = (0u64, 0u64);
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let mut buf = Vec::with_capacity(256);
    while got < count {
        buf.clear();
        let wait = if first.is_some() { STALL } else { first_within };
        if ch.wait_poll(&mut buf, 256, wait, waiter)? == 0 {
            return Err(MeasureError::TimedOut {
                during: "DMA stream: waiting for data",
                waited: wait,
                progress: format!("{got} of {count} received"),
            });
        }
        let mut reposted = false;
        for m in &buf {
            match m {
                Message::DmaData(d) => {
                    if d.cookie >= n {
                        return Err(MeasureError::UnknownBuffer {
                            during: "DMA stream",
                            what: "data",
                            cookie: d.cookie,
                        });
                    }
                    first.get_or_insert_with(Instant::now);
                    last = Instant::now();
                    got += 1;
                    bytes += u64::from(d.data.len);
                    let again = DataRef {
                        offset: base + d.cookie * u64::from(size),
                        len: size,
                    };
                    if !ch.post_buffer(d.cookie, again)? {
                        return Err(MeasureError::RingFull {
                            ring: "posted-buffer",
                            during: "reposting a DMA stream buffer",
                        });
                    }
                    reposted = true;
                }
                Message::UserData(u) if is_probe(u) => answer_probe(ch, u.peer)?,
                Message::Completion(c) if c.status != CompletionStatus::Ok => {
                    return Err(MeasureError::Completion {
                        during: "DMA stream".into(),
                        status: c.status,
                    });
                }
                _ => {}
            }
        }
        if reposted {
            ch.flush()?;
        }
    }
    Ok(Throughput {
        messages: got,
        bytes,
        elapsed: first.map_or(Duration::ZERO, |f| last.duration_since(f)),
    })
}
