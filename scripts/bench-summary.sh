#!/usr/bin/env bash
# Runs the criterion benchmarks of the data path and prints the numbers that matter against the
# project's targets:
#   - engine forwarding: at least 10 M 64-byte messages per second per worker (in batches;
#     judged on forward/user_data_1w_burst, the other forward rows give context);
#   - DMA-data at 64 KiB: at least 70 % of plain memcpy bandwidth, measured in the same run
#     (judged on dma/64KiB/engine_vs_memcpy: within each sample the engine and memcpy alternate
#     in chunks of 256 messages, each half timed on its own, and the median of the per-sample
#     ratios is taken, so that both halves see the same moments of a host whose pace drifts;
#     the separate rows give context).
#
# Usage: scripts/bench-summary.sh [--no-run] [--strict]
#   --no-run   do not run the benches; summarise the last results in target/criterion
#   --strict   exit with status 2 if a target is missed
#
# The benches: channels/benches/ring.rs and backend/benches/engine.rs (see their headers).
# Criterion keeps each result in target/criterion/<group>/<bench>/new/{benchmark,estimates}.json;
# this script reads those (python3, no extra crates).
set -euo pipefail

cd "$(dirname "$0")/.."

run=1
strict=0
for arg in "$@"; do
    case "$arg" in
        --no-run) run=0 ;;
        --strict) strict=1 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "unknown argument: $arg (try --help)" >&2; exit 64 ;;
    esac
done

# After a run, only the results it wrote are summarised (older ones, of benches since renamed or
# removed, stay in target/criterion for criterion's own comparisons).
since=0
if [[ $run == 1 ]]; then
    since=$(date +%s)
    cargo bench -p svnic-channels --bench ring
    cargo bench -p svnic-backend --bench engine
fi

CRITERION_DIR="${CARGO_TARGET_DIR:-target}/criterion" STRICT="$strict" SINCE="$since" python3 - <<'PY'
import json, os, pathlib, sys

root = pathlib.Path(os.environ["CRITERION_DIR"])
results = {}
since = float(os.environ["SINCE"])
for bench in root.glob("**/new/benchmark.json"):
    if bench.stat().st_mtime < since:
        continue
    meta = json.loads(bench.read_text())
    est = json.loads((bench.parent / "estimates.json").read_text())
    # Criterion reports the slope of the linear regression when it has one (iteration counts
    # grow linearly across samples), else the mean: use the same figure it prints.
    ns = (est.get("slope") or est["mean"])["point_estimate"]
    tp = meta.get("throughput") or {}
    kind, amount = next(iter(tp.items())) if tp else (None, None)
    rate = amount / ns * 1e9 if amount else None
    results[meta["full_id"]] = (ns, kind, rate)

if not results:
    sys.exit(f"no criterion results under {root}: run the benches first")

def fmt(kind, rate):
    if rate is None:
        return "-"
    if kind == "Bytes":
        return f"{rate / 2**30:8.2f} GiB/s"
    return f"{rate / 1e6:8.2f} M/s"

print(f"\n{'benchmark':40} {'time/iter':>12} {'throughput':>14}")
for name in sorted(results):
    ns, kind, rate = results[name]
    t = f"{ns / 1000:.3f} us" if ns >= 1000 else f"{ns:.1f} ns"
    print(f"{name:40} {t:>12} {fmt(kind, rate):>14}")

missed = []
def verdict(ok):
    return "ok" if ok else "MISSED"

print("\ntargets")
TARGET_MSGS = 10e6
# (bench, workers it spreads over (1 if already per worker), what it measures, judged by --strict)
FORWARD = [
    ("forward/user_data_1w_burst", 1, "worker in batches of 4096, guests on the other core", True),
    ("forward/user_data_1w_same_core", 1, "worker alone on its core: the engine's own cost", False),
    ("forward/user_data_1w", 1, "end to end, one bench thread plays both guests", False),
    ("forward/user_data_1w_worker_cpu", 1, "per second of worker CPU (idle polling included)", False),
    ("forward/user_data_2w_4p", 2, "2 workers, 4 pairs, 3 busy threads on the cores", False),
    ("forward/user_data_2w_4p_worker_cpu", 1, "the same per second of worker CPU", False),
]
for name, workers, what, judged in FORWARD:
    if name in results:
        per_worker = results[name][2] / workers
        ok = per_worker >= TARGET_MSGS
        if judged and not ok:
            missed.append(name)
        print(f"  {name:36} {per_worker / 1e6:6.2f} M msgs/s per worker = "
              f"{per_worker / TARGET_MSGS:6.1%} of 10 M/s  {verdict(ok):6}  ({what})")

# The target is judged on the paired ratio of the streaming run (`engine_vs_memcpy`: 4 buffers
# in flight, guests on the other core, alternating with as many memcpys within each sample); the
# ratios of the separate rows (`engine`, and `engine_burst`: 4 messages queued at once, the
# worker alone), measured seconds apart from `memcpy_vec`, are shown beside it.
for size in ["4KiB", "64KiB"]:
    paired = root / "dma" / size / "engine_vs_memcpy" / "paired.json"
    if paired.exists():
        p = json.loads(paired.read_text())
        ratios = p["ratios"]
        ratio = p["median"]
        line = (f"  dma/{size:6} engine_vs_memcpy {ratio:6.1%} of memcpy: median of "
                f"{len(ratios)} paired samples ({min(ratios):.0%}-{max(ratios):.0%})")
        if size == "64KiB":
            ok = ratio >= 0.70
            if not ok:
                missed.append(f"dma/{size}")
            line += f"  (target 70%) {verdict(ok)}"
        print(line)
    elif size == "64KiB":
        missed.append(f"dma/{size} (no paired result)")
    mc = results.get(f"dma/{size}/memcpy_vec")
    vc = results.get(f"dma/{size}/volatile_copy")
    for row in ["engine", "engine_burst"]:
        eng = results.get(f"dma/{size}/{row}")
        if not (eng and mc):
            continue
        ratio = eng[2] / mc[2]
        line = (f"  dma/{size:6} {row:16} {ratio:6.1%} of memcpy: {eng[2] / 2**30:6.2f} GiB/s "
                f"against {mc[2] / 2**30:.2f} GiB/s")
        if vc:
            line += f", {eng[2] / vc[2]:6.1%} of volatile copy ({vc[2] / 2**30:.2f} GiB/s)"
        print(line)

if missed and os.environ.get("STRICT") == "1":
    sys.exit(2)
PY
