//! A short soak (8 guest processes x 4 channels, ~20 s, a guest SIGKILLed and restarted every
//! second) against a real `svnic serve`: the same checks as `scripts/soak.sh`.

use std::path::PathBuf;
use std::time::Duration;

use svnic_tests::soak::{self, SoakConfig};
use svnic_tests::vm::svnic_binary;

#[test]
fn a_short_soak_balances_every_counter_and_returns_the_daemon_to_its_baseline() {
    let svnic = svnic_binary().unwrap_or_else(|e| panic!("{e}"));
    let me = PathBuf::from(env!("CARGO_BIN_EXE_svnic-soak"));
    let mut cfg = SoakConfig::full(svnic, me, Duration::from_secs(20));
    cfg.guests = 8;
    cfg.channels = 4;
    cfg.kill_every = Duration::from_secs(1);
    let report = soak::run(&cfg).unwrap_or_else(|e| panic!("{e}"));
    println!("{report}");
    // run() checked the books, the baseline and SIGTERM; the run must also have done the
    // things whose aftermath it checked.
    assert!(report.kills >= 10, "{report}");
    assert!(report.totals.accepted > 1000, "{report}");
    assert!(report.totals.destroys > 0, "{report}");
    assert!(report.totals.errors > 0, "{report}");
    assert!(report.sigterm <= Duration::from_secs(5), "{report}");
}
