//! The svnic libfabric provider (libsvnic-fi.so) as applications load it: libfabric's own
//! `fi_info` and `fi_pingpong` (Debian's libfabric-bin, installed by scripts/setup.sh), and a C
//! program compiled here against the installed headers (libfabric-dev), with `FI_PROVIDER_PATH`
//! pointing at the library installed by scripts/install-libfabric-provider.sh, on host-process
//! guests of the daemon (`Daemon::start`, as `svnic serve` runs it).
#![allow(clippy::unwrap_used)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use svnic_backend::config::EngineOverrides;
use svnic_channels::MacAddr;
use svnic_tests::daemon_fixture::DaemonFixture;
use svnic_tests::daemon_proc::{kill_with_parent, repo_root, KillOnDrop, ScratchDir};

const MAC1: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x71, 0x01, 0x01]);
const MAC2: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x71, 0x01, 0x02]);
const LONG: Duration = Duration::from_secs(180);

/// The directory holding libsvnic-fi.so (under the target directory), installed once per test
/// binary by the project's script.
fn provider_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| repo_root().join("target"), PathBuf::from);
        let dir = target.join("libfabric-provider");
        let script = repo_root().join("scripts/install-libfabric-provider.sh");
        let out = Command::new(&script).arg(&dir).output().unwrap();
        assert!(
            out.status.success(),
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(dir.join("libsvnic-fi.so").is_file());
        dir
    })
}

/// A libfabric tool (from libfabric-bin) with the provider path and `FI_SVNIC_SOCKET`.
fn fi_tool(tool: &str, socket: Option<&Path>) -> Command {
    let mut c = Command::new(tool);
    c.env("FI_PROVIDER_PATH", provider_dir())
        .env("FI_PROVIDER", "svnic")
        .env("FI_SVNIC_LOG", "warn")
        .env_remove("FI_SVNIC_ENDPOINT");
    match socket {
        Some(s) => c.env("FI_SVNIC_SOCKET", s),
        None => c.env_remove("FI_SVNIC_SOCKET"),
    };
    c
}

fn run(mut c: Command) -> (bool, String) {
    let out = c.output().unwrap_or_else(|e| {
        panic!("cannot run {c:?} (scripts/setup.sh installs libfabric-bin): {e}")
    });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn fi_info_lists_the_svnic_dgram_endpoint() {
    // No daemon is needed to list the provider: getinfo never connects.
    let mut c = fi_tool("fi_info", None);
    c.args(["-p", "svnic"]);
    let (ok, text) = run(c);
    assert!(ok, "{text}");
    let entries: Vec<(&str, &str)> = text
        .split("provider: ")
        .skip(1)
        .map(|e| {
            let name = e.lines().next().unwrap_or("").trim();
            let ty = e
                .lines()
                .find_map(|l| l.trim().strip_prefix("type: "))
                .unwrap_or("");
            (name, ty)
        })
        .collect();
    assert!(entries.contains(&("svnic", "FI_EP_DGRAM")), "{text}");

    let mut c = fi_tool("fi_info", None);
    c.args(["-p", "svnic", "-t", "FI_EP_DGRAM", "-v"]);
    let (ok, text) = run(c);
    assert!(ok, "{text}");
    for want in [
        "type: FI_EP_DGRAM",
        "max_msg_size: 65536",
        "inject_size: 40",
        "name: svnic",
        "prov_name: svnic",
        "data_progress: FI_PROGRESS_MANUAL",
    ] {
        assert!(text.contains(want), "{want} missing in:\n{text}");
    }
    assert!(!text.contains("svnic;svnic"), "{text}");
}

/// A TCP port nobody listens on right now (for fi_pingpong's out-of-band socket).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// True once something listens on TCP `port` (read from /proc, so no connection is used up).
fn listening(port: u16) -> bool {
    let needle = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && format!("{} ", cols[1]).ends_with(&needle) && cols[3] == "0A"
            })
        })
    })
}

/// One result line of fi_pingpong: bytes, #sent, #ack.
#[derive(Debug, PartialEq, Eq)]
struct PingpongLine {
    bytes: u64,
    sent: u64,
    acked: u64,
}

/// fi_pingpong's size column: `64`, `1.5k`, `64k`, `1m`.
fn parse_size(s: &str) -> Option<u64> {
    let (num, mul) = match s.as_bytes().last()? {
        b'k' => (&s[..s.len() - 1], 1024.0),
        b'm' => (&s[..s.len() - 1], 1024.0 * 1024.0),
        _ => (s, 1.0),
    };
    let v: f64 = num.parse().ok()?;
    Some((v * mul).round() as u64)
}

/// The result table of fi_pingpong's output (the lines under its `bytes #sent #ack` header).
fn parse_pingpong(text: &str) -> Vec<PingpongLine> {
    let mut lines = text.lines().skip_while(|l| !l.starts_with("bytes"));
    assert!(lines.next().is_some(), "no result table in:\n{text}");
    lines
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            if cols.len() < 8 {
                return None;
            }
            Some(PingpongLine {
                bytes: parse_size(cols[0])?,
                sent: cols[1].parse().ok()?,
                acked: cols[2].strip_prefix('=')?.parse().ok()?,
            })
        })
        .collect()
}

/// The sizes `fi_pingpong -S all` runs up to `max` (util/pingpong.c of 1.17: 0, then powers of
/// two and 1.5 times each from 1).
fn all_sizes(max: u64) -> Vec<u64> {
    let mut v = vec![0];
    let mut p = 1u64;
    while p <= max {
        v.push(p);
        if p >= 2 && p + p / 2 <= max {
            v.push(p + p / 2);
        }
        p *= 2;
    }
    v
}

#[test]
fn size_and_table_parsing() {
    assert_eq!(parse_size("1.5k"), Some(1536));
    assert_eq!(parse_size("64k"), Some(65536));
    assert_eq!(parse_size("3"), Some(3));
    assert_eq!(parse_size("x"), None);
    assert_eq!(
        all_sizes(16),
        vec![0, 1, 2, 3, 4, 6, 8, 12, 16],
        "the list of util/pingpong.c"
    );
    let t = "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n\
             64      10      =10      1.2k        0.08s      0.02    3805.90       0.00\n";
    assert_eq!(
        parse_pingpong(t),
        vec![PingpongLine {
            bytes: 64,
            sent: 10,
            acked: 10
        }]
    );
}

/// A fi_pingpong server with `args` on guest 1 of `d`, and once it listens its client on
/// guest 2 (each process's output into its log); on a fresh control port.
fn start_pingpong(
    d: &DaemonFixture,
    args: &[&str],
    server_log: &Path,
    client_log: &Path,
) -> (KillOnDrop, KillOnDrop) {
    let port = free_port().to_string();
    let spawn = |guest: u8, extra: &[&str], log: &Path| {
        let out = std::fs::File::create(log).unwrap();
        let mut c = fi_tool("fi_pingpong", Some(&d.sock(guest)));
        c.args(args)
            .args(extra)
            .stdin(Stdio::null())
            .stderr(out.try_clone().unwrap())
            .stdout(out);
        kill_with_parent(&mut c);
        KillOnDrop(c.spawn().unwrap())
    };
    let mut server = spawn(1, &["-B", &port], server_log);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !listening(port.parse().unwrap()) {
        assert!(Instant::now() < deadline, "the server never listened");
        assert!(server.0.try_wait().unwrap().is_none(), "the server exited");
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = spawn(2, &["-P", &port, "127.0.0.1"], client_log);
    (server, client)
}

#[test]
fn fi_pingpong_survivor_of_a_killed_peer_gets_an_error_not_a_hang() {
    let d = DaemonFixture::start(
        "fi-kill",
        &[(MAC1, ""), (MAC2, "")],
        EngineOverrides::default(),
    );
    let scratch = ScratchDir::new("fi-kill").unwrap();
    let (server_log, client_log) = (
        scratch.path().join("server.log"),
        scratch.path().join("client.log"),
    );
    // 16 B goes by fi_inject, which has no completion: only the provider's probe of the peer can
    // end the server's wait for the next message.
    let args = ["-p", "svnic", "-e", "dgram", "-S", "16", "-I", "100000000"];
    let (mut server, mut client) = start_pingpong(&d, &args, &server_log, &client_log);
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        client.0.try_wait().unwrap().is_none(),
        "the client ended early:\n{}",
        std::fs::read_to_string(&client_log).unwrap()
    );
    client.0.kill().unwrap();
    let killed = Instant::now();
    let status = server.wait_until(killed + Duration::from_secs(60)).unwrap();
    let out = std::fs::read_to_string(&server_log).unwrap();
    let status =
        status.unwrap_or_else(|| panic!("the server still waits 60 s after its peer died:\n{out}"));
    assert!(!status.success(), "{out}");
    assert!(
        out.contains("cq_readerr: svnic: no route to destination")
            || out.contains("cq_readerr: svnic: destination channel gone"),
        "{status:?}\n{out}"
    );
}

#[test]
fn fi_pingpong_dgram_between_two_guests_every_size_to_64k_verified() {
    let d = DaemonFixture::start(
        "fi-pingpong",
        &[(MAC1, ""), (MAC2, "")],
        EngineOverrides::default(),
    );
    let scratch = ScratchDir::new("fi-pingpong").unwrap();
    let iterations = "20";
    let common = [
        "-p", "svnic", "-e", "dgram", "-S", "all", "-c", "-I", iterations,
    ];

    let (server_log, client_log) = (
        scratch.path().join("server.log"),
        scratch.path().join("client.log"),
    );
    let (mut server, mut client) = start_pingpong(&d, &common, &server_log, &client_log);

    let deadline = Instant::now() + LONG;
    let client_status = client.wait_until(deadline).unwrap();
    let server_status = server.wait_until(deadline).unwrap();
    let client_out = std::fs::read_to_string(&client_log).unwrap();
    let server_out = std::fs::read_to_string(&server_log).unwrap();
    assert!(
        client_status.is_some_and(|s| s.success()),
        "client: {client_status:?}\n{client_out}"
    );
    assert!(
        server_status.is_some_and(|s| s.success()),
        "server: {server_status:?}\n{server_out}"
    );

    // Both sides ran every size of `-S all` up to max_msg_size (64 KiB), each with every
    // iteration sent and acknowledged (fi_pingpong checks each payload with -c and exits
    // non-zero on a mismatch).
    let n: u64 = iterations.parse().unwrap();
    for (who, out) in [("client", &client_out), ("server", &server_out)] {
        let table = parse_pingpong(out);
        let sizes: Vec<u64> = table.iter().map(|l| l.bytes).collect();
        assert_eq!(sizes, all_sizes(64 << 10), "{who}:\n{out}");
        for l in &table {
            assert_eq!((l.sent, l.acked), (n, n), "{who}: {l:?}\n{out}");
        }
    }
}

/// A C program using the provider through libfabric's API: attributes, bad use (each printed as
/// `name value`), and one 64 KiB message between two endpoints, checked byte for byte.
const BAD_USE_C: &str = r#"#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_errno.h>

#define SHOW(name, expr) printf("%s %ld\n", name, (long)(expr))
#define MUST(expr) do { long rc_ = (long)(expr); if (rc_) { printf("FAILED %s %ld\n", #expr, rc_); return 1; } } while (0)

int main(void)
{
	struct fi_info *hints = fi_allocinfo(), *info = NULL;
	struct fid_fabric *fabric; struct fid_domain *domain; struct fid_av *av;
	struct fid_cq *cq; struct fid_ep *ep, *ep2; struct fid_eq *eq;
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_NONE, .size = 64 };
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	struct fi_eq_attr eq_attr = { .wait_obj = FI_WAIT_UNSPEC };
	char name[64], name2[64], garbage[16], text[64];
	size_t len;
	fi_addr_t a = 0, self, peer;
	struct fi_cq_entry entry;
	static char buf[70000], rbuf[70000];
	int i;

	hints->ep_attr->type = FI_EP_DGRAM;
	hints->caps = FI_MSG;
	hints->mode = FI_CONTEXT | FI_CONTEXT2 | FI_MSG_PREFIX;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
	hints->fabric_attr->prov_name = strdup("svnic");
	MUST(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info));
	printf("prov_name %s\n", info->fabric_attr->prov_name);
	SHOW("max_msg_size", info->ep_attr->max_msg_size);
	SHOW("inject_size", info->tx_attr->inject_size);
	SHOW("mode", info->mode);
	SHOW("second_entry", info->next != NULL);
	MUST(fi_fabric(info->fabric_attr, &fabric, NULL));
	MUST(fi_eq_open(fabric, &eq_attr, &eq, NULL));
	MUST(fi_domain(fabric, info, &domain, NULL));
	MUST(fi_av_open(domain, &av_attr, &av, NULL));
	MUST(fi_cq_open(domain, &cq_attr, &cq, NULL));
	MUST(fi_endpoint(domain, info, &ep, NULL));
	MUST(fi_endpoint(domain, info, &ep2, NULL));
	SHOW("send_before_enable", fi_send(ep, buf, 8, NULL, 0, NULL));
	SHOW("enable_without_av", fi_enable(ep));
	SHOW("bind_cq_no_flags", fi_ep_bind(ep, &cq->fid, 0));
	MUST(fi_ep_bind(ep, &av->fid, 0));
	MUST(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
	MUST(fi_ep_bind(ep, &eq->fid, 0));
	MUST(fi_enable(ep));
	MUST(fi_ep_bind(ep2, &av->fid, 0));
	MUST(fi_ep_bind(ep2, &cq->fid, FI_TRANSMIT | FI_RECV));
	MUST(fi_enable(ep2));

	len = 0;
	SHOW("getname_null", fi_getname(&ep->fid, NULL, &len));
	SHOW("getname_len", len);
	len = sizeof name;
	MUST(fi_getname(&ep->fid, name, &len));
	len = sizeof name2;
	MUST(fi_getname(&ep2->fid, name2, &len));
	memset(garbage, 0x5a, sizeof garbage);
	SHOW("av_insert_garbage", fi_av_insert(av, garbage, 1, &a, 0, NULL));
	SHOW("garbage_notavail", a == FI_ADDR_NOTAVAIL);
	SHOW("av_insert_null", fi_av_insert(av, NULL, 1, &a, 0, NULL));
	SHOW("av_insert_self", fi_av_insert(av, name, 1, &self, 0, NULL));
	SHOW("av_insert_peer", fi_av_insert(av, name2, 1, &peer, 0, NULL));
	len = sizeof text;
	printf("straddr %s\n", fi_av_straddr(av, name2, text, &len));
	len = 4;
	SHOW("lookup_short", fi_av_lookup(av, peer, text, &len));
	SHOW("lookup_len", len);
	SHOW("lookup_unknown", fi_av_lookup(av, 12345, text, &len));

	SHOW("send_unknown_addr", fi_send(ep, buf, 8, NULL, 12345, NULL));
	SHOW("send_null_buf", fi_send(ep, NULL, 8, NULL, peer, NULL));
	SHOW("send_too_long", fi_send(ep, buf, 65537, NULL, peer, NULL));
	SHOW("inject_too_long", fi_inject(ep, buf, 41, peer));
	SHOW("recv_null_buf", fi_recv(ep, NULL, 8, NULL, 0, NULL));
	SHOW("tsend", fi_tsend(ep, buf, 8, NULL, peer, 1, NULL));
	SHOW("rma_read", fi_read(ep, buf, 8, NULL, peer, 0, 0, NULL));
	SHOW("cq_read_empty", fi_cq_read(cq, &entry, 1));
	SHOW("cq_strerror_null", fi_cq_strerror(cq, 1, NULL, NULL, 0) != NULL);

	for (i = 0; i < 65536; i++)
		buf[i] = (char)(i * 7 + 3);
	MUST(fi_recv(ep2, rbuf, sizeof rbuf, NULL, 0, (void *)0x2));
	MUST(fi_send(ep, buf, 65536, NULL, peer, (void *)0x1));
	{
		int got = 0, seen = 0;
		for (i = 0; i < 20000000 && got < 2; i++) {
			ssize_t n = fi_cq_read(cq, &entry, 1);
			if (n == 1) {
				got++;
				seen |= (int)(long)entry.op_context;
			} else if (n != -FI_EAGAIN) {
				SHOW("cq_read_failed", n);
				return 1;
			}
		}
		SHOW("completions", got);
		SHOW("contexts", seen);
		SHOW("payload_equal", memcmp(buf, rbuf, 65536) == 0);
	}
	MUST(fi_close(&ep->fid));
	MUST(fi_close(&ep2->fid));
	MUST(fi_close(&cq->fid));
	MUST(fi_close(&av->fid));
	MUST(fi_close(&domain->fid));
	MUST(fi_close(&eq->fid));
	MUST(fi_close(&fabric->fid));
	fi_freeinfo(info);
	fi_freeinfo(hints);
	printf("done\n");
	return 0;
}
"#;

#[test]
fn a_c_program_gets_libfabric_error_codes_for_bad_use() {
    let d = DaemonFixture::start("fi-c", &[(MAC1, "")], EngineOverrides::default());
    let scratch = ScratchDir::new("fi-c").unwrap();
    let src = scratch.path().join("bad_use.c");
    let exe = scratch.path().join("bad_use");
    std::fs::write(&src, BAD_USE_C).unwrap();
    let mut cc = Command::new("cc");
    cc.arg("-Wall")
        .arg("-Werror")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-lfabric");
    let (ok, text) = run(cc);
    assert!(
        ok,
        "cc (scripts/setup.sh installs gcc and libfabric-dev):\n{text}"
    );

    let (ok, text) = run(fi_tool(exe.to_str().unwrap(), Some(&d.sock(1))));
    assert!(ok, "{text}");
    let got: Vec<(&str, &str)> = text.lines().filter_map(|l| l.split_once(' ')).collect();
    let want = [
        ("prov_name", "svnic"),
        ("max_msg_size", "65536"),
        ("inject_size", "40"),
        ("mode", "0"),
        ("second_entry", "0"),
        ("send_before_enable", "-258"), // -FI_EOPBADSTATE
        ("enable_without_av", "-267"),  // -FI_ENOAV
        ("bind_cq_no_flags", "-260"),   // -FI_EBADFLAGS
        ("getname_null", "-257"),       // -FI_ETOOSMALL
        ("getname_len", "16"),
        ("av_insert_garbage", "-22"), // -FI_EINVAL
        ("garbage_notavail", "1"),
        ("av_insert_null", "-22"),
        ("av_insert_self", "1"),
        ("av_insert_peer", "1"),
        ("straddr", &format!("fi_svnic://{MAC1}/2")),
        ("lookup_short", "0"),
        ("lookup_len", "16"),
        ("lookup_unknown", "-22"),
        ("send_unknown_addr", "-22"),
        ("send_null_buf", "-22"),
        ("send_too_long", "-90"), // -FI_EMSGSIZE
        ("inject_too_long", "-90"),
        ("recv_null_buf", "-22"),
        ("tsend", "-38"), // -FI_ENOSYS
        ("rma_read", "-38"),
        ("cq_read_empty", "-11"), // -FI_EAGAIN
        ("cq_strerror_null", "1"),
        ("completions", "2"),
        ("contexts", "3"),
        ("payload_equal", "1"),
    ];
    let want: Vec<(&str, &str)> = want.iter().map(|(k, v)| (*k, &**v)).collect();
    assert_eq!(got, want, "{text}");
    assert_eq!(text.lines().last(), Some("done"), "{text}");
}
