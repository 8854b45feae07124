//! A hostile vhost-user frontend: any sequence of messages, with any fds, against a real port.
//! The harness and its invariants: `svnic_fuzz_common::vhost_user::harness`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svnic_fuzz_common::vhost_user::{run, Input};

fuzz_target!(|input: Input| run(&input));
