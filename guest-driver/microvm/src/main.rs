//! `svnic-microvm`: detect what KVM runs natively here, run the bypass guest program against a
//! peer through `svnic serve`, or be that peer (a host-process echo).
//!
//! ```text
//! svnic-microvm detect
//! svnic-microvm bypass --socket PATH --peer MAC/ENDPOINT [--mode bypass|doorbell|mediated]
//!                      [--endpoint N] [--count N] [--dma-len BYTES] [--ring-size N]
//!                      [--memory-mib N] [--timeout-secs N]
//! svnic-microvm echo --socket PATH [--endpoint N] [--count N] [--ring-size N] [--timeout-secs N]
//!                    [--yields N]
//! svnic-microvm bench --socket PATH --peer MAC/ENDPOINT [--rounds N] [--floor-cpus A,B] [...]
//! ```
//! `detect` exits 0 when 64-bit user mode runs natively, 2 when it does not, 1 on error.

use std::process::ExitCode;
use std::time::Duration;

use svnic_channels::{ChannelAddr, MacAddr};
use svnic_client::WaitPolicy;
use svnic_host_frontend::HostGuest;
use svnic_microvm::bench::{self, BenchConfig};
use svnic_microvm::{
    detect, detect_all, peer, run_bypass, BypassArgs, BypassConfig, DataPath, MicroVmError, Payload,
};

const USAGE: &str = concat!(
    "usage: svnic-microvm detect\n",
    "       svnic-microvm bypass --socket PATH --peer MAC/ENDPOINT\n",
    "                            [--mode bypass|doorbell|mediated] [--endpoint N] [--count N]\n",
    "                            [--dma-len BYTES] [--ring-size N] [--memory-mib N]\n",
    "                            [--timeout-secs N]\n",
    "       svnic-microvm echo --socket PATH [--endpoint N] [--count N] [--ring-size N]\n",
    "                          [--timeout-secs N] [--yields N]\n",
    "       svnic-microvm bench --socket PATH --peer MAC/ENDPOINT [--rounds N] [--floor-cpus A,B]\n",
    "                           [--endpoint N] [--count N] [--ring-size N] [--memory-mib N]\n",
    "                           [--timeout-secs N]",
);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("detect") if args.len() == 1 => cmd_detect(),
        Some("bypass") => parse(&args[1..], Cmd::Bypass).and_then(|o| cmd_bypass(&o.cfg)),
        Some("echo") => parse_echo(&args[1..]).and_then(|(cfg, wait)| cmd_echo(&cfg, wait)),
        Some("bench") => parse_bench(&args[1..]).and_then(|cfg| cmd_bench(&cfg)),
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
    let report = detect_all().map_err(|e| format!("no usable KVM: {e}"))?;
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
        "{}: {} → {}: {} of {} messages; {}",
        r.program.path,
        r.addr,
        r.program.peer,
        r.result.done,
        r.program.count,
        r.result.describe()
    );
    println!(
        "run: {:?}, {} user-space exit(s) ({} by signals)",
        r.run.elapsed, r.run.user_exits, r.run.interrupted
    );
    println!(
        "{} path: doorbell relay: {} signal(s) in {} wakeup(s), {} Doorbell frame(s) to a \
         sleeping engine",
        r.program.path, r.relay.signals, r.relay.wakeups, r.relay.frames
    );
    if let Some(m) = &r.mediator {
        println!(
            "mediator: {} message(s) handed over, {} receive load(s) ({} empty), {} Doorbell \
             frame(s)",
            m.sends, m.recvs, m.empty_recvs, m.frames
        );
    }
    match (&r.stats, r.exits()) {
        (Some(s), Some(e)) => {
            println!("KVM exit counters over the run: {:?}", s.exits());
            println!("over the run, {}", e.describe_per_message(r.program.count));
        }
        _ => println!("KVM exit counters: no binary statistics on this kernel"),
    }
    if let (Some(w), Some(e)) = (&r.steady, r.steady_exits()) {
        println!(
            "KVM exit counters over {} messages in the steady state (replies {}..{}, {} \
             doorbell(s)): {:?}",
            w.messages(),
            w.from,
            w.to,
            w.doorbells,
            w.stats.exits()
        );
        println!(
            "in the steady state, {}",
            e.describe_per_message(w.messages())
        );
    }
    Ok(if r.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Answers `cfg.program.count` messages on a channel at `cfg.endpoint` of the guest at `cfg.socket`
/// (`cfg.timeout`: longest silence, and the create's wait), waiting as `wait` says.
fn cmd_echo(cfg: &BypassConfig, wait: WaitPolicy) -> Result<ExitCode, String> {
    let e = |e: MicroVmError| e.to_string();
    let guest = HostGuest::connect(&cfg.socket, cfg.memory_size).map_err(|e| e.to_string())?;
    let mut ch = guest
        .create_channel(cfg.endpoint, cfg.ring_size, cfg.timeout)
        .map_err(|e| e.to_string())?;
    ch.set_wait_policy(wait);
    eprintln!("svnic-microvm echo: ready at {}", ch.addr());
    peer::echo(&guest, &mut ch, cfg.program.count, cfg.timeout, |_, _| {}).map_err(e)?;
    println!("echoed {} messages", cfg.program.count);
    Ok(ExitCode::SUCCESS)
}

/// `bench`: `rounds` rounds of the three paths, the host-process bypass and the cache-line floor
/// (see `svnic_microvm::bench`), each sample as it comes, then the summary.
fn cmd_bench(cfg: &BenchConfig) -> Result<ExitCode, String> {
    let report = detect().map_err(|e| format!("no usable KVM: {e}"))?;
    println!("{report}");
    println!(
        "{} rounds of {} user-data round trips each; floor threads on CPUs {} and {}",
        cfg.rounds, cfg.vm.program.count, cfg.floor_cpus.0, cfg.floor_cpus.1
    );
    let samples = bench::run(cfg, |round, s| println!("{}", bench::describe(round, s)))
        .map_err(|e| e.to_string())?;
    println!("\n{}", bench::summary(&samples));
    Ok(ExitCode::SUCCESS)
}

/// The commands that take options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cmd {
    Bypass,
    Echo,
    Bench,
}

impl Cmd {
    fn name(self) -> &'static str {
        match self {
            Cmd::Bypass => "bypass",
            Cmd::Echo => "echo",
            Cmd::Bench => "bench",
        }
    }

    /// Whether `flag` is one of this command's options: `--mode` and `--dma-len` are
    /// `bypass`'s only (the benchmark runs every path, with user-data), `--rounds` and
    /// `--floor-cpus` `bench`'s, `--yields` `echo`'s. (`--peer` is checked after the options.)
    fn takes(self, flag: &str) -> bool {
        match flag {
            "--socket" | "--peer" | "--endpoint" | "--count" | "--ring-size" | "--memory-mib"
            | "--timeout-secs" => true,
            "--mode" | "--dma-len" => self == Cmd::Bypass,
            "--rounds" | "--floor-cpus" => self == Cmd::Bench,
            "--yields" => self == Cmd::Echo,
            _ => false,
        }
    }

    /// Why `flag`, not one of its options, is refused.
    fn refusal(self, flag: &str) -> String {
        if ![Cmd::Bypass, Cmd::Echo, Cmd::Bench]
            .iter()
            .any(|c| c.takes(flag))
        {
            return format!("unknown option {flag}\n{USAGE}");
        }
        let why = match self {
            Cmd::Bench => " (the benchmark runs every data path, with user-data)",
            Cmd::Bypass | Cmd::Echo => "",
        };
        format!("{} takes no option {flag}{why}\n{USAGE}", self.name())
    }
}

/// The options of every command; those a command does not take keep their defaults.
#[derive(Debug)]
struct Options {
    cfg: BypassConfig,
    /// `bench`: rounds (default 3).
    rounds: u32,
    /// `bench`: the floor's CPUs (default 0,1).
    floor_cpus: (usize, usize),
    /// `echo`: how it waits (the channel API's default).
    wait: WaitPolicy,
}

/// The options of `bench`: those of `bypass` but `--mode` and `--dma-len`, and `--rounds`
/// and `--floor-cpus`.
fn parse_bench(args: &[String]) -> Result<BenchConfig, String> {
    let o = parse(args, Cmd::Bench)?;
    Ok(BenchConfig {
        vm: o.cfg,
        rounds: o.rounds,
        floor_cpus: o.floor_cpus,
    })
}

/// The options of `echo`: those of `bypass` without a peer, `--mode` or `--dma-len`, and
/// `--yields N`, the polls that yield the CPU before the echo sleeps until the engine wakes
/// it.
fn parse_echo(args: &[String]) -> Result<(BypassConfig, WaitPolicy), String> {
    parse(args, Cmd::Echo).map(|o| (o.cfg, o.wait))
}

/// A CPU of `--floor-cpus`: a number below `libc::CPU_SETSIZE`.
fn floor_cpu(v: &str, cpu: &str) -> Result<usize, String> {
    let n: usize = cpu.parse().map_err(|e| format!("--floor-cpus {v}: {e}"))?;
    if !bench::fits_cpu_set(n) {
        return Err(format!(
            "--floor-cpus {v}: CPU {n} is beyond the {} a CPU set holds",
            libc::CPU_SETSIZE
        ));
    }
    Ok(n)
}

/// The options of `cmd`.
fn parse(args: &[String], cmd: Cmd) -> Result<Options, String> {
    let mut o = Options {
        cfg: BypassConfig {
            socket: Default::default(),
            memory_size: 64 << 20,
            endpoint: 1,
            ring_size: svnic_channels::layout::DEFAULT_RING_SIZE,
            program: BypassArgs {
                peer: ChannelAddr::new(MacAddr([0; 6]), 0),
                count: 1000,
                seed: 0x5eed_0000_0000,
                payload: Payload::UserData,
                path: DataPath::Bypass,
                times: 0,
            },
            timeout: Duration::from_secs(10),
            start: None,
        },
        rounds: 3,
        floor_cpus: (0, 1),
        wait: WaitPolicy::default(),
    };
    let cfg = &mut o.cfg;
    let (mut socket, mut peer) = (false, false);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if !cmd.takes(flag) {
            return Err(cmd.refusal(flag));
        }
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
                cfg.program.peer = ChannelAddr {
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
            "--count" => cfg.program.count = num()?,
            "--dma-len" => {
                cfg.program.payload = Payload::DmaData {
                    len: value
                        .parse()
                        .map_err(|e| format!("--dma-len {value}: {e}"))?,
                }
            }
            "--ring-size" => {
                cfg.ring_size = value
                    .parse()
                    .map_err(|e| format!("--ring-size {value}: {e}"))?
            }
            "--mode" => cfg.program.path = value.parse()?,
            "--memory-mib" => cfg.memory_size = num()?.saturating_mul(1 << 20),
            "--timeout-secs" => cfg.timeout = Duration::from_secs(num()?),
            "--rounds" => {
                o.rounds = value
                    .parse()
                    .map_err(|e| format!("--rounds {value}: {e}"))?
            }
            "--floor-cpus" => {
                let (a, b) = value
                    .split_once(',')
                    .ok_or_else(|| format!("--floor-cpus {value}: expected A,B"))?;
                o.floor_cpus = (floor_cpu(value, a)?, floor_cpu(value, b)?);
            }
            "--yields" => {
                o.wait.yields = value
                    .parse()
                    .map_err(|e| format!("--yields {value}: {e}"))?
            }
            _ => return Err(format!("unknown option {flag}\n{USAGE}")),
        }
    }
    if !socket || peer != (cmd != Cmd::Echo) {
        return Err(match cmd {
            Cmd::Bypass | Cmd::Bench => {
                format!("{} needs --socket and --peer\n{USAGE}", cmd.name())
            }
            Cmd::Echo => format!("echo needs --socket and takes no --peer\n{USAGE}"),
        });
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    /// The configuration of `bypass` (`peer`) or `echo` for `line`.
    fn parse(line: &[String], peer: bool) -> Result<BypassConfig, String> {
        super::parse(line, if peer { Cmd::Bypass } else { Cmd::Echo }).map(|o| o.cfg)
    }

    #[test]
    fn bypass_options_fill_the_config() {
        let cfg = parse(
            &args(
                "--socket /s --peer 52:54:00:00:00:02/7 --endpoint 3 --count 5 --dma-len 4096 \
                 --ring-size 64 --memory-mib 32 --timeout-secs 2 --mode mediated",
            ),
            true,
        )
        .expect("valid options");
        assert_eq!(cfg.socket, std::path::PathBuf::from("/s"));
        assert_eq!(
            cfg.program.peer,
            ChannelAddr::new(MacAddr([0x52, 0x54, 0, 0, 0, 2]), 7)
        );
        assert_eq!(
            (
                cfg.endpoint,
                cfg.program.count,
                cfg.program.payload,
                cfg.ring_size
            ),
            (3, 5, Payload::DmaData { len: 4096 }, 64)
        );
        assert_eq!(
            (cfg.memory_size, cfg.timeout, cfg.program.path),
            (32 << 20, Duration::from_secs(2), DataPath::Mediated)
        );
        let mode = |m: &str| {
            parse(
                &args(&format!(
                    "--socket /s --peer 52:54:00:00:00:02/7 --mode {m}"
                )),
                true,
            )
        };
        assert_eq!(mode("bypass").map(|c| c.program.path), Ok(DataPath::Bypass));
        assert_eq!(
            mode("doorbell").map(|c| c.program.path),
            Ok(DataPath::Doorbell)
        );
    }

    #[test]
    fn wrong_options_are_refused_with_the_reason() {
        let refused = |line: &str, peer: bool, want: &str| {
            let e = parse(&args(line), peer).expect_err(line);
            assert!(e.contains(want), "{line}: {e}");
        };
        refused("--socket /s", true, "bypass needs --socket and --peer");
        refused(
            "--peer 52:54:00:00:00:02/7",
            true,
            "bypass needs --socket and --peer",
        );
        refused(
            "--socket /s --peer 52:54:00:00:00:02/7",
            false,
            "echo needs --socket and takes no --peer",
        );
        refused(
            "--socket /s --peer 52:54:00:00:00:02",
            true,
            "expected MAC/ENDPOINT",
        );
        refused("--socket /s --peer nonsense/1", true, "--peer nonsense/1");
        refused("--socket /s --count", false, "--count needs a value");
        refused("--socket /s --count many", false, "--count many");
        let bypass = "--socket /s --peer 52:54:00:00:00:02/7";
        refused(&format!("{bypass} --dma-len -1"), true, "--dma-len -1");
        refused(
            &format!("{bypass} --mode fast"),
            true,
            "unknown mode \"fast\"",
        );
        // The options of the other commands.
        refused(
            &format!("{bypass} --rounds 2"),
            true,
            "bypass takes no option --rounds",
        );
        refused(
            "--socket /s --mode bypass",
            false,
            "echo takes no option --mode",
        );
        refused(
            "--socket /s --dma-len 64",
            false,
            "echo takes no option --dma-len",
        );
        refused(
            "--socket /s --frobnicate 1",
            false,
            "unknown option --frobnicate",
        );
    }

    #[test]
    fn bench_options_add_rounds_and_floor_cpus_to_those_of_bypass() {
        let cfg = parse_bench(&args(
            "--rounds 5 --socket /s --floor-cpus 1,1023 --peer 52:54:00:00:00:02/7 --count 9",
        ))
        .expect("valid options");
        assert_eq!(
            (cfg.rounds, cfg.floor_cpus, cfg.vm.program.count),
            (5, (1, 1023), 9)
        );
        let defaults =
            parse_bench(&args("--socket /s --peer 52:54:00:00:00:02/7")).expect("defaults");
        assert_eq!((defaults.rounds, defaults.floor_cpus), (3, (0, 1)));
        for (line, want) in [
            (
                "--socket /s --peer 52:54:00:00:00:02/7 --rounds",
                "--rounds needs a value",
            ),
            (
                "--socket /s --peer 52:54:00:00:00:02/7 --floor-cpus 1",
                "expected A,B",
            ),
            (
                "--socket /s --peer 52:54:00:00:00:02/7 --floor-cpus a,1",
                "--floor-cpus a,1",
            ),
            (
                "--socket /s --peer 52:54:00:00:00:02/7 --floor-cpus 0,1024",
                "--floor-cpus 0,1024: CPU 1024 is beyond the 1024 a CPU set holds",
            ),
            (
                "--socket /s --peer 52:54:00:00:00:02/7 --mode mediated",
                "bench takes no option --mode (the benchmark runs every data path",
            ),
            (
                "--socket /s --peer 52:54:00:00:00:02/7 --dma-len 4096",
                "bench takes no option --dma-len",
            ),
            (
                "--socket /s --peer 52:54:00:00:00:02/7 --yields 3",
                "bench takes no option --yields",
            ),
            ("--socket /s", "bench needs --socket and --peer"),
        ] {
            let e = parse_bench(&args(line)).expect_err(line);
            assert!(e.contains(want), "{line}: {e}");
        }
        let (cfg, wait) = parse_echo(&args("--yields 7 --socket /s --count 3")).expect("echo");
        assert_eq!((wait.yields, wait.spins, cfg.program.count), (7, 200, 3));
        assert_eq!(
            parse_echo(&args("--socket /s")).map(|(_, w)| w.yields),
            Ok(WaitPolicy::default().yields)
        );
        let e = parse_echo(&args("--socket /s --yields x")).expect_err("bad --yields");
        assert!(e.contains("--yields x"), "{e}");
        let e = parse_echo(&args("--socket /s --rounds 2")).expect_err("--rounds");
        assert!(e.contains("echo takes no option --rounds"), "{e}");
    }
}
