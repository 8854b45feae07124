#!/usr/bin/env bash
# Measures the svnic libfabric provider against libfabric's shm, udp and tcp providers and Open
# MPI's shared memory, side by side in one run (issue 15, "Measured"; docs/performance.md):
#   - fi_pingpong one-way latency (usec/xfer) at 64 B and 4 KiB and bandwidth (MB/s) at 64 KiB;
#   - NPopenmpi between 2 ranks: latency at 1 B and 64 B, bandwidth at 64 KiB;
# under three placements: "pinned" (the svnic engine on CPU 0, both processes on CPU 1, taskset),
# "split" (one process on each CPU, the engine not pinned: what a user of udp or shm would do)
# and "free" (nothing pinned). Within a placement the providers of one measure run one after
# the other, in an order that alternates from round to round, so that they see the same host.
# Targets (issue 15): svnic's 64 KiB bandwidth at least 2x udp's, its 64 B latency at most udp's.
#
# Usage: scripts/bench-libfabric.sh [--rounds N] [--no-build] [--no-mpi]
#   --rounds N   runs of every row per placement (default 2); the table shows the median
#   --no-build   use the release svnic and provider already in target/release
#   --no-mpi     skip NetPIPE
#
# Endpoint types: fi_pingpong's shm provider offers only rdm, tcp only msg (and rdm through
# ofi_rxm), udp only dgram with a max_msg_size below 4 KiB. So the rows are: svnic dgram,
# svnic rdm (the native RDM endpoint), shm rdm, tcp msg at every size; udp dgram at 64 B; and
# the RDM pair svnic;ofi_rxd (FI_SVNIC_RXD=1) and udp;ofi_rxd at every size (the svnic/udp
# ratios compare native svnic rdm and svnic;ofi_rxd with udp;ofi_rxd, and dgram with dgram).
# NetPIPE runs over native svnic, svnic;ofi_rxd, vader and udp;ofi_rxd.
# Every run has a timeout (a lost datagram leaves a dgram pingpong waiting forever); a run that
# fails or times out is shown as FAIL(status) and never enters a median.
set -euo pipefail

source "$(dirname "$0")/lib/bench-common.sh"
rounds=2
mpi=1
bench_option() {
    case "$1" in
        --no-mpi) mpi=0; bench_took=1 ;;
        *) return 1 ;;
    esac
}
bench_args "$@"

work=$(mktemp -d /tmp/svnic-bench-fi.XXXXXX)
sock=$work/pool.sock
daemon_pid=
# Every background process of a run, killed by the trap if the script stops half way.
bg_pids=()

# Kills a process and everything under it (children first stop being reaped by it).
kill_tree() {
    local child
    for child in $(pgrep -P "$1" 2>/dev/null); do
        kill_tree "$child"
    done
    kill "$1" 2>/dev/null || true
}

cleanup() {
    local pid
    for pid in $(pgrep -P $$ 2>/dev/null) "${bg_pids[@]}" $daemon_pid; do
        kill_tree "$pid"
    done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$build" = 1 ]; then
    nice -n 10 cargo build -q --release -p svnic
    nice -n 10 scripts/install-libfabric-provider.sh --release "$work/prov" >/dev/null
else
    mkdir -p "$work/prov"
    cp "$target/release/libsvnic_fi.so" "$work/prov/libsvnic-fi.so"
fi
svnic=$target/release/svnic
export FI_PROVIDER_PATH=$work/prov

mpi_root=()
[ "$(id -u)" = 0 ] && mpi_root=(--allow-run-as-root)

# The taskset prefix of a placement's engine, first process (server, rank 0) and second.
pin_of() { # placement role
    case "$1:$2" in
        pinned:engine) echo "taskset -c 0" ;;
        pinned:*) echo "taskset -c 1" ;;
        split:first) echo "taskset -c 0" ;;
        split:second) echo "taskset -c 1" ;;
    esac
}

start_daemon() { # $1: placement
    local pin
    read -ra pin <<<"$(pin_of "$1" engine)"
    rm -f "$sock"
    "${pin[@]}" "$svnic" serve --pool "name=bench,socket=$sock,macs=52:54:00:10:00:00/24,max=64" \
        >"$work/daemon.log" 2>&1 &
    daemon_pid=$!
    for _ in $(seq 100); do
        [ -S "$sock" ] && return 0
        sleep 0.05
    done
    echo "svnic serve did not create $sock:" >&2
    cat "$work/daemon.log" >&2
    exit 1
}

stop_daemon() {
    kill "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
    daemon_pid=
}

# One fi_pingpong run; prints "usec MBps" or "FAIL(reason)".
pingpong() { # placement provider ep size iterations port
    local placement=$1 prov=$2 ep=$3 size=$4 iters=$5 port=$6 pin1 pin2 env=() rc_s rc_c
    read -ra pin1 <<<"$(pin_of "$placement" first)"
    read -ra pin2 <<<"$(pin_of "$placement" second)"
    case "$prov" in
        "svnic;ofi_rxd") env=(env "FI_SVNIC_SOCKET=$sock" FI_SVNIC_RXD=1) ;;
        svnic) env=(env "FI_SVNIC_SOCKET=$sock") ;;
        *) env=(env) ;;
    esac
    local args=(-p "$prov" -e "$ep" -S "$size" -I "$iters")
    "${env[@]}" timeout 60 "${pin1[@]}" fi_pingpong "${args[@]}" -B "$port" >"$work/srv.out" 2>&1 &
    local srv=$!
    bg_pids+=("$srv")
    sleep 0.3
    rc_c=0
    "${env[@]}" timeout 60 "${pin2[@]}" fi_pingpong "${args[@]}" -P "$port" 127.0.0.1 \
        >"$work/cli.out" 2>&1 || rc_c=$?
    rc_s=0
    wait "$srv" || rc_s=$?
    unset 'bg_pids[-1]'
    if [ "$rc_c" != 0 ] || [ "$rc_s" != 0 ]; then
        local why=exit
        { [ "$rc_c" = 124 ] || [ "$rc_s" = 124 ]; } && why=timeout
        echo "FAIL($why:$rc_c/$rc_s)"
        return
    fi
    awk -v s="$size" 'NR > 1 && $6 ~ /^[0-9.]+$/ { r = $7 " " $6 } END { print (r ? r : "FAIL(no-output)") }' \
        "$work/cli.out"
}

# One NPopenmpi run; prints "lat1_us lat64_us MBps64k" or "FAIL(reason)".
netpipe() { # placement kind
    local placement=$1 kind=$2 pin=() mca=() env=() rc=0
    # Two ranks polling on one CPU only progress when the scheduler preempts one: on that
    # placement the ranks yield when idle, as Open MPI does by itself when oversubscribed.
    # On "split" mpirun binds rank 0 to CPU 0 and rank 1 to CPU 1.
    local bind=(--bind-to none)
    case "$placement" in
        pinned) pin=(taskset -c 1); mca=(--mca mpi_yield_when_idle 1) ;;
        split) bind=(--bind-to core --map-by core) ;;
    esac
    case "$kind" in
        svnic) env=(-x FI_PROVIDER_PATH -x FI_PROVIDER=svnic -x "FI_SVNIC_SOCKET=$sock")
               mca+=(--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include svnic --mca btl self) ;;
        svnic-rxd) env=(-x FI_PROVIDER_PATH -x FI_PROVIDER=svnic -x "FI_SVNIC_SOCKET=$sock" -x FI_SVNIC_RXD=1)
               mca+=(--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include 'svnic;ofi_rxd' --mca btl self) ;;
        udp)   env=(-x FI_PROVIDER=udp)
               mca+=(--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include 'udp;ofi_rxd' --mca btl self) ;;
        vader) mca+=(--mca pml ob1 --mca btl self,vader) ;;
    esac
    rm -f "$work/np.out"
    timeout 120 "${pin[@]}" mpirun "${mpi_root[@]}" "${bind[@]}" -np 2 "${env[@]}" "${mca[@]}" \
        NPopenmpi -l 1 -u 65536 -p 0 -o "$work/np.out" >"$work/np.log" 2>&1 || rc=$?
    if [ "$rc" != 0 ] || [ ! -s "$work/np.out" ]; then
        [ "$rc" = 124 ] && echo "FAIL(timeout)" || echo "FAIL(exit:$rc)"
        return
    fi
    # np.out: size, Mbps, seconds per one-way transfer.
    awk '$1 == 1 { l1 = $3 * 1e6 } $1 == 64 { l64 = $3 * 1e6 } $1 == 65536 { bw = $2 / 8 }
         END { if (l1 && bw) printf "%.2f %.2f %.1f\n", l1, l64, bw; else print "FAIL(no-output)" }' \
        "$work/np.out"
}

results=$work/results.txt
: >"$results"
record() { # placement measure provider value
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$results"
    printf '  %-7s %-14s %-22s %s\n' "$1" "$2" "$3" "$4" >&2
}

# size iterations providers ("provider:ep" ...). The iterations are divided by 20 on the pinned
# placement: fi_pingpong polls without yielding, so its two processes on one CPU take turns only
# when the scheduler preempts one (milliseconds per message; svnic's CQ yields, libfabric's
# shm, udp and tcp providers do not).
MEASURES=(
    "64 20000 svnic:dgram svnic:rdm udp:dgram shm:rdm tcp:msg svnic;ofi_rxd:rdm udp;ofi_rxd:rdm"
    "4096 10000 svnic:dgram svnic:rdm shm:rdm tcp:msg svnic;ofi_rxd:rdm udp;ofi_rxd:rdm"
    "65536 2000 svnic:dgram svnic:rdm shm:rdm tcp:msg svnic;ofi_rxd:rdm udp;ofi_rxd:rdm"
)

port=47800
for placement in pinned split free; do
    start_daemon "$placement"
    echo "placement $placement" >&2
    for round in $(seq "$rounds"); do
        for m in "${MEASURES[@]}"; do
            read -r size iters provs <<<"$m"
            read -ra list <<<"$provs"
            # Alternate the order from round to round.
            if [ $((round % 2)) = 0 ]; then
                rev=()
                for ((i = ${#list[@]} - 1; i >= 0; i--)); do rev+=("${list[i]}"); done
                list=("${rev[@]}")
            fi
            n=$iters
            [ "$placement" = pinned ] && n=$((iters / 20))
            for pe in "${list[@]}"; do
                prov=${pe%:*} ep=${pe##*:}
                port=$((port + 1))
                v=$(pingpong "$placement" "$prov" "$ep" "$size" "$n" "$port")
                record "$placement" "pp-$size" "$prov/$ep" "$v"
            done
        done
        if [ "$mpi" = 1 ]; then
            kinds=(svnic svnic-rxd vader udp)
            [ $((round % 2)) = 0 ] && kinds=(udp vader svnic-rxd svnic)
            for k in "${kinds[@]}"; do
                record "$placement" netpipe "$k" "$(netpipe "$placement" "$k")"
            done
        fi
    done
    stop_daemon
done

echo
echo "machine: $(nproc) CPUs, $(uname -r); commit $(git rev-parse --short HEAD); $(date -u +%F\ %H:%M) UTC"
echo "placements: pinned = svnic serve (the engine) taskset to CPU 0, both processes (fi_pingpong"
echo "  server and client, or both MPI ranks) taskset to CPU 1; split = server / rank 0 on CPU 0,"
echo "  client / rank 1 on CPU 1 (mpirun --bind-to core), engine not pinned; free = nothing pinned."
echo "fi_pingpong: usec = one-way latency (usec/xfer), MB/s = its MB/sec; NetPIPE: one-way us, MB/s."
echo "median of $rounds rounds; FAIL rows are listed with every run."
RESULTS=$results python3 - <<'PY'
import os, statistics
rows = {}
for line in open(os.environ["RESULTS"]):
    placement, measure, prov, value = line.rstrip("\n").split("\t")
    rows.setdefault((placement, measure, prov), []).append(value)

def med(vals, i):
    ok = [float(v.split()[i]) for v in vals if not v.startswith("FAIL")]
    return statistics.median(ok) if ok else None

def cell(vals, i):
    m = med(vals, i)
    fails = [v for v in vals if v.startswith("FAIL")]
    s = "-" if m is None else f"{m:.2f}"
    return s + (f" ({len(fails)} of {len(vals)} {fails[0]})" if fails else "")

print(f"\n{'placement':9} {'measure':28} {'provider':20} {'result':30} runs")
table = {}
for (placement, measure, prov), vals in rows.items():
    if measure.startswith("pp-"):
        size = int(measure[3:])
        if size == 65536:
            what, i, unit = "bandwidth 64 KiB", 1, "MB/s"
        else:
            what, i, unit = f"latency {size} B", 0, "us"
        table[(placement, what, prov)] = med(vals, i)
        print(f"{placement:9} {'fi_pingpong ' + what:28} {prov:20} {cell(vals, i) + ' ' + unit:30} "
              + " | ".join(vals))
    else:
        for i, what, unit in [(0, "latency 1 B", "us"), (1, "latency 64 B", "us"),
                              (2, "bandwidth 64 KiB", "MB/s")]:
            table[(placement, "np " + what, prov)] = med(vals, i)
            print(f"{placement:9} {'NetPIPE ' + what:28} {prov:20} {cell(vals, i) + ' ' + unit:30} "
                  + " | ".join(v.split()[i] if not v.startswith("FAIL") else v for v in vals))

print("\nratios svnic / udp (targets: bandwidth >= 2.00, latency <= 1.00)")
PLACEMENTS = ["pinned", "split", "free"]
def best(placement, what, prov, higher):
    if placement != "best":
        return table.get((placement, what, prov))
    vals = [v for p in PLACEMENTS if (v := table.get((p, what, prov))) is not None]
    return (max(vals) if higher else min(vals)) if vals else None
def ratio(placement, what, a, b, target, higher):
    x, y = best(placement, what, a, higher), best(placement, what, b, higher)
    if x is None or y is None:
        print(f"  {placement:7} {what:24} {a} / {b}: -")
        return
    r = x / y
    ok = r >= target if higher else r <= target
    print(f"  {placement:7} {what:24} {a} / {b}: {r:5.2f}  {'ok' if ok else 'MISSED'}")
# "best": each provider in the placement that suits it best.
for placement in PLACEMENTS + ["best"]:
    ratio(placement, "bandwidth 64 KiB", "svnic/rdm", "udp;ofi_rxd/rdm", 2.0, True)
    ratio(placement, "bandwidth 64 KiB", "svnic;ofi_rxd/rdm", "udp;ofi_rxd/rdm", 2.0, True)
    ratio(placement, "bandwidth 64 KiB", "svnic/dgram", "udp;ofi_rxd/rdm", 2.0, True)
    ratio(placement, "latency 64 B", "svnic/dgram", "udp/dgram", 1.0, False)
    ratio(placement, "latency 64 B", "svnic/rdm", "udp;ofi_rxd/rdm", 1.0, False)
    ratio(placement, "latency 64 B", "svnic;ofi_rxd/rdm", "udp;ofi_rxd/rdm", 1.0, False)
    ratio(placement, "np bandwidth 64 KiB", "svnic", "udp", 2.0, True)
    ratio(placement, "np bandwidth 64 KiB", "svnic-rxd", "udp", 2.0, True)
    ratio(placement, "np latency 64 B", "svnic", "udp", 1.0, False)
    ratio(placement, "np latency 64 B", "svnic-rxd", "udp", 1.0, False)
PY
