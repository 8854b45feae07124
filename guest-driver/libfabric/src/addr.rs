//! The provider address of an endpoint: its channel's (MAC, endpoint) as 16 canonical bytes
//! `{ 'S', version 1, mac[6], endpoint u32 LE, 0u32 }`, so that byte equality is address
//! equality (utility providers compare addresses with `memcmp`).

use svnic_channels::{ChannelAddr, MacAddr};

/// Bytes of an address (`fi_getname` length, `fi_av_insert` stride).
pub const ADDR_LEN: usize = 16;
const MAGIC: u8 = b'S';
const VERSION: u8 = 1;

/// Encodes `addr`.
pub fn encode(addr: ChannelAddr) -> [u8; ADDR_LEN] {
    let mut b = [0u8; ADDR_LEN];
    b[0] = MAGIC;
    b[1] = VERSION;
    b[2..8].copy_from_slice(&addr.mac.0);
    b[8..12].copy_from_slice(&addr.endpoint.to_le_bytes());
    b
}

/// Decodes an address; `None` for anything that [`encode`] cannot have produced (wrong length,
/// magic or version, non-zero reserved bytes, a multicast MAC).
pub fn decode(b: &[u8]) -> Option<ChannelAddr> {
    if b.len() != ADDR_LEN || b[0] != MAGIC || b[1] != VERSION || b[12..] != [0; 4] {
        return None;
    }
    let mut mac = [0u8; 6];
    mac.copy_from_slice(&b[2..8]);
    let mac = MacAddr(mac);
    if !mac.is_unicast() {
        return None;
    }
    let mut ep = [0u8; 4];
    ep.copy_from_slice(&b[8..12]);
    Some(ChannelAddr::new(mac, u32::from_le_bytes(ep)))
}

/// The printable form `fi_svnic://<mac>/<endpoint>` (what `fi_av_straddr` writes).
pub fn to_string(b: &[u8]) -> String {
    match decode(b) {
        Some(a) => format!("fi_svnic://{}/{}", a.mac, a.endpoint),
        None => "fi_svnic://invalid".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_and_garbage_is_refused() {
        let a = ChannelAddr::new(MacAddr([0x52, 0x54, 0, 1, 2, 3]), 0x0102_0304);
        let b = encode(a);
        assert_eq!(decode(&b), Some(a));
        assert_eq!(to_string(&b), "fi_svnic://52:54:00:01:02:03/16909060");
        let mut bad = b;
        bad[0] = b'X';
        assert_eq!(decode(&bad), None);
        let mut bad = b;
        bad[15] = 1;
        assert_eq!(decode(&bad), None);
        let mut bad = b;
        bad[2] = 0x01; // multicast
        assert_eq!(decode(&bad), None);
        assert_eq!(decode(&b[..15]), None);
        assert_eq!(decode(&[0u8; ADDR_LEN]), None);
        assert_eq!(to_string(&[0u8; 3]), "fi_svnic://invalid");
    }
}
