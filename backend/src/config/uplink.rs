//! The uplink: the host interface the engine attaches to (`--uplink IFACE` or `[uplink]` in a TOML
//! file), how long a peer engine may stay silent, and the fault injection used by tests.

use std::time::Duration;

use serde::Deserialize;

use super::{field_err, ConfigError};
use crate::engine::Placement;

/// Longest interface name the kernel accepts (IFNAMSIZ − 1).
const MAX_IFACE_LEN: usize = 15;

/// Default peer timeout: a sender whose peer engine acknowledges nothing for this long gets
/// `PeerUnreachable` completions.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(2);

const PEER_TIMEOUT_MS: std::ops::RangeInclusive<u64> = 10..=600_000;

const FAULT_EXPECTED: &str = "drop=F,duplicate=F,reorder=F[,seed=N] with each F a fraction in \
     0..=1 (every part optional)";

/// The uplink's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct UplinkConfig {
    /// The host interface (its name, as `ip link` shows it).
    pub iface: String,
    /// How long a peer engine may acknowledge nothing before its senders' messages fail.
    pub peer_timeout: Duration,
    /// Frames dropped, duplicated or held back on purpose (tests only; off by default).
    pub fault: FaultSettings,
}

/// Fault injection on the uplink, in both directions: what fraction of frames is dropped, sent
/// twice, or held back and sent after later ones. All zero (the default) turns it off.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultSettings {
    /// Fraction of frames dropped.
    pub drop: f64,
    /// Fraction of frames sent twice.
    pub duplicate: f64,
    /// Fraction of frames held back and sent after later ones.
    pub reorder: f64,
    /// Seed of the injector's pseudo-random choices (the same seed, the same choices).
    pub seed: u64,
}

impl FaultSettings {
    /// True if no frame is touched.
    pub fn is_off(&self) -> bool {
        self.drop == 0.0 && self.duplicate == 0.0 && self.reorder == 0.0
    }

    /// Parses `drop=F,duplicate=F,reorder=F[,seed=N]`.
    pub fn parse(ctx: &str, s: &str) -> Result<Self, ConfigError> {
        let bad = || field_err(ctx, "fault", s, FAULT_EXPECTED);
        let mut f = FaultSettings::default();
        for part in s.split(',').filter(|p| !p.trim().is_empty()) {
            let (key, value) = part.split_once('=').ok_or_else(bad)?;
            match key.trim() {
                "drop" => f.drop = parse_fraction(ctx, "fault.drop", value)?,
                "duplicate" => f.duplicate = parse_fraction(ctx, "fault.duplicate", value)?,
                "reorder" => f.reorder = parse_fraction(ctx, "fault.reorder", value)?,
                "seed" => f.seed = value.trim().parse().map_err(|_| bad())?,
                _ => return Err(bad()),
            }
        }
        Ok(f)
    }

    fn check(&self, ctx: &str) -> Result<(), ConfigError> {
        for (field, v) in [
            ("fault.drop", self.drop),
            ("fault.duplicate", self.duplicate),
            ("fault.reorder", self.reorder),
        ] {
            check_fraction(ctx, field, v)?;
        }
        Ok(())
    }
}

fn check_fraction(ctx: &str, field: &str, v: f64) -> Result<f64, ConfigError> {
    if v.is_finite() && (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(field_err(ctx, field, &v.to_string(), "a fraction in 0..=1"))
    }
}

fn parse_fraction(ctx: &str, field: &str, s: &str) -> Result<f64, ConfigError> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| field_err(ctx, field, s, "a fraction in 0..=1"))?;
    check_fraction(ctx, field, v)
}

/// Checks an interface name as the kernel would take it: 1 to 15 bytes, no '/', no whitespace,
/// not "." or "..".
pub fn check_iface(ctx: &str, name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_IFACE_LEN
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':');
    if ok {
        Ok(())
    } else {
        Err(field_err(
            ctx,
            "iface",
            name,
            "an interface name of 1 to 15 printable characters without '/', ':' or spaces",
        ))
    }
}

fn check_peer_timeout(ctx: &str, ms: u64) -> Result<Duration, ConfigError> {
    if PEER_TIMEOUT_MS.contains(&ms) {
        Ok(Duration::from_millis(ms))
    } else {
        Err(field_err(
            ctx,
            "peer_timeout_ms",
            &ms.to_string(),
            "10 to 600000 (ms)",
        ))
    }
}

/// `[uplink]` in the TOML file.
#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
pub(super) struct FileUplink {
    iface: Option<String>,
    peer_timeout_ms: Option<u64>,
    #[serde(default)]
    fault: FileFault,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct FileFault {
    drop: Option<f64>,
    duplicate: Option<f64>,
    reorder: Option<f64>,
    seed: Option<u64>,
}

/// Uplink settings given on the command line (each overrides the file).
#[derive(Debug, Default, Clone)]
pub struct UplinkOverrides {
    /// `--uplink IFACE`.
    pub iface: Option<String>,
    /// `--uplink-peer-timeout-ms MS`.
    pub peer_timeout_ms: Option<u64>,
    /// `--uplink-fault drop=F,duplicate=F,reorder=F[,seed=N]`.
    pub fault: Option<String>,
}

impl UplinkOverrides {
    /// True if nothing was given.
    pub fn is_empty(&self) -> bool {
        self.iface.is_none() && self.peer_timeout_ms.is_none() && self.fault.is_none()
    }
}

/// The uplink of the file's `[uplink]` section, or None if it names no interface (then it may
/// hold nothing else).
pub(super) fn from_file(file: Option<FileUplink>) -> Result<Option<UplinkConfig>, ConfigError> {
    let Some(file) = file else {
        return Ok(None);
    };
    let ctx = "uplink";
    let f = &file.fault;
    let fault = FaultSettings {
        drop: f.drop.unwrap_or(0.0),
        duplicate: f.duplicate.unwrap_or(0.0),
        reorder: f.reorder.unwrap_or(0.0),
        seed: f.seed.unwrap_or(0),
    };
    fault.check(ctx)?;
    let Some(iface) = file.iface else {
        return Err(iface_required(ctx));
    };
    check_iface(ctx, &iface)?;
    let peer_timeout = match file.peer_timeout_ms {
        Some(ms) => check_peer_timeout(ctx, ms)?,
        None => DEFAULT_PEER_TIMEOUT,
    };
    Ok(Some(UplinkConfig {
        iface,
        peer_timeout,
        fault,
    }))
}

fn iface_required(ctx: &str) -> ConfigError {
    field_err(
        ctx,
        "iface",
        "",
        "required when other uplink settings are given (--uplink IFACE or iface = ...)",
    )
}

/// `current` (from the file) with the command line's settings applied over it.
pub(super) fn apply(
    current: Option<UplinkConfig>,
    cli: &UplinkOverrides,
) -> Result<Option<UplinkConfig>, ConfigError> {
    let ctx = "--uplink";
    let mut up = match (current, &cli.iface) {
        (_, Some(iface)) => {
            check_iface(ctx, iface)?;
            UplinkConfig {
                iface: iface.clone(),
                peer_timeout: DEFAULT_PEER_TIMEOUT,
                fault: FaultSettings::default(),
            }
        }
        (Some(up), None) => up,
        (None, None) if cli.is_empty() => return Ok(None),
        (None, None) => return Err(iface_required(ctx)),
    };
    if let Some(ms) = cli.peer_timeout_ms {
        up.peer_timeout = check_peer_timeout(ctx, ms)?;
    }
    if let Some(spec) = &cli.fault {
        up.fault = FaultSettings::parse(ctx, spec)?;
    }
    Ok(Some(up))
}

/// Ingress is steered to workers by destination endpoint, so channels must be placed the same
/// way when there is an uplink.
pub(super) fn check_placement(placement: Placement) -> Result<(), ConfigError> {
    if placement == Placement::EndpointHash {
        return Ok(());
    }
    Err(field_err(
        "engine",
        "placement",
        "least-loaded",
        "endpoint-hash when an uplink is configured (frames from the wire are steered to workers \
         by destination endpoint)",
    ))
}
