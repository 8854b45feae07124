//! Two threads, one ring, millions of messages: no loss, no duplication, no reordering, and the
//! producer never overwrites a slot the consumer has not released. Also exercises the
//! sleeping-flag handshake: the consumer sleeps when idle, the producer wakes it only when it
//! sees the flag, and no wakeup is lost.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use svnic_channels::layout::header;
use svnic_channels::{
    ChannelLayout, ChannelMem, Consumer, Message, Producer, RingKind, SharedRegion, UserData,
};

fn shared_region(len: usize) -> SharedRegion {
    let buf: Arc<Vec<std::sync::atomic::AtomicU64>> = Arc::new(
        (0..len / 8)
            .map(|_| std::sync::atomic::AtomicU64::new(0))
            .collect(),
    );
    let ptr = buf.as_ptr() as *mut u8;
    // SAFETY: the Vec of atomics (interior mutability, so writes through this pointer are allowed)
    // lives as long as the region's keep-alive (the Arc) and is accessed only via VolatileSlice.
    unsafe { SharedRegion::new(ptr, len, buf) }
}

/// A one-slot "doorbell": the producer rings it, the consumer waits on it.
#[derive(Default)]
struct Bell {
    rung: Mutex<bool>,
    cv: Condvar,
}

impl Bell {
    fn ring(&self) {
        *self.rung.lock().unwrap() = true;
        self.cv.notify_one();
    }
    fn wait(&self, timeout: Duration) -> bool {
        let g = self.rung.lock().unwrap();
        let (mut g, r) = self.cv.wait_timeout_while(g, timeout, |r| !*r).unwrap();
        *g = false;
        !r.timed_out()
    }
}

#[test]
fn two_threads_millions_of_messages_in_order_with_sleep_and_wake() {
    let total: u64 = if cfg!(debug_assertions) {
        2_000_000
    } else {
        20_000_000
    };
    let layout = ChannelLayout::new(256, 2 << 20).unwrap();
    let region = shared_region(2 << 20);
    region
        .channel(layout)
        .unwrap()
        .init_header(1, 0, None)
        .unwrap();
    let bell = Arc::new(Bell::default());
    let done = Arc::new(AtomicBool::new(false));

    let consumer = {
        let (region, bell, done) = (region.clone(), bell.clone(), done.clone());
        std::thread::spawn(move || {
            let mem = ChannelMem::new(region.slice(), layout).unwrap();
            let mut c = Consumer::new(RingKind::Tx, &layout);
            let mut next = 0u64;
            let mut sleeps = 0u64;
            let mut idle = 0u32;
            while next < total {
                let n = c.available(&mem).unwrap();
                if n == 0 {
                    idle += 1;
                    if idle < 64 {
                        std::hint::spin_loop();
                        continue;
                    }
                    // Advertise sleeping, re-check, then block: the lost-wakeup-free handshake.
                    mem.set_sleeping(header::ENGINE_SLEEPING, true);
                    if c.available(&mem).unwrap() == 0 {
                        sleeps += 1;
                        assert!(
                            bell.wait(Duration::from_secs(20)),
                            "wakeup lost at message {next}"
                        );
                    }
                    mem.set_sleeping(header::ENGINE_SLEEPING, false);
                    idle = 0;
                    continue;
                }
                idle = 0;
                for _ in 0..n {
                    let raw = c.pop(&mem).unwrap().unwrap();
                    assert_eq!(raw.cookie(), next, "lost, duplicated or reordered");
                    let Ok(Message::UserData(u)) = raw.decode() else {
                        panic!("corrupt slot")
                    };
                    assert_eq!(u.data(), &next.to_le_bytes(), "payload torn");
                    next += 1;
                }
                c.release(&mem).unwrap();
            }
            done.store(true, Ordering::Release);
            sleeps
        })
    };

    let mem = ChannelMem::new(region.slice(), layout).unwrap();
    let mut p = Producer::new(RingKind::Tx, &layout);
    let mut sent = 0u64;
    let mut rings = 0u64;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let deadline = Instant::now() + Duration::from_secs(120);
    while sent < total {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let batch = (rng % 300) as u32 + 1;
        let free = p.free(&mem).unwrap();
        for _ in 0..batch.min(free) {
            if sent == total {
                break;
            }
            let m = Message::UserData(
                UserData::new(Default::default(), sent, &sent.to_le_bytes()).unwrap(),
            );
            assert!(p.push(&mem, &m.encode()).unwrap());
            sent += 1;
        }
        p.publish(&mem).unwrap();
        if mem.peer_sleeping(header::ENGINE_SLEEPING) {
            rings += 1;
            bell.ring();
        }
        // Now and then go quiet so that the consumer falls asleep.
        if rng % 512 == 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
        assert!(Instant::now() < deadline, "producer stuck");
    }
    let sleeps = consumer.join().unwrap();
    assert!(done.load(Ordering::Acquire));
    assert!(
        sleeps > 0 && rings > 0,
        "the sleep/wake path was exercised ({sleeps} sleeps, {rings} rings)"
    );
}
