//! One soak guest: a host-process guest (`HostGuest`) in a process of its own, so that the
//! driver can SIGKILL it. It keeps up to `channels` channels (endpoint `slot + 1`), creates and
//! destroys them at random, and sends user-data and DMA-data to random endpoints of the other
//! guests, every message asking for a completion, so that it can count, per channel, that every
//! message its TX ring accepted came back delivered or error-completed.
//!
//! Protocol with the driver, one line each: stdout `READY`, then `PROGRESS {json}` about once a
//! second; stdin `stop` (stop sending, wait until every channel settled) answered by
//! `SETTLED {json}`; stdin `report` answered by `REPORT {json}` (per channel counts); stdin EOF
//! ends the process.

use std::io::{BufRead, Write};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use svnic_client::Completions;

use serde_json::json;
use svnic_channels::{ChannelAddr, CompletionStatus, DataRef, Message};
use svnic_client::Channel;
use svnic_host_frontend::HostGuest;

use super::{soak_mac, Rng};

/// Ring slots per channel.
const RING: u32 = 64;
/// Receive buffers kept posted per channel, and their size.
const POSTED: u64 = 8;
const POST_LEN: u32 = 4096;
/// The DMA source area (after the posted buffers) and the largest DMA-data sent.
const DMA_SRC: u64 = POSTED * POST_LEN as u64;
const DMA_MAX: u32 = 4096;
/// How long a create, a destroy or a channel's settling may take.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(20);
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// What a soak guest is told on its command line.
#[derive(Debug, Clone)]
pub struct GuestArgs {
    /// Its vhost-user socket.
    pub socket: std::path::PathBuf,
    /// Its index (its MAC is `soak_mac(index)`).
    pub index: u32,
    /// How many guests there are (the peers are the others).
    pub guests: u32,
    /// Channel slots.
    pub channels: u32,
    /// Random seed.
    pub seed: u64,
    /// Pause between rounds of work.
    pub tick: Duration,
}

/// One live channel and what it counted.
struct Slot {
    ch: Channel,
    data_offset: u64,
    counts: Counts,
}

/// Per-channel counts, as the guest sees them.
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    /// Messages its TX ring accepted.
    accepted: u64,
    /// TX completions: delivered.
    ok: u64,
    /// TX completions: errors.
    errors: u64,
    /// Messages received (user-data and DMA-data).
    received: u64,
}

impl Counts {
    fn settled(&self) -> bool {
        self.accepted == self.ok + self.errors
    }
}

/// Lifetime totals of the process.
#[derive(Debug, Default)]
struct Totals {
    creates: u64,
    create_failures: u64,
    destroys: u64,
    /// Channels destroyed before every message they accepted had come back.
    unsettled_destroys: u64,
    accepted: u64,
    ok: u64,
    errors: u64,
    received: u64,
    /// Anything that should never happen (a message that does not decode, a foreign cookie...).
    anomalies: Vec<String>,
}

struct SoakGuest {
    args: GuestArgs,
    guest: HostGuest,
    slots: Vec<Option<Slot>>,
    totals: Totals,
    rng: Rng,
    msgs: Vec<Message>,
}

fn out(line: String) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}

/// Runs a soak guest until stdin closes.
pub fn guest_main(args: GuestArgs) -> Result<(), String> {
    let memory = (2 * u64::from(args.channels) + 8) << 20;
    let guest = HostGuest::connect(&args.socket, memory)
        .map_err(|e| format!("cannot connect to {}: {e}", args.socket.display()))?;
    let commands = stdin_lines();
    let mut g = SoakGuest {
        slots: (0..args.channels).map(|_| None).collect(),
        rng: Rng::new(args.seed),
        args,
        guest,
        totals: Totals::default(),
        msgs: Vec::new(),
    };
    out("READY".into());
    let mut sending = true;
    let mut last_progress = Instant::now();
    loop {
        match commands.try_recv() {
            Ok(cmd) if cmd == "stop" => {
                sending = false;
                let settled = g.settle_all();
                out(format!("SETTLED {}", json!({ "settled": settled })));
            }
            Ok(cmd) if cmd == "report" => {
                g.pump(false)?;
                out(format!("REPORT {}", g.report()));
            }
            Ok(_) => {}
            Err(mpsc::TryRecvError::Empty) => {}
            Err(mpsc::TryRecvError::Disconnected) => return Ok(()),
        }
        if sending {
            g.churn()?;
        }
        g.pump(sending)?;
        if last_progress.elapsed() >= PROGRESS_EVERY {
            last_progress = Instant::now();
            out(format!("PROGRESS {}", g.progress()));
        }
        std::thread::sleep(g.args.tick);
    }
}

/// Lines of stdin, from a thread; the channel disconnects at EOF.
fn stdin_lines() -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line.trim().to_string()).is_err() {
                break;
            }
        }
    });
    rx
}

impl SoakGuest {
    /// Creates or destroys a channel now and then.
    fn churn(&mut self) -> Result<(), String> {
        let slot = self.rng.below(u64::from(self.args.channels)) as usize;
        let roll = self.rng.below(1000);
        match &self.slots[slot] {
            None if roll < 100 => self.create(slot),
            Some(_) if roll < 4 => self.destroy(slot),
            _ => Ok(()),
        }
    }

    fn create(&mut self, slot: usize) -> Result<(), String> {
        let endpoint = slot as u32 + 1;
        let mut ch = match self.guest.create_channel(endpoint, RING, CONTROL_TIMEOUT) {
            Ok(ch) => ch,
            Err(e) => {
                // Refusals are the daemon's right (quota, rate limits, an endpoint whose
                // previous owner is still being torn down): counted, not fatal.
                self.totals.create_failures += 1;
                eprintln!("create of endpoint {endpoint} failed: {e}");
                return Ok(());
            }
        };
        let data_offset = ch.layout().data_offset;
        let pattern: Vec<u8> = (0..DMA_MAX).map(|i| (i % 251) as u8).collect();
        ch.write_data(data_offset + DMA_SRC, &pattern)
            .map_err(|e| format!("channel {}: write_data: {e}", ch.id()))?;
        for i in 0..POSTED {
            let buf = DataRef {
                offset: data_offset + i * u64::from(POST_LEN),
                len: POST_LEN,
            };
            ch.post_buffer(i, buf)
                .map_err(|e| format!("channel {}: post_buffer: {e}", ch.id()))?;
        }
        ch.flush()
            .map_err(|e| format!("channel {}: flush: {e}", ch.id()))?;
        self.totals.creates += 1;
        self.slots[slot] = Some(Slot {
            ch,
            data_offset,
            counts: Counts::default(),
        });
        Ok(())
    }

    /// Waits until the channel settled, then destroys it.
    fn destroy(&mut self, slot: usize) -> Result<(), String> {
        let settled = self.settle(slot);
        let Some(s) = self.slots[slot].take() else {
            return Ok(());
        };
        if !settled {
            self.totals.unsettled_destroys += 1;
        }
        let id = s.ch.id();
        self.guest
            .destroy_channel(s.ch, CONTROL_TIMEOUT)
            .map_err(|e| format!("channel {id}: destroy: {e}"))?;
        self.totals.destroys += 1;
        Ok(())
    }

    /// Polls `slot` until every message it accepted came back; false on timeout.
    fn settle(&mut self, slot: usize) -> bool {
        let deadline = Instant::now() + CONTROL_TIMEOUT;
        loop {
            match &self.slots[slot] {
                Some(s) if !s.counts.settled() => {}
                _ => return true,
            }
            if Instant::now() >= deadline || self.pump(false).is_err() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn settle_all(&mut self) -> bool {
        (0..self.slots.len()).all(|slot| self.settle(slot))
    }

    /// Sends (if `sending`) a small burst on some channels, and receives on every channel.
    fn pump(&mut self, sending: bool) -> Result<(), String> {
        self.guest
            .poll_control()
            .map_err(|e| format!("control: {e}"))?;
        if sending && self.args.guests > 1 {
            for _ in 0..2 {
                let slot = self.rng.below(self.slots.len() as u64) as usize;
                let burst = 1 + self.rng.below(8);
                for _ in 0..burst {
                    self.send_one(slot)?;
                }
            }
        }
        for slot in 0..self.slots.len() {
            self.receive(slot)?;
        }
        Ok(())
    }

    fn send_one(&mut self, slot: usize) -> Result<(), String> {
        let peer_index = {
            let other = self.rng.below(u64::from(self.args.guests - 1)) as u32;
            if other >= self.args.index {
                other + 1
            } else {
                other
            }
        };
        let dest = ChannelAddr::new(
            soak_mac(peer_index),
            1 + self.rng.below(u64::from(self.args.channels)) as u32,
        );
        let dma = self.rng.below(4) == 0;
        let len = 1 + self.rng.below(u64::from(DMA_MAX)) as u32;
        let Some(s) = self.slots[slot].as_mut() else {
            return Ok(());
        };
        let cookie = s.counts.accepted;
        let taken = if dma {
            let buf = DataRef {
                offset: s.data_offset + DMA_SRC,
                len,
            };
            s.ch.send_dma(dest, cookie, buf)
        } else {
            s.ch.send_user(dest, cookie, &cookie.to_le_bytes(), Completions::Always)
        }
        .map_err(|e| format!("channel {}: send: {e}", s.ch.id()))?;
        if taken {
            s.counts.accepted += 1;
            self.totals.accepted += 1;
        }
        s.ch.flush()
            .map_err(|e| format!("channel {}: flush: {e}", s.ch.id()))
    }

    fn receive(&mut self, slot: usize) -> Result<(), String> {
        let Some(s) = self.slots[slot].as_mut() else {
            return Ok(());
        };
        self.msgs.clear();
        s.ch.poll(&mut self.msgs, 256)
            .map_err(|e| format!("channel {}: poll: {e}", s.ch.id()))?;
        let mut repost = Vec::new();
        for m in &self.msgs {
            match m {
                Message::Completion(c) if c.status == CompletionStatus::BadPostBuffer => self
                    .totals
                    .anomalies
                    .push(format!("channel {}: a posted buffer refused", s.ch.id())),
                Message::Completion(c) => {
                    if c.status == CompletionStatus::Ok {
                        s.counts.ok += 1;
                        self.totals.ok += 1;
                    } else {
                        s.counts.errors += 1;
                        self.totals.errors += 1;
                    }
                }
                Message::UserData(_) => {
                    s.counts.received += 1;
                    self.totals.received += 1;
                }
                Message::DmaData(d) => {
                    s.counts.received += 1;
                    self.totals.received += 1;
                    repost.push(d.cookie);
                }
                other => self
                    .totals
                    .anomalies
                    .push(format!("channel {}: unexpected {other:?}", s.ch.id())),
            }
        }
        for cookie in repost {
            if cookie >= POSTED {
                self.totals.anomalies.push(format!(
                    "channel {}: DMA into unknown buffer {cookie}",
                    s.ch.id()
                ));
                continue;
            }
            let buf = DataRef {
                offset: s.data_offset + cookie * u64::from(POST_LEN),
                len: POST_LEN,
            };
            s.ch.post_buffer(cookie, buf)
                .map_err(|e| format!("channel {}: post_buffer: {e}", s.ch.id()))?;
        }
        s.ch.flush()
            .map_err(|e| format!("channel {}: flush: {e}", s.ch.id()))
    }

    fn progress(&self) -> serde_json::Value {
        let t = &self.totals;
        json!({
            "creates": t.creates,
            "create_failures": t.create_failures,
            "destroys": t.destroys,
            "unsettled_destroys": t.unsettled_destroys,
            "accepted": t.accepted,
            "ok": t.ok,
            "errors": t.errors,
            "received": t.received,
            "anomalies": t.anomalies.iter().take(5).collect::<Vec<_>>(),
            "anomaly_count": t.anomalies.len(),
        })
    }

    fn report(&self) -> serde_json::Value {
        let channels: Vec<_> = self
            .slots
            .iter()
            .flatten()
            .map(|s| {
                json!({
                    "id": s.ch.id(),
                    "accepted": s.counts.accepted,
                    "ok": s.counts.ok,
                    "errors": s.counts.errors,
                    "received": s.counts.received,
                })
            })
            .collect();
        json!({ "totals": self.progress(), "channels": channels })
    }
}
