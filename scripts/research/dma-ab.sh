#!/usr/bin/env bash
# Compares two revisions on the DMA-data target row (dma/64KiB/engine_vs_memcpy): builds the
# engine bench of each (in temporary worktrees, sharing target/ab), then
# runs the row alternately, A then B, for ROUNDS rounds, and prints both series with their mean,
# minimum and how often B beat A in the same round. This host's pace changes over seconds to
# minutes (scripts/research/core-latency.c shows it), so only runs made alternately compare; a round
# prints the cross-core latency before it.
#
#   scripts/research/dma-ab.sh REV_A REV_B [ROUNDS]     # default 10 rounds, about 15 s each after the builds
#
# e.g. scripts/research/dma-ab.sh HEAD~1 HEAD 12. Needs gcc and 2 CPUs.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/research/ab-lib.sh
[ $# -ge 2 ] || { sed -n '2,11p' "$0" >&2; exit 2; }
rounds=${3:-10}
ab_rounds dma-ab "$rounds"
ab_setup
gcc -O2 -pthread scripts/research/core-latency.c -o "$work/core-latency"
for x in a b; do
    ab_worktree $x "$([ $x = a ] && echo "$1" || echo "$2")"
    bin=$(cd "$work/$x" && "$repo/scripts/research/bench-binary.sh" --manifest-path "$work/$x/Cargo.toml")
    cp "$bin" "$work/bench-$x"
done
# The row's paired ratio from one run of bench $1; fails, saying so, if the run printed none.
ratio() {
    local v
    v=$("$1" --bench 'dma/64KiB/engine_vs' 2>&1 | grep -oE 'engine at [0-9.]+%' | grep -oE '[0-9.]+' | tail -1) || true
    [ -n "$v" ] || { echo "dma-ab: $1 printed no paired ratio (does that revision have the row?)" >&2; return 1; }
    echo "$v"
}
: >"$work/results"
for r in $(seq "$rounds"); do
    lat=$("$work/core-latency" 100000)
    ra=$(ratio "$work/bench-a")
    rb=$(ratio "$work/bench-b")
    echo "round $r: cross-core ${lat} ns; A ${ra}%, B ${rb}%"
    echo "$ra $rb" >>"$work/results"
done
python3 - "$work/results" <<'PY'
import sys
rows = [tuple(map(float, l.split())) for l in open(sys.argv[1]) if len(l.split()) == 2]
for name, i in (("A", 0), ("B", 1)):
    v = [r[i] for r in rows]
    print(f"{name}: mean {sum(v) / len(v):.1f} %, min {min(v):.1f} %, at 70 % or more: {sum(x >= 70 for x in v)} of {len(v)}")
wins = sum(b > a for a, b in rows)
diff = sum(b - a for a, b in rows) / len(rows)
print(f"B - A: mean {diff:+.1f} points, B ahead in {wins} of {len(rows)} rounds")
PY
