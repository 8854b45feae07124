//! `svnic-soak run [--svnic PATH] [--guests N] [--channels N] [--seconds S] [--kill-every-ms MS]
//! [--tick-ms MS] [--seed N] [--rss-slack-mib M]`: the soak of issue 13 (see
//! `svnic_tests::soak`), printing its figures; exits 1 if anything did not balance.
//!
//! `svnic-soak guest ...` is one soak guest (started by `run`, not by hand).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use svnic_tests::soak::{self, GuestArgs, SoakConfig};

/// `--key value` pairs.
fn options(args: &[String]) -> Result<HashMap<String, String>, String> {
    let mut map = HashMap::new();
    let mut it = args.iter();
    while let Some(key) = it.next() {
        let name = key
            .strip_prefix("--")
            .ok_or_else(|| format!("unexpected argument '{key}'"))?;
        let value = it.next().ok_or_else(|| format!("{key} needs a value"))?;
        map.insert(name.to_string(), value.clone());
    }
    Ok(map)
}

fn get<T: FromStr>(opts: &HashMap<String, String>, key: &str, default: T) -> Result<T, String> {
    match opts.get(key) {
        None => Ok(default),
        Some(v) => v
            .parse()
            .map_err(|_| format!("--{key} {v}: not a valid number")),
    }
}

fn guest(opts: &HashMap<String, String>) -> Result<(), String> {
    let args = GuestArgs {
        socket: PathBuf::from(opts.get("socket").ok_or("--socket is required")?),
        index: get(opts, "index", 0)?,
        guests: get(opts, "guests", 2)?,
        channels: get(opts, "channels", 4)?,
        seed: get(opts, "seed", 1)?,
        tick: Duration::from_millis(get(opts, "tick-ms", 5)?),
    };
    soak::guest_main(args)
}

fn run(opts: &HashMap<String, String>) -> Result<(), String> {
    let svnic = match opts.get("svnic") {
        Some(p) => PathBuf::from(p),
        None => svnic_tests::vm::svnic_binary()?,
    };
    let me = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let mut cfg = SoakConfig::full(svnic, me, Duration::from_secs(get(opts, "seconds", 600)?));
    cfg.guests = get(opts, "guests", cfg.guests)?;
    cfg.channels = get(opts, "channels", cfg.channels)?;
    cfg.kill_every = Duration::from_millis(get(opts, "kill-every-ms", 2000)?);
    cfg.tick = Duration::from_millis(get(opts, "tick-ms", 5)?);
    cfg.seed = get(opts, "seed", cfg.seed)?;
    cfg.rss_slack_kib = get::<u64>(opts, "rss-slack-mib", cfg.rss_slack_kib >> 10)? << 10;
    let report = soak::run(&cfg)?;
    println!("{report}");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.split_first() {
        Some((cmd, rest)) if cmd == "guest" => options(rest).and_then(|o| guest(&o)),
        Some((cmd, rest)) if cmd == "run" => options(rest).and_then(|o| run(&o)),
        _ => Err(
            "usage: svnic-soak run [--svnic PATH] [--guests N] [--channels N] \
                  [--seconds S] [--kill-every-ms MS] [--tick-ms MS] [--seed N] \
                  [--rss-slack-mib M]"
                .into(),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("svnic-soak: {e}");
            ExitCode::FAILURE
        }
    }
}
