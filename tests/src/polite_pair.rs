//! Two well-behaved host-process guests (svnic-guest's `HostGuest`, the virtio-user frontend)
//! with a channel each: the witnesses that a daemon still serves its other guests. A round trip
//! is user-data A -> B and B -> A over the channels, then a virtio-net frame each way.

use std::path::Path;
use std::time::{Duration, Instant};
use svnic_client::Completions;

use svnic_channels::{ChannelAddr, MacAddr, Message};
use svnic_client::Channel;
use svnic_host_frontend::HostGuest;

/// How long one leg of a round trip may take (generous: the machine may be loaded).
pub const LEG_TIMEOUT: Duration = Duration::from_secs(10);
/// Memory of each guest.
pub const GUEST_MEMORY: u64 = 64 << 20;
/// Endpoint of each guest's channel.
pub const ENDPOINT: u32 = 1;
/// EtherType of the test frames (IEEE local experimental 2; svnic frames use 0x88b5).
pub const TEST_ETHERTYPE: u16 = 0x88b6;

/// Two host-process guests with a channel each.
pub struct PolitePair {
    /// Guest A.
    pub a: HostGuest,
    /// Guest B.
    pub b: HostGuest,
    /// A's channel.
    pub ca: Channel,
    /// B's channel.
    pub cb: Channel,
    rounds: u64,
}

impl std::fmt::Debug for PolitePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolitePair")
            .field("a", &self.a.mac())
            .field("b", &self.b.mac())
            .field("rounds", &self.rounds)
            .finish()
    }
}

impl PolitePair {
    /// Connects a guest to each socket and creates a channel on each.
    pub fn connect(socket_a: &Path, socket_b: &Path) -> Result<PolitePair, String> {
        let guest = |s: &Path| {
            HostGuest::connect(s, GUEST_MEMORY).map_err(|e| format!("{}: {e}", s.display()))
        };
        let (a, b) = (guest(socket_a)?, guest(socket_b)?);
        let channel = |g: &HostGuest, name: &str| {
            g.create_channel(ENDPOINT, 256, LEG_TIMEOUT)
                .map_err(|e| format!("guest {name}: create channel: {e}"))
        };
        let (ca, cb) = (channel(&a, "A")?, channel(&b, "B")?);
        Ok(PolitePair {
            a,
            b,
            ca,
            cb,
            rounds: 0,
        })
    }

    /// One round trip (user-data both ways, then a frame both ways); how long it took.
    pub fn round_trip(&mut self) -> Result<Duration, String> {
        let t0 = Instant::now();
        self.user_round_trip()?;
        let n = self.rounds;
        exchange_frame(&self.a, &self.b, n).map_err(|e| format!("frame A -> B: {e}"))?;
        exchange_frame(&self.b, &self.a, n).map_err(|e| format!("frame B -> A: {e}"))?;
        Ok(t0.elapsed())
    }

    /// User-data A -> B -> A only (the latency witness); how long it took.
    pub fn user_round_trip(&mut self) -> Result<Duration, String> {
        let t0 = Instant::now();
        self.rounds += 1;
        let n = self.rounds;
        let (addr_a, addr_b) = (self.ca.addr(), self.cb.addr());
        send_user(&mut self.ca, addr_b, n)?;
        expect_user(&mut self.cb, &self.b, addr_a, n).map_err(|e| format!("A -> B: {e}"))?;
        send_user(&mut self.cb, addr_a, n)?;
        expect_user(&mut self.ca, &self.a, addr_b, n).map_err(|e| format!("B -> A: {e}"))?;
        Ok(t0.elapsed())
    }

    /// Sends user-data `n` from A to B.
    pub fn send_a_to_b(&mut self, n: u64) -> Result<(), String> {
        let to = self.cb.addr();
        send_user(&mut self.ca, to, n)
    }
}

/// Panics unless the pair completes a round trip.
#[track_caller]
pub fn assert_round_trip(pair: &mut PolitePair) {
    if let Err(e) = pair.round_trip() {
        panic!("the polite pair's round trip failed: {e}");
    }
}

fn send_user(ch: &mut Channel, to: ChannelAddr, n: u64) -> Result<(), String> {
    let deadline = Instant::now() + LEG_TIMEOUT;
    loop {
        match ch.send_user(to, n, &n.to_le_bytes(), Completions::OnError) {
            Ok(true) => break,
            Ok(false) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            Ok(false) => return Err("TX ring full for the whole timeout".into()),
            Err(e) => return Err(format!("send: {e}")),
        }
    }
    ch.flush().map_err(|e| format!("flush: {e}"))
}

/// Waits for user-data `n` from `from`; other messages are skipped.
fn expect_user(ch: &mut Channel, g: &HostGuest, from: ChannelAddr, n: u64) -> Result<(), String> {
    let waiter = g.waiter(ch);
    let deadline = Instant::now() + LEG_TIMEOUT;
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        let mut out = Vec::new();
        let left = deadline.saturating_duration_since(Instant::now());
        ch.wait_poll(&mut out, 16, left, &waiter)
            .map_err(|e| format!("receive: {e}"))?;
        for m in out {
            match m {
                Message::UserData(u) if u.cookie == n && u.peer == from => {
                    return if u.data() == n.to_le_bytes() {
                        Ok(())
                    } else {
                        Err(format!("message {n} arrived with payload {:?}", u.data()))
                    };
                }
                other => seen.push(other),
            }
        }
    }
    Err(format!(
        "message {n} did not arrive within {LEG_TIMEOUT:?} (got instead: {seen:?})"
    ))
}

/// An Ethernet frame from `src` to `dst` carrying `n`.
pub fn test_frame(dst: MacAddr, src: MacAddr, n: u64) -> Vec<u8> {
    let mut f = Vec::with_capacity(60);
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&TEST_ETHERTYPE.to_be_bytes());
    f.extend_from_slice(&n.to_le_bytes());
    f.resize(60, 0xa5);
    f
}

/// Sends frame `n` from `from` to `to` and waits for it there (other frames are skipped).
/// How long a frame leg waits for its frame before sending it again.
const RESEND_AFTER: Duration = Duration::from_millis(500);

fn exchange_frame(from: &HostGuest, to: &HostGuest, n: u64) -> Result<(), String> {
    let frame = test_frame(to.mac(), from.mac(), n);
    let deadline = Instant::now() + LEG_TIMEOUT;
    let mut got = Vec::new();
    while Instant::now() < deadline {
        // Sent again every round: virtio-net is Ethernet, and a switch queue still full of an
        // attacker's flood may drop it (counted as rx_queue_full).
        if !from.send_raw(&frame).map_err(|e| format!("send: {e}"))? {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let round_end = Instant::now() + RESEND_AFTER;
        while Instant::now() < round_end.min(deadline) {
            let left = round_end.saturating_duration_since(Instant::now());
            if !to
                .wait_raw(left.min(Duration::from_millis(100)))
                .map_err(|e| format!("receive: {e}"))?
            {
                continue;
            }
            got.clear();
            to.recv_raw(&mut got, 256)
                .map_err(|e| format!("receive: {e}"))?;
            if got.contains(&frame) {
                return Ok(());
            }
        }
    }
    Err(format!("frame {n} did not arrive within {LEG_TIMEOUT:?}"))
}
