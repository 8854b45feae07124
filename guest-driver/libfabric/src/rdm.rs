//! The RDM endpoint's message header and its matching rules.
//!
//! An RDM endpoint is the DGRAM data path (svnic channels deliver reliably, in order per
//! sender, or fail the send with the reason) plus a header in front of every payload, inside
//! the 40 inline bytes of a user-data message or at the front of the DMA-data bytes:
//! one flags byte, then the message's sequence number (4 bytes, little-endian) if its bit 4 is set
//! (every message an RDM endpoint sends has one), then the tag (8 bytes) if its bit 0 is set, then
//! the remote CQ data (8 bytes) if its bit 1 is set.
//!
//! Order (`FI_ORDER_SAS`): a sender numbers the messages (and parts) it sends to each peer
//! 0, 1, 2, ... A send the engine could not deliver (`NoBuffer`/`RingFull`) is retried with its
//! number, and may arrive after later ones; the receiver hands each sender's messages on in
//! number order ([`Reorder`]), keeping those that arrived ahead of a missing one aside. A send
//! that finally fails is replaced by a skip marker (bit 5, the number alone, no payload) so that
//! the receiver stops waiting for it. A sender has at most [`WINDOW`] numbers to one peer not
//! yet known delivered (or skipped), so an honest sender never has more than that kept aside.
//!
//! A message longer than `max_msg_size` (the bounce buffers' size) travels in parts of
//! `max_msg_size` bytes, sent back to back: the first part's header also carries the message's
//! total length (bit 2, 8 bytes), every other part's header only its offset in the message (bit 3,
//! 8 bytes, no other field). The receiver assembles them per sender (whose messages arrive in
//! order) and checks the offsets. A receive matches a message when both are tagged or both are not,
//! the tags agree outside the receive's ignore bits, and the receive's source (if directed) is
//! the sender.

use std::collections::{BTreeMap, HashMap};

use svnic_channels::ChannelAddr;

/// Flag bit: the message is tagged (`fi_tsend*`), a tag follows.
const TAGGED: u8 = 1;
/// Flag bit: remote CQ data follows.
const HAS_DATA: u8 = 2;
/// Flag bit: the first part of a message in parts; its total length follows.
const FIRST: u8 = 4;
/// Flag bit: a later part of a message in parts; its offset follows (and only the sequence number
/// besides).
const CONT: u8 = 8;
/// Flag bit: the sequence number follows (right after the flags).
const SEQ: u8 = 16;
/// Flag bit: a skip marker: the sequence number of a send that failed, nothing else.
const SKIP: u8 = 32;
/// The longest header of a message in one part: flags, sequence number, tag, data.
pub const HEADER_MAX: usize = 21;
/// The longest header of a part: flags, sequence number, tag, data, total length.
pub const PART_HEADER_MAX: usize = 29;
/// Sequence numbers a sender may have to one peer that are not known delivered or skipped.
pub const WINDOW: u64 = 64;
/// Messages a receiver keeps aside (arrived ahead of a missing one) from all senders together.
pub const HELD_MAX: usize = 256;
/// Senders a receiver keeps the numbering of; beyond, the one heard from least recently that
/// has nothing kept aside is forgotten (its numbering starts over at 0 for this receiver).
pub const SOURCES_MAX: usize = 4096;
/// Parts a message may have at most: `max_msg_size` of the RDM endpoint is this many times the
/// bounce buffers' size (an endpoint needs a staging slot per part: it has 14 with the defaults).
pub const MAX_PARTS: usize = 8;
/// Bytes every bounce buffer and staging slot of an RDM endpoint has beyond `max_msg_size`
/// (the header, rounded up to keep the slots 64-byte aligned).
pub const SLOT_EXTRA: usize = 64;

/// What a message carries beside its payload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Header {
    /// The tag of a tagged message.
    pub tag: Option<u64>,
    /// Remote CQ data.
    pub data: Option<u64>,
    /// The total length of a message in parts (its first part).
    pub total: Option<u64>,
    /// The offset of a later part of a message in parts (the header has nothing else but the
    /// sequence number).
    pub offset: Option<u64>,
    /// The sequence number of the message (or part) from its sender to this receiver.
    pub seq: Option<u32>,
    /// A skip marker: `seq` is the number of a send that failed; the header has nothing else.
    pub skip: bool,
}

impl Header {
    /// The header's bytes, and how many of them are used.
    pub fn encode(&self) -> ([u8; PART_HEADER_MAX], usize) {
        let mut b = [0u8; PART_HEADER_MAX];
        let mut n = 1;
        if let Some(seq) = self.seq {
            b[0] |= SEQ;
            b[1..5].copy_from_slice(&seq.to_le_bytes());
            n += 4;
        }
        let fields = match (self.skip, self.offset) {
            (true, _) => {
                b[0] |= SKIP;
                [(0, None), (0, None), (0, None)]
            }
            (false, Some(_)) => [(CONT, self.offset), (0, None), (0, None)],
            (false, None) => [
                (TAGGED, self.tag),
                (HAS_DATA, self.data),
                (FIRST, self.total),
            ],
        };
        for (bit, v) in fields {
            if let Some(v) = v {
                b[0] |= bit;
                b[n..n + 8].copy_from_slice(&v.to_le_bytes());
                n += 8;
            }
        }
        (b, n)
    }

    /// The header at the front of `b`, and its length; `None` if `b` does not start with one.
    pub fn decode(b: &[u8]) -> Option<(Header, usize)> {
        let flags = *b.first()?;
        let alone = |bit: u8| flags & bit != 0 && flags & !SEQ == bit;
        if flags & !(TAGGED | HAS_DATA | FIRST | CONT | SEQ | SKIP) != 0
            || alone(CONT) != (flags & CONT != 0)
            || alone(SKIP) != (flags & SKIP != 0)
            || (flags & SKIP != 0 && flags & SEQ == 0)
        {
            return None;
        }
        let mut n = 1;
        let seq = if flags & SEQ != 0 {
            n += 4;
            Some(u32::from_le_bytes(b.get(1..5)?.try_into().ok()?))
        } else {
            None
        };
        let mut field = |bit: u8| -> Option<Option<u64>> {
            if flags & bit == 0 {
                return Some(None);
            }
            let v = u64::from_le_bytes(b.get(n..n + 8)?.try_into().ok()?);
            n += 8;
            Some(Some(v))
        };
        let tag = field(TAGGED)?;
        let data = field(HAS_DATA)?;
        let total = field(FIRST)?;
        let offset = field(CONT)?;
        let h = Header {
            tag,
            data,
            total,
            offset,
            seq,
            skip: flags & SKIP != 0,
        };
        Some((h, n))
    }
}

/// Puts the messages (or parts) of each sender back into their sequence numbers' order: see the
/// module documentation. A message ahead of the next expected number of its sender is kept aside
/// (the caller copies it out of its bounce buffer first, [`Reorder::is_next`]) until the
/// missing ones arrive or are skipped. Bounds: a sender with a message [`WINDOW`] or more ahead of
/// the one expected, or whose message would take more than [`HELD_MAX`] kept aside in all, is
/// not waited for any longer: what it has kept aside is handed on now, in number order, and the
/// next expected number is the one after the highest (its missing messages, should they still
/// come, are handed on when they come, late: nothing is lost and no sender stalls the others).
/// When [`HELD_MAX`] is reached, the sender holding the most is the one given up (so that
/// senders holding many cannot make this receiver give up those holding few). A number behind
/// the expected one is handed on at once (late); number 0 behind it means the sender began
/// again (a new endpoint at the same address, or its peer state reset): its numbering starts
/// over. At most [`SOURCES_MAX`] senders are remembered.
#[derive(Debug)]
pub struct Reorder<T> {
    sources: HashMap<ChannelAddr, Source<T>>,
    held: usize,
    /// Arrivals so far: the clock of [`Source::seen`].
    tick: u64,
    /// Times a sender was given up waiting for (a bound exceeded).
    pub given_up: u64,
    /// Messages handed on after later ones of their sender.
    pub late: u64,
}

/// One sender's state: the next number expected, what arrived ahead of it (`None`: skipped),
/// and since when something has been kept aside.
#[derive(Debug)]
struct Source<T> {
    expected: u32,
    held: BTreeMap<u32, Option<T>>,
    since: Option<std::time::Instant>,
    /// [`Reorder::tick`] of its last arrival.
    seen: u64,
}

impl<T> Default for Reorder<T> {
    fn default() -> Self {
        Reorder {
            sources: HashMap::new(),
            held: 0,
            tick: 0,
            given_up: 0,
            late: 0,
        }
    }
}

impl<T> Reorder<T> {
    /// Messages kept aside, from all senders.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Whether a message numbered `seq` from `src` would be handed on at once (not kept aside).
    pub fn is_next(&self, src: ChannelAddr, seq: u32) -> bool {
        let expected = self.sources.get(&src).map_or(0, |s| s.expected);
        seq.wrapping_sub(expected) == 0 || seq.wrapping_sub(expected) >= 1 << 31
    }

    /// Message `seq` from `src` arrived (`None`: a skip marker); pushes onto `out` the messages
    /// now due (those of `src`, and those of a sender given up to make room), in order per sender.
    pub fn arrive(&mut self, src: ChannelAddr, seq: u32, item: Option<T>, out: &mut Vec<T>) {
        self.tick += 1;
        if !self.sources.contains_key(&src) && self.sources.len() >= SOURCES_MAX {
            self.forget_idlest();
        }
        let tick = self.tick;
        let s = self.sources.entry(src).or_insert_with(|| Source {
            expected: 0,
            held: BTreeMap::new(),
            since: None,
            seen: tick,
        });
        s.seen = tick;
        let ahead = seq.wrapping_sub(s.expected);
        if ahead == 0 {
            out.extend(item);
            s.expected = seq.wrapping_add(1);
            while let Some(next) = s.held.remove(&s.expected) {
                self.held = self.held.saturating_sub(1);
                out.extend(next);
                s.expected = s.expected.wrapping_add(1);
            }
            // A gap further on, if any, is awaited from now.
            s.since = (!s.held.is_empty()).then(std::time::Instant::now);
            return;
        }
        if ahead >= 1 << 31 {
            if seq == 0 {
                self.held = self.held.saturating_sub(s.held.len());
                Self::hand_on_all(s, out);
                s.expected = 1;
            } else {
                self.late += 1;
                crate::stats::REORDER_LATE.bump();
            }
            out.extend(item);
            return;
        }
        let fresh = !s.held.contains_key(&seq);
        let mine = s.held.len();
        if u64::from(ahead) < WINDOW && fresh && self.held >= HELD_MAX {
            // Room is made by giving up the sender holding the most, unless that is `src`.
            let victim = self
                .sources
                .iter()
                .filter(|(a, v)| **a != src && v.held.len() > mine)
                .max_by_key(|(_, v)| v.held.len())
                .map(|(a, _)| *a);
            if let Some(v) = victim {
                if let Some(vs) = self.sources.get_mut(&v) {
                    self.held = self.held.saturating_sub(vs.held.len());
                    Self::give_up(vs, v, seq, out);
                    self.given_up += 1;
                }
            }
        }
        let Some(s) = self.sources.get_mut(&src) else {
            return;
        };
        if u64::from(ahead) < WINDOW && self.held < HELD_MAX && fresh {
            s.held.insert(seq, item);
            s.since.get_or_insert_with(std::time::Instant::now);
            self.held += 1;
            return;
        }
        self.given_up += 1;
        self.held = self.held.saturating_sub(s.held.len());
        if fresh {
            s.held.insert(seq, item);
        } else {
            out.extend(item);
        }
        Self::give_up(s, src, seq, out);
    }

    /// Stops waiting for sender `src` (`s`) on the arrival of message `seq` (of any sender):
    /// logged, counted, and what it kept aside handed on.
    fn give_up(s: &mut Source<T>, src: ChannelAddr, seq: u32, out: &mut Vec<T>) {
        crate::stats::warn_limited!(
            "svnic provider: gave up waiting for message {} from {src} (message {seq} arrived, {} kept aside)",
            s.expected,
            s.held.len()
        );
        crate::stats::REORDER_GIVEN_UP.bump();
        Self::hand_on_all(s, out);
    }

    /// Forgets the sender heard from least recently among those with nothing kept aside (at
    /// most [`HELD_MAX`] senders hold something, fewer than [`SOURCES_MAX`]).
    fn forget_idlest(&mut self) {
        let idlest = self
            .sources
            .iter()
            .filter(|(_, s)| s.held.is_empty())
            .min_by_key(|(_, s)| s.seen)
            .map(|(a, _)| *a);
        if let Some(a) = idlest {
            self.sources.remove(&a);
        }
    }

    /// Gives up waiting for the senders whose missing messages have been awaited for `max_wait`
    /// (a sender that lost its numbering without this endpoint learning of it, e.g. it kept the
    /// numbering of an earlier endpoint at this address): what they kept aside is handed on now,
    /// in number order. An honest sender's retries and skip markers fill a gap well before.
    pub fn expire(
        &mut self,
        now: std::time::Instant,
        max_wait: std::time::Duration,
        out: &mut Vec<T>,
    ) {
        for (src, s) in self.sources.iter_mut() {
            if s.since
                .is_some_and(|t| now.saturating_duration_since(t) >= max_wait)
            {
                crate::stats::warn_limited!(
                    "svnic provider: gave up waiting {max_wait:?} for message {} from {src} ({} kept aside)",
                    s.expected,
                    s.held.len()
                );
                crate::stats::REORDER_GIVEN_UP.bump();
                self.given_up += 1;
                self.held = self.held.saturating_sub(s.held.len());
                Self::hand_on_all(s, out);
            }
        }
    }

    /// Forgets sender `src` (it is gone): what it kept aside is handed on now, in number order.
    pub fn forget(&mut self, src: ChannelAddr, out: &mut Vec<T>) {
        if let Some(mut s) = self.sources.remove(&src) {
            self.held = self.held.saturating_sub(s.held.len());
            Self::hand_on_all(&mut s, out);
        }
    }

    /// Hands on everything `s` kept aside, in number order; expects the number after the last.
    fn hand_on_all(s: &mut Source<T>, out: &mut Vec<T>) {
        let base = s.expected;
        let mut kept: Vec<(u32, Option<T>)> = std::mem::take(&mut s.held).into_iter().collect();
        kept.sort_by_key(|(seq, _)| seq.wrapping_sub(base));
        if let Some((last, _)) = kept.last() {
            s.expected = last.wrapping_add(1);
        }
        s.since = None;
        out.extend(kept.into_iter().filter_map(|(_, item)| item));
    }
}

/// Writes `seq` into an encoded header `b` that has room for one (its flags say so).
pub fn stamp_seq(b: &mut [u8], seq: u32) {
    if b.first().is_some_and(|f| f & SEQ != 0) {
        if let Some(at) = b.get_mut(1..5) {
            at.copy_from_slice(&seq.to_le_bytes());
        }
    }
}

/// Which messages a posted receive takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Want {
    /// `Some((tag, ignore))` for a tagged receive.
    pub tag: Option<(u64, u64)>,
    /// The only sender accepted (`FI_DIRECTED_RECV`), or any.
    pub src: Option<ChannelAddr>,
}

impl Want {
    /// Whether a message with header `h` from `src` matches.
    pub fn matches(&self, h: &Header, src: ChannelAddr) -> bool {
        let tag_ok = match (self.tag, h.tag) {
            (None, None) => true,
            (Some((want, ignore)), Some(tag)) => (want ^ tag) & !ignore == 0,
            _ => false,
        };
        tag_ok && self.src.is_none_or(|s| s == src)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(ep: u32) -> ChannelAddr {
        ChannelAddr::new(svnic_channels::MacAddr([2, 0, 0, 0, 0, 1]), ep)
    }

    #[test]
    fn every_header_shape_round_trips_and_garbage_is_refused() {
        let h = |tag, data, total, offset| Header {
            tag,
            data,
            total,
            offset,
            ..Header::default()
        };
        let numbered = |h: Header, seq| Header {
            seq: Some(seq),
            ..h
        };
        let skip = |seq| Header {
            seq: Some(seq),
            skip: true,
            ..Header::default()
        };
        for h in [
            Header::default(),
            h(Some(u64::MAX), None, None, None),
            h(None, Some(7), None, None),
            h(Some(0x1234), Some(u64::MAX - 1), None, None),
            h(Some(1), Some(2), Some(1 << 20), None),
            h(None, None, None, Some(65536)),
            numbered(Header::default(), 0),
            numbered(h(Some(1), Some(2), Some(1 << 20), None), u32::MAX),
            numbered(h(None, None, None, Some(65536)), 7),
            skip(3),
        ] {
            let (b, n) = h.encode();
            assert_eq!(Header::decode(&b[..n]), Some((h, n)));
            if n > 1 {
                assert_eq!(Header::decode(&b[..n - 1]), None, "{h:?} cut short");
            }
        }
        assert_eq!(Header::decode(&[]), None);
        assert_eq!(Header::decode(&[64]), None, "an unknown flag");
        assert_eq!(
            Header::decode(&[SKIP]),
            None,
            "a skip marker without its number"
        );
        assert_eq!(
            Header::decode(&[SKIP | SEQ | TAGGED, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]),
            None,
            "a skip marker has only its number"
        );
        let (longest, n) = numbered(h(Some(1), Some(2), Some(3), None), 4).encode();
        assert_eq!((n, longest.len()), (PART_HEADER_MAX, PART_HEADER_MAX));
        let (mut b, n) = numbered(h(Some(9), None, None, None), 0).encode();
        stamp_seq(&mut b[..n], 0xdead_beef);
        assert_eq!(
            Header::decode(&b[..n]).map(|(h, _)| h.seq),
            Some(Some(0xdead_beef))
        );
        let mut cont_and_tag = [0u8; 17];
        cont_and_tag[0] = CONT | TAGGED;
        assert_eq!(
            Header::decode(&cont_and_tag),
            None,
            "a later part has only its offset"
        );
    }

    /// Feeds `arrivals` (source endpoint, sequence number, payload or `None` for a skip marker)
    /// and returns what each one handed on.
    fn feed(r: &mut Reorder<u32>, arrivals: &[(u32, u32, Option<u32>)]) -> Vec<Vec<u32>> {
        arrivals
            .iter()
            .map(|&(src, seq, item)| {
                let mut out = Vec::new();
                r.arrive(addr(src), seq, item, &mut out);
                out
            })
            .collect()
    }

    #[test]
    fn reorder_hands_each_senders_messages_on_in_number_order() {
        let mut r = Reorder::default();
        // Two senders interleaved, each with a message overtaken by later ones.
        let got = feed(
            &mut r,
            &[
                (1, 0, Some(10)),
                (1, 2, Some(12)),
                (2, 1, Some(21)),
                (1, 3, Some(13)),
                (2, 0, Some(20)),
                (1, 1, Some(11)),
                (2, 2, Some(22)),
            ],
        );
        let want: Vec<Vec<u32>> = vec![
            vec![10],
            vec![],
            vec![],
            vec![],
            vec![20, 21],
            vec![11, 12, 13],
            vec![22],
        ];
        assert_eq!(got, want);
        assert_eq!(r.held(), 0);
        assert!(!r.is_next(addr(1), 5));
        assert!(r.is_next(addr(1), 4));
        assert!(
            r.is_next(addr(1), 1),
            "a number behind is handed on at once"
        );

        // A failed send's number is skipped (its marker may itself overtake or be overtaken).
        let got = feed(
            &mut r,
            &[
                (1, 5, Some(15)),
                (1, 4, None),
                (1, 7, Some(17)),
                (1, 6, None),
                (1, 8, None),
                (1, 9, Some(19)),
            ],
        );
        assert_eq!(
            got,
            vec![vec![], vec![15], vec![], vec![17], vec![], vec![19]]
        );
        assert_eq!((r.held(), r.given_up, r.late), (0, 0, 0));

        // A new sender, and numbers that wrap.
        let mut w = Reorder::default();
        let got = feed(&mut w, &[(1, 1, Some(1)), (1, 0, Some(0))]);
        assert_eq!(
            got,
            vec![vec![], vec![0, 1]],
            "a new sender is expected from 0"
        );
        let mut w = Reorder::default();
        w.sources.insert(
            addr(3),
            Source {
                expected: u32::MAX,
                held: BTreeMap::new(),
                since: None,
                seen: 0,
            },
        );
        let got = feed(&mut w, &[(3, 0, Some(1)), (3, u32::MAX, Some(0))]);
        assert_eq!(got, vec![vec![], vec![0, 1]]);
    }

    #[test]
    fn reorder_gives_up_a_gap_awaited_too_long_and_hands_on_in_order() {
        let (a, b) = (addr(1), addr(2));
        let mut r: Reorder<u32> = Reorder::default();
        let mut out = Vec::new();
        // A sender that kept an earlier endpoint's numbering: its first message here is 5.
        r.arrive(a, 5, Some(5), &mut out);
        r.arrive(a, 6, Some(6), &mut out);
        r.arrive(b, 0, Some(100), &mut out);
        assert_eq!(out, vec![100]);
        let t0 = std::time::Instant::now();
        let wait = std::time::Duration::from_secs(30);
        r.expire(t0, wait, &mut out);
        assert_eq!(out, vec![100], "not yet");
        r.expire(t0 + wait + wait, wait, &mut out);
        assert_eq!(out, vec![100, 5, 6]);
        assert_eq!((r.held(), r.given_up), (0, 1));
        // It goes on from there.
        r.arrive(a, 7, Some(7), &mut out);
        assert_eq!(out, vec![100, 5, 6, 7]);
    }

    #[test]
    fn reorder_bounds_what_it_keeps_and_never_loses_or_stalls() {
        // A sender WINDOW ahead is not waited for: its kept messages go on in order.
        let mut r = Reorder::default();
        let mut out = Vec::new();
        for seq in 1..WINDOW as u32 {
            r.arrive(addr(1), seq, Some(seq), &mut out);
        }
        assert!(out.is_empty());
        assert_eq!(r.held(), WINDOW as usize - 1);
        r.arrive(addr(1), WINDOW as u32, Some(WINDOW as u32), &mut out);
        assert_eq!(out, (1..=WINDOW as u32).collect::<Vec<_>>());
        assert_eq!((r.held(), r.given_up), (0, 1));
        // The missing one, should it still come, is handed on (late), not lost.
        out.clear();
        r.arrive(addr(1), 0, Some(0), &mut out);
        assert_eq!(
            (out, r.late),
            (vec![0], 0),
            "0 behind: the sender began again"
        );
        let mut out = Vec::new();
        r.arrive(addr(1), 1, Some(1), &mut out);
        assert_eq!(out, vec![1], "numbered from 0 again");

        // HELD_MAX in all: the sender whose message would exceed it is not waited for; the
        // others keep their order.
        let mut r = Reorder::default();
        let mut out = Vec::new();
        let per = (WINDOW - 1) as usize;
        let mut src = 0;
        while r.held() + per <= HELD_MAX {
            src += 1;
            for seq in 1..=per as u32 {
                r.arrive(addr(src), seq, Some(seq), &mut out);
            }
        }
        assert!(out.is_empty());
        let held = r.held();
        for seq in 1..=(HELD_MAX - held) as u32 {
            r.arrive(addr(100), seq, Some(seq), &mut out);
        }
        assert_eq!((r.held(), out.len()), (HELD_MAX, 0));
        r.arrive(addr(100), 1000, Some(1000), &mut out);
        let mut want: Vec<u32> = (1..=(HELD_MAX - held) as u32).collect();
        want.push(1000);
        assert_eq!(out, want);
        assert_eq!((r.held(), r.given_up), (held, 1));
        out.clear();
        r.arrive(addr(1), 0, Some(0), &mut out);
        assert_eq!(out, (0..=per as u32).collect::<Vec<_>>());

        // A gone sender's kept messages are handed on when it is forgotten; a duplicate
        // number is not kept twice.
        let mut r = Reorder::default();
        let mut out = Vec::new();
        r.arrive(addr(1), 2, Some(2), &mut out);
        r.arrive(addr(1), 2, Some(22), &mut out);
        assert_eq!((out.clone(), r.given_up), (vec![22, 2], 1));
        out.clear();
        r.arrive(addr(1), 5, Some(5), &mut out);
        r.forget(addr(1), &mut out);
        assert_eq!((out, r.held()), (vec![5], 0));
    }

    #[test]
    fn reorder_gives_up_the_sender_holding_most_when_full_and_bounds_its_senders() {
        // Senders 1..=4 hold 63 each (252 of HELD_MAX); sender 9 holds a few up to the bound.
        let mut r = Reorder::default();
        let mut out = Vec::new();
        for src in 1..=4 {
            for seq in 1..WINDOW as u32 {
                r.arrive(addr(src), seq, Some(src * 1000 + seq), &mut out);
            }
        }
        for seq in 1..=(HELD_MAX - r.held()) as u32 {
            r.arrive(addr(9), seq, Some(9000 + seq), &mut out);
        }
        assert_eq!((r.held(), out.len()), (HELD_MAX, 0));
        // Sender 9's next one is kept: one of those holding the most is given up instead.
        r.arrive(addr(9), 5, Some(9005), &mut out);
        assert_eq!(r.given_up, 1);
        assert_eq!(out.len(), WINDOW as usize - 1);
        let victim = out[0] / 1000;
        assert!((1..=4).contains(&victim));
        let want: Vec<u32> = (1..WINDOW as u32).map(|q| victim * 1000 + q).collect();
        assert_eq!(out, want, "the victim's messages, in order");
        out.clear();
        r.arrive(addr(9), 0, Some(9000), &mut out);
        assert_eq!(
            out,
            (9000..=9005).collect::<Vec<_>>(),
            "sender 9 kept its order"
        );

        // Senders beyond SOURCES_MAX: the least recently heard one holding nothing is forgotten.
        let mut r = Reorder::default();
        let mut out = Vec::new();
        r.arrive(addr(0), 1, Some(1), &mut out);
        for src in 1..=SOURCES_MAX as u32 {
            r.arrive(addr(src), 0, Some(0), &mut out);
        }
        assert_eq!(r.sources.len(), SOURCES_MAX);
        assert!(r.sources.contains_key(&addr(0)), "it holds a message");
        assert!(!r.sources.contains_key(&addr(1)), "the idlest is forgotten");
        out.clear();
        r.arrive(addr(0), 0, Some(0), &mut out);
        assert_eq!(out, vec![0, 1]);
    }

    #[test]
    fn matching_takes_kind_tag_ignore_bits_and_source_into_account() {
        let tagged = |t| Header {
            tag: Some(t),
            ..Header::default()
        };
        let any = Want::default();
        assert!(any.matches(&Header::default(), addr(1)));
        assert!(!any.matches(&tagged(5), addr(1)));
        let t5 = Want {
            tag: Some((5, 0)),
            src: None,
        };
        assert!(t5.matches(&tagged(5), addr(1)));
        assert!(!t5.matches(&tagged(4), addr(1)));
        assert!(!t5.matches(&Header::default(), addr(1)));
        let t5_or_4 = Want {
            tag: Some((5, 1)),
            src: None,
        };
        assert!(t5_or_4.matches(&tagged(4), addr(1)));
        let from2 = Want {
            tag: Some((5, 0)),
            src: Some(addr(2)),
        };
        assert!(from2.matches(&tagged(5), addr(2)));
        assert!(!from2.matches(&tagged(5), addr(1)));
    }
}
