//! Any bytes received as a frame: decoding never panics; whatever decodes re-encodes to the same
//! content bytes and decodes equal (`svnic_fuzz_common::codec::check_frame`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use svnic_fuzz_common::codec::check_frame;

fuzz_target!(|data: &[u8]| check_frame(data));
