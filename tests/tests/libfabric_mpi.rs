//! Programs nobody here wrote, over svnic through its libfabric provider: Open MPI 4.1's OFI MTL
//! (`--mca pml cm --mca mtl ofi`, FI_PROVIDER=svnic, reliable delivery by libfabric's ofi_rxd
//! over the provider's DGRAM endpoints) running NetPIPE (netpipe-openmpi) and the project's
//! collectives program, and fi_pingpong's RDM endpoint; every process attaches as its own guest
//! of a pool (`svnic serve --pool`), with no line of configuration of its own.
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use svnic_tests::daemon_proc::ScratchDir;
use svnic_tests::libfabric::{acked_sizes, fi_tool, run, run_pingpong, signal, start_pingpong};
use svnic_tests::pool_fixture::PoolFixture;

const LONG: Duration = Duration::from_secs(180);

/// `mpirun` of `np` ranks of `program` on this host over the provider, attaching through `pool`'s
/// socket; the MTL is forced to OFI (and the OFI BTL kept out) so that no byte between ranks can
/// take another way.
fn mpirun(pool: &PoolFixture, np: u32, program: &[&str]) -> Command {
    let mut c = fi_tool("mpirun", Some(pool.socket()));
    c.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
    ])
    .args(["-np", &np.to_string()])
    .args([
        "-x",
        "FI_PROVIDER_PATH",
        "-x",
        "FI_PROVIDER",
        "-x",
        "FI_SVNIC_SOCKET",
    ])
    .args(["-x", "FI_SVNIC_LOG"])
    .args(["--mca", "pml", "cm", "--mca", "mtl", "ofi"])
    .args(["--mca", "mtl_ofi_provider_include", "svnic;ofi_rxd"])
    .args(["--mca", "btl", "self"])
    .args(program);
    c
}

/// Messages the engine has taken from TX rings so far.
fn engine_messages(pool: &PoolFixture) -> u64 {
    pool.engine().workers.iter().map(|w| w.messages).sum()
}

/// Waits until every member has left the pool; the number of members it accepted.
fn accepted_once_empty(pool: &PoolFixture) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let view = pool.pool();
        if view.live == 0 {
            return view.accepted;
        }
        assert!(Instant::now() < deadline, "members left behind: {view:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn mpi_allreduce_and_alltoall_over_four_ranks_of_a_pool() {
    let pool = PoolFixture::start("fi-mpi-coll", 8, "");
    let scratch = ScratchDir::new("fi-mpi-coll").unwrap();
    let src = scratch.path().join("mpi_collectives.c");
    let exe = scratch.path().join("mpi_collectives");
    std::fs::write(&src, include_str!("../programs/mpi_collectives.c")).unwrap();
    let mut cc = Command::new("mpicc");
    cc.arg("-Wall").arg("-Werror").arg("-o").arg(&exe).arg(&src);
    let (ok, text) = run(cc);
    assert!(
        ok,
        "mpicc (scripts/setup.sh installs libopenmpi-dev):\n{text}"
    );

    let before = engine_messages(&pool);
    let (ok, text) = run(mpirun(&pool, 4, &[exe.to_str().unwrap()]));
    assert!(ok, "{text}");
    let mut ranks: Vec<&str> = text.lines().filter(|l| l.starts_with("rank ")).collect();
    ranks.sort_unstable();
    assert_eq!(
        ranks,
        (0..4)
            .map(|r| format!("rank {r}: allreduce 10 alltoall ok"))
            .collect::<Vec<_>>(),
        "{text}"
    );
    assert_eq!(
        accepted_once_empty(&pool),
        4,
        "each rank is a guest of the pool"
    );
    let moved = engine_messages(&pool) - before;
    assert!(
        moved >= 4 * 3,
        "only {moved} messages through the engine:\n{text}"
    );
}

#[test]
fn netpipe_between_two_ranks_up_to_64k() {
    let pool = PoolFixture::start("fi-mpi-netpipe", 8, "");
    let scratch = ScratchDir::new("fi-mpi-netpipe").unwrap();
    let out = scratch.path().join("np.out");
    let before = engine_messages(&pool);
    let (ok, text) = run(mpirun(
        &pool,
        2,
        &[
            "NPopenmpi",
            "-u",
            "65536",
            "-n",
            "10",
            "-o",
            out.to_str().unwrap(),
        ],
    ));
    assert!(
        ok,
        "NPopenmpi (scripts/setup.sh installs netpipe-openmpi):\n{text}"
    );
    // Its result file: one "bytes Mbps usec" line per size, the last one the largest.
    let results = std::fs::read_to_string(&out).unwrap();
    let sizes: Vec<u64> = results
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert!(sizes.len() > 20, "{results}\n{text}");
    assert!(sizes.contains(&1) && sizes.contains(&65536), "{results}");
    assert!(sizes.iter().all(|s| *s <= 65539), "{results}");
    assert_eq!(accepted_once_empty(&pool), 2);
    assert!(engine_messages(&pool) - before >= 2 * sizes.len() as u64);
}

#[test]
fn fi_pingpong_rdm_through_ofi_rxd_between_two_pool_members_1b_to_64k_verified() {
    let pool = PoolFixture::start("fi-rdm", 8, "");
    let scratch = ScratchDir::new("fi-rdm").unwrap();
    let iterations = 10;
    let sockets = (pool.socket(), pool.socket());
    // One run per size: `-S all` would go on to fi_pingpong's own limit (rxd leaves
    // max_msg_size unbounded), megabytes that take minutes through rxd's 4 KiB packets here.
    let sizes = [1u64, 64, 1024, 4096, 65536];
    for size in sizes {
        let size_arg = size.to_string();
        let args = [
            "-p", "svnic", "-e", "rdm", "-S", &size_arg, "-c", "-I", "10",
        ];
        let dir = scratch.path().join(&size_arg);
        std::fs::create_dir(&dir).unwrap();
        for (who, out) in run_pingpong(sockets, &args, &dir, LONG) {
            assert_eq!(acked_sizes(who, &out, iterations), [size], "{who}:\n{out}");
        }
    }
    assert_eq!(accepted_once_empty(&pool), 2 * sizes.len() as u64);
}

/// At most how long ofi_rxd (libfabric 1.17, prov/rxd) would keep retransmitting to a silent
/// peer before failing the sends to it with `FI_ECONNREFUSED`: 51 retransmissions, the n-th after
/// `min(2^n, 4000)` ms (rxd_get_timeout, RXD_MAX_PKT_RETRY 50), about 160 s (112 s where the
/// 31st does not stall, as the overflow makes it wait 1 ms and the next ones 2^(n-32) ms).
const RXD_GIVES_UP: Duration = Duration::from_millis(4095 + 39 * 4000);

/// The survivor of a killed peer under `-e rdm` (ofi_rxd over the DGRAM core) does not end: rxd
/// 1.17 tells its user of a dead peer only by failing sends the peer never acknowledged, after
/// 51 retransmissions, but its 31st retransmission waits until `timestamp + (1 << 31)` in C
/// `int` arithmetic, a wrapped time that never comes on a machine up for less than 24.8 days, so
/// it stops retransmitting some 80 s after the kill and waits for ever; a survivor waiting in a
/// receive waits for ever by design (rxd has no keepalive, and only logs the core's error
/// completions). docs/libfabric.md has the details. Run with `--ignored` to see it; it passes
/// once the RDM path reports dead peers.
#[test]
#[ignore = "ofi_rxd 1.17 never fails an operation for a dead peer (docs/libfabric.md)"]
fn fi_pingpong_rdm_survivor_of_a_killed_peer_gets_an_error_not_a_hang() {
    let pool = PoolFixture::start("fi-rdm-kill", 8, "");
    let scratch = ScratchDir::new("fi-rdm-kill").unwrap();
    let (server_log, client_log) = (
        scratch.path().join("server.log"),
        scratch.path().join("client.log"),
    );
    // 4 KiB is over rxd's inject_size (3880 here): each pong is an fi_tsend whose completion the
    // server waits for on its TX CQ, and rxd completes it only once the client acknowledged it.
    let args = ["-p", "svnic", "-e", "rdm", "-S", "4096", "-I", "100000000"];
    let (mut server, mut client) = start_pingpong(
        (pool.socket(), pool.socket()),
        &args,
        &server_log,
        &client_log,
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while engine_messages(&pool) < 1000 {
        assert!(Instant::now() < deadline, "no traffic through the engine");
        assert!(
            client.0.try_wait().unwrap().is_none(),
            "the client ended early:\n{}",
            std::fs::read_to_string(&client_log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The client dies while the server waits for a pong's acknowledgement (the one case where
    // rxd could fail an operation): stop the client, and kill it if the server goes on
    // retransmitting (rxd's retries at 1, 2, 4 .. 512 ms), else let it run on and try again.
    let mut attempts = 0;
    loop {
        attempts += 1;
        assert!(
            attempts <= 50,
            "the server never waited for an acknowledgement"
        );
        signal(&client, "STOP");
        std::thread::sleep(Duration::from_millis(300));
        let before = engine_messages(&pool);
        std::thread::sleep(Duration::from_millis(800));
        if engine_messages(&pool) > before {
            break;
        }
        signal(&client, "CONT");
        std::thread::sleep(Duration::from_millis(20 + 7 * attempts));
    }
    client.0.kill().unwrap();
    client.0.wait().unwrap();
    let killed = Instant::now();
    let status = server
        .wait_until(killed + RXD_GIVES_UP + Duration::from_secs(30))
        .unwrap();
    let out = std::fs::read_to_string(&server_log).unwrap();
    let status = status.unwrap_or_else(|| {
        panic!(
            "the server still waits {:?} after its peer died:\n{out}",
            killed.elapsed()
        )
    });
    assert_eq!(status.code(), Some(111), "exit -FI_ECONNREFUSED:\n{out}");
    assert!(out.contains("cq_readerr"), "{out}");
    assert_eq!(accepted_once_empty(&pool), 2);
}
