//! The running engine fed with a hostile guest's channel memory: a script of what an attacker
//! guest writes into its two channels, interleaved with an honest victim and a healthy channel.
//! The harness and its invariants: `svnic_fuzz_common::engine::harness`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svnic_fuzz_common::engine::{run, Script};

fuzz_target!(|script: Script| run(&script));
