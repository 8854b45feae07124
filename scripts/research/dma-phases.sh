#!/usr/bin/env bash
# The DMA-data target row (dma/64KiB/engine_vs_memcpy) next to the bare exchange
# (scripts/research/dma-ceiling.c), run alternately, with the engine built with the `dma-timing` feature:
# each round prints the bare exchange's and the engine's paired ratio to memcpy, and where the
# worker's time went per message (the copy, and the gap before it: everything else the worker
# does per message).
#
#   scripts/research/dma-phases.sh [ROUNDS]     # default 6 rounds, about 7 s each after the build
#
# Each round also prints the cross-core latency just before it (scripts/research/core-latency.c): this
# host runs the two vCPUs sometimes on nearby cores (about 27-75 ns one way) and sometimes on
# distant ones (225-300 ns), for seconds to minutes at a time. When it is high the copy takes as
# long as before and the gap grows, since the gap waits on lines the guest's core holds, while
# the bare exchange, which does almost nothing between copies, loses less. Needs gcc, AVX2 and
# 2 CPUs.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-6}
bin=$(scripts/research/bench-binary.sh --features dma-timing)
ceiling=$(mktemp)
latency=$(mktemp)
trap 'rm -f "$ceiling" "$latency"' EXIT
gcc -O2 -mavx2 -pthread scripts/research/dma-ceiling.c -o "$ceiling"
gcc -O2 -pthread scripts/research/core-latency.c -o "$latency"
for r in $(seq "$rounds"); do
    lat=$("$latency" 100000)
    bare=$("$ceiling" 1 | grep -oE 'at [0-9.]+%' | grep -oE '[0-9.]+')
    out=$("$bin" --bench 'dma/64KiB/engine_vs' 2>&1)
    engine=$(grep -oE 'engine at [0-9.]+%' <<<"$out" | grep -oE '[0-9.]+' | tail -1)
    split=$(grep -oE 'copy [0-9]+ ns, gap before it [0-9]+ ns' <<<"$out" | tail -1)
    pass=$(grep -oE '[0-9.]+ messages per pass' <<<"$out" | tail -1)
    echo "round $r: cross-core ${lat} ns; bare exchange ${bare}% of memcpy, engine ${engine}% of memcpy; worker per message: ${split} (${pass})"
done
