//! Any 64 bytes in a ring slot: decoding never panics, and whatever decodes is canonical
//! (`svnic_fuzz_common::codec::check_message`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use svnic_fuzz_common::codec::{check_message, Slot};

fuzz_target!(|slot: Slot| check_message(slot));
