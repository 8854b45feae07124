//! Identifiers shared by every part of svnic: MAC addresses, endpoint ids, channel ids.

use std::fmt;
use std::str::FromStr;

use crate::error::ParseError;

/// An Ethernet MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// The broadcast address ff:ff:ff:ff:ff:ff.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

    /// The engine's own address: control responses and wake frames come from it, and guests
    /// address control requests and doorbells to it ("svnic" with the locally administered bit).
    /// The backend consumes every svnic-EtherType frame a guest sends, whatever its destination.
    pub const ENGINE: MacAddr = MacAddr([0x02, 0x73, 0x76, 0x6e, 0x69, 0x63]);

    /// True for group (broadcast or multicast) addresses: the I/G bit of the first octet.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 1 == 1
    }

    /// True for an individual (unicast) address that is not all zeros.
    pub fn is_unicast(&self) -> bool {
        !self.is_multicast() && self.0 != [0; 6]
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for MacAddr {
    type Err = ParseError;

    /// Parses `aa:bb:cc:dd:ee:ff` (or with `-` separators), hex digits in either case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseError::Mac(s.to_string());
        let mut out = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for byte in out.iter_mut() {
            let part = parts.next().ok_or_else(bad)?;
            if part.len() != 2 {
                return Err(bad());
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(MacAddr(out))
    }
}

/// An endpoint id: the second half of a channel's address (MAC, endpoint), Open-MX style.
pub type EndpointId = u32;

/// A channel id, unique within one engine for the engine's lifetime (never reused).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
pub struct ChannelId(pub u32);

impl fmt::Display for ChannelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "channel {}", self.0)
    }
}

/// The address of a channel on the svnic network: the owning guest's MAC and an endpoint id.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
pub struct ChannelAddr {
    /// MAC address owned by the guest the channel belongs to.
    pub mac: MacAddr,
    /// Endpoint id within that MAC.
    pub endpoint: EndpointId,
}

impl ChannelAddr {
    /// The channel at `endpoint` of `mac`.
    pub const fn new(mac: MacAddr, endpoint: EndpointId) -> Self {
        ChannelAddr { mac, endpoint }
    }
}

impl fmt::Display for ChannelAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.mac, self.endpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_parses_and_prints() {
        let m: MacAddr = "52:54:00:AB:cd:01".parse().unwrap();
        assert_eq!(m.0, [0x52, 0x54, 0, 0xab, 0xcd, 1]);
        assert_eq!(m.to_string(), "52:54:00:ab:cd:01");
        assert!(m.is_unicast());
        assert!(MacAddr::BROADCAST.is_multicast());
    }

    #[test]
    fn mac_rejects_garbage() {
        for s in [
            "",
            "52:54:00:ab:cd",
            "52:54:00:ab:cd:01:02",
            "5:54:00:ab:cd:01",
            "zz:54:00:ab:cd:01",
        ] {
            assert!(s.parse::<MacAddr>().is_err(), "{s}");
        }
    }
}
