//! Any bytes received as a frame: decoding never panics; whatever decodes re-encodes to the same
//! content bytes (headers, body, payload: only Ethernet padding may differ) and decodes equal.
#![no_main]

use libfuzzer_sys::fuzz_target;
use svnic_channels::frame::{claims_svnic, control_request_id};
use svnic_channels::Frame;

fuzz_target!(|data: &[u8]| {
    let claims = claims_svnic(data);
    let request_id = control_request_id(data);
    let Ok(frame) = Frame::decode(data) else {
        return;
    };
    assert!(claims, "{frame:?} decoded but claims_svnic is false");
    let bytes = match frame.encode() {
        Ok(b) => b,
        Err(e) => panic!("{frame:?} decoded but does not encode: {e}"),
    };
    let content = frame.content_len();
    assert_eq!(bytes.len(), frame.encoded_len());
    assert_eq!(
        bytes.get(..content),
        data.get(..content),
        "content not canonical"
    );
    assert!(bytes[content..].iter().all(|b| *b == 0), "padding not zero");
    assert_eq!(Frame::decode(&bytes), Ok(frame));
    if let svnic_channels::FrameBody::ControlRequest(r) = frame.body {
        assert_eq!(request_id, Some(r.request_id));
    }
});
