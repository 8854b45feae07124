//! Guest pools: one socket where any local process that connects becomes a guest of its own,
//! with the next free MAC of the pool's range and the pool's policy
//! (`--pool name=..,socket=..,macs=..,max=..` or `[[pool]]` in a TOML file).

use std::fmt;
use std::path::PathBuf;

use svnic_channels::MacAddr;
use svnic_control_plane::GuestPolicy;

use super::{field_err, parse_mac, parse_parts, ConfigError, GuestConfig, GuestFields};
use crate::sockets::SocketAccess;

/// The most guests a pool may hold at once: each live one costs the daemon threads, descriptors
/// and a guest's memory mapping.
pub const MAX_POOL_GUESTS: u32 = 1024;

/// The shortest MAC prefix of a pool range: the first octet stays fixed, so every address of the
/// range is unicast when its first one is.
const MIN_PREFIX: u32 = 8;

const MACS_EXPECTED: &str = "BASE/LEN (from BASE to the end of its LEN-bit prefix, LEN 8 to 48) \
     or FIRST-LAST with the same first octet, of unicast MACs like 52:54:00:10:00:00";

/// A contiguous range of unicast MAC addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MacRange {
    first: u64,
    len: u64,
}

fn mac_bits(mac: MacAddr) -> u64 {
    mac.0.iter().fold(0, |acc, b| (acc << 8) | u64::from(*b))
}

fn bits_mac(bits: u64) -> MacAddr {
    let b = bits.to_be_bytes();
    MacAddr([b[2], b[3], b[4], b[5], b[6], b[7]])
}

impl MacRange {
    /// Parses `BASE/LEN` (BASE up to the last address sharing its first LEN bits) or
    /// `FIRST-LAST`. `ctx` names the pool in the error.
    pub fn parse(ctx: &str, s: &str) -> Result<Self, ConfigError> {
        let bad = || field_err(ctx, "macs", s, MACS_EXPECTED);
        let mac = |m: &str| parse_mac(ctx, m.trim()).map_err(|_| bad());
        if let Some((base, len)) = s.split_once('/') {
            let first = mac_bits(mac(base)?);
            let prefix: u32 = len.trim().parse().map_err(|_| bad())?;
            if !(MIN_PREFIX..=48).contains(&prefix) {
                return Err(bad());
            }
            let host_mask = (1u64 << (48 - prefix)) - 1;
            let last = first | host_mask;
            return Ok(MacRange {
                first,
                len: last - first + 1,
            });
        }
        let (a, b) = s.split_once('-').ok_or_else(bad)?;
        let (a, b) = (mac(a)?, mac(b)?);
        if a.0[0] != b.0[0] || a > b {
            return Err(bad());
        }
        let first = mac_bits(a);
        Ok(MacRange {
            first,
            len: mac_bits(b) - first + 1,
        })
    }

    /// Number of addresses.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Never true: a range has at least one address.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address `offset` places after the first, if in the range.
    pub fn get(&self, offset: u64) -> Option<MacAddr> {
        (offset < self.len).then(|| bits_mac(self.first + offset))
    }

    /// True if `mac` is in the range.
    pub fn contains(&self, mac: MacAddr) -> bool {
        mac_bits(mac)
            .checked_sub(self.first)
            .is_some_and(|o| o < self.len)
    }

    /// True if the two ranges share an address.
    pub fn overlaps(&self, other: &MacRange) -> bool {
        self.first < other.first + other.len && other.first < self.first + self.len
    }
}

impl fmt::Display for MacRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let last = bits_mac(self.first + self.len - 1);
        write!(f, "{}-{last}", bits_mac(self.first))
    }
}

/// A pool: its socket, its MAC range, how many guests it holds at once, and their policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// Name; its guests are named `NAME-OFFSET` after their MAC's offset in the range.
    pub name: String,
    /// The vhost-user socket every member connects to.
    pub socket: PathBuf,
    /// The MACs handed out, lowest free first.
    pub macs: MacRange,
    /// Guests at once; further connections are refused.
    pub max: u32,
    /// Every member's policy; its name and MAC are the member's own.
    pub policy: GuestPolicy,
    /// The socket's mode and group, and the uids allowed to connect.
    pub access: SocketAccess,
}

impl PoolConfig {
    /// Parses `name=NAME,socket=PATH,macs=RANGE,max=N` with the optional policy and socket
    /// fields of a guest (`endpoints`, `channels`, `max_region_mib`, `create_burst`,
    /// `creates_per_sec`, `socket_mode`, `socket_group`, `allow_uids`).
    pub fn parse_spec(spec: &str) -> Result<Self, ConfigError> {
        let ctx = format!("--pool {spec}");
        let (g, own) = parse_parts(&ctx, spec, &["macs", "max"], "macs, max")?;
        let mut macs = None;
        let mut max = None;
        for (k, v) in own {
            if k == "macs" {
                macs = Some(MacRange::parse(&ctx, &v)?);
            } else {
                max = Some(
                    v.parse::<u32>()
                        .map_err(|_| field_err(&ctx, "max", &v, "a positive integer"))?,
                );
            }
        }
        Self::build(&ctx, g, macs, max)
    }

    /// Checks and assembles a pool; `macs` and `max` are required.
    pub(super) fn build(
        ctx: &str,
        g: GuestFields,
        macs: Option<MacRange>,
        max: Option<u32>,
    ) -> Result<Self, ConfigError> {
        let name = g
            .name
            .clone()
            .ok_or_else(|| field_err(ctx, "name", "", "required"))?;
        let socket = g.socket.clone().unwrap_or_default();
        if socket.as_os_str().is_empty() {
            return Err(field_err(ctx, "socket", "", "a path"));
        }
        let macs = macs.ok_or_else(|| field_err(ctx, "macs", "", MACS_EXPECTED))?;
        let max = max.ok_or_else(|| field_err(ctx, "max", "", "required"))?;
        let bound = u64::from(MAX_POOL_GUESTS).min(macs.len());
        if max == 0 || u64::from(max) > bound {
            return Err(field_err(
                ctx,
                "max",
                &max.to_string(),
                &format!(
                    "1 to {bound} (at most {MAX_POOL_GUESTS}, and no more than the {} MACs \
                     of {macs})",
                    macs.len()
                ),
            ));
        }
        let pool_ctx = format!("pool '{name}'");
        // The longest member name and the last MAC: the policy holds for every member.
        let last = macs.len() - 1;
        let last_mac = macs
            .get(last)
            .ok_or_else(|| field_err(ctx, "macs", &macs.to_string(), MACS_EXPECTED))?;
        g.policy(&pool_ctx, member_name(&name, last), last_mac)?;
        let policy = g.policy(&pool_ctx, name.clone(), last_mac)?;
        let access = g.access(ctx)?;
        Ok(PoolConfig {
            name,
            socket,
            macs,
            max,
            policy,
            access,
        })
    }

    /// The policy of the member holding the range's MAC at `offset`.
    pub fn member_policy(&self, offset: u64) -> Option<GuestPolicy> {
        let mac = self.macs.get(offset)?;
        let mut policy = self.policy.clone();
        policy.name = member_name(&self.name, offset);
        policy.macs = vec![mac];
        Some(policy)
    }
}

/// The name of pool `pool`'s member at MAC offset `offset`.
pub fn member_name(pool: &str, offset: u64) -> String {
    format!("{pool}-{offset}")
}

/// True if `name` is one `pool` could give a member.
fn is_member_name(pool: &PoolConfig, name: &str) -> bool {
    name.strip_prefix(pool.name.as_str())
        .and_then(|rest| rest.strip_prefix('-'))
        .and_then(|n| n.parse::<u64>().ok())
        .is_some_and(|n| n < pool.macs.len() && member_name(&pool.name, n) == name)
}

/// Pools against each other and against the guests: names, sockets and MACs are not shared.
pub(super) fn check_pools(guests: &[GuestConfig], pools: &[PoolConfig]) -> Result<(), ConfigError> {
    for (i, p) in pools.iter().enumerate() {
        let ctx = format!("pool '{}'", p.name);
        let socket = p.socket.display().to_string();
        for q in &pools[..i] {
            let used_by = format!("not used by pool '{}' too", q.name);
            if q.name == p.name {
                return Err(field_err(&ctx, "name", &p.name, &used_by));
            }
            if q.socket == p.socket {
                return Err(field_err(&ctx, "socket", &socket, &used_by));
            }
            if q.macs.overlaps(&p.macs) {
                let expected = format!("a range not overlapping pool '{}' ({})", q.name, q.macs);
                return Err(field_err(&ctx, "macs", &p.macs.to_string(), &expected));
            }
        }
        for g in guests {
            let guest = &g.policy.name;
            if g.socket == p.socket {
                let used_by = format!("not used by guest '{guest}' too");
                return Err(field_err(&ctx, "socket", &socket, &used_by));
            }
            if let Some(mac) = g.policy.macs.iter().find(|m| p.macs.contains(**m)) {
                let expected = format!("a range without guest '{guest}''s MAC {mac}");
                return Err(field_err(&ctx, "macs", &p.macs.to_string(), &expected));
            }
            if is_member_name(p, guest) {
                return Err(field_err(
                    &ctx,
                    "name",
                    &p.name,
                    &format!("a name whose member names (NAME-N) no guest has: '{guest}'"),
                ));
            }
        }
    }
    Ok(())
}
