//! Attaching the daemon to its uplink (`--uplink IFACE`, docs/wire.md): one packet socket per
//! engine worker, joined in one fanout group in worker order so that the steering program's
//! worker numbers are the group's member indices, and one send-only socket for the frames the
//! switch sends (guests' virtio-net traffic for other hosts).

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use log::{debug, info};
use svnic_channels::DataMessage;

use crate::config::UplinkConfig;
use crate::engine::{Engine, EngineError, WireSetup};
use crate::net::{PortId, Switch, Uplink};
use crate::uplink::packet::{PacketConfig, PacketError, PacketSocket};
use crate::uplink::reliable::{FaultInjection, ReliableConfig};

/// Opens the uplink's sockets and puts the engine's workers and the switch on it.
pub(super) fn attach(
    cfg: &UplinkConfig,
    engine: &Engine,
    switch: &Arc<Switch>,
) -> Result<(), EngineError> {
    let workers = engine.config().workers;
    let n = u16::try_from(workers)
        .map_err(|_| EngineError::Uplink(format!("{workers} workers: at most 65535")))?;
    let packet = PacketConfig::default();
    let open = |what: &str| {
        PacketSocket::open(&cfg.iface, &packet)
            .map_err(|e: PacketError| EngineError::Uplink(format!("{what}: {e}")))
    };
    let mut sockets = Vec::with_capacity(workers);
    for i in 0..workers {
        sockets.push(open(&format!("worker {i}'s socket"))?);
    }
    join_group(&mut sockets, n, packet.rx_frames)?;
    let mtu = sockets.first().map_or(1500, |s| s.mtu());
    let reliable = reliable_config(cfg, engine, mtu)?;
    let fault = (!cfg.fault.is_off()).then_some(FaultInjection {
        drop: cfg.fault.drop,
        duplicate: cfg.fault.duplicate,
        reorder: cfg.fault.reorder,
    });
    let seed = clock_seed();
    let setups = sockets
        .into_iter()
        .enumerate()
        .map(|(i, socket)| WireSetup {
            socket,
            ports: switch.clone(),
            reliable,
            fault: fault.map(|f| (f, cfg.fault.seed.wrapping_add(i as u64))),
            session_seed: seed.wrapping_add((i as u32) << 24),
        })
        .collect();
    engine.attach_uplink(setups)?;
    // Send-only: its RX ring is never read, so it gets the smallest.
    let out = PacketSocket::open(
        &cfg.iface,
        &PacketConfig {
            rx_frames: 1,
            ..PacketConfig::default()
        },
    )
    .map_err(|e| EngineError::Uplink(format!("the switch's socket: {e}")))?;
    out.send_only()
        .map_err(|e| EngineError::Uplink(format!("the switch's socket: {e}")))?;
    switch.set_uplink(Some(Arc::new(SwitchUplink(Mutex::new(out)))));
    info!(
        "uplink {}: {workers} worker socket(s) (MTU {mtu}, {} payload bytes per data frame), \
         peer timeout {:?}{}",
        cfg.iface,
        reliable.chunk,
        cfg.peer_timeout,
        if fault.is_some() {
            format!(", fault injection {:?}", cfg.fault)
        } else {
            String::new()
        }
    );
    Ok(())
}

/// Joins every socket to one fanout group of their own, in order (worker `i` is member `i`),
/// then empties their RX rings (of `ring` slots): until the last one joined, frames went to every socket (before
/// it joined, or to the members present so far), not to the worker that serves them.
fn join_group(sockets: &mut [PacketSocket], n: u16, ring: usize) -> Result<(), EngineError> {
    let Some((first, rest)) = sockets.split_first() else {
        return Ok(());
    };
    let group = first
        .create_fanout(n)
        .map_err(|e| EngineError::Uplink(format!("worker 0 creating its fanout group: {e}")))?;
    for (i, s) in rest.iter().enumerate() {
        s.join_fanout(group, n).map_err(|e| {
            EngineError::Uplink(format!(
                "worker {} joining fanout group {group}: {e}",
                i + 1
            ))
        })?;
    }
    let stale: usize = sockets
        .iter_mut()
        // What was in each ring when the group was complete: a flood arriving meanwhile does
        // not hold up the start.
        .map(|s| s.receive(ring, |_| {}))
        .sum();
    debug!("uplink: fanout group {group}; {stale} frame(s) from before it was complete dropped");
    Ok(())
}

/// The protocol's parameters for this uplink: fragments fit its MTU, the peer timeout is the
/// configured one, and the receiver's backpressure wait is the engine's.
fn reliable_config(
    cfg: &UplinkConfig,
    engine: &Engine,
    mtu: usize,
) -> Result<ReliableConfig, EngineError> {
    let mut r = ReliableConfig {
        chunk: DataMessage::fragment_capacity(mtu)
            .map_err(|e| EngineError::Uplink(format!("MTU {mtu}: {e}")))?,
        peer_timeout: cfg.peer_timeout,
        backpressure_wait: engine.config().backpressure_wait,
        ..ReliableConfig::default()
    };
    r.max_rto = r.max_rto.min(r.peer_timeout);
    r.initial_rto = r.initial_rto.min(r.max_rto);
    r.min_rto = r.min_rto.min(r.initial_rto);
    // A state blocked for the whole backpressure wait takes no frame meanwhile: it must outlive
    // that wait to reject its message, rather than expire and answer RESET.
    r.state_lifetime = r
        .state_lifetime
        .max(r.peer_timeout.saturating_mul(2))
        .max(r.backpressure_wait.saturating_mul(2));
    r.validate().map_err(EngineError::Uplink)?;
    Ok(r)
}

/// A seed that differs from one start to the next (session ids must not repeat across restarts).
fn clock_seed() -> u32 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| {
        (d.as_secs() as u32).wrapping_mul(1_000_003) ^ d.subsec_nanos()
    })
}

/// The switch's way out: frames of local guests for MACs not on this host, and broadcasts.
struct SwitchUplink(Mutex<PacketSocket>);

impl Uplink for SwitchUplink {
    fn transmit(&self, _from: PortId, frame: &[u8]) -> bool {
        let mut socket = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = socket.queue(frame) {
            svnic_control_plane::log_limited!(log::Level::Debug, "uplink: switch frame: {e}");
            return false;
        }
        // A frame the kernel did not take now stays queued and goes with a later flush.
        if let Err(e) = socket.flush() {
            svnic_control_plane::log_limited!(log::Level::Debug, "uplink: switch flush: {e}");
        }
        true
    }
}
