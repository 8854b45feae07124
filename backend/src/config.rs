//! Daemon configuration: guests (`--guest name=..,socket=..,mac=..` or `[[guest]]` in a TOML
//! file) and engine settings. Everything is validated before anything starts; an error names
//! the field and the value.

use std::collections::HashSet;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use svnic_channels::MacAddr;
use svnic_control::GuestPolicy;
use thiserror::Error;

use crate::engine::{EngineConfig, Placement};

/// A configuration error: what, where, and what is expected.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    /// A field with a bad value.
    #[error("{context}: {field} = '{value}' is invalid: {expected}")]
    Field {
        /// Where (a guest name, `--guest #2`, `engine`, the file name).
        context: String,
        /// Field name.
        field: String,
        /// Value given.
        value: String,
        /// What is allowed.
        expected: String,
    },
    /// The TOML file could not be read or parsed.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// Two guests share a name, socket or MAC.
    #[error("guests '{a}' and '{b}' both use {what} {value}")]
    Duplicate {
        /// First guest.
        a: String,
        /// Second guest.
        b: String,
        /// Which field.
        what: &'static str,
        /// The shared value.
        value: String,
    },
    /// No guest configured.
    #[error("no guest configured: give at least one --guest or [[guest]]")]
    NoGuests,
}

fn field_err(context: &str, field: &str, value: &str, expected: &str) -> ConfigError {
    ConfigError::Field {
        context: context.to_string(),
        field: field.to_string(),
        value: value.to_string(),
        expected: expected.to_string(),
    }
}

/// One guest: its vhost-user socket and its policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestConfig {
    /// The vhost-user socket the guest's frontend connects to.
    pub socket: PathBuf,
    /// Name, MACs, endpoint range, channel quota, region limit.
    pub policy: GuestPolicy,
}

/// The whole daemon configuration.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Guests, in order.
    pub guests: Vec<GuestConfig>,
    /// Engine settings.
    pub engine: EngineConfig,
    /// The operator socket `svnic ctl` talks to.
    pub admin_socket: PathBuf,
}

/// Default admin socket path.
pub const DEFAULT_ADMIN_SOCKET: &str = "/tmp/svnic-admin.sock";

fn parse_endpoints(context: &str, s: &str) -> Result<RangeInclusive<u32>, ConfigError> {
    let bad = || field_err(context, "endpoints", s, "a range A-B of u32 with A <= B");
    let (a, b) = s.split_once('-').ok_or_else(bad)?;
    let a: u32 = a.trim().parse().map_err(|_| bad())?;
    let b: u32 = b.trim().parse().map_err(|_| bad())?;
    if a > b {
        return Err(bad());
    }
    Ok(a..=b)
}

fn parse_mac(context: &str, s: &str) -> Result<MacAddr, ConfigError> {
    let mac: MacAddr = s
        .parse()
        .map_err(|_| field_err(context, "mac", s, "six hex pairs like 52:54:00:12:34:56"))?;
    if !mac.is_unicast() {
        return Err(field_err(
            context,
            "mac",
            s,
            "a unicast address (first octet even, not all zeros)",
        ));
    }
    Ok(mac)
}

impl GuestConfig {
    /// Parses `name=NAME,socket=PATH,mac=MAC[,endpoints=A-B][,channels=N][,max_region_mib=M]`.
    pub fn parse_spec(spec: &str) -> Result<Self, ConfigError> {
        let ctx = format!("--guest {spec}");
        let (mut name, mut socket, mut mac) = (None, None, None);
        let (mut endpoints, mut channels, mut max_region) = (None, None, None);
        for part in spec.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| field_err(&ctx, part, "", "key=value"))?;
            match k {
                "name" => name = Some(v.to_string()),
                "socket" => socket = Some(PathBuf::from(v)),
                "mac" => mac = Some(parse_mac(&ctx, v)?),
                "endpoints" => endpoints = Some(parse_endpoints(&ctx, v)?),
                "channels" => {
                    channels = Some(
                        v.parse::<u32>()
                            .map_err(|_| field_err(&ctx, k, v, "a positive integer"))?,
                    )
                }
                "max_region_mib" => {
                    max_region = Some(
                        v.parse::<u64>()
                            .map_err(|_| field_err(&ctx, k, v, "an integer (MiB)"))?,
                    )
                }
                other => {
                    return Err(field_err(
                        &ctx,
                        other,
                        v,
                        "one of name, socket, mac, endpoints, channels, max_region_mib",
                    ))
                }
            }
        }
        let name = name.ok_or_else(|| field_err(&ctx, "name", "", "required"))?;
        let socket = socket.ok_or_else(|| field_err(&ctx, "socket", "", "required"))?;
        let mac = mac.ok_or_else(|| field_err(&ctx, "mac", "", "required"))?;
        Self::build(name, socket, mac, endpoints, channels, max_region)
    }

    fn build(
        name: String,
        socket: PathBuf,
        mac: MacAddr,
        endpoints: Option<RangeInclusive<u32>>,
        channels: Option<u32>,
        max_region_mib: Option<u64>,
    ) -> Result<Self, ConfigError> {
        let mut policy = GuestPolicy::new(name.clone(), mac);
        if let Some(e) = endpoints {
            policy.endpoints = e;
        }
        if let Some(c) = channels {
            policy.max_channels = c;
        }
        if let Some(m) = max_region_mib {
            policy.max_region_len = m.saturating_mul(1 << 20);
        }
        policy.validate().map_err(|e| {
            field_err(
                &format!("guest '{name}'"),
                "policy",
                &e.to_string(),
                "a valid guest policy",
            )
        })?;
        if socket.as_os_str().is_empty() {
            return Err(field_err(&name, "socket", "", "a path"));
        }
        Ok(GuestConfig { socket, policy })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileGuest {
    name: String,
    socket: PathBuf,
    mac: String,
    endpoints: Option<String>,
    channels: Option<u32>,
    max_region_mib: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileEngine {
    workers: Option<usize>,
    poll_budget: Option<u32>,
    backpressure_wait_ms: Option<u64>,
    max_sleep_ms: Option<u64>,
    placement: Option<String>,
    pin_workers: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    admin_socket: Option<PathBuf>,
    #[serde(default)]
    engine: FileEngine,
    #[serde(default)]
    guest: Vec<FileGuest>,
}

/// Engine settings given on the command line (each overrides the file).
#[derive(Debug, Default, Clone)]
pub struct EngineOverrides {
    /// Worker threads.
    pub workers: Option<usize>,
    /// TX messages per channel per pass.
    pub poll_budget: Option<u32>,
    /// Backpressure wait in milliseconds.
    pub backpressure_wait_ms: Option<u64>,
    /// Pin workers to CPUs.
    pub pin_workers: bool,
    /// Placement policy name.
    pub placement: Option<String>,
}

fn placement(ctx: &str, s: &str) -> Result<Placement, ConfigError> {
    match s {
        "endpoint-hash" => Ok(Placement::EndpointHash),
        "least-loaded" => Ok(Placement::LeastLoaded),
        _ => Err(field_err(
            ctx,
            "placement",
            s,
            "endpoint-hash or least-loaded",
        )),
    }
}

impl DaemonConfig {
    /// Builds the configuration from an optional TOML file, `--guest` specs and overrides.
    pub fn load(
        file: Option<&Path>,
        guest_specs: &[String],
        overrides: &EngineOverrides,
        admin_socket: Option<PathBuf>,
    ) -> Result<Self, ConfigError> {
        let parsed = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
                    path: path.display().to_string(),
                    message: e.to_string(),
                })?;
                toml::from_str::<FileConfig>(&text).map_err(|e| ConfigError::File {
                    path: path.display().to_string(),
                    message: e.to_string(),
                })?
            }
            None => FileConfig::default(),
        };
        let mut guests = Vec::new();
        for g in parsed.guest {
            let ctx = format!("guest '{}'", g.name);
            let mac = parse_mac(&ctx, &g.mac)?;
            let endpoints = g
                .endpoints
                .as_deref()
                .map(|e| parse_endpoints(&ctx, e))
                .transpose()?;
            guests.push(GuestConfig::build(
                g.name,
                g.socket,
                mac,
                endpoints,
                g.channels,
                g.max_region_mib,
            )?);
        }
        for spec in guest_specs {
            guests.push(GuestConfig::parse_spec(spec)?);
        }
        if guests.is_empty() {
            return Err(ConfigError::NoGuests);
        }
        check_unique(&guests)?;

        let fe = parsed.engine;
        let mut engine = EngineConfig::default();
        let ctx = "engine";
        engine.workers = overrides.workers.or(fe.workers).unwrap_or(engine.workers);
        engine.poll_budget = overrides
            .poll_budget
            .or(fe.poll_budget)
            .unwrap_or(engine.poll_budget);
        if let Some(ms) = overrides.backpressure_wait_ms.or(fe.backpressure_wait_ms) {
            engine.backpressure_wait = Duration::from_millis(ms);
        }
        if let Some(ms) = fe.max_sleep_ms {
            engine.max_sleep = Duration::from_millis(ms);
        }
        if let Some(p) = overrides.placement.as_deref().or(fe.placement.as_deref()) {
            engine.placement = placement(ctx, p)?;
        }
        engine.pin_workers = overrides.pin_workers || fe.pin_workers.unwrap_or(false);
        engine
            .validate()
            .map_err(|e| field_err(ctx, e.field, &e.value, e.expected))?;
        Ok(DaemonConfig {
            guests,
            engine,
            admin_socket: admin_socket
                .or(parsed.admin_socket)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_ADMIN_SOCKET)),
        })
    }
}

fn check_unique(guests: &[GuestConfig]) -> Result<(), ConfigError> {
    for (i, a) in guests.iter().enumerate() {
        for b in &guests[i + 1..] {
            let dup = |what, value: String| ConfigError::Duplicate {
                a: a.policy.name.clone(),
                b: b.policy.name.clone(),
                what,
                value,
            };
            if a.policy.name == b.policy.name {
                return Err(dup("name", a.policy.name.clone()));
            }
            if a.socket == b.socket {
                return Err(dup("socket", a.socket.display().to_string()));
            }
            let macs: HashSet<_> = a.policy.macs.iter().collect();
            if let Some(m) = b.policy.macs.iter().find(|m| macs.contains(m)) {
                return Err(dup("mac", m.to_string()));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(specs: &[&str]) -> Result<DaemonConfig, ConfigError> {
        let specs: Vec<String> = specs.iter().map(|s| s.to_string()).collect();
        DaemonConfig::load(None, &specs, &EngineOverrides::default(), None)
    }

    #[test]
    fn a_full_guest_spec_parses() {
        let c =
            load(&["name=vm1,socket=/tmp/a.sock,mac=52:54:00:00:00:01,endpoints=10-20,channels=4"])
                .unwrap();
        let g = &c.guests[0];
        assert_eq!(g.policy.name, "vm1");
        assert_eq!(g.socket, PathBuf::from("/tmp/a.sock"));
        assert_eq!(g.policy.endpoints, 10..=20);
        assert_eq!(g.policy.max_channels, 4);
    }

    #[test]
    fn each_bad_field_is_named_with_its_value() {
        let cases = [
            ("name=a,socket=/s,mac=zz", "mac"),
            ("name=a,socket=/s,mac=ff:ff:ff:ff:ff:ff", "mac"),
            (
                "name=a,socket=/s,mac=52:54:00:00:00:01,endpoints=9-1",
                "endpoints",
            ),
            (
                "name=a,socket=/s,mac=52:54:00:00:00:01,channels=x",
                "channels",
            ),
            (
                "name=a,socket=/s,mac=52:54:00:00:00:01,colour=blue",
                "colour",
            ),
            ("socket=/s,mac=52:54:00:00:00:01", "name"),
            ("name=a,mac=52:54:00:00:00:01", "socket"),
            (
                "name=a,socket=/s,mac=52:54:00:00:00:01,channels=0",
                "policy",
            ),
        ];
        for (spec, field) in cases {
            match load(&[spec]) {
                Err(ConfigError::Field { field: f, .. }) => assert_eq!(f, field, "{spec}"),
                other => panic!("{spec}: {other:?}"),
            }
        }
    }

    #[test]
    fn duplicates_and_emptiness_are_refused() {
        assert_eq!(load(&[]).unwrap_err(), ConfigError::NoGuests);
        let e = load(&[
            "name=a,socket=/1,mac=52:54:00:00:00:01",
            "name=b,socket=/2,mac=52:54:00:00:00:01",
        ]);
        assert!(matches!(e, Err(ConfigError::Duplicate { what: "mac", .. })));
        let e = load(&[
            "name=a,socket=/1,mac=52:54:00:00:00:01",
            "name=b,socket=/1,mac=52:54:00:00:00:02",
        ]);
        assert!(matches!(
            e,
            Err(ConfigError::Duplicate { what: "socket", .. })
        ));
    }

    #[test]
    fn a_toml_file_with_engine_settings_loads_and_unknown_keys_fail() {
        let dir = std::env::temp_dir().join(format!("svnic-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.toml");
        std::fs::write(
            &good,
            "admin_socket = \"/tmp/x.sock\"\n[engine]\nworkers = 2\nbackpressure_wait_ms = 5\nplacement = \"least-loaded\"\n\
             [[guest]]\nname = \"vm1\"\nsocket = \"/tmp/vm1.sock\"\nmac = \"52:54:00:00:00:01\"\nchannels = 3\n",
        )
        .unwrap();
        let c = DaemonConfig::load(Some(&good), &[], &EngineOverrides::default(), None).unwrap();
        assert_eq!(c.engine.workers, 2);
        assert_eq!(c.engine.placement, Placement::LeastLoaded);
        assert_eq!(c.engine.backpressure_wait, Duration::from_millis(5));
        assert_eq!(c.admin_socket, PathBuf::from("/tmp/x.sock"));
        assert_eq!(c.guests[0].policy.max_channels, 3);
        let bad = dir.join("bad.toml");
        std::fs::write(&bad, "[engine]\nworkerz = 2\n").unwrap();
        let e = DaemonConfig::load(Some(&bad), &[], &EngineOverrides::default(), None).unwrap_err();
        assert!(e.to_string().contains("workerz"), "{e}");
        let bad = dir.join("bad2.toml");
        std::fs::write(&bad, "[engine]\nworkers = 0\n[[guest]]\nname=\"a\"\nsocket=\"/a\"\nmac=\"52:54:00:00:00:01\"\n").unwrap();
        let e = DaemonConfig::load(Some(&bad), &[], &EngineOverrides::default(), None).unwrap_err();
        assert!(
            matches!(e, ConfigError::Field { ref field, .. } if field == "workers"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
