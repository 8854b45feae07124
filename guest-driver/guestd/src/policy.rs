//! What each local user (uid) may have: how many channels and how much hugepage memory, and
//! which endpoints. Pure rules, no I/O; the agent feeds them what its users hold now.
//!
//! - **Quotas**: a uid's channels count from the moment the agent allocates their memory until
//!   that memory is freed, i.e. until the engine acknowledged the destroy (or refused the
//!   create). A user who kills its applications therefore keeps paying for their channels until
//!   the engine let go of them, and cannot exceed the quota by dying quickly. Root is unlimited
//!   unless given its own limits (`--quota-for-uid 0=...`): root can bypass the agent anyway.
//! - **Endpoints**: a range reserved for a uid (`--endpoints-for-uid 1000=100-199`) may only be
//!   claimed by that uid. An endpoint outside every range is first come, first served; it then
//!   belongs to the uid that claimed it for as long as the agent holds memory for it (live,
//!   being created, or destroyed but not yet acknowledged), so nobody else can step in between
//!   an application's destroy and the engine's acknowledgement and receive what was sent to it.
//! - **Root** may claim endpoints in any reserved range: ranges share endpoints out among
//!   unprivileged users, and root, which can send control frames on eth0 itself, is not bound by
//!   them. Root may not take an endpoint another uid holds right now, like everyone else: that
//!   protects the holder's live channel or pending re-create, and costs root nothing it needs.

use std::fmt;

use thiserror::Error;

use super::memory::HUGEPAGE;
use svnic_client::vm::protocol::AgentFailure;

/// Channels one non-root uid may hold unless configured otherwise.
pub const DEFAULT_CHANNELS_PER_UID: usize = 4;
/// 2 MiB hugepages one non-root uid may hold unless configured otherwise (8 MiB).
pub const DEFAULT_HUGEPAGES_PER_UID: u64 = 4;
/// Per-uid overrides and reserved ranges accepted (each is checked on every request).
pub const MAX_POLICY_ENTRIES: usize = 1024;

/// The limits of one uid; `None` is unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidLimits {
    /// Channels (memory allocated, live, or awaiting the engine's destroy acknowledgement).
    pub channels: Option<usize>,
    /// Bytes of channel memory.
    pub memory: Option<u64>,
}

impl UidLimits {
    /// No limit at all.
    pub const UNLIMITED: UidLimits = UidLimits {
        channels: None,
        memory: None,
    };

    /// `channels` channels and `hugepages` 2 MiB hugepages.
    pub fn new(channels: Option<usize>, hugepages: Option<u64>) -> Self {
        UidLimits {
            channels,
            memory: hugepages.map(|n| n.saturating_mul(HUGEPAGE)),
        }
    }
}

impl Default for UidLimits {
    fn default() -> Self {
        UidLimits::new(
            Some(DEFAULT_CHANNELS_PER_UID),
            Some(DEFAULT_HUGEPAGES_PER_UID),
        )
    }
}

/// Endpoints `first..=last` reserved for `uid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointRange {
    /// First endpoint of the range.
    pub first: u32,
    /// Last endpoint of the range (inclusive).
    pub last: u32,
    /// The only uid (besides root) that may claim them.
    pub uid: u32,
}

impl EndpointRange {
    fn contains(&self, endpoint: u32) -> bool {
        (self.first..=self.last).contains(&endpoint)
    }
}

impl fmt::Display for EndpointRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}-{}", self.uid, self.first, self.last)
    }
}

/// What a uid holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UidUsage {
    /// Channels (see [`UidLimits::channels`]).
    pub channels: usize,
    /// Bytes of channel memory.
    pub memory: u64,
}

/// A policy that contradicts itself.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PolicyError {
    /// Two ranges share endpoints.
    #[error("endpoint ranges {0} and {1} overlap")]
    Overlap(EndpointRange, EndpointRange),
    /// A range that ends before it starts.
    #[error("endpoint range {0}: the last endpoint is below the first")]
    Backwards(EndpointRange),
    /// One uid given two quotas.
    #[error("uid {0} is given a quota twice")]
    DuplicateUid(u32),
    /// More entries than the agent checks per request.
    #[error("{what}: {count} entries, at most {MAX_POLICY_ENTRIES}")]
    TooMany {
        /// Which list.
        what: &'static str,
        /// How many were given.
        count: usize,
    },
}

/// Every per-uid rule of the agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserPolicy {
    /// Limits of every uid without an override (root: unlimited).
    pub default: UidLimits,
    /// Per-uid limits, root's included.
    pub overrides: Vec<(u32, UidLimits)>,
    /// Reserved endpoint ranges.
    pub endpoint_ranges: Vec<EndpointRange>,
}

impl UserPolicy {
    /// Refuses overlapping or backwards ranges, duplicate uids and oversized lists.
    pub fn validate(&self) -> Result<(), PolicyError> {
        for (what, count) in [
            ("--quota-for-uid", self.overrides.len()),
            ("--endpoints-for-uid", self.endpoint_ranges.len()),
        ] {
            if count > MAX_POLICY_ENTRIES {
                return Err(PolicyError::TooMany { what, count });
            }
        }
        for (i, (uid, _)) in self.overrides.iter().enumerate() {
            if self.overrides[..i].iter().any(|(u, _)| u == uid) {
                return Err(PolicyError::DuplicateUid(*uid));
            }
        }
        for (i, r) in self.endpoint_ranges.iter().enumerate() {
            if r.last < r.first {
                return Err(PolicyError::Backwards(*r));
            }
            let earlier = self.endpoint_ranges[..i].iter();
            if let Some(o) = earlier
                .filter(|o| o.first <= o.last)
                .find(|o| o.contains(r.first) || o.contains(r.last) || r.contains(o.first))
            {
                return Err(PolicyError::Overlap(*o, *r));
            }
        }
        Ok(())
    }

    /// The limits of `uid`.
    pub fn limits(&self, uid: u32) -> UidLimits {
        match self.overrides.iter().find(|(u, _)| *u == uid) {
            Some((_, l)) => *l,
            None if uid == 0 => UidLimits::UNLIMITED,
            None => self.default,
        }
    }

    /// The range reserving `endpoint`, if any.
    pub fn reservation(&self, endpoint: u32) -> Option<&EndpointRange> {
        self.endpoint_ranges.iter().find(|r| r.contains(endpoint))
    }

    /// Why `uid` may not claim `endpoint` while `holder` (another uid, if any) holds it.
    pub fn endpoint_refusal(&self, uid: u32, endpoint: u32, holder: Option<u32>) -> Option<String> {
        if let Some(other) = holder.filter(|h| *h != uid) {
            return Some(format!(
                "endpoint {endpoint} is held by uid {other}: the agent holds that user's channel \
                 memory there (until its channel is destroyed and the engine acknowledged)"
            ));
        }
        match self.reservation(endpoint) {
            Some(r) if r.uid != uid && uid != 0 => Some(format!(
                "endpoint {endpoint} is reserved for uid {} (--endpoints-for-uid {r})",
                r.uid
            )),
            _ => None,
        }
    }

    /// Why `uid`, holding `usage`, may not take one more channel of `region_len` bytes.
    pub fn quota_refusal(
        &self,
        uid: u32,
        usage: UidUsage,
        region_len: u64,
    ) -> Option<(AgentFailure, String)> {
        let limits = self.limits(uid);
        if let Some(max) = limits.channels.filter(|m| usage.channels >= *m) {
            return Some((
                AgentFailure::UidChannelQuota,
                format!(
                    "uid {uid} holds {} channel(s); the limit is {max} (--max-channels-per-uid)",
                    usage.channels
                ),
            ));
        }
        let wanted = usage.memory.saturating_add(region_len);
        if let Some(max) = limits.memory.filter(|m| wanted > *m) {
            return Some((
                AgentFailure::UidMemoryQuota,
                format!(
                    "uid {uid} holds {} KiB of channel memory; another {} KiB passes the limit \
                     of {} KiB (--max-hugepages-per-uid)",
                    usage.memory / 1024,
                    region_len / 1024,
                    max / 1024
                ),
            ));
        }
        None
    }
}

/// A limit on the command line: a number or `unlimited`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit(pub Option<u64>);

impl std::str::FromStr for Limit {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        parse_limit(s).map(Limit)
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(n) => write!(f, "{n}"),
            None => f.write_str("unlimited"),
        }
    }
}

/// Parses a limit: a number or `unlimited`.
pub fn parse_limit<T: std::str::FromStr>(s: &str) -> Result<Option<T>, String> {
    if s == "unlimited" {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|_| format!("{s:?} is neither a number nor \"unlimited\""))
}

/// Parses `UID=CHANNELS:HUGEPAGES` (`--quota-for-uid`); either limit may be `unlimited`.
pub fn parse_uid_quota(s: &str) -> Result<(u32, UidLimits), String> {
    let shape = || format!("{s:?}: expected UID=CHANNELS:HUGEPAGES, e.g. 1000=8:8");
    let (uid, limits) = s.split_once('=').ok_or_else(shape)?;
    let (channels, hugepages) = limits.split_once(':').ok_or_else(shape)?;
    let uid = uid
        .parse()
        .map_err(|_| format!("{s:?}: {uid:?} is not a uid"))?;
    Ok((
        uid,
        UidLimits::new(parse_limit(channels)?, parse_limit(hugepages)?),
    ))
}

/// Parses `UID=FIRST-LAST` or `UID=ENDPOINT` (`--endpoints-for-uid`).
pub fn parse_endpoint_range(s: &str) -> Result<EndpointRange, String> {
    let shape = || format!("{s:?}: expected UID=FIRST-LAST, e.g. 1000=100-199");
    let (uid, range) = s.split_once('=').ok_or_else(shape)?;
    let (first, last) = range.split_once('-').unwrap_or((range, range));
    let number = |t: &str| t.parse::<u32>().map_err(|_| shape());
    Ok(EndpointRange {
        first: number(first)?,
        last: number(last)?,
        uid: number(uid)?,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn range(uid: u32, first: u32, last: u32) -> EndpointRange {
        EndpointRange { first, last, uid }
    }

    #[test]
    fn flags_parse_and_bad_ones_are_refused() {
        assert_eq!(
            parse_endpoint_range("1000=100-199"),
            Ok(range(1000, 100, 199))
        );
        assert_eq!(parse_endpoint_range("7=5"), Ok(range(7, 5, 5)));
        for bad in [
            "1000",
            "x=1-2",
            "1=a-2",
            "1=1-",
            "1=-1-2",
            "=1-2",
            "1=4294967296",
        ] {
            assert!(parse_endpoint_range(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_uid_quota("1000=8:unlimited"),
            Ok((1000, UidLimits::new(Some(8), None)))
        );
        assert_eq!(
            parse_uid_quota("0=2:3").unwrap().1.memory,
            Some(3 * HUGEPAGE)
        );
        for bad in ["1000=8", "1000:8:8", "u=1:1", "1=-1:1", "1=1:lots"] {
            assert!(parse_uid_quota(bad).is_err(), "{bad}");
        }
        // A huge hugepage count saturates instead of wrapping.
        assert_eq!(UidLimits::new(None, Some(u64::MAX)).memory, Some(u64::MAX));
    }

    #[test]
    fn contradictions_are_refused() {
        let ranges = |r: Vec<EndpointRange>| UserPolicy {
            endpoint_ranges: r,
            ..UserPolicy::default()
        };
        assert!(ranges(vec![range(1, 0, 9), range(2, 10, 19)])
            .validate()
            .is_ok());
        for (a, b) in [((0, 9), (9, 12)), ((5, 9), (0, 5)), ((3, 4), (0, 20))] {
            let p = ranges(vec![range(1, a.0, a.1), range(2, b.0, b.1)]);
            assert!(
                matches!(p.validate(), Err(PolicyError::Overlap(..))),
                "{a:?} {b:?}"
            );
        }
        assert_eq!(
            ranges(vec![range(1, 9, 3)]).validate(),
            Err(PolicyError::Backwards(range(1, 9, 3)))
        );
        let twice = UserPolicy {
            overrides: vec![(5, UidLimits::UNLIMITED), (5, UidLimits::default())],
            ..UserPolicy::default()
        };
        assert_eq!(twice.validate(), Err(PolicyError::DuplicateUid(5)));
    }

    #[test]
    fn limits_come_from_the_override_then_the_default_and_root_is_unlimited() {
        let p = UserPolicy {
            overrides: vec![(1000, UidLimits::new(Some(1), Some(1)))],
            ..UserPolicy::default()
        };
        assert_eq!(p.limits(1000), UidLimits::new(Some(1), Some(1)));
        assert_eq!(p.limits(1001), UidLimits::default());
        assert_eq!(p.limits(0), UidLimits::UNLIMITED);
        let limited_root = UserPolicy {
            overrides: vec![(0, UidLimits::new(Some(2), None))],
            ..UserPolicy::default()
        };
        assert_eq!(limited_root.limits(0).channels, Some(2));
    }

    #[test]
    fn quotas_name_the_limit_reached() {
        let p = UserPolicy {
            default: UidLimits::new(Some(2), Some(3)),
            ..UserPolicy::default()
        };
        let usage = |channels, pages: u64| UidUsage {
            channels,
            memory: pages * HUGEPAGE,
        };
        assert_eq!(p.quota_refusal(7, usage(1, 1), HUGEPAGE), None);
        let (why, detail) = p.quota_refusal(7, usage(2, 2), HUGEPAGE).unwrap();
        assert_eq!(why, AgentFailure::UidChannelQuota);
        assert!(detail.contains("--max-channels-per-uid"), "{detail}");
        // Memory: a region larger than what is left.
        let (why, detail) = p.quota_refusal(7, usage(1, 2), 2 * HUGEPAGE).unwrap();
        assert_eq!(why, AgentFailure::UidMemoryQuota);
        assert!(detail.contains("--max-hugepages-per-uid"), "{detail}");
        assert_eq!(p.quota_refusal(0, usage(100, 100), HUGEPAGE), None);
    }

    #[test]
    fn endpoints_follow_reservations_and_holders() {
        let p = UserPolicy {
            endpoint_ranges: vec![range(1000, 100, 199)],
            ..UserPolicy::default()
        };
        assert_eq!(p.endpoint_refusal(1000, 150, None), None);
        let other = p.endpoint_refusal(1001, 150, None).unwrap();
        assert!(other.contains("reserved for uid 1000"), "{other}");
        // Root may claim in a range, but not what another uid holds.
        assert_eq!(p.endpoint_refusal(0, 150, None), None);
        assert!(p.endpoint_refusal(0, 150, Some(1000)).is_some());
        // Outside every range: first come, then the holder's.
        assert_eq!(p.endpoint_refusal(1001, 5, None), None);
        assert_eq!(p.endpoint_refusal(1001, 5, Some(1001)), None);
        let held = p.endpoint_refusal(1002, 5, Some(1001)).unwrap();
        assert!(held.contains("held by uid 1001"), "{held}");
    }
}
