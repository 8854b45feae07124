//! Channel ids: handed out in turn over `1..=u32::MAX` (0 means "no channel" on the wire),
//! wrapping from `u32::MAX` back to 1, and skipping every id that still names a record.
//!
//! So ids never run out, and an id comes back only after a full cycle and only once nothing
//! the control plane keeps refers to it any more.

use svnic_channels::ChannelId;

/// Where the next search for a free channel id starts.
#[derive(Debug, Default)]
pub(crate) struct ChannelIds {
    /// The id handed out last (0 before the first).
    last: u32,
}

impl ChannelIds {
    /// A cursor whose next id is the one after `last` (tests start it near the end of the cycle).
    #[cfg(test)]
    pub(crate) fn after(last: u32) -> Self {
        ChannelIds { last }
    }

    /// The first id after the last one handed out for which `in_use` is false, and remembers it.
    /// `in_use_count` is how many ids `in_use` holds for: among that many plus one consecutive
    /// ids one is free, so that bounds the search. `None` only if every id is in use.
    pub(crate) fn allocate(
        &mut self,
        in_use_count: usize,
        in_use: impl Fn(ChannelId) -> bool,
    ) -> Option<ChannelId> {
        let tries = in_use_count.saturating_add(1).min(u32::MAX as usize);
        let mut candidate = self.last;
        for _ in 0..tries {
            candidate = following(candidate);
            if !in_use(ChannelId(candidate)) {
                self.last = candidate;
                return Some(ChannelId(candidate));
            }
        }
        None
    }
}

/// The id after `id` in the cycle `1..=u32::MAX`.
fn following(id: u32) -> u32 {
    id.checked_add(1).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn allocate(ids: &mut ChannelIds, taken: &BTreeSet<u32>) -> Option<u32> {
        ids.allocate(taken.len(), |id| taken.contains(&id.0))
            .map(|id| id.0)
    }

    #[test]
    fn ids_start_at_one_and_count_up() {
        let mut ids = ChannelIds::default();
        let none = BTreeSet::new();
        assert_eq!(allocate(&mut ids, &none), Some(1));
        assert_eq!(allocate(&mut ids, &none), Some(2));
    }

    #[test]
    fn ids_wrap_past_the_top_to_one_never_zero_and_skip_those_in_use() {
        let mut ids = ChannelIds::after(u32::MAX - 2);
        let taken: BTreeSet<u32> = [u32::MAX - 1, 1, 2, 4].into();
        assert_eq!(allocate(&mut ids, &taken), Some(u32::MAX));
        assert_eq!(allocate(&mut ids, &taken), Some(3));
        assert_eq!(allocate(&mut ids, &taken), Some(5));
    }

    #[test]
    fn the_search_is_bounded_by_the_ids_in_use() {
        let mut ids = ChannelIds::after(10);
        // Every id claimed in use, but only three counted: four candidates are tried.
        let calls = std::cell::Cell::new(0u32);
        let got = ids.allocate(3, |_| {
            calls.set(calls.get() + 1);
            true
        });
        assert_eq!((got, calls.get()), (None, 4));
        // A failed search moves nothing: the next one starts after 10 again.
        assert_eq!(ids.allocate(0, |_| false), Some(ChannelId(11)));
    }
}
