//! Ring throughput: 64-byte messages through a [`Producer`] / [`Consumer`] pair over shared
//! memory, the way the engine and a client drive a channel's rings.
//!
//! - `ring/single_thread/batch=N`: one thread pushes N messages, publishes, then pops the N and
//!   releases (one index store per side per batch). Measures the per-message cost of slot writes,
//!   slot reads and index validation without any cache-line transfer between cores.
//! - `ring/two_threads`: a producer thread and a consumer thread on the same TX ring, each
//!   publishing / releasing per batch of up to 32: messages per second across two cores.
//!
//! Run with `cargo bench -p svnic-channels --bench ring`.
#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use svnic_channels::{
    ChannelAddr, ChannelLayout, Consumer, Message, Producer, RawMessage, RingKind, SharedRegion,
    UserData,
};
use vm_memory::{GuestAddress, GuestMemoryMmap};

/// A default channel region (256 slots, 2 MiB) in its own anonymous mapping, initialised.
fn region() -> (SharedRegion, ChannelLayout) {
    let layout = ChannelLayout::default_layout();
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), layout.region_len as usize)])
        .unwrap();
    let r =
        SharedRegion::from_guest_memory(std::sync::Arc::new(mem), 0, layout.region_len).unwrap();
    r.channel(layout).unwrap().init_header(0, 0, None).unwrap();
    (r, layout)
}

fn message(i: u64) -> RawMessage {
    Message::UserData(UserData::new(ChannelAddr::default(), i, &[0x5a; 40]).unwrap()).encode()
}

fn single_thread(c: &mut Criterion) {
    let (r, layout) = region();
    let mem = r.channel(layout).unwrap();
    let msg = message(7);
    let mut g = c.benchmark_group("ring/single_thread");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    for batch in [1u32, 32, 256] {
        // Fresh indices for every batch size (the previous one left them far along).
        mem.init_header(0, 0, None).unwrap();
        let mut p = Producer::new(RingKind::Tx, &layout);
        let mut cons = Consumer::new(RingKind::Tx, &layout);
        g.throughput(Throughput::Elements(u64::from(batch)));
        g.bench_function(BenchmarkId::new("batch", batch), |b| {
            b.iter(|| {
                p.free(&mem).unwrap();
                for _ in 0..batch {
                    p.push(&mem, &msg).unwrap();
                }
                p.publish(&mem).unwrap();
                let n = cons.available(&mem).unwrap();
                for _ in 0..n {
                    black_box(cons.pop(&mem).unwrap());
                }
                cons.release(&mem).unwrap();
            })
        });
    }
    g.finish();
}

/// The number of CPUs the process may use, counted once, before any thread pinned itself (a
/// pinned thread's own count, and that of the threads it spawns, is 1).
fn ncpu() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Pins the calling thread to `cpu` (if the machine has it), so that producer and consumer run
/// on two different cores, as a guest and the engine do.
fn pin_to(cpu: usize) {
    if cpu >= ncpu() {
        return;
    }
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: CPU_SET writes inside `set`; cpu < ncpu < CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: pid 0 is the calling thread; `set` is valid for its size.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        eprintln!(
            "could not pin to cpu {cpu}: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Sends `n` messages from a producer thread to the calling thread; returns the consumer's time
/// from start to the last message.
fn two_thread_run(r: &SharedRegion, layout: ChannelLayout, n: u64) -> Duration {
    let r2 = r.clone();
    // Fresh indices for every run: re-initialise the header (both ends start at 0).
    r.channel(layout).unwrap().init_header(0, 0, None).unwrap();
    std::thread::scope(|s| {
        s.spawn(move || {
            pin_to(0);
            let mem = r2.channel(layout).unwrap();
            let mut p = Producer::new(RingKind::Tx, &layout);
            let mut sent = 0u64;
            while sent < n {
                let room = u64::from(p.free(&mem).unwrap()).min(32).min(n - sent);
                for i in 0..room {
                    p.push(&mem, &message(sent + i)).unwrap();
                }
                sent += room;
                p.publish(&mem).unwrap();
                if room == 0 {
                    std::hint::spin_loop();
                }
            }
        });
        pin_to(1);
        let mem = r.channel(layout).unwrap();
        let mut cons = Consumer::new(RingKind::Tx, &layout);
        let start = Instant::now();
        let mut got = 0u64;
        while got < n {
            let avail = cons.available(&mem).unwrap();
            for _ in 0..avail.min(32) {
                let m = cons.pop(&mem).unwrap().unwrap();
                debug_assert_eq!(m.cookie(), got);
                got += 1;
            }
            cons.release(&mem).unwrap();
            if avail == 0 {
                std::hint::spin_loop();
            }
        }
        start.elapsed()
    })
}

fn two_threads(c: &mut Criterion) {
    ncpu();
    let (r, layout) = region();
    let mut g = c.benchmark_group("ring");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    g.throughput(Throughput::Elements(1));
    g.bench_function("two_threads", |b| {
        b.iter_custom(|iters| two_thread_run(&r, layout, iters))
    });
    g.finish();
}

criterion_group!(benches, single_thread, two_threads);
criterion_main!(benches);
