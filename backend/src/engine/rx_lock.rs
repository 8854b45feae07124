//! The lock around a channel's RX side ([`super::channel::RxSide`]).
//!
//! Workers hold it for a few ring operations, or for one DMA-data copy, and the worker that
//! delivers into a channel is usually the only one that ever takes it. A `std::sync::Mutex`
//! releases with an atomic swap (it must learn whether a waiter sleeps in the kernel), and on
//! x86 every locked instruction waits until all of the thread's earlier stores have reached the
//! cache. Just after a publish those stores are to lines the guest's core holds (the ring index,
//! the slot), so each release cost a cross-core round trip, twice per message and more.
//!
//! [`RxLock`] releases with a plain store instead (on x86 a `mov`, which waits for nothing).
//! The price is that waiters never sleep in the kernel: they spin for a while, then yield the
//! CPU between attempts. That suits a lock held for microseconds by threads that are already
//! polling; [`RxLock::try_lock`] lets a worker that holds one RX side take a second without
//! ever waiting for it (no lock-order deadlock between workers).

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

/// Spins before a waiter starts yielding its CPU.
const SPINS_BEFORE_YIELD: u32 = 64;

/// A mutual-exclusion lock whose release is a plain store (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct RxLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reached through an `RxGuard`, and at most one guard exists at a time
// (`locked` is taken with an Acquire compare-exchange and given back with a Release store), so
// sharing the lock between threads hands the value from one thread to another, which `T: Send`
// allows. This is the same bound as `std::sync::Mutex`'s.
unsafe impl<T: Send> Sync for RxLock<T> {}

impl<T> RxLock<T> {
    pub fn new(value: T) -> Self {
        RxLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock, spinning and then yielding while another thread holds it.
    pub fn lock(&self) -> RxGuard<'_, T> {
        let mut spins = 0u32;
        loop {
            if let Some(g) = self.try_lock() {
                return g;
            }
            // Wait with plain loads (no cache-line ping-pong) until it looks free.
            while self.locked.load(Ordering::Relaxed) {
                if spins < SPINS_BEFORE_YIELD {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Takes the lock if it is free; never waits.
    pub fn try_lock(&self) -> Option<RxGuard<'_, T>> {
        // Acquire: everything the previous holder wrote before its Release store is visible.
        self.locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            // Lazily: a guard made and dropped on failure would release the holder's lock.
            .then(|| RxGuard { lock: self })
    }
}

/// Access to the value of a held [`RxLock`]; dropping it releases the lock.
pub(crate) struct RxGuard<'a, T> {
    lock: &'a RxLock<T>,
}

impl<T> Deref for RxGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: this guard is the only one of its lock (see `RxLock`'s Sync impl), so nothing
        // else reaches the value while the guard lives.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for RxGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for RxGuard<'_, T> {
    fn drop(&mut self) {
        // Release: the next holder's Acquire sees every write made under the lock. A plain
        // store: it does not wait for earlier stores to reach the cache (see the module docs).
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn excludes_other_holders_and_hands_writes_over() {
        let lock = Arc::new(RxLock::new((0u64, 0u64)));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let mut g = lock.lock();
                        // Two writes that a second holder inside the section would tear apart.
                        g.0 += 1;
                        std::hint::spin_loop();
                        g.1 += 1;
                        assert_eq!(g.0, g.1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.lock(), (80_000, 80_000));
    }

    #[test]
    fn try_lock_fails_while_held_and_succeeds_after() {
        let lock = RxLock::new(1u32);
        let g = lock.lock();
        assert!(lock.try_lock().is_none());
        drop(g);
        let mut g = lock.try_lock().expect("free again");
        *g += 1;
        drop(g);
        assert_eq!(*lock.lock(), 2);
    }

    #[test]
    fn a_holder_that_panics_releases_the_lock() {
        let lock = Arc::new(RxLock::new(0u32));
        let l = lock.clone();
        let r = std::thread::spawn(move || {
            let _g = l.lock();
            panic!("holder dies");
        })
        .join();
        assert!(r.is_err());
        assert!(lock.try_lock().is_some());
    }
}
