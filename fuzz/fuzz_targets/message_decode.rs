//! Any 64 bytes in a ring slot: decoding never panics, and whatever decodes is canonical
//! (encoding it gives back the very same 64 bytes).
#![no_main]

use libfuzzer_sys::fuzz_target;
use svnic_channels::message::MESSAGE_SIZE;
use svnic_channels::RawMessage;

fuzz_target!(|data: &[u8]| {
    let Some(bytes) = data.get(..MESSAGE_SIZE) else {
        return;
    };
    let Ok(bytes) = <[u8; MESSAGE_SIZE]>::try_from(bytes) else {
        return;
    };
    let raw = RawMessage(bytes);
    let _ = raw.cookie();
    let _ = raw.flags();
    if let Ok(msg) = raw.decode() {
        assert_eq!(
            msg.encode(),
            raw,
            "decoded {msg:?} does not re-encode to the same bytes"
        );
    }
});
