//! A stream of frames from the uplink fed to a small Reassembler: never panics, never exceeds its
//! bounds, and every message it returns has the length its fragments announced
//! (`svnic_fuzz_common::codec::check_reassembly`). The seeds are real fragment streams.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svnic_fuzz_common::codec::{check_reassembly, FrameStream};

fuzz_target!(|stream: FrameStream<'_>| check_reassembly(&stream));
