//! `svnic-guestd`: the svnic guest agent (VM mode). Run it as root in the guest; see
//! guest-driver/README.md and `svnic_guestd`.

use clap::Parser;
use svnic_guestd::{run_daemon, DaemonArgs};

fn main() {
    let args = DaemonArgs::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(&args.log)).init();
    if let Err(e) = run_daemon(&args) {
        log::error!("{e}");
        eprintln!("svnic-guestd: {e}");
        std::process::exit(1);
    }
}
