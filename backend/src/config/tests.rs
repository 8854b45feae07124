//! Configuration parsing: each field, each error, the file and the command line.

use super::*;
use crate::sockets::DEFAULT_SOCKET_DIR;

fn load(specs: &[&str]) -> Result<DaemonConfig, ConfigError> {
    let specs: Vec<String> = specs.iter().map(|s| s.to_string()).collect();
    DaemonConfig::load(None, &specs, &EngineOverrides::default(), None)
}

/// A directory of configuration files, removed when dropped.
struct ConfigFiles(vmm_sys_util::tempdir::TempDir);

impl ConfigFiles {
    fn new() -> Self {
        ConfigFiles(vmm_sys_util::tempdir::TempDir::new().unwrap())
    }

    /// Writes `text` to the file `name` and returns its path.
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.as_path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Writes `text` to the file `name` and loads it (no guest specs, no overrides).
    fn load(&self, name: &str, text: &str) -> Result<DaemonConfig, ConfigError> {
        let path = self.write(name, text);
        DaemonConfig::load(Some(&path), &[], &EngineOverrides::default(), None)
    }
}

#[test]
fn a_full_guest_spec_parses() {
    let c = load(&["name=vm1,socket=/tmp/a.sock,mac=52:54:00:00:00:01,endpoints=10-20,channels=4"])
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
fn socket_access_fields_parse_from_a_spec() {
    let c = load(&[
        "name=vm1,socket=/tmp/a.sock,allow_uids=0,107,mac=52:54:00:00:00:01,socket_mode=0660,socket_group=107",
        "name=vm2,socket=/tmp/b.sock,mac=52:54:00:00:00:02",
    ])
    .unwrap();
    let a = &c.guests[0].access;
    assert_eq!(
        (a.mode, a.group, a.allow_uids.as_deref()),
        (0o660, Some(107), Some(&[0, 107][..]))
    );
    assert_eq!(c.guests[1].access, SocketAccess::default());
    assert_eq!(c.guests[1].access.mode, 0o600);
    assert_eq!(c.admin_socket, PathBuf::from(DEFAULT_ADMIN_SOCKET));
    assert_eq!(
        PathBuf::from(DEFAULT_ADMIN_SOCKET).parent(),
        Some(Path::new(DEFAULT_SOCKET_DIR))
    );
}

#[test]
fn each_bad_socket_access_field_is_named_with_its_value() {
    let base = "name=a,socket=/s,mac=52:54:00:00:00:01";
    let cases = [
        (",socket_mode=0777x", "socket_mode", "0777x"),
        (",socket_mode=1777", "socket_mode", "1777"),
        (",socket_mode=0066", "socket_mode", "0066"),
        (",socket_group=wheel", "socket_group", "wheel"),
        (",socket_group=4294967295", "socket_group", "4294967295"),
        (",allow_uids=", "allow_uids", ""),
        (",allow_uids=0,root", "allow_uids", "root"),
        (",allow_uids=-1", "allow_uids", "-1"),
    ];
    for (extra, field, value) in cases {
        let spec = format!("{base}{extra}");
        match load(&[&spec]) {
            Err(ConfigError::Field {
                field: f, value: v, ..
            }) => assert_eq!((f.as_str(), v.as_str()), (field, value), "{spec}"),
            other => panic!("{spec}: {other:?}"),
        }
    }
    // A part without `=` is only a uid right after allow_uids.
    match load(&[&format!("{base},channels=3,7")]) {
        Err(ConfigError::Field { field, .. }) => assert_eq!(field, "7"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn socket_access_and_admin_settings_load_from_a_toml_file() {
    let files = ConfigFiles::new();
    let guest =
        "[[guest]]\nname = \"vm1\"\nsocket = \"/tmp/vm1.sock\"\nmac = \"52:54:00:00:00:01\"\n";
    let mut c = files
        .load(
            "good.toml",
            &format!("admin_socket_mode = \"0660\"\nadmin_allow_uids = [1000]\n{guest}socket_mode = \"0660\"\nsocket_group = 107\nallow_uids = [0, 107]\n"),
        )
        .unwrap();
    let a = &c.guests[0].access;
    assert_eq!(
        (a.mode, a.group, a.allow_uids.as_deref()),
        (0o660, Some(107), Some(&[0, 107][..]))
    );
    assert_eq!(
        (c.admin_socket_mode, &c.admin_allow_uids[..]),
        (0o660, &[1000][..])
    );
    let admin = c.admin_access();
    let uids = admin.allow_uids.unwrap();
    assert!(uids.contains(&0) && uids.contains(&1000), "{uids:?}");
    assert!(uids.contains(&crate::sockets::sys::effective_uid()));
    // The command line replaces the file's admin settings, validated the same way.
    c.override_admin(Some("0600"), &[2000]).unwrap();
    assert_eq!(
        (c.admin_socket_mode, &c.admin_allow_uids[..]),
        (0o600, &[2000][..])
    );
    let e = c.override_admin(Some("0999"), &[]).unwrap_err();
    assert!(
        matches!(e, ConfigError::Field { ref value, .. } if value == "0999"),
        "{e}"
    );
    let e = c.override_admin(None, &[u32::MAX]).unwrap_err();
    assert!(
        matches!(e, ConfigError::Field { ref field, .. } if field == "uid"),
        "{e}"
    );
    let bad_cases = [
        (format!("{guest}socket_mode = \"0800\"\n"), "socket_mode"),
        (format!("{guest}socket_mode = 600\n"), "socket_mode"),
        (
            format!("{guest}socket_group = 4294967295\n"),
            "socket_group",
        ),
        (format!("{guest}allow_uids = []\n"), "allow_uids"),
        (format!("{guest}allow_uids = [-1]\n"), "allow_uids"),
        (
            format!("admin_socket_mode = \"7\"\n{guest}"),
            "admin_socket_mode",
        ),
        (
            format!("admin_allow_uids = []\n{guest}"),
            "admin_allow_uids",
        ),
    ];
    for (i, (text, field)) in bad_cases.iter().enumerate() {
        let e = files.load(&format!("bad{i}.toml"), text).unwrap_err();
        assert!(e.to_string().contains(field), "{text}: {e}");
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
    let files = ConfigFiles::new();
    let c = files
        .load(
            "good.toml",
            "admin_socket = \"/tmp/x.sock\"\n[engine]\nworkers = 2\nbackpressure_wait_ms = 5\nplacement = \"least-loaded\"\n\
         [[guest]]\nname = \"vm1\"\nsocket = \"/tmp/vm1.sock\"\nmac = \"52:54:00:00:00:01\"\nchannels = 3\n",
        )
        .unwrap();
    assert_eq!(c.engine.workers, 2);
    assert_eq!(c.engine.placement, Placement::LeastLoaded);
    assert_eq!(c.engine.backpressure_wait, Duration::from_millis(5));
    assert_eq!(c.admin_socket, PathBuf::from("/tmp/x.sock"));
    assert_eq!(c.guests[0].policy.max_channels, 3);
    let e = files
        .load("bad.toml", "[engine]\nworkerz = 2\n")
        .unwrap_err();
    assert!(e.to_string().contains("workerz"), "{e}");
    // A placement outside the accepted ones: the error names the field, the value and the choices.
    let e = files
        .load(
        "bad-placement.toml",
        "[engine]\nplacement = \"fastest\"\n[[guest]]\nname=\"a\"\nsocket=\"/a\"\nmac=\"52:54:00:00:00:01\"\n",
    )
        .unwrap_err();
    for word in [
        "bad-placement.toml",
        "placement",
        "fastest",
        "endpoint-hash",
        "least-loaded",
    ] {
        assert!(e.to_string().contains(word), "{word} missing from {e}");
    }
    let e = files
        .load(
        "bad2.toml",
        "[engine]\nworkers = 0\n[[guest]]\nname=\"a\"\nsocket=\"/a\"\nmac=\"52:54:00:00:00:01\"\n",
    )
        .unwrap_err();
    assert!(
        matches!(e, ConfigError::Field { ref field, .. } if field == "workers"),
        "{e}"
    );
}

#[test]
fn create_rate_and_byte_budget_load_from_spec_file_and_command_line() {
    let c = load(&[
        "name=a,socket=/tmp/a.sock,mac=52:54:00:00:00:01,create_burst=8,creates_per_sec=20",
    ])
    .unwrap();
    let p = &c.guests[0].policy;
    assert_eq!((p.create_burst, p.creates_per_sec), (8, 20));
    assert_eq!(c.engine.byte_budget, EngineConfig::default().byte_budget);

    let files = ConfigFiles::new();
    let file = files.write(
        "svnic.toml",
        "[engine]\nbyte_budget_kib = 64\n[[guest]]\nname = \"a\"\nsocket = \"/tmp/a.sock\"\n\
         mac = \"52:54:00:00:00:01\"\ncreate_burst = 4\ncreates_per_sec = 10\n",
    );
    let c = DaemonConfig::load(Some(&file), &[], &EngineOverrides::default(), None).unwrap();
    assert_eq!(c.engine.byte_budget, 64 << 10);
    assert_eq!(
        (
            c.guests[0].policy.create_burst,
            c.guests[0].policy.creates_per_sec
        ),
        (4, 10)
    );
    let cli = EngineOverrides {
        byte_budget_kib: Some(1024),
        ..Default::default()
    };
    let c = DaemonConfig::load(Some(&file), &[], &cli, None).unwrap();
    assert_eq!(c.engine.byte_budget, 1 << 20, "the command line wins");
}

#[test]
fn bad_create_rates_and_byte_budgets_are_named_with_their_value() {
    for (spec, field) in [
        ("create_burst=0", "create_burst"),
        ("creates_per_sec=x", "creates_per_sec"),
        ("creates_per_sec=-1", "creates_per_sec"),
    ] {
        let spec = format!("name=a,socket=/tmp/a.sock,mac=52:54:00:00:00:01,{spec}");
        match load(&[&spec]) {
            Err(ConfigError::Field { field: f, .. }) => assert_eq!(f, field, "{spec}"),
            other => panic!("{spec}: {other:?}"),
        }
    }
    for kib in [1, 1 << 30] {
        let cli = EngineOverrides {
            byte_budget_kib: Some(kib),
            ..Default::default()
        };
        let specs = vec!["name=a,socket=/tmp/a.sock,mac=52:54:00:00:00:01".to_string()];
        let err = DaemonConfig::load(None, &specs, &cli, None).unwrap_err();
        assert!(err.to_string().contains("byte_budget"), "{kib} KiB: {err}");
    }
}

#[test]
fn engine_errors_name_the_configuration_key_and_its_unit() {
    let files = ConfigFiles::new();
    for (engine, key, value) in [
        ("byte_budget_kib = 3", "byte_budget_kib", "'3'"),
        ("max_sleep_ms = 0", "max_sleep_ms", "'0'"),
        ("max_sleep_ms = 3600001", "max_sleep_ms", "'3600001'"),
        (
            "backpressure_wait_ms = 60001",
            "backpressure_wait_ms",
            "'60001'",
        ),
    ] {
        let text = format!(
            "[engine]\n{engine}\n[[guest]]\nname = \"a\"\nsocket = \"/tmp/a.sock\"\n\
             mac = \"52:54:00:00:00:01\"\n"
        );
        let err = files.load("svnic.toml", &text).unwrap_err().to_string();
        assert!(err.contains(key) && err.contains(value), "{engine}: {err}");
    }
}

fn load_pools(guests: &[&str], pools: &[&str]) -> Result<DaemonConfig, ConfigError> {
    let guests: Vec<String> = guests.iter().map(|s| s.to_string()).collect();
    let pools: Vec<String> = pools.iter().map(|s| s.to_string()).collect();
    DaemonConfig::load_with_pools(None, &guests, &pools, &EngineOverrides::default(), None)
}

fn mac(s: &str) -> MacAddr {
    s.parse().unwrap()
}

#[test]
fn a_pool_spec_parses_with_its_range_limit_and_policy() {
    let c = load_pools(
        &[],
        &["name=ranks,socket=/tmp/r.sock,macs=52:54:00:10:00:00/24,max=64,channels=8,endpoints=1-99,socket_mode=0660,allow_uids=0,1000"],
    )
    .unwrap();
    assert!(c.guests.is_empty());
    let p = &c.pools[0];
    assert_eq!((p.name.as_str(), p.max), ("ranks", 64));
    assert_eq!(p.socket, PathBuf::from("/tmp/r.sock"));
    // From the base to the end of its 24-bit prefix.
    assert_eq!(p.macs.len(), 0xf0_0000);
    assert_eq!(p.macs.to_string(), "52:54:00:10:00:00-52:54:00:ff:ff:ff");
    assert!(p.macs.contains(mac("52:54:00:ff:ff:ff")));
    assert!(!p.macs.contains(mac("52:54:00:0f:ff:ff")));
    assert!(!p.macs.contains(mac("52:54:01:00:00:00")));
    assert_eq!(
        (p.access.mode, p.access.allow_uids.as_deref()),
        (0o660, Some(&[0, 1000][..]))
    );
    let m = p.member_policy(0x102).unwrap();
    assert_eq!(m.name, "ranks-258");
    assert_eq!(m.macs, vec![mac("52:54:00:10:01:02")]);
    assert_eq!((m.max_channels, m.endpoints.clone()), (8, 1..=99));
    assert_eq!(p.member_policy(0xf0_0000), None);

    let r = load_pools(
        &[],
        &["name=r,socket=/r,macs=02:00:00:00:00:fe-02:00:00:00:01:01,max=4"],
    )
    .unwrap();
    let macs = r.pools[0].macs;
    assert_eq!(macs.len(), 4);
    assert_eq!(macs.get(2), Some(mac("02:00:00:00:01:00")));
    assert_eq!(macs.get(4), None);
}

#[test]
fn each_bad_pool_field_is_named_with_its_value() {
    let base = "name=r,socket=/r.sock";
    let cases = [
        (format!("{base},macs=zz/24,max=1"), "macs", "zz/24"),
        (
            format!("{base},macs=52:54:00:10:00:00/7,max=1"),
            "macs",
            "52:54:00:10:00:00/7",
        ),
        (
            format!("{base},macs=52:54:00:10:00:00/49,max=1"),
            "macs",
            "52:54:00:10:00:00/49",
        ),
        (
            format!("{base},macs=53:54:00:10:00:00/24,max=1"),
            "macs",
            "53:54:00:10:00:00/24",
        ),
        (
            format!("{base},macs=52:54:00:00:00:09-52:54:00:00:00:01,max=1"),
            "macs",
            "52:54:00:00:00:09-52:54:00:00:00:01",
        ),
        (
            format!("{base},macs=52:54:00:00:00:01-54:54:00:00:00:01,max=1"),
            "macs",
            "52:54:00:00:00:01-54:54:00:00:00:01",
        ),
        (
            format!("{base},macs=52:54:00:00:00:00/40,max=0"),
            "max",
            "0",
        ),
        (
            format!("{base},macs=52:54:00:00:00:00/40,max=257"),
            "max",
            "257",
        ),
        (
            format!("{base},macs=52:54:00:00:00:00/16,max=1025"),
            "max",
            "1025",
        ),
        (
            format!("{base},macs=52:54:00:00:00:00/40,max=x"),
            "max",
            "x",
        ),
        (format!("{base},max=4"), "macs", ""),
        (format!("{base},macs=52:54:00:00:00:00/40"), "max", ""),
        (
            "socket=/r.sock,macs=52:54:00:00:00:00/40,max=4".to_string(),
            "name",
            "",
        ),
        (
            "name=r,macs=52:54:00:00:00:00/40,max=4".to_string(),
            "socket",
            "",
        ),
        (
            format!("{base},macs=52:54:00:00:00:00/40,max=4,mac=52:54:00:00:00:01"),
            "mac",
            "52:54:00:00:00:01",
        ),
        (
            format!("{base},macs=52:54:00:00:00:00/40,max=4,channels=y"),
            "channels",
            "y",
        ),
    ];
    for (spec, field, value) in cases {
        match load_pools(&[], &[&spec]) {
            Err(ConfigError::Field {
                field: f, value: v, ..
            }) => assert_eq!((f.as_str(), v.as_str()), (field, value), "{spec}"),
            other => panic!("{spec}: {other:?}"),
        }
    }
    // A member name too long for a guest name is refused through the pool's policy.
    let long = "p".repeat(60);
    match load_pools(
        &[],
        &[&format!(
            "name={long},socket=/r,macs=52:54:00:00:00:00/32,max=4"
        )],
    ) {
        Err(ConfigError::Field { context, field, .. }) => {
            assert_eq!(
                (context.as_str(), field.as_str()),
                (&*format!("pool '{long}'"), "policy")
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn pools_may_not_overlap_each_other_or_the_guests() {
    let guest = "name=vm1,socket=/g.sock,mac=52:54:00:10:00:05";
    let range = "macs=52:54:00:10:00:00/40,max=4";
    let cases = [
        (
            vec![guest],
            vec![format!("name=a,socket=/a.sock,{range}")],
            "macs",
            "52:54:00:10:00:00-52:54:00:10:00:ff",
        ),
        (
            vec![guest],
            vec![format!(
                "name=a,socket=/g.sock,macs=52:54:00:20:00:00/40,max=4"
            )],
            "socket",
            "/g.sock",
        ),
        (
            vec!["name=a-3,socket=/g.sock,mac=52:54:00:30:00:01"],
            vec![format!("name=a,socket=/a.sock,{range}")],
            "name",
            "a",
        ),
        (
            vec![],
            vec![
                format!("name=a,socket=/a.sock,{range}"),
                "name=b,socket=/b.sock,macs=52:54:00:10:00:80-52:54:00:10:01:10,max=4".into(),
            ],
            "macs",
            "52:54:00:10:00:80-52:54:00:10:01:10",
        ),
        (
            vec![],
            vec![
                format!("name=a,socket=/a.sock,{range}"),
                "name=b,socket=/a.sock,macs=52:54:00:20:00:00/40,max=4".into(),
            ],
            "socket",
            "/a.sock",
        ),
        (
            vec![],
            vec![
                format!("name=a,socket=/a.sock,{range}"),
                "name=a,socket=/b.sock,macs=52:54:00:20:00:00/40,max=4".into(),
            ],
            "name",
            "a",
        ),
    ];
    for (guests, pools, field, value) in cases {
        let pools: Vec<&str> = pools.iter().map(String::as_str).collect();
        match load_pools(&guests, &pools) {
            Err(ConfigError::Field {
                field: f, value: v, ..
            }) => assert_eq!(
                (f.as_str(), v.as_str()),
                (field, value),
                "{guests:?} {pools:?}"
            ),
            other => panic!("{guests:?} {pools:?}: {other:?}"),
        }
    }
    // Neighbours that do not overlap are fine, and a guest named like no member.
    let c = load_pools(
        &[guest, "name=a-x,socket=/h.sock,mac=52:54:00:30:00:01"],
        &[
            "name=a,socket=/a.sock,macs=52:54:00:10:01:00/40,max=4",
            "name=b,socket=/b.sock,macs=52:54:00:10:00:06-52:54:00:10:00:ff,max=4",
        ],
    )
    .unwrap();
    assert_eq!((c.guests.len(), c.pools.len()), (2, 2));
}

#[test]
fn a_pool_loads_from_a_toml_file_and_guest_and_pool_keys_stay_apart() {
    let files = ConfigFiles::new();
    let pool = "[[pool]]\nname = \"ranks\"\nsocket = \"/tmp/ranks.sock\"\n";
    let good = format!(
        "{pool}macs = \"52:54:00:10:00:00/24\"\nmax = 64\nchannels = 4\nallow_uids = [1000]\n"
    );
    let c = files.load("good.toml", &good).unwrap();
    let p = &c.pools[0];
    assert_eq!(
        (p.name.as_str(), p.max, p.policy.max_channels),
        ("ranks", 64, 4)
    );
    assert_eq!(p.macs.get(0), Some(mac("52:54:00:10:00:00")));
    assert_eq!(p.access.allow_uids.as_deref(), Some(&[1000][..]));
    let guest =
        "[[guest]]\nname = \"vm1\"\nsocket = \"/tmp/vm1.sock\"\nmac = \"52:54:00:00:00:01\"\n";
    let bad_cases = [
        (
            format!("{pool}macs = \"52:54:00:10:00:00/24\"\nmax = 2000\n"),
            "max = '2000'",
        ),
        (
            format!("{pool}macs = \"52:54:00:10:00:00/99\"\nmax = 2\n"),
            "macs = '52:54:00:10:00:00/99'",
        ),
        (
            format!("{pool}mac = \"52:54:00:10:00:00\"\nmax = 2\n"),
            "mac = '52:54:00:10:00:00'",
        ),
        (format!("{guest}max = 2\n"), "max = '2'"),
        (
            format!("{guest}macs = \"52:54:00:10:00:00/24\"\n"),
            "macs = '52:54:00:10:00:00/24'",
        ),
        (
            "[[guest]]\nname = \"vm1\"\nsocket = \"/tmp/vm1.sock\"\n".to_string(),
            "mac = ''",
        ),
    ];
    for (i, (text, what)) in bad_cases.iter().enumerate() {
        let e = files.load(&format!("bad-pool{i}.toml"), text).unwrap_err();
        assert!(e.to_string().contains(what), "{text}: {e}");
    }
}

/// Loads `text` with one guest added.
fn load_file(text: &str) -> Result<DaemonConfig, ConfigError> {
    let guest = "[[guest]]\nname = \"a\"\nsocket = \"/tmp/a.sock\"\nmac = \"52:54:00:00:00:01\"\n";
    ConfigFiles::new().load("svnic.toml", &format!("{text}\n{guest}"))
}

#[test]
fn no_uplink_unless_an_interface_is_named() {
    let c = load(&["name=a,socket=/tmp/a.sock,mac=52:54:00:00:00:01"]).unwrap();
    assert_eq!(c.uplink, None);
    let mut c = c;
    c.override_uplink(&UplinkOverrides::default()).unwrap();
    assert_eq!(c.uplink, None);
}

#[test]
fn uplink_from_the_file_with_the_command_line_over_it() {
    let c = load_file(
        "[uplink]\niface = \"veth0\"\npeer_timeout_ms = 500\n[uplink.fault]\ndrop = 0.05\nseed = 7\n",
    )
    .unwrap();
    let up = c.uplink.clone().unwrap();
    assert_eq!(up.iface, "veth0");
    assert_eq!(up.peer_timeout, Duration::from_millis(500));
    assert_eq!(
        up.fault,
        FaultSettings {
            drop: 0.05,
            duplicate: 0.0,
            reorder: 0.0,
            seed: 7
        }
    );
    assert!(!up.fault.is_off());

    let mut c2 = c.clone();
    c2.override_uplink(&UplinkOverrides {
        peer_timeout_ms: Some(100),
        fault: Some("duplicate=0.5,reorder=1".into()),
        ..Default::default()
    })
    .unwrap();
    let up = c2.uplink.unwrap();
    assert_eq!(
        (up.iface.as_str(), up.peer_timeout),
        ("veth0", Duration::from_millis(100))
    );
    assert_eq!(
        (up.fault.drop, up.fault.duplicate, up.fault.reorder),
        (0.0, 0.5, 1.0)
    );

    let mut c3 = c;
    c3.override_uplink(&UplinkOverrides {
        iface: Some("eth1".into()),
        ..Default::default()
    })
    .unwrap();
    let up = c3.uplink.unwrap();
    assert_eq!(up.iface, "eth1");
    assert_eq!(
        up.peer_timeout, DEFAULT_PEER_TIMEOUT,
        "a new --uplink starts afresh"
    );
    assert!(up.fault.is_off());
}

#[test]
fn bad_uplink_settings_are_named_with_their_value() {
    for (text, field, value) in [
        ("[uplink]\niface = \"\"\n", "iface", ""),
        ("[uplink]\niface = \"a/b\"\n", "iface", "a/b"),
        (
            "[uplink]\niface = \"sixteen-chars-xx\"\n",
            "iface",
            "sixteen-chars-xx",
        ),
        ("[uplink]\niface = \"a b\"\n", "iface", "a b"),
        ("[uplink]\niface = \"..\"\n", "iface", ".."),
        ("[uplink]\npeer_timeout_ms = 100\n", "iface", ""),
        (
            "[uplink]\niface = \"v\"\npeer_timeout_ms = 5\n",
            "peer_timeout_ms",
            "5",
        ),
        (
            "[uplink]\niface = \"v\"\n[uplink.fault]\ndrop = 1.5\n",
            "fault.drop",
            "1.5",
        ),
        (
            "[uplink]\niface = \"v\"\n[uplink.fault]\nreorder = -0.1\n",
            "fault.reorder",
            "-0.1",
        ),
        (
            "[engine]\nplacement = \"least-loaded\"\n[uplink]\niface = \"v\"\n",
            "placement",
            "least-loaded",
        ),
    ] {
        match load_file(text) {
            Err(ConfigError::Field {
                field: f, value: v, ..
            }) => assert_eq!((f.as_str(), v.as_str()), (field, value), "{text}"),
            other => panic!("{text}: {other:?}"),
        }
    }
    assert!(matches!(
        load_file("[uplink]\niface = \"v\"\nmtu = 9000\n"),
        Err(ConfigError::File { .. })
    ));
    let base = load(&["name=a,socket=/tmp/a.sock,mac=52:54:00:00:00:01"]).unwrap();
    for (cli, field) in [
        (
            UplinkOverrides {
                fault: Some("drop=0.1".into()),
                ..Default::default()
            },
            "iface",
        ),
        (
            UplinkOverrides {
                iface: Some("v".into()),
                fault: Some("drop=2".into()),
                ..Default::default()
            },
            "fault.drop",
        ),
        (
            UplinkOverrides {
                iface: Some("v".into()),
                fault: Some("loss=0.1".into()),
                ..Default::default()
            },
            "fault",
        ),
        (
            UplinkOverrides {
                iface: Some("v".into()),
                peer_timeout_ms: Some(700_000),
                ..Default::default()
            },
            "peer_timeout_ms",
        ),
    ] {
        let mut c = base.clone();
        match c.override_uplink(&cli) {
            Err(ConfigError::Field { field: f, .. }) => assert_eq!(f, field, "{cli:?}"),
            other => panic!("{cli:?}: {other:?}"),
        }
    }
}

#[test]
fn spin_and_idle_passes_come_from_the_file_or_the_command_line_and_are_checked() {
    let c = load_file("[engine]\nspin_passes = 0\nidle_passes = 100\n").unwrap();
    assert_eq!((c.engine.spin_passes, c.engine.idle_passes), (0, 100));
    let specs = vec!["name=a,socket=/tmp/a.sock,mac=52:54:00:00:00:01".to_string()];
    let cli = EngineOverrides {
        spin_passes: Some(5),
        idle_passes: Some(7),
        ..Default::default()
    };
    let c = DaemonConfig::load(None, &specs, &cli, None).unwrap();
    assert_eq!((c.engine.spin_passes, c.engine.idle_passes), (5, 7));
    let cli = EngineOverrides {
        spin_passes: Some(10),
        idle_passes: Some(7),
        ..Default::default()
    };
    match DaemonConfig::load(None, &specs, &cli, None) {
        Err(ConfigError::Field { field, value, .. }) => {
            assert_eq!((field.as_str(), value.as_str()), ("spin_passes", "10"))
        }
        other => panic!("{other:?}"),
    }
}
