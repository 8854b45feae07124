//! The operator's view of a running daemon: a local Unix socket speaking one JSON request per
//! line and one JSON response per line (`server`), and the `svnic ctl` client that prints it
//! as tables (or as JSON for scripts).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

mod server;

pub use server::{
    AdminCounters, AdminOptions, AdminServer, ADMIN_IO_TIMEOUT, MAX_ADMIN_CONNECTIONS,
    MAX_REQUEST_LINE,
};

/// A request to the admin socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum AdminRequest {
    /// Every configured guest and every live pool member.
    Guests,
    /// Every guest pool.
    Pools,
    /// Every channel the control plane remembers.
    Channels,
    /// Engine-wide counters.
    Engine,
    /// The uplink's counters, per worker.
    Uplink,
}

/// One worker's side of the uplink, as the operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UplinkWorkerView {
    /// Worker index.
    pub worker: usize,
    /// Its counters by name (docs/wire.md, "Counters").
    pub counters: std::collections::BTreeMap<String, u64>,
}

impl UplinkWorkerView {
    /// The counter `name`, if there is one.
    pub fn counter(&self, name: &str) -> Option<u64> {
        self.counters.get(name).copied()
    }
}

/// One guest, as the operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestView {
    /// Name.
    pub name: String,
    /// MAC addresses it owns.
    pub macs: Vec<String>,
    /// Its vhost-user socket.
    pub socket: String,
    /// A frontend is connected.
    pub connected: bool,
    /// Live channels.
    pub channels: usize,
    /// Frames received from the guest (its TX).
    pub frames_in: u64,
    /// Frames delivered to the guest (its RX).
    pub frames_out: u64,
    /// Frames dropped (spoofed source, unknown destination, full queue, bad descriptors).
    pub drops: u64,
    /// Frontends refused by the socket's uid allow-list.
    #[serde(default)]
    pub refused_peers: u64,
    /// The pool it is a member of (none: a configured guest).
    #[serde(default)]
    pub pool: Option<String>,
    /// A pool member's process id, as the kernel recorded it at connect.
    #[serde(default)]
    pub peer_pid: Option<i32>,
    /// A pool member's uid.
    #[serde(default)]
    pub peer_uid: Option<u32>,
}

/// One guest pool, as the operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolView {
    /// Name.
    pub name: String,
    /// Its socket.
    pub socket: String,
    /// Its MAC range, FIRST-LAST.
    pub macs: String,
    /// Members at once.
    pub max: u32,
    /// Members live now.
    pub live: usize,
    /// Connections that became members since start.
    pub accepted: u64,
    /// Connections closed at once because the pool was full.
    pub refused_full: u64,
    /// Connections refused by the socket's uid allow-list.
    pub refused_peers: u64,
}

/// One channel, as the operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelView {
    /// Channel id.
    pub id: u32,
    /// Owning guest.
    pub guest: String,
    /// Address (MAC/endpoint).
    pub addr: String,
    /// Pending, Success, Failure(reason), Destroyed, or Faulted.
    pub state: String,
    /// Serving worker.
    pub worker: Option<u32>,
    /// CPU of the serving worker, if pinned.
    pub cpu: Option<u32>,
    /// Slots per ring.
    pub ring_size: u32,
    /// Messages taken from its TX ring.
    pub tx: u64,
    /// Of those, delivered.
    pub delivered: u64,
    /// Of those, error-completed.
    pub errors: u64,
    /// Messages delivered into its RX ring.
    pub rx: u64,
    /// DMA bytes delivered into it.
    pub rx_bytes: u64,
}

/// One worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerView {
    /// Index.
    pub worker: usize,
    /// Pinned CPU.
    pub cpu: Option<u32>,
    /// Channels served.
    pub channels: u64,
    /// TX messages processed.
    pub messages: u64,
    /// Times it slept.
    pub sleeps: u64,
    /// Doorbells received.
    pub doorbells: u64,
    /// Channels faulted.
    pub faults: u64,
}

/// Engine-wide view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineView {
    /// Workers.
    pub workers: Vec<WorkerView>,
    /// Control responses sent.
    pub control_requests: u64,
    /// Doorbells relayed.
    pub doorbells: u64,
    /// Wake frames sent.
    pub wakes: u64,
    /// svnic frames dropped by the frame handler (undecodable, spoofed, foreign channel).
    pub svnic_frame_drops: u64,
    /// Frames dropped by the switch, all ports.
    pub switch_drops: u64,
    /// Creates that became channels.
    #[serde(default)]
    pub creates_succeeded: u64,
    /// Creates refused by the control plane (policy, quota, rate limit), rate-limited included.
    #[serde(default)]
    pub creates_refused: u64,
    /// Of those, refused by the per-guest create rate limit.
    #[serde(default)]
    pub creates_rate_limited: u64,
    /// Creates admitted, then failed by the engine (region outside guest memory, ...).
    #[serde(default)]
    pub creates_failed: u64,
    /// Faults in guest memory the daemon recovered from (a frontend's memory file shrank or
    /// lost pages); each closed that frontend's connection.
    #[serde(default)]
    pub memory_faults: u64,
}

/// A response from the admin socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AdminResponse {
    /// Answer to [`AdminRequest::Guests`].
    Guests {
        /// The guests.
        guests: Vec<GuestView>,
    },
    /// Answer to [`AdminRequest::Pools`].
    Pools {
        /// The pools.
        pools: Vec<PoolView>,
    },
    /// Answer to [`AdminRequest::Channels`].
    Channels {
        /// The channels.
        channels: Vec<ChannelView>,
    },
    /// Answer to [`AdminRequest::Engine`].
    Engine(EngineView),
    /// Answer to [`AdminRequest::Uplink`].
    Uplink {
        /// The uplink's interface, if the daemon has one.
        iface: Option<String>,
        /// Each worker's counters.
        workers: Vec<UplinkWorkerView>,
    },
    /// The request could not be understood.
    Error {
        /// Why.
        message: String,
    },
}

/// What the admin server asks the daemon.
pub trait AdminSource: Send + Sync {
    /// Answers one request.
    fn answer(&self, req: AdminRequest) -> AdminResponse;
}

/// Errors of the admin client.
#[derive(Debug, Error)]
pub enum AdminError {
    /// The socket could not be reached.
    #[error("cannot reach the svnic daemon at {path}: {source} (is `svnic serve` running?)")]
    Connect {
        /// Socket path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// I/O on the socket failed.
    #[error("admin socket I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The answer was not valid JSON of the expected shape.
    #[error("bad answer from the daemon: {0}")]
    Json(#[from] serde_json::Error),
}

/// Client side: sends `req` to the daemon at `path` and returns its answer.
pub fn query(path: &Path, req: AdminRequest) -> Result<AdminResponse, AdminError> {
    let mut stream = UnixStream::connect(path).map_err(|source| AdminError::Connect {
        path: path.display().to_string(),
        source,
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut line = serde_json::to_vec(&req)?;
    line.push(b'\n');
    // A daemon that refuses the connection (busy) answers and closes at once, possibly before
    // the request is written: the answer it left is still read.
    if let Err(e) = stream.write_all(&line) {
        if !matches!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
        ) {
            return Err(e.into());
        }
    }
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer)?;
    Ok(serde_json::from_str(answer.trim())?)
}

fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref()
        .map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// Renders rows as an aligned text table.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(c.len());
            }
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{:<w$}", c, w = widths.get(i).copied().unwrap_or(0)))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.clone()));
        out.push('\n');
    }
    out
}

/// A record shown as one line of a table: its column names and its cells, in the same order.
trait TableRow {
    /// Column names.
    const HEADER: &'static [&'static str];
    /// The cells of this record.
    fn cells(&self) -> Vec<String>;
}

/// `rows` as a table.
fn table_of<R: TableRow>(rows: &[R]) -> String {
    table(R::HEADER, &rows.iter().map(R::cells).collect::<Vec<_>>())
}

impl TableRow for GuestView {
    const HEADER: &'static [&'static str] = &[
        "NAME",
        "MAC",
        "SOCKET",
        "CONNECTED",
        "CHANNELS",
        "FRAMES-IN",
        "FRAMES-OUT",
        "DROPS",
        "REFUSED",
        "POOL",
        "PID",
        "UID",
    ];
    fn cells(&self) -> Vec<String> {
        vec![
            self.name.clone(),
            self.macs.join(","),
            self.socket.clone(),
            if self.connected { "yes" } else { "no" }.to_string(),
            self.channels.to_string(),
            self.frames_in.to_string(),
            self.frames_out.to_string(),
            self.drops.to_string(),
            self.refused_peers.to_string(),
            opt(&self.pool),
            opt(&self.peer_pid),
            opt(&self.peer_uid),
        ]
    }
}

impl TableRow for PoolView {
    const HEADER: &'static [&'static str] = &[
        "NAME", "SOCKET", "MACS", "MAX", "LIVE", "ACCEPTED", "FULL", "REFUSED",
    ];
    fn cells(&self) -> Vec<String> {
        vec![
            self.name.clone(),
            self.socket.clone(),
            self.macs.clone(),
            self.max.to_string(),
            self.live.to_string(),
            self.accepted.to_string(),
            self.refused_full.to_string(),
            self.refused_peers.to_string(),
        ]
    }
}

impl TableRow for ChannelView {
    const HEADER: &'static [&'static str] = &[
        "ID",
        "GUEST",
        "ADDR",
        "STATE",
        "WORKER",
        "CPU",
        "RING",
        "TX",
        "DELIVERED",
        "ERRORS",
        "RX",
        "RX-BYTES",
    ];
    fn cells(&self) -> Vec<String> {
        vec![
            self.id.to_string(),
            self.guest.clone(),
            self.addr.clone(),
            self.state.clone(),
            opt(&self.worker),
            opt(&self.cpu),
            self.ring_size.to_string(),
            self.tx.to_string(),
            self.delivered.to_string(),
            self.errors.to_string(),
            self.rx.to_string(),
            self.rx_bytes.to_string(),
        ]
    }
}

impl TableRow for WorkerView {
    const HEADER: &'static [&'static str] = &[
        "WORKER",
        "CPU",
        "CHANNELS",
        "MESSAGES",
        "SLEEPS",
        "DOORBELLS",
        "FAULTS",
    ];
    fn cells(&self) -> Vec<String> {
        vec![
            self.worker.to_string(),
            opt(&self.cpu),
            self.channels.to_string(),
            self.messages.to_string(),
            self.sleeps.to_string(),
            self.doorbells.to_string(),
            self.faults.to_string(),
        ]
    }
}

/// Renders a response for humans.
pub fn render(resp: &AdminResponse) -> String {
    match resp {
        AdminResponse::Guests { guests } => table_of(guests),
        AdminResponse::Pools { pools } => table_of(pools),
        AdminResponse::Channels { channels } => table_of(channels),
        AdminResponse::Engine(e) => {
            let mut s = table_of(&e.workers);
            s.push_str(&format!(
                "control responses {}  doorbells {}  wakes {}  svnic-frame drops {}  switch drops {}\n",
                e.control_requests, e.doorbells, e.wakes, e.svnic_frame_drops, e.switch_drops
            ));
            s.push_str(&format!(
                "creates: succeeded {}  refused {} (rate-limited {})  failed {}  \
                 guest memory faults recovered {}\n",
                e.creates_succeeded,
                e.creates_refused,
                e.creates_rate_limited,
                e.creates_failed,
                e.memory_faults
            ));
            s
        }
        AdminResponse::Uplink { iface, workers } => match iface {
            None => "no uplink\n".to_string(),
            Some(iface) => {
                let mut header = vec!["COUNTER".to_string()];
                header.extend(workers.iter().map(|w| format!("WORKER-{}", w.worker)));
                let header: Vec<&str> = header.iter().map(String::as_str).collect();
                let names: Vec<&String> = workers
                    .first()
                    .map(|w| w.counters.keys().collect())
                    .unwrap_or_default();
                let rows: Vec<Vec<String>> = names
                    .iter()
                    .map(|n| {
                        let mut row = vec![n.to_string()];
                        row.extend(
                            workers
                                .iter()
                                .map(|w| w.counter(n).unwrap_or(0).to_string()),
                        );
                        row
                    })
                    .collect();
                format!("uplink {iface}\n{}", table(&header, &rows))
            }
        },
        AdminResponse::Error { message } => format!("error: {message}\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    struct Fixed;
    impl AdminSource for Fixed {
        fn answer(&self, req: AdminRequest) -> AdminResponse {
            match req {
                AdminRequest::Guests => AdminResponse::Guests {
                    guests: vec![GuestView {
                        name: "vm1".into(),
                        macs: vec!["52:54:00:00:00:01".into()],
                        socket: "/tmp/vm1.sock".into(),
                        connected: true,
                        channels: 2,
                        frames_in: 10,
                        frames_out: 11,
                        drops: 0,
                        refused_peers: 0,
                        pool: None,
                        peer_pid: None,
                        peer_uid: None,
                    }],
                },
                _ => AdminResponse::Error {
                    message: "n/a".into(),
                },
            }
        }
    }

    #[test]
    fn a_request_round_trips_over_the_socket_and_renders() {
        let path =
            std::env::temp_dir().join(format!("svnic-admin-test-{}.sock", std::process::id()));
        let server = AdminServer::start(&path, Arc::new(Fixed), &AdminOptions::default()).unwrap();
        let resp = query(&path, AdminRequest::Guests).unwrap();
        let text = render(&resp);
        assert!(
            text.contains("vm1") && text.contains("CONNECTED") && text.contains("yes"),
            "{text}"
        );
        // Garbage gets an error answer, and the server keeps serving.
        let mut s = UnixStream::connect(&path).unwrap();
        s.write_all(b"{not json}\n").unwrap();
        let mut answer = String::new();
        BufReader::new(s).read_line(&mut answer).unwrap();
        assert!(answer.contains("bad request"), "{answer}");
        assert!(query(&path, AdminRequest::Guests).is_ok());
        drop(server);
        assert!(!path.exists(), "socket removed on shutdown");
        assert!(matches!(
            query(&path, AdminRequest::Guests),
            Err(AdminError::Connect { .. })
        ));
    }
}
