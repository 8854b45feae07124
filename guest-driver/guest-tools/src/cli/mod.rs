//! # `svnic-guest`: the measurement tools as a program
//!
//! `ping`/`echo` (round trips) and `perf`/`sink` (streaming) over four paths — channel
//! user-data, channel DMA-data, virtio-net frames, kernel UDP — in both transports: VM mode
//! (`--agent`, through `svnic-guestd`) and host-process mode (`--socket`, the process is a
//! virtio-user guest of the daemon). The measurements are [`crate::measure`]'; this module picks
//! the transport, runs them and prints a [`Report`] (text, or JSON with `--json`).
//!
//! Responders (`echo`, `sink`) print `svnic-guest <tool>: ready ...` on stderr once they can be
//! reached; initiators (`ping`, `perf`) probe the peer until it answers (up to `--wait`), so
//! the two sides may be started in any order.

mod args;
mod crash;
mod frames;
mod run;
mod transport;

pub use args::{
    Cli, Command, Common, CrashTestArgs, EchoArgs, PathKind, PerfArgs, PingArgs, SinkArgs,
};
pub use run::{common_of, drop_privileges, run};

use serde_json::json;
use thiserror::Error;

use crate::measure::{LatencyStats, Throughput};

/// What went wrong.
#[derive(Debug, Error)]
pub enum CliError {
    /// The options do not make sense together.
    #[error("{0}")]
    Usage(String),
    /// A step failed.
    #[error("{what}: {source}")]
    Failed {
        /// The step.
        what: String,
        /// Why: the error of the step (a sentence where no error type exists).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl CliError {
    pub(crate) fn failed(
        what: impl Into<String>,
        why: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        CliError::Failed {
            what: what.into(),
            source: why.into(),
        }
    }
}

/// What a tool measured.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Round trips.
    Latency(LatencyStats),
    /// A stream, as sent (perf) or as received (sink).
    Stream(Throughput),
    /// Messages an echo answered.
    Echoed(u64),
    /// crash-test: the killed application and how long until its endpoint was free again.
    Reclaimed {
        /// Process id of the killed application.
        pid: u32,
        /// From the kill to a successful create at the same endpoint.
        after: std::time::Duration,
    },
}

/// The result of one run, printed as text or JSON.
#[derive(Debug, Clone)]
pub struct Report {
    /// ping, echo, perf or sink.
    pub tool: &'static str,
    /// "vm" or "host-process".
    pub mode: &'static str,
    /// The path.
    pub path: PathKind,
    /// Payload bytes per message (0 for echo).
    pub size: usize,
    /// Messages asked for.
    pub count: u64,
    /// This side's address (channel MAC/endpoint, MAC, or IP:port).
    pub local: String,
    /// The peer's address, if this side named it.
    pub peer: Option<String>,
    /// The numbers.
    pub outcome: Outcome,
}

fn us(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

impl Report {
    /// One line (or two) for humans.
    pub fn text(&self) -> String {
        let to = self
            .peer
            .as_ref()
            .map_or(String::new(), |p| format!(" to {p}"));
        let head = format!(
            "{} {} ({}) from {}{to}",
            self.tool,
            self.path.name(),
            self.mode,
            self.local
        );
        match &self.outcome {
            Outcome::Latency(s) => format!(
                "{head}: {} round trips of {} B: min {:.1} us, p50 {:.1} us, p99 {:.1} us, \
                 mean {:.1} us",
                s.count,
                self.size,
                us(s.min),
                us(s.p50),
                us(s.p99),
                us(s.mean)
            ),
            Outcome::Stream(t) => format!(
                "{head}: {} messages, {} bytes in {:.3} s: {:.0} msgs/s, {:.2} MB/s",
                t.messages,
                t.bytes,
                t.elapsed.as_secs_f64(),
                t.messages_per_sec(),
                t.bytes_per_sec() / 1e6
            ),
            Outcome::Echoed(n) => format!("{head}: answered {n} messages"),
            Outcome::Reclaimed { pid, after } => format!(
                "{head}: application pid {pid} killed holding the channel; the endpoint was \
                 free again after {:.1} ms (its channel was destroyed with the engine)",
                after.as_secs_f64() * 1e3
            ),
        }
    }

    /// One JSON object.
    pub fn json(&self) -> serde_json::Value {
        let mut v = json!({
            "tool": self.tool,
            "mode": self.mode,
            "path": self.path.name(),
            "size": self.size,
            "count": self.count,
            "local": self.local,
            "peer": self.peer,
        });
        let extra = match &self.outcome {
            Outcome::Latency(s) => json!({
                "round_trips": s.count,
                "min_us": us(s.min),
                "p50_us": us(s.p50),
                "p99_us": us(s.p99),
                "mean_us": us(s.mean),
            }),
            Outcome::Stream(t) => json!({
                "messages": t.messages,
                "bytes": t.bytes,
                "seconds": t.elapsed.as_secs_f64(),
                "messages_per_sec": t.messages_per_sec(),
                "bytes_per_sec": t.bytes_per_sec(),
            }),
            Outcome::Echoed(n) => json!({ "echoed": n }),
            Outcome::Reclaimed { pid, after } => json!({
                "killed_pid": pid,
                "reclaimed_ms": after.as_secs_f64() * 1e3,
            }),
        };
        if let (Some(o), serde_json::Value::Object(e)) = (v.as_object_mut(), extra) {
            o.extend(e);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use clap::Parser;

    use super::*;

    #[test]
    fn reports_read_as_text_and_json() {
        let r = Report {
            tool: "ping",
            mode: "vm",
            path: PathKind::User,
            size: 32,
            count: 3,
            local: "52:54:00:00:00:01/2".into(),
            peer: Some("52:54:00:00:00:02/1".into()),
            outcome: Outcome::Latency(LatencyStats::from_samples(vec![
                Duration::from_micros(10),
                Duration::from_micros(20),
                Duration::from_micros(30),
            ])),
        };
        let t = r.text();
        assert!(t.contains("min 10.0 us, p50 20.0 us, p99 30.0 us"), "{t}");
        let j = r.json();
        assert_eq!(j["tool"], "ping");
        assert_eq!(j["p50_us"], 20.0);
        assert_eq!(j["peer"], "52:54:00:00:00:02/1");
        let s = Report {
            tool: "sink",
            peer: None,
            outcome: Outcome::Stream(Throughput {
                messages: 1000,
                bytes: 32_000,
                elapsed: Duration::from_millis(500),
            }),
            ..r
        };
        assert_eq!(s.json()["messages_per_sec"], 2000.0);
        assert!(s.text().contains("2000 msgs/s"), "{}", s.text());
    }

    #[test]
    fn the_command_line_parses() {
        let c = Cli::try_parse_from([
            "svnic-guest",
            "ping",
            "--agent",
            "/run/svnic/agent.sock",
            "--path",
            "dma",
            "--peer",
            "52:54:00:00:00:02/1",
            "--json",
        ])
        .unwrap();
        let Command::Ping(p) = c.command else {
            panic!()
        };
        assert_eq!(p.common.path, PathKind::Dma);
        assert!(p.common.json);
        assert_eq!(p.count, 1000);
        assert!(
            Cli::try_parse_from(["svnic-guest", "echo", "--agent", "/a", "--socket", "/b"])
                .is_err()
        );
        assert!(
            Cli::try_parse_from(["svnic-guest", "ping"]).is_err(),
            "--peer"
        );
    }
}
