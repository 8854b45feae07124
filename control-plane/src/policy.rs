//! Per-guest policy: which MACs a guest owns, which endpoint ids it may bind, how many channels it
//! may hold, how large their regions may be and how fast it may ask for new ones.
//!
//! A policy comes from the operator (configuration or CLI), never from the guest. It is validated
//! once, when the guest is added ([`GuestPolicy::validate`]); the registry then checks every create
//! request against it.

use std::ops::RangeInclusive;

use svnic_channels::layout::{MAX_REGION_LEN, PAGE};
use svnic_channels::{EndpointId, MacAddr};
use thiserror::Error;

/// Endpoint ids a guest may bind unless its policy says otherwise.
pub const DEFAULT_ENDPOINTS: RangeInclusive<EndpointId> = 0..=1023;
/// Live channels a guest may hold unless its policy says otherwise.
pub const DEFAULT_MAX_CHANNELS: u32 = 64;
/// Largest channel region a guest may register unless its policy says otherwise (64 MiB).
pub const DEFAULT_MAX_REGION_LEN: u64 = 64 << 20;
/// Create requests a guest may send back to back unless its policy says otherwise.
pub const DEFAULT_CREATE_BURST: u32 = 64;
/// Create requests per second a guest may sustain unless its policy says otherwise.
pub const DEFAULT_CREATES_PER_SEC: u32 = 200;
/// Highest `creates_per_sec` accepted: one token per nanosecond.
pub const MAX_CREATES_PER_SEC: u32 = 1_000_000_000;
/// Longest guest name accepted.
pub const MAX_GUEST_NAME_LEN: usize = 64;

/// What one guest is allowed to do on the control path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestPolicy {
    /// Operator-facing name, unique among registered guests: `[A-Za-z0-9_.-]`, 1 to 64 characters.
    pub name: String,
    /// MAC addresses the guest owns: unicast, distinct, at least one. No other guest may own them.
    pub macs: Vec<MacAddr>,
    /// Endpoint ids the guest may bind on each of its MACs.
    pub endpoints: RangeInclusive<EndpointId>,
    /// Most channels the guest may hold at once (Pending or Success).
    pub max_channels: u32,
    /// Largest region one channel may register, in bytes: a multiple of 4096 in
    /// `4096..=`[`MAX_REGION_LEN`].
    pub max_region_len: u64,
    /// Create requests the guest may send back to back (the token bucket's size), at least 1.
    /// Every create request takes a token, refused ones included.
    pub create_burst: u32,
    /// Tokens added back per second, in `1..=`[`MAX_CREATES_PER_SEC`]. A request finding no token
    /// is refused with RateLimited, before anything is checked or reserved.
    pub creates_per_sec: u32,
}

impl GuestPolicy {
    /// A policy for guest `name` owning `mac`, with the defaults: endpoints
    /// [`DEFAULT_ENDPOINTS`], [`DEFAULT_MAX_CHANNELS`] channels, regions up to
    /// [`DEFAULT_MAX_REGION_LEN`], creates at [`DEFAULT_CREATES_PER_SEC`] per second in bursts of
    /// [`DEFAULT_CREATE_BURST`]. Not validated; [`GuestPolicy::validate`] does that.
    pub fn new(name: impl Into<String>, mac: MacAddr) -> Self {
        GuestPolicy {
            name: name.into(),
            macs: vec![mac],
            endpoints: DEFAULT_ENDPOINTS,
            max_channels: DEFAULT_MAX_CHANNELS,
            max_region_len: DEFAULT_MAX_REGION_LEN,
            create_burst: DEFAULT_CREATE_BURST,
            creates_per_sec: DEFAULT_CREATES_PER_SEC,
        }
    }

    /// Checks every field, and says which one is wrong and with what value.
    pub fn validate(&self) -> Result<(), PolicyError> {
        self.validate_name()?;
        let name = &self.name;
        if self.macs.is_empty() {
            return Err(PolicyError::NoMac { name: name.clone() });
        }
        for (i, mac) in self.macs.iter().enumerate() {
            if !mac.is_unicast() {
                return Err(PolicyError::MacNotUnicast {
                    name: name.clone(),
                    mac: *mac,
                });
            }
            if self.macs[..i].contains(mac) {
                return Err(PolicyError::DuplicateMac {
                    name: name.clone(),
                    mac: *mac,
                });
            }
        }
        if self.endpoints.is_empty() {
            return Err(PolicyError::EmptyEndpointRange {
                name: name.clone(),
                start: *self.endpoints.start(),
                end: *self.endpoints.end(),
            });
        }
        if self.max_channels == 0 {
            return Err(PolicyError::ZeroMaxChannels { name: name.clone() });
        }
        let len = self.max_region_len;
        if len % PAGE != 0 || !(PAGE..=MAX_REGION_LEN).contains(&len) {
            return Err(PolicyError::BadMaxRegionLen {
                name: name.clone(),
                len,
                max: MAX_REGION_LEN,
            });
        }
        if self.create_burst == 0 || !(1..=MAX_CREATES_PER_SEC).contains(&self.creates_per_sec) {
            return Err(PolicyError::BadCreateRate {
                name: name.clone(),
                burst: self.create_burst,
                per_sec: self.creates_per_sec,
                max: MAX_CREATES_PER_SEC,
            });
        }
        Ok(())
    }

    fn validate_name(&self) -> Result<(), PolicyError> {
        let name = &self.name;
        if name.is_empty() {
            return Err(PolicyError::EmptyName);
        }
        if name.len() > MAX_GUEST_NAME_LEN {
            return Err(PolicyError::NameTooLong {
                name: name.clone(),
                len: name.len(),
                max: MAX_GUEST_NAME_LEN,
            });
        }
        if let Some(ch) = name.chars().find(|c| !is_name_char(*c)) {
            return Err(PolicyError::NameBadChar {
                name: name.clone(),
                ch,
            });
        }
        Ok(())
    }

    /// True if the guest owns `mac`.
    pub fn owns_mac(&self, mac: &MacAddr) -> bool {
        self.macs.contains(mac)
    }

    /// True if `endpoint` lies in the guest's endpoint range.
    pub fn allows_endpoint(&self, endpoint: EndpointId) -> bool {
        self.endpoints.contains(&endpoint)
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')
}

/// A guest policy that cannot be accepted.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PolicyError {
    /// The name is empty.
    #[error("guest policy: the guest name is empty; give it a name of [A-Za-z0-9_.-]")]
    EmptyName,
    /// The name is longer than [`MAX_GUEST_NAME_LEN`] bytes.
    #[error("guest policy {name:?}: name is {len} bytes long, the maximum is {max}")]
    NameTooLong {
        /// The name given.
        name: String,
        /// Its length in bytes.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// The name has a character outside `[A-Za-z0-9_.-]`.
    #[error("guest policy {name:?}: character {ch:?} is not allowed in a guest name (use [A-Za-z0-9_.-])")]
    NameBadChar {
        /// The name given.
        name: String,
        /// The first offending character.
        ch: char,
    },
    /// The guest owns no MAC address.
    #[error("guest policy {name:?}: no MAC address; a guest needs at least one")]
    NoMac {
        /// The guest name.
        name: String,
    },
    /// A MAC is multicast, broadcast or all zeros.
    #[error("guest policy {name:?}: MAC {mac} is not a unicast address")]
    MacNotUnicast {
        /// The guest name.
        name: String,
        /// The offending MAC.
        mac: MacAddr,
    },
    /// A MAC appears twice.
    #[error("guest policy {name:?}: MAC {mac} is listed twice")]
    DuplicateMac {
        /// The guest name.
        name: String,
        /// The repeated MAC.
        mac: MacAddr,
    },
    /// The endpoint range contains no endpoint.
    #[error("guest policy {name:?}: endpoint range {start}..={end} is empty")]
    EmptyEndpointRange {
        /// The guest name.
        name: String,
        /// First endpoint of the range.
        start: EndpointId,
        /// Last endpoint of the range.
        end: EndpointId,
    },
    /// `max_channels` is zero.
    #[error("guest policy {name:?}: max_channels is 0; a guest needs at least 1")]
    ZeroMaxChannels {
        /// The guest name.
        name: String,
    },
    /// `max_region_len` is not a multiple of 4096 in `4096..=max`.
    #[error("guest policy {name:?}: max_region_len {len} must be a multiple of 4096 between 4096 and {max}")]
    BadMaxRegionLen {
        /// The guest name.
        name: String,
        /// The value given.
        len: u64,
        /// The ABI maximum.
        max: u64,
    },
    /// The create rate limit is unusable: a zero burst, or a rate outside `1..=max` per second.
    #[error("guest policy {name:?}: create rate {per_sec}/s in bursts of {burst}: the burst must be at least 1 and the rate between 1 and {max} per second")]
    BadCreateRate {
        /// The guest name.
        name: String,
        /// The burst given.
        burst: u32,
        /// The rate given.
        per_sec: u32,
        /// The highest rate accepted.
        max: u32,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 1]);

    #[test]
    fn defaults_are_valid() {
        let p = GuestPolicy::new("vm-1.test_a", MAC);
        assert_eq!(p.validate(), Ok(()));
        assert_eq!(p.endpoints, 0..=1023);
        assert_eq!(p.max_channels, 64);
        assert_eq!(p.max_region_len, 64 << 20);
        assert!(p.owns_mac(&MAC));
        assert!(p.allows_endpoint(1023));
        assert!(!p.allows_endpoint(1024));
    }

    #[test]
    fn bad_names_are_refused() {
        let mut p = GuestPolicy::new("", MAC);
        assert_eq!(p.validate(), Err(PolicyError::EmptyName));
        p.name = "a".repeat(65);
        assert!(matches!(
            p.validate(),
            Err(PolicyError::NameTooLong {
                len: 65,
                max: 64,
                ..
            })
        ));
        p.name = "a".repeat(64);
        assert_eq!(p.validate(), Ok(()));
        for (name, ch) in [("vm 1", ' '), ("vm/1", '/'), ("vmé", 'é'), ("a\n", '\n')] {
            p.name = name.to_string();
            assert_eq!(
                p.validate(),
                Err(PolicyError::NameBadChar {
                    name: name.to_string(),
                    ch
                })
            );
        }
    }

    #[test]
    fn bad_macs_are_refused() {
        let mut p = GuestPolicy::new("vm", MAC);
        p.macs.clear();
        assert!(matches!(p.validate(), Err(PolicyError::NoMac { .. })));
        for bad in [
            MacAddr::BROADCAST,
            MacAddr([0; 6]),
            MacAddr([1, 0, 0x5e, 0, 0, 1]),
        ] {
            p.macs = vec![MAC, bad];
            assert!(
                matches!(p.validate(), Err(PolicyError::MacNotUnicast { mac, .. }) if mac == bad),
                "{bad}"
            );
        }
        p.macs = vec![MAC, MacAddr([0x52, 0x54, 0, 0, 0, 2]), MAC];
        assert!(matches!(
            p.validate(),
            Err(PolicyError::DuplicateMac { mac: MAC, .. })
        ));
    }

    #[test]
    fn endpoint_range_and_quota_are_checked() {
        let mut p = GuestPolicy::new("vm", MAC);
        #[allow(clippy::reversed_empty_ranges)]
        {
            p.endpoints = 5..=4;
        }
        assert!(matches!(
            p.validate(),
            Err(PolicyError::EmptyEndpointRange {
                start: 5,
                end: 4,
                ..
            })
        ));
        p.endpoints = 7..=7;
        assert_eq!(p.validate(), Ok(()));
        p.max_channels = 0;
        assert!(matches!(
            p.validate(),
            Err(PolicyError::ZeroMaxChannels { .. })
        ));
    }

    #[test]
    fn max_region_len_is_checked() {
        let mut p = GuestPolicy::new("vm", MAC);
        for bad in [0, 1, 4095, 4097, MAX_REGION_LEN + PAGE, u64::MAX] {
            p.max_region_len = bad;
            assert!(
                matches!(p.validate(), Err(PolicyError::BadMaxRegionLen { len, .. }) if len == bad),
                "{bad}"
            );
        }
        for good in [PAGE, 2 << 20, MAX_REGION_LEN] {
            p.max_region_len = good;
            assert_eq!(p.validate(), Ok(()), "{good}");
        }
    }

    #[test]
    fn create_rate_is_checked() {
        let mut p = GuestPolicy::new("vm", MAC);
        assert_eq!((p.create_burst, p.creates_per_sec), (64, 200));
        for (burst, per_sec) in [(0, 200), (64, 0), (64, MAX_CREATES_PER_SEC + 1)] {
            p.create_burst = burst;
            p.creates_per_sec = per_sec;
            assert!(
                matches!(p.validate(), Err(PolicyError::BadCreateRate { burst: b, per_sec: r, .. }) if b == burst && r == per_sec),
                "{burst} {per_sec}"
            );
        }
        for (burst, per_sec) in [(1, 1), (u32::MAX, MAX_CREATES_PER_SEC)] {
            p.create_burst = burst;
            p.creates_per_sec = per_sec;
            assert_eq!(p.validate(), Ok(()), "{burst} {per_sec}");
        }
    }

    #[test]
    fn error_messages_name_the_value() {
        let mut p = GuestPolicy::new("vm7", MAC);
        p.max_region_len = 5000;
        let msg = p
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(msg.contains("vm7") && msg.contains("5000"), "{msg}");
    }
}
