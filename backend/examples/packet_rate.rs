//! Frames per second through the uplink's packet socket, one `send()` per batch of B frames
//! against one per frame, across a veth cable between two network namespaces (as root):
//!
//!     cargo run -p svnic-backend --example packet_rate [FRAMES] [FRAME_LEN]
//!
//! Host B queues FRAMES svnic data frames of FRAME_LEN bytes (default 200000 of 64) and
//! flushes every B frames; a thread on host A drains its RX ring. Prints, per B, over three
//! runs: the median and best rate at which host B sent, the median CPU time of the sending
//! thread per frame (less sensitive than the rate to other load on the machine), and the
//! smallest share of frames host A received.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use svnic_backend::uplink::packet::{PacketConfig, PacketError, PacketSocket};
use svnic_tests::netns::{veth_pair, NetNs};

fn main() {
    let mut args = std::env::args().skip(1);
    let frames: u64 = args.next().map_or(200_000, |a| a.parse().unwrap());
    let len: usize = args.next().map_or(64, |a| a.parse().unwrap());
    let a = NetNs::unique("svnic-rate").unwrap();
    let b = NetNs::unique("svnic-rate").unwrap();
    veth_pair(&a, "rate-a", &b, "rate-b").unwrap();
    let mut frame = vec![0u8; len.max(26)];
    frame[..6].copy_from_slice(&[0x52, 0x54, 0x00, 0xe9, 0, 2]);
    frame[6..12].copy_from_slice(&[0x52, 0x54, 0x00, 0xe9, 0, 1]);
    frame[12..16].copy_from_slice(&[0x88, 0xB5, 1, 3]);

    println!(
        "frames {frames} of {len} bytes\nbatch  frames/s median  frames/s best  CPU ns/frame  received"
    );
    for batch in [1u64, 4, 16, 64, 256] {
        let mut runs: Vec<Run> = (0..3).map(|_| run(&a, &b, &frame, frames, batch)).collect();
        let received = runs.iter().map(|r| r.received).fold(1.0, f64::min);
        runs.sort_by(|x, y| x.cpu_ns.total_cmp(&y.cpu_ns));
        let cpu_ns = runs[1].cpu_ns;
        runs.sort_by(|x, y| x.rate.total_cmp(&y.rate));
        println!(
            "{batch:>5} {:>15.0} {:>14.0} {cpu_ns:>13.0} {received:>9.3}",
            runs[1].rate, runs[2].rate
        );
    }
}

struct Run {
    /// Frames sent per second.
    rate: f64,
    /// CPU time of the sending thread per frame, in nanoseconds.
    cpu_ns: f64,
    /// Share of the frames received.
    received: f64,
}

fn thread_cpu() -> Duration {
    // SAFETY: timespec is plain data; all zeros is a valid value.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime writes one timespec into `ts`, a live local.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn run(a: &NetNs, b: &NetNs, frame: &[u8], frames: u64, batch: u64) -> Run {
    {
        let cfg = PacketConfig {
            rx_frames: 4096,
            tx_frames: 1024,
            ..PacketConfig::default()
        };
        let mut rx = a
            .run_in(|| PacketSocket::open("rate-a", &cfg))
            .unwrap()
            .unwrap();
        let mut tx = b
            .run_in(|| PacketSocket::open("rate-b", &cfg))
            .unwrap()
            .unwrap();
        let received = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let drain = {
            let (received, stop) = (received.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let n = rx.receive(256, |f| {
                        if f.get(6..12) == Some(&[0x52, 0x54, 0x00, 0xe9, 0, 1][..]) {
                            received.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                    if n == 0 {
                        std::thread::yield_now();
                    }
                }
            })
        };
        let start = Instant::now();
        let cpu_start = thread_cpu();
        let mut sent = 0u64;
        while sent < frames {
            let mut queued = 0;
            while queued < batch && sent + queued < frames {
                match tx.queue(frame) {
                    Ok(()) => queued += 1,
                    Err(PacketError::Full) => break,
                    Err(e) => panic!("{e}"),
                }
            }
            tx.flush().unwrap();
            sent += queued;
        }
        let elapsed = start.elapsed();
        let cpu = thread_cpu() - cpu_start;
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, Ordering::Relaxed);
        drain.join().unwrap();
        let got = received.load(Ordering::Relaxed);
        Run {
            rate: frames as f64 / elapsed.as_secs_f64(),
            cpu_ns: cpu.as_nanos() as f64 / frames as f64,
            received: got as f64 / frames as f64,
        }
    }
}
