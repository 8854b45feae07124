#!/usr/bin/env bash
# Measures the kvm-ioctls micro-VM's three data paths (issue 17, "Measured"; docs/vm.md and
# docs/performance.md): round trip (median, p99) and round trips per second of user-data between
# the micro-VM's guest program and an echo, on the bypass path, with a doorbell per message
# (ioeventfd) and VMM-mediated (an exit to the VMM per message and per reply), next to the
# host-process bypass (the same echo, a host thread in place of the vCPU) and the cache-line floor
# (two host threads handing one word back and forth), all in ONE run of `svnic-microvm bench`,
# which alternates them round by round, with KVM's exits per message for the micro-VM rows.
# Targets (issue 17): bypass round trip within 1.2x of the host-process bypass, and at least 10x
# below the VMM-mediated path.
#
# The peer: "self" (default) sends every message to the sender's own channel, so a round trip is
# sender -> engine -> sender and only two threads poll (the engine worker and the sender), one
# per CPU; "echo" is `svnic-microvm echo` in a process of its own, a third polling thread that
# on 2 CPUs shares one with the engine or with the sender (--echo-cpu), so that the scheduler,
# not the data path, sets the round trip.
#
# Placement (2 CPUs): `svnic serve` with --pin-workers (its one worker on CPU 0) and taskset to
# CPU 0; the bench (the micro-VM's vCPU thread, or the host thread, and the VMM's relay thread) on
# CPU 1; the floor's threads on CPUs 0 and 1; the echo as --echo-cpu says.
#
# Usage: scripts/bench-microvm.sh [--rounds N] [--count N] [--peer self|echo] [--echo-cpu 0|1|free]
#                                 [--echo-yields N] [--no-build]
#   --rounds N        rounds of every row (default 3); the summary shows the median and range
#   --count N         round trips per row and round (default 20000)
#   --peer P          self (default) or echo
#   --echo-cpu C      where the echo runs: 0 (with the engine), 1 (with the client) or free
#                     (default 0)
#   --echo-yields N   idle polls in which the echo yields its CPU before it sleeps until the
#                     engine wakes it (default 1000000000: it yields, never sleeps; the channel
#                     API's default is 200)
#   --no-build        use the release binaries already in target/release
set -euo pipefail

source "$(dirname "$0")/lib/bench-common.sh"
rounds=3
count=20000
peer=self
echo_cpu=0
echo_yields=1000000000
bench_option() {
    case "$1" in
        --count) bench_value count "$@" ;;
        --peer) bench_value peer "$@" ;;
        --echo-cpu) bench_value echo_cpu "$@" ;;
        --echo-yields) bench_value echo_yields "$@" ;;
        *) return 1 ;;
    esac
}
bench_args "$@"
case "$peer" in
    self|echo) ;;
    *) echo "--peer must be self or echo" >&2; exit 64 ;;
esac
case "$echo_cpu" in
    0|1|free) ;;
    *) echo "--echo-cpu must be 0, 1 or free" >&2; exit 64 ;;
esac

work=$(mktemp -d /tmp/svnic-bench-microvm.XXXXXX)
pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# Exits with $1 and the end of log $2.
fail_with_log() {
    echo "$1; the end of $2:" >&2
    tail -n 20 "$2" >&2 || true
    exit 1
}

if [ "$build" = 1 ]; then
    cargo build --release -p svnic -p svnic-microvm
fi
svnic=$target/release/svnic
microvm=$target/release/svnic-microvm

vm_mac=52:54:00:4b:03:01
echo_mac=52:54:00:4b:03:02
echo_ep=1
vm_ep=1
"$microvm" detect || { echo "no natively running KVM user mode here: nothing to measure" >&2; exit 2; }

taskset -c 0 "$svnic" serve --pin-workers --admin-socket "$work/admin.sock" \
    --guest "name=vm,socket=$work/vm.sock,mac=$vm_mac" \
    --guest "name=echo,socket=$work/echo.sock,mac=$echo_mac" >"$work/serve.log" 2>&1 &
pids+=($!)
sockets_up() { [ -S "$work/vm.sock" ] && [ -S "$work/echo.sock" ]; }
for _ in $(seq 100); do
    sockets_up && break
    sleep 0.05
done
sockets_up || fail_with_log "svnic serve did not open its guest sockets within 5 s" "$work/serve.log"

if [ "$peer" = echo ]; then
    # The echo answers every round trip of the micro-VM's three rows and the host-process row.
    echo_count=$((rounds * 4 * count))
    if [ "$echo_cpu" = free ]; then
        echo_cmd=("$microvm")
    else
        echo_cmd=(taskset -c "$echo_cpu" "$microvm")
    fi
    "${echo_cmd[@]}" echo --socket "$work/echo.sock" --endpoint "$echo_ep" \
        --count "$echo_count" --timeout-secs 60 --yields "$echo_yields" >"$work/echo.log" 2>&1 &
    pids+=($!)
    echo_up() { grep -q ready "$work/echo.log" 2>/dev/null; }
    for _ in $(seq 100); do
        echo_up && break
        sleep 0.05
    done
    echo_up || fail_with_log "the echo was not ready within 5 s" "$work/echo.log"
    to=$echo_mac/$echo_ep
    where="echo CPU $echo_cpu, yielding $echo_yields polls before sleeping"
else
    to=$vm_mac/$vm_ep
    where="peer: the sender's own channel (no echo)"
fi

echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo ' (with local changes)'), $(date -u +%F), $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
echo "placement: engine worker CPU 0 (svnic serve --pin-workers, taskset 0); vCPU / host client CPU 1; $where; floor threads CPUs 0 and 1"
taskset -c 1 "$microvm" bench --socket "$work/vm.sock" --endpoint "$vm_ep" --peer "$to" \
    --rounds "$rounds" --count "$count" --memory-mib 64 --timeout-secs 60 --floor-cpus 0,1
