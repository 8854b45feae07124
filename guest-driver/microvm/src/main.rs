//! `svnic-microvm`: detect what KVM runs natively here, or run the bypass guest program against
//! a peer through `svnic serve`.
//!
//! ```text
//! svnic-microvm detect
//! svnic-microvm bypass --socket PATH --peer MAC/ENDPOINT [--endpoint N] [--count N]
//!                      [--ring-size N] [--memory-mib N] [--timeout-secs N]
//! ```
//! `detect` exits 0 when 64-bit user mode runs natively, 2 when it does not, 1 on error.

use std::process::ExitCode;
use std::time::Duration;

use svnic_channels::{ChannelAddr, MacAddr};
use svnic_microvm::{detect, run_bypass, BypassConfig};

const USAGE: &str = "usage: svnic-microvm detect\n       svnic-microvm bypass --socket PATH \
--peer MAC/ENDPOINT [--endpoint N] [--count N] [--ring-size N] [--memory-mib N] [--timeout-secs N]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("detect") if args.len() == 1 => cmd_detect(),
        Some("bypass") => parse_bypass(&args[1..]).and_then(|cfg| cmd_bypass(&cfg)),
        _ => Err(USAGE.to_string()),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("svnic-microvm: {e}");
            ExitCode::FAILURE
        }
    }
}

fn cmd_detect() -> Result<ExitCode, String> {
    let report = detect().map_err(|e| format!("no usable KVM: {e}"))?;
    println!("{report}");
    Ok(if report.cpl3_native() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}

fn cmd_bypass(cfg: &BypassConfig) -> Result<ExitCode, String> {
    let report = detect().map_err(|e| format!("no usable KVM: {e}"))?;
    println!("{report}");
    let r = run_bypass(cfg).map_err(|e| e.to_string())?;
    println!(
        "bypass: {} → {}: {} of {} messages; {}",
        r.addr,
        cfg.peer,
        r.result.done,
        r.count,
        r.result.describe()
    );
    println!(
        "run: {:?}, {} user-space exit(s) ({} by signals)",
        r.run.elapsed, r.run.user_exits, r.run.interrupted
    );
    match &r.stats {
        Some(s) => println!("KVM exit counters over the run: {:?}", s.exits()),
        None => println!("KVM exit counters: no binary statistics on this kernel"),
    }
    Ok(if r.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn parse_bypass(args: &[String]) -> Result<BypassConfig, String> {
    let mut cfg = BypassConfig {
        socket: Default::default(),
        memory_size: 64 << 20,
        endpoint: 1,
        ring_size: svnic_channels::layout::DEFAULT_RING_SIZE,
        peer: ChannelAddr {
            mac: MacAddr([0; 6]),
            endpoint: 0,
        },
        count: 1000,
        seed: 0x5eed_0000_0000,
        timeout: Duration::from_secs(10),
    };
    let (mut socket, mut peer) = (false, false);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let num = || {
            value
                .parse::<u64>()
                .map_err(|e| format!("{flag} {value}: {e}"))
        };
        match flag.as_str() {
            "--socket" => {
                cfg.socket = value.into();
                socket = true;
            }
            "--peer" => {
                let (mac, ep) = value
                    .split_once('/')
                    .ok_or_else(|| format!("--peer {value}: expected MAC/ENDPOINT"))?;
                cfg.peer = ChannelAddr {
                    mac: mac.parse().map_err(|e| format!("--peer {value}: {e}"))?,
                    endpoint: ep.parse().map_err(|e| format!("--peer {value}: {e}"))?,
                };
                peer = true;
            }
            "--endpoint" => {
                cfg.endpoint = value
                    .parse()
                    .map_err(|e| format!("--endpoint {value}: {e}"))?
            }
            "--count" => cfg.count = num()?,
            "--ring-size" => {
                cfg.ring_size = value
                    .parse()
                    .map_err(|e| format!("--ring-size {value}: {e}"))?
            }
            "--memory-mib" => cfg.memory_size = num()?.saturating_mul(1 << 20),
            "--timeout-secs" => cfg.timeout = Duration::from_secs(num()?),
            _ => return Err(format!("unknown option {flag}\n{USAGE}")),
        }
    }
    if !socket || !peer {
        return Err(format!("bypass needs --socket and --peer\n{USAGE}"));
    }
    Ok(cfg)
}
