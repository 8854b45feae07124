#!/usr/bin/env bash
# Measures svnic between two "hosts" (network namespaces joined by a veth pair, one
# `svnic serve --uplink` each) next to kernel UDP between the same namespaces, in one run
# (issue 16, "Measured"; docs/performance.md, "The wire"):
#   - round trip: svnic channel user-data (32 B) vs UDP (32 B), p50 and p99 (svnic-guest ping/echo);
#   - 64 B message rate: svnic user-data (a 64-byte message, 32 B payload) vs UDP (64 B payload)
#     (svnic-guest perf/sink, messages/s as received);
#   - bandwidth: svnic DMA-data at 64 KiB and 1 MiB vs UDP with 1472-byte datagrams (the
#     largest that needs no IP fragmentation at MTU 1500; svnic-guest's UDP path stops there);
#   - fi_pingpong -p svnic (dgram) vs -p udp (dgram) vs -p tcp (msg) at 64 B, and svnic vs tcp at
#     64 KiB.
# Within a round the svnic and kernel rows of one measure run back to back, their order
# alternating from round to round. Placement (2 cores, four parties): host A's engine on CPU 0,
# host B's on CPU 1, each yielding its CPU as soon as it is idle (--spin-passes 0); the pinger
# or sender (host A's guest) on CPU 1 and the echo or receiver (host B's guest) on CPU 0, each
# yielding rather than spinning (--spins 0): every party shares its CPU with the other host's
# engine, whose work alternates with its own. The UDP processes run on the same CPUs.
# Targets (issue 16): round trip at most half of UDP's, 64 B message rate at least 5x UDP's.
#
# Usage: scripts/bench-wire.sh [--rounds N] [--no-build]
#   --rounds N   runs of every row (default 3); the table shows the median
#   --no-build   use the release binaries already built
# Needs root (network namespaces). Prints a markdown table.
set -euo pipefail

source "$(dirname "$0")/lib/bench-common.sh"
rounds=3
bench_args "$@"

if [ "$build" = 1 ]; then
    cargo build --release -q -p svnic -p svnic-guest-tools
    scripts/install-libfabric-provider.sh "$target/libfabric-provider" >/dev/null
fi
svnic=$target/release/svnic
guest=$target/release/svnic-guest
provider=$target/libfabric-provider

work=$(mktemp -d /tmp/svnic-bench-wire.XXXXXX)
nsa=svbench-a-$$
nsb=svbench-b-$$
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    ip netns del "$nsa" 2>/dev/null || true
    ip netns del "$nsb" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

ip netns add "$nsa"
ip netns add "$nsb"
ip link add sv0 netns "$nsa" type veth peer name sv0 netns "$nsb"
for ns in "$nsa" "$nsb"; do
    ip -n "$ns" link set lo up
    ip -n "$ns" link set sv0 up
done
ip -n "$nsa" addr add 10.199.0.1/24 dev sv0
ip -n "$nsb" addr add 10.199.0.2/24 dev sv0
mac_a=52:54:00:20:00:01
mac_b=52:54:00:21:00:01

# host NS CPU MAC: svnic serve in namespace NS, its worker pinned to CPU, guest `g` with MAC.
host() {
    local ns=$1 cpu=$2 mac=$3 dir=$work/$1
    mkdir -p "$dir"
    ip netns exec "$ns" taskset -c "$cpu" "$svnic" serve --pin-workers --spin-passes 0 --uplink sv0 \
        --admin-socket "$dir/admin.sock" \
        --guest "name=g,socket=$dir/g.sock,mac=$mac" 2>"$dir/log" &
    pids+=($!)
    for _ in $(seq 100); do [ -S "$dir/g.sock" ] && return 0; sleep 0.1; done
    echo "svnic serve in $ns did not start:" >&2
    cat "$dir/log" >&2
    exit 1
}
host "$nsa" 0 "$mac_a"
host "$nsb" 1 "$mac_b"
sock_a=$work/$nsa/g.sock
sock_b=$work/$nsb/g.sock

json() { python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }

# One measurement: prints the value of FIELD from the client's JSON.
#   svnic_rt / udp_rt / svnic_rate / udp_rate / dma SIZE / udp_bw
measure() {
    local what=$1 size=${2:-0} server client out
    case "$what" in
        svnic_rt)
            server=(taskset -c 0 "$guest" echo --spins 0 --socket "$sock_b" --path user --count 20000)
            client=(taskset -c 1 "$guest" ping --spins 0 --socket "$sock_a" --path user --size 32 --count 20000 --peer "$mac_b/1" --json)
            field=p50_us ;;
        udp_rt)
            server=(ip netns exec "$nsb" taskset -c 0 "$guest" echo --path udp --listen 10.199.0.2:7777 --count 20000)
            client=(ip netns exec "$nsa" taskset -c 1 "$guest" ping --path udp --size 32 --count 20000 --peer 10.199.0.2:7777 --json)
            field=p50_us ;;
        svnic_rate)
            server=(taskset -c 0 "$guest" sink --spins 0 --socket "$sock_b" --path user --count 1000000 --json)
            client=(taskset -c 1 "$guest" perf --spins 0 --socket "$sock_a" --path user --size 32 --count 1000000 --peer "$mac_b/1")
            field=messages_per_sec ;;
        udp_rate)
            server=(ip netns exec "$nsb" taskset -c 0 "$guest" sink --path udp --listen 10.199.0.2:7777 --count 200000 --json)
            client=(ip netns exec "$nsa" taskset -c 1 "$guest" perf --path udp --size 64 --count 200000 --peer 10.199.0.2:7777)
            field=messages_per_sec ;;
        dma)
            local n=$(( size >= 1048576 ? 2000 : 20000 ))
            server=(taskset -c 0 "$guest" sink --spins 0 --socket "$sock_b" --path dma --size "$size" --count "$n" --json)
            client=(taskset -c 1 "$guest" perf --spins 0 --socket "$sock_a" --path dma --size "$size" --count "$n" --peer "$mac_b/1")
            field=bytes_per_sec ;;
        udp_bw)
            server=(ip netns exec "$nsb" taskset -c 0 "$guest" sink --path udp --size 1472 --listen 10.199.0.2:7777 --count 200000 --json)
            client=(ip netns exec "$nsa" taskset -c 1 "$guest" perf --path udp --size 1472 --count 200000 --peer 10.199.0.2:7777)
            field=bytes_per_sec ;;
    esac
    if [[ $what == *_rt ]]; then
        "${server[@]}" >/dev/null 2>"$work/server.err" &
        local spid=$!
        sleep 0.3
        out=$(timeout 120 "${client[@]}" 2>"$work/client.err") || { kill $spid 2>/dev/null; echo FAIL; return; }
        wait $spid 2>/dev/null || true
    else
        "${server[@]}" >"$work/sink.json" 2>"$work/server.err" &
        local spid=$!
        sleep 0.3
        timeout 120 "${client[@]}" >/dev/null 2>"$work/client.err" || true
        if ! timeout 30 tail --pid=$spid -f /dev/null; then kill $spid 2>/dev/null; echo FAIL; return; fi
        out=$(cat "$work/sink.json")
    fi
    echo "$out" | json "$field" 2>/dev/null || echo FAIL
}

# fi_pingpong between the namespaces: prints usec/xfer (64 B) or MB/s (64 KiB).
pingpong() {
    local prov=$1 ep=$2 size=$3 col=$4 port=$((47000 + RANDOM % 1000)) env_a=() env_b=()
    if [ "$prov" = svnic ]; then
        env_a=(FI_PROVIDER_PATH="$provider" FI_SVNIC_SOCKET="$sock_a" FI_SVNIC_LOG=warn FI_SVNIC_YIELD_AFTER=1)
        env_b=(FI_PROVIDER_PATH="$provider" FI_SVNIC_SOCKET="$sock_b" FI_SVNIC_LOG=warn FI_SVNIC_YIELD_AFTER=1)
    fi
    ip netns exec "$nsa" env "${env_a[@]}" taskset -c 1 fi_pingpong -p "$prov" -e "$ep" -S "$size" -I 2000 -B $port >/dev/null 2>&1 &
    local spid=$!
    sleep 0.5
    local out
    out=$(ip netns exec "$nsb" env "${env_b[@]}" taskset -c 0 timeout 60 fi_pingpong -p "$prov" -e "$ep" -S "$size" -I 2000 -P $port 10.199.0.1 2>&1) || { kill $spid 2>/dev/null; echo FAIL; return; }
    wait $spid 2>/dev/null || true
    echo "$out" | awk -v c="$col" '$1 ~ /^[0-9]/ {print $c; exit}'
}

median() { python3 -c "import sys,statistics; v=[float(x) for x in sys.argv[1:] if x!='FAIL']; print(round(statistics.median(v),2) if v else 'FAIL')" "$@"; }

declare -A res
rows=(svnic_rt udp_rt svnic_rate udp_rate "dma 65536" "dma 1048576" udp_bw)
for r in $(seq "$rounds"); do
    order=("${rows[@]}")
    if (( r % 2 == 0 )); then order=(udp_rt svnic_rt udp_rate svnic_rate udp_bw "dma 1048576" "dma 65536"); fi
    for row in "${order[@]}"; do
        # shellcheck disable=SC2086
        res[$row]+=" $(measure $row)"
    done
    for p in "svnic dgram 64 7" "udp dgram 64 7" "tcp msg 64 7" "svnic dgram 65536 6" "tcp msg 65536 6"; do
        # shellcheck disable=SC2086
        res[fi $p]+=" $(pingpong $p)"
    done
done

m() { median ${res[$1]}; }
echo "| measure | svnic | kernel | ratio |"
echo "|---|---:|---:|---:|"
rt_s=$(m svnic_rt); rt_u=$(m udp_rt)
echo "| round trip p50 (us), 32 B | $rt_s | $rt_u (UDP) | $(python3 -c "print(round($rt_u/$rt_s,2))" 2>/dev/null || echo -) x faster |"
ra_s=$(m svnic_rate); ra_u=$(m udp_rate)
echo "| 64 B messages/s | $ra_s | $ra_u (UDP) | $(python3 -c "print(round($ra_s/$ra_u,2))" 2>/dev/null || echo -) x |"
b64=$(m "dma 65536"); b1m=$(m "dma 1048576"); bu=$(m udp_bw)
mb() { python3 -c "print(round($1/1e6,1))" 2>/dev/null || echo FAIL; }
echo "| bandwidth (MB/s), 64 KiB | $(mb "$b64") | $(mb "$bu") (UDP, 1472 B datagrams) | $(python3 -c "print(round($b64/$bu,2))" 2>/dev/null || echo -) x |"
echo "| bandwidth (MB/s), 1 MiB | $(mb "$b1m") | - | - |"
echo "| fi_pingpong 64 B (us/xfer) | $(m 'fi svnic dgram 64 7') | udp $(m 'fi udp dgram 64 7'), tcp $(m 'fi tcp msg 64 7') | |"
echo "| fi_pingpong 64 KiB (MB/s) | $(m 'fi svnic dgram 65536 6') | tcp $(m 'fi tcp msg 65536 6') | |"
echo
echo "rounds: $rounds; raw: $(for k in "${!res[@]}"; do printf '%s=[%s] ' "$k" "${res[$k]}"; done)"
