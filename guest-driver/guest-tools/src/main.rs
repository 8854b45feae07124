//! `svnic-guest`: ping/echo and perf/sink over an svnic channel, virtio-net frames or kernel UDP,
//! in a VM (through svnic-guestd) or as a host-process guest. See guest-driver/README.md and
//! `svnic_guest_tools::cli`.

use clap::Parser;
use svnic_guest_tools::cli::{common_of, drop_privileges, run, Cli};

fn main() {
    let cli = Cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(&cli.log)).init();
    if let Some(uid) = cli.user {
        if let Err(e) = drop_privileges(uid) {
            eprintln!("svnic-guest: {e}");
            std::process::exit(1);
        }
    }
    let json = common_of(&cli.command).json;
    match run(&cli.command) {
        Ok(report) if json => println!("{}", report.json()),
        Ok(report) => println!("{}", report.text()),
        Err(e) => {
            eprintln!("svnic-guest: {e}");
            std::process::exit(1);
        }
    }
}
