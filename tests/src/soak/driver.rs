//! The soak driver: starts the daemon and the guest processes, kills and restarts guests while
//! the traffic runs, then stops everything in order and checks the books.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use svnic_backend::admin::ChannelView;

use super::{soak_mac, Rng, SoakConfig};
use crate::daemon_proc::{GuestSpec, ServeOptions, Svnic};
use crate::vm::{KillOnDrop, ScratchDir};

/// How long SIGTERM may take (issue 13).
const SIGTERM_LIMIT: Duration = Duration::from_secs(5);
/// Lines of the daemon's log a failure report ends with.
const LOG_TAIL_LINES: usize = 30;
/// Generous: the machine may be loaded, and 64 guests settle one after another.
const PHASE_TIMEOUT: Duration = Duration::from_secs(120);

/// What one guest process said last.
#[derive(Debug, Default)]
struct Seen {
    progress: Option<Value>,
    settled: Option<Value>,
    report: Option<Value>,
}

struct GuestProc {
    child: KillOnDrop,
    stdin: Option<ChildStdin>,
    seen: Arc<Mutex<Seen>>,
    log: PathBuf,
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(|e| e.into_inner())
}

impl GuestProc {
    fn spawn(
        cfg: &SoakConfig,
        dir: &std::path::Path,
        index: u32,
        life: u64,
    ) -> Result<Self, String> {
        let log = dir.join(format!("guest-{index}.log"));
        let log_file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let seed = cfg.seed ^ (u64::from(index) << 32) ^ life.wrapping_mul(0x9e37_79b9);
        let mut child = Command::new(&cfg.soak_bin)
            .arg("guest")
            .arg("--socket")
            .arg(socket(dir, index))
            .args(["--index", &index.to_string()])
            .args(["--guests", &cfg.guests.to_string()])
            .args(["--channels", &cfg.channels.to_string()])
            .args(["--seed", &seed.to_string()])
            .args(["--tick-ms", &cfg.tick.as_millis().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", cfg.soak_bin.display()))?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| "guest without stdout".to_string())?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let sink = seen.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Some((kind, body)) = line.split_once(' ') else {
                    continue;
                };
                let Ok(v) = serde_json::from_str::<Value>(body) else {
                    continue;
                };
                let mut s = lock(&sink);
                match kind {
                    "PROGRESS" => s.progress = Some(v),
                    "SETTLED" => s.settled = Some(v),
                    "REPORT" => {
                        s.progress = v.get("totals").cloned();
                        s.report = Some(v);
                    }
                    _ => {}
                }
            }
        });
        Ok(GuestProc {
            child: KillOnDrop(child),
            stdin,
            seen,
            log,
        })
    }

    fn tell(&mut self, cmd: &str) -> Result<(), String> {
        let stdin = self.stdin.as_mut().ok_or("stdin closed")?;
        writeln!(stdin, "{cmd}")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("cannot tell a guest '{cmd}': {e}"))
    }

    fn check_alive(&mut self, index: u32) -> Result<(), String> {
        match self.child.0.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "guest {index} exited on its own ({status}):\n{}",
                tail(&self.log)
            )),
            Err(e) => Err(format!("guest {index}: {e}")),
        }
    }

    fn kill(&mut self) {
        let _ = self.child.0.kill(); // SIGKILL
        let _ = self.child.0.wait();
    }
}

fn tail(path: &std::path::Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

fn socket(dir: &std::path::Path, index: u32) -> PathBuf {
    dir.join(format!("g{index}.sock"))
}

/// Sums of the guests' own counts.
#[derive(Debug, Default, Clone, Copy)]
pub struct GuestTotals {
    /// Messages the guests' TX rings accepted.
    pub accepted: u64,
    /// Completions: delivered.
    pub ok: u64,
    /// Completions: errors.
    pub errors: u64,
    /// Messages received.
    pub received: u64,
    /// Channels created.
    pub creates: u64,
    /// Creates refused.
    pub create_failures: u64,
    /// Channels destroyed by their guest.
    pub destroys: u64,
}

impl GuestTotals {
    fn add(&mut self, v: &Value) {
        let n = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
        self.accepted += n("accepted");
        self.ok += n("ok");
        self.errors += n("errors");
        self.received += n("received");
        self.creates += n("creates");
        self.create_failures += n("create_failures");
        self.destroys += n("destroys");
    }
}

/// The soak's figures.
#[derive(Debug, Clone)]
pub struct SoakReport {
    /// Guests and channels per guest.
    pub guests: u32,
    /// Channels per guest at most.
    pub channels: u32,
    /// How long the traffic ran.
    pub ran: Duration,
    /// The daemon's pid (the same throughout).
    pub pid: libc::pid_t,
    /// Guest processes SIGKILLed (each restarted).
    pub kills: u64,
    /// What the guests counted (killed guests: as of their last progress line).
    pub totals: GuestTotals,
    /// Channels alive at the end, and the messages their TX rings took.
    pub live_channels: usize,
    /// Of the live channels: messages taken, as the daemon counts.
    pub live_tx: u64,
    /// RSS and fds: before any guest, the highest seen, after every guest was gone.
    pub baseline: Usage,
    /// Highest seen.
    pub peak: Usage,
    /// At the end.
    pub end: Usage,
    /// From SIGTERM to exit.
    pub sigterm: Duration,
}

impl fmt::Display for SoakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.totals;
        writeln!(
            f,
            "soak: {} guests x {} channels for {:.0} s against svnic serve pid {} (never restarted)",
            self.guests,
            self.channels,
            self.ran.as_secs_f64(),
            self.pid
        )?;
        writeln!(
            f,
            "soak: messages accepted {}, delivered {}, error-completed {}, received {} (as the \
             guests count them; a killed guest's as of its last progress line)",
            t.accepted, t.ok, t.errors, t.received
        )?;
        writeln!(
            f,
            "soak: channels created {} (refused {}), destroyed by their guest {}, guests killed \
             and restarted {}",
            t.creates, t.create_failures, t.destroys, self.kills
        )?;
        writeln!(
            f,
            "soak: at the end {} live channels, {} messages taken by them, every one delivered \
             or error-completed (daemon and guests agree exactly)",
            self.live_channels, self.live_tx
        )?;
        writeln!(
            f,
            "soak: daemon RSS baseline {} KiB, peak {} KiB, end {} KiB; fds baseline {}, peak {}, \
             end {}",
            self.baseline.rss_kib,
            self.peak.rss_kib,
            self.end.rss_kib,
            self.baseline.fds,
            self.peak.fds,
            self.end.fds
        )?;
        write!(f, "soak: SIGTERM to exit {} ms", self.sigterm.as_millis())
    }
}

/// Resident memory and open fds of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// VmRSS, KiB.
    pub rss_kib: u64,
    /// Entries of /proc/PID/fd.
    pub fds: u64,
}

/// The daemon's RSS and open fds now.
fn usage(daemon: &Svnic) -> Result<Usage, String> {
    Ok(Usage {
        rss_kib: daemon.rss_kib()?,
        fds: daemon.fd_count()? as u64,
    })
}

fn peak(a: Usage, b: Usage) -> Usage {
    Usage {
        rss_kib: a.rss_kib.max(b.rss_kib),
        fds: a.fds.max(b.fds),
    }
}

/// Runs the soak; the figures, or everything that went wrong.
pub fn run(cfg: &SoakConfig) -> Result<SoakReport, String> {
    if cfg.guests < 2 || cfg.channels == 0 {
        return Err("the soak needs at least 2 guests and 1 channel each".into());
    }
    let scratch = ScratchDir::new("soak").map_err(|e| format!("scratch dir: {e}"))?;
    // The sockets' directory is private, as the daemon's own directory will be.
    let dir = scratch.path().join("run");
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut daemon = start_daemon(cfg, &dir)?;
    let result = drive(cfg, &dir, &mut daemon);
    match result {
        Ok(mut report) => {
            let start = Instant::now();
            let status = daemon
                .terminate_within(SIGTERM_LIMIT)
                .map_err(|e| format!("{e}\n{}", daemon.log_tail(LOG_TAIL_LINES)))?;
            if !status.success() {
                return Err(format!("svnic serve exited with {status} after SIGTERM"));
            }
            report.sigterm = start.elapsed();
            Ok(report)
        }
        Err(e) => Err(format!(
            "{e}\n-- svnic serve log (tail):\n{}",
            daemon.log_tail(LOG_TAIL_LINES)
        )),
    }
}

/// Starts `svnic serve` with one guest per soak guest (`name=sN`, MAC `soak_mac(N)`,
/// `cfg.channels` channels at most, its socket in `dir`), the daemon's default worker count,
/// and warnings only in its log.
fn start_daemon(cfg: &SoakConfig, dir: &std::path::Path) -> Result<Svnic, String> {
    let guests: Vec<GuestSpec> = (0..cfg.guests)
        .map(|i| GuestSpec {
            name: format!("s{i}"),
            socket: socket(dir, i),
            mac: soak_mac(i).to_string(),
        })
        .collect();
    let opts = ServeOptions {
        workers: None,
        guest_channels: Some(cfg.channels),
        rust_log: "warn",
        start_timeout: Duration::from_secs(30),
        ..ServeOptions::default()
    };
    Svnic::start_with(&cfg.svnic, dir, &guests, &opts)
}

fn drive(
    cfg: &SoakConfig,
    dir: &std::path::Path,
    daemon: &mut Svnic,
) -> Result<SoakReport, String> {
    std::thread::sleep(Duration::from_millis(300));
    let baseline = usage(daemon)?;
    let mut high = baseline;
    let mut rng = Rng::new(cfg.seed);
    let mut fleet = Vec::new();
    for i in 0..cfg.guests {
        fleet.push(GuestProc::spawn(cfg, dir, i, 0)?);
    }
    let mut killed = GuestTotals::default();
    let mut kills = 0u64;
    let start = Instant::now();
    let mut next_kill = start + cfg.kill_every;
    while start.elapsed() < cfg.duration {
        daemon.check_alive()?;
        high = peak(high, usage(daemon)?);
        for (i, g) in fleet.iter_mut().enumerate() {
            g.check_alive(i as u32)?;
        }
        if Instant::now() >= next_kill {
            next_kill += cfg.kill_every;
            let i = rng.below(u64::from(cfg.guests)) as u32;
            let g = &mut fleet[i as usize];
            g.kill();
            if let Some(p) = &lock(&g.seen).progress {
                killed.add(p);
            }
            kills += 1;
            *g = GuestProc::spawn(cfg, dir, i, kills)?;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let ran = start.elapsed();

    // Quiesce: every guest stops sending and waits for its own messages to come back.
    for g in &mut fleet {
        g.tell("stop")?;
    }
    wait_all(&fleet, daemon, "SETTLED", |s| s.settled.is_some())?;
    let mut problems = Vec::new();
    for (i, g) in fleet.iter().enumerate() {
        let settled = lock(&g.seen).settled.clone();
        if settled
            .as_ref()
            .and_then(|v| v.get("settled"))
            .and_then(Value::as_bool)
            != Some(true)
        {
            problems.push(format!(
                "guest {i}: some accepted messages never came back as delivered or error-completed"
            ));
        }
    }
    // Nothing is in flight now: the guests' counts are final.
    for g in &mut fleet {
        g.tell("report")?;
    }
    wait_all(&fleet, daemon, "REPORT", |s| s.report.is_some())?;
    let mut totals = killed;
    let mut guest_channels = BTreeMap::new();
    for (i, g) in fleet.iter().enumerate() {
        let seen = lock(&g.seen);
        let Some(report) = &seen.report else { continue };
        if let Some(t) = report.get("totals") {
            totals.add(t);
            for k in ["unsettled_destroys", "anomaly_count"] {
                let n = t.get(k).and_then(Value::as_u64).unwrap_or(0);
                if n > 0 {
                    problems.push(format!("guest {i}: {k} = {n}: {}", t["anomalies"]));
                }
            }
        }
        for c in report["channels"].as_array().into_iter().flatten() {
            let id = c["id"].as_u64().unwrap_or(u64::MAX);
            guest_channels.insert(id, (i, c.clone()));
        }
    }
    high = peak(high, usage(daemon)?);
    let (live_channels, live_tx) = check_books(daemon, &guest_channels, &mut problems)?;

    // The guests leave (stdin closed: each exits 0 and its connection closes).
    for g in &mut fleet {
        g.stdin = None;
    }
    let deadline = Instant::now() + PHASE_TIMEOUT;
    for (i, g) in fleet.iter_mut().enumerate() {
        match g.child.wait_until(deadline) {
            Ok(Some(status)) if status.success() => {}
            Ok(Some(status)) => {
                problems.push(format!("guest {i} exited with {status}:\n{}", tail(&g.log)))
            }
            Ok(None) => problems.push(format!("guest {i} did not exit when told to")),
            Err(e) => problems.push(format!("guest {i}: {e}")),
        }
    }
    let end = back_to_baseline(cfg, daemon, baseline, &mut problems)?;
    daemon.check_alive()?;
    if !problems.is_empty() {
        return Err(format!("soak failed:\n- {}", problems.join("\n- ")));
    }
    Ok(SoakReport {
        guests: cfg.guests,
        channels: cfg.channels,
        ran,
        pid: daemon.pid(),
        kills,
        totals,
        live_channels,
        live_tx,
        baseline,
        peak: high,
        end,
        sigterm: Duration::ZERO,
    })
}

/// Waits until `done` holds for every guest's last words.
fn wait_all(
    fleet: &[GuestProc],
    daemon: &mut Svnic,
    what: &str,
    done: impl Fn(&Seen) -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + PHASE_TIMEOUT;
    loop {
        daemon.check_alive()?;
        let missing: Vec<usize> = (0..fleet.len())
            .filter(|&i| !done(&lock(&fleet[i].seen)))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "no {what} from guests {missing:?} within {PHASE_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The daemon's per-channel counters against the guests' own: the same channels, and for each
/// `tx == delivered + errors`, the guest's accepted == tx, its Ok completions == delivered,
/// its error completions == errors, its received == rx. The live channels and their tx.
fn check_books(
    daemon: &Svnic,
    guest_channels: &BTreeMap<u64, (usize, Value)>,
    problems: &mut Vec<String>,
) -> Result<(usize, u64), String> {
    let listed = daemon.channels()?;
    // Every channel listed, destroyed ones included, must balance.
    for c in &listed {
        if c.tx != c.delivered + c.errors {
            problems.push(format!(
                "channel {} ({}, {}): tx {} != delivered {} + errors {}",
                c.id, c.guest, c.state, c.tx, c.delivered, c.errors
            ));
        }
    }
    let channels: Vec<_> = listed.into_iter().filter(is_live).collect();
    let mut live_tx = 0;
    let mut seen = std::collections::BTreeSet::new();
    for c in &channels {
        seen.insert(u64::from(c.id));
        live_tx += c.tx;
        let Some((g, mine)) = guest_channels.get(&u64::from(c.id)) else {
            problems.push(format!(
                "channel {} ({}, {}) is live in the daemon but no guest holds it",
                c.id, c.guest, c.state
            ));
            continue;
        };
        let n = |k: &str| mine[k].as_u64().unwrap_or(u64::MAX);
        for (what, guest, daemon) in [
            ("accepted/tx", n("accepted"), c.tx),
            ("ok/delivered", n("ok"), c.delivered),
            ("errors", n("errors"), c.errors),
            ("received/rx", n("received"), c.rx),
        ] {
            if guest != daemon {
                problems.push(format!(
                    "channel {} of guest {g}: {what}: the guest counts {guest}, the daemon {daemon}",
                    c.id
                ));
            }
        }
    }
    for (id, (g, _)) in guest_channels {
        if !seen.contains(id) {
            problems.push(format!(
                "guest {g} holds channel {id}, which the daemon does not list"
            ));
        }
    }
    Ok((channels.len(), live_tx))
}

/// A channel that holds resources: not Destroyed, not Failure(..).
fn is_live(c: &ChannelView) -> bool {
    c.state != "Destroyed" && !c.state.starts_with("Failure")
}

/// Waits until no guest is connected and no channel is left, then until the daemon's RSS and
/// fds are back within the slack of their baseline; its usage then.
fn back_to_baseline(
    cfg: &SoakConfig,
    daemon: &mut Svnic,
    baseline: Usage,
    problems: &mut Vec<String>,
) -> Result<Usage, String> {
    let deadline = Instant::now() + PHASE_TIMEOUT;
    loop {
        daemon.check_alive()?;
        let gone = daemon.guests()?.iter().all(|g| !g.connected)
            && !daemon.channels()?.iter().any(is_live);
        if gone {
            break;
        }
        if Instant::now() >= deadline {
            problems
                .push("guests still connected or channels left after every guest exited".into());
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = usage(daemon)?;
        let rss_ok = now.rss_kib <= baseline.rss_kib + cfg.rss_slack_kib;
        let fds_ok = now.fds <= baseline.fds + cfg.fd_slack;
        if rss_ok && fds_ok {
            return Ok(now);
        }
        if Instant::now() >= deadline {
            problems.push(format!(
                "the daemon did not return to its baseline: RSS {} KiB (baseline {} + {} \
                 allowed), fds {} (baseline {} + {} allowed)",
                now.rss_kib,
                baseline.rss_kib,
                cfg.rss_slack_kib,
                now.fds,
                baseline.fds,
                cfg.fd_slack
            ));
            return Ok(now);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
