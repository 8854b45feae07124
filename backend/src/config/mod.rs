//! Daemon configuration: guests (`--guest name=..,socket=..,mac=..` or `[[guest]]` in a TOML
//! file), guest pools (`--pool name=..,socket=..,macs=..,max=..` or `[[pool]]`), who may reach
//! their sockets, and engine settings. Everything is validated before anything starts; an error
//! names the field and the value.

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

mod pool;
mod uplink;

pub use pool::{member_name, MacRange, PoolConfig, MAX_POOL_GUESTS};
pub use uplink::{check_iface, FaultSettings, UplinkConfig, UplinkOverrides, DEFAULT_PEER_TIMEOUT};

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
    /// No guest and no pool configured.
    #[error("no guest configured: give at least one --guest, [[guest]], --pool or [[pool]]")]
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
    /// Guest pools, in order.
    pub pools: Vec<PoolConfig>,
    /// Engine settings.
    pub engine: EngineConfig,
    /// The operator socket `svnic ctl` talks to.
    pub admin_socket: PathBuf,
    /// The admin socket's mode.
    pub admin_socket_mode: u32,
    /// Uids allowed on the admin socket besides the daemon's own and root.
    pub admin_allow_uids: Vec<u32>,
    /// The host interface guests reach other hosts through, if any.
    pub uplink: Option<UplinkConfig>,
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
        let (g, own) = parse_parts(&ctx, spec, &["mac"], "mac")?;
        let mut mac = None;
        for (_, v) in own {
            mac = Some(parse_mac(&ctx, &v)?);
        }
        let name = g
            .name
            .clone()
            .ok_or_else(|| field_err(&ctx, "name", "", "required"))?;
        if g.socket.is_none() {
            return Err(field_err(&ctx, "socket", "", "required"));
        }
        let mac = mac.ok_or_else(|| field_err(&ctx, "mac", "", "required"))?;
        Self::build(&ctx, name, mac, g)
    }

    fn build(ctx: &str, name: String, mac: MacAddr, g: GuestFields) -> Result<Self, ConfigError> {
        let policy = g.policy(&format!("guest '{name}'"), name.clone(), mac)?;
        let socket = g.socket.clone().unwrap_or_default();
        if socket.as_os_str().is_empty() {
            return Err(field_err(&name, "socket", "", "a path"));
        }
        let access = g.access(ctx)?;
        Ok(GuestConfig {
            socket,
            policy,
            access,
        })
    }
}

/// The parts of a `--guest` or `--pool` spec: `key=value` separated by commas; the uids of
/// `allow_uids` continue over the following parts that have no `=`. The policy and socket keys
/// are parsed into the fields; `own` keys are returned as given, in order, for the caller to
/// parse (`own_expected` lists them for the unknown-key error).
fn parse_parts(
    ctx: &str,
    spec: &str,
    own: &[&str],
    own_expected: &str,
) -> Result<(GuestFields, Vec<(String, String)>), ConfigError> {
    let mut g = GuestFields::default();
    let mut own_values = Vec::new();
    let mut last_key = "";
    for part in spec.split(',').filter(|p| !p.is_empty()) {
        let Some((k, v)) = part.split_once('=') else {
            if last_key == "allow_uids" {
                let uid = parse_id(ctx, "allow_uids", part)?;
                g.allow_uids.get_or_insert_with(Vec::new).push(uid);
                continue;
            }
            return Err(field_err(ctx, part, "", "key=value"));
        };
        last_key = k;
        match k {
            "name" => g.name = Some(v.to_string()),
            "socket" => g.socket = Some(PathBuf::from(v)),
            "endpoints" => g.endpoints = Some(parse_endpoints(ctx, v)?),
            "channels" => {
                g.channels = Some(
                    v.parse::<u32>()
                        .map_err(|_| field_err(ctx, k, v, "a positive integer"))?,
                )
            }
            "max_region_mib" => {
                g.max_region_mib = Some(
                    v.parse::<u64>()
                        .map_err(|_| field_err(ctx, k, v, "an integer (MiB)"))?,
                )
            }
            "create_burst" => g.create_burst = Some(parse_count(ctx, k, v)?),
            "creates_per_sec" => g.creates_per_sec = Some(parse_count(ctx, k, v)?),
            "socket_mode" => g.socket_mode = Some(parse_socket_mode(ctx, k, v)?),
            "socket_group" => g.socket_group = Some(parse_id(ctx, k, v)?),
            "allow_uids" => {
                let list = g.allow_uids.get_or_insert_with(Vec::new);
                if !v.is_empty() {
                    list.push(parse_id(ctx, k, v)?);
                }
            }
            other if own.contains(&other) => own_values.push((k.to_string(), v.to_string())),
            other => {
                return Err(field_err(
                    ctx,
                    other,
                    v,
                    &format!(
                        "one of name, socket, {own_expected}, endpoints, channels, \
                         max_region_mib, create_burst, creates_per_sec, socket_mode, \
                         socket_group, allow_uids"
                    ),
                ))
            }
        }
    }
    Ok((g, own_values))
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

impl GuestFields {
    /// The policy of a guest `name` owning `mac`, with these fields' limits; `ctx` names the
    /// guest (or pool) in the error.
    fn policy(&self, ctx: &str, name: String, mac: MacAddr) -> Result<GuestPolicy, ConfigError> {
        let mut policy = GuestPolicy::new(name, mac);
        if let Some(e) = &self.endpoints {
            policy.endpoints = e.clone();
        }
        if let Some(c) = self.channels {
            policy.max_channels = c;
        }
        if let Some(m) = self.max_region_mib {
            policy.max_region_len = m.saturating_mul(1 << 20);
        }
        if let Some(b) = self.create_burst {
            policy.create_burst = b;
        }
        if let Some(r) = self.creates_per_sec {
            policy.creates_per_sec = r;
        }
        policy
            .validate()
            .map_err(|e| field_err(ctx, "policy", &e.to_string(), "a valid guest policy"))?;
        Ok(policy)
    }

    /// Who may reach the socket.
    fn access(&self, ctx: &str) -> Result<SocketAccess, ConfigError> {
        if let Some(uids) = &self.allow_uids {
            check_ids(ctx, "allow_uids", uids)?;
        }
        Ok(SocketAccess {
            mode: self.socket_mode.unwrap_or(DEFAULT_SOCKET_MODE),
            group: self.socket_group,
            allow_uids: self.allow_uids.clone(),
        })
    }
}

/// A `[[guest]]` or a `[[pool]]` of the file: a guest has `mac`, a pool `macs` and `max`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileGuest {
    name: String,
    socket: PathBuf,
    mac: Option<String>,
    macs: Option<String>,
    max: Option<u32>,
    endpoints: Option<String>,
    channels: Option<u32>,
    max_region_mib: Option<u64>,
    create_burst: Option<u32>,
    creates_per_sec: Option<u32>,
    socket_mode: Option<String>,
    socket_group: Option<u32>,
    allow_uids: Option<Vec<u32>>,
}

impl FileGuest {
    /// The fields common to guests and pools; `foreign` are the keys of the other kind, refused.
    fn fields(self, ctx: &str, foreign: &[&'static str]) -> Result<GuestFields, ConfigError> {
        let given = [
            ("mac", self.mac.clone()),
            ("macs", self.macs.clone()),
            ("max", self.max.map(|m| m.to_string())),
        ];
        for (key, value) in given {
            if let (true, Some(v)) = (foreign.contains(&key), value) {
                let expected = if key == "mac" {
                    "only in a [[guest]]: a pool has macs and max"
                } else {
                    "only in a [[pool]]: a guest has one mac"
                };
                return Err(field_err(ctx, key, &v, expected));
            }
        }
        let endpoints = self
            .endpoints
            .as_deref()
            .map(|e| parse_endpoints(ctx, e))
            .transpose()?;
        let socket_mode = self
            .socket_mode
            .as_deref()
            .map(|m| parse_socket_mode(ctx, "socket_mode", m))
            .transpose()?;
        if let Some(gid) = self.socket_group {
            check_id(ctx, "socket_group", gid)?;
        }
        Ok(GuestFields {
            name: Some(self.name),
            socket: Some(self.socket),
            endpoints,
            channels: self.channels,
            max_region_mib: self.max_region_mib,
            create_burst: self.create_burst,
            creates_per_sec: self.creates_per_sec,
            socket_mode,
            socket_group: self.socket_group,
            allow_uids: self.allow_uids,
        })
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileEngine {
    workers: Option<usize>,
    poll_budget: Option<u32>,
    byte_budget_kib: Option<u64>,
    backpressure_wait_ms: Option<u64>,
    max_sleep_ms: Option<u64>,
    spin_passes: Option<u32>,
    idle_passes: Option<u32>,
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
    #[serde(default)]
    pool: Vec<FileGuest>,
    uplink: Option<uplink::FileUplink>,
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
    /// Idle passes a worker spins before it yields.
    pub spin_passes: Option<u32>,
    /// Idle passes (spinning, then yielding) before a worker sleeps.
    pub idle_passes: Option<u32>,
}

impl DaemonConfig {
    /// Builds the configuration from an optional TOML file, `--guest` specs and overrides.
    pub fn load(
        file: Option<&Path>,
        guest_specs: &[String],
        overrides: &EngineOverrides,
        admin_socket: Option<PathBuf>,
    ) -> Result<Self, ConfigError> {
        Self::load_with_pools(file, guest_specs, &[], overrides, admin_socket)
    }

    /// [`Self::load`] with `--pool` specs.
    pub fn load_with_pools(
        file: Option<&Path>,
        guest_specs: &[String],
        pool_specs: &[String],
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
            let mac = g.mac.clone();
            let fields = g.fields(&ctx, &["macs", "max"])?;
            let mac = mac.ok_or_else(|| field_err(&ctx, "mac", "", "required"))?;
            let mac = parse_mac(&ctx, &mac)?;
            let name = fields.name.clone().unwrap_or_default();
            guests.push(GuestConfig::build(&ctx, name, mac, fields)?);
        }
        for spec in guest_specs {
            guests.push(GuestConfig::parse_spec(spec)?);
        }
        let mut pools = Vec::new();
        for p in parsed.pool {
            let ctx = format!("pool '{}'", p.name);
            let (macs, max) = (p.macs.clone(), p.max);
            let fields = p.fields(&ctx, &["mac"])?;
            let macs = macs.map(|m| pool::MacRange::parse(&ctx, &m)).transpose()?;
            pools.push(PoolConfig::build(&ctx, fields, macs, max)?);
        }
        for spec in pool_specs {
            pools.push(PoolConfig::parse_spec(spec)?);
        }
        if guests.is_empty() && pools.is_empty() {
            return Err(ConfigError::NoGuests);
        }
        check_unique(&guests)?;
        pool::check_pools(&guests, &pools)?;

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
        if let Some(n) = overrides.spin_passes.or(fe.spin_passes) {
            engine.spin_passes = n;
        }
        if let Some(n) = overrides.idle_passes.or(fe.idle_passes) {
            engine.idle_passes = n;
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
            pools,
            engine,
            admin_socket: admin_socket
                .or(parsed.admin_socket)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_ADMIN_SOCKET)),
            admin_socket_mode: DEFAULT_SOCKET_MODE,
            admin_allow_uids: Vec::new(),
            uplink: uplink::from_file(parsed.uplink)?,
        };
        if config.uplink.is_some() {
            uplink::check_placement(config.engine.placement)?;
        }
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

    /// Applies the uplink settings of the command line (each replaces the file's; `--uplink`
    /// names an interface anew, with default settings for what the command line does not give).
    pub fn override_uplink(&mut self, cli: &UplinkOverrides) -> Result<(), ConfigError> {
        self.uplink = uplink::apply(self.uplink.take(), cli)?;
        if self.uplink.is_some() {
            uplink::check_placement(self.engine.placement)?;
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
