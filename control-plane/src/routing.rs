//! The routing table: (destination MAC, endpoint) -> (channel id, engine payload).
//!
//! Data-path readers never wait for the control path. The table is a copy-on-write snapshot behind
//! an [`ArcSwap`]: a reader loads the current [`RoutingSnapshot`] without taking any lock and keeps
//! looking up in it for as long as it likes; a writer (serialised by a writer mutex that readers
//! never touch) copies the current map, changes the copy and swaps it in. A reader therefore sees
//! either the whole old table or the whole new one, never a half-applied change.
//!
//! Every change increases the generation by one. A worker can keep its last snapshot and call
//! [`RoutingTable::refresh`] once per batch: one atomic load when nothing changed.
//!
//! A route removed by [`RoutingTable::unbind`] can still be found in snapshots that readers loaded
//! before; [`RemovedRoute::generation`] is the first generation without it. Whoever tears the
//! channel down must wait until every reader has moved to that generation (or make the payload
//! itself refuse work) before releasing the channel's memory.
//!
//! Lookups hash with the local [`crate::fast_hash`] (FxHash-style, not flood-resistant). The keys
//! that get *inserted* are chosen by guests, but each guest binds at most its policy's
//! `max_channels` addresses, so the collisions a hostile guest can build, and hence the probe
//! length of any lookup (even of a key a remote host picked), are bounded by the quotas.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::{ArcSwap, Guard};
use svnic_channels::{ChannelAddr, ChannelId};
use thiserror::Error;

use crate::fast_hash::FastBuildHasher;

type RouteMap<T> = HashMap<ChannelAddr, (ChannelId, T), FastBuildHasher>;

/// What [`RoutingTable::load`] returns: a cheap, lock-free borrow of the current snapshot.
pub type SnapshotGuard<T> = Guard<Arc<RoutingSnapshot<T>>>;

/// One immutable version of the routing table.
pub struct RoutingSnapshot<T> {
    generation: u64,
    routes: RouteMap<T>,
}

impl<T> RoutingSnapshot<T> {
    fn empty() -> Self {
        RoutingSnapshot {
            generation: 0,
            routes: RouteMap::default(),
        }
    }

    /// The channel bound to `addr`, with the engine's payload.
    #[inline]
    pub fn lookup(&self, addr: &ChannelAddr) -> Option<&(ChannelId, T)> {
        self.routes.get(addr)
    }

    /// This snapshot's generation: 0 for the empty initial table, one more for every change since.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Number of routes.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// True if no route is bound.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Every route, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&ChannelAddr, &(ChannelId, T))> {
        self.routes.iter()
    }

    /// Every route as (address, channel), sorted by address: the operator view.
    pub fn sorted(&self) -> Vec<(ChannelAddr, ChannelId)> {
        let mut v: Vec<_> = self.routes.iter().map(|(a, (id, _))| (*a, *id)).collect();
        v.sort_unstable();
        v
    }
}

impl<T> fmt::Debug for RoutingSnapshot<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoutingSnapshot")
            .field("generation", &self.generation)
            .field("routes", &self.sorted())
            .finish()
    }
}

/// A route taken out of the table by [`RoutingTable::unbind`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedRoute<T> {
    /// The channel that was bound.
    pub id: ChannelId,
    /// The engine's payload that was bound with it.
    pub payload: T,
    /// The first generation without the route. Readers holding an older snapshot may still find it.
    pub generation: u64,
}

/// A routing change that cannot be made.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum RouteError {
    /// The address is already bound (an endpoint of a MAC is bound at most once).
    #[error("route {addr} is already bound to {existing}; cannot bind it to {requested}")]
    AlreadyBound {
        /// The address.
        addr: ChannelAddr,
        /// The channel bound to it.
        existing: ChannelId,
        /// The channel that asked for it.
        requested: ChannelId,
    },
    /// The address is not bound.
    #[error("route {addr} is not bound; nothing to unbind")]
    NotBound {
        /// The address.
        addr: ChannelAddr,
    },
}

/// The routing table: lock-free snapshots for readers, copy-on-write updates for writers.
pub struct RoutingTable<T> {
    current: ArcSwap<RoutingSnapshot<T>>,
    /// Generation of `current`, published after it so that a reader seeing a new value here finds
    /// at least that snapshot in `current`.
    generation: AtomicU64,
    /// Serialises writers so that no change is lost between copy and swap. Readers never take it.
    writer: Mutex<()>,
}

impl<T: Clone + Send + Sync + 'static> RoutingTable<T> {
    /// An empty table at generation 0.
    pub fn new() -> Self {
        RoutingTable {
            current: ArcSwap::from_pointee(RoutingSnapshot::empty()),
            generation: AtomicU64::new(0),
            writer: Mutex::new(()),
        }
    }

    /// The current snapshot, lock-free and cheap (no reference-count traffic in the common case).
    /// Hold the guard for a batch, not forever; use [`RoutingTable::load_full`] to keep one.
    #[inline]
    pub fn load(&self) -> SnapshotGuard<T> {
        self.current.load()
    }

    /// The current snapshot as an `Arc` that may be kept as long as wanted.
    pub fn load_full(&self) -> Arc<RoutingSnapshot<T>> {
        self.current.load_full()
    }

    /// The current generation: one atomic load.
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Replaces `cached` with the current snapshot if the generation changed; true if it did.
    #[inline]
    pub fn refresh(&self, cached: &mut Arc<RoutingSnapshot<T>>) -> bool {
        if self.generation() == cached.generation {
            return false;
        }
        *cached = self.load_full();
        true
    }

    /// Looks `addr` up in the current snapshot and clones the result. Convenient for the control
    /// path; the data path should look up in a snapshot it holds.
    pub fn lookup(&self, addr: &ChannelAddr) -> Option<(ChannelId, T)> {
        self.current.load().lookup(addr).cloned()
    }

    /// Number of routes in the current snapshot.
    pub fn len(&self) -> usize {
        self.current.load().len()
    }

    /// True if the current snapshot has no route.
    pub fn is_empty(&self) -> bool {
        self.current.load().is_empty()
    }

    /// Binds `addr` to channel `id` with `payload`; returns the new generation. Refuses an
    /// address that is already bound.
    pub fn bind(&self, addr: ChannelAddr, id: ChannelId, payload: T) -> Result<u64, RouteError> {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.current.load();
        if let Some((existing, _)) = current.lookup(&addr) {
            return Err(RouteError::AlreadyBound {
                addr,
                existing: *existing,
                requested: id,
            });
        }
        let mut routes = current.routes.clone();
        routes.insert(addr, (id, payload));
        Ok(self.publish(current.generation, routes))
    }

    /// Removes the route of `addr` and returns what was bound.
    pub fn unbind(&self, addr: &ChannelAddr) -> Result<RemovedRoute<T>, RouteError> {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.current.load();
        if !current.routes.contains_key(addr) {
            return Err(RouteError::NotBound { addr: *addr });
        }
        let mut routes = current.routes.clone();
        let Some((id, payload)) = routes.remove(addr) else {
            return Err(RouteError::NotBound { addr: *addr });
        };
        let generation = self.publish(current.generation, routes);
        Ok(RemovedRoute {
            id,
            payload,
            generation,
        })
    }

    /// Swaps in a snapshot one generation after `previous`. Caller holds the writer lock.
    fn publish(&self, previous: u64, routes: RouteMap<T>) -> u64 {
        let generation = previous.wrapping_add(1);
        self.current
            .store(Arc::new(RoutingSnapshot { generation, routes }));
        // Release: a reader that Acquire-loads this value also sees the store above.
        self.generation.store(generation, Ordering::Release);
        generation
    }
}

impl<T: Clone + Send + Sync + 'static> Default for RoutingTable<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for RoutingTable<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoutingTable")
            .field("current", &**self.current.load())
            .finish()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::thread;

    use svnic_channels::MacAddr;

    use super::*;

    fn addr(mac_last: u8, endpoint: u32) -> ChannelAddr {
        ChannelAddr::new(MacAddr([0x52, 0x54, 0, 0, 0, mac_last]), endpoint)
    }

    #[test]
    fn bind_lookup_unbind() {
        let t: RoutingTable<&'static str> = RoutingTable::new();
        assert_eq!(t.generation(), 0);
        assert!(t.is_empty());
        assert_eq!(t.bind(addr(1, 5), ChannelId(1), "a"), Ok(1));
        assert_eq!(t.bind(addr(2, 5), ChannelId(2), "b"), Ok(2));
        assert_eq!(t.lookup(&addr(1, 5)), Some((ChannelId(1), "a")));
        assert_eq!(t.lookup(&addr(1, 6)), None);
        assert_eq!(t.len(), 2);
        assert_eq!(
            t.load().sorted(),
            vec![(addr(1, 5), ChannelId(1)), (addr(2, 5), ChannelId(2))]
        );
        let removed = t.unbind(&addr(1, 5)).unwrap();
        assert_eq!(
            removed,
            RemovedRoute {
                id: ChannelId(1),
                payload: "a",
                generation: 3
            }
        );
        assert_eq!(t.lookup(&addr(1, 5)), None);
        assert_eq!(t.generation(), 3);
    }

    #[test]
    fn an_address_is_bound_at_most_once() {
        let t = RoutingTable::new();
        t.bind(addr(1, 5), ChannelId(1), ()).unwrap();
        let err = t.bind(addr(1, 5), ChannelId(2), ()).unwrap_err();
        assert_eq!(
            err,
            RouteError::AlreadyBound {
                addr: addr(1, 5),
                existing: ChannelId(1),
                requested: ChannelId(2)
            }
        );
        assert_eq!(
            err.to_string(),
            "route 52:54:00:00:00:01/5 is already bound to channel 1; cannot bind it to channel 2"
        );
        // A refused change does not bump the generation.
        assert_eq!(t.generation(), 1);
        assert_eq!(
            t.unbind(&addr(1, 6)),
            Err(RouteError::NotBound { addr: addr(1, 6) })
        );
        assert_eq!(t.generation(), 1);
    }

    #[test]
    fn old_snapshots_stay_valid_and_refresh_follows_the_generation() {
        let t = RoutingTable::new();
        t.bind(addr(1, 1), ChannelId(1), 10u32).unwrap();
        let mut cached = t.load_full();
        assert!(!t.refresh(&mut cached));
        t.unbind(&addr(1, 1)).unwrap();
        // The cached snapshot still has the route; a refresh drops it.
        assert_eq!(cached.lookup(&addr(1, 1)), Some(&(ChannelId(1), 10)));
        assert!(t.refresh(&mut cached));
        assert_eq!(cached.lookup(&addr(1, 1)), None);
        assert_eq!(cached.generation(), 2);
    }

    #[test]
    fn readers_do_not_take_the_writer_lock() {
        let t = Arc::new(RoutingTable::new());
        t.bind(addr(1, 1), ChannelId(1), 1u8).unwrap();
        let held = t.writer.lock().unwrap();
        let reader = {
            let t = Arc::clone(&t);
            thread::spawn(move || {
                let mut cached = t.load_full();
                t.refresh(&mut cached);
                (t.lookup(&addr(1, 1)), t.load().len(), t.generation())
            })
        };
        // The reader finishes while a writer holds the lock.
        let got = reader.join().unwrap();
        drop(held);
        assert_eq!(got, (Some((ChannelId(1), 1)), 1, 1));
    }

    /// The payload names its own key and channel, so a reader can tell a torn entry.
    type Payload = Arc<(ChannelAddr, ChannelId)>;

    #[test]
    fn concurrent_readers_see_whole_snapshots() {
        const READERS: usize = 3;
        const ROUNDS: u32 = 3000;
        const KEYS: u32 = 16;
        let table: Arc<RoutingTable<Payload>> = Arc::new(RoutingTable::new());
        let done = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..READERS)
            .map(|_| {
                let table = Arc::clone(&table);
                let done = Arc::clone(&done);
                thread::spawn(move || {
                    let mut lookups = 0u64;
                    let mut last_generation = 0;
                    let mut cached = table.load_full();
                    loop {
                        let finished = done.load(Ordering::Acquire);
                        table.refresh(&mut cached);
                        let snap = &cached;
                        assert!(snap.generation() >= last_generation, "generation went back");
                        last_generation = snap.generation();
                        // The writer keeps at most one route per key and the count matches.
                        assert!(snap.len() <= KEYS as usize);
                        let mut found = 0;
                        for k in 0..KEYS {
                            let a = addr(1, k);
                            if let Some((id, payload)) = snap.lookup(&a) {
                                assert_eq!(payload.0, a, "payload of another key");
                                assert_eq!(payload.1, *id, "payload of another channel");
                                // Channel ids are key + KEYS * round: a torn entry breaks this.
                                assert_eq!(id.0 % KEYS, k);
                                found += 1;
                            }
                            lookups += 1;
                        }
                        assert_eq!(found, snap.len());
                        if finished {
                            return (lookups, last_generation);
                        }
                    }
                })
            })
            .collect();

        for round in 0..ROUNDS {
            let k = round % KEYS;
            let a = addr(1, k);
            if table.lookup(&a).is_some() {
                table.unbind(&a).unwrap();
            }
            let id = ChannelId(k + KEYS * round);
            table.bind(a, id, Arc::new((a, id))).unwrap();
        }
        done.store(true, Ordering::Release);
        let final_generation = table.generation();
        for r in readers {
            let (lookups, last) = r.join().unwrap();
            assert!(lookups > 0);
            assert_eq!(last, final_generation, "reader missed the last change");
        }
        // ROUNDS binds plus one unbind per round after the first KEYS.
        assert_eq!(final_generation, u64::from(2 * ROUNDS - KEYS));
    }
}
