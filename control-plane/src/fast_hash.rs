//! A small, fast, non-cryptographic hasher (the FxHash multiply-rotate scheme used inside rustc)
//! for the routing table's lookups on the data path.
//!
//! It gives no protection against deliberately colliding keys. That is acceptable here because the
//! keys that are *inserted* (channel addresses) are bounded by the guests' policies: a guest binds
//! at most `max_channels` endpoints, so the longest collision chain a hostile guest can build is
//! bounded by its quota, and a lookup of any key (even one chosen by a host on the uplink) never
//! probes more than the entries that exist. Keep `max_channels` modest and this stays cheap.

use std::hash::{BuildHasherDefault, Hasher};

/// The FxHash multiplier (from rustc's `FxHasher`, 64-bit variant).
const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

/// FxHash-style hasher: for every word, `hash = (hash.rotl(5) ^ word) * SEED`.
#[derive(Clone, Copy, Default, Debug)]
pub struct FastHasher {
    hash: u64,
}

impl FastHasher {
    fn add_word(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add_word(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add_word(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add_word(u64::from(i));
    }

    fn write_u16(&mut self, i: u16) {
        self.add_word(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.add_word(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.add_word(i);
    }

    fn write_usize(&mut self, i: usize) {
        self.add_word(i as u64);
    }

    fn finish(&self) -> u64 {
        self.hash
    }
}

/// `BuildHasher` for [`FastHasher`], for `HashMap<K, V, FastBuildHasher>`.
pub type FastBuildHasher = BuildHasherDefault<FastHasher>;

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::hash::{BuildHasher, Hash};

    use svnic_channels::{ChannelAddr, MacAddr};

    use super::*;

    fn hash_of<K: Hash>(k: &K) -> u64 {
        FastBuildHasher::default().hash_one(k)
    }

    #[test]
    fn equal_keys_hash_equal_and_nearby_keys_differ() {
        let mac = MacAddr([0x52, 0x54, 0, 0, 0, 1]);
        let a = ChannelAddr { mac, endpoint: 7 };
        assert_eq!(hash_of(&a), hash_of(&ChannelAddr { mac, endpoint: 7 }));
        let hashes: HashSet<u64> = (0..1024)
            .map(|endpoint| hash_of(&ChannelAddr { mac, endpoint }))
            .collect();
        assert_eq!(hashes.len(), 1024);
    }

    fn hash_bytes(bytes: &[u8]) -> u64 {
        let mut h = FastHasher::default();
        h.write(bytes);
        h.finish()
    }

    #[test]
    fn tail_bytes_count() {
        assert_ne!(hash_bytes(&[1, 2, 3]), hash_bytes(&[1, 2, 4]));
        assert_ne!(
            hash_bytes(&[0; 9]),
            hash_bytes(&[0, 0, 0, 0, 0, 0, 0, 0, 1])
        );
    }
}
