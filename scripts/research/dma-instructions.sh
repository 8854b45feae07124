#!/usr/bin/env bash
# Instructions the engine's worker executes per 64 KiB DMA-data message outside the copy, counted
# by callgrind in the DMA-data path's own functions (delivery, TX parse and peek, publish,
# completions). Unlike the timed benches, the count does not move with the host's pace, so two
# builds can be compared exactly; the DMA-data path's cost beyond the bare exchange
# (scripts/research/dma-ceiling.c) is mostly instructions (see docs/performance.md).
#
#   scripts/research/dma-instructions.sh            # builds the bench, runs it under valgrind (~2-3 min)
#
# Needs valgrind (apt install valgrind). Functions the compiler inlines into the worker loop are
# not counted; the copy is recognised by its loop (13 instructions per 128 bytes).
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt install valgrind)" >&2; exit 1; }
bin=$(scripts/research/bench-binary.sh)
out=$(mktemp -d)
toggles=()
for f in 'svnic_backend::engine::deliver::DestRun::deliver' \
         'svnic_backend::engine::channel::EngineChannel::post_completions_locked' \
         'svnic_backend::engine::deliver::DestRun::publish_written' \
         'svnic_channels::ring::Consumer::peek' \
         'svnic_backend::engine::deliver::parse_tx'; do
    toggles+=("--toggle-collect=$f")
done
valgrind --tool=callgrind --fair-sched=yes --collect-atstart=no "${toggles[@]}" \
    --callgrind-out-file="$out/cg" "$bin" --bench 'dma/64KiB/engine$' >"$out/log" 2>&1
callgrind_annotate --inclusive=no "$out/cg" >"$out/txt" 2>/dev/null
python3 - "$out/txt" <<'PY'
import re, sys
total = copy = 0
for line in open(sys.argv[1]):
    if 'Auto-annotated source' in line:
        break  # per-line source annotations follow: not per-function totals
    m = re.match(r'\s*([\d,]+) \(', line)
    if not m:
        continue
    v = int(m.group(1).replace(',', ''))
    if 'PROGRAM TOTALS' in line:
        total = v
    elif 'vector_copy::copy_avx2' in line:
        copy += v
per_copy = 13 * (64 * 1024 // 128)
msgs = round(copy / per_copy)
if msgs == 0:
    sys.exit("no DMA-data copy seen (no AVX2 under valgrind?)")
print(f"{msgs} messages; outside the copy: {(total - copy) / msgs:.0f} instructions per message")
PY
rm -rf "$out"
