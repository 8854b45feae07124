//! The svnic libfabric provider (libsvnic-fi.so) as applications load it: libfabric's own
//! `fi_info` and `fi_pingpong` (Debian's libfabric-bin, installed by scripts/setup.sh), and a C
//! program compiled here against the installed headers (libfabric-dev), with `FI_PROVIDER_PATH`
//! pointing at the library installed by scripts/install-libfabric-provider.sh, on host-process
//! guests of the daemon (`Daemon::start`, as `svnic serve` runs it).
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::Duration;

use svnic_backend::config::EngineOverrides;
use svnic_channels::MacAddr;
use svnic_tests::daemon_fixture::DaemonFixture;
use svnic_tests::daemon_proc::ScratchDir;
use svnic_tests::libfabric::{
    acked_sizes, all_sizes, check_survivor_of_a_killed_client, fi_tool, parse_pingpong, parse_size,
    run, run_pingpong, PingpongLine,
};

const MAC1: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x71, 0x01, 0x01]);
const MAC2: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x71, 0x01, 0x02]);
const LONG: Duration = Duration::from_secs(180);

/// `fi_info` with `args` and the variables `env`: its output, after checking that it succeeded.
fn fi_info(env: &[(&str, &str)], args: &[&str]) -> String {
    let mut c = fi_tool("fi_info", None);
    c.envs(env.iter().copied()).args(args);
    let (ok, text) = run(c);
    assert!(ok, "{text}");
    text
}

#[test]
fn fi_info_lists_the_native_rdm_and_the_dgram_endpoint() {
    // No daemon is needed to list the provider: getinfo never connects.
    let text = fi_info(&[], &["-p", "svnic"]);
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
    assert_eq!(
        entries,
        [("svnic", "FI_EP_RDM"), ("svnic", "FI_EP_DGRAM")],
        "{text}"
    );
    // ofi_rxd layers on the DGRAM endpoint only when asked to.
    let text = fi_info(&[("FI_SVNIC_RXD", "1")], &["-p", "svnic;ofi_rxd"]);
    assert!(text.contains("provider: svnic;ofi_rxd"), "{text}");

    // Each endpoint type's attributes, as `fi_info -v` prints them.
    let rdm: &[&str] = &[
        "type: FI_EP_RDM",
        "max_msg_size: 524288",
        "inject_size: 19",
        "cq_data_size: 8",
        "mem_tag_format: 0xaaaaaaaaaaaaaaaa",
        "FI_TAGGED",
        "FI_DIRECTED_RECV",
        "FI_ORDER_SAS",
        "prov_name: svnic",
    ];
    let dgram: &[&str] = &[
        "type: FI_EP_DGRAM",
        "max_msg_size: 65536",
        "inject_size: 40",
        "name: svnic",
        "prov_name: svnic",
        "data_progress: FI_PROGRESS_MANUAL",
    ];
    for (ep_type, lines) in [("FI_EP_RDM", rdm), ("FI_EP_DGRAM", dgram)] {
        let text = fi_info(&[], &["-p", "svnic", "-t", ep_type, "-v"]);
        for want in lines {
            assert!(text.contains(want), "{want} missing in:\n{text}");
        }
        assert!(!text.contains("svnic;svnic"), "{text}");
    }
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

/// A daemon named `name` with two guests (MAC1 and MAC2), and a scratch directory.
fn two_guests(name: &str) -> (DaemonFixture, ScratchDir) {
    let d = DaemonFixture::start(name, &[(MAC1, ""), (MAC2, "")], EngineOverrides::default());
    (d, ScratchDir::new(name).unwrap())
}

#[test]
fn fi_pingpong_survivor_of_a_killed_peer_gets_an_error_not_a_hang() {
    let (d, scratch) = two_guests("fi-kill");
    // 16 B goes by fi_inject, which has no completion: only the provider's probe of the peer can
    // end the server's wait for the next message.
    let args = ["-p", "svnic", "-e", "dgram", "-S", "16", "-I", "100000000"];
    let moved = || -> u64 {
        d.daemon()
            .engine()
            .worker_stats()
            .iter()
            .map(|w| w.counts.messages)
            .sum()
    };
    check_survivor_of_a_killed_client(
        (&d.sock(1), &d.sock(2)),
        &args,
        scratch.path(),
        moved,
        "dgram",
    );
}

#[test]
fn fi_pingpong_dgram_between_two_guests_every_size_to_64k_verified() {
    let (d, scratch) = two_guests("fi-pingpong");
    let iterations = "20";
    let common = [
        "-p", "svnic", "-e", "dgram", "-S", "all", "-c", "-I", iterations,
    ];

    let outputs = run_pingpong((&d.sock(1), &d.sock(2)), &[], &common, scratch.path(), LONG);

    // Both sides ran every size of `-S all` up to max_msg_size (64 KiB), each with every
    // iteration sent and acknowledged (fi_pingpong checks each payload with -c and exits
    // non-zero on a mismatch).
    let n: u64 = iterations.parse().unwrap();
    for (who, out) in &outputs {
        assert_eq!(
            acked_sizes(who, out, n),
            all_sizes(64 << 10),
            "{who}:\n{out}"
        );
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
