//! Daemon configuration: guests (`--guest name=..,socket=..,mac=..` or `[[guest]]` in a TOML
//! file), who may reach their sockets, and engine settings. Everything is validated before
//! anything starts; an error names the field and the value.

use std::collections::HashSet;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use svnic_channels::MacAddr;
use svnic_control_plane::GuestPolicy;
use thiserror::Error;

use crate::engine::{EngineConfig, Placement};
use crate::sockets::{parse_mode, SocketAccess, DEFAULT_SOCKET_MODE};

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

/// An engine setting the engine refused, named and valued as the configuration writes it
/// (`byte_budget_kib` in KiB, `*_ms` in milliseconds), not as the engine holds it.
fn engine_field_err(
    context: &str,
    e: &crate::engine::ConfigError,
    engine: &EngineConfig,
) -> ConfigError {
    match e.field {
        "byte_budget" => field_err(
            context,
            "byte_budget_kib",
            &(engine.byte_budget / 1024).to_string(),
            "4 to 65536 (KiB)",
        ),
        "backpressure_wait" => field_err(
            context,
            "backpressure_wait_ms",
            &engine.backpressure_wait.as_millis().to_string(),
            "at most 60000 (ms)",
        ),
        "max_sleep" => field_err(
            context,
            "max_sleep_ms",
            &engine.max_sleep.as_millis().to_string(),
            "1 to 3600000 (ms)",
        ),
        field => field_err(context, field, &e.value, e.expected),
    }
}

/// One guest: its vhost-user socket and its policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestConfig {
    /// The vhost-user socket the guest's frontend connects to.
    pub socket: PathBuf,
    /// Name, MACs, endpoint range, channel quota, region limit.
    pub policy: GuestPolicy,
    /// The socket's mode and group, and the frontend uids allowed to connect.
    pub access: SocketAccess,
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
    /// The admin socket's mode.
    pub admin_socket_mode: u32,
    /// Uids allowed on the admin socket besides the daemon's own and root.
    pub admin_allow_uids: Vec<u32>,
}

/// Default admin socket path, in the daemon's private directory
/// [`DEFAULT_SOCKET_DIR`](crate::sockets::DEFAULT_SOCKET_DIR).
pub const DEFAULT_ADMIN_SOCKET: &str = "/run/svnic/admin.sock";

fn parse_socket_mode(context: &str, field: &str, s: &str) -> Result<u32, ConfigError> {
    parse_mode(s).map_err(|expected| field_err(context, field, s, expected))
}

/// A positive count (a create burst, a rate).
fn parse_count(context: &str, field: &str, s: &str) -> Result<u32, ConfigError> {
    match s.trim().parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(field_err(context, field, s, "a positive integer")),
    }
}

const ID_EXPECTED: &str = "a numeric id below 4294967295";

/// A numeric uid or gid; (uid_t)-1 means "no id" to the kernel and is refused.
fn parse_id(context: &str, field: &str, s: &str) -> Result<u32, ConfigError> {
    let id = s
        .trim()
        .parse::<u32>()
        .map_err(|_| field_err(context, field, s, ID_EXPECTED))?;
    check_id(context, field, id)
}

fn check_id(context: &str, field: &str, id: u32) -> Result<u32, ConfigError> {
    if id == u32::MAX {
        return Err(field_err(context, field, &id.to_string(), ID_EXPECTED));
    }
    Ok(id)
}

fn check_ids(context: &str, field: &str, ids: &[u32]) -> Result<(), ConfigError> {
    if ids.is_empty() {
        return Err(field_err(
            context,
            field,
            "",
            "a non-empty list of numeric uids such as 0,107",
        ));
    }
    for id in ids {
        check_id(context, field, *id)?;
    }
    Ok(())
}

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
    /// Parses `name=NAME,socket=PATH,mac=MAC[,endpoints=A-B][,channels=N][,max_region_mib=M]
    /// [,create_burst=N][,creates_per_sec=N][,socket_mode=0600][,socket_group=GID]
    /// [,allow_uids=UID,UID...]`. The uids of
    /// `allow_uids` continue over the following parts that have no `=`.
    pub fn parse_spec(spec: &str) -> Result<Self, ConfigError> {
        let ctx = format!("--guest {spec}");
        let mut g = GuestFields::default();
        let mut mac = None;
        let mut last_key = "";
        for part in spec.split(',').filter(|p| !p.is_empty()) {
            let Some((k, v)) = part.split_once('=') else {
                if last_key == "allow_uids" {
                    let uid = parse_id(&ctx, "allow_uids", part)?;
                    g.allow_uids.get_or_insert_with(Vec::new).push(uid);
                    continue;
                }
                return Err(field_err(&ctx, part, "", "key=value"));
            };
            last_key = k;
            match k {
                "name" => g.name = Some(v.to_string()),
                "socket" => g.socket = Some(PathBuf::from(v)),
                "mac" => mac = Some(parse_mac(&ctx, v)?),
                "endpoints" => g.endpoints = Some(parse_endpoints(&ctx, v)?),
                "channels" => {
                    g.channels = Some(
                        v.parse::<u32>()
                            .map_err(|_| field_err(&ctx, k, v, "a positive integer"))?,
                    )
                }
                "max_region_mib" => {
                    g.max_region_mib = Some(
                        v.parse::<u64>()
                            .map_err(|_| field_err(&ctx, k, v, "an integer (MiB)"))?,
                    )
                }
                "create_burst" => g.create_burst = Some(parse_count(&ctx, k, v)?),
                "creates_per_sec" => g.creates_per_sec = Some(parse_count(&ctx, k, v)?),
                "socket_mode" => g.socket_mode = Some(parse_socket_mode(&ctx, k, v)?),
                "socket_group" => g.socket_group = Some(parse_id(&ctx, k, v)?),
                "allow_uids" => {
                    let list = g.allow_uids.get_or_insert_with(Vec::new);
                    if !v.is_empty() {
                        list.push(parse_id(&ctx, k, v)?);
                    }
                }
                other => {
                    return Err(field_err(
                        &ctx,
                        other,
                        v,
                        "one of name, socket, mac, endpoints, channels, max_region_mib, \
                         create_burst, creates_per_sec, socket_mode, socket_group, allow_uids",
                    ))
                }
            }
        }
        let name = g
            .name
            .take()
            .ok_or_else(|| field_err(&ctx, "name", "", "required"))?;
        if g.socket.is_none() {
            return Err(field_err(&ctx, "socket", "", "required"));
        }
        let mac = mac.ok_or_else(|| field_err(&ctx, "mac", "", "required"))?;
        Self::build(&ctx, name, mac, g)
    }

    fn build(ctx: &str, name: String, mac: MacAddr, g: GuestFields) -> Result<Self, ConfigError> {
        let mut policy = GuestPolicy::new(name.clone(), mac);
        if let Some(e) = g.endpoints {
            policy.endpoints = e;
        }
        if let Some(c) = g.channels {
            policy.max_channels = c;
        }
        if let Some(m) = g.max_region_mib {
            policy.max_region_len = m.saturating_mul(1 << 20);
        }
        if let Some(b) = g.create_burst {
            policy.create_burst = b;
        }
        if let Some(r) = g.creates_per_sec {
            policy.creates_per_sec = r;
        }
        policy.validate().map_err(|e| {
            field_err(
                &format!("guest '{name}'"),
                "policy",
                &e.to_string(),
                "a valid guest policy",
            )
        })?;
        let socket = g.socket.unwrap_or_default();
        if socket.as_os_str().is_empty() {
            return Err(field_err(&name, "socket", "", "a path"));
        }
        if let Some(uids) = &g.allow_uids {
            check_ids(ctx, "allow_uids", uids)?;
        }
        let access = SocketAccess {
            mode: g.socket_mode.unwrap_or(DEFAULT_SOCKET_MODE),
            group: g.socket_group,
            allow_uids: g.allow_uids,
        };
        Ok(GuestConfig {
            socket,
            policy,
            access,
        })
    }
}

/// The optional fields of a guest, from `--guest` or `[[guest]]`.
#[derive(Default)]
struct GuestFields {
    name: Option<String>,
    socket: Option<PathBuf>,
    endpoints: Option<RangeInclusive<u32>>,
    channels: Option<u32>,
    max_region_mib: Option<u64>,
    create_burst: Option<u32>,
    creates_per_sec: Option<u32>,
    socket_mode: Option<u32>,
    socket_group: Option<u32>,
    allow_uids: Option<Vec<u32>>,
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
    create_burst: Option<u32>,
    creates_per_sec: Option<u32>,
    socket_mode: Option<String>,
    socket_group: Option<u32>,
    allow_uids: Option<Vec<u32>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileEngine {
    workers: Option<usize>,
    poll_budget: Option<u32>,
    byte_budget_kib: Option<u64>,
    backpressure_wait_ms: Option<u64>,
    max_sleep_ms: Option<u64>,
    placement: Option<Placement>,
    pin_workers: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    admin_socket: Option<PathBuf>,
    admin_socket_mode: Option<String>,
    admin_allow_uids: Option<Vec<u32>>,
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
    /// DMA-data bytes per channel per pass, in KiB.
    pub byte_budget_kib: Option<u64>,
    /// Backpressure wait in milliseconds.
    pub backpressure_wait_ms: Option<u64>,
    /// Pin workers to CPUs.
    pub pin_workers: bool,
    /// Placement policy.
    pub placement: Option<Placement>,
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
            let socket_mode = g
                .socket_mode
                .as_deref()
                .map(|m| parse_socket_mode(&ctx, "socket_mode", m))
                .transpose()?;
            if let Some(gid) = g.socket_group {
                check_id(&ctx, "socket_group", gid)?;
            }
            let fields = GuestFields {
                name: None,
                socket: Some(g.socket),
                endpoints,
                channels: g.channels,
                max_region_mib: g.max_region_mib,
                create_burst: g.create_burst,
                creates_per_sec: g.creates_per_sec,
                socket_mode,
                socket_group: g.socket_group,
                allow_uids: g.allow_uids,
            };
            guests.push(GuestConfig::build(&ctx, g.name, mac, fields)?);
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
        if let Some(kib) = overrides.byte_budget_kib.or(fe.byte_budget_kib) {
            engine.byte_budget = kib
                .checked_mul(1024)
                .and_then(|b| u32::try_from(b).ok())
                .ok_or_else(|| {
                    field_err(ctx, "byte_budget_kib", &kib.to_string(), "4 to 65536 (KiB)")
                })?;
        }
        if let Some(ms) = overrides.backpressure_wait_ms.or(fe.backpressure_wait_ms) {
            engine.backpressure_wait = Duration::from_millis(ms);
        }
        if let Some(ms) = fe.max_sleep_ms {
            engine.max_sleep = Duration::from_millis(ms);
        }
        if let Some(p) = overrides.placement.or(fe.placement) {
            engine.placement = p;
        }
        engine.pin_workers = overrides.pin_workers || fe.pin_workers.unwrap_or(false);
        engine
            .validate()
            .map_err(|e| engine_field_err(ctx, &e, &engine))?;
        let mut config = DaemonConfig {
            guests,
            engine,
            admin_socket: admin_socket
                .or(parsed.admin_socket)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_ADMIN_SOCKET)),
            admin_socket_mode: DEFAULT_SOCKET_MODE,
            admin_allow_uids: Vec::new(),
        };
        let file_ctx = file.map_or_else(|| "config".to_string(), |f| f.display().to_string());
        if let Some(mode) = parsed.admin_socket_mode.as_deref() {
            config.admin_socket_mode = parse_socket_mode(&file_ctx, "admin_socket_mode", mode)?;
        }
        if let Some(uids) = parsed.admin_allow_uids {
            check_ids(&file_ctx, "admin_allow_uids", &uids)?;
            config.admin_allow_uids = uids;
        }
        Ok(config)
    }

    /// Applies the admin socket settings of the command line (each replaces the file's).
    pub fn override_admin(
        &mut self,
        mode: Option<&str>,
        allow_uids: &[u32],
    ) -> Result<(), ConfigError> {
        if let Some(mode) = mode {
            self.admin_socket_mode = parse_socket_mode("--admin-socket-mode", "mode", mode)?;
        }
        if !allow_uids.is_empty() {
            check_ids("--admin-allow-uid", "uid", allow_uids)?;
            self.admin_allow_uids = allow_uids.to_vec();
        }
        Ok(())
    }

    /// Who may use the admin socket: its mode, and the daemon's own uid, root and the
    /// configured uids.
    pub fn admin_access(&self) -> SocketAccess {
        let mut uids = vec![crate::sockets::sys::effective_uid(), 0];
        for uid in &self.admin_allow_uids {
            if !uids.contains(uid) {
                uids.push(*uid);
            }
        }
        SocketAccess {
            mode: self.admin_socket_mode,
            group: None,
            allow_uids: Some(uids),
        }
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
mod tests;
