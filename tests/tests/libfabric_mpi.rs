//! Programs nobody here wrote, over svnic through its libfabric provider: Open MPI 4.1's OFI MTL
//! (`--mca pml cm --mca mtl ofi`, FI_PROVIDER=svnic) running NetPIPE (netpipe-openmpi) and the
//! project's collectives program, and fi_pingpong's RDM endpoint, each over the provider's native
//! RDM endpoint and over libfabric's ofi_rxd layered on its DGRAM endpoints (`svnic;ofi_rxd`,
//! offered with FI_SVNIC_RXD=1); every process attaches as its own guest of a pool (`svnic serve
//! --pool`), with no line of configuration of its own.
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use svnic_tests::daemon_proc::ScratchDir;
use svnic_tests::libfabric::{
    acked_sizes, check_survivor_of_a_killed_client, fi_tool, run, run_pingpong,
};
use svnic_tests::pool_fixture::PoolFixture;

const LONG: Duration = Duration::from_secs(180);

/// The two RDM paths: the provider's native endpoint, and ofi_rxd over its DGRAM endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rdm {
    Native,
    Rxd,
}

impl Rdm {
    /// The provider name applications ask for.
    fn provider(self) -> &'static str {
        match self {
            Rdm::Native => "svnic",
            Rdm::Rxd => "svnic;ofi_rxd",
        }
    }

    /// The environment of its processes.
    fn env(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Rdm::Native => &[("FI_SVNIC_RXD", "0"), ("FI_SVNIC_LOG", "info")],
            Rdm::Rxd => &[("FI_SVNIC_RXD", "1"), ("FI_SVNIC_LOG", "info")],
        }
    }

    /// Checks in a run's output (the provider's log at info level) that every endpoint the
    /// processes opened was of this path: RDM endpoints natively, DGRAM ones under rxd.
    fn check_endpoints(self, text: &str, processes: usize) {
        let count = |kind: &str| {
            text.matches(&format!("svnic provider: {kind} endpoint"))
                .count()
        };
        let (mine, other) = match self {
            Rdm::Native => (count("RDM"), count("DGRAM")),
            Rdm::Rxd => (count("DGRAM"), count("RDM")),
        };
        assert!(
            mine >= processes && other == 0,
            "{self:?}: {mine} endpoints of this path, {other} of the other:\n{text}"
        );
    }
}

/// `mpirun` of `np` ranks of `program` on this host over the provider's `rdm` path, attaching
/// through `pool`'s socket; the MTL is forced to OFI (and the OFI BTL kept out) so that no byte
/// between ranks can take another way.
fn mpirun(pool: &PoolFixture, rdm: Rdm, np: u32, program: &[&str]) -> Command {
    let mut c = fi_tool("mpirun", Some(pool.socket()));
    c.envs(rdm.env().iter().copied());
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
    .args(["-x", "FI_SVNIC_LOG", "-x", "FI_SVNIC_RXD"])
    .args(["--mca", "pml", "cm", "--mca", "mtl", "ofi"])
    .args(["--mca", "mtl_ofi_provider_include", rdm.provider()])
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

    for rdm in [Rdm::Native, Rdm::Rxd] {
        let pool = PoolFixture::start("fi-mpi-coll", 8, "");
        let before = engine_messages(&pool);
        let (ok, text) = run(mpirun(&pool, rdm, 4, &[exe.to_str().unwrap()]));
        assert!(ok, "{rdm:?}: {text}");
        let mut ranks: Vec<&str> = text.lines().filter(|l| l.starts_with("rank ")).collect();
        ranks.sort_unstable();
        assert_eq!(
            ranks,
            (0..4)
                .map(|r| format!("rank {r}: allreduce 10 alltoall ok"))
                .collect::<Vec<_>>(),
            "{rdm:?}: {text}"
        );
        rdm.check_endpoints(&text, 4);
        assert_eq!(
            accepted_once_empty(&pool),
            4,
            "each rank is a guest of the pool"
        );
        let moved = engine_messages(&pool) - before;
        assert!(
            moved >= 4 * 3,
            "{rdm:?}: only {moved} messages through the engine:\n{text}"
        );
    }
}

#[test]
fn netpipe_between_two_ranks_up_to_64k() {
    for rdm in [Rdm::Native, Rdm::Rxd] {
        netpipe(rdm);
    }
}

/// NPopenmpi up to 64 KiB (and 3 bytes: NetPIPE's perturbation) over `rdm`.
fn netpipe(rdm: Rdm) {
    let pool = PoolFixture::start("fi-mpi-netpipe", 8, "");
    let scratch = ScratchDir::new("fi-mpi-netpipe").unwrap();
    let out = scratch.path().join("np.out");
    let before = engine_messages(&pool);
    let args = [
        "NPopenmpi",
        "-u",
        "65536",
        "-n",
        "10",
        "-o",
        out.to_str().unwrap(),
    ];
    let (ok, text) = run(mpirun(&pool, rdm, 2, &args));
    assert!(
        ok,
        "{rdm:?}: NPopenmpi (scripts/setup.sh installs netpipe-openmpi):\n{text}"
    );
    rdm.check_endpoints(&text, 2);
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
fn fi_pingpong_rdm_native_and_through_ofi_rxd_between_two_pool_members_1b_to_64k_verified() {
    for rdm in [Rdm::Native, Rdm::Rxd] {
        let pool = PoolFixture::start("fi-rdm", 8, "");
        let scratch = ScratchDir::new("fi-rdm").unwrap();
        let iterations = 10;
        let sockets = (pool.socket(), pool.socket());
        // One run per size: `-S all` would go on to fi_pingpong's own limit under rxd (which
        // leaves max_msg_size unbounded), megabytes that take minutes through its 4 KiB packets.
        // Natively also the largest message, in 8 parts of 64 KiB.
        let sizes: &[u64] = match rdm {
            Rdm::Native => &[1, 64, 1024, 4096, 65536, 524288],
            Rdm::Rxd => &[1, 64, 1024, 4096, 65536],
        };
        for &size in sizes {
            let size_arg = size.to_string();
            let args = [
                "-p",
                rdm.provider(),
                "-e",
                "rdm",
                "-S",
                &size_arg,
                "-c",
                "-I",
                "10",
            ];
            let dir = scratch.path().join(&size_arg);
            std::fs::create_dir(&dir).unwrap();
            for (who, out) in run_pingpong(sockets, rdm.env(), &args, &dir, LONG) {
                assert_eq!(
                    acked_sizes(who, &out, iterations),
                    [size],
                    "{rdm:?} {who}:\n{out}"
                );
                rdm.check_endpoints(&out, 1);
            }
        }
        assert_eq!(accepted_once_empty(&pool), 2 * sizes.len() as u64);
    }
}

/// The survivor of a killed peer under `-e rdm` on the native RDM endpoint ends with an error:
/// a send to the dead peer completes in error, and a receive waiting for it fails once the
/// endpoint's probe of its peers (after `FI_SVNIC_PEER_TIMEOUT_MS`) finds it gone. Both sizes
/// are run: 16 B goes by fi_inject (no completion to fail), 4 KiB by fi_send. (Under ofi_rxd
/// 1.17 the survivor waits for ever: docs/libfabric.md, "Killed peers".)
#[test]
fn fi_pingpong_rdm_survivor_of_a_killed_peer_gets_an_error_not_a_hang() {
    for size in ["16", "4096"] {
        let pool = PoolFixture::start("fi-rdm-kill", 8, "");
        let scratch = ScratchDir::new("fi-rdm-kill").unwrap();
        let args = ["-p", "svnic", "-e", "rdm", "-S", size, "-I", "100000000"];
        check_survivor_of_a_killed_client(
            (pool.socket(), pool.socket()),
            &args,
            scratch.path(),
            || engine_messages(&pool),
            &format!("{size} B"),
        );
        assert_eq!(accepted_once_empty(&pool), 2);
    }
}
